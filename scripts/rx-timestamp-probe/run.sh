#!/usr/bin/env bash
# What does the XDP metadata kfunc bpf_xdp_metadata_rx_timestamp give on a
# veth in the lab? Builds a device-bound probe program (libbpf), attaches it
# natively and in generic mode to <lab>-b0, sends ICMP, UDP from a kernel
# socket and UDP from an AF_XDP engine from host a, prints one JSON line per
# mode. Usage (root): scripts/rx-timestamp-probe/run.sh [LAB] (default nwprobe)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lab=${1:-nwprobe}
nw=${NANOWIRE:-target/release/nanowire}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; "$nw" lab down --name "$lab" >/dev/null 2>&1 || true' EXIT
clang -O2 -g -target bpf -I/usr/include/x86_64-linux-gnu -Wall -c "$here/probe.bpf.c" -o "$tmp/probe.bpf.o"
cc -O2 -Wall "$here/probe.c" -o "$tmp/probe" -lbpf
"$nw" lab up --name "$lab" >/dev/null
for mode in native generic; do
  ip netns exec "$lab-b" "$tmp/probe" "$tmp/probe.bpf.o" "$lab-b0" "$mode" 3 &
  sleep 1
  ip netns exec "$lab-a" ping -c 2 -i 0.2 198.18.0.2 >/dev/null || true
  ip netns exec "$lab-a" python3 -c "import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); [s.sendto(b'x',('198.18.0.2',9)) for _ in range(5)]"
  ip netns exec "$lab-a" "$nw" bench burst -i 198.18.0.2 -p 9 -n 20 --engine xdp >/dev/null 2>&1 || true
  wait
done
