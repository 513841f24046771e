#!/usr/bin/env bash
# Throughput of the plugin's architectures against fairseq's transformer, gradient-logging
# overhead and the Fig. 3 analysis time, measured in one process; see --help.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"
else PY=python3; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fairseq_lnpos.bench "$@"
