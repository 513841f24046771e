#!/usr/bin/env bash
# Prepare IWSLT14 De-En (see fairseq_lnpos/data/iwslt.py; --help for options)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.data.iwslt "$@"
