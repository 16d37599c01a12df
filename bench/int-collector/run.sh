#!/usr/bin/env bash
# INT collector throughput: reports/s per core from memory (collector vs parse-only vs
# export-every-report, measured side by side) and over loopback (collector receive path vs a
# bare recvmmsg loop = this kernel's UDP receive limit), with the filter ratio and the published
# anchors (INTCollector 1.2 M/s, AF_XDP collector ~3 M/s/core) as ratios.
#   bench/int-collector/run.sh [--seconds 3] [--flows 10000] [--hops 4] [--format v2.0] [--json]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet -p cgloop-int-collector
target="${CARGO_TARGET_DIR:-target}"
echo "machine: $(nproc) cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
"$target/release/cgloop-int-collector" bench "$@"
