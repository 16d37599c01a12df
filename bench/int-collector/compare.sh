#!/usr/bin/env bash
# INT collector from memory, side by side with an earlier commit's build: both binaries run
# alternately in the same session (ROUNDS rounds each, `bench --memory-only`), each round
# printed with the load average, then the median of each and their ratio.
#   bench/int-collector/compare.sh [BASE_REV (default HEAD~1)] [ROUNDS (default 3)] [bench args...]
# The baseline is built from `git archive BASE_REV` in a temporary folder, with the same cargo
# target dir (dependencies are reused; the contract and collector crates are rebuilt).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$HOME/.cargo/bin:$PATH"
base_rev="${1:-HEAD~1}"  # name the commit: others commit to the same branch
rounds="${2:-3}"
shift $(( $# > 2 ? 2 : $# ))
target="${CARGO_TARGET_DIR:-$PWD/target}"
export CARGO_TARGET_DIR="$target"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
base_sha="$(git rev-parse --short "$base_rev")"
cur_sha="$(git rev-parse --short HEAD)$(git diff --quiet -- telemetry/int-collector proto/cgloop/v1/int.proto || echo +wip)"

mkdir -p "$work/src"
git archive "$base_rev" | tar -x -C "$work/src"
# Both trees share the target dir (and its dependencies): cargo tells the two trees' crates
# apart by mtime only, so the contract and collector crates are cleaned before each build.
rebuild() { cargo clean --release --quiet -p cgloop-proto -p cgloop-int-collector; cargo build --release --quiet -p cgloop-int-collector; }
(cd "$work/src" && rebuild)
cp "$target/release/cgloop-int-collector" "$work/base"
rebuild
cp "$target/release/cgloop-int-collector" "$work/cur"

echo "machine: $(nproc) cores, $(uname -r), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "from memory, 1 core, M reports per CPU-second (parse + state + filter); base $base_sha vs now $cur_sha"
for i in $(seq 1 "$rounds"); do
  for which in base cur; do
    out="$("$work/$which" bench --memory-only --json "$@")"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)["memory"]
m = lambda k: r[k] / 1e6
print("%-4s round %s  collector %5.2f  parse-only %5.2f  export-all %5.2f  filter ratio %.0f  load %s" % (
    sys.argv[1], sys.argv[2], m("collector_reports_per_s"), m("parse_only_reports_per_s"),
    m("export_every_report_reports_per_s"), r["filter_ratio"], sys.argv[3]))
' "$which" "$i" "$load" | tee -a "$work/rounds.txt"
  done
done
python3 - "$work/rounds.txt" "$base_sha" "$cur_sha" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def vals(which, col):
    return [float(r[r.index(col) + 1]) for r in rows if r[0] == which]
# Interference from other processes only slows a round down: the best round is the least
# disturbed one, the median the typical one. Both are printed.
for col in ("collector", "parse-only", "export-all"):
    b, c = vals("base", col), vals("cur", col)
    mb, mc = statistics.median(b), statistics.median(c)
    print(f"{col:10}  base {sys.argv[2]} median {mb:5.2f} best {max(b):5.2f}"
          f"  now {sys.argv[3]} median {mc:5.2f} best {max(c):5.2f}"
          f"  now/base: median {mc / mb:.2f}x, best {max(c) / max(b):.2f}x")
c = statistics.median(vals("cur", "collector"))
print(f"target 3 M reports/s/core: {'met' if c >= 3 else 'NOT met'} (median {c:.2f});"
      f" vs INTCollector 1.2 M/s = {c / 1.2:.2f}x, vs AF_XDP collector 3 M/s/core = {c / 3:.2f}x")
EOF
