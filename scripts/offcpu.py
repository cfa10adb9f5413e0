#!/usr/bin/env python3
"""Where a program's threads waited: off-CPU intervals from `perf script` of sched:sched_switch -g.

For each switch-out of a thread whose name is listed (prev_state S/D = blocked, R = preempted):
the time until it ran again and the first kernel frames that name what it waited for; then totals
per (thread, kind, frame). Used for the engine start's critical path (docs/benchmarks.md,
"Session 13: churn and engine start"):

    perf record -q -a -e sched:sched_switch -g -o sw.data -- \
        ip netns exec LAB-a nanowire run -- ab -q -n 1 -c 1 http://198.18.0.2:8080/index.html
    perf script -i sw.data | scripts/offcpu.py ab,nanowire-umem 0.3

Arguments: comma-separated thread names; the smallest interval to list, in ms (default 0.5).
System-wide recording (-a) is needed: a thread's switch-in is recorded in the context of the
thread it replaces."""
import re, sys, collections
SKIP = ("__schedule", "schedule", "__x64_sys", "do_syscall", "entry_SYSCALL", "x64_sys_call",
        "schedule_timeout", "schedule_preempt", "preempt_schedule", "__cond_resched", "exit_to_user_mode",
        "wait_for_completion", "io_schedule", "rwsem_down", "down_write", "down_read", "__wait_for_common",
        "schedule_hrtimeout", "do_nanosleep", "hrtimer_nanosleep", "futex", "__futex")
comms = set(sys.argv[1].split(","))
ev = []
cur = None
for line in sys.stdin:
    m = re.match(r"^(\S.*?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+): sched:sched_switch: prev_comm=(.*) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> next_comm=(.*) next_pid=(\d+)", line)
    if m:
        cur = dict(t=float(m[4]), prev=int(m[6]), pcomm=m[5], state=m[7], next=int(m[9]), ncomm=m[8], stack=[])
        ev.append(cur)
        continue
    if cur is not None and line.strip():
        f = line.split()
        if len(f) >= 2:
            cur["stack"].append(f[1].split("+")[0])
out = {}
tot = collections.Counter()
for i, e in enumerate(ev):
    if e["pcomm"] in comms:
        out[e["prev"]] = e
    if e["next"] in out:
        s = out.pop(e["next"])
        d = (e["t"] - s["t"]) * 1e3
        why = next((f for f in s["stack"] if not f.startswith(SKIP)), "?")
        chain = " < ".join([f for f in s["stack"] if not f.startswith(SKIP)][:4])
        kind = "blocked" if s["state"].startswith(("S", "D")) else "preempted"
        tot[(s["pcomm"], kind, why)] += d
        if d >= float(sys.argv[2] if len(sys.argv) > 2 else 0.5):
            print(f"{s['t']:.4f} {s['pcomm']}/{s['prev']} {kind} {d:7.2f} ms  {chain}")
print("-- totals (ms)")
for (c, k, w), d in tot.most_common(25):
    print(f"{d:8.2f} {c} {k} {w}")
