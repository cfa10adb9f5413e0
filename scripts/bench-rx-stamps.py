#!/usr/bin/env python3
"""What receive stamps cost the xdp engine (issue 13): xdp ping-pong (`nanowire bench pp`, 64 B,
both ends xdp) without and with `--rx-stamps` (the client's engine reads CLOCK_REALTIME for every
frame it takes off its RX ring, pp reads it once more per reply and reports ring -> application),
interleaved in one run, one lab. Prints JSON: p50 per repeat, medians, the ratio, the client's
ring -> application p50, and the environment.

    flock /tmp/nanowire-bench.lock scripts/bench-rx-stamps.py --repeats 3 --seconds 3
"""
import argparse, json, os, platform, statistics, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--lab", default="nwrxstamp")
    a = ap.parse_args()
    subprocess.run([compare.NW, "lab", "up", "--name", a.lab], check=True, stdout=subprocess.DEVNULL)
    res = {"plain": [], "rx_stamps": []}
    r2a = []
    try:
        for _ in range(a.repeats):
            for label, extra in (("plain", []), ("rx_stamps", ["--rx-stamps"])):
                srv = compare.Server(a.lab, compare.nw_server("xdp"))
                try:
                    d = compare.run_client(a.lab, compare.nw_pp("xdp", a.seconds, 64, ["--no-fallback"] + extra),
                                           lambda t: json.loads(t[t.index("{"):]), timeout=a.seconds + 60)
                finally:
                    srv.stop()
                res[label].append(d["latency_us"]["p50"])
                if d.get("ring_to_app_us"):
                    r2a.append(d["ring_to_app_us"]["p50"])
    finally:
        subprocess.run([compare.NW, "lab", "down", "--name", a.lab], stdout=subprocess.DEVNULL)
    med = {k: statistics.median(v) for k, v in res.items()}
    print(json.dumps({
        "benchmark": "xdp pp 64 B one-way p50 (us), without vs with --rx-stamps",
        "p50_per_repeat": res,
        "median_p50": med,
        "ratio_rx_stamps_over_plain": round(med["rx_stamps"] / med["plain"], 3),
        "client_ring_to_app_p50_us": r2a,
        "env": {"kernel": platform.release(), "cpus": os.cpu_count(),
                "loadavg": open("/proc/loadavg").read().split()[:3]},
    }, indent=1))


if __name__ == "__main__":
    main()
