#!/usr/bin/env bash
# analytics: create the model-signing key, then train the gaming-flow classifier once, so
# `cgloop analytics run` has a signed model. Idempotent: does nothing when a model file exists
# and verifies (hash, signature, format, features); an unsigned or foreign-signed one is retrained.
# Skips quietly when the real data folder (docs/sources.md) is not on this machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$HOME/.local/bin:$PATH"
model="${CGLOOP_STATE_DIR:-.state}/analytics/flow-classifier.skops"
uv run --quiet cgloop analytics model-key >/dev/null
if [ -f "$model" ] && uv run --quiet cgloop analytics model-info "$model" >/dev/null 2>&1; then
  exit 0
fi
if ! uv run --quiet python -c 'from cgloop.analytics.datasets import default_data_root as d; import sys; sys.exit(0 if (d() / "xbox-cloud-gaming").is_dir() else 1)'; then
  echo "analytics: real data not found, skipping model training (run \`cgloop train\` later)"
  exit 0
fi
uv run --quiet cgloop train --out "$model" >/dev/null
echo "analytics: trained $model"
