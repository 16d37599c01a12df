#!/usr/bin/env bash
# One command: build the release agent and run the node-agent benchmark (needs root).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cargo build --release --quiet -p cgloop-node-agent
cargo build --release --quiet -p cgloop-node-agent --example bench_client --example udp_sender
release="${CARGO_TARGET_DIR:-$PWD/target}/release"
CGLOOP_BIN_DIR="$release" CGLOOP_BENCH_CLIENT="$release/examples/bench_client" \
  CGLOOP_BENCH_SENDER="$release/examples/udp_sender" \
  uv run --quiet python bench/node-agent/bench.py
