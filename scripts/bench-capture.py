#!/usr/bin/env python3
"""Capture benchmarks (issue 13), interleaved in one run; prints one JSON object.

1. tap: xdp ping-pong (both ends xdp, 64 B) with no capture vs with `nanowire capture` tapping the
   server's engine (pcapng written to /dev/null: the cost of copying, merging and formatting every
   frame, not of a disk). Ratio of p50 (and p99) medians.
2. rate: a generator in host a (AF_XDP, paced, 64 B) sends to host b for --seconds at each rate of a
   ladder; in host b either `nanowire capture --xdp` (dedicated) or `tcpdump` (AF_PACKET, default
   buffer) captures the port. Frames captured vs sent; the highest rate with zero loss for each.
3. burst: back-to-back bursts of N datagrams into a stalled capture (SIGSTOP while the burst
   arrives, SIGCONT 0.5 s later); the largest N captured without loss, each way (dedicated: ring
   16384 frames; tcpdump: its default 2 MiB buffer).

Run it alone on the machine:
    flock /tmp/nanowire-bench.lock scripts/bench-capture.py --repeats 3 --seconds 3
"""
import argparse, json, os, re, signal, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (the lab conventions: NW, addresses, parsers, env)

NW, B = compare.NW, compare.B
CAP_PORT = 7000


def in_ns(lab, host, argv, **kw):
    return subprocess.Popen(["ip", "netns", "exec", f"{lab}-{host}"] + argv, **kw)


def stop(p, sig=signal.SIGINT, timeout=20):
    p.send_signal(sig)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return out or "", err or ""


def pingpong(lab, secs, with_tap):
    srv = compare.Server(lab, compare.nw_server("xdp"))
    cap = None
    try:
        if with_tap:
            cap = in_ns(lab, "b", [NW, "capture", "-i", f"{lab}-b0", "-w", "/dev/null"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
        res = compare.run_client(lab, compare.nw_pp("xdp", secs, 64, ["--no-fallback"]),
                                 compare.nanowire_parse, timeout=secs + 60)
    finally:
        if cap:
            _, err = stop(cap)
            m = re.search(r"(\d+) frames written.*?(\d+) engine copies dropped", err)
            res_cap = {"frames": int(m.group(1)), "dropped_copies": int(m.group(2))} if m else {"stderr": err[-500:]}
        srv.stop()
    if cap:
        res["capture"] = res_cap
    return res


# Capture files go to a private directory (mkdtemp: mode 0700, a fresh name), never to a fixed
# name in world-writable /tmp (we run as root).
PRIV = tempfile.mkdtemp(prefix="nwcap-bench-")


def capture_rate(lab, kind, rate, secs, count=None, stall=False):
    """Send at `rate` (or a burst of `count`) to B:CAP_PORT while `kind` captures; (sent, captured).
    `stall`: the capture process is stopped (SIGSTOP) while the burst arrives and resumed 0.5 s
    later, so what survives is what its buffer (ring or socket buffer) absorbed."""
    ifb = f"{lab}-b0"
    if kind == "dedicated":
        cap = in_ns(lab, "b", [NW, "capture", "--xdp", "--ring", "16384", "-i", ifb, "-w", os.path.join(PRIV, "c.pcapng"),
                               "--port", str(CAP_PORT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    else:
        cap = in_ns(lab, "b", ["tcpdump", "-i", ifb, "-n", "-w", os.path.join(PRIV, "c.pcap"), "udp", "port", str(CAP_PORT)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Wait until the capture is really capturing: its program attached and socket bound (nanowire),
    # its socket open (tcpdump). Loading an XDP program on a loaded machine can take seconds.
    token = "dedicated XDP capture" if kind == "dedicated" else "listening on"
    timer = threading.Timer(30, cap.kill)
    timer.start()
    seen = []
    while True:
        line = cap.stderr.readline()
        if not line or token in line:
            break
        seen.append(line)
    timer.cancel()
    if not line:
        raise RuntimeError(f"{kind} capture did not start: {''.join(seen)[-1000:]}")
    time.sleep(0.2)
    gen = [NW, "bench", "burst", "-i", B, "-p", str(CAP_PORT), "-m", "64", "--engine", "xdp", "--cpu", "0", "--json"]
    gen += ["-n", str(count)] if count else ["--rate", str(rate), "--duration", str(secs)]
    if stall:
        cap.send_signal(signal.SIGSTOP)
    g = subprocess.run(["ip", "netns", "exec", f"{lab}-a"] + gen, capture_output=True, text=True, timeout=secs + 60)
    sent = json.loads(g.stdout[g.stdout.index("{"):])["sent"] if "{" in g.stdout else 0
    if stall:
        time.sleep(0.5)
        cap.send_signal(signal.SIGCONT)
    time.sleep(1.0)
    _, err = stop(cap)
    if kind == "dedicated":
        m = re.search(r"(\d+) frames written", err)
        got = int(m.group(1)) if m else -1
    else:
        m = re.search(r"(\d+) packets? captured", err)
        got = int(m.group(1)) if m else -1
    for f in (os.path.join(PRIV, "c.pcapng"), os.path.join(PRIV, "c.pcap")):
        try:
            os.unlink(f)
        except FileNotFoundError:
            pass
    return sent, got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--lab", default="nwcapbench")
    ap.add_argument("--rates", default="50000,100000,200000,400000,800000")
    ap.add_argument("--bursts", default="1000,4096,16384,65536")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: tap,rate,burst")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    subprocess.run([NW, "lab", "up", "--name", a.lab], check=True, stdout=subprocess.DEVNULL)
    # Resolve b's MAC first: an xdp generator's first burst into an unresolved neighbour is cut to
    # the engine's per-neighbour queue while it resolves (counted at the sender, not the capture's loss).
    subprocess.run(["ip", "netns", "exec", f"{a.lab}-a", "ping", "-c", "1", "-W", "2", B],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {"repeats": a.repeats, "seconds": a.seconds}
    try:
        if "tap" not in skip:
            runs = {"xdp": [], "xdp + tap capture": []}
            for r in range(a.repeats):
                for label, tap in (("xdp", False), ("xdp + tap capture", True)):
                    res = pingpong(a.lab, a.seconds, tap)
                    runs[label].append(res)
                    print(f"# repeat {r + 1} {label}: p50={res.get('p50')} p99={res.get('p99')} {res.get('capture', '')}",
                          file=sys.stderr)
            med = {k: {q: statistics.median(x[q] for x in v) for q in ("p50", "p99")} for k, v in runs.items()}
            out["tap"] = {"runs": runs, "median": med,
                          "ratio_p50": round(med["xdp + tap capture"]["p50"] / med["xdp"]["p50"], 3),
                          "ratio_p99": round(med["xdp + tap capture"]["p99"] / med["xdp"]["p99"], 3)}
        if "rate" not in skip:
            rates = [int(x) for x in a.rates.split(",")]
            res = {"dedicated": {}, "tcpdump": {}}
            for rate in rates:
                for kind in ("dedicated", "tcpdump"):
                    sent, got = capture_rate(a.lab, kind, rate, a.seconds)
                    res[kind][rate] = {"sent": sent, "captured": got}
                    print(f"# rate {rate} {kind}: sent {sent} captured {got}", file=sys.stderr)
            # The generator may not reach the asked rate (on veth the sender's CPU pays for delivery,
            # and more so when the kernel stack also handles every frame): quote the rate achieved.
            for k in res:
                for v in res[k].values():
                    v["achieved_rate"] = round(v["sent"] / a.seconds)
            best = {k: max([v["achieved_rate"] for v in res[k].values() if v["sent"] > 0 and v["captured"] == v["sent"]],
                           default=0) for k in res}
            out["rate"] = {"runs": res, "zero_loss_rate": best,
                           "ratio": round(best["dedicated"] / best["tcpdump"], 2) if best["tcpdump"] else None}
        if "burst" not in skip:
            bursts = [int(x) for x in a.bursts.split(",")]
            res = {"dedicated": {}, "tcpdump": {}}
            for n in bursts:
                for kind in ("dedicated", "tcpdump"):
                    sent, got = capture_rate(a.lab, kind, 0, a.seconds, count=n, stall=True)
                    res[kind][n] = {"sent": sent, "captured": got}
                    print(f"# burst {n} {kind}: sent {sent} captured {got}", file=sys.stderr)
            best = {k: max([n for n, v in res[k].items() if v["sent"] == n and v["captured"] == n], default=0)
                    for k in res}
            out["burst"] = {"runs": res, "largest_lossless": best}
    finally:
        out["env"] = compare.env(a.lab)
        os.rmdir(PRIV)
        subprocess.run([NW, "lab", "down", "--name", a.lab], stdout=subprocess.DEVNULL)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
