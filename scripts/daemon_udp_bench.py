#!/usr/bin/env python3
"""A daemonizing UDP server (the shape of `daemon(3)` and dnsmasq): it binds, forks; the child calls
setsid, forks again and exits; the grandchild (the daemon) echoes; the first process `_exit`s once
the daemon is up. `--mode now`: the daemon serves at once (its first use may come while the first
process lives: on the engine service the socket moves to the daemon's engine); `after`: the daemon
waits until the first process is gone (its exit leaves the socket to the daemon). Before session 29
the fork took the socket to the kernel in either case. A plain Python client in host a times
`--n` round trips (after 200 unmeasured) and prints their median, µs; rows plainly, under run with
this tree's shim and with another build's (`--before SHIM`, `--before-bin NANOWIRE`), interleaved:

    scripts/daemon_udp_bench.py --before /work/bench29/prev.so --before-bin /work/bench29/prev-nanowire --engine service

`--engine own` or `service` (the service is started afresh per row: every `nanowire engine serve` of
the host is killed first; run it on a quiet machine). The server runs in host b of the default lab.
The JSON (stdout) has the environment, every repeat's median, the medians and the ratios.
"""
import argparse, json, statistics, subprocess, time
from rowlib import env_of, interleave, output_of, row_argv

SERVER = r"""
import os, socket, sys
addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
r, w = os.pipe()
gr, gw = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    os.close(r); os.close(gw)
    os.write(w, b"up"); os.close(w)
    if mode == "after":
        os.read(gr, 1)
    while True:
        d, peer = u.recvfrom(65536)
        if d == b"bye":
            os._exit(0)
        u.sendto(d, peer)
os.close(w); os.close(gr)
os.waitpid(pid, 0)
os.read(r, 2)
print("listening", flush=True)
os._exit(0)
"""

CLIENT = r"""
import socket, statistics, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(2)
c.connect((addr, port))
ts = []
for k in range(n + 200):
    t = time.perf_counter()
    c.send(b"%064d" % k)
    while c.recv(2048) != b"%064d" % k:
        pass
    if k >= 200:
        ts.append((time.perf_counter() - t) * 1e6)
c.send(b"bye")
print("%.2f" % statistics.median(ts), flush=True)
"""


def one(row, a, port):
    argv = row_argv(row, ["python3", "-c", SERVER, "198.18.0.2", str(port[0]), a.mode], a)
    if a.engine == "service" and row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    output_of(argv, row)
    cli = ["ip", "netns", "exec", "nw-a", "python3", "-c", CLIENT, "198.18.0.2", str(port[0]), str(a.n)]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    port[0] += 1
    if out.returncode != 0:
        raise RuntimeError(f"{row}: client: {out.stderr[-500:]}")
    time.sleep(0.3)
    return float(out.stdout.split()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary; default: this tree's")
    p.add_argument("--engine", choices=["service", "own"], default="service")
    p.add_argument("--mode", choices=["now", "after"], default="after")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--n", type=int, default=5000)
    a = p.parse_args()
    port = [15600]
    runs = interleave(a.repeats, lambda row: one(row, a, port))
    med = {r: statistics.median(v) for r, v in runs.items()}
    print(json.dumps({
        "env": env_of(a, engine=a.engine, mode=a.mode),
        "n": a.n, "repeats": a.repeats, "p50_rtt_us": runs, "median_p50_rtt_us": med,
        "ratios": {"run/plain": round(med["run"] / med["plain"], 3),
                   "run/before": round(med["run"] / med["before"], 3)},
    }, indent=1))


if __name__ == "__main__":
    main()
