/* Socket semantics the shim must not change. Run plainly and under
 * `nanowire run`; the two outputs must be identical (one line per check,
 * results and errno names, no timings, no addresses that vary).
 *
 * Usage: shim_semantics all            every portable check
 *        shim_semantics close-waiter   a thread blocked in recv while another
 *                                      thread closes the fd (shim only: the
 *                                      kernel leaves such a recv asleep)
 *        shim_semantics exec-child     (internal: the exec'd child)
 * Traffic stays on 127.0.0.1. alarm() bounds every run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *en(int e) {
    switch (e) {
    case 0: return "OK";
    case EBADF: return "EBADF";
    case EAGAIN: return "EAGAIN";
    case EMSGSIZE: return "EMSGSIZE";
    case ENOTCONN: return "ENOTCONN";
    case ENOTSOCK: return "ENOTSOCK";
    case EDESTADDRREQ: return "EDESTADDRREQ";
    case EINVAL: return "EINVAL";
    case EFAULT: return "EFAULT";
    case ECONNREFUSED: return "ECONNREFUSED";
    case EINTR: return "EINTR";
    case EADDRINUSE: return "EADDRINUSE";
    case EPIPE: return "EPIPE";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    default: return "E?";
    }
}

/* print "name: ret errno" */
static void rep(const char *name, long r) {
    int e = errno;
    printf("%s: %ld %s\n", name, r, r < 0 ? en(e) : "OK");
    fflush(stdout);
}

static void msleep(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* UDP sockets bind to $SEM_ADDR (default 127.0.0.1): in a lab host that is
 * the veth address, so the shim puts them on the xdp engine. */
static int udp_bound(struct sockaddr_in *out) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    const char *env = getenv("SEM_ADDR");
    if (env) a.sin_addr.s_addr = inet_addr(env);
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) { perror("bind"); exit(2); }
    socklen_t l = sizeof *out;
    getsockname(s, (struct sockaddr *)out, &l);
    return s;
}

struct delayed { int fd; struct sockaddr_in to; int ms; const char *msg; };
static void *send_later(void *p) {
    struct delayed *d = p;
    msleep(d->ms);
    sendto(d->fd, d->msg, strlen(d->msg), 0, (struct sockaddr *)&d->to, sizeof d->to);
    return NULL;
}

static void tcp_pair(int *cli, int *srv) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(l, (struct sockaddr *)&a, sizeof a);
    listen(l, 4);
    socklen_t len = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &len);
    *cli = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*cli, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); exit(2); }
    *srv = accept(l, NULL, NULL);
    close(l);
}

struct cw { int fd; long r; int e; };
static void *close_waiter(void *p) {
    struct cw *q = p;
    char buf[64];
    errno = 0; q->r = recv(q->fd, buf, sizeof buf, 0); q->e = errno; return NULL;
}

static volatile sig_atomic_t alarms;
static void on_alarm(int s) { (void)s; alarms++; }

static void arm_100ms(void) {
    struct itimerval it = {{0, 0}, {0, 100000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

/* A handled signal interrupts a blocking recv (EINTR) unless SA_RESTART;
 * poll and epoll_wait are interrupted either way. */
static void signal_checks(void) {
    char buf[64];
    struct sockaddr_in aa, ab;
    int a = udp_bound(&aa), b = udp_bound(&ab);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    arm_100ms();
    errno = 0; long r = recv(a, buf, sizeof buf, 0); rep("recv_eintr", r);
    struct pollfd p = {.fd = a, .events = POLLIN};
    arm_100ms();
    errno = 0; r = poll(&p, 1, 5000); rep("poll_eintr", r);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct sigaction old;
    sigaction(SIGALRM, NULL, &old);
    printf("sigaction_readback: %d\n", old.sa_handler == on_alarm && (old.sa_flags & SA_RESTART) != 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev);
    arm_100ms();
    errno = 0; r = epoll_wait(ep, &ev, 1, 5000); rep("epoll_wait_eintr_even_with_sa_restart", r);
    pthread_t th;
    struct delayed d = {b, aa, 300, "rest"};
    pthread_create(&th, NULL, send_later, &d);
    arm_100ms();
    memset(buf, 0, sizeof buf);
    errno = 0; r = recv(a, buf, sizeof buf, 0);
    printf("recv_sa_restart: %ld %s\n", r, r < 0 ? en(errno) : buf);
    pthread_join(th, NULL);
    printf("alarms: %d\n", (int)alarms);
    signal(SIGALRM, SIG_DFL);
    alarm(30);
    close(ep); close(a); close(b);
}

static void checks(const char *self) {
    char buf[2048];
    struct sockaddr_in aa, ab;
    int a = udp_bound(&aa), b = udp_bound(&ab);
    long r;

    /* EBADF */
    errno = 0; r = recv(-1, buf, 10, 0); rep("recv_fd_-1", r);
    errno = 0; r = recvfrom(987, buf, 10, 0, NULL, NULL); rep("recvfrom_unopened", r);
    errno = 0; r = read(987, buf, 10); rep("read_unopened", r);
    struct pollfd bp = {.fd = 987, .events = POLLIN};
    errno = 0; r = poll(&bp, 1, 10); printf("poll_unopened: %ld revents=%#x\n", r, bp.revents);
    struct epoll_event eo[1];
    errno = 0; r = epoll_wait(987, eo, 1, 10); rep("epoll_wait_unopened", r);

    /* ENOTSOCK, and read() on a pipe still works */
    int pp[2]; pipe(pp);
    errno = 0; r = recv(pp[0], buf, 10, 0); rep("recv_on_pipe", r);
    write(pp[1], "pipe!", 5);
    errno = 0; r = read(pp[0], buf, sizeof buf); rep("read_pipe", r);

    /* EAGAIN: MSG_DONTWAIT, O_NONBLOCK via fcntl, FIONBIO via ioctl */
    errno = 0; r = recv(a, buf, sizeof buf, MSG_DONTWAIT); rep("recv_dontwait_empty", r);
    int fl = fcntl(a, F_GETFL);
    fcntl(a, F_SETFL, fl | O_NONBLOCK);
    errno = 0; r = recvfrom(a, buf, sizeof buf, 0, NULL, NULL); rep("recvfrom_nonblock_empty", r);
    errno = 0; r = read(a, buf, sizeof buf); rep("read_nonblock_empty", r);
    struct iovec iv = {buf, sizeof buf};
    errno = 0; r = readv(a, &iv, 1); rep("readv_nonblock_empty", r);
    fcntl(a, F_SETFL, fl);
    int one = 1, zero = 0;
    ioctl(a, FIONBIO, &one);
    struct msghdr mh = {.msg_iov = &iv, .msg_iovlen = 1};
    errno = 0; r = recvmsg(a, &mh, 0); rep("recvmsg_fionbio_empty", r);
    ioctl(a, FIONBIO, &zero);
    printf("fcntl_getfl_restored: %d\n", (fcntl(a, F_GETFL) & O_NONBLOCK) != 0);

    /* EMSGSIZE, EDESTADDRREQ, ENOTCONN */
    static char big[70000];
    errno = 0; r = sendto(a, big, sizeof big, 0, (struct sockaddr *)&ab, sizeof ab); rep("sendto_70000", r);
    errno = 0; r = send(a, "x", 1, 0); rep("send_unconnected_udp", r);
    struct sockaddr_in peer; socklen_t pl = sizeof peer;
    errno = 0; r = getpeername(a, (struct sockaddr *)&peer, &pl); rep("getpeername_unconnected", r);
    int t = socket(AF_INET, SOCK_STREAM, 0);
    errno = 0; r = recv(t, buf, 10, 0); rep("recv_unconnected_tcp", r);
    errno = 0; r = send(t, "x", 1, MSG_NOSIGNAL); rep("send_unconnected_tcp", r);
    close(t);

    /* blocking recv woken by data from another thread */
    pthread_t th;
    struct delayed d = {b, aa, 50, "late"};
    pthread_create(&th, NULL, send_later, &d);
    struct sockaddr_in from; socklen_t fl2 = sizeof from;
    memset(buf, 0, sizeof buf);
    errno = 0; r = recvfrom(a, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl2);
    printf("recvfrom_blocking_late: %ld %s from_is_b=%d\n", r, buf, from.sin_port == ab.sin_port);
    pthread_join(th, NULL);

    /* MSG_PEEK, then the real read, then empty */
    sendto(b, "hello", 5, 0, (struct sockaddr *)&aa, sizeof aa);
    memset(buf, 0, sizeof buf);
    r = recv(a, buf, sizeof buf, MSG_PEEK); printf("peek: %ld %s\n", r, buf);
    int avail = -1; ioctl(a, FIONREAD, &avail); printf("fionread: %d\n", avail);
    memset(buf, 0, sizeof buf);
    r = recv(a, buf, sizeof buf, 0); printf("after_peek: %ld %s\n", r, buf);
    errno = 0; r = recv(a, buf, sizeof buf, MSG_DONTWAIT); rep("after_peek_empty", r);

    /* MSG_TRUNC: returns the real length; recvmsg flags say truncated */
    memset(big, 'z', 100);
    sendto(b, big, 100, 0, (struct sockaddr *)&aa, sizeof aa);
    r = recv(a, buf, 10, MSG_TRUNC); printf("trunc_len: %ld\n", r);
    sendto(b, big, 100, 0, (struct sockaddr *)&aa, sizeof aa);
    struct iovec iv10 = {buf, 10};
    struct msghdr m2 = {.msg_iov = &iv10, .msg_iovlen = 1};
    r = recvmsg(a, &m2, 0); printf("recvmsg_trunc: %ld flags_trunc=%d\n", r, (m2.msg_flags & MSG_TRUNC) != 0);

    /* recvmmsg: WAITFORONE with two queued, and plain vlen=2 with two queued */
    sendto(b, "m1", 2, 0, (struct sockaddr *)&aa, sizeof aa);
    sendto(b, "m2", 2, 0, (struct sockaddr *)&aa, sizeof aa);
    char mb[4][16]; struct iovec mv[4]; struct mmsghdr mm[4];
    memset(mm, 0, sizeof mm);
    for (int i = 0; i < 4; i++) { mv[i].iov_base = mb[i]; mv[i].iov_len = 16; mm[i].msg_hdr.msg_iov = &mv[i]; mm[i].msg_hdr.msg_iovlen = 1; }
    r = recvmmsg(a, mm, 4, MSG_WAITFORONE, NULL); printf("recvmmsg_waitforone: %ld\n", r);
    sendto(b, "m3", 2, 0, (struct sockaddr *)&aa, sizeof aa);
    sendto(b, "m4", 2, 0, (struct sockaddr *)&aa, sizeof aa);
    r = recvmmsg(a, mm, 2, 0, NULL); printf("recvmmsg_vlen2: %ld %.2s %.2s\n", r, mb[0], mb[1]);

    /* flags the engine leaves to the kernel */
    errno = 0; r = recv(a, buf, sizeof buf, MSG_OOB | MSG_DONTWAIT); rep("recv_oob", r);
    errno = 0; r = recv(a, buf, sizeof buf, MSG_ERRQUEUE); rep("recv_errqueue_empty", r);
    errno = 0; r = sendto(b, "x", 1, MSG_OOB, (struct sockaddr *)&aa, sizeof aa); rep("sendto_oob", r);

    /* sendmmsg: three datagrams in one call, all arrive in order */
    {
        struct mmsghdr sm[3]; struct iovec sv[3]; char *words[3] = {"s1", "s22", "s333"};
        memset(sm, 0, sizeof sm);
        for (int i = 0; i < 3; i++) {
            sv[i].iov_base = words[i]; sv[i].iov_len = strlen(words[i]);
            sm[i].msg_hdr.msg_iov = &sv[i]; sm[i].msg_hdr.msg_iovlen = 1;
            sm[i].msg_hdr.msg_name = &aa; sm[i].msg_hdr.msg_namelen = sizeof aa;
        }
        r = sendmmsg(b, sm, 3, 0);
        printf("sendmmsg: %ld lens %u %u %u\n", r, sm[0].msg_len, sm[1].msg_len, sm[2].msg_len);
        for (int i = 0; i < 3; i++) {
            memset(buf, 0, sizeof buf);
            long k = recv(a, buf, sizeof buf, 0);
            printf("sendmmsg_rx%d: %ld %s\n", i, k, buf);
        }
        errno = 0; r = sendmmsg(b, sm, 0, 0); rep("sendmmsg_vlen0", r);
    }

    /* SO_RCVTIMEO: a blocking recv times out with EAGAIN */
    struct timeval tv = {0, 100000};
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    errno = 0; r = recv(a, buf, sizeof buf, 0); rep("recv_rcvtimeo", r);
    struct timeval tz = {0, 0};
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tz, sizeof tz);

    /* poll / select / pselect / ppoll: timeout on empty, ready with data */
    struct pollfd p = {.fd = a, .events = POLLIN};
    r = poll(&p, 1, 50); printf("poll_empty: %ld revents=%#x\n", r, p.revents);
    fd_set rs; FD_ZERO(&rs); FD_SET(a, &rs);
    struct timeval stv = {0, 50000};
    r = select(a + 1, &rs, NULL, NULL, &stv); printf("select_empty: %ld isset=%d\n", r, FD_ISSET(a, &rs));
    struct timespec pts = {0, 50000000};
    FD_ZERO(&rs); FD_SET(a, &rs);
    r = pselect(a + 1, &rs, NULL, NULL, &pts, NULL); printf("pselect_empty: %ld isset=%d\n", r, FD_ISSET(a, &rs));
    r = ppoll(&p, 1, &pts, NULL); printf("ppoll_empty: %ld revents=%#x\n", r, p.revents);
    d = (struct delayed){b, aa, 30, "wake"};
    pthread_create(&th, NULL, send_later, &d);
    p.revents = 0;
    r = poll(&p, 1, 5000); printf("poll_late: %ld revents=%#x\n", r, p.revents);
    pthread_join(th, NULL);
    FD_ZERO(&rs); FD_SET(a, &rs); FD_SET(pp[0], &rs);
    stv = (struct timeval){5, 0};
    r = select((a > pp[0] ? a : pp[0]) + 1, &rs, NULL, NULL, &stv);
    printf("select_ready: %ld a=%d pipe=%d\n", r, FD_ISSET(a, &rs), FD_ISSET(pp[0], &rs));
    recv(a, buf, sizeof buf, 0);

    /* epoll with mixed fds: pipe, UDP, TCP */
    int c, s; tcp_pair(&c, &s);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u32 = 1; epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &ev);
    ev.data.u32 = 2; epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev);
    ev.data.u32 = 3; epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    struct epoll_event out[8];
    r = epoll_wait(ep, out, 8, 50); printf("epoll_empty: %ld\n", r);
    write(pp[1], "p", 1);
    r = epoll_wait(ep, out, 8, 5000); printf("epoll_pipe: %ld tag=%u\n", r, r > 0 ? out[0].data.u32 : 0);
    read(pp[0], buf, 1);
    d = (struct delayed){b, aa, 30, "udp"};
    pthread_create(&th, NULL, send_later, &d);
    r = epoll_wait(ep, out, 8, 5000); printf("epoll_udp_late: %ld tag=%u\n", r, r > 0 ? out[0].data.u32 : 0);
    pthread_join(th, NULL);
    recv(a, buf, sizeof buf, 0);
    send(c, "tcp", 3, 0);
    r = epoll_pwait(ep, out, 8, 5000, NULL); printf("epoll_tcp: %ld tag=%u\n", r, r > 0 ? out[0].data.u32 : 0);
    memset(buf, 0, sizeof buf);
    r = read(s, buf, sizeof buf); printf("tcp_read: %ld %s\n", r, buf);

    /* MSG_WAITALL on TCP: 6 bytes sent in two parts */
    send(c, "abc", 3, 0);
    pid_t helper = fork();
    if (helper == 0) { msleep(30); send(c, "def", 3, 0); _exit(0); }
    memset(buf, 0, sizeof buf);
    r = recv(s, buf, 6, MSG_WAITALL); printf("waitall: %ld %s\n", r, buf);
    waitpid(helper, NULL, 0);

    /* peer close: recv returns 0 */
    close(c);
    r = recv(s, buf, sizeof buf, 0); printf("tcp_peer_closed: %ld\n", r);
    close(s);
    close(ep);

    /* dup / dup2: the copy receives; the closed original is EBADF */
    int a2 = dup(a);
    sendto(b, "dup", 3, 0, (struct sockaddr *)&aa, sizeof aa);
    memset(buf, 0, sizeof buf);
    r = recv(a2, buf, sizeof buf, 0); printf("recv_dup: %ld %s\n", r, buf);
    int a3 = dup2(a, 900);
    sendto(b, "dup2", 4, 0, (struct sockaddr *)&aa, sizeof aa);
    memset(buf, 0, sizeof buf);
    r = recv(a3, buf, sizeof buf, 0); printf("recv_dup2: %ld %s\n", r, buf);
    close(a3);
    errno = 0; r = recv(900, buf, 10, 0); rep("recv_closed_dup2", r);
    close(a2);

    /* shutdown(SHUT_RD) wakes a blocked recv with 0 */
    pid_t w = fork();
    if (w == 0) {
        /* forked child keeps using the inherited socket */
        memset(buf, 0, sizeof buf);
        long rr = recv(a, buf, sizeof buf, 0);
        _exit(rr == 4 && memcmp(buf, "fork", 4) == 0 ? 0 : 1);
    }
    msleep(30);
    sendto(b, "fork", 4, 0, (struct sockaddr *)&aa, sizeof aa);
    int st = 0; waitpid(w, &st, 0);
    printf("forked_child_recv: exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);

    /* fork + exec: the exec'd program starts clean and works */
    pid_t x = fork();
    if (x == 0) { execl(self, self, "exec-child", (char *)NULL); _exit(127); }
    waitpid(x, &st, 0);
    printf("exec_child: exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);

    /* shutdown(SHUT_RD) while another thread is blocked in recv */
    pthread_t wt;
    struct cw wa = {a, -2, 0};
    pthread_create(&wt, NULL, close_waiter, &wa);
    msleep(50);
    shutdown(a, SHUT_RD);
    pthread_join(wt, NULL);
    printf("shutdown_wakes_waiter: %ld %s\n", wa.r, wa.r < 0 ? en(wa.e) : "OK");
    errno = 0; r = recv(a, buf, sizeof buf, 0); rep("recv_after_shutdown", r);
    close(a); close(b);
    errno = 0; r = recv(a, buf, 10, 0); rep("recv_after_close", r);

    signal_checks();
}

static void exec_child(void) {
    struct sockaddr_in aa;
    int a = udp_bound(&aa);
    char buf[16];
    errno = 0;
    long r = recv(a, buf, sizeof buf, MSG_DONTWAIT);
    if (!(r < 0 && errno == EAGAIN)) exit(3);
    sendto(a, "self", 4, 0, (struct sockaddr *)&aa, sizeof aa);
    r = recv(a, buf, sizeof buf, 0);
    exit(r == 4 ? 0 : 4);
}


int main(int argc, char **argv) {
    alarm(30);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "exec-child") == 0) { exec_child(); return 0; }
    if (argc > 1 && strcmp(argv[1], "close-waiter") == 0) {
        struct sockaddr_in aa;
        int a = udp_bound(&aa);
        struct cw w = {a, -2, 0};
        pthread_t th;
        pthread_create(&th, NULL, close_waiter, &w);
        msleep(100);
        close(a);
        /* the number is reused at once: the waiter must not read from it */
        struct sockaddr_in ab;
        int b = udp_bound(&ab);
        sendto(b, "intruder", 8, 0, (struct sockaddr *)&ab, sizeof ab);
        pthread_join(th, NULL);
        printf("close_waiter: %ld %s reused=%d\n", w.r, w.r < 0 ? en(w.e) : "OK", b == a);
        return 0;
    }
    checks(argv[0]);
    return 0;
}
