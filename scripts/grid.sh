#!/usr/bin/env bash
# The paper's experiment grid: `grid.sh list`, `grid.sh run [--dry-run] [--only NAME,...] ...`
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fairseq_lnpos.experiments.grid "$@"
