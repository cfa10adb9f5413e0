#!/usr/bin/env bash
# make fuzz: build the libFuzzer driver on stable Rust (sanitizer coverage
# through -Cpasses=sancov-module, no -Z flag) and run every target for
# FUZZ_SECONDS. A crash (or hang, or OOM) is copied into
# fuzz/regressions/<target>/ — commit it: `make test` replays it — and the
# run fails. Corpora live in target/fuzz/corpus/<target> (not committed).
#   FUZZ_SECONDS=60 FUZZ_TARGETS="ipv4 udp" FUZZ_JOBS=1 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
triple=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS off build scripts (they cannot link the coverage hooks).
cargo build --release --locked -p nanowire-fuzz --features libfuzzer --bin nanowire-fuzz \
  --target "$triple" --target-dir target/fuzz
bin=target/fuzz/$triple/release/nanowire-fuzz
all=$(sed -n 's/^        name: "\([a-z0-9_]*\)",$/\1/p' fuzz/src/lib.rs)
targets=${FUZZ_TARGETS:-$all}
failed=()
for t in $targets; do
  corpus=target/fuzz/corpus/$t
  art=target/fuzz/artifacts/$t
  mkdir -p "$corpus" "$art" fuzz/regressions/"$t"
  rm -f "$art"/*
  seed=()
  [ -n "$(ls -A "$corpus")" ] || seed=(env NANOWIRE_FUZZ_SEED_DIR="$corpus")
  echo "fuzz: $t for ${secs}s"
  rc=0
  "${seed[@]}" env NANOWIRE_FUZZ_TARGET="$t" "$bin" -max_total_time="$secs" -timeout="${FUZZ_TIMEOUT:-10}" \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/" "$corpus" fuzz/regressions/"$t" \
    >"target/fuzz/$t.log" 2>&1 || rc=$?
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^Done" "target/fuzz/$t.log" | tr '\n' ' ' || true
  echo
  if [ "$rc" != 0 ] || [ -n "$(ls -A "$art")" ]; then
    mkdir -p fuzz/regressions/"$t"
    cp "$art"/* fuzz/regressions/"$t"/ 2>/dev/null || true
    echo "fuzz: $t FAILED (exit $rc); inputs kept in fuzz/regressions/$t, log target/fuzz/$t.log" >&2
    tail -30 "target/fuzz/$t.log" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failures in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all targets passed:" $targets
