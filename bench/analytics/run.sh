#!/usr/bin/env bash
# Analytics benchmark: flows classified per second (engine's batched path vs one predict call
# per flow), and per-record detection latency in the streaming worker on the real Kafka broker
# (worker vs a bare consume-and-commit loop on the same records, and vs the 20 ms p99 target).
#   bench/analytics/run.sh [--flows 2000] [--records 20000] [--rate 2000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$HOME/.local/bin:$PATH"
echo "machine: $(nproc) cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
exec uv run --quiet python bench/analytics/bench.py "$@"
