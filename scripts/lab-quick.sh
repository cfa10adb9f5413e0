#!/usr/bin/env bash
# The main job's quick run: the seed suite when it exists, otherwise a UDP
# ping-pong comparison of every engine in the lab.
set -euo pipefail
nw=${1:-target/release/nanowire}
out=${2:-lab-report}
if "$nw" lab report --help >/dev/null 2>&1; then
  exec "$nw" lab report --quick --out "$out"
fi
lab=${LAB:-nw}
# Run the server directly in the namespace (not through `lab exec`) so the
# trap's kill reaches the server process itself.
ip netns exec "$lab-b" "$nw" bench server -i 198.18.0.2 -p 11111 --engine spin --cpu 1 >"$out.server.log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null || true; wait $srv 2>/dev/null || true' EXIT
for _ in $(seq 50); do
  ip netns exec "$lab-b" ss -ulnH sport = :11111 | grep -q . && break
  sleep 0.1
done
printf '%-8s %8s %8s %8s %8s\n' engine p50_us p99_us p99.9_us max_us
for e in kernel spin; do
  ip netns exec "$lab-a" "$nw" bench pp -i 198.18.0.2 -p 11111 -m 64 -t 3 --engine "$e" --cpu 0 --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); l=d["latency_us"]; print("%-8s %8.2f %8.2f %8.2f %8.2f" % (d["engine"], l["p50"], l["p99"], l["p99.9"], l["max"]))'
done
