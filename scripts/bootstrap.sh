#!/usr/bin/env bash
# Installs what cgloop needs on a fresh machine, idempotently and without prompts; safe to re-run:
# each step checks first and does nothing when its result is already there.
#   scripts/bootstrap.sh                    what the main job (`make run`, the closed loop) needs
#   scripts/bootstrap.sh --with-test-tools  that, plus the tools only the tests use (`make test`):
#                                           buf (proto lint), cargo-fuzz and the fuzz targets, the
#                                           Debian packages in scripts/bootstrap.d/*.test.apt
#   --dry-run                               print what would be installed or run, change nothing
set -euo pipefail

usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
with_test_tools=0
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --with-test-tools) with_test_tools=1 ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bootstrap: unknown option '$arg' (accepted: --with-test-tools, --dry-run, --help)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }
# act CMD…: run CMD, or under --dry-run only say it would (on fd 3, the script's stdout, so a
# redirection of the command's own output does not hide the message).
exec 3>&1
act() { if ((dry_run)); then log "dry-run: would run: $*" >&3; else "$@"; fi; }

# Component files in scripts/bootstrap.d: <component>.apt / .sh are for the main job, and
# <component>.test.apt / .test.sh for the tests only (read with --with-test-tools).
component_files() { # $1 = apt | sh
  local f
  for f in scripts/bootstrap.d/*."$1"; do
    [ -e "$f" ] || continue
    if [[ "$f" == *.test."$1" ]]; then ((with_test_tools)) || continue; fi
    printf '%s\n' "$f"
  done
}

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
while read -r f; do
  [ -n "$f" ] || continue
  while read -r p _; do [[ -z "$p" || "$p" == \#* ]] || apt_packages+=("$p"); done <"$f"
done < <(component_files apt)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# (the same package listed by two components is installed once)
if ((${#missing[@]})); then
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  log "apt packages: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  act "${sudo_cmd[@]}" apt-get update -qq
  act "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Java (Kafka broker) ------------------------------------------------------------------------
command -v java >/dev/null || { echo "bootstrap: java (OpenJDK 17+) is missing; install openjdk-17-jre-headless" >&2; exit 1; }
command -v mvn >/dev/null || { log "maven: installing"; act apt-get install -y -qq maven >/dev/null; }

# --- uv and the Python workspace ----------------------------------------------------------------
if ! command -v uv >/dev/null; then
  log "uv: installing from PyPI"
  if ((dry_run)); then
    log "dry-run: would run: python3 -m pip install --user uv"
    log "dry-run: uv is missing, so the steps after it cannot be listed"
    exit 0
  fi
  python3 -m pip install -q --user uv 2>/dev/null || python3 -m pip install -q uv
  export PATH="$HOME/.local/bin:$PATH"
fi
# The workspace includes a Rust extension (datasets/arrow-codec, built by maturin): cargo first.
command -v cargo >/dev/null || { echo "bootstrap: cargo is missing (install Rust with rustup)" >&2; exit 1; }
log "python: uv sync"
if ((dry_run)); then
  act uv sync --all-packages --frozen --quiet
else
  uv sync --all-packages --frozen --quiet 2>/dev/null || uv sync --all-packages --quiet
fi

# --- Generated code: protobuf bindings ----------------------------------------------------------
act make --no-print-directory -s proto

# --- Kafka broker jars (Maven Central), cached in .cache/kafka ----------------------------------
act uv run --quiet python -m cgloop.stack.kafka_install

# --- Rust workspace -----------------------------------------------------------------------------
log "rust: cargo build --workspace"
act cargo build --workspace --quiet --locked

# --- Test-only: buf (npm) for protobuf linting, cached in proto/node_modules --------------------
if ((with_test_tools)) && [ ! -x proto/node_modules/.bin/buf ]; then
  # `npm install` (not `npm ci`) honours the lock but tolerates optional platform packages
  # (buf's darwin/win32 builds) that a registry mirror may not serve; `npm ci` refuses then.
  log "buf: npm install (locked)"
  if ((dry_run)); then
    log "dry-run: would run: (cd proto && npm install --no-audit --no-fund)"
  else
    (cd proto && npm install --no-audit --no-fund --loglevel=error >/dev/null)
  fi
fi

# --- Component steps: scripts/bootstrap.d/<component>.sh (and with --with-test-tools
# <component>.test.sh), in name order, each idempotent --------------------------------------------
while read -r f; do
  [ -n "$f" ] || continue
  log "step: ${f#scripts/}"
  act bash "$f"
done < <(component_files sh)

if ((with_test_tools)); then log "ready (main job and tests)"; else log "ready (main job; \`make test\` adds the test tools)"; fi
