#!/bin/bash
# Session 18 lead's quiet-machine runs. Usage: run.sh CIDIR OUTDIR
set -u
CI=${1:-/work/ci18}; OUT=${2:-/work/bench18/out}
mkdir -p "$OUT"; cd "$CI" || exit 1
export NANOWIRE=$CI/target/release/nanowire
OLD=/work/baseline/libnanowire_preload.so
./target/release/nanowire lab up >/dev/null 2>&1 || true
run() { local name=$1; shift; echo "== $name $(date +%T)"; "$@" > "$OUT/$name.json" 2> "$OUT/$name.err"; echo "rc=$? $(date +%T)"; }
run floor python3 scripts/compare.py --scenario floor --repeats 5 --seconds 3 --placement near --placement-wait 60 --placement-budget 240
run wave3 env NANOWIRE_OLD_PRELOAD=$OLD python3 scripts/compare.py --scenario wave3-regress --repeats 7 --seconds 3 --placement near --placement-wait 60 --placement-budget 240
run service python3 scripts/compare.py --scenario service --repeats 5 --seconds 3
run nginx4 python3 scripts/compare.py --scenario churn --rows nginx4 --repeats 9
run wave3any env NANOWIRE_OLD_PRELOAD=$OLD python3 scripts/compare.py --scenario wave3-regress --repeats 7 --seconds 3
./target/release/nanowire lab down >/dev/null 2>&1 || true
