#!/usr/bin/env python3
"""A daemonizing UDP server (the shape of `daemon(3)` and dnsmasq): it binds, forks; the child calls
setsid, forks again and exits; the grandchild (the daemon) echoes; the first process `_exit`s once
the daemon is up. `--mode now`: the daemon serves at once (its first use may come while the first
process lives: on the engine service the socket moves to the daemon's engine); `after`: the daemon
waits until the first process is gone (its exit leaves the socket to the daemon). Before session 29
the fork took the socket to the kernel in either case. The daemon answers as `sockperf sr` does (a
Python loop); a plain `sockperf pp` in host a (64-byte messages, `--time` s) gives the p50 round trip,
µs; rows plainly, under run with this tree's shim and with another build's (`--before SHIM`,
`--before-bin NANOWIRE`), interleaved:

    scripts/daemon_udp_bench.py --before /work/bench29/prev.so --before-bin /work/bench29/prev-nanowire --engine service

`--engine own` or `service` (the service is started afresh per row: every `nanowire engine serve` of
the host is killed first; run it on a quiet machine). The server runs in host b of the default lab.
The JSON (stdout) has the environment, every repeat's median, the medians and the ratios.
"""
import subprocess, time
from rowlib import output_of, parser, report, row_argv, sockperf_p50

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
    dn = os.open("/dev/null", os.O_RDWR)
    for k in (0, 1, 2):
        os.dup2(dn, k)
    os.write(w, b"up"); os.close(w)
    if mode == "after":
        os.read(gr, 1)
    while True:
        d, peer = u.recvfrom(65536)
        if d == b"bye":
            os._exit(0)
        # sockperf's server: a message with the client (1) and pong-request
        # (2) flags (big-endian u16 at 8) goes back with the client flag off.
        if len(d) >= 14 and d[9] & 3 == 3:
            u.sendto(d[:9] + bytes([d[9] & 0xFE]) + d[10:], peer)
os.close(w); os.close(gr)
os.waitpid(pid, 0)
os.read(r, 2)
print("listening", flush=True)
os._exit(0)
"""

def one(row, a, port):
    argv = row_argv(row, ["python3", "-c", SERVER, "198.18.0.2", str(port[0]), a.mode], a)
    if a.engine == "service" and row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    output_of(argv, row)
    cli = ["ip", "netns", "exec", "nw-a", "sockperf", "pp", "-i", "198.18.0.2", "-p", str(port[0]),
           "-t", str(a.time), "--msg-size", "64"]
    p50 = sockperf_p50(cli, row)
    bye = "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'bye', ('198.18.0.2', %d))"
    subprocess.run(["ip", "netns", "exec", "nw-a", "python3", "-c", bye % port[0]])
    port[0] += 1
    time.sleep(0.3)
    return p50


def main():
    p = parser(__doc__)
    p.add_argument("--mode", choices=["now", "after"], default="after")
    p.add_argument("--time", type=int, default=5, help="seconds of sockperf ping-pong per run")
    a = p.parse_args()
    port = [15600]
    report(a, lambda row: one(row, a, port), "p50_rtt_us", dict(engine=a.engine, mode=a.mode),
           time_s=a.time)


if __name__ == "__main__":
    main()
