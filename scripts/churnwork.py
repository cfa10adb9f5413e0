#!/usr/bin/env python3
"""Per-request counts of the nginx row of `compare.py --scenario churn` (issue 24): nginx with
`--workers` workers in host b, plainly or under `nanowire run` on host b's engine service, and a
plain `ab -c 20` in host a. After `--warmup` requests, `perf stat -p` counts the nginx processes
(master and workers) and the service over `--requests` requests: tracepoints and software events
(work, not time), and task-clock (time: noisy on a loaded machine, quoted with the load), and host
b's interface counts the segments in and out (`segments_out`, `segments_in`). Prints one JSON object:
totals and per request.

    scripts/churnwork.py --lab timers1 --requests 10000          # under run on the service
    scripts/churnwork.py --lab timers1 --requests 10000 --plain  # plain nginx
"""

import argparse, json, os, signal, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import B, EngineService, churn_nginx  # noqa: E402
from worklib import PERF_EVENTS, perf_counts, pids_in  # noqa: E402

# The per-request calls of an accepted connection's life (the placeholder's socket/fcntl/close, its
# identity's getsockopt, nginx's own): counted by name; slab allocations (a socket made is six) as work.
CONN_EVENTS = [f"syscalls:sys_enter_{c}" for c in (
    "accept4", "socket", "fcntl", "dup3", "close", "getsockopt", "setsockopt", "epoll_ctl", "openat",
    "writev")] + ["kmem:kmem_cache_alloc"]
EVENTS = ["task-clock", *PERF_EVENTS, *CONN_EVENTS]


def ab(lab, url, n):
    p = subprocess.run(["ip", "netns", "exec", f"{lab}-a", "ab", "-q", "-n", str(n), "-c", str(min(20, n)), url],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or "Failed requests:        0" not in p.stdout:
        raise SystemExit(f"ab failed ({p.returncode}):\n{p.stdout[-1500:]}{p.stderr[-1500:]}")


def link_packets(lab):
    """(tx, rx) packets of host b's lab interface so far."""
    stat = f"/sys/class/net/{lab}-b0/statistics"
    out = subprocess.run(["ip", "netns", "exec", f"{lab}-b", "cat", f"{stat}/tx_packets", f"{stat}/rx_packets"],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", required=True)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--plain", action="store_true", help="nginx without nanowire")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the run (e.g. NANOWIRE_SPIN_US=0)")
    ap.add_argument("--record", metavar="FILE", help="also `perf record -g` the same processes into FILE")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nw-churnwork-") as tmp:
        svc = None if a.plain else EngineService(a.lab, "b")
        srv = None
        try:
            srv = churn_nginx(a.lab, tmp, a.port, under_run=not a.plain, workers=a.workers,
                              env_extra=tuple(a.env))
            url = f"http://{B}:{a.port}/index.html"
            end = time.time() + 20
            while True:
                try:
                    ab(a.lab, url, 1)
                    break
                except SystemExit:
                    if time.time() > end:
                        raise
                    time.sleep(0.2)
            ab(a.lab, url, a.warmup)
            pids = pids_in(a.lab, "b")
            out = os.path.join(tmp, "nginx.perf")
            perf = subprocess.Popen(["perf", "stat", "-x", ",", "-o", out, "-e", ",".join(EVENTS),
                                     "-p", ",".join(map(str, pids))])
            rec = a.record and subprocess.Popen(["perf", "record", "-g", "-q", "-o", a.record,
                                                 "-p", ",".join(map(str, pids))])
            time.sleep(0.5)
            pk0 = link_packets(a.lab)
            ab(a.lab, url, a.requests)
            pk1 = link_packets(a.lab)
            for p in (perf, rec):
                if p:
                    p.send_signal(signal.SIGINT)
                    p.wait(60)
            c = perf_counts(out)
            # Segments host b's interface sent and received (the engine's and the kernel's).
            c["segments_out"], c["segments_in"] = pk1[0] - pk0[0], pk1[1] - pk0[1]
        finally:
            if srv:
                srv.stop()
            if svc:
                svc.stop()
    per = {k: round(v / a.requests, 3) for k, v in c.items()}
    per["task-clock_us"] = round(c.get("task-clock", 0) * 1e3 / a.requests, 2)  # perf gives msec
    json.dump({"mode": "plain" if a.plain else "run on the service", "workers": a.workers,
               "requests": a.requests, "processes": len(pids), "totals": c, "per_request": per,
               "loadavg": open("/proc/loadavg").read().split()[:3]}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
