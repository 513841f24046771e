#!/usr/bin/env bash
# Results of a grid: Markdown table, OUT_DIR/results.csv and figures. Usage: make_table.sh OUT_DIR [--no-figures] [--skip-unreadable] [--allow-mixed-code]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.experiments.report "$@"
