#!/usr/bin/env bash
# Fig. 3 of Xiong et al. (2020) at initialization and the Lemma 2 norms; see --help.
# Thin wrapper over fairseq_lnpos.analysis.init_grad.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" -m fairseq_lnpos.analysis.init_grad "$@"
