"""Counts per repeat for compare.py's `--probe` (what selects the bimodal UDP p50, session 18).

One repeat of a ping-pong row with the probe on: three `perf stat -I 100` run beside the client,
one attached to the server's process (all its threads), one to the client's, one system-wide per
CPU (`-a -A`); the window is the intervals in which the replies flowed (net:netif_rx on the
client's veth, counted per CPU) at half their peak rate or more, less the first and the last.
Tracepoints and software events count work, not time: they hold on a loaded machine. The
per-process counts are the events that happened while one of the process's threads was on a CPU
(a softirq run at the end of its `sendto` counts to it, one run by ksoftirqd does not). Per round
trip = count / the replies netif_rx saw in the window. (Intervals, not a fixed window after the
start: sockperf pp begins its exchange up to ~2 s after it starts here, and later under load.)

Besides: /proc/softirqs per CPU over the client's whole run, each process's threads (name, CPU
allowed and last run on, switches during the window) and its transparent huge pages
(AnonHugePages, ShmemPmdMapped, FilePmdMapped of /proc/PID/smaps_rollup) at the window's start.

`placement()`: where the host runs the two vCPUs, from the one-way time of a cache line between
CPU 0 and CPU 1 (scripts/machine-probes/c2c.c): "near" (~50 ns, one L3) or "far" (~245 ns). It,
not the code, selects the mode of a ping-pong's p50 (docs/benchmarks.md, "Session 18: the bimodal
UDP p50"); compare.py records it before and after every ping-pong run.
"""

import json, os, subprocess, time

INTERVAL_MS = 100
HERE = os.path.dirname(os.path.abspath(__file__))
C2C_SRC = os.path.join(HERE, "machine-probes", "c2c.c")
C2C = os.path.join(HERE, "..", "target", "machine-probes", "c2c")
C2C_MS = 60

# Per process (all threads): the syscalls a waiter or a kick makes, scheduling, interrupts and
# the receive path's events.
PROC_EVENTS = [
    "raw_syscalls:sys_enter", "syscalls:sys_enter_sendto", "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_recvmsg", "syscalls:sys_enter_sendmsg", "syscalls:sys_enter_poll",
    "syscalls:sys_enter_ppoll", "syscalls:sys_enter_epoll_wait", "syscalls:sys_enter_epoll_pwait",
    "syscalls:sys_enter_sched_yield", "syscalls:sys_enter_futex", "syscalls:sys_enter_nanosleep",
    "syscalls:sys_enter_clock_nanosleep", "syscalls:sys_enter_clock_gettime",
    "context-switches", "cpu-migrations", "page-faults", "sched:sched_wakeup",
    "irq:softirq_raise", "irq:softirq_entry", "irq:irq_handler_entry",
    "irq_vectors:reschedule_entry", "irq_vectors:call_function_single_entry",
    "irq_vectors:local_timer_entry", "timer:hrtimer_expire_entry", "ipi:ipi_send_cpu",
    "net:netif_rx", "net:netif_receive_skb", "napi:napi_poll", "xdp:xdp_redirect",
    "skb:consume_skb", "skb:kfree_skb",
]

# System-wide, per CPU (name, perf arguments): where NET_RX runs and who runs it.
SYS_EVENTS = [
    ("net_rx_softirq", ["-e", "irq:softirq_entry", "--filter", "vec == 3"]),
    ("net_rx_raise", ["-e", "irq:softirq_raise", "--filter", "vec == 3"]),
    ("switch_to_ksoftirqd", ["-e", "sched:sched_switch", "--filter", 'next_comm ~ "ksoftirqd*"']),
    ("switch", ["-e", "sched:sched_switch"]),
    ("wakeup", ["-e", "sched:sched_wakeup"]),
    ("reschedule_ipi", ["-e", "irq_vectors:reschedule_entry"]),
    ("call_function_single_ipi", ["-e", "irq_vectors:call_function_single_entry"]),
    ("local_timer", ["-e", "irq_vectors:local_timer_entry"]),
    ("netif_rx", ["-e", "net:netif_rx"]),
    ("xdp_redirect", ["-e", "xdp:xdp_redirect"]),
]


def c2c(ms=C2C_MS):
    """The one-way time of a cache line between CPU 0 and CPU 1 (scripts/machine-probes/c2c.c,
    built on first use): {min, p25, p50} ns of its batches; None if no batch ran (both CPUs busy
    with others for all of `ms`) or it cannot run."""
    try:
        if not os.path.exists(C2C) or os.path.getmtime(C2C) < os.path.getmtime(C2C_SRC):
            os.makedirs(os.path.dirname(C2C), exist_ok=True)
            subprocess.run(["cc", "-O2", "-pthread", "-o", C2C, C2C_SRC], check=True)
        p = subprocess.run([C2C, "0", "1", str(ms)], capture_output=True, text=True, timeout=30)
        return json.loads(p.stdout)["oneway_ns"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None


# A cache line crosses from CPU 0 to CPU 1 in ~50 ns when the host runs the two vCPUs on cores
# that share an L3 (one CCX) and in ~245 ns when it does not (session 18: nothing in between).
NEAR_BELOW_NS = 120


NO_BATCH_ABOVE_NS = 1000


def placement(ms=C2C_MS, tries=5):
    """("near" | "far" | None, the c2c minimum in ns): where the host has the two vCPUs now. A
    minimum over NO_BATCH_ABOVE_NS says no batch ran undisturbed (the CPUs were busy with others):
    measured again, up to `tries` times."""
    for _ in range(tries):
        r = c2c(ms)
        if r and r["min"] < NO_BATCH_ABOVE_NS:
            return ("near" if r["min"] < NEAR_BELOW_NS else "far"), r["min"]
    return None, None


def softirqs():
    """{name: [count per CPU]} from /proc/softirqs."""
    out = {}
    with open("/proc/softirqs") as f:
        next(f)
        for line in f:
            name, *vals = line.split()
            out[name.rstrip(":")] = [int(v) for v in vals]
    return out


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def threads(pid):
    """{tid: {comm, cpu (last run on), allowed, vcs, nvcs}} of process `pid`."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        stat = read(f"/proc/{pid}/task/{tid}/stat")
        status = read(f"/proc/{pid}/task/{tid}/status")
        if not stat or not status:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        st = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        out[tid] = {"comm": stat[stat.index("(") + 1:stat.rindex(")")], "cpu": int(fields[36]),
                    "allowed": st.get("Cpus_allowed_list", "").strip(),
                    "vcs": int(st.get("voluntary_ctxt_switches", "0")),
                    "nvcs": int(st.get("nonvoluntary_ctxt_switches", "0"))}
    return out


def huge(pid):
    """Transparent huge pages of process `pid` (kB) from smaps_rollup."""
    out = {}
    for line in read(f"/proc/{pid}/smaps_rollup").splitlines():
        k, _, v = line.partition(":")
        if k in ("Rss", "AnonHugePages", "ShmemPmdMapped", "FilePmdMapped"):
            out[k + "_kB"] = int(v.split()[0])
    return out


def perf_intervals(path, per_cpu):
    """[(t, [(cpu or None, event, count or None), ...in output order])] from `perf stat -x , -I`."""
    out, cur_t = [], None
    for line in read(path).splitlines():
        f = line.strip().split(",")
        if line.startswith("#") or len(f) < 4:
            continue
        t = float(f[0])
        cpu, val, ev = (int(f[1][3:]), f[2], f[4]) if per_cpu else (None, f[1], f[3])
        if t != cur_t:
            out.append((t, []))
            cur_t = t
        try:
            n = int(float(val))
        except ValueError:
            n = None  # <not counted>: no thread of the process ran in the interval
        out[-1][1].append((cpu, ev, n))
    return out


def perf_start(target, events, path):
    """`perf stat -I` of `target` (["-p", PID] or ["-a", "-A"]) until SIGINT; (Popen, start time)."""
    argv = ["perf", "stat", "-x", ",", "-I", str(INTERVAL_MS), "-o", path, *target]
    for e in events:
        argv += e if isinstance(e, list) else ["-e", e]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), time.monotonic()


def sum_window(intervals, t0, lo, hi):
    """Counts summed over the intervals of a perf started at `t0` that end within [lo, hi]
    (monotonic time), keyed (event, k-th of that event in an interval, cpu)."""
    tot = {}
    for t, rows in intervals:
        if not lo <= t0 + t <= hi:
            continue
        seen = {}
        for cpu, ev, n in rows:
            k = seen.get((ev, cpu), 0)
            seen[(ev, cpu)] = k + 1
            tot[(ev, k, cpu)] = tot.get((ev, k, cpu), 0) + (n or 0)
    return tot


def sampler(pids, stop, out):
    """Every 0.2 s until `stop` is set: (monotonic time, {side: threads}, {side: thp})."""
    while not stop.wait(0.2):
        out.append((time.monotonic(), {s: threads(p) for s, p in pids.items()},
                    {s: huge(p) for s, p in pids.items()}))


def probed_client(lab, argv, parser, timeout, server_pid, seconds, tmp):
    """Run the client (`ip netns exec` + argv: the process execs down to the program, so its pid
    is the program's) with the probe; (parsed result, probe dict)."""
    import signal, threading
    dev = {"to_server": f"{lab}-b0", "to_client": f"{lab}-a0"}
    sys_events = SYS_EVENTS + [(f"netif_rx {d}", ["-e", "net:netif_rx", "--filter", f'name == "{n}"'])
                               for d, n in dev.items()]
    before = softirqs()
    files = {side: os.path.join(tmp, f"{side}.perf") for side in ("server", "client", "cpus")}
    cpus, t_cpus = perf_start(["-a", "-A"], [e for _, e in sys_events], files["cpus"])
    srv, t_srv = perf_start(["-p", str(server_pid)], PROC_EVENTS, files["server"])
    p = subprocess.Popen(["ip", "netns", "exec", f"{lab}-a"] + argv, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    cli, t_cli = perf_start(["-p", str(p.pid)], PROC_EVENTS, files["client"])
    stop, samples = threading.Event(), []
    th = threading.Thread(target=sampler, args=({"server": server_pid, "client": p.pid}, stop, samples))
    th.start()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    finally:
        stop.set()
        th.join()
        for q in (cli, srv, cpus):
            q.send_signal(signal.SIGINT)
            q.wait()
    after = softirqs()
    if p.returncode != 0:
        raise RuntimeError(f"client failed ({p.returncode}): {' '.join(argv)}\n{err[-2000:]}")
    res = parser(out)
    # The window: the intervals in which the replies flowed at >= half their peak rate, without
    # the first and the last of them (perf's clocks and ours differ by a few ms).
    cpu_iv = perf_intervals(files["cpus"], per_cpu=True)
    def replies(rows):
        seen, n = {}, 0
        for cpu, ev, c in rows:
            k = seen.get((ev, cpu), 0)
            seen[(ev, cpu)] = k + 1
            if ev == "net:netif_rx" and k == 1:  # the second netif_rx: to_client
                n += c or 0
        return n
    rates = [(t, replies(rows)) for t, rows in cpu_iv]
    peak = max((n for _, n in rates), default=0)
    busy = [t for t, n in rates if peak and n >= peak / 2]
    probe = {"interval_ms": INTERVAL_MS}
    if len(busy) < 3:
        probe["error"] = f"no steady window (reply intervals {[n for _, n in rates]})"
        return res, probe
    lo, hi = t_cpus + busy[1] - INTERVAL_MS / 1000, t_cpus + busy[-2]
    tot = sum_window(cpu_iv, t_cpus, lo, hi)
    trips = sum(v for (ev, k, _), v in tot.items() if ev == "net:netif_rx" and k == 1)
    probe.update(window_s=round(hi - lo, 3), round_trips_in_window=trips)
    for side, path, t0 in (("server", files["server"], t_srv), ("client", files["client"], t_cli)):
        c = sum_window(perf_intervals(path, per_cpu=False), t0, lo, hi)
        inside = [x for x in samples if lo <= x[0] <= hi]
        first, last = (inside[0], inside[-1]) if inside else (None, None)
        ths = {}
        if first:
            for tid, t in first[1][side].items():
                e = last[1][side].get(tid, t)
                ths[tid] = dict(t, vcs_window=e["vcs"] - t["vcs"], nvcs_window=e["nvcs"] - t["nvcs"])
        if not any(n for (ev, _, _), n in c.items() if ev == "raw_syscalls:sys_enter"):
            # Nothing counted in the window (the attach missed the process): say so, not zeros.
            probe[side] = {"error": "not counted", "thp": first[2][side] if first else {}}
            continue
        probe[side] = {"per_round_trip": {ev: round(n / trips, 4) for (ev, _, _), n in c.items() if trips},
                       "thp": first[2][side] if first else {}, "threads": ths}
    seen = {}
    probe["cpus_per_round_trip"] = {}
    for name, e in sys_events:
        k = seen.get(e[1], 0)
        seen[e[1]] = k + 1
        probe["cpus_per_round_trip"][name] = {f"cpu{c}": round(v / trips, 4) for (ev, kk, c), v in sorted(
            tot.items(), key=lambda x: x[0][2]) if ev == e[1] and kk == k and trips}
    probe["softirqs_whole_run_per_round_trip"] = {
        k: [round((a - b) / max(1, res.get("received") or 0), 4) for a, b in zip(after[k], before[k])]
        for k in ("NET_RX", "NET_TX", "TIMER", "SCHED", "HRTIMER", "RCU") if k in after}
    return res, probe

SUMMARY = [("sys", "raw_syscalls:sys_enter"), ("sendto", "syscalls:sys_enter_sendto"),
           ("softirq", "irq:softirq_entry"), ("cs", "context-switches"),
           ("resched", "irq_vectors:reschedule_entry"), ("timer", "irq_vectors:local_timer_entry")]


def summary(probe):
    """One line of the counts per round trip that tell the modes apart, for stderr."""
    if "error" in probe:
        return " | probe: " + probe["error"]
    parts = []
    for side in ("client", "server"):
        if "error" in probe[side]:
            parts.append(f"{side[:3]} {probe[side]['error']}")
            continue
        c = probe[side]["per_round_trip"]
        parts.append(f"{side[:3]} " + " ".join(f"{k}={c.get(e, 0):.2f}" for k, e in SUMMARY)
                     + f" thp={probe[side]['thp'].get('AnonHugePages_kB', 0) + probe[side]['thp'].get('ShmemPmdMapped_kB', 0)}kB")
    cpus = probe["cpus_per_round_trip"]
    for name in ("net_rx_softirq", "switch_to_ksoftirqd"):
        parts.append(f"{name} " + "/".join(f"{v:.2f}" for v in cpus[name].values()))
    return " | " + " | ".join(parts)
