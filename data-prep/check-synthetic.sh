#!/usr/bin/env bash
# Train a tiny Transformer on the synthetic corpus and report valid loss, BLEU and timings (see fairseq_lnpos/data/synthetic_check.py)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.data.synthetic_check "$@"
