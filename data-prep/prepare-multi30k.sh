#!/usr/bin/env bash
# Prepare Multi30k task 1 De-En (see fairseq_lnpos/data/multi30k.py; --help for options)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.data.multi30k "$@"
