/* Arguments checked as the kernel checks them (issue 20, findings 9 and
 * 10). Run plainly and under `nanowire run`; the outputs must be
 * identical (one line per call: return value class and errno name).
 *
 * Usage: args_check peer PORT          UDP echo on PORT, TCP echo on PORT
 *                                      (plain, in the other host)
 *        args_check client ADDR PEER PORT
 *                                      every check on a UDP socket bound
 *                                      to ADDR and a TCP connection, both
 *                                      to PEER:PORT
 * alarm() bounds every run. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static const char *en(int e) {
    switch (e) {
    case EAGAIN: return "EAGAIN";
    case EMSGSIZE: return "EMSGSIZE";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case EINTR: return "EINTR";
    case ENOBUFS: return "ENOBUFS";
    case EPIPE: return "EPIPE";
    default: return "E?";
    }
}

/* "name: -1 ERRNO" or "name: ok N" (N only when it is deterministic). */
static void rep(const char *name, long r, int show) {
    int e = errno;
    if (r < 0)
        printf("%s: -1 %s\n", name, en(e));
    else if (show)
        printf("%s: ok %ld\n", name, r);
    else
        printf("%s: ok\n", name);
    fflush(stdout);
}

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static struct sockaddr_in sin_of(const char *a, int port) {
    struct sockaddr_in s = {0};
    s.sin_family = AF_INET;
    s.sin_port = htons(port);
    inet_pton(AF_INET, a, &s.sin_addr);
    return s;
}

/* ------------------------------------------------------------- peer */

static void *tcp_conn(void *arg) {
    int c = (int)(intptr_t)arg;
    char b[65536];
    for (;;) {
        ssize_t n = recv(c, b, sizeof b, 0);
        if (n <= 0)
            break;
        if (b[0] == 's') /* a sink: swallow, never answer */
            continue;
        if (send(c, b, n, MSG_NOSIGNAL) < 0)
            break;
    }
    close(c);
    return NULL;
}

static void *udp_echo(void *arg) {
    int u = (int)(intptr_t)arg;
    char b[65536];
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(u, b, sizeof b, 0, (struct sockaddr *)&from, &fl);
        if (n >= 0)
            sendto(u, b, n, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

static int peer(int port) {
    struct sockaddr_in a = sin_of("0.0.0.0", port);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(u, (struct sockaddr *)&a, sizeof a) || bind(l, (struct sockaddr *)&a, sizeof a) ||
        listen(l, 16)) {
        perror("peer bind");
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, udp_echo, (void *)(intptr_t)u);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c < 0)
            continue;
        pthread_create(&th, NULL, tcp_conn, (void *)(intptr_t)c);
        pthread_detach(th);
    }
}

/* ----------------------------------------------------------- client */

static char *unmapped;  /* a page that was mapped and is not any more */
static char *readonly;  /* a page mapped PROT_READ */
static volatile sig_atomic_t hits;

static void on_sig(int s) { (void)s; hits++; }

/* A datagram (or bytes) from the echo: send "x" and wait for the answer. */
static void ping(int fd) {
    send(fd, "x", 1, 0);
    msleep(150);
}

static void drain(int fd) {
    char b[65536];
    while (recv(fd, b, sizeof b, MSG_DONTWAIT) > 0)
        ;
}

/* A call made by another thread: `recv_in_thread` pings and receives
 * `len` bytes into `buf` (result and errno back); `unmap_in_thread`
 * unmaps the page at `buf`. */
struct peer_call {
    int fd;
    char *buf;
    size_t len;
    long r;
    int err;
};

static void *recv_in_thread(void *arg) {
    struct peer_call *c = arg;
    ping(c->fd);
    c->r = recv(c->fd, c->buf, c->len, 0);
    c->err = errno;
    return NULL;
}

static void *unmap_in_thread(void *arg) {
    struct peer_call *c = arg;
    munmap(c->buf, 4096);
    return NULL;
}

static void checks(const char *p, int fd, int tcp) {
    char name[128];
    char buf[256];
    struct iovec big[2000];
    for (int i = 0; i < 2000; i++) {
        big[i].iov_base = buf;
        big[i].iov_len = 1;
    }
#define N(s) (snprintf(name, sizeof name, "%s %s", p, s), name)

    /* recvmsg: a huge iovlen, a NULL iov, a NULL msghdr: refused before
     * any wait. */
    struct msghdr m = {0};
    m.msg_iov = big;
    m.msg_iovlen = (size_t)1 << 40;
    rep(N("recvmsg huge iovlen"), recvmsg(fd, &m, 0), 1);
    m.msg_iovlen = 2000;
    rep(N("recvmsg 2000 iovecs"), recvmsg(fd, &m, 0), 1);
    m.msg_iov = NULL;
    m.msg_iovlen = 1;
    rep(N("recvmsg null iov"), recvmsg(fd, &m, 0), 1);
    m.msg_iov = (struct iovec *)unmapped;
    rep(N("recvmsg unmapped iov"), recvmsg(fd, &m, 0), 1);
    rep(N("readv 2000 iovecs"), readv(fd, big, 2000), 1);
    int minus1 = -1;
    rep(N("readv -1 iovecs"), readv(fd, big, *(volatile int *)&minus1), 1);

    /* Bad receive buffers with data waiting: EFAULT. */
    ping(fd);
    rep(N("recv null buffer"), recv(fd, NULL, 100, 0), 1);
    if (tcp) {
        /* The kernel keeps the stream's bytes: they are still there. */
        rep(N("recv after fault"), recv(fd, buf, sizeof buf, 0), 1);
    } else {
        /* The kernel drops the datagram it could not copy. */
        rep(N("recv after fault"), recv(fd, buf, sizeof buf, MSG_DONTWAIT), 1);
    }
    ping(fd);
    rep(N("recv unmapped buffer"), recv(fd, unmapped, 100, 0), 1);
    drain(fd);
    ping(fd);
    rep(N("recv read-only buffer"), recv(fd, readonly, 100, 0), 1);
    drain(fd);
    ping(fd);
    struct iovec bad[2] = {{buf, 0}, {unmapped, 100}};
    m.msg_iov = bad;
    m.msg_iovlen = 2;
    rep(N("recvmsg unmapped iov_base"), recvmsg(fd, &m, 0), 1);
    drain(fd);
    ping(fd);
    rep(N("readv unmapped iov_base"), readv(fd, bad, 2), 1);
    drain(fd);
    ping(fd);
    struct iovec two[2] = {{buf, 0}, {buf, sizeof buf}};
    m.msg_iov = two;
    m.msg_iovlen = 2;
    m.msg_name = NULL;
    rep(N("recvmsg good after faults"), recvmsg(fd, &m, 0), 1);
    drain(fd);
    if (!tcp) {
        ping(fd);
        struct sockaddr_in from;
        rep(N("recvfrom name without length"),
            recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, NULL), 1);
        drain(fd);
    }
    struct mmsghdr mm[2];
    memset(mm, 0, sizeof mm);
    rep(N("recvmmsg null vector"), recvmmsg(fd, NULL, 2, MSG_DONTWAIT, NULL), 1);
    (void)mm;

    /* Buffers the shim has used (it remembers their mappings), then
     * unmapped or made read-only, by this thread or another; and a
     * buffer another thread used, from a new thread: the kernel's answer
     * each time, never a crash (session 27: a change forgets only the
     * ranges it touched, and threads share what they found). */
    char *pg = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 4; i++) {
        ping(fd);
        snprintf(name, sizeof name, "%s recv into page %d of a fresh mapping", p, i);
        rep(name, recv(fd, pg + i * 4096, 100, 0), 1);
        drain(fd);
    }
    munmap(pg + 4096, 4096);
    mprotect(pg + 2 * 4096, 4096, PROT_READ);
    struct peer_call c1 = {fd, pg + 3 * 4096, 0, -2, 0};
    pthread_t th1;
    pthread_create(&th1, NULL, unmap_in_thread, &c1);
    pthread_join(th1, NULL);
    ping(fd);
    rep(N("recv into a used page since unmapped"), recv(fd, pg + 4096, 100, 0), 1);
    drain(fd);
    ping(fd);
    rep(N("recv into a used page since read-only"), recv(fd, pg + 2 * 4096, 100, 0), 1);
    drain(fd);
    ping(fd);
    rep(N("recv into a used page another thread unmapped"), recv(fd, pg + 3 * 4096, 100, 0), 1);
    drain(fd);
    ping(fd);
    rep(N("recv into the used page beside them"), recv(fd, pg, 100, 0), 1);
    drain(fd);
    struct peer_call c2 = {fd, pg, 100, 0, 0};
    pthread_create(&th1, NULL, recv_in_thread, &c2);
    pthread_join(th1, NULL);
    errno = c2.err;
    rep(N("a new thread's recv into a page another used"), c2.r, 1);
    struct peer_call c3 = {fd, pg + 4096, 100, 0, 0};
    pthread_create(&th1, NULL, recv_in_thread, &c3);
    pthread_join(th1, NULL);
    errno = c3.err;
    rep(N("a new thread's recv into a page another used and unmapped"), c3.r, 1);
    drain(fd);
    munmap(pg, 4096);
    munmap(pg + 2 * 4096, 2 * 4096);

    /* Sends. */
    m.msg_iov = big;
    m.msg_iovlen = 2000;
    rep(N("sendmsg 2000 iovecs"), sendmsg(fd, &m, 0), 1);
    rep(N("writev 2000 iovecs"), writev(fd, big, 2000), 1);
    rep(N("writev -1 iovecs"), writev(fd, big, *(volatile int *)&minus1), 1);
    m.msg_iov = NULL;
    m.msg_iovlen = 1;
    rep(N("sendmsg null iov"), sendmsg(fd, &m, 0), 1);
    struct iovec neg = {buf, (size_t)-1};
    rep(N("writev negative iov_len"), writev(fd, &neg, 1), 1);
    rep(N("send null buffer"), send(fd, NULL, 10, 0), 1);
    rep(N("send unmapped buffer"), send(fd, unmapped, 10, 0), 1);
    struct iovec badw[2] = {{buf, 1}, {unmapped, 10}};
    rep(N("writev unmapped iov_base"), writev(fd, badw, 2), 1);
    if (!tcp) {
        /* A terabyte iov_len over a real buffer: the kernel clamps the
         * total and refuses the datagram as too long. */
        static char sbuf[16]; /* low in the address space: +1 TiB is still user space */
        struct iovec tb = {sbuf, (size_t)1 << 40};
        memset(mm, 0, sizeof mm);
        mm[0].msg_hdr.msg_iov = &tb;
        mm[0].msg_hdr.msg_iovlen = 1;
        rep(N("sendmmsg terabyte iov_len"), sendmmsg(fd, mm, 1, 0), 1);
        m.msg_iov = &tb;
        m.msg_iovlen = 1;
        rep(N("sendmsg terabyte iov_len"), sendmsg(fd, &m, 0), 1);
        struct sockaddr_in to;
        socklen_t tl = sizeof to;
        getpeername(fd, (struct sockaddr *)&to, &tl);
        rep(N("sendto unmapped name"), sendto(fd, "x", 1, 0, (struct sockaddr *)unmapped, 16), 1);
        rep(N("sendto huge namelen"), sendto(fd, "x", 1, 0, (struct sockaddr *)&to, 1000), 1);
    }
    rep(N("sendmmsg null vector"), sendmmsg(fd, NULL, 2, 0), 1);
    /* A good one still works. */
    struct iovec hello[2] = {{"he", 2}, {"llo", 3}};
    rep(N("writev good"), writev(fd, hello, 2), 1);
    msleep(150);
    drain(fd);
#undef N
}

/* A non-blocking writev of 256 MiB on TCP: partial, and the process does
 * not keep the memory afterwards. */
static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static void big_writev(int fd) {
    size_t total = (size_t)256 << 20;
    char *b = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(b, 's', total); /* 's': the peer swallows it */
    long before = rss_kib() - (long)(total >> 10);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct iovec v[2] = {{b, total / 2}, {b + total / 2, total / 2}};
    ssize_t r = writev(fd, v, 2);
    int e = errno;
    printf("tcp big writev: %s\n", r > 0 && (size_t)r < total ? "partial" : r < 0 ? en(e) : "all");
    munmap(b, total);
    long grew = rss_kib() - before;
    printf("tcp big writev memory kept: %s\n", grew > 64 * 1024 ? "yes" : "no");
    fflush(stdout);
}

/* Finding 10: a timed receive and an SA_RESTART handler: EINTR. */
static void *kick(void *arg) {
    msleep(300);
    pthread_kill(*(pthread_t *)arg, SIGUSR1);
    return NULL;
}

static void timed_signal(const char *p, int fd) {
    struct sigaction sa = {0};
    sa.sa_handler = on_sig;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    struct timeval tv = {2, 500000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pthread_t me = pthread_self(), th;
    pthread_create(&th, NULL, kick, &me);
    char b[64];
    ssize_t r = recv(fd, b, sizeof b, 0);
    int e = errno;
    pthread_join(th, NULL);
    errno = e;
    char name[64];
    snprintf(name, sizeof name, "%s SA_RESTART with SO_RCVTIMEO", p);
    rep(name, r, 1);
    struct timeval zero = {0, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &zero, sizeof zero);
}

static int client(const char *addr, const char *peer_addr, int port) {
    /* Two pages: the first read-only, the second unmapped (nothing else
     * is mapped there while the checks run: the first page holds the
     * range). */
    readonly = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unmapped = readonly + 4096;
    munmap(unmapped, 4096);
    mprotect(readonly, 4096, PROT_READ);
    struct sockaddr_in me = sin_of(addr, 0), pe = sin_of(peer_addr, port);

    int u = socket(AF_INET, SOCK_DGRAM, 0);
    if (bind(u, (struct sockaddr *)&me, sizeof me) || connect(u, (struct sockaddr *)&pe, sizeof pe)) {
        perror("udp");
        return 1;
    }
    checks("udp", u, 0);
    timed_signal("udp", u);

    int t = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(t, (struct sockaddr *)&pe, sizeof pe)) {
        perror("tcp connect");
        return 1;
    }
    checks("tcp", t, 1);
    timed_signal("tcp", t);
    big_writev(t);
    close(t);
    close(u);
    printf("done\n");
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 3 && !strcmp(argv[1], "peer"))
        return peer(atoi(argv[2]));
    alarm(60);
    if (argc >= 5 && !strcmp(argv[1], "client"))
        return client(argv[2], argv[3], atoi(argv[4]));
    fprintf(stderr, "usage: args_check peer PORT | client ADDR PEER PORT\n");
    return 2;
}
