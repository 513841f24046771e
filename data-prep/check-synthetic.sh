#!/usr/bin/env bash
# Train a tiny Transformer on the synthetic corpus and report valid loss, BLEU and timings (see fairseq_lnpos/data/synthetic_check.py)
set -e
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fairseq_lnpos.data.synthetic_check "$@"
