#!/bin/bash
# interleaved p50 as compare.py's shims rows run sockperf: --profile latency --engine xdp, pinned, -m ${SIZE:-64}.
# usage: ab_lead.sh A.so B.so PAIRS [--tcp]
export PATH=/work/main/target/release:$PATH
A=$1; B=$2; P=$3; proto=${4:-}
for r in $(seq 1 $P); do for so in $A $B; do
  ip netns exec nw-b env NANOWIRE_PRELOAD=$so nanowire run --profile latency --engine xdp -- taskset -c 1 sockperf sr -i 198.18.0.2 -p 11111 $proto > /dev/null 2>&1 &
  sleep 1.2
  p=$(ip netns exec nw-a env NANOWIRE_PRELOAD=$so nanowire run --profile latency --engine xdp -- taskset -c 0 sockperf pp -i 198.18.0.2 -p 11111 -m ${SIZE:-64} -t 3 $proto 2>&1 | awk '/percentile 50.000/{print $NF}')
  pkill -f "sockperf sr"; sleep 0.4
  echo "$r $(basename $so) $p"
done; done
