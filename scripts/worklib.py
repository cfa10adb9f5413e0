"""Helpers shared by the per-message / per-segment work counters (msgwork.py,
bulkwork.py): the lab's namespaces, the profiler in front of a program, and
reading what callgrind and strace -c left behind."""

import os, re, struct, subprocess, time


def ns(lab, h):
    """Run in host `h` ("a" or "b") of lab `lab`."""
    return ["ip", "netns", "exec", f"{lab}-{h}"]


def wrap(tool, out, name, extra=()):
    """The profiler in front of a program whose output is named `name` in `out`
    (callgrind: NAME.PID.cg per process, `extra` options added; strace: NAME.strace;
    perf: NAME.perf, `extra` events added); none for "none"."""
    if tool == "callgrind":
        return ["valgrind", "--tool=callgrind", "--trace-children=yes", "--quiet", *extra,
                f"--callgrind-out-file={out}/{name}.%p.cg"]
    if tool == "strace":
        return ["strace", "-f", "-c", "-o", f"{out}/{name}.strace"]
    if tool == "perf":
        return ["perf", "stat", "-x", ",", "-o", f"{out}/{name}.perf", "-e", ",".join([*PERF_EVENTS, *extra]), "--"]
    return []


# Kernel events counted per process (all its threads) by `wrap("perf", ..)`: tracepoints and
# software events count work, not time, so they hold on a loaded machine.
PERF_EVENTS = [
    "raw_syscalls:sys_enter", "syscalls:sys_enter_sendto", "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_poll", "syscalls:sys_enter_ppoll", "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_epoll_pwait", "syscalls:sys_enter_sched_yield", "syscalls:sys_enter_futex",
    "syscalls:sys_enter_clock_gettime", "syscalls:sys_enter_getpid", "syscalls:sys_enter_pread64",
    "sched:sched_switch", "sched:sched_wakeup", "context-switches", "cpu-migrations",
    "page-faults", "irq:softirq_entry", "irq:irq_handler_entry", "ipi:ipi_send_cpu",
    "napi:napi_poll", "xdp:xdp_redirect", "xdp:xdp_redirect_err", "skb:consume_skb",
    "skb:kfree_skb", "kmem:kmalloc",
]


def pids_in(lab, h):
    """The pids in host `h` of lab `lab`."""
    return [int(p) for p in subprocess.run(["ip", "netns", "pids", f"{lab}-{h}"], capture_output=True,
                                           text=True).stdout.split()]


def signal_ns(lab, h, sig):
    """Send `sig` to every process in host `h` of lab `lab`."""
    for p in pids_in(lab, h):
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass


def callgrind_ns(lab, h, what):
    """`callgrind_control WHAT` (`--dump`, `--instr=on`) for every process in host `h`."""
    for p in pids_in(lab, h):
        subprocess.run(["callgrind_control", what, str(p)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)


def end_server(srv, lab):
    """Wait for a signalled server (kill it after 60 s), then end what the run left in the lab."""
    try:
        srv.wait(60)
    except subprocess.TimeoutExpired:
        srv.kill()
        srv.wait()
    stop_left(lab)


def stop_left(lab):
    """End what a run left in the lab's namespaces (SIGINT, then SIGKILL): `strace` passes the
    SIGINT on but detaches, so the server it traced kept running after the run."""
    for sig in (2, 9):
        left = pids_in(lab, "a") + pids_in(lab, "b")
        signal_ns(lab, "a", sig)
        signal_ns(lab, "b", sig)
        if sig == 2 and left:
            time.sleep(2)


def settle_files(out):
    """Wait until the profiles stop changing (valgrind writes them as the processes end)."""
    last = None
    for _ in range(30):
        cur = sorted((f, os.stat(os.path.join(out, f)).st_size) for f in os.listdir(out))
        if cur == last:
            return
        last = cur
        time.sleep(1)


def perf_counts(path):
    """{event: count} from `perf stat -x ,` output."""
    counts = {}
    for line in open(path):
        f = line.strip().split(",")
        if len(f) >= 3 and f[0].replace(".", "").isdigit():
            counts[f[2]] = int(float(f[0]))
    return counts


def largest_profile(out, name):
    """(total Ir, path) of the largest callgrind profile NAME.*.cg in `out` (the
    program itself: `ip` and the launcher exec into it), or of a dump made on request
    (NAME.*.cg.N)."""
    best = None
    for f in os.listdir(out):
        if f.startswith(name + ".") and re.search(r"\.cg(\.\d+)?$", f):
            p = os.path.join(out, f)
            t = re.search(r"^(?:summary|totals):\s*(\d+)", open(p, errors="replace").read(), re.M)
            if t and (best is None or int(t.group(1)) > best[0]):
                best = (int(t.group(1)), p)
    if best is None:
        raise SystemExit(f"no callgrind output for {name} in {out}")
    return best


def profile_events(path):
    """{event: total} of a callgrind profile (its `events:` and `summary:` lines: Ir, and with
    --cache-sim/--branch-sim the misses and branches too)."""
    text = open(path, errors="replace").read()
    ev = re.search(r"^events:\s*(.*)$", text, re.M).group(1).split()
    tot = re.search(r"^(?:summary|totals):\s*(.*)$", text, re.M).group(1).split()
    return {e: int(v) for e, v in zip(ev, tot)}


def strace_counts(path):
    """{syscall: calls} from an `strace -c` summary."""
    calls = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[-1] not in ("total", "syscall") and f[3].isdigit():
            calls[f[-1]] = int(f[3])
        elif len(f) >= 4 and f[-1] not in ("total", "syscall") and f[2].isdigit():
            calls[f[-1]] = int(f[2])
    return calls


def option(body, o, want):
    """The value of option `want` (a string) in a pcapng block body whose options start at `o`; ""
    when absent."""
    while o + 4 <= len(body):
        code, olen = struct.unpack_from("<HH", body, o)
        if code == 0:
            break
        if code == want:
            return body[o + 4: o + 4 + olen].decode()
        o += 4 + olen + (-olen % 4)
    return ""


def read_pcapng(path):
    """[(iface_name, ts_ns, comment, frame)] of a little-endian pcapng written by nanowire."""
    data = open(path, "rb").read()
    off, ifaces, out = 0, [], []
    while off + 12 <= len(data):
        kind, ln = struct.unpack_from("<II", data, off)
        body = data[off + 8: off + ln - 4]
        if kind == 1:  # IDB: options after 8 bytes
            ifaces.append(option(body, 8, 2))
        elif kind == 6:
            ifid, hi, lo, cap, _orig = struct.unpack_from("<IIIII", body, 0)
            frame = body[20: 20 + cap]
            comment = option(body, 20 + cap + (-cap % 4), 1)
            out.append((ifaces[ifid], (hi << 32) | lo, comment, frame))
        off += ln
    return out
