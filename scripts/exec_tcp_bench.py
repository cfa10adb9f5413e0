#!/usr/bin/env python3
"""A server that hands its connection to a program it execs (the inetd shape: the server accepts, then
execs the handler, which inherits the connection as its fd). Before session 30 the exec
left the connection the kernel's for good (the old image handed it over with TCP_REPAIR); now the new
image takes it back onto the engine at its first read. The handler answers as `sockperf sr` does over
TCP, reading each 64-byte message whole: `--handler c` (default) a small C program (built with cc
into a temporary directory), `python` a Python loop (whose own time hides the socket's); a `sockperf pp --tcp` in host a gives
the p50 round trip, µs (`--client run`, the default: the client under this tree's run in every row, so the
server's side is what differs); rows plainly, under run with this tree's shim and with another build's
(`--before SHIM`, `--before-bin NANOWIRE`), interleaved:

    scripts/exec_tcp_bench.py --before /work/bench30/prev.so --before-bin /work/bench30/prev-nanowire --engine own

`--engine own` or `service` (the service is started afresh per row: every `nanowire engine serve` of
the host is killed first; run it on a quiet machine). The server runs in host b of the default lab.
The JSON (stdout) has the environment, every repeat's median, the medians and the ratios.
"""
import subprocess, time
from rowlib import NW, build_c, parser, report, row_argv, sockperf_p50, start_listening

SERVER = r"""
import os, socket, sys
addr, port = sys.argv[1], int(sys.argv[2])
if len(sys.argv) > 3:
    c = socket.socket(fileno=int(sys.argv[3]))
    n = 64
    while True:
        d = b""
        while len(d) < n:
            x = c.recv(n - len(d))
            if not x:
                sys.exit(0)
            d += x
        # sockperf's server: a message with the client (1) and pong-request
        # (2) flags (big-endian u16 at 8) goes back with the client flag off.
        if d[9] & 3 == 3:
            c.sendall(d[:9] + bytes([d[9] & 0xFE]) + d[10:])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port)); ls.listen(8)
print("listening", flush=True)
c, _ = ls.accept()
ls.close()
os.set_inheritable(c.fileno(), True)
if HANDLER:
    os.execv(HANDLER, [HANDLER, str(c.fileno())])
os.execv(sys.executable, [sys.executable, "-c", "SRC = %r\nHANDLER = None\n%s" % (SRC, SRC), addr, str(port), str(c.fileno())])
"""

# The C handler: fd in argv[1]; each 64-byte message read whole, answered as sockperf's server.
HANDLER_C = r"""
#include <stdlib.h>
#include <unistd.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    int fd = atoi(argv[1]);
    unsigned char d[64];
    for (;;) {
        size_t got = 0;
        while (got < sizeof d) {
            ssize_t n = recv(fd, d + got, sizeof d - got, 0);
            if (n <= 0)
                return 0;
            got += n;
        }
        if ((d[9] & 3) == 3) {
            d[9] &= 0xFE;
            if (send(fd, d, sizeof d, 0) != sizeof d)
                return 1;
        }
    }
}
"""


def one(row, a, port):
    prog = "SRC = %r\nHANDLER = %r\n%s" % (SERVER, a.handler_bin, SERVER)
    argv = row_argv(row, ["python3", "-c", prog, "198.18.0.2", str(port[0])], a)
    srv = start_listening(row, argv, a)
    pre = [] if a.client == "plain" else [NW, "run", "-o", "log=warn", "--"]
    cli = ["ip", "netns", "exec", "nw-a"] + pre + ["sockperf", "pp", "--tcp", "-i", "198.18.0.2", "-p",
           str(port[0]), "-t", str(a.time), "--msg-size", "64"]
    p50 = sockperf_p50(cli, row)
    port[0] += 1
    try:
        srv.wait(timeout=20)
    except subprocess.TimeoutExpired:
        srv.kill()
    time.sleep(0.3)
    return p50


def main():
    p = parser(__doc__, engine="own")
    p.add_argument("--time", type=int, default=5, help="seconds of sockperf ping-pong per run")
    p.add_argument("--handler", choices=["c", "python"], default="c")
    p.add_argument("--client", choices=["run", "plain"], default="run",
                   help="the sockperf client in host a: under this tree's run (every row) or plainly")
    a = p.parse_args()
    a.handler_bin = build_c(HANDLER_C, "handler") if a.handler == "c" else None
    port = [15700]
    report(a, lambda row: one(row, a, port), "p50_rtt_us",
           dict(engine=a.engine, handler=a.handler, client=a.client), time_s=a.time)


if __name__ == "__main__":
    main()
