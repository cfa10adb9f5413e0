#!/bin/bash
# The lead's quiet-machine benchmark run (after the clean-clone CI), from a plan file.
# Usage: scripts/lead_bench.sh CIDIR OUTDIR PLAN
#   CIDIR  a built checkout (its target/release/nanowire and scripts/compare.py are used)
#   OUTDIR where NAME.json (compare.py's JSON) and NAME.err go, with a copy of the plan
#   PLAN   one run a line: `NAME [VAR=VALUE ...] COMPARE_ARGS...`; the VAR=VALUE words are put in
#          compare.py's environment; in any word @OLD@ becomes the old shim ($NANOWIRE_OLD_PRELOAD,
#          default /work/baseline/libnanowire_preload.so) and @PW@ the placement wait options.
#          Blank lines and lines starting with '#' are skipped.
# Each session's docs/results/<date>-sessionN/plan.txt is the plan its numbers came from.
set -u
if [ $# -ne 3 ]; then echo "usage: $0 CIDIR OUTDIR PLAN" >&2; exit 2; fi
CI=$1; OUT=$2; PLAN=$(realpath "$3") || exit 2
OLD=${NANOWIRE_OLD_PRELOAD:-/work/baseline/libnanowire_preload.so}
PW="--placement-wait 60 --placement-budget 240"
mkdir -p "$OUT" && cp "$PLAN" "$OUT/plan.txt" && cd "$CI" || exit 1
export NANOWIRE=$CI/target/release/nanowire
"$NANOWIRE" lab up >/dev/null 2>&1 || true
while read -r name rest; do
    case "$name" in ''|'#'*) continue ;; esac
    envs=(); args=()
    for w in $rest; do
        w=${w//@OLD@/$OLD}
        if [ ${#args[@]} -eq 0 ] && [[ "$w" =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$w")
        elif [ "$w" = "@PW@" ]; then args+=($PW)
        else args+=("$w"); fi
    done
    echo "== $name $(date +%T)"
    env "${envs[@]}" python3 scripts/compare.py "${args[@]}" < /dev/null > "$OUT/$name.json" 2> "$OUT/$name.err"
    echo "rc=$? $(date +%T)"
done < "$PLAN"
"$NANOWIRE" lab down >/dev/null 2>&1 || true
