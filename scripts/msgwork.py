#!/usr/bin/env python3
"""Per-message work of sockperf ping-pong under `nanowire run` (both ends), without a PMU.

This machine's VMs expose no hardware counters (`perf stat -e instructions` says "not
supported"), and timing on a shared machine is noise. What does not depend on load:

* **user-space instructions** per message, counted by valgrind's callgrind (exact, whatever the
  load), with waits that sleep instead of spinning (`NANOWIRE_SPIN_US=0`, `--profile balanced`) so
  that a spin loop does not count. Per side: the whole process divided by the messages, and the
  inclusive cost per call of each interposed entry point the program used (send, recv, epoll_wait,
  ...), so the shim's own path is seen apart from the program's;
* **system calls** per message (`strace -c -f`), which is most of the kernel's share.

Both ends run in a lab of their own (`nanowire lab up --name msgwork<pid>`, removed at the end).
The counts include the process's start (engine open, program attach, sockperf's setup): use enough
seconds that it is small against the messages, or `--diff` (two runs, 1 s and SECS: the start
cancels out; the short run must outlast the start: `--base`, default 4 s).

    scripts/msgwork.py --tcp --seconds 4                    # this tree's shim
    scripts/msgwork.py --tcp --shim /work/baseline/libnanowire_preload.so
    scripts/msgwork.py --udp --tool strace --seconds 3      # syscalls per message
    scripts/msgwork.py --udp --service --diff               # the server on host b's engine service

`--insnmix`: the profiles are made with `--dump-instr=yes` and each side also reports, per message,
the executed instructions Ir does not weigh (PAUSE, LOCK-prefixed, XCHG with memory, fences, RDTSC,
SYSCALL) and the functions they are in (scripts/insnmix.py). `--sim`: callgrind's cache and branch
simulation (`--cache-sim=yes --branch-sim=yes`): per message L1/LL misses and mispredicted branches
too (one simulated core per process: lines that move between the two processes' cores are not seen).

    scripts/msgwork.py --tcp --diff --base 8 --seconds 24 --settle 10 --ping --insnmix --sim \
        --shim target-vg/release/libnanowire_preload.so

`--profile latency` counts the spinning path (the server's profile is then dumped with
`callgrind_control` before it is stopped: a spinning server under valgrind may not act on SIGINT).
Kernel events per message without valgrind (`--tool perf`: syscalls by name, context switches,
softirqs, XDP redirects, skbs; worklib.PERF_EVENTS), placed as compare.py runs sockperf (`--pin`):

    scripts/msgwork.py --udp --tool perf --profile latency --pin --diff --base 3 --seconds 8 --settle 4 --ping

`--service`: the server attaches to host b's engine service (`nanowire engine serve --daemon`,
started untraced before each run and ended with it; `NANOWIRE_SERVICE=1`), the client keeps an
engine of its own: the server side's numbers against a run without it are the service's extra.

Prints one JSON object (and a short table on stderr).
"""
import argparse, json, os, re, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worklib import (callgrind_ns, end_server, largest_profile, ns, perf_counts, profile_events,  # noqa: E402
                     settle_files, signal_ns, strace_counts, wrap)
import insnmix  # noqa: E402

NW = os.path.abspath(os.environ.get("NANOWIRE", "target/release/nanowire"))
A, B = "198.18.0.1", "198.18.0.2"
PORT = 11111
# Engine functions on the per-message path whose inclusive cost per call is reported too.
DETAIL = ["XdpTcpStream::recv_once", "XdpTcpStream::send_once", "TcpEngine::turn_with",
          "TcpEngine::transmit", "TcpStack::input", "TcpStack::poll_transmit", "rx::handle",
          "accel::recv_one", "accel::send_one", "tcpx::recv", "tcpx::send",
          "XskRx::refill_now", "XskRx::refill_shared", "XskTx::reap_shared"]
# Entry points of the shim whose inclusive cost per call is reported.
ENTRIES = ["send", "sendto", "sendmsg", "write", "recv", "recvfrom", "recvmsg", "read",
           "epoll_wait", "epoll_pwait", "poll", "select"]


def sh(*argv, **kw):
    return subprocess.run(list(argv), check=True, **kw)


def run_once(args, lab, secs, out):
    env = dict(os.environ, NANOWIRE_LOG="error")
    if args.profile != "latency":
        env["NANOWIRE_SPIN_US"] = "0"
    if args.shim:
        env["NANOWIRE_PRELOAD"] = os.path.abspath(args.shim)
    proto = ["--tcp"] if args.tcp else []
    run = [NW, "run", "--profile", args.profile, "--engine", "xdp", "--"]
    srv_env = env
    if args.service:
        sh(*ns(lab, "b"), NW, "engine", "serve", "--daemon", "--idle-ms", "600000")
        srv_env = dict(env, NANOWIRE_SERVICE="1")
    extra = (["--dump-instr=yes"] if args.insnmix else []) + \
        (["--cache-sim=yes", "--branch-sim=yes"] if args.sim else [])
    srv = subprocess.Popen(ns(lab, "b") + wrap(args.tool, out, "server", extra) + run
                           + pin(args, 1) + ["sockperf", "sr", "-i", B, "-p", str(PORT)] + proto,
                           env=srv_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(args.settle)
    if srv.poll() is not None:
        raise SystemExit("server exited: " + srv.stderr.read()[-2000:])
    cli = subprocess.run(ns(lab, "a") + wrap(args.tool, out, "client", extra) + run
                         + pin(args, 0) + ["sockperf", "pp", "-i", B, "-p", str(PORT), "-m", str(args.size),
                            "-t", str(secs)] + proto,
                         env=env, capture_output=True, text=True, timeout=600)
    if args.tool == "callgrind" and args.profile == "latency":
        # A spinning server under valgrind may not act on SIGINT before it is killed (and a
        # killed valgrind writes nothing): ask for its profile first (`server.PID.cg.1`).
        callgrind_ns(lab, "b", "--dump")
    if args.tool == "perf":
        # perf stat waits for its child and ignores the SIGINT: the program gets it.
        signal_ns(lab, "b", 2)
    srv.send_signal(2)
    end_server(srv, lab)
    if cli.returncode != 0:
        raise SystemExit("client failed: " + cli.stderr[-2000:])
    m = re.search(r"\[Total Run\].*?SentMessages=(\d+); ReceivedMessages=(\d+)", cli.stdout)
    if not m:
        raise SystemExit("no message count in sockperf's output:\n" + cli.stdout[-2000:])
    return int(m.group(2))


def pin(args, cpu):
    """compare.py's placement (`--pin`): server on CPU 1, client on CPU 0."""
    return ["taskset", "-c", str(cpu)] if args.pin else []


def callgrind_side(out, side):
    """(total Ir, {function: (inclusive Ir, calls)}, profile path) of the side's program (the
    largest profile of that side: `ip` and the launcher exec into it)."""
    total, path = largest_profile(out, side)
    tree = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=caller", "--auto=no", "--show=Ir",
                           "--threshold=100", path], capture_output=True, text=True).stdout
    funcs, calls = {}, 0
    for line in tree.splitlines():
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+<.*\((\d[\d,]*)x\)", line)
        if m:
            calls += int(m.group(2).replace(",", ""))
            continue
        # A function of its own (inlined pieces carry no "[object]").
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\*\s+\S*?:(.+?) \[.*\]$", line)
        if m:
            name = m.group(2).strip()
            short = name.split("::")[-1] if "nanowire" in name else name
            if "preload/src/exports.rs" in line and short in ENTRIES and short not in funcs:
                funcs[short] = (int(m.group(1).replace(",", "")), calls)
            elif any(k in name for k in DETAIL):
                funcs[name.replace("nanowire_", "").replace("::<impl ", "<")] = (
                    int(m.group(1).replace(",", "")), calls)
        calls = 0 if not line.strip() or "*" in line else calls
    return total, funcs, path


def strace_side(out, side):
    return strace_counts(os.path.join(out, side + ".strace"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tcp", action="store_true")
    g.add_argument("--udp", action="store_true")
    ap.add_argument("--shim", help="another shim (NANOWIRE_PRELOAD)")
    ap.add_argument("--service", action="store_true",
                    help="the server on host b's engine service (the client on its own engine)")
    ap.add_argument("--tool", choices=["callgrind", "strace", "perf"], default="callgrind",
                    help="perf: kernel events per message (tracepoints and software events, "
                         "worklib.PERF_EVENTS), best with --profile latency --pin")
    ap.add_argument("--pin", action="store_true",
                    help="server on CPU 1, client on CPU 0 (taskset), as compare.py runs them")
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--diff", action="store_true", help="two runs (BASE and SECONDS), per message of the difference")
    ap.add_argument("--base", type=int, default=4,
                    help="seconds of the shorter run of --diff (under valgrind the engine's start alone takes ~2 s)")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--profile", choices=["balanced", "latency"], default="balanced",
                    help="latency: spinning waits (for syscall counts of the spinning path; "
                         "instruction counts then include the spin loops)")
    ap.add_argument("--settle", type=float, default=None, help="seconds for the server to start")
    ap.add_argument("--insnmix", action="store_true",
                    help="also count executed PAUSE/LOCK/XCHG/fences/RDTSC/SYSCALL per message (insnmix.py)")
    ap.add_argument("--sim", action="store_true",
                    help="callgrind's cache and branch simulation: misses per message too")
    ap.add_argument("--ping", action="store_true",
                    help="resolve the hosts' neighbours (one ping) before the runs: the session-7 "
                         "shim under valgrind gets no reply when the first datagram waits for ARP")
    args = ap.parse_args()
    if args.settle is None:
        args.settle = 6.0 if args.tool == "callgrind" else 2.0
    lab = f"msgwork{os.getpid()}"
    sh(NW, "lab", "up", "--name", lab, stdout=subprocess.DEVNULL)
    try:
        if args.ping:
            sh(*ns(lab, "a"), "ping", "-c", "1", "-W", "5", B, stdout=subprocess.DEVNULL)
        runs = []
        for secs in ([args.base, args.seconds] if args.diff else [args.seconds]):
            out = tempfile.mkdtemp(prefix="msgwork.")
            msgs = run_once(args, lab, secs, out)
            settle_files(out)
            sides = {}
            for side in ("client", "server"):
                if args.tool == "callgrind":
                    total, entries, path = callgrind_side(out, side)
                    sides[side] = {"ir": total, "entries": entries, "events": profile_events(path)}
                    if args.insnmix:
                        sides[side]["mix"] = insnmix.mix(path)
                else:
                    sides[side] = {"syscalls": perf_counts(os.path.join(out, side + ".perf"))
                                   if args.tool == "perf" else strace_side(out, side)}
            runs.append({"seconds": secs, "messages": msgs, "sides": sides, "dir": out})
    finally:
        subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    res = {"proto": "tcp" if args.tcp else "udp", "shim": args.shim or "this tree", "tool": args.tool,
           "server_on_service": args.service,
           "runs": runs, "per_message": {}}
    last = runs[-1]
    first = runs[0] if args.diff else None
    dm = last["messages"] - (first["messages"] if first else 0)
    for side in ("client", "server"):
        s = last["sides"][side]
        f = first["sides"][side] if first else None
        if args.tool == "callgrind":
            ir = s["ir"] - (f["ir"] if f else 0)
            per = {"ir": round(ir / dm, 1)}
            for k, (inc, calls) in s["entries"].items():
                # With --diff, the entry's cost and calls of the difference too (the start's
                # calls, e.g. the first send that brings the socket onto the engine, cancel).
                inc0, calls0 = f["entries"].get(k, (0, 0)) if f else (0, 0)
                if calls - calls0 > 0:
                    per[k] = {"per_call": round((inc - inc0) / (calls - calls0)),
                              "calls_per_msg": round((calls - calls0) / dm, 2),
                              "per_msg": round((inc - inc0) / dm)}
            if args.sim:
                per["events"] = {e: round((v - (f["events"].get(e, 0) if f else 0)) / dm, 2)
                                 for e, v in s["events"].items()}
            if args.insnmix:
                m = insnmix.minus(s["mix"], f["mix"]) if f else s["mix"]
                per["mix"] = insnmix.per(m, dm)
        else:
            per = {}
            for k, v in s["syscalls"].items():
                v0 = f["syscalls"].get(k, 0) if f else 0
                per[k] = round((v - v0) / dm, 3)
            if args.tool == "strace":
                per["total"] = round(sum(per.values()), 3)
        res["per_message"][side] = per
    for r in runs:  # the raw profiles' analyses are not printed (big): the per-message ones are
        for s in r["sides"].values():
            s.pop("mix", None)
    print(json.dumps(res, indent=1))
    for side, per in res["per_message"].items():
        print(f"{side}: Ir/msg {per.get('ir', '-')}", file=sys.stderr)
        if "events" in per:
            print("  events/msg " + " ".join(f"{e}={v}" for e, v in per["events"].items()), file=sys.stderr)
        if "mix" in per:
            insnmix.show(per["mix"], 6)
        for k, v in sorted(per.items()):
            if k in ("events", "mix"):
                continue
            if isinstance(v, dict):
                print(f"  {k:<60} {v['per_msg']:>8} Ir/msg  {v['per_call']:>8} Ir/call  "
                      f"{v['calls_per_msg']:>6} calls/msg", file=sys.stderr)
            elif k != "ir":
                print(f"  {k:<60} {v}", file=sys.stderr)


if __name__ == "__main__":
    main()
