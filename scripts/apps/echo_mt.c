/* UDP echo, multi-threaded C: THREADS threads share one socket on each end.
 *
 *   echo_mt server ADDR PORT [THREADS]
 *   echo_mt client ADDR PORT N INFLIGHT SIZE WARMUP [THREADS]
 *
 * The server's threads all block in recvfrom() on one socket and echo each
 * datagram to its sender. The client sends WARMUP + N datagrams with
 * INFLIGHT outstanding; its threads all block in recv() on one connected
 * socket, check every reply (length, sequence number seen once, every byte)
 * and send the next one. Time runs from the WARMUP-th reply to the last.
 * Prints "ok N datagrams in X ms" and one JSON line; exits 1 on a bad or
 * duplicate datagram, 2 when no reply came for 5 s (a lost datagram).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STOP UINT64_MAX

static int sock;
static uint64_t total, warmup, n_timed;
static size_t size;
static atomic_uint_fast64_t next_seq, received;
static atomic_uchar *seen;
static atomic_int done;
static uint64_t t_start, t_end;
static int nthreads = 6;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void fill(unsigned char *b, uint64_t seq) {
  memcpy(b, &seq, 8);
  for (size_t i = 8; i < size; i++) b[i] = (unsigned char)(seq * 7 + i * 13);
}

static int check(const unsigned char *b, ssize_t n, uint64_t *seq) {
  if (n != (ssize_t)size) return 0;
  memcpy(seq, b, 8);
  if (*seq == STOP) return 1;
  if (*seq >= total) return 0;
  for (size_t i = 8; i < size; i++)
    if (b[i] != (unsigned char)(*seq * 7 + i * 13)) return 0;
  return 1;
}

static void send_seq(uint64_t seq) {
  unsigned char b[65536];
  fill(b, seq);
  for (;;) {
    ssize_t r = send(sock, b, size, 0);
    if (r == (ssize_t)size) return;
    if (r < 0 && (errno == EINTR || errno == ENOBUFS || errno == EAGAIN)) continue;
    fprintf(stderr, "echo_mt: send: %s\n", strerror(errno));
    exit(1);
  }
}

static void *client_thread(void *arg) {
  (void)arg;
  unsigned char b[65536];
  for (;;) {
    ssize_t n = recv(sock, b, sizeof b, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "echo_mt: recv: %s\n", strerror(errno));
      exit(1);
    }
    uint64_t seq;
    if (!check(b, n, &seq)) {
      fprintf(stderr, "echo_mt: bad datagram (%zd bytes)\n", n);
      exit(1);
    }
    if (seq == STOP) return NULL;
    if (atomic_exchange(&seen[seq], 1)) {
      fprintf(stderr, "echo_mt: duplicate datagram %llu\n", (unsigned long long)seq);
      exit(1);
    }
    uint64_t r = atomic_fetch_add(&received, 1) + 1;
    if (r == warmup) t_start = now_ns();
    if (r == total) {
      t_end = now_ns();
      atomic_store(&done, 1);
      /* Wake the other threads: one STOP each, echoed by the server. */
      for (int i = 1; i < nthreads; i++) send_seq(STOP);
      return NULL;
    }
    uint64_t s = atomic_fetch_add(&next_seq, 1);
    if (s < total) send_seq(s);
  }
}

static void *watchdog(void *arg) {
  (void)arg;
  uint64_t last = 0, quiet = 0;
  for (;;) {
    sleep(1);
    uint64_t r = atomic_load(&received);
    if (atomic_load(&done)) quiet++; /* waiting for STOP echoes */
    else if (r == last) quiet++;
    else quiet = 0;
    last = r;
    if (quiet >= 5) {
      if (atomic_load(&done)) _exit(0); /* result already printed */
      fprintf(stderr, "echo_mt: stalled: %llu of %llu replies (a datagram was lost)\n",
              (unsigned long long)r, (unsigned long long)total);
      _exit(2);
    }
  }
}

static struct sockaddr_in addr_of(const char *ip, const char *port) {
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(port))};
  if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
    fprintf(stderr, "echo_mt: bad address %s\n", ip);
    exit(1);
  }
  return sa;
}

static void *server_thread(void *arg) {
  (void)arg;
  unsigned char b[65536];
  for (;;) {
    struct sockaddr_in src;
    socklen_t sl = sizeof src;
    ssize_t n = recvfrom(sock, b, sizeof b, 0, (struct sockaddr *)&src, &sl);
    if (n < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "echo_mt: recvfrom: %s\n", strerror(errno));
      exit(1);
    }
    if (sendto(sock, b, (size_t)n, 0, (struct sockaddr *)&src, sl) < 0 && errno != EINTR)
      fprintf(stderr, "echo_mt: sendto: %s\n", strerror(errno));
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 4 && !strcmp(argv[1], "server")) {
    if (argc > 4) nthreads = atoi(argv[4]);
    struct sockaddr_in sa = addr_of(argv[2], argv[3]);
    sock = socket(AF_INET, SOCK_DGRAM, 0);
    if (sock < 0 || bind(sock, (struct sockaddr *)&sa, sizeof sa) < 0) {
      fprintf(stderr, "echo_mt: bind: %s\n", strerror(errno));
      return 1;
    }
    printf("ready\n");
    pthread_t t[64];
    for (int i = 0; i < nthreads && i < 64; i++) pthread_create(&t[i], NULL, server_thread, NULL);
    pthread_join(t[0], NULL);
    return 0;
  }
  if (argc < 8 || strcmp(argv[1], "client")) {
    fprintf(stderr,
            "usage: echo_mt server ADDR PORT [THREADS]\n"
            "       echo_mt client ADDR PORT N INFLIGHT SIZE WARMUP [THREADS]\n");
    return 1;
  }
  n_timed = strtoull(argv[4], NULL, 10);
  uint64_t inflight = strtoull(argv[5], NULL, 10);
  size = strtoul(argv[6], NULL, 10);
  warmup = strtoull(argv[7], NULL, 10);
  if (argc > 8) nthreads = atoi(argv[8]);
  if (size < 8 || size > 65507 || n_timed == 0 || inflight == 0 || nthreads < 1 || nthreads > 64) {
    fprintf(stderr, "echo_mt: need SIZE 8..65507, N >= 1, INFLIGHT >= 1, THREADS 1..64\n");
    return 1;
  }
  total = warmup + n_timed;
  seen = calloc(total, 1);
  struct sockaddr_in sa = addr_of(argv[2], argv[3]);
  sock = socket(AF_INET, SOCK_DGRAM, 0);
  if (sock < 0 || connect(sock, (struct sockaddr *)&sa, sizeof sa) < 0) {
    fprintf(stderr, "echo_mt: connect: %s\n", strerror(errno));
    return 1;
  }
  pthread_t wd, t[64];
  pthread_create(&wd, NULL, watchdog, NULL);
  if (warmup == 0) t_start = now_ns();
  uint64_t first = inflight < total ? inflight : total;
  atomic_store(&next_seq, first);
  for (uint64_t s = 0; s < first; s++) send_seq(s);
  for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, client_thread, NULL);
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
  double ms = (double)(t_end - t_start) / 1e6;
  printf("ok %llu datagrams in %.3f ms\n", (unsigned long long)n_timed, ms);
  printf("{\"runtime\":\"c-mt\",\"n\":%llu,\"inflight\":%llu,\"size\":%zu,\"warmup\":%llu,"
         "\"threads\":%d,\"received\":%llu,\"elapsed_ms\":%.3f,\"ok\":true}\n",
         (unsigned long long)n_timed, (unsigned long long)inflight, size,
         (unsigned long long)warmup, nthreads, (unsigned long long)atomic_load(&received), ms);
  return 0;
}
