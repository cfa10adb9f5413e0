/* SO_TIMESTAMPING / SO_TIMESTAMPNS / SO_TIMESTAMP observations, normalized
 * (no times, no addresses that vary): run plainly and under `nanowire run`,
 * the outputs must be identical (crates/nanowire/tests/timestamping.rs).
 *
 * Usage: timestamping LOCAL_ADDR PEER_ADDR PEER_PORT
 *   an echo server must answer at PEER_ADDR:PEER_PORT (inside the lab).
 *   TS_HOLD=FILE: at the end print "holding" and wait (at most 30 s) until
 *   FILE exists, so the test can look at `nanowire stats` meanwhile.
 * alarm() bounds every run. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in peer;
static const char *local;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int mk(int port, int opt, int val) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (opt && setsockopt(s, SOL_SOCKET, opt, &val, sizeof val) != 0) {
        printf("setsockopt %d: errno %d\n", opt, errno);
        exit(1);
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, local, &a.sin_addr);
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) {
        printf("bind %d: errno %d\n", port, errno);
        exit(1);
    }
    return s;
}

static const char *cname(int level, int type) {
    if (level == SOL_SOCKET && type == SCM_TIMESTAMPING) return "SCM_TIMESTAMPING";
    if (level == SOL_SOCKET && type == SCM_TIMESTAMPNS) return "SCM_TIMESTAMPNS";
    if (level == SOL_SOCKET && type == SCM_TIMESTAMP) return "SCM_TIMESTAMP";
    if (level == SOL_IP && type == IP_RECVERR) return "IP_RECVERR";
    if (level == SOL_SOCKET && type == 64) return "SCM_TIMESTAMPNS_NEW";
    if (level == SOL_SOCKET && type == 65) return "SCM_TIMESTAMPING_NEW";
    return "other";
}

/* One recvmsg; prints what arrived. lo/hi: the window the stamp must be in
 * (CLOCK_REALTIME ns). *last: the previous stamp (monotonic check). */
static void show(const char *what, int s, int flags, uint64_t lo, uint64_t *last) {
    char data[2048], ctl[512];
    struct sockaddr_in from;
    struct iovec iov = {data, sizeof data};
    struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov,
                       .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(s, &m, flags);
    uint64_t hi = now_ns();
    if (n < 0) {
        printf("%s: %s\n", what, errno == EAGAIN ? "EAGAIN" : strerror(errno));
        return;
    }
    printf("%s: len=%zd namelen=%u flags=%s%s%s cmsgs=[", what, n, (unsigned)m.msg_namelen,
           m.msg_flags & MSG_ERRQUEUE ? "ERRQUEUE" : "", m.msg_flags & MSG_TRUNC ? "|TRUNC" : "",
           m.msg_flags & MSG_CTRUNC ? "|CTRUNC" : "");
    uint64_t st = 0;
    char extra[256] = "";
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        printf("%s%s", c == CMSG_FIRSTHDR(&m) ? "" : ",", cname(c->cmsg_level, c->cmsg_type));
        if (c->cmsg_level == SOL_SOCKET && (c->cmsg_type == SCM_TIMESTAMPING || c->cmsg_type == 65)) {
            struct scm_timestamping *t = (void *)CMSG_DATA(c);
            st = (uint64_t)t->ts[0].tv_sec * 1000000000ull + t->ts[0].tv_nsec;
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), " ts1=%d ts2=%d",
                     t->ts[1].tv_sec || t->ts[1].tv_nsec, t->ts[2].tv_sec || t->ts[2].tv_nsec);
        } else if (c->cmsg_level == SOL_SOCKET && (c->cmsg_type == SCM_TIMESTAMPNS || c->cmsg_type == 64)) {
            struct timespec *t = (void *)CMSG_DATA(c);
            st = (uint64_t)t->tv_sec * 1000000000ull + t->tv_nsec;
        } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMP) {
            struct timeval *t = (void *)CMSG_DATA(c);
            st = (uint64_t)t->tv_sec * 1000000000ull + t->tv_usec * 1000ull;
            lo -= lo % 1000; /* microseconds */
        } else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) {
            struct sock_extended_err *e = (void *)CMSG_DATA(c);
            struct sockaddr_in *off = (void *)(e + 1);
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     " ee_errno=%s origin=%u type=%u code=%u info=%u data=%u offender_family=%u",
                     e->ee_errno == ENOMSG ? "ENOMSG" : "?", e->ee_origin, e->ee_type, e->ee_code,
                     e->ee_info, e->ee_data, off->sin_family);
        }
    }
    printf("]%s", extra);
    if (st) {
        printf(" stamp_in_window=%d", st >= lo && st <= hi);
        if (last) {
            printf(" monotonic=%d", st >= *last);
            *last = st;
        }
    }
    printf("\n");
}

static int pollerr(int s, int ms) {
    struct pollfd p = {.fd = s, .events = 0};
    int r = poll(&p, 1, ms);
    return r > 0 && (p.revents & POLLERR);
}

static void send1(int s, int i) {
    char b[32];
    int n = snprintf(b, sizeof b, "stamp-%d", i);
    if (sendto(s, b, n, 0, (struct sockaddr *)&peer, sizeof peer) != n) {
        printf("send %d: errno %d\n", i, errno);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: timestamping LOCAL PEER PORT\n");
        return 2;
    }
    alarm(30);
    setvbuf(stdout, NULL, _IOLBF, 0);
    local = argv[1];
    peer.sin_family = AF_INET;
    peer.sin_port = htons(atoi(argv[3]));
    inet_pton(AF_INET, argv[2], &peer.sin_addr);

    /* The kernel turns its receive stamping on (a global static key) from a
     * workqueue after the first socket asks for it: frames that arrive
     * before carry no stamp, and SO_TIMESTAMPING then reports none. One
     * socket asks first, kept open, and we let the switch happen. */
    int warm = socket(AF_INET, SOCK_DGRAM, 0);
    int rxsw = SOF_TIMESTAMPING_RX_SOFTWARE;
    setsockopt(warm, SOL_SOCKET, SO_TIMESTAMPING, &rxsw, sizeof rxsw);
    usleep(100000);

    /* 1. SO_TIMESTAMPING: RX and TX software stamps, OPT_ID, OPT_TSONLY. */
    int want = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE |
               SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY;
    int s1 = mk(12601, SO_TIMESTAMPING, want);
    int got = 0;
    socklen_t gl = sizeof got;
    getsockopt(s1, SOL_SOCKET, SO_TIMESTAMPING, &got, &gl);
    printf("getsockopt SO_TIMESTAMPING: equal=%d len=%u\n", got == want, (unsigned)gl);
    uint64_t last_rx = 0, last_tx = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t t0 = now_ns();
        send1(s1, i);
        printf("tx %d: pollerr=%d\n", i, pollerr(s1, 2000));
        char w[32];
        snprintf(w, sizeof w, "errqueue %d", i);
        show(w, s1, MSG_ERRQUEUE, t0, &last_tx);
        snprintf(w, sizeof w, "rx %d", i);
        show(w, s1, 0, t0, &last_rx);
    }
    /* Larger than the MTU: the kernel fragments it (under run the kernel
     * socket under the fd sends it), still one stamp, the next OPT_ID. */
    {
        static char big[3000];
        memset(big, 'b', sizeof big);
        uint64_t t0 = now_ns();
        if (sendto(s1, big, sizeof big, 0, (struct sockaddr *)&peer, sizeof peer) != sizeof big) {
            printf("send big: errno %d\n", errno);
            exit(1);
        }
        printf("tx big: pollerr=%d\n", pollerr(s1, 2000));
        show("errqueue big", s1, MSG_ERRQUEUE, t0, NULL);
        show("rx big", s1, 0, t0, NULL);
    }
    show("errqueue after", s1, MSG_ERRQUEUE | MSG_DONTWAIT, 0, NULL);
    printf("pollerr after: %d\n", pollerr(s1, 0));

    /* 2. TX stamps with the packet (no OPT_TSONLY), no OPT_ID: the frame comes back. */
    want = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE;
    int s4 = mk(12604, SO_TIMESTAMPING, want);
    for (int i = 0; i < 2; i++) {
        uint64_t t0 = now_ns();
        send1(s4, 10 + i);
        printf("tx4 %d: pollerr=%d\n", i, pollerr(s4, 2000));
        show("errqueue4", s4, MSG_ERRQUEUE, t0, NULL);
        /* No RX_SOFTWARE: whether a receive stamp appears depends on other
         * sockets (the kernel's global rule); just take the datagram. */
        char b[64];
        recv(s4, b, sizeof b, 0);
    }

    /* 3. SO_TIMESTAMPNS and SO_TIMESTAMP: receive stamps only, no error queue. */
    int s2 = mk(12602, SO_TIMESTAMPNS, 1);
    int s3 = mk(12603, SO_TIMESTAMP, 1);
    uint64_t l2 = 0, l3 = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t t0 = now_ns();
        send1(s2, 20 + i);
        show("rx ns", s2, 0, t0, &l2);
        t0 = now_ns();
        send1(s3, 30 + i);
        show("rx us", s3, 0, t0, &l3);
    }
    printf("pollerr ns/us: %d %d\n", pollerr(s2, 0), pollerr(s3, 0));
    int v = 0;
    gl = sizeof v;
    getsockopt(s2, SOL_SOCKET, SO_TIMESTAMPNS, &v, &gl);
    printf("getsockopt SO_TIMESTAMPNS: %d\n", v);
    /* Turning SO_TIMESTAMP off: no stamp any more. */
    v = 0;
    setsockopt(s3, SOL_SOCKET, SO_TIMESTAMP, &v, sizeof v);
    send1(s3, 40);
    show("rx off", s3, 0, 0, NULL);

    /* 4. The _NEW options (64-bit time on every ABI; what glibc uses on
     * 32-bit targets with _TIME_BITS=64): _NEW control messages. */
    int s5 = mk(12605, 64 /* SO_TIMESTAMPNS_NEW */, 1);
    want = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
    if (setsockopt(s5, SOL_SOCKET, 65 /* SO_TIMESTAMPING_NEW */, &want, sizeof want) != 0)
        printf("SO_TIMESTAMPING_NEW: errno %d\n", errno);
    uint64_t t5 = now_ns(), l5 = 0;
    send1(s5, 50);
    show("rx new", s5, 0, t5, &l5);

    /* A control buffer too small for both messages: MSG_CTRUNC, what fits. */
    {
        send1(s5, 51);
        char data[64], ctl[CMSG_SPACE(16) + 24];
        struct iovec iov = {data, sizeof data};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                           .msg_controllen = sizeof ctl};
        ssize_t n = recvmsg(s5, &m, 0);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        printf("rx small control: n=%zd ctrunc=%d controllen=%zu first=%s\n", n,
               (m.msg_flags & MSG_CTRUNC) != 0, (size_t)m.msg_controllen,
               c ? cname(c->cmsg_level, c->cmsg_type) : "none");
    }

    /* 5. epoll reports EPOLLERR while transmit stamps are queued. */
    {
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 7};
        epoll_ctl(ep, EPOLL_CTL_ADD, s1, &ev);
        send1(s1, 60);
        struct epoll_event out[2];
        int n = epoll_wait(ep, out, 2, 2000);
        printf("epoll: n=%d err=%d data=%u\n", n, n > 0 && (out[0].events & EPOLLERR) != 0,
               n > 0 ? out[0].data.u32 : 0);
        show("errqueue epoll", s1, MSG_ERRQUEUE, 0, NULL);
        char b[64];
        recv(s1, b, sizeof b, 0);
        n = epoll_wait(ep, out, 2, 0);
        printf("epoll after: err=%d\n", n > 0 && (out[0].events & EPOLLERR) != 0);
        close(ep);
    }

    /* 6. Stamps not read yet when the socket is taken off the engine (under
     * run IP_PKTINFO does that) are still delivered, in order. */
    {
        want = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
               SOF_TIMESTAMPING_OPT_TSONLY;
        int s6 = mk(12606, SO_TIMESTAMPING, want);
        uint64_t t6 = now_ns();
        send1(s6, 70);
        send1(s6, 71);
        printf("tx6: pollerr=%d\n", pollerr(s6, 2000));
        int on = 1;
        setsockopt(s6, IPPROTO_IP, IP_PKTINFO, &on, sizeof on);
        /* Both replies first (under run: the datagrams the engine had
         * queued), then the stamps. */
        char b[64];
        ssize_t r1 = recv(s6, b, sizeof b, 0);
        ssize_t r2 = recv(s6, b, sizeof b, 0);
        printf("rx6: %zd %zd\n", r1, r2);
        show("errqueue6", s6, MSG_ERRQUEUE, t6, NULL);
        /* The second stamp may still be on its way in the kernel's case. */
        printf("tx6 second: pollerr=%d\n", pollerr(s6, 2000));
        show("errqueue6", s6, MSG_ERRQUEUE, t6, NULL);
        show("errqueue6 after", s6, MSG_ERRQUEUE | MSG_DONTWAIT, 0, NULL);
    }

    const char *hold = getenv("TS_HOLD");
    if (hold) {
        printf("holding\n");
        struct stat sb;
        for (int i = 0; i < 1500 && stat(hold, &sb) != 0; i++) usleep(20000);
    }
    return 0;
}
