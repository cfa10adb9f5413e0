#!/usr/bin/env python3
"""Where one message's time goes, step by step: sockperf ping-pong under `nanowire run` (both ends)
with the probe shim (the `probe` feature: `nanowire_probe`, its marks named by `probe::Mark`).

Each side's shim prints a line every 100,000 messages: each mark's median distance in ns from the
moment the message's frame was first seen on the RX ring, up to the kick that sends the answer
("kick"). This script builds the probe shim (cargo feature `probe`, profile `shim`, its own target
directory: `--target-dir`, default target-probe), brings up a lab of its own (`nanowire lab up
--name probe<pid>`, removed at the end), runs the pair for each protocol asked, and prints per side
the marks in order with the step from the mark before, and one JSON object.

    scripts/probe.py                     # UDP and TCP, 6 s each, unpinned, the default profile
    scripts/probe.py --tcp --seconds 10 --profile latency --pin
    scripts/probe.py --shim target-probe/shim/libnanowire_preload.so --udp   # no build
    scripts/probe.py --serial --tcp      # LFENCE before each mark: a stall shows where it happens

Each mark costs an RDTSC and a few loads (~8 ns here): a step includes the marks inside it, and the
latency printed is the probed shim's, not comparable with an unprobed run. Steps are medians of
distances, not distances of medians: a step's value is the difference of two medians.
"""
import argparse, json, os, re, signal, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NW = os.path.abspath(os.environ.get("NANOWIRE", os.path.join(ROOT, "target/release/nanowire")))
A, B = "198.18.0.1", "198.18.0.2"
PORT = 11111

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worklib import ns  # noqa: E402


def build(target, serial):
    env = dict(os.environ, CARGO_TARGET_DIR=target)
    feature = "probe-serial" if serial else "probe"
    subprocess.run(["cargo", "build", "--profile", "shim", "--locked", "-p", "nanowire-preload",
                    "--features", feature], cwd=ROOT, env=env, check=True)
    return os.path.join(target, "shim", "libnanowire_preload.so")


def probe_lines(text):
    """Each PROBE line's marks: [{name: ns}]."""
    out = []
    for line in text.splitlines():
        m = re.match(r"PROBE pid \d+ n (\d+) (.*)", line)
        if not m:
            continue
        f = m.group(2).split()
        out.append({f[i]: int(f[i + 1]) for i in range(0, len(f) - 1, 2)})
    return out


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else None


def merged(reports):
    """Each mark's median over the reports (a mark present in at least half of them)."""
    names = {k for r in reports for k in r}
    m = {k: median([r[k] for r in reports if k in r]) for k in names
         if 2 * sum(k in r for r in reports) >= len(reports)}
    return dict(sorted(m.items(), key=lambda kv: kv[1]))


def run_pair(args, lab, shim, proto):
    env = dict(os.environ, NANOWIRE_PRELOAD=shim, NANOWIRE_LOG="error")
    run = [NW, "run", "--profile", args.profile, "--"]
    pin = lambda cpu: ["taskset", "-c", str(cpu)] if args.pin else []
    extra = ["--tcp"] if proto == "tcp" else []
    srv = subprocess.Popen(ns(lab, "b") + run + pin(1) + ["sockperf", "sr", "-i", B, "-p", str(PORT)]
                           + extra, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    time.sleep(args.settle)
    cli = subprocess.run(ns(lab, "a") + run + pin(0) + ["sockperf", "pp", "-i", B, "-p", str(PORT),
                         "-t", str(args.seconds), "-m", str(args.size)] + extra,
                         env=env, capture_output=True, text=True)
    # `ip netns exec`, `nanowire run` and taskset exec: the child is sockperf itself.
    srv.send_signal(signal.SIGINT)
    try:
        _, serr = srv.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        srv.kill()
        _, serr = srv.communicate()
    p50 = re.search(r"percentile 50\.000 =\s*([\d.]+)", cli.stdout + cli.stderr)
    return {
        "p50_us": float(p50.group(1)) if p50 else None,
        "client": merged(probe_lines(cli.stderr)),
        "server": merged(probe_lines(serr)),
        "reports": [len(probe_lines(cli.stderr)), len(probe_lines(serr))],
    }


def table(name, marks):
    print(f"  {name}:", file=sys.stderr)
    last = 0
    for k, v in marks.items():
        print(f"    {k:<16} {v:>5} ns  (+{v - last})", file=sys.stderr)
        last = v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tcp", action="store_true")
    g.add_argument("--udp", action="store_true")
    ap.add_argument("--shim", help="a probe shim already built (no build)")
    ap.add_argument("--target-dir", help="default target-probe (target-probe-serial with --serial)")
    ap.add_argument("--serial", action="store_true",
                    help="LFENCE before each mark's RDTSC (stalls charged where they happen)")
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--settle", type=float, default=1.5, help="seconds for the server to start")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--profile", choices=["balanced", "latency"], default="balanced")
    ap.add_argument("--pin", action="store_true", help="server on CPU 1, client on CPU 0")
    args = ap.parse_args()
    protos = ["tcp"] if args.tcp else ["udp"] if args.udp else ["udp", "tcp"]
    target = args.target_dir or os.path.join(ROOT, "target-probe" + ("-serial" if args.serial else ""))
    shim = os.path.abspath(args.shim) if args.shim else build(target, args.serial)
    lab = f"probe{os.getpid()}"
    subprocess.run([NW, "lab", "up", "--name", lab], check=True, stdout=subprocess.DEVNULL)
    out = {"shim": shim, "serial": args.serial, "seconds": args.seconds, "profile": args.profile, "pin": args.pin,
           "size": args.size, "kernel": os.uname().release, "cpus": os.cpu_count()}
    try:
        subprocess.run(ns(lab, "a") + ["ping", "-c", "1", "-W", "5", B], stdout=subprocess.DEVNULL)
        for p in protos:
            r = run_pair(args, lab, shim, p)
            out[p] = r
            print(f"{p}: p50 {r['p50_us']} us (probed), reports client/server {r['reports']}",
                  file=sys.stderr)
            table("server", r["server"])
            table("client", r["client"])
    finally:
        subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
