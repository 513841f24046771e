#!/usr/bin/env bash
# Throughput of the plugin's architectures against fairseq's transformer, the overheads of
# --log-grad-norms and --log-diagnostics, and the Fig. 3 analysis time, measured in one process; see --help.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/_env.sh"
exec "$PY" "$ROOT/scripts/tools/bench.py" "$@"
