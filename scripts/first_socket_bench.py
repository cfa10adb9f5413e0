#!/usr/bin/env python3
"""A new process's first engine socket: how long a program's first UDP socket, bind and sendto take
(timed inside the program, so the process's own start is not counted), plainly, under `nanowire
run` with this tree's shim and with another build's (`--before SHIM`, `--before-bin NANOWIRE`),
interleaved (session 27: the membarrier registration's RCU grace period, 5-17 ms, was paid here):

    scripts/first_socket_bench.py --before /work/bench27/prev.so --before-bin /work/bench27/prev-nanowire

`--engine service` (default): the processes attach to the engine service (started once per row
before its timed runs, so its own start is not counted: every `nanowire engine serve` of the host is
killed first; run it on a quiet machine). `--engine own`: each process makes its engine.
`--threads`: the program starts a thread before its first socket (most servers have some).
The program runs in host b of the default lab (`nanowire lab up`) and sends to host a's discard port.
Per row and repeat: the median of `--procs` processes, ms; the JSON (stdout) has the environment,
every repeat, the medians and the ratios of medians.
"""
import statistics
from rowlib import fresh_service, output_of, parser, report, row_argv

PROG = r"""
import socket, sys, threading, time
if sys.argv[1] == "1":
    threading.Thread(target=time.sleep, args=(0.2,), daemon=True).start()
t = time.perf_counter()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("198.18.0.2", 0))
s.sendto(b"x", ("198.18.0.1", 9))
print("%.3f" % ((time.perf_counter() - t) * 1e3), flush=True)
"""


def prog(a):
    return ["python3", "-c", PROG, "1" if a.threads else "0"]


def one(row, a):
    argv = row_argv(row, prog(a), a)
    fresh_service(row, argv, a)
    return statistics.median(float(output_of(argv, row, 60).split()[-1]) for _ in range(a.procs))


def main():
    p = parser(__doc__)
    p.add_argument("--threads", action="store_true", help="the program starts a thread first")
    p.add_argument("--procs", type=int, default=10)
    a = p.parse_args()
    report(a, lambda row: one(row, a), "runs_ms", dict(engine=a.engine, threads=a.threads), "median_ms",
           procs=a.procs)


if __name__ == "__main__":
    main()
