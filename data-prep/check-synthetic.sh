#!/usr/bin/env bash
# Train a tiny Transformer on the synthetic corpus and report valid loss, BLEU and timings (see scripts/tools/synthetic_check.py)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" "$ROOT/scripts/tools/synthetic_check.py" "$@"
