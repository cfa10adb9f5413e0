#!/usr/bin/env bash
# make soak: SOAK_SECONDS (default 3600) of UDP at a fixed, modest rate
# through the impaired lab (SOAK_LOSS % loss each way) against one long-lived
# xdp server. Every SOAK_SAMPLE seconds: one client run of that length
# (`bench ul --reply-every 1 --strict`, so every message asks for a reply),
# the server's RSS, its engine counters and the wire's counters; the
# accounting identity (asked = received + dropped) is checked for each
# sample. Writes $SOAK_OUT/soak.jsonl, soak.json (summary) and soak.svg.
# The server (SOAK_ENGINE, default xdp) blocks between messages
# (--spin-then-block-us) and the client is a kernel socket by default
# (SOAK_CLIENT_ENGINE), so a soak does not keep cores spinning for an hour.
# A reply may take up to 1 s before it counts as dropped.
set -euo pipefail
cd "$(dirname "$0")/.."
NW=${NANOWIRE:-target/release/nanowire}
NW=$(realpath "$NW")
secs=${SOAK_SECONDS:-3600}
sample=${SOAK_SAMPLE:-60}
rate=${SOAK_RATE:-2000}
loss=${SOAK_LOSS:-0.1}
engine=${SOAK_ENGINE:-xdp}
client_engine=${SOAK_CLIENT_ENGINE:-kernel}
lab=${SOAK_LAB:-nwsoak}
out=${SOAK_OUT:-docs/soak}
mkdir -p "$out"
"$NW" lab up --impair --name "$lab" >/dev/null
cleanup() {
  [ -n "${srv:-}" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null
  "$NW" lab down --name "$lab" >/dev/null || true
}
trap cleanup EXIT
"$NW" lab impair --name "$lab" --loss "$loss" >/dev/null
# Started directly in the namespace (`ip netns exec` execs), so $srv is the
# server itself: its RSS is what is sampled.
ip netns exec "$lab-b" "$NW" bench server -i 198.18.0.2 -p 11300 --engine "$engine" \
  --spin-then-block-us 20 >"$out/server.log" 2>&1 &
srv=$!
for _ in $(seq 100); do grep -q "(engine " "$out/server.log" && break; sleep 0.1; done
grep "(engine " "$out/server.log"
: >"$out/soak.jsonl"
start=$(date +%s)
n=0
while [ $(( $(date +%s) - start + sample )) -le "$secs" ]; do
  n=$((n + 1))
  rc=0
  res=$("$NW" lab exec --name "$lab" a -- "$NW" bench ul -i 198.18.0.2 -p 11300 --engine "$client_engine" \
    --reply-timeout-ms 1000 --mps "$rate" --reply-every 1 -t "$sample" --warmup-ms 0 --json --strict) || rc=$?
  rss=$(awk '/^VmRSS/ {print $2}' /proc/$srv/status 2>/dev/null || echo 0)
  kill -0 "$srv" 2>/dev/null || { echo "soak: the server ($srv) is gone" >&2; exit 1; }
  stats=$("$NW" stats --json)
  # Drops the kernel counts in each host: UDP InErrors (receive buffer full,
  # checksum) and the interfaces' rx_dropped.
  kdrops() { ip netns exec "$lab-$1" sh -c 'grep "^Udp:" /proc/net/snmp | tail -1 | cut -d" " -f4; cat /sys/class/net/*/statistics/rx_dropped' | awk '{s+=$1} END {print s+0}'; }
  ka=$(kdrops a); kb=$(kdrops b)
  wire=$("$NW" lab status --name "$lab" --json || true)
  python3 - "$n" "$(( $(date +%s) - start ))" "$rc" "$rss" "$srv" "$ka" "$kb" <<PY >>"$out/soak.jsonl"
import json, sys
n, t, rc, rss, pid, ka, kb = sys.argv[1:8]
res = json.loads('''$res''' or 'null')
stats = json.loads('''$stats''')
wire = json.loads('''$wire''' or 'null')
eng = [e for e in stats.get("engines", []) if e.get("pid", e.get("info", {}).get("pid")) == int(pid)]
w = (wire or {}).get("wire") or {}
print(json.dumps({
  "sample": int(n), "t_s": int(t), "client_exit": int(rc), "server_rss_kb": int(rss or 0),
  "sent": res and res["sent"], "received": res and res["received"], "dropped": res and res["dropped"],
  "accounting": res and res["accounting"], "p99_us": res and res["latency_us"] and res["latency_us"]["p99"],
  "max_us": res and res["latency_us"] and res["latency_us"]["max"],
  "server_counters": eng[0]["counters"] if eng else None,
  "wire_dropped": (w.get("ab", {}).get("dropped_loss", 0) + w.get("ba", {}).get("dropped_loss", 0)) if w else None,
  "kernel_dropped_a": int(ka or 0), "kernel_dropped_b": int(kb or 0),
}))
PY
  tail -1 "$out/soak.jsonl" | cut -c1-200
done
python3 scripts/soak-summary.py "$out" "$rate" "$loss" "server $engine, client $client_engine" "$sample"
