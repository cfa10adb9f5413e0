/* clone() called by the program itself (issue 24 item 4): a bound UDP
 * socket answers one datagram (under run: on the engine), then a child
 * made by clone(CLONE_FILES | SIGCHLD) (it shares the fd table) answers
 * the next one, the parent the next, then a child made by clone(SIGCHLD)
 * (a copy of the fd table, as fork, but no pthread_atfork handler runs),
 * then the parent again. Each answer names who read which datagram: a
 * datagram read twice or lost shows in the output. Each child is made
 * once the datagram it answers is queued on the socket (poll): the kernel
 * queues it on the socket the child shares, so the child reads it (under
 * run it was on the engine's queue when the socket went to the kernel).
 * Usage: clone_files ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int s;

static void answer(const char *who) {
    char b[256], r[300];
    struct sockaddr_in src;
    socklen_t sl = sizeof src;
    ssize_t n = recvfrom(s, b, sizeof b - 1, 0, (struct sockaddr *)&src, &sl);
    if (n < 0) {
        printf("%s: recvfrom failed: %m\n", who);
        fflush(stdout);
        return;
    }
    b[n] = 0;
    int m = snprintf(r, sizeof r, "%s got %s", who, b);
    if (sendto(s, r, m, 0, (struct sockaddr *)&src, sl) < 0)
        printf("%s: sendto failed: %m\n", who);
    printf("%s\n", r);
    fflush(stdout);
}

static int kid(void *who) {
    answer(who);
    return 0;
}

static void in_child(const char *who, int flags) {
    static char stack[1 << 16];
    struct pollfd q = {.fd = s, .events = POLLIN};
    if (poll(&q, 1, -1) != 1) {
        perror("poll");
        exit(1);
    }
    pid_t p = clone(kid, stack + sizeof stack, flags, (void *)who);
    if (p < 0) {
        perror("clone");
        exit(1);
    }
    int st;
    waitpid(p, &st, 0);
    printf("%s exited %d\n", who, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (bind(s, (struct sockaddr *)&a, sizeof a)) {
        perror("bind");
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    answer("parent");
    in_child("CLONE_FILES child", CLONE_FILES | SIGCHLD);
    answer("parent");
    in_child("clone child", SIGCHLD);
    answer("parent");
    close(s);
    return 0;
}
