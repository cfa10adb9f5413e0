#!/usr/bin/env python3
"""Executed instructions that Ir does not weigh, from a callgrind profile, without a PMU.

callgrind counts every instruction as one `Ir`, but a `PAUSE` costs tens to ~150 cycles, a
LOCK-prefixed read-modify-write or `XCHG` with memory ~20 uncontended (more when the line moves
between cores), an `MFENCE` ~30-100, `RDTSC(P)` ~25, `SYSCALL` hundreds to thousands. This tool
weighs each instruction of a profile made with `--dump-instr=yes` by its execution count and
counts the executed instructions of those classes, in total and by function:

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=P.cg PROGRAM ...
    scripts/insnmix.py P.cg                     # classes and the functions they are in
    scripts/insnmix.py P.cg --per 100000        # ... per message (divide by 100,000)
    scripts/insnmix.py LONG.cg --minus SHORT.cg --per DMSGS   # the difference of two runs

How: the profile's cost lines give, per object (`ob=`) and function (`fn=`), the address of each
executed instruction (relative to the object's load address, as objdump shows it) and its `Ir` =
how many times it ran; `objdump -d` of each object names the instruction at that address. The
line after a `calls=` line is a call's inclusive cost, not the caller's own: skipped.
Under valgrind the vDSO is not used (clock_gettime is a system call there), so RDTSC of the
vDSO's clock is not seen: count clock reads as calls (`callgrind_annotate`) instead.

Used by scripts/msgwork.py --insnmix. Prints one JSON object with --json.
"""
import argparse, json, os, re, subprocess, sys
from collections import defaultdict

CLASSES = ["pause", "lock", "xchg_mem", "mfence", "lfence", "sfence", "rdtsc", "syscall", "cpuid"]
# How an objdump mnemonic (with its operands) falls into a class, or None.


def classify(text):
    t = text.strip()
    if t.startswith("lock "):
        return "lock"
    op = t.split(None, 1)
    if not op:
        return None
    m = op[0]
    if m == "pause":
        return "pause"
    if m.startswith("xchg") and len(op) > 1 and "(" in op[1]:
        return "xchg_mem"  # XCHG with a memory operand is locked implicitly
    if m in ("mfence", "lfence", "sfence", "syscall", "cpuid"):
        return m
    if m in ("rdtsc", "rdtscp"):
        return "rdtsc"
    return None


_DIS = {}


def disassembly(obj):
    """{address: class} of the instructions of `obj` that fall into a class, and the set of all
    instruction addresses (to check that the profile's addresses are instruction starts)."""
    key = (obj, os.stat(obj).st_mtime if os.path.exists(obj) else 0)
    if key in _DIS:
        return _DIS[key]
    classes, starts = {}, set()
    if os.path.exists(obj):
        p = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj],
                           capture_output=True, text=True)
        for line in p.stdout.splitlines():
            m = re.match(r"\s*([0-9a-f]+):\t(.*)$", line)
            if not m:
                continue
            a = int(m.group(1), 16)
            starts.add(a)
            c = classify(m.group(2))
            if c:
                classes[a] = c
    _DIS[key] = (classes, starts)
    return _DIS[key]


def _num(s):
    return int(s, 16) if s.startswith("0x") else int(s)


def profile_costs(path):
    """{(object, function): {address: Ir}} of a callgrind profile made with --dump-instr=yes."""
    obs, fns = {}, {}
    cur_ob, cur_fn = "???", "???"
    last = [0, 0]
    out = defaultdict(lambda: defaultdict(int))
    skip_next = False
    positions = None

    def named(table, v):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", v)
        if not m:
            return v
        if m.group(2) is not None:
            table[m.group(1)] = m.group(2)
        return table.get(m.group(1), "???")

    with open(path, errors="replace") as f:
        for line in f:
            if not line or line[0] == "\n" or line[0] == "#":
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                npos = len(positions) if positions else 1
                pos = []
                for i in range(npos):
                    s = parts[i]
                    if s == "*":
                        v = last[i]
                    elif s[0] in "+-":
                        v = last[i] + (int(s[1:], 16) if s[1:].startswith("0x") else int(s[1:])) * (1 if s[0] == "+" else -1)
                    else:
                        v = _num(s)
                    pos.append(v)
                for i, v in enumerate(pos):
                    last[i] = v
                if skip_next:
                    skip_next = False
                    continue
                ir = int(parts[npos]) if len(parts) > npos else 0
                out[(cur_ob, cur_fn)][pos[0]] += ir
                continue
            if line.startswith("positions:"):
                positions = line.split(":", 1)[1].split()
                if positions[0] != "instr":
                    raise SystemExit(f"{path}: made without --dump-instr=yes (positions: {positions})")
                last = [0] * len(positions)
            elif line.startswith("ob="):
                cur_ob = named(obs, line[3:].strip())
            elif line.startswith("fn="):
                cur_fn = named(fns, line[3:].strip())
            elif line.startswith("cfn="):
                named(fns, line[4:].strip())
            elif line.startswith("cob="):
                named(obs, line[4:].strip())
            elif line.startswith("calls="):
                skip_next = True
            elif line.startswith(("jump=", "jcnd=")):
                pass
    return out


def mix(path):
    """{"total": {class: n}, "by_fn": {class: {function: n}}, "ir": total Ir,
    "unmatched": Ir at addresses that are no instruction start of their object}."""
    total = defaultdict(int)
    by_fn = defaultdict(lambda: defaultdict(int))
    ir, unmatched = 0, 0
    for (ob, fn), addrs in profile_costs(path).items():
        classes, starts = disassembly(ob) if ob not in ("???", "") else ({}, set())
        for a, n in addrs.items():
            ir += n
            if starts and a not in starts:
                unmatched += n
            c = classes.get(a)
            if c:
                total[c] += n
                by_fn[c][fn] += n
    return {"ir": ir, "unmatched": unmatched, "total": dict(total),
            "by_fn": {c: dict(v) for c, v in by_fn.items()}}


def minus(a, b):
    """a - b, class by class and function by function."""
    r = {"ir": a["ir"] - b["ir"], "unmatched": a["unmatched"] - b["unmatched"], "total": {}, "by_fn": {}}
    for c in set(a["total"]) | set(b["total"]):
        r["total"][c] = a["total"].get(c, 0) - b["total"].get(c, 0)
    for c in set(a["by_fn"]) | set(b["by_fn"]):
        fa, fb = a["by_fn"].get(c, {}), b["by_fn"].get(c, {})
        r["by_fn"][c] = {f: fa.get(f, 0) - fb.get(f, 0) for f in set(fa) | set(fb)}
    return r


def per(m, n):
    """Counts of `m` divided by `n` (messages)."""
    return {"ir": round(m["ir"] / n, 1), "unmatched": round(m["unmatched"] / n, 2),
            "total": {c: round(v / n, 3) for c, v in m["total"].items()},
            "by_fn": {c: {f: round(v / n, 3) for f, v in fs.items() if abs(v / n) >= 0.005}
                      for c, fs in m["by_fn"].items()}}


def short(fn):
    fn = re.sub(r"::h[0-9a-f]{16}$", "", fn)
    fn = fn.replace("nanowire_", "")
    return fn if len(fn) <= 110 else fn[:107] + "..."


def show(m, top=8, file=sys.stderr):
    print(f"Ir {m['ir']}" + (f" (at no instruction start: {m['unmatched']})" if m["unmatched"] else ""),
          file=file)
    for c in CLASSES:
        v = m["total"].get(c, 0)
        if not v:
            continue
        print(f"  {c:<9} {v}", file=file)
        fs = sorted(m["by_fn"].get(c, {}).items(), key=lambda kv: -abs(kv[1]))[:top]
        for f, n in fs:
            if n:
                print(f"      {n:>12}  {short(f)}", file=file)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--minus", help="a shorter run's profile to subtract")
    ap.add_argument("--per", type=float, default=1.0, help="divide the counts by this (messages)")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = mix(a.profile)
    if a.minus:
        m = minus(m, mix(a.minus))
    m = per(m, a.per) if a.per != 1.0 else m
    if a.json:
        print(json.dumps(m, indent=1))
    show(m, a.top, sys.stdout if not a.json else sys.stderr)


if __name__ == "__main__":
    main()
