#!/bin/bash
# Session 20 lead's quiet-machine runs. Usage: run.sh CIDIR OUTDIR
set -u
CI=${1:-/work/ci20}; OUT=${2:-/work/bench20/out}
mkdir -p "$OUT"; cd "$CI" || exit 1
export NANOWIRE=$CI/target/release/nanowire
OLD=/work/baseline/libnanowire_preload.so
./target/release/nanowire lab up >/dev/null 2>&1 || true
run() { local name=$1; shift; echo "== $name $(date +%T)"; "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; echo "rc=$? $(date +%T)"; }
PW="--placement-wait 60 --placement-budget 240"
run floor python3 scripts/compare.py --scenario floor --repeats 5 --seconds 3 --placement near $PW
run wave3 env NANOWIRE_OLD_PRELOAD=$OLD python3 scripts/compare.py --scenario wave3-regress --repeats 7 --seconds 3 --placement near $PW
export NANOWIRE_SHIMS="noowner=+NANOWIRE_SHIM_NO_OWNER=1,old=$OLD+NANOWIRE_PRESTART=0" NANOWIRE_SHIMS_TCP=1
run shims_far python3 scripts/compare.py --scenario shims --repeats 5 --seconds 3 --placement far $PW
run shims_near python3 scripts/compare.py --scenario shims --repeats 5 --seconds 3 --placement near $PW
unset NANOWIRE_SHIMS NANOWIRE_SHIMS_TCP
run service python3 scripts/compare.py --scenario service --repeats 4 --seconds 3
run nginx4 python3 scripts/compare.py --scenario churn --rows nginx4 --repeats 5
./target/release/nanowire lab down >/dev/null 2>&1 || true
