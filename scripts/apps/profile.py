#!/usr/bin/env python3
"""Where the time goes: the echo programs of scripts/apps, plainly and under `nanowire run`, each end
counted with `perf stat` (CPU time, context switches, migrations, syscalls in total and by name, from
the syscall tracepoints), per echoed datagram. Optional `--record DIR`: a `perf record -e cpu-clock -g`
of each client (the VM has no hardware PMU; cpu-clock sampling works).

    scripts/apps/profile.py --lab nwapps1 --count 3000 --inflight 8 [--runtimes node,c-mt] [--no-pin]

Prints one JSON object; `--table` prints a Markdown table instead. Not a benchmark (counting costs
a little); use scripts/compare.py --scenario apps for times.
"""
import argparse, json, os, re, shlex, signal, subprocess, sys, tempfile, time, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import compare  # noqa: E402

B = compare.B


def perf_stat_parse(path):
    """perf stat -x, output -> {event: value}."""
    out = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) > 2 and f[0] and not line.startswith("#"):
            try:
                out[f[2]] = float(f[0])
            except ValueError:
                pass
    return out


SYSCALLS = ["epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl", "poll", "ppoll", "select", "pselect6",
            "recvfrom", "recvmsg", "recvmmsg", "sendto", "sendmsg", "sendmmsg", "read", "write", "readv", "writev",
            "futex", "sched_yield", "getrusage", "fcntl", "ioctl", "getsockopt", "nanosleep", "clock_nanosleep",
            "getpid", "gettid", "eventfd2"]
# Tracepoints count in the kernel without stopping the process (perf trace would slow every syscall and,
# with it, change how many times a spin loop goes round).
EVENTS = ",".join(["task-clock", "context-switches", "cpu-migrations", "raw_syscalls:sys_enter"] +
                  [f"syscalls:sys_enter_{c}" for c in SYSCALLS])


def one(a, progs, rt, mode, port, tmp):
    """Counts per datagram: (run with 3*count) - (run with count), over 2*count, so start-up
    (a JVM makes thousands of syscalls before main) cancels out."""
    small, port = one_count(a, progs, rt, mode, port, tmp, a.count)
    big, port = one_count(a, progs, rt, mode, port, tmp, 3 * a.count)
    d = 2 * a.count
    res = {"elapsed_ms_under_perf_stat": big["elapsed_ms"]}
    for side in ("client", "server"):
        sb, ss = big[side], small[side]
        diff = {k: sb["stat"].get(k, 0) - ss["stat"].get(k, 0) for k in sb["stat"]}
        calls = {k.split("sys_enter_")[1]: v for k, v in diff.items() if "sys_enter_" in k}
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
        res[side] = {"cpu_us_per_dgram": round(diff.get("task-clock", 0) * 1000 / d, 2),
                     "syscalls_per_dgram": round(diff.get("raw_syscalls:sys_enter", 0) / d, 2),
                     "ctx_switches_per_dgram": round(diff.get("context-switches", 0) / d, 3),
                     "migrations": int(sb["stat"].get("cpu-migrations", 0)),
                     "top_syscalls_per_dgram": {k: round(v / d, 2) for k, v in top}}
    return res, port


def one_count(a, progs, rt, mode, port, tmp, count):
    pin_c, pin_s = (["taskset", "-c", "0"], ["taskset", "-c", "1"]) if a.pin else ([], [])
    wrap = (lambda v: v) if mode == "plain" else (lambda v: [compare.NW, "run", "--profile", mode, "--"] + v)
    res = {}
    for tool in ("stat",):
        sf, cf = os.path.join(tmp, f"srv.{tool}"), os.path.join(tmp, f"cli.{tool}")
        pre = lambda f: ["perf", "stat", "-x,", "-e", EVENTS, "-o", f, "--"]  # noqa: E731
        srv = pre(sf) + pin_s + wrap(progs[rt] + ["server", B, str(port)])
        cli = pre(cf) + pin_c + wrap(progs[rt] + ["client", B, str(port), str(count), str(a.inflight), "64", "0"])
        if tool == "stat" and a.record and count > a.count:
            cli = ["perf", "record", "-q", "-e", "cpu-clock", "-g", "-o",
                   os.path.join(a.record, f"{rt}-{mode}.data"), "--"] + cli
        port += 1
        s = compare.ReadyServer(a.lab, srv, os.path.join(tmp, "server.out"))
        try:
            p = subprocess.run(["ip", "netns", "exec", compare.ns(a.lab, "a")] + cli, capture_output=True, text=True,
                               timeout=300)
        finally:
            # perf waits for its workload: end the workload (perf's children), then perf writes its counts.
            try:
                kids = open(f"/proc/{s.p.pid}/task/{s.p.pid}/children").read().split()
            except OSError:
                kids = []
            for k in kids:
                os.kill(int(k), signal.SIGTERM)
            try:
                s.p.wait(10)
            except subprocess.TimeoutExpired:
                s.p.kill()
                s.p.wait()
            s.out.close()
        if p.returncode != 0:
            raise RuntimeError(f"{rt} {mode}: client failed\n{p.stdout[-500:]}\n{p.stderr[-1500:]}")
        line = next(l for l in reversed(p.stdout.splitlines()) if l.startswith("{"))
        if tool == "stat":
            res["elapsed_ms"] = json.loads(line)["elapsed_ms"]
            for side, f in (("client", cf), ("server", sf)):
                res[side] = {"stat": perf_stat_parse(f)}
    return res, port


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lab", default="nwapps1")
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--runtimes", default="")
    ap.add_argument("--profiles", default="balanced")
    ap.add_argument("--no-pin", dest="pin", action="store_false")
    ap.add_argument("--record", default="", help="directory for perf record data of each client")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    subprocess.run([compare.NW, "lab", "up", "--name", a.lab], check=True, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="nanowire-prof-")
    try:
        progs = compare.apps_build(tmp)
        runtimes = a.runtimes.split(",") if a.runtimes else list(progs)
        out, port = {}, 24000
        for rt in runtimes:
            for mode in ["plain"] + a.profiles.split(","):
                out[f"{rt} {mode}"], port = one(a, progs, rt, mode, port, tmp)
                print(f"# {rt} {mode}: {out[f'{rt} {mode}']}", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.table:
        print("| program | side | CPU µs/dgram | syscalls/dgram | ctx sw/dgram | top syscalls per datagram |")
        print("|---|---|---|---|---|---|")
        for k, v in out.items():
            for side in ("client", "server"):
                s = v[side]
                top = ", ".join(f"{n} {c}" for n, c in s["top_syscalls_per_dgram"].items() if c >= 0.05)
                print(f"| {k} | {side} | {s['cpu_us_per_dgram']} | {s['syscalls_per_dgram']} | "
                      f"{s['ctx_switches_per_dgram']} | {top} |")
    else:
        print(json.dumps({"count": a.count, "inflight": a.inflight, "pinned": a.pin, "results": out}, indent=1))


if __name__ == "__main__":
    main()
