#!/usr/bin/env python3
"""The shim's check of a buffer it has not seen (issue 20's argument checks: may the engine copy
from/to it as the kernel would?): a Python program sends 64 bytes from a fresh mapping each time
(`mmap` + `sendto` + `munmap`: the caches forget the range, so each send asks the kernel), plainly,
under `nanowire run` with this tree's shim and with another build's (`--before SHIM`, `--before-bin
NANOWIRE`), interleaved. Before session 28 each miss read and parsed all of `/proc/self/maps`; now
it asks for the one mapping (PROCMAP_QUERY, Linux 6.11). A forked child's or a new thread's first
buffers pay this:

    scripts/range_check_bench.py --before /work/bench28/prev.so --before-bin /work/bench28/prev-nanowire

The program runs in host b of the default lab (`nanowire lab up`) on its own engine. Per row and
repeat: µs per send (mmap and munmap included); the JSON (stdout) has the environment, every
repeat, the medians and the ratios of medians.
"""
import argparse, json, os, platform, statistics, subprocess, sys, time

NW = os.environ.get("NANOWIRE", os.path.join(os.path.dirname(__file__), "..", "target", "release", "nanowire"))
PROG = r"""
import mmap, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("198.18.0.2", 0))
dst = ("198.18.0.1", 9)
s.sendto(b"x", dst)
n = int(sys.argv[1])
t = time.perf_counter()
for i in range(n):
    m = mmap.mmap(-1, 65536)
    v = memoryview(m)
    s.sendto(v[:64], dst)
    v.release(); m.close()
print("%.2f" % ((time.perf_counter() - t) / n * 1e6), flush=True)
"""


def argv(row, a):
    prog = ["python3", "-c", PROG, str(a.n)]
    if row == "plain":
        return prog
    nw = a.before_bin if row == "before" and a.before_bin else NW
    env = ["env"] + ([f"NANOWIRE_PRELOAD={a.before}"] if row == "before" else [])
    return env + [nw, "run", "-o", "log=warn", "--"] + prog


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--before-bin")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--n", type=int, default=2000)
    a = p.parse_args()
    subprocess.run([NW, "lab", "up"], check=True, stdout=subprocess.DEVNULL)
    rows = ["plain", "run", "before"]
    runs = {r: [] for r in rows}
    for k in range(a.repeats):
        for row in rows[k % 3:] + rows[:k % 3]:
            out = subprocess.run(["ip", "netns", "exec", "nw-b"] + argv(row, a), capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"{row}: {out.stderr[-500:]}")
            runs[row].append(float(out.stdout.split()[-1]))
            print(f"repeat {k} {row} {runs[row][-1]} us", file=sys.stderr, flush=True)
    med = {r: statistics.median(v) for r, v in runs.items()}
    print(json.dumps({
        "env": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                "nanowire": os.path.realpath(NW), "before": a.before, "before_bin": a.before_bin,
                "date": time.strftime("%F %T")},
        "n": a.n, "repeats": a.repeats, "us_per_send": runs, "median_us": med,
        "ratios": {"run/plain": round(med["run"] / med["plain"], 3), "run/before": round(med["run"] / med["before"], 3),
                   "run-plain_us": round(med["run"] - med["plain"], 2), "before-plain_us": round(med["before"] - med["plain"], 2)},
    }, indent=1))


if __name__ == "__main__":
    main()
