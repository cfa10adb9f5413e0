// How much of the caches survives a thread's idle spin? Fills a buffer of
// KB kilobytes, then 2000 times: spin GAP µs in user space touching no
// memory (only the vDSO clock), and time one read of every cache line of the
// buffer in a shuffled order. Prints the median and p90 of those reads. On a
// machine where nothing else runs on the core the time does not depend on
// GAP. Not a test: a measurement of the machine (docs/benchmarks.md,
// "Session 6").
//
//   cc -O2 -o /tmp/cache-idle scripts/machine-probes/cache-idle.c
//   for g in 2 100 1000; do /tmp/cache-idle 32 $g; done
#include "probe.h"
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { N = 2000 };

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s KB GAP_US\n", argv[0]);
        return 2;
    }
    size_t bytes = (size_t)atoi(argv[1]) * 1024;
    int gap = atoi(argv[2]);
    if (bytes < 64) {
        fprintf(stderr, "bad size\n");
        return 2;
    }
    if (pin_cpu(0) != 0)
        return 1;
    volatile unsigned char *buf = aligned_alloc(4096, bytes);
    size_t lines = bytes / 64;
    size_t *order = malloc(lines * sizeof *order);
    if (!buf || !order)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        buf[i] = (unsigned char)i;
    // A shuffled walk, so the prefetcher cannot hide the misses.
    for (size_t i = 0; i < lines; i++)
        order[i] = i;
    for (size_t i = lines - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    static uint64_t d[N];
    unsigned sum = 0;
    for (int r = 0; r < N; r++) {
        uint64_t until = now_ns() + (uint64_t)gap * 1000ull;
        while (now_ns() < until) {
        }
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < lines; i++)
            sum += buf[order[i] * 64];
        d[r] = now_ns() - t0;
    }
    qsort(d, N, sizeof d[0], cmp_u64);
    printf("{\"kb\": %zu, \"gap_us\": %d, \"read_p50_us\": %.2f, \"read_p90_us\": %.2f, \"ns_per_line\": %.1f, \"sum\": %u}\n",
           bytes / 1024, gap, d[N / 2] / 1e3, d[N * 9 / 10] / 1e3, (double)d[N / 2] / (double)lines, sum & 1);
    return 0;
}
