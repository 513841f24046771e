#!/usr/bin/env bash
# Generate the synthetic De-En corpus (see fairseq_lnpos/data/synthetic.py; --help for options)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.data.synthetic "$@"
