#!/usr/bin/env python3
"""A forking UDP server (issue 24 item 1, session 33): Python's `socketserver.ForkingUDPServer`, whose
parent receives each datagram and forks a child that sends the answer on the inherited socket and
exits. Plainly and under `nanowire run` with this tree's shim and with another build's (`--before
SHIM`, e.g. the session's starting point, where the first child's send took the socket off the
parent's engine and the second's made it the kernel's), interleaved:

    scripts/forkudp_bench.py --before /work/bench33/prev.so --before-bin /work/bench33/prev-nanowire

`--before-bin NANOWIRE` runs the other row with that build's `nanowire run` and engine service.
On the engine service (the default; `--engine own`: an engine of the server's own). The service is
started afresh per row: every `nanowire engine serve` of the host is killed first; run it on a quiet
machine, as any benchmark here.

The server runs in host b of the default lab (`nanowire lab up`); a plain Python client in host a
sends `--n` datagrams one at a time, each when the last answer came (stop-and-wait), and times each
round trip. Per row and repeat: answers per second and the p50/p99 round trip (µs). The JSON
(stdout) has the environment, every repeat, the medians and the ratios of medians.
"""
import statistics, subprocess
from rowlib import interleave, env_of, parser, row_argv, start_listening

SERVER = r"""
import socketserver, sys
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(data, self.client_address)
srv = socketserver.ForkingUDPServer((addr, port), Echo)
print("listening", flush=True)
for _ in range(n):
    srv.handle_request()
srv.collect_children(blocking=True)
"""

CLIENT = r"""
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(5)
ts = []
t0 = time.perf_counter()
for i in range(n):
    d = b"request %d" % i
    a = time.perf_counter()
    c.sendto(d, (addr, port))
    if c.recvfrom(2048)[0] != d:
        print("wrong answer", i, flush=True)
        sys.exit(1)
    ts.append((time.perf_counter() - a) * 1e6)
el = time.perf_counter() - t0
ts.sort()
print("%.1f %.1f %.1f" % (n / el, ts[len(ts) // 2], ts[min(len(ts) - 1, int(len(ts) * 0.99))]), flush=True)
"""

KEYS = ("answers_s", "p50_us", "p99_us")


def one(row, a, port):
    port[0] += 1
    srv = start_listening(row, row_argv(row, ["python3", "-c", SERVER, "198.18.0.2", str(port[0]), str(a.n)], a), a)
    try:
        out = subprocess.run(["ip", "netns", "exec", "nw-a", "python3", "-c", CLIENT, "198.18.0.2",
                              str(port[0]), str(a.n)], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{row}: client: {out.stdout[-500:]} {out.stderr[-500:]}")
        srv.wait(timeout=60)
        return dict(zip(KEYS, map(float, out.stdout.split())))
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def main():
    import json
    p = parser(__doc__)
    p.add_argument("--n", type=int, default=300, help="datagrams per repeat")
    a = p.parse_args()
    port = [17600]
    runs = interleave(a.repeats, lambda row: one(row, a, port))
    med = {r: {k: statistics.median(x[k] for x in v) for k in KEYS} for r, v in runs.items()}
    ratio = lambda x, y, k: round(med[x][k] / med[y][k], 3)
    print(json.dumps({"env": env_of(a, engine=a.engine), "n": a.n, "repeats": a.repeats, "runs": runs,
                      "median": med,
                      "ratios": {f"{k} {x}/{y}": ratio(x, y, k) for k in ("answers_s", "p50_us")
                                 for x, y in (("run", "plain"), ("run", "before"))}}, indent=1))


if __name__ == "__main__":
    main()
