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
import argparse, json, statistics
from rowlib import env_of, interleave, output_of, row_argv

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


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--before-bin")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--n", type=int, default=2000)
    a = p.parse_args()
    prog = ["python3", "-c", PROG, str(a.n)]
    runs = interleave(a.repeats, lambda row: float(output_of(row_argv(row, prog, a), row, 300).split()[-1]))
    med = {r: statistics.median(v) for r, v in runs.items()}
    print(json.dumps({
        "env": env_of(a),
        "n": a.n, "repeats": a.repeats, "us_per_send": runs, "median_us": med,
        "ratios": {"run/plain": round(med["run"] / med["plain"], 3), "run/before": round(med["run"] / med["before"], 3),
                   "run-plain_us": round(med["run"] - med["plain"], 2), "before-plain_us": round(med["before"] - med["plain"], 2)},
    }, indent=1))


if __name__ == "__main__":
    main()
