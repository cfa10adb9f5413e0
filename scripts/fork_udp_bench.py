#!/usr/bin/env python3
"""What a fork costs a program whose engine sockets are UDP ones: a program binds a UDP socket (on
the engine under `nanowire run`), sends one datagram, then forks `--forks` children that exit at once
(a worker pool's, or a helper's, shape), each fork timed from `fork()` to the child's reaping, inside
the program. Plainly, under run with this tree's shim and with another build's (`--before SHIM`,
`--before-bin NANOWIRE`), interleaved. Before session 28 the first fork took the socket off the
engine inside `fork()` (RCU grace periods, ~30-45 ms) and the program went on on the kernel; now it
stays on the engine until a child uses it:

    scripts/fork_udp_bench.py --before /work/bench28/prev.so --before-bin /work/bench28/prev-nanowire

`--engine own` (default) or `service` (the engine service is started once per row before its timed
runs: every `nanowire engine serve` of the host is killed first; run it on a quiet machine).
The program runs in host b of the default lab (`nanowire lab up`). Per row and repeat: the medians
over `--procs` programs of the first fork and of the median later fork, ms; the JSON (stdout) has
the environment, every repeat, the medians and the ratios of medians.
"""
import json, statistics
from rowlib import env_of, fresh_service, interleave, output_of, parser, row_argv

PROG = r"""
import os, socket, statistics, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("198.18.0.2", 0))
s.sendto(b"x", ("198.18.0.1", 9))
ts = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    ts.append((time.perf_counter() - t) * 1e3)
print("%.3f %.3f" % (ts[0], statistics.median(ts[1:])), flush=True)
"""


def one(row, a):
    argv = row_argv(row, ["python3", "-c", PROG, str(a.forks)], a)
    fresh_service(row, argv, a)
    first, later = [], []
    for _ in range(a.procs):
        f, l = output_of(argv, row).split()[-2:]
        first.append(float(f))
        later.append(float(l))
    return statistics.median(first), statistics.median(later)


def main():
    p = parser(__doc__, engine="own")
    p.add_argument("--procs", type=int, default=5)
    p.add_argument("--forks", type=int, default=20)
    a = p.parse_args()
    runs = interleave(a.repeats, lambda row: one(row, a))
    first = {r: [x[0] for x in v] for r, v in runs.items()}
    later = {r: [x[1] for x in v] for r, v in runs.items()}
    mf = {r: statistics.median(v) for r, v in first.items()}
    ml = {r: statistics.median(v) for r, v in later.items()}
    print(json.dumps({
        "env": env_of(a, engine=a.engine),
        "procs": a.procs, "forks": a.forks, "repeats": a.repeats,
        "first_fork_ms": first, "later_fork_ms": later,
        "median_first_ms": mf, "median_later_ms": ml,
        "ratios": {"first run/plain": round(mf["run"] / mf["plain"], 3),
                   "first run/before": round(mf["run"] / mf["before"], 3),
                   "later run/plain": round(ml["run"] / ml["plain"], 3),
                   "later run/before": round(ml["run"] / ml["before"], 3)},
    }, indent=1))


if __name__ == "__main__":
    main()
