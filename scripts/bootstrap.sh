#!/usr/bin/env bash
# Installs everything cgloop needs on a fresh machine, idempotently and without prompts.
# Called by `make run` and `make test` (through the Makefile's `setup` target); safe to re-run:
# each step checks first and does nothing when its result is already there.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }

# --- Debian packages ----------------------------------------------------------------------------
# clang/llvm/libbpf/bpftool/libelf: BPF programs (telemetry/). protobuf-compiler: prost-build.
# libcurl/libssl/zlib/cmake/pkg-config: rdkafka's cmake build. iproute2: namespaces and qdiscs.
apt_packages=(
  clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev pkg-config
  protobuf-compiler libprotobuf-dev
  libcurl4-openssl-dev libssl-dev cmake
  iproute2 procps
)
# Each component may list more Debian packages in scripts/bootstrap.d/<component>.apt (one a line,
# '#' comments), so components never edit this file to add theirs.
for f in scripts/bootstrap.d/*.apt; do
  [ -e "$f" ] || continue
  while read -r p _; do [[ -z "$p" || "$p" == \#* ]] || apt_packages+=("$p"); done <"$f"
done
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt packages: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Java (Kafka broker) ------------------------------------------------------------------------
command -v java >/dev/null || { echo "bootstrap: java (OpenJDK 17+) is missing; install openjdk-17-jre-headless" >&2; exit 1; }
command -v mvn >/dev/null || { log "maven: installing"; apt-get install -y -qq maven >/dev/null; }

# --- uv and the Python workspace ----------------------------------------------------------------
if ! command -v uv >/dev/null; then
  log "uv: installing from PyPI"
  python3 -m pip install -q --user uv 2>/dev/null || python3 -m pip install -q uv
  export PATH="$HOME/.local/bin:$PATH"
fi
# The workspace includes a Rust extension (datasets/arrow-codec, built by maturin): cargo first.
command -v cargo >/dev/null || { echo "bootstrap: cargo is missing (install Rust with rustup)" >&2; exit 1; }
log "python: uv sync"
uv sync --all-packages --frozen --quiet 2>/dev/null || uv sync --all-packages --quiet

# --- Generated code: protobuf bindings ----------------------------------------------------------
make --no-print-directory -s proto

# --- Kafka broker jars (Maven Central), cached in .cache/kafka ----------------------------------
uv run --quiet python -m cgloop.stack.kafka_install

# --- buf (npm) for protobuf linting, cached in proto/node_modules -------------------------------
if [ ! -x proto/node_modules/.bin/buf ]; then
  # `npm install` (not `npm ci`) honours the lock but tolerates optional platform packages
  # (buf's darwin/win32 builds) that a registry mirror may not serve; `npm ci` refuses then.
  log "buf: npm install (locked)"
  (cd proto && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi

# --- Rust workspace -----------------------------------------------------------------------------
command -v cargo >/dev/null || { echo "bootstrap: cargo is missing (install Rust with rustup)" >&2; exit 1; }
log "rust: cargo build --workspace"
cargo build --workspace --quiet --locked

# --- Component steps: scripts/bootstrap.d/<component>.sh, in name order, each idempotent -------
for f in scripts/bootstrap.d/*.sh; do
  [ -e "$f" ] || continue
  log "step: ${f#scripts/}"
  bash "$f"
done

log "ready"
