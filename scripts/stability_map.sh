#!/usr/bin/env bash
# Stability map of a sweep: OUT/stability.{csv,md}, heatmaps and LR sensitivity. Usage: stability_map.sh OUT
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.analysis.stability "$@"
