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
import argparse, json, os, platform, statistics, subprocess, sys, time

NW = os.environ.get("NANOWIRE", os.path.join(os.path.dirname(__file__), "..", "target", "release", "nanowire"))
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


def ns_b(argv):
    return ["ip", "netns", "exec", "nw-b"] + argv


def row_argv(row, a):
    prog = ["python3", "-c", PROG, "1" if a.threads else "0"]
    if row == "plain":
        return prog
    nw = a.before_bin if row == "before" and a.before_bin else NW
    env = ["env"] + (["NANOWIRE_SERVICE=1"] if a.engine == "service" else [])
    if row == "before":
        env.append(f"NANOWIRE_PRELOAD={a.before}")
    return env + [nw, "run", "-o", "log=warn", "--"] + prog


def one(row, a):
    if a.engine == "service" and row != "plain":
        subprocess.run(["pkill", "-f", "engine serve"], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        # The row's service starts with a first process, not timed.
        subprocess.run(ns_b(row_argv(row, a)), capture_output=True, timeout=60)
    xs = []
    for _ in range(a.procs):
        out = subprocess.run(ns_b(row_argv(row, a)), capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{row}: {out.stderr[-500:]}")
        xs.append(float(out.stdout.split()[-1]))
    return statistics.median(xs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="the other build's shim (libnanowire_preload.so)")
    p.add_argument("--before-bin", help="the other build's nanowire binary; default: this tree's")
    p.add_argument("--engine", choices=["service", "own"], default="service")
    p.add_argument("--threads", action="store_true", help="the program starts a thread first")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--procs", type=int, default=10)
    a = p.parse_args()
    subprocess.run([NW, "lab", "up"], check=True, stdout=subprocess.DEVNULL)
    rows = ["plain", "run", "before"]
    runs = {r: [] for r in rows}
    for k in range(a.repeats):
        for row in rows[k % 3:] + rows[:k % 3]:
            runs[row].append(one(row, a))
            print(f"repeat {k} {row} {runs[row][-1]:.3f} ms", file=sys.stderr, flush=True)
    med = {r: statistics.median(v) for r, v in runs.items()}
    print(json.dumps({
        "env": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                "nanowire": os.path.realpath(NW), "before": a.before, "before_bin": a.before_bin,
                "engine": a.engine, "threads": a.threads, "date": time.strftime("%F %T")},
        "procs": a.procs, "repeats": a.repeats, "runs_ms": runs, "median_ms": med,
        "ratios": {"run/plain": round(med["run"] / med["plain"], 3),
                   "run/before": round(med["run"] / med["before"], 3)},
    }, indent=1))


if __name__ == "__main__":
    main()
