#!/usr/bin/env bash
# The whole suite, as `make test` runs it (after `make setup`): lints, Rust tests, Python tests.
# Tests that need root or network namespaces mark themselves and skip cleanly without them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "buf lint (proto/)"
(cd proto && node_modules/.bin/buf lint)
step "ruff"
uv run --quiet ruff check .
step "cargo test --workspace"
cargo test --workspace --quiet
step "pytest"
uv run --quiet pytest "$@"
# Component steps (bounded fuzzing, …): scripts/test.d/<component>.sh, in name order.
for f in scripts/test.d/*.sh; do
  [ -e "$f" ] || continue
  step "${f#scripts/}"
  bash "$f"
done
