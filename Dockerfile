# syntax=docker/dockerfile:1
# One image for every cgloop service: the `cgloop` command (Python, uv workspace) plus the Rust
# binaries of the Cargo workspace (probe, INT collector, node agent, ...). docker-compose.yml
# picks the subcommand per service (or a Rust program as the entrypoint: cgloop-node-agent):
#   docker run --rm cgloop:dev --help
#   docker run --rm cgloop:dev --check-config sink      (parse a service's command and settings)
#
# Stages: rust-build (cargo, BPF toolchain), then python-build (uv, protobuf bindings, and the
# Rust toolchain taken from rust-build for the cgloop.arrowcodec extension); the runtime stage
# takes only their outputs.

ARG RUST_VERSION=1.95
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG UV_VERSION=0.13.9

# ------------------------------------------------------------------------------ Rust ----------
FROM rust:${RUST_VERSION}-bookworm AS rust-build
# clang/llvm/libbpf/libelf: BPF programs (libbpf-cargo). protobuf-compiler: prost-build.
# cmake/libcurl/libssl/zlib/pkg-config: rdkafka's cmake build.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang llvm libbpf-dev libelf-dev zlib1g-dev pkg-config \
      protobuf-compiler libprotobuf-dev cmake libcurl4-openssl-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the Cargo workspace reads, so Python-only changes keep this stage cached.
COPY Cargo.toml Cargo.lock ./
COPY proto ./proto
COPY telemetry ./telemetry
COPY actuators ./actuators
COPY datasets/arrow-codec ./datasets/arrow-codec
# target/ lives in a cache mount, so the binaries are copied out within the same step.
# Every executable at the top of target/release is taken, whichever members exist today.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --workspace --locked \
 && mkdir -p /out/bin \
 && find target/release -maxdepth 1 -type f -perm -u+x ! -name '*.so' -exec cp {} /out/bin/ \;

# ---------------------------------------------------------------------------- Python ----------
FROM ${PYTHON_IMAGE} AS python-build
ARG UV_VERSION
# cgloop.arrowcodec (datasets/arrow-codec) is a Rust extension that uv builds with maturin:
# it needs the rust-build stage's toolchain, a C linker and protoc (cgloop-proto's build.rs).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc libc6-dev protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
COPY --from=rust-build /usr/local/rustup /usr/local/rustup
COPY --from=rust-build /usr/local/cargo /usr/local/cargo
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH
RUN pip install --no-cache-dir "uv==${UV_VERSION}"
ENV UV_PROJECT_ENVIRONMENT=/opt/cgloop/venv \
    UV_PYTHON=/usr/local/bin/python3 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
COPY . .
# 1. the dev group only (grpcio-tools), 2. the protobuf bindings (as `make proto` does),
# 3. the runtime environment: all members, no dev tools (sync is exact, so step 1's extras
#    go), installed as wheels rather than editable, so the venv stands alone.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --only-group dev \
 && rm -rf proto/python/src/cgloop/v1 \
 && uv run --no-sync python -m grpc_tools.protoc -I proto \
      --python_out=proto/python/src --pyi_out=proto/python/src --grpc_python_out=proto/python/src \
      proto/cgloop/v1/*.proto \
 && uv sync --frozen --all-packages --no-dev --no-editable \
 && /opt/cgloop/venv/bin/cgloop --version

# --------------------------------------------------------------------------- runtime ----------
FROM ${PYTHON_IMAGE} AS runtime
# Shared libraries of the Rust binaries; iproute2 for the node agent's qdiscs.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates libelf1 libbpf1 zlib1g libssl3 libcurl4 iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=python-build /opt/cgloop/venv /opt/cgloop/venv
COPY --from=rust-build /out/bin/ /usr/local/bin/
ENV PATH=/opt/cgloop/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    CGLOOP_STATE_DIR=/var/lib/cgloop \
    CGLOOP_CACHE_DIR=/var/cache/cgloop
RUN mkdir -p /var/lib/cgloop /var/cache/cgloop
WORKDIR /var/lib/cgloop
# Root on purpose: the probe and node agent load BPF programs and change qdiscs; compose
# grants the capabilities per service.
ENTRYPOINT ["cgloop"]
CMD ["--help"]
