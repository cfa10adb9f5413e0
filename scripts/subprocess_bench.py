#!/usr/bin/env python3
"""A server that runs a helper program: request-response time on its connection and its UDP socket
before and after one `subprocess.run(["/bin/true"])` (which vforks), plainly, under `nanowire run`
with this tree's shim and with another build's (`--before SHIM`, `--before-bin NANOWIRE`),
interleaved. Before session 28 the vfork moved every engine socket of the process to the kernel (the
shim cannot see which fd a vfork child takes); now vfork is a fork under run and the helper's exec
takes only what it inherits (nothing here), so the sockets stay on the engine:

    scripts/subprocess_bench.py --before /work/bench28/prev.so --before-bin /work/bench28/prev-nanowire

The server (Python) runs in host b of the default lab (`nanowire lab up`) on its own engine (or
`--engine service`), the client (Python, plain) in host a: `--n` 64-byte round trips on the
connection and on the UDP socket, the helper (its `subprocess.run` timed by the server: a fork
copies the page tables a vfork does not), `--n` more each. Per row and repeat the client's
median round trip (µs) for each phase; the JSON (stdout) has the environment, every repeat, the
medians and the ratios (after/before per row, and run/before after the helper).
"""
import argparse, json, statistics, subprocess
from rowlib import ROWS, env_of, in_b, interleave, row_argv

SERVER = r"""
import socket, subprocess, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("198.18.0.2", port)); ls.listen(4)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("198.18.0.2", port))
print("listening", flush=True)
c, _ = ls.accept()
def phase():
    for _ in range(n):
        c.sendall(c.recv(64))
    for _ in range(n):
        d, a = u.recvfrom(64)
        u.sendto(d, a)
phase()
t = time.perf_counter()
subprocess.run(["/bin/true"])
helper = (time.perf_counter() - t) * 1e6
phase()
print("helper_us %.1f" % helper, flush=True)
"""
CLIENT = r"""
import socket, statistics, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
for _ in range(200):
    try:
        c = socket.create_connection(("198.18.0.2", port), timeout=10); break
    except OSError:
        time.sleep(0.05)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(10)
msg = b"x" * 64
out = []
for ph in range(2):
    t = []
    for _ in range(n):
        s = time.perf_counter(); c.sendall(msg); b = b""
        while len(b) < 64:
            b += c.recv(64 - len(b))
        t.append(time.perf_counter() - s)
    out.append(statistics.median(t) * 1e6)
    t = []
    for _ in range(n):
        s = time.perf_counter(); u.sendto(msg, ("198.18.0.2", port)); u.recvfrom(64)
        t.append(time.perf_counter() - s)
    out.append(statistics.median(t) * 1e6)
print(" ".join("%.1f" % x for x in out), flush=True)
"""


KEYS = ["tcp_before_us", "udp_before_us", "tcp_after_us", "udp_after_us", "helper_us"]


def one(row, a, port):
    srv = subprocess.Popen(in_b(row_argv(row, ["python3", "-c", SERVER, str(port), str(a.n)], a)),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    srv.stdout.readline()
    out = subprocess.run(["ip", "netns", "exec", "nw-a", "python3", "-c", CLIENT, str(port), str(a.n)],
                         capture_output=True, text=True, timeout=300)
    helper = float(srv.stdout.read().split()[-1])
    srv.wait(timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{row}: {out.stderr[-500:]}")
    return dict(zip(KEYS, [*(float(x) for x in out.stdout.split()), helper]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--before-bin")
    p.add_argument("--engine", choices=["service", "own"], default="own")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--n", type=int, default=2000)
    a = p.parse_args()
    ports = iter(range(17001, 17100))
    got = interleave(a.repeats, lambda row: one(row, a, next(ports)))
    runs = {r: {k: [x[k] for x in got[r]] for k in KEYS} for r in ROWS}
    med = {r: {k: statistics.median(v) for k, v in runs[r].items()} for r in ROWS}
    ratios = {}
    for r in ROWS:
        for proto in ["tcp", "udp"]:
            ratios[f"{r} {proto} after/before"] = round(med[r][f"{proto}_after_us"] / med[r][f"{proto}_before_us"], 3)
    ratios["helper run/plain"] = round(med["run"]["helper_us"] / med["plain"]["helper_us"], 3)
    ratios["helper run/before"] = round(med["run"]["helper_us"] / med["before"]["helper_us"], 3)
    for proto in ["tcp", "udp"]:
        ratios[f"after: run/before {proto}"] = round(med["run"][f"{proto}_after_us"] / med["before"][f"{proto}_after_us"], 3)
        ratios[f"after: run/plain {proto}"] = round(med["run"][f"{proto}_after_us"] / med["plain"][f"{proto}_after_us"], 3)
    print(json.dumps({
        "env": env_of(a, engine=a.engine),
        "n": a.n, "repeats": a.repeats, "runs": runs, "median": med, "ratios": ratios,
    }, indent=1))


if __name__ == "__main__":
    main()
