#!/usr/bin/env bash
# The paper's experiment grid: `grid.sh list`, `grid.sh run [--dry-run] [--only NAME,...] ...`
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.experiments.grid "$@"
