#!/usr/bin/env bash
# GPU checks that the CPU test suite cannot make: fp16/bf16 gradient norms, every arch with --fp16,
# a GPU grid, throughput, the Multi30k rows side by side, the depth map (scripts/tools/gpu_check.py).
# Usage: [MULTI30K_ORIG=DIR] [SEEDS=S,S] [RUNS_PER_GPU=K] [EVALUATORS=N] [EVAL_EVERY=E] scripts/gpu_check.sh OUT_DIR STEP [STEP ...]
# One step per call, each resuming what an earlier call left; what is not installed is named first, in one line.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$PY" "$ROOT/scripts/tools/gpu_check.py" "$@"
