#!/usr/bin/env bash
# The warm-up study (docs/warmup_study.md) in one command: the grid trains its why-* rows into OUT (runs
# already finished there are kept), then its report reads OUT and whatever else is given after "--"
# (e.g. the page of seeds run elsewhere) and writes the tables, figures and, with --publish, the page.
# Usage: why_study.sh OUT [GRID OPTIONS] [-- [PAGE ...] [REPORT OPTIONS]]
#   why_study.sh why-out --seeds 1,2,3 --jobs 2 --data multi30k_cpu=DIR -- --trains multi30k=0.8 --publish docs/results/why-warmup
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,6s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
  echo "GRID OPTIONS: scripts/grid.sh run --help; REPORT OPTIONS: $PY -m fairseq_lnpos.analysis.why --help"
  exit 0
fi
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "usage: why_study.sh OUT [GRID OPTIONS] [-- [PAGE ...] [REPORT OPTIONS]]: OUT, the folder of the runs, comes first" >&2
  exit 2
fi
out=$1; shift
grid=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do grid+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
"$PY" -m fairseq_lnpos.experiments.grid run --only 'why-*' "${grid[@]}" --out "$out"
exec "$PY" -m fairseq_lnpos.analysis.why "$out" "$@"
