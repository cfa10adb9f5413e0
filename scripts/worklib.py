"""Helpers shared by the per-message / per-segment work counters (msgwork.py,
bulkwork.py): the lab's namespaces, the profiler in front of a program, and
reading what callgrind and strace -c left behind."""

import os, re


def ns(lab, h):
    """Run in host `h` ("a" or "b") of lab `lab`."""
    return ["ip", "netns", "exec", f"{lab}-{h}"]


def wrap(tool, out, name, extra=()):
    """The profiler in front of a program whose output is named `name` in `out`
    (callgrind: NAME.PID.cg per process, `extra` options added; strace: NAME.strace);
    none for "none"."""
    if tool == "callgrind":
        return ["valgrind", "--tool=callgrind", "--trace-children=yes", "--quiet", *extra,
                f"--callgrind-out-file={out}/{name}.%p.cg"]
    if tool == "strace":
        return ["strace", "-f", "-c", "-o", f"{out}/{name}.strace"]
    return []


def largest_profile(out, name):
    """(total Ir, path) of the largest callgrind profile NAME.*.cg in `out` (the
    program itself: `ip` and the launcher exec into it)."""
    best = None
    for f in os.listdir(out):
        if f.startswith(name + ".") and f.endswith(".cg"):
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
