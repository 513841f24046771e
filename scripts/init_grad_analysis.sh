#!/usr/bin/env bash
# Fig. 3 of Xiong et al. (2020) at initialization and the Lemma 2 norms; see --help.
# Thin wrapper over fairseq_lnpos.analysis.init_grad.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"
else PY=python3; fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m fairseq_lnpos.analysis.init_grad "$@"
