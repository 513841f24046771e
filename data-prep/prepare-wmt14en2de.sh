#!/usr/bin/env bash
# Prepare WMT14 En-De (see fairseq_lnpos/data/wmt.py; --help for options)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.data.wmt "$@"
