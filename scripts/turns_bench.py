#!/usr/bin/env python3
"""A parent and its forked child serving one connection in turns (session 31, issue 24 item 1): the
server in host b accepts, forks, and the two answer the client's 64-byte messages `--per-turn` at a
time each, a pipe passing the turn, for `--turns` turns. Before session 31 the connection moved once
(to the child, at its first turn), then the parent's next turn had it handed to the kernel; now it
moves on at each turn and stays on the engine. A plain Python client in host a sends each message
when the last answer came and times the round trips: the JSON (stdout) has the environment, every
repeat's p50 round trip (µs; their medians and ratios) and wall time of the whole exchange (ms);
rows plainly, under run with this tree's shim and with another build's (`--before SHIM`,
`--before-bin NANOWIRE`), interleaved:

    scripts/turns_bench.py --before /work/bench31/prev.so --before-bin /work/bench31/prev-nanowire

`--shape daemon` (session 32): the process that accepted forks and exits at once; its child waits
until it is gone (EOF on a pipe only it held), then answers every message: before session 32 the
exit handed the connection to the kernel for good, now the child takes it from the kernel onto its
engine.

On the engine service (the default; `--engine own`: the child has no engine and every row after the
first turn is the kernel's). The service is started afresh per row: every `nanowire engine serve`
of the host is killed first; run it on a quiet machine.
"""
import subprocess, time
from rowlib import parser, report, row_argv, start_listening

ACCEPT = r"""
import os, socket, sys
addr, port, turns, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port)); ls.listen(8)
print("listening", flush=True)
c, _ = ls.accept()
"""

SERVER = ACCEPT + r"""
pipes = os.pipe(), os.pipe()  # the turn: parent to child, child to parent
pid = os.fork()
me = int(pid == 0)
tok_r, tok_w = pipes[1 - me][0], pipes[me][1]
for i in range(me, turns, 2):
    if i > 0:
        os.read(tok_r, 1)
    for _ in range(per):
        d = b""
        while len(d) < 64:
            d += c.recv(64 - len(d))
        c.sendall(d)
    os.write(tok_w, b"t")
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
c.close()
"""

DAEMON = ACCEPT + r"""
ls.close()
r, w = os.pipe()
if os.fork():
    os._exit(0)
os.close(w)
os.read(r, 1)  # EOF: the process that accepted is gone
for _ in range(turns * per):
    d = b""
    while len(d) < 64:
        d += c.recv(64 - len(d))
    c.sendall(d)
c.close()
"""

CLIENT = r"""
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = socket.create_connection((addr, port), timeout=60)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
m = b"x" * 64
rtt = []
t0 = time.perf_counter_ns()
for _ in range(n):
    a = time.perf_counter_ns()
    c.sendall(m)
    d = b""
    while len(d) < 64:
        d += c.recv(64 - len(d))
    rtt.append(time.perf_counter_ns() - a)
wall = time.perf_counter_ns() - t0
rtt.sort()
print(rtt[len(rtt) // 2] / 1000, wall / 1e6)
"""


def one(row, a, port):
    code = DAEMON if a.shape == "daemon" else SERVER
    argv = row_argv(row, ["python3", "-c", code, "198.18.0.2", str(port[0]), str(a.turns),
                          str(a.per_turn)], a)
    srv = start_listening(row, argv, a)
    n = a.turns * a.per_turn
    out = subprocess.run(["ip", "netns", "exec", "nw-a", "python3", "-c", CLIENT, "198.18.0.2",
                          str(port[0]), str(n)], capture_output=True, text=True, timeout=120)
    port[0] += 1
    if out.returncode != 0:
        srv.kill()
        raise RuntimeError(f"{row}: client: {out.stderr[-500:]}")
    srv.wait(timeout=30)
    p50, wall = map(float, out.stdout.split())
    time.sleep(0.3)
    return {"p50_us": p50, "wall_ms": wall}


def main():
    p = parser(__doc__)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--per-turn", type=int, default=500, help="messages answered per turn")
    p.add_argument("--shape", choices=["turns", "daemon"], default="turns",
                   help="turns: parent and child in turns; daemon: the child alone, its parent gone")
    a = p.parse_args()
    port = [15900]
    walls = {}  # filled as the rows run (printed with the report)

    def row(r):
        v = one(r, a, port)
        walls.setdefault(r, []).append(v["wall_ms"])
        return v["p50_us"]

    report(a, row, "p50_rtt_us", dict(engine=a.engine, turns=a.turns, per_turn=a.per_turn,
                                      shape=a.shape),
           wall_ms=walls)


if __name__ == "__main__":
    main()
