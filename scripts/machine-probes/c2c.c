// How long does a cache line take to go from one CPU to the other? Two
// threads pinned to CPU A and CPU B pass a counter back and forth through two
// cache lines (A writes its line, B spins until it sees the value and writes
// its own, A spins on that) for MS milliseconds, in batches of 100 round
// trips. Prints one JSON line: the one-way time in ns (round trip / 2) of the
// batches, minimum, p25 and median (a batch in which either thread was
// descheduled is slow; the low percentiles hold under load). No memory other
// than the two lines is touched, no system call is made in the loop: the time
// is the machine's (the host's placement of the two vCPUs: SMT siblings,
// cores of one CCX, or cores of two CCDs). Not a test: a measurement of the
// machine (docs/benchmarks.md, "Session 18: the bimodal UDP p50"), run by
// scripts/compare.py --probe before and after each repeat.
//
//   cc -O2 -pthread -o /tmp/c2c scripts/machine-probes/c2c.c
//   /tmp/c2c 0 1 200
#include "probe.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

enum { BATCH = 100, MAX_BATCHES = 1 << 16 };

struct line {
    _Alignas(128) _Atomic uint64_t v;
};
static struct line ping, pong;
static _Atomic int stop;
static int cpu_b;

static void *echo(void *arg) {
    (void)arg;
    if (pin_cpu(cpu_b) != 0)
        exit(1);
    uint64_t seen = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        uint64_t v = atomic_load_explicit(&ping.v, memory_order_acquire);
        if (v != seen) {
            seen = v;
            atomic_store_explicit(&pong.v, v, memory_order_release);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s CPU_A CPU_B MS\n", argv[0]);
        return 2;
    }
    int cpu_a = atoi(argv[1]);
    cpu_b = atoi(argv[2]);
    uint64_t ms = (uint64_t)atoi(argv[3]);
    if (pin_cpu(cpu_a) != 0)
        return 1;
    pthread_t t;
    if (pthread_create(&t, NULL, echo, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    static uint64_t batch[MAX_BATCHES];
    size_t n = 0;
    uint64_t seq = 0, end = now_ns() + ms * 1000000ull;
    // Warm-up: the echo thread must be running before the first timed batch.
    atomic_store_explicit(&ping.v, ++seq, memory_order_release);
    while (atomic_load_explicit(&pong.v, memory_order_acquire) != seq)
        ;
    while (n < MAX_BATCHES) {
        uint64_t t0 = now_ns();
        if (t0 >= end)
            break;
        for (int i = 0; i < BATCH; i++) {
            atomic_store_explicit(&ping.v, ++seq, memory_order_release);
            while (atomic_load_explicit(&pong.v, memory_order_acquire) != seq)
                ;
        }
        batch[n++] = now_ns() - t0;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    if (n == 0) {
        // Not one batch in MS (both threads never ran at once): no number.
        printf("{\"tool\": \"c2c\", \"cpus\": [%d, %d], \"batches\": 0, \"oneway_ns\": null}\n", cpu_a,
               cpu_b);
        return 0;
    }
    qsort(batch, n, sizeof batch[0], cmp_u64);
    double k = 2.0 * BATCH;
    printf("{\"tool\": \"c2c\", \"cpus\": [%d, %d], \"batches\": %zu, \"oneway_ns\": "
           "{\"min\": %.1f, \"p25\": %.1f, \"p50\": %.1f}}\n",
           cpu_a, cpu_b, n, batch[0] / k, batch[n / 4] / k, batch[n / 2] / k);
    return 0;
}
