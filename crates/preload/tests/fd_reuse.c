/* An fd is what the kernel says it is (issue 20, finding 1).
 *
 * fd_reuse PROTO METHOD ADDR PORT DIR
 *   PROTO  udp | tcp
 *   METHOD close_range | closefrom | fclose | syscall | dup2 | dup3 | close
 *          | asm | exec
 *          (asm: an inline `syscall` instruction no library call can see;
 *          the shim learns of it when open() returns the same number;
 *          exec: the socket is close-on-exec and the program execs itself,
 *          `fd_reuse PROTO exec-child ADDR PORT DIR FD`, whose new image
 *          goes on with the file where the socket was)
 *
 * Connects a socket to ADDR:PORT and sends "hello", closes it by METHOD,
 * opens DIR/ledger.txt (which gets the same number), writes a secret to it
 * and reads it back. Prints what it observed; the peer must receive only
 * "hello", plainly and under `nanowire run` alike. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char SECRET[] = "ACCOUNT 1234 PIN 9876\n";

int main(int argc, char **argv) {
    int child = argc == 7 && strcmp(argv[2], "exec-child") == 0;
    if (argc != 6 && !child) {
        fprintf(stderr, "usage: fd_reuse udp|tcp METHOD ADDR PORT DIR\n");
        return 2;
    }
    int tcp = strcmp(argv[1], "tcp") == 0;
    const char *how = child ? "exec" : argv[2];
    int s = child ? atoi(argv[6]) : -1;
    if (!child) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
        inet_pton(AF_INET, argv[3], &sa.sin_addr);
        s = socket(AF_INET, tcp ? SOCK_STREAM : SOCK_DGRAM, 0);
        if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof sa) != 0) {
            perror("socket/connect");
            return 1;
        }
        if (write(s, "hello", 5) != 5) {
            perror("write hello");
            return 1;
        }
        usleep(100000);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/ledger.txt", argv[5]);
    int r = -1;
    if (child) {
        r = 0; /* the kernel closed it at exec */
    } else if (strcmp(how, "exec") == 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", s);
        if (fcntl(s, F_SETFD, FD_CLOEXEC) != 0) {
            perror("FD_CLOEXEC");
            return 1;
        }
        fflush(stdout);
        execl("/proc/self/exe", argv[0], argv[1], "exec-child", argv[3], argv[4], argv[5], fd,
              (char *)NULL);
        perror("exec");
        return 1;
    } else if (strcmp(how, "close_range") == 0) {
        r = close_range(s, s, 0);
    } else if (strcmp(how, "closefrom") == 0) {
        closefrom(s);
        r = 0;
    } else if (strcmp(how, "fclose") == 0) {
        FILE *f = fdopen(s, "r+");
        r = f ? fclose(f) : -1;
    } else if (strcmp(how, "syscall") == 0) {
        r = (int)syscall(SYS_close, s);
    } else if (strcmp(how, "dup2") == 0) {
        int o = open("/dev/null", O_RDONLY);
        r = dup2(o, s) == s ? 0 : -1;
        close(o);
        r |= close(s);
    } else if (strcmp(how, "dup3") == 0) {
        int o = open("/dev/null", O_RDONLY);
        r = dup3(o, s, O_CLOEXEC) == s ? 0 : -1;
        close(o);
        r |= close(s);
    } else if (strcmp(how, "asm") == 0) {
#if defined(__x86_64__)
        long ret;
        __asm__ volatile("syscall" : "=a"(ret) : "a"((long)SYS_close), "D"((long)s) : "rcx", "r11", "memory");
        r = (int)ret;
#else
        r = (int)syscall(SYS_close, s);
#endif
    } else {
        r = close(s);
    }
    printf("closed by %s: %d\n", how, r);
    int f = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    printf("file got the socket's number: %s\n", f == s ? "yes" : "no");
    ssize_t w = write(f, SECRET, strlen(SECRET));
    printf("write: %zd\n", w);
    lseek(f, 0, SEEK_SET);
    char buf[256] = {0};
    ssize_t n = read(f, buf, sizeof buf - 1);
    printf("read back %zd: %s", n, n > 0 ? buf : "\n");
    close(f);
    /* What the file holds, read by stdio (never through the shim). */
    FILE *c = fopen(path, "r");
    char line[256] = {0};
    if (c && fgets(line, sizeof line, c))
        printf("file holds: %s", line);
    else
        printf("file holds: nothing\n");
    if (c)
        fclose(c);
    usleep(200000);
    return 0;
}
