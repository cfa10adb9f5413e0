// Does spinning with PAUSE get a vCPU taken away (pause-loop exiting)?
// Spins for 2 s reading the TSC, with or without a PAUSE per turn, and
// counts the gaps between turns longer than 0.5/1/2/5/10/50 µs: time the
// thread did not run (interrupts, hypervisor exits). Not a test: a
// measurement of the machine (docs/benchmarks.md, "Session 6").
//
//   cc -O2 -o /tmp/spin-gaps scripts/machine-probes/spin-gaps.c
//   /tmp/spin-gaps 1 0; /tmp/spin-gaps 0 0     # with PAUSE, without, on CPU 0
#include "probe.h"
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PAUSE(0|1) CPU\n", argv[0]);
        return 2;
    }
    int pause = atoi(argv[1]), cpu = atoi(argv[2]);
    if (pin_cpu(cpu) != 0)
        return 1;
    // TSC ticks per ns, over 100 ms.
    uint64_t t0 = now_ns(), c0 = __rdtsc();
    while (now_ns() - t0 < 100000000ull) {
    }
    double ghz = (double)(__rdtsc() - c0) / (double)(now_ns() - t0);
    const double limits[6] = {0.5, 1, 2, 5, 10, 50};
    long over[6] = {0}, turns = 0;
    double lost_us = 0;
    uint64_t end = __rdtsc() + (uint64_t)(2e9 * ghz), last = __rdtsc();
    for (;;) {
        uint64_t now = __rdtsc();
        if (now > end)
            break;
        double gap_us = (double)(now - last) / ghz / 1000.0;
        last = now;
        turns++;
        if (gap_us > limits[0]) {
            lost_us += gap_us;
            for (int i = 0; i < 6; i++)
                over[i] += gap_us > limits[i];
        }
        if (pause)
            _mm_pause();
    }
    printf("{\"pause\": %d, \"turns\": %ld, \"gaps_over_0.5us\": %ld, \"over_1us\": %ld, \"over_2us\": %ld, "
           "\"over_5us\": %ld, \"over_10us\": %ld, \"over_50us\": %ld, \"lost_us\": %.0f}\n",
           pause, turns, over[0], over[1], over[2], over[3], over[4], over[5], lost_us);
    return 0;
}
