#!/usr/bin/env bash
# INT collector: bounded cargo-fuzz run of every parser target on the corpus kept in the repo
# (telemetry/int-collector/fuzz/corpus/<target>). INT_FUZZ_SECONDS per target (default 30;
# 4 targets = 2 minutes). New inputs libFuzzer finds go to a temporary folder, never into the
# repo. This step never skips silently: if fuzzing cannot run, it fails and says why.
#   --build-only   build the targets and exit (used by scripts/bootstrap.d/int-collector.test.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$PWD/.cache/cargo-fuzz/bin:$HOME/.cargo/bin:$PATH"
fuzz_dir=telemetry/int-collector/fuzz
targets=(parse_report parse_int parse_inner state_ingest)
seconds="${INT_FUZZ_SECONDS:-30}"

die() { printf '\n\033[1;31mint-collector fuzz: FAILED: %s\033[0m\n' "$*" >&2; exit 1; }
command -v cargo-fuzz >/dev/null || die "cargo-fuzz is not installed (run scripts/bootstrap.sh --with-test-tools: scripts/bootstrap.d/int-collector.test.sh installs it into .cache/cargo-fuzz)"

# libFuzzer instrumentation needs nightly rustc flags (-Zsanitizer, sancov). Use a nightly
# toolchain when rustup has one; otherwise the stable compiler with RUSTC_BOOTSTRAP=1, which
# accepts the same flags (checked on rustc 1.95 with its bundled ASan runtime).
toolchain=()
# INT_FUZZ_TOOLCHAIN=stable forces the stable path (to check it on a machine that has nightly).
if [[ "${INT_FUZZ_TOOLCHAIN:-}" != stable ]] && command -v rustup >/dev/null &&
  rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
  echo "int-collector fuzz: using the nightly toolchain"
else
  export RUSTC_BOOTSTRAP=1
  echo "int-collector fuzz: no nightly toolchain; using stable rustc with RUSTC_BOOTSTRAP=1"
fi
target_dir="$PWD/target/int-fuzz"
run_fuzz() { (cd "$fuzz_dir" && cargo "${toolchain[@]}" fuzz "$@"); }

# -a: debug assertions, so integer overflow is a crash too.
build_log=$(mktemp)
if ! run_fuzz build -a --target-dir "$target_dir" >"$build_log" 2>&1; then
  tail -30 "$build_log" >&2
  die "cargo fuzz build failed (log above)"
fi
rm -f "$build_log"
[[ "${1:-}" == "--build-only" ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  seeds="$fuzz_dir/corpus/$t"
  [ -d "$seeds" ] && [ -n "$(ls -A "$seeds")" ] || die "no seed corpus in $seeds"
  mkdir -p "$work/$t" "$work/artifacts-$t"
  echo "int-collector fuzz: $t for ${seconds}s on $(ls "$seeds" | wc -l) seeds"
  if ! run_fuzz run -a --target-dir "$target_dir" "$t" "$work/$t" "$PWD/$seeds" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$work/artifacts-$t/" -print_final_stats=1 >"$work/$t.log" 2>&1; then
    tail -40 "$work/$t.log" >&2
    for a in "$work/artifacts-$t"/*; do
      [ -e "$a" ] && { echo "crashing input $a:" >&2; od -A x -t x1z "$a" | head -20 >&2; }
    done
    die "target $t crashed or failed (output above; reproduce: cd $fuzz_dir && cargo fuzz run $t <input>)"
  fi
  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/$t.log" | tail -2 || true
done
echo "int-collector fuzz: all ${#targets[@]} targets ran ${seconds}s each without a crash"
