#!/usr/bin/env bash
# INT collector (telemetry/int-collector), for the tests only (`make test` runs it through
# `scripts/bootstrap.sh --with-test-tools`; `make run` does not): cargo-fuzz for the bounded
# fuzzing step of scripts/test.d/int-collector.sh, installed from crates.io into .cache/cargo-fuzz
# (kept by CI's cache), and the fuzz targets built once so the test step spends its time fuzzing.
# Idempotent: does nothing when the pinned version is already there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$HOME/.cargo/bin:$PATH"

CARGO_FUZZ_VERSION=0.13.2
root=.cache/cargo-fuzz
if ! "$root/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION"; then
  echo "int-collector: installing cargo-fuzz $CARGO_FUZZ_VERSION into $root"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$root" --quiet
fi

# Build the fuzz targets (nightly when rustup has it, else stable with RUSTC_BOOTSTRAP=1; see
# scripts/test.d/int-collector.sh). A failure here is reported, not fatal: the test step
# rebuilds and fails loudly if fuzzing truly cannot run.
bash scripts/test.d/int-collector.sh --build-only ||
  echo "int-collector: WARNING: building the fuzz targets failed; scripts/test.d/int-collector.sh will report why" >&2
