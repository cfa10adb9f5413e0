#!/usr/bin/env python3
"""Summarise a soak (soak.jsonl) into soak.json and an SVG plot."""
import json, sys

out, rate, loss, engine, sample = sys.argv[1:6]
rows = [json.loads(l) for l in open(f"{out}/soak.jsonl") if l.strip()]
if not rows:
    sys.exit("soak: no samples")
rss = [r["server_rss_kb"] for r in rows]
held = [bool(r["accounting"] and r["accounting"]["holds"]) for r in rows]
summary = {
    "samples": len(rows), "sample_s": int(sample), "rate_msg_s": int(rate), "loss_pct": float(loss),
    "engine": engine, "duration_s": rows[-1]["t_s"],
    "sent": sum(r["sent"] or 0 for r in rows), "received": sum(r["received"] or 0 for r in rows),
    "dropped": sum(r["dropped"] or 0 for r in rows),
    "wire_dropped_last_sample": rows[-1]["wire_dropped"],
    "accounting_held_every_sample": all(held), "samples_where_it_failed": [r["sample"] for r, h in zip(rows, held) if not h],
    "server_rss_kb_first": rss[0], "server_rss_kb_last": rss[-1], "server_rss_kb_max": max(rss),
    "worst_p99_us": max((r["p99_us"] or 0) for r in rows), "worst_max_us": max((r["max_us"] or 0) for r in rows),
}
# Per sample: the client's drops against what was counted on the way (the
# wire's drops, the kernel's drops in both hosts, the server engine's drops);
# all counters are cumulative, so compare differences.
def engine_drops(r):
    c = r.get("server_counters") or {}
    return sum(v for k, v in c.items() if k.startswith("drop_") or k in ("xsk_rx_dropped", "xsk_rx_ring_full"))
prev = None
explained = []
for r in rows:
    if prev is not None and r.get("kernel_dropped_a") is not None:
        counted = ((r["wire_dropped"] or 0) - (prev["wire_dropped"] or 0)
                   + r["kernel_dropped_a"] - prev["kernel_dropped_a"]
                   + r["kernel_dropped_b"] - prev["kernel_dropped_b"]
                   + engine_drops(r) - engine_drops(prev))
        explained.append({"sample": r["sample"], "client_dropped": r["dropped"], "counted_on_the_way": counted})
    prev = r
if explained:
    summary["drops_vs_counted"] = explained
    summary["samples_where_every_drop_was_counted"] = sum(1 for e in explained if e["counted_on_the_way"] >= e["client_dropped"])
json.dump(summary, open(f"{out}/soak.json", "w"), indent=1)
print(json.dumps(summary, indent=1))

# Plot: server RSS (MB) and drops per sample over time, two panels.
W, H, P = 720, 420, 50
def panel(y0, h, ys, colour, label):
    lo, hi = min(ys), max(ys)
    rng = f"min {lo:g}, max {hi:g}" if hi != lo else f"flat at {lo:g}"
    if hi == lo:
        hi = lo + 1
    ts = [r["t_s"] for r in rows]
    tmax = max(ts) or 1
    pts = " ".join(f"{P + (W - 2 * P) * t / tmax:.1f},{y0 + h - (h * (y - lo) / (hi - lo)):.1f}" for t, y in zip(ts, ys))
    return (f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{pts}"/>'
            f'<text x="{P}" y="{y0 - 6}" font-size="13">{label} ({rng})</text>'
            f'<line x1="{P}" y1="{y0 + h}" x2="{W - P}" y2="{y0 + h}" stroke="#888"/>')
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
       '<rect width="100%" height="100%" fill="white"/>',
       f'<text x="{P}" y="20" font-size="15">soak: {engine}, {rate} msg/s, {loss}% loss each way, {summary["duration_s"]} s</text>',
       f'<text x="{P}" y="38" font-size="13">accounting (asked = received + dropped) held in every sample: {summary["accounting_held_every_sample"]}</text>',
       panel(75, 115, [v / 1024 for v in rss], "#1f77b4", "server RSS, MB"),
       panel(240, 130, [r["dropped"] or 0 for r in rows], "#d62728", f"replies dropped per {sample} s sample (counted)"),
       f'<text x="{W // 2 - 40}" y="{H - 10}" font-size="12">time, s</text>', '</svg>']
open(f"{out}/soak.svg", "w").write("\n".join(svg))
