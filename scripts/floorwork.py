#!/usr/bin/env python3
"""Per-message work of the AF_XDP floor (`xsk_floor echo`/`ping`) against `nanowire bench` (the
engine alone, `bench server` / `bench pp --engine xdp`), counted in the same harness, without a PMU
and without timing (issue 22: the engine's share of the gap to the floor; docs/benchmarks.md
"Session 15: the engine vs the floor").

Both pairs run as `compare.py --scenario floor` places them (server in host b on CPU 1, client in
host a on CPU 0), in a lab of their own (`nanowire lab up --name flw<pid>`, removed at the
end). Two runs of each (`--base` and `--seconds` long): the difference, divided by the difference
in round trips, is the work per message with the start (engine open, program attach, warm-up)
cancelled out (perf, strace; callgrind: one run, see below).

    scripts/floorwork.py --tool perf               # kernel events per message (tracepoints)
    scripts/floorwork.py --tool strace             # syscalls per message, by name
    scripts/floorwork.py --tool callgrind --sim --insnmix   # user-space Ir, cache/branch sim,
                                                            # LOCK/XCHG/syscall instructions

`--tool callgrind` runs both ends under valgrind (a build with
`RUSTFLAGS=--cfg=rustix_use_libc CARGO_TARGET_DIR=target-vg`, see msgwork.py: rustix's vDSO
set-up crashes valgrind; `NANOWIRE`/`NANOWIRE_FLOOR` name the binaries); the server's profile
starts when the client does (`--instr-atstart=no`, `callgrind_control --instr=on`). Both ends
spin (the floor has no other mode), so the totals per message depend on how many idle turns a
wait took; with `--insnmix` each end's work is split instruction by instruction
(`code_per_message`): the message's own path (what ran about once a message: receive, reply,
kick) and the idle turns (what ran once per turn), with the code lines each touches. `--which
floor|bench` runs one pair only.

Prints one JSON object (and a short table on stderr).
"""
import argparse, json, os, re, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from worklib import (callgrind_ns, end_server, largest_profile, ns, perf_counts, profile_events,  # noqa: E402
                     settle_files, signal_ns, stop_left, strace_counts, wrap)
import insnmix  # noqa: E402

NW = os.path.abspath(os.environ.get("NANOWIRE", "target/release/nanowire"))
FLOOR = os.path.abspath(os.environ.get("NANOWIRE_FLOOR", "target/release/examples/xsk_floor"))
A, B = "198.18.0.1", "198.18.0.2"
PORT = 11122


def commands(which, lab, secs):
    """(server argv, client argv, parse(client stdout) -> round trips) of one pair."""
    if which == "floor":
        return ([FLOOR, "echo", f"{lab}-b0", str(PORT), "1"],
                [FLOOR, "ping", f"{lab}-a0", B, "auto", str(PORT), str(secs), "0"],
                lambda out: json.loads(out[out.index("{"):])["round_trips"])
    return ([NW, "bench", "server", "-i", B, "-p", str(PORT), "--engine", "xdp", "--cpu", "1", "--no-fallback"],
            [NW, "bench", "pp", "-i", B, "-p", str(PORT), "-m", "64", "-t", str(secs), "--engine", "xdp",
             "--cpu", "0", "--json", "--no-fallback"],
            lambda out: json.loads(out[out.index("{"):])["received"])


def run_once(args, which, lab, secs, out):
    name = f"{which}{secs}"
    srv_argv, cli_argv, parse = commands(which, lab, secs)
    extra = (["--dump-instr=yes"] if args.insnmix else []) + \
        (["--cache-sim=yes", "--branch-sim=yes"] if args.sim else [])
    env = dict(os.environ, NANOWIRE_LOG="error")
    # The server's profile starts with the client (its idle spin before is not counted).
    sextra = extra + (["--instr-atstart=no"] if args.tool == "callgrind" else [])
    srv = subprocess.Popen(ns(lab, "b") + wrap(args.tool, out, f"{name}-server", sextra) + srv_argv,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(args.settle)
    if srv.poll() is not None:
        raise SystemExit("server exited: " + srv.stderr.read()[-2000:])
    if args.tool == "callgrind":
        callgrind_ns(lab, "b", "--instr=on")
    # The client under the same tool (callgrind too: both ends equally slow, so the server
    # spins as many idle turns per message as the client's path takes, and they separate).
    cli = subprocess.run(ns(lab, "a") + wrap(args.tool, out, f"{name}-client", extra) + cli_argv, env=env,
                         capture_output=True, text=True, timeout=secs + 600)
    if args.tool == "callgrind":
        # A spinning server under valgrind: its profile is asked for before it is stopped.
        callgrind_ns(lab, "b", "--dump")
    # perf stat / strace pass signals on to (or wait for) the program: signal it directly.
    signal_ns(lab, "b", 2)
    end_server(srv, lab)
    if cli.returncode != 0:
        raise SystemExit(f"{which} client failed: " + cli.stderr[-2000:])
    return name, parse(cli.stdout)


def side_counts(args, out, name, side):
    """{what: count} of one side of one run (perf or strace)."""
    if args.tool == "perf":
        return perf_counts(os.path.join(out, f"{name}-{side}.perf"))
    return strace_counts(os.path.join(out, f"{name}-{side}.strace"))


def messages_of(costs):
    """Messages a process received: calls of `XskRx::take` (one per RX descriptor, in the floor
    and the engine alike; not inlined), the execution count of its first instruction."""
    for (_, fn), addrs in costs.items():
        if fn.endswith("XskRx::take") and addrs:
            return addrs[min(addrs)]
    raise SystemExit("no XskRx::take in the profile")


def code_per_message(path):
    """From a profile made with --dump-instr=yes (a spinning server, counted from the client's
    start), per message (`messages_of`), instruction by instruction: those that ran fewer than 8
    times a message are the message's own path (receive, reply, kick: once or a few times a
    message), those that ran at least a third as often as the most frequent one the idle spin
    turns (once per turn: many turns a message with the client under valgrind too), what lies
    between the work done every so many turns of a wait (the engine's clock read every 64 turns,
    its look at the kernel twin every 200 us). Reports Ir of each part, the turns per message (the most any
    instruction ran), the code lines (64-byte lines of each object) each part executes (the
    kernel's path between two messages evicts L1I, so each line of the message's path is a fetch
    from L2 or further), and the message path's Ir by function."""
    costs = insnmix.profile_costs(path)
    n = messages_of(costs)
    diffs = {((ob, fn), addr): c / n for (ob, fn), addrs in costs.items() for addr, c in addrs.items() if c}
    turns = max(diffs.values(), default=0.0)
    limit = max(8.0, turns / 3)
    msg_ir, turn_ir, periodic_ir = 0.0, 0.0, 0.0
    msg_lines, turn_lines, per_fn = set(), set(), {}
    for ((ob, fn), addr), d in diffs.items():
        if d < 8:
            msg_ir += d
            f = insnmix.short(fn)
            per_fn[f] = per_fn.get(f, 0) + d
            if d >= 0.9:
                msg_lines.add((ob, addr // 64))
        elif d < limit:
            periodic_ir += d
        else:
            turn_ir += d
            turn_lines.add((ob, addr // 64))
    top = sorted(((f, round(v, 1)) for f, v in per_fn.items() if v >= 1), key=lambda kv: -kv[1])
    return {"messages": n, "message_path_ir": round(msg_ir, 1), "idle_turns_ir": round(turn_ir, 1),
            "turns": round(turns, 1), "idle_turn_ir": round(turn_ir / turns, 1) if turns else 0,
            "every_few_turns_ir": round(periodic_ir, 1),
            "message_path_code_lines": len(msg_lines - turn_lines), "turn_code_lines": len(turn_lines),
            "message_path_ir_by_function": top[:40]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", choices=["perf", "strace", "callgrind"], default="perf")
    ap.add_argument("--which", choices=["floor", "bench", "both"], default="both")
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--base", type=int, default=2)
    ap.add_argument("--settle", type=float, default=None, help="seconds for the server to start")
    ap.add_argument("--insnmix", action="store_true")
    ap.add_argument("--sim", action="store_true")
    ap.add_argument("--keep", help="keep the raw outputs in this directory")
    args = ap.parse_args()
    if args.settle is None:
        args.settle = 12.0 if args.tool == "callgrind" else 2.0
    lab = f"flw{os.getpid()}"
    subprocess.run([NW, "lab", "up", "--name", lab], check=True, stdout=subprocess.DEVNULL)
    out = args.keep or tempfile.mkdtemp(prefix="floorwork.")
    os.makedirs(out, exist_ok=True)
    res = {"tool": args.tool, "seconds": [args.base, args.seconds], "per_message": {}}
    try:
        for which in (["floor", "bench"] if args.which == "both" else [args.which]):
            if args.tool == "callgrind":
                # One run: the server's profile starts with the client, per message of what it
                # received (the client's own start under valgrind is not separable: not reported).
                name, trips = run_once(args, which, lab, args.seconds, out)
                settle_files(out)
                path = largest_profile(out, f"{name}-server")[1]
                n = messages_of(insnmix.profile_costs(path))
                ev = profile_events(path)
                r = {"round_trips": trips, "server_messages": n,
                     "server": {k: round(v / n, 3) for k, v in ev.items()}}
                if args.insnmix:
                    m = insnmix.mix(path)
                    r["server"].update({k: round(m["total"].get(k, 0) / n, 3) for k in insnmix.CLASSES})
                    r["server_code"] = code_per_message(path)
                res["per_message"][which] = r
                continue
            short, n_short = run_once(args, which, lab, args.base, out)
            long_, n_long = run_once(args, which, lab, args.seconds, out)
            dn = n_long - n_short
            if dn <= 0:
                raise SystemExit(f"{which}: no more round trips in the long run ({n_short} vs {n_long})")
            sides = {}
            for side in ("server", "client"):
                a = side_counts(args, out, short, side)
                b = side_counts(args, out, long_, side)
                sides[side] = {k: round((b.get(k, 0) - a.get(k, 0)) / dn, 3)
                               for k in sorted(set(a) | set(b)) if b.get(k, 0) or a.get(k, 0)}
            res["per_message"][which] = {"round_trips": [n_short, n_long], **sides}
    finally:
        stop_left(lab)
        subprocess.run([NW, "lab", "down", "--name", lab], stdout=subprocess.DEVNULL)
    for which, r in res["per_message"].items():
        for side in ("server", "client"):
            if side in r:
                top = sorted(r[side].items(), key=lambda kv: -abs(kv[1]))[:24]
                print(f"{which} {side}: " + ", ".join(f"{k} {v}" for k, v in top), file=sys.stderr)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
