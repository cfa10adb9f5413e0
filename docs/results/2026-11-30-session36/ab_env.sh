#!/bin/bash
# interleaved p50: same shim, env A vs env B (both ends). usage: ab_env.sh "ENV_A" "ENV_B" PAIRS [--tcp]
export PATH=/work/main/target/release:$PATH
SO=${SO:-/work/main/target/shim/libnanowire_preload.so}
A=$1; B=$2; P=$3; proto=${4:-}
for r in $(seq 1 $P); do for e in "$A" "$B"; do
  ip netns exec nw-b env NANOWIRE_PRELOAD=$SO $e nanowire run -- sockperf sr $proto -i 198.18.0.2 -p 11111 > /dev/null 2>&1 &
  sleep 1.2
  p=$(ip netns exec nw-a env NANOWIRE_PRELOAD=$SO $e nanowire run -- sockperf pp $proto -i 198.18.0.2 -p 11111 -t 3 2>&1 | awk '/percentile 50.000/{print $NF}')
  pkill -f "sockperf sr"; sleep 0.4
  echo "$r [$e] $p"
done; done
