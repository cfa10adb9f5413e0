#!/usr/bin/env python3
"""Short connections through an exec'd handler (the inetd shape): a Python server accepts, forks; the
parent closes its copy and accepts again; the child execs a small C handler (built with cc into a
temporary directory) with the connection as its fd, which echoes until the client's end. A plain
Python client in host a makes `--conns` connections one after another, each one 64-byte request and
its answer, then its end: connections per second and the p50 time of one connection (connect to the
answer), ms. Since session 30 the handler takes such a connection back onto the engine at its first
read (on the engine service); before, it stayed the kernel's. Rows plainly, under run with this tree's
shim and with another build's (`--before SHIM`, `--before-bin NANOWIRE`), interleaved:

    scripts/exec_churn_bench.py --before /work/bench30/prev.so --before-bin /work/bench30/prev-nanowire

On the engine service (started afresh per row: every `nanowire engine serve` of the host is killed
first; run it on a quiet machine). The JSON (stdout) has the environment, every repeat's values, the
medians and the ratios.
"""
import json, statistics, subprocess, time
from rowlib import build_c, env_of, in_b, interleave, parser, row_argv

SERVER = r"""
import os, signal, socket, sys
addr, port, handler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port)); ls.listen(64)
print("listening", flush=True)
while True:
    c, _ = ls.accept()
    pid = os.fork()
    if pid == 0:
        ls.close()
        os.set_inheritable(c.fileno(), True)
        os.execv(handler, [handler, str(c.fileno())])
    c.close()
"""

HANDLER_C = r"""
#include <stdlib.h>
#include <unistd.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    int fd = atoi(argv[1]);
    char d[4096];
    for (;;) {
        ssize_t n = recv(fd, d, sizeof d, 0);
        if (n <= 0)
            return 0;
        if (send(fd, d, n, 0) != n)
            return 1;
    }
}
"""

CLIENT = r"""
import socket, statistics, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
msg = b"x" * 64
times = []
t0 = time.perf_counter()
for _ in range(n):
    s = time.perf_counter()
    c = socket.create_connection((addr, port))
    c.sendall(msg)
    got = b""
    while len(got) < 64:
        d = c.recv(64 - len(got))
        if not d:
            raise SystemExit("short answer")
        got += d
    times.append(time.perf_counter() - s)
    c.close()
print(n / (time.perf_counter() - t0), statistics.median(times) * 1000)
"""


def one(row, a, port):
    argv = row_argv(row, ["python3", "-c", SERVER, "198.18.0.2", str(port[0]), a.handler_bin], a)
    if row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    srv = subprocess.Popen(in_b(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if srv.stdout.readline().strip() != "listening":
        raise RuntimeError(f"{row}: server: {srv.stderr.read()[-500:]}")
    cli = ["ip", "netns", "exec", "nw-a", "python3", "-c", CLIENT, "198.18.0.2", str(port[0]),
           str(a.conns)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    port[0] += 1
    srv.kill()
    srv.wait()
    subprocess.run(["pkill", "-f", "-9", a.handler_bin], stderr=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"{row}: client: {out.stdout[-500:]} {out.stderr[-500:]}")
    rate, p50 = (float(x) for x in out.stdout.split())
    time.sleep(0.3)
    return {"conns_per_s": round(rate, 1), "p50_ms": round(p50, 3)}


def main():
    p = parser(__doc__, engine=None)
    p.add_argument("--conns", type=int, default=300, help="connections per run")
    a = p.parse_args()
    a.engine = "service"
    a.handler_bin = build_c(HANDLER_C, "handler")
    port = [15800]
    runs = interleave(a.repeats, lambda row: one(row, a, port))
    med = {r: {k: statistics.median(x[k] for x in v) for k in ("conns_per_s", "p50_ms")}
           for r, v in runs.items()}
    print(json.dumps({
        "env": env_of(a, engine=a.engine, conns=a.conns),
        "repeats": a.repeats, "runs": runs, "medians": med,
        "ratios": {"run/plain conns_per_s": round(med["run"]["conns_per_s"] / med["plain"]["conns_per_s"], 3),
                   "run/before conns_per_s": round(med["run"]["conns_per_s"] / med["before"]["conns_per_s"], 3)},
    }, indent=1))


if __name__ == "__main__":
    main()
