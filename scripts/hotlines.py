#!/usr/bin/env python3
"""Hot code lines per message: how much instruction cache a message's path needs, without a PMU.

Session 16 (helper tcplat) found that TCP's per-message code under `nanowire run` is past a 32 KiB
L1i where UDP's fits; the count that shows it is the number of 64-byte code lines holding an
instruction that runs at least THRESHOLD times per message (default 0.5). This tool counts them
from two callgrind profiles made with `--dump-instr=yes` (a short and a long run: the start
cancels out), e.g. the ones `scripts/msgwork.py --diff --insnmix` leaves in the directories its
JSON names (`runs[i].dir`):

    scripts/hotlines.py --msgwork OUT.json --side server          # from msgwork's JSON
    scripts/hotlines.py LONG.cg --minus SHORT.cg --per DMSGS      # two profiles by hand
    scripts/hotlines.py ... --top 40 --json

How: per object and address, the difference of the two runs' `Ir` divided by the messages
(insnmix.profile_costs: addresses as objdump shows them; shared objects are loaded page-aligned,
so an address's line is the same at run time); an instruction's bytes are from its address to the
next instruction start of `objdump -d` (at most 15); every line an executed instruction's bytes
touch is counted once, and charged to the function that has the most hot instructions in it.
"""
import argparse, json, os, sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import insnmix  # noqa: E402

LINE = 64


def starts_sorted(obj):
    _, starts = insnmix.disassembly(obj) if obj not in ("???", "") else ({}, set())
    return sorted(starts)


def per_message(long_cg, short_cg, n):
    """{(object, function): {address: executions per message}}."""
    a = insnmix.profile_costs(long_cg)
    b = insnmix.profile_costs(short_cg) if short_cg else {}
    out = {}
    for k in set(a) | set(b):
        fa, fb = a.get(k, {}), b.get(k, {})
        out[k] = {ad: (fa.get(ad, 0) - fb.get(ad, 0)) / n for ad in set(fa) | set(fb)}
    return out


def hot_lines(costs, threshold=0.5):
    sizes = {}
    lines = {}  # (object, line address) -> {function: hot instructions}
    hot_bytes = 0
    for (ob, fn), addrs in costs.items():
        hot = [ad for ad, v in addrs.items() if v >= threshold]
        if not hot:
            continue
        if ob not in sizes:
            st = starts_sorted(ob)
            sizes[ob] = {x: min(15, y - x) for x, y in zip(st, st[1:])}
        for ad in hot:
            sz = sizes[ob].get(ad, 4)
            hot_bytes += sz
            for ln in range(ad // LINE, (ad + sz - 1) // LINE + 1):
                lines.setdefault((ob, ln), defaultdict(int))[fn] += 1
    by_fn = defaultdict(int)
    by_ob = defaultdict(int)
    for (ob, _), fns in lines.items():
        by_fn[max(fns.items(), key=lambda kv: kv[1])[0]] += 1
        by_ob[os.path.basename(ob)] += 1
    return {"lines": len(lines), "kib": round(len(lines) * LINE / 1024, 1),
            "hot_instruction_kib": round(hot_bytes / 1024, 1),
            "by_object": dict(sorted(by_ob.items(), key=lambda kv: -kv[1])),
            "by_function": dict(sorted(by_fn.items(), key=lambda kv: -kv[1]))}


def from_msgwork(path, side):
    res = json.load(open(path))
    runs = res["runs"]

    def cg(r):
        d = r["dir"]
        return os.path.join(d, next(f for f in os.listdir(d) if f.startswith(side + ".")))
    if len(runs) == 2:
        return cg(runs[1]), cg(runs[0]), runs[1]["messages"] - runs[0]["messages"]
    return cg(runs[0]), None, runs[0]["messages"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", nargs="?")
    ap.add_argument("--minus")
    ap.add_argument("--per", type=float)
    ap.add_argument("--msgwork", help="msgwork.py's JSON (its run directories must still exist)")
    ap.add_argument("--side", default="server", choices=["server", "client"])
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.msgwork:
        long_cg, short_cg, n = from_msgwork(a.msgwork, a.side)
    else:
        if not a.profile or not a.per:
            ap.error("PROFILE and --per (or --msgwork)")
        long_cg, short_cg, n = a.profile, a.minus, a.per
    r = hot_lines(per_message(long_cg, short_cg, n), a.threshold)
    if a.json:
        print(json.dumps(r, indent=1))
        return
    print(f"hot lines {r['lines']} ({r['kib']} KiB; hot instructions {r['hot_instruction_kib']} KiB)")
    print("  by object: " + ", ".join(f"{o} {v}" for o, v in r["by_object"].items()))
    for fn, v in list(r["by_function"].items())[:a.top]:
        print(f"  {v:>4}  {insnmix.short(fn)}")


if __name__ == "__main__":
    main()
