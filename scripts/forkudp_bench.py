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
import argparse, json, os, platform, statistics, subprocess, sys, time

B = "198.18.0.2"
NW = os.environ.get("NANOWIRE", os.path.join(os.path.dirname(__file__), "..", "target", "release", "nanowire"))

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
print("answers_s %.1f p50_us %.1f p99_us %.1f" % (n / el, ts[len(ts) // 2], ts[min(len(ts) - 1, int(len(ts) * 0.99))]), flush=True)
"""


def ns(h, argv):
    return ["ip", "netns", "exec", f"nw-{h}"] + argv


def one(row, shim, port, a):
    srv_argv = ["python3", "-c", SERVER, B, str(port), str(a.n)]
    subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    if row != "plain":
        nw = a.before_bin if row == "before" and a.before_bin else NW
        svc = ["NANOWIRE_SERVICE=1"] if a.engine == "service" else []
        env = ["env"] + svc + ([f"NANOWIRE_PRELOAD={shim}"] if shim else [])
        srv_argv = env + [nw, "run", "--"] + srv_argv
    srv = subprocess.Popen(ns("b", srv_argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if "listening" not in srv.stdout.readline():
            raise RuntimeError(f"{row}: the server did not start")
        out = subprocess.run(ns("a", ["python3", "-c", CLIENT, B, str(port), str(a.n)]),
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{row}: client failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        w = out.stdout.split()
        srv.wait(timeout=60)
        return {"answers_s": float(w[1]), "p50_us": float(w[3]), "p99_us": float(w[5])}
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary (its `run` and engine service)")
    p.add_argument("--engine", choices=["service", "own"], default="service")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--n", type=int, default=300, help="datagrams per repeat")
    a = p.parse_args()
    subprocess.run([NW, "lab", "up"], check=True, stdout=subprocess.DEVNULL)
    rows = [("plain", None), ("run", ""), ("before", a.before)]
    runs = {r: [] for r, _ in rows}
    port = 17600
    for k in range(a.repeats):
        for row, shim in rows[k % len(rows):] + rows[:k % len(rows)]:
            port += 1
            runs[row].append(one(row, shim, port, a))
            print(f"repeat {k} {row} {runs[row][-1]}", file=sys.stderr, flush=True)
    med = {r: {m: statistics.median(x[m] for x in v) for m in ("answers_s", "p50_us", "p99_us")}
           for r, v in runs.items()}
    ratio = lambda x, y, m: round(med[x][m] / med[y][m], 3)
    print(json.dumps({
        "env": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                "nanowire": os.path.realpath(NW), "before": a.before, "before_bin": a.before_bin,
                "engine": a.engine, "date": time.strftime("%F %T")},
        "n": a.n, "repeats": a.repeats, "runs": runs, "median": med,
        "ratios": {"answers_s run/plain": ratio("run", "plain", "answers_s"),
                   "answers_s run/before": ratio("run", "before", "answers_s"),
                   "p50 run/plain": ratio("run", "plain", "p50_us"),
                   "p50 run/before": ratio("run", "before", "p50_us")},
    }, indent=1))


if __name__ == "__main__":
    main()
