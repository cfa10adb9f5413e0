#!/usr/bin/env python3
"""A fork-per-connection server (issue 24 item 1), plainly and under `nanowire run` on the engine
service, with this tree's shim and with another build (`--before SHIM`, e.g. the session's
starting point, whose children reach a shared connection through the kernel), interleaved:

    scripts/forkconn_bench.py --before /work/bench25/prev.so --repeats 5 --conns 200 --body 65536

`--before-bin NANOWIRE` runs the other row with that build's `nanowire run` and engine service too
(the service is stopped before every row, so each row starts its own: every `nanowire engine serve`
of the host is killed, so run it on a quiet machine, as any benchmark here).

The server (host b of the default lab, `nanowire lab up`) accepts, forks and closes its copy; the
child reads one request line, answers `--body` bytes and exits. `--shape thread` (session 27): the
server's main thread accepts and a thread of the same process serves each connection and closes it. The client (host a, plain Python)
makes `--conns` connections one after another: connect, request, read to the end. Per row and
repeat: connections per second and the p50/p99 of one connection's time (connect to EOF), µs.
Rows run in a rotating order per repeat; the JSON (stdout) has the environment, every repeat,
the medians and the ratios of medians (run/plain, run/before).
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, time

B = "198.18.0.2"
NW = os.environ.get("NANOWIRE", os.path.join(os.path.dirname(__file__), "..", "target", "release", "nanowire"))

# The server: `fork` (a child serves each connection and exits; the parent closes its copy) or
# `thread` (a thread of the accepting process serves it: the accept sleeps while a worker's
# connection is open, and a worker's close of the last one must wake it).
SERVER = r"""
import os, signal, socket, sys, threading
addr, port, body, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port)); ls.listen(64)
print("listening", flush=True)
data = b"x" * body
def serve(c):
    b = b""
    while not b.endswith(b"\n"):
        d = c.recv(4096)
        if not d:
            break
        b += d
    c.sendall(data)
    c.close()
while True:
    c, _ = ls.accept()
    if shape == "thread":
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    elif os.fork() == 0:
        ls.close()
        serve(c)
        os._exit(0)
    else:
        c.close()
"""

CLIENT = r"""
import socket, sys, time
addr, port, n, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ts = []
t0 = time.perf_counter()
for i in range(n):
    a = time.perf_counter()
    c = socket.create_connection((addr, port), timeout=30)
    c.sendall(b"get %d\n" % i)
    got = 0
    while True:
        d = c.recv(1 << 16)
        if not d:
            break
        got += len(d)
    c.close()
    if got != body:
        print("short", i, got, flush=True)
        sys.exit(1)
    ts.append((time.perf_counter() - a) * 1e6)
el = time.perf_counter() - t0
ts.sort()
print("conns_s %.1f p50_us %.1f p99_us %.1f" % (n / el, ts[len(ts) // 2], ts[min(len(ts) - 1, int(len(ts) * 0.99))]), flush=True)
"""


def ns(h, argv):
    return ["ip", "netns", "exec", f"nw-{h}"] + argv


def one(row, shim, port, a):
    srv_argv = ["python3", "-c", SERVER, B, str(port), str(a.body), a.shape]
    # Each row starts the engine service of its own build (the service's
    # part of a change is measured with it).
    subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    if row != "plain":
        nw = a.before_bin if row == "before" and a.before_bin else NW
        svc = ["NANOWIRE_SERVICE=1"] if a.engine == "service" else []
        env = ["env"] + svc + ([f"NANOWIRE_PRELOAD={shim}"] if shim else [])
        srv_argv = env + [nw, "run", "--"] + srv_argv
    srv = subprocess.Popen(ns("b", srv_argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = srv.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"{row}: the server did not start")
        out = subprocess.run(ns("a", ["python3", "-c", CLIENT, B, str(port), str(a.conns), str(a.body)]),
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{row}: client failed: {out.stdout[-500:]} {out.stderr[-500:]}")
        w = out.stdout.split()
        return {"conns_s": float(w[1]), "p50_us": float(w[3]), "p99_us": float(w[5])}
    finally:
        srv.kill()
        srv.wait()
        subprocess.run(["pkill", "-f", f"{B} {port} {a.body} {a.shape}"], stderr=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary (its `run` and engine service); default: this tree's")
    p.add_argument("--engine", choices=["service", "own"], default="service",
                   help="the run rows on the engine service (default) or on an engine of the server's own")
    p.add_argument("--shape", choices=["fork", "thread"], default="fork",
                   help="fork: a child serves each connection; thread: a thread of the accepting process does")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--conns", type=int, default=200)
    p.add_argument("--body", type=int, default=65536)
    a = p.parse_args()
    subprocess.run([NW, "lab", "up"], check=True, stdout=subprocess.DEVNULL)
    rows = [("plain", None), ("run", ""), ("before", a.before)]
    runs = {r: [] for r, _ in rows}
    port = 17000
    for k in range(a.repeats):
        order = rows[k % len(rows):] + rows[:k % len(rows)]
        for row, shim in order:
            port += 1
            runs[row].append(one(row, shim, port, a))
            print(f"repeat {k} {row} {runs[row][-1]}", file=sys.stderr, flush=True)
    med = {r: {m: statistics.median(x[m] for x in v) for m in ("conns_s", "p50_us", "p99_us")}
           for r, v in runs.items()}
    ratio = lambda x, y, m: round(med[x][m] / med[y][m], 3)
    print(json.dumps({
        "env": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                "nanowire": os.path.realpath(NW), "before": a.before, "before_bin": a.before_bin, "engine": a.engine, "shape": a.shape, "date": time.strftime("%F %T")},
        "conns": a.conns, "body": a.body, "repeats": a.repeats, "runs": runs, "median": med,
        "ratios": {"conns_s run/plain": ratio("run", "plain", "conns_s"),
                   "conns_s run/before": ratio("run", "before", "conns_s"),
                   "p50 run/plain": ratio("run", "plain", "p50_us"),
                   "p50 run/before": ratio("run", "before", "p50_us")},
    }, indent=1))


if __name__ == "__main__":
    main()
