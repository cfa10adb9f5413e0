#!/bin/bash
# nginx 4 workers under run on host b's engine service: shim A vs shim B, alternated; ab -c 20 from host a.
# usage: nginx_ab.sh A.so B.so PAIRS [REQUESTS]
export PATH=/work/main/target/release:$PATH
A=$1; B=$2; P=$3; N=${4:-10000}
ip netns exec nw-b nanowire engine serve --daemon --idle-ms 600000 >/dev/null 2>&1
sleep 1
for r in $(seq 1 $P); do for so in $A $B; do
  ip netns exec nw-b env NANOWIRE_PRELOAD=$so NANOWIRE_SERVICE=1 nanowire run -- nginx -c /work/n4/run/nginx.conf > /dev/null 2>&1 &
  sleep 2
  ip netns exec nw-a ab -q -n 200 -c 20 http://198.18.0.2:8083/ >/dev/null 2>&1
  x=$(ip netns exec nw-a ab -q -n $N -c 20 http://198.18.0.2:8083/ 2>&1 | awk '/Requests per second/{print $4}')
  kill $(cat /work/n4/run/nginx.pid) 2>/dev/null; sleep 1.5
  echo "$r $(basename $so) $x"
done; done
for p in $(pgrep -f "engine serve"); do [ "$(ip netns identify $p)" = "nw-b" ] && kill $p; done
