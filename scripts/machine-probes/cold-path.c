// How much slower is a kernel path that runs rarely? Times one 64-byte UDP
// sendto over loopback after GAP µs in which the thread does something else:
//   0  spin in user space (no system calls: what a polling receiver does),
//   1  spin with PAUSE,
//   2  spin calling getppid() (enter the kernel, but not the send path),
//   3  spin sending datagrams (the send path stays warm).
// Prints the median, p90 and minimum of 3000 timed sends. Not a test: a
// measurement of the machine (docs/benchmarks.md, "Session 6").
//
//   cc -O2 -o /tmp/cold-path scripts/machine-probes/cold-path.c
//   for g in 2 100 1000; do /tmp/cold-path 0 $g 0; done; /tmp/cold-path 0 1000 3
#include "probe.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

enum { N = 3000 };

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s CPU GAP_US MODE(0 spin|1 pause|2 getppid|3 send)\n", argv[0]);
        return 2;
    }
    int cpu = atoi(argv[1]), gap = atoi(argv[2]), mode = atoi(argv[3]);
    if (pin_cpu(cpu) != 0)
        return 1;
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (rx < 0 || tx < 0 || bind(rx, (void *)&a, sizeof a) != 0 ||
        getsockname(rx, (void *)&a, &alen) != 0) {
        perror("socket");
        return 1;
    }
    static uint64_t d[N];
    char buf[64] = {0};
    for (int i = 0; i < N; i++) {
        uint64_t until = now_ns() + (uint64_t)gap * 1000ull;
        while (now_ns() < until) {
            if (mode == 1)
                _mm_pause();
            else if (mode == 2)
                getppid();
            else if (mode == 3) {
                sendto(tx, buf, sizeof buf, 0, (void *)&a, sizeof a);
                recv(rx, buf, sizeof buf, MSG_DONTWAIT);
            }
        }
        uint64_t t0 = now_ns();
        sendto(tx, buf, sizeof buf, 0, (void *)&a, sizeof a);
        uint64_t t1 = now_ns();
        recv(rx, buf, sizeof buf, MSG_DONTWAIT);
        d[i] = t1 - t0;
    }
    qsort(d, N, sizeof d[0], cmp_u64);
    printf("{\"gap_us\": %d, \"mode\": %d, \"send_p50_us\": %.2f, \"send_p90_us\": %.2f, \"send_min_us\": %.2f}\n",
           gap, mode, d[N / 2] / 1e3, d[N * 9 / 10] / 1e3, d[0] / 1e3);
    return 0;
}
