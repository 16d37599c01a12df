#!/usr/bin/env bash
# One command: build the release agent and run the node-agent benchmark (needs root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --quiet -p cgloop-node-agent
CGLOOP_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/release" uv run --quiet python bench/node-agent/bench.py
