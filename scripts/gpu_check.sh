#!/usr/bin/env bash
# GPU checks that the CPU test suite cannot make (fairseq's fp16/bf16 need CUDA):
#  1. per-layer gradient norms of the first update agree between fp32, --fp16 and --bf16
#     (the loss scale is removed), for Post-LN and Keel;
#  2. every plugin arch trains for a few hundred updates with --fp16 and RAdam;
#  3. a two-run tiny grid on GPU 0 with --fp16, scored and tabled;
#  4. throughput ratios against fairseq's transformer on the GPU (fp32 and fp16);
#  5. with MULTI30K_ORIG=DIR (the six .gz files of Multi30k task 1): the multi30k-* rows the paper
#     compares (Post-LN without warm-up and with 500 updates at 5e-4, Pre-LN, RAdam, DeepNorm, Keel,
#     Admin; 7 runs, 12 epochs, --fp16) side by side on GPU 0 (--runs-per-gpu $RUNS_PER_GPU, default 7;
#     --evaluators $EVALUATORS, default 1): wall time (target <= 8 minutes on an H200) and the table;
#  6. with MULTI30K_ORIG=DIR, after step 5 in the same OUT_DIR: the Pre-LN row of step 5 alone on
#     GPU 0 (12 epochs), and the aggregate words/s of step 5 against it (target >= 2.5);
#  7. with MULTI30K_ORIG=DIR: the depth map's GPU preset (`grid.sh sweep --depth-map --real`: six
#     archs x depths 6, 18, 36, 60, 100 x lr 5e-4, 1e-3, 600 updates, fp16; 60 runs, $RUNS_PER_GPU
#     side by side) and its map: wall time, largest trainable depth, gradient ratios, CUDA peaks.
#     Estimated 1.5-3.5 hours on an H200 (docs/grid.md), not measured: run it alone, resumable.
# Usage: [MULTI30K_ORIG=DIR] [RUNS_PER_GPU=K] [EVALUATORS=N] scripts/gpu_check.sh OUT_DIR [STEP ...]
#   (default: steps 1 to 6; needs torch with CUDA and fairseq installed). Steps 5 and 6 take about
#   8 and 2-3 minutes on an H200; run them as `gpu_check.sh OUT 5` then `gpu_check.sh OUT 6`, and
#   step 7 (hours) as `gpu_check.sh OUT 7`.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"  # $ROOT, $PY (the interpreter grid.sh below uses too), PYTHONPATH
OUT="${1:?usage: gpu_check.sh OUT_DIR [STEP ...]}"
shift
STEPS=" ${*:-1 2 3 4 5 6} "
for s in $STEPS; do
  case "$s" in [1-7]) ;; *) echo "gpu_check.sh: error: unknown step '$s'; the steps are 1 to 7" >&2; exit 2;; esac
done
step() { [[ "$STEPS" == *" $1 "* ]]; }
mkdir -p "$OUT"
FS=("$(dirname "$(command -v "$PY")")/fairseq-train")
[ -x "${FS[0]}" ] || FS=(fairseq-train)  # fairseq installed elsewhere (pip --target): from PATH
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no GPU"; print(torch.__version__, torch.cuda.get_device_name(0))'

if step 1 || step 2 || step 3 || step 4; then
  echo "== synthetic corpus"
  "$PY" -m fairseq_lnpos.data.synthetic --out "$OUT/syn.text" --bin "$OUT/syn" --train 8000 --workers 4 | tail -3
fi

if step 1; then
echo "== 1. gradient norms of update 1: fp32 vs --fp16 vs --bf16"
for arch in transformer_postln_tiny transformer_keel_tiny; do
  for prec in fp32 fp16 bf16; do
    flag=(); [ "$prec" != fp32 ] && flag=("--$prec")
    "${FS[@]}" "$OUT/syn" --user-dir "$ROOT/fairseq_lnpos" --task translation_lnpos --log-grad-norms \
      --grad-norm-interval 1 --arch "$arch" --dropout 0 --optimizer adam --lr 1e-4 --max-tokens 4096 \
      --max-update 1 --save-dir "$OUT/gn-$arch-$prec" --no-save --seed 1 --fp16-init-scale 1024 "${flag[@]}" \
      > "$OUT/gn-$arch-$prec.log" 2>&1
  done
  "$PY" - "$OUT" "$arch" <<'PYEOF'
import json, sys
out, arch = sys.argv[1:]
import os
norms = {}
for p in ("fp32", "fp16", "bf16"):
    path = f"{out}/gn-{arch}-{p}/grad_norms.jsonl"
    if os.path.exists(path):
        norms[p] = json.loads(open(path).readline())["norms"]
    else:
        print(f"{arch} {p}: no record (update 1 skipped, e.g. fp16 overflow): " + open(f"{out}/gn-{arch}-{p}.log").read()[-300:])
for p, tol in (("fp16", 0.02), ("bf16", 0.08)):
    if p not in norms or "fp32" not in norms:
        continue
    rel = {k: abs(norms[p][k] - v) / v for k, v in norms["fp32"].items() if v}
    worst = max(rel, key=rel.get)
    print(f"{arch} {p}: {len(rel)} groups, total {norms[p]['total']:.4f} vs fp32 {norms['fp32']['total']:.4f}, "
          f"max rel diff {rel[worst]:.4f} ({worst}) -> {'OK' if rel[worst] < tol else 'MISMATCH'}")
PYEOF
done || true
fi

if step 2; then
echo "== 2. every arch, 300 updates, --fp16, RAdam, no warm-up"
for v in $("$PY" -c 'from fairseq_lnpos.variants import VARIANTS; print(" ".join(VARIANTS))'); do
  "${FS[@]}" "$OUT/syn" --user-dir "$ROOT/fairseq_lnpos" --arch "transformer_${v}_tiny" --fp16 \
    --optimizer radam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler warmup_inverse_sqrt --warmup-updates 1 \
    --decay-anchor 4000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
    --max-update 300 --save-dir "$OUT/train-$v" --no-save --log-format json --log-interval 50 > "$OUT/train-$v.log" 2>&1
  grep -o '"train_loss": "[0-9.]*"\|"valid_loss": "[0-9.]*"' "$OUT/train-$v.log" | tr '\n' ' ' | sed "s/^/$v: /"; echo
done
fi

if step 3; then
echo "== 3. tiny grid on GPU 0 with --fp16"
"$ROOT/scripts/grid.sh" run --only iwslt-postln-adam-lr5e-4-wu4000,iwslt-preln-adam-lr5e-4-step8 --arch-size tiny \
  --data "$OUT/syn" --out "$OUT/grid" --gpus 0 --fp16 --max-epoch 2 --set max_tokens=4096 --set batch_tokens=4096 | tail -4
"$ROOT/scripts/make_table.sh" "$OUT/grid" | head -12
fi

if step 4; then
echo "== 4. throughput ratios on the GPU"
"$PY" -m fairseq_lnpos.bench --device cuda --data "$OUT/syn" --sizes tiny,iwslt_de_en --steps 20 --reps 5 \
  --max-tokens 4096 --no-analysis --out "$OUT/bench-gpu-fp32.json" | tail -12
"$PY" -m fairseq_lnpos.bench --device cuda --data "$OUT/syn" --sizes iwslt_de_en --steps 20 --reps 5 \
  --max-tokens 4096 --no-analysis --fairseq-args=--fp16 --out "$OUT/bench-gpu-fp16.json" | tail -8
fi

step 5 || step 6 || step 7 || exit 0
[ -n "${MULTI30K_ORIG:-}" ] || { echo "== 5, 6, 7: skipped: set MULTI30K_ORIG=DIR to run the Multi30k grid"; exit 0; }
"$ROOT/data-prep/prepare-multi30k.sh" --orig "$MULTI30K_ORIG" --out "$OUT/m30k.text" --bin "$OUT/m30k" --workers 8 2>&1 | tail -2
ROWS=multi30k-postln-adam-lr5e-4-nowu,multi30k-postln-adam-lr5e-4-wu500,multi30k-preln-adam-lr5e-4-nowu,multi30k-postln-radam-lr5e-4-linear,multi30k-deepnorm-adam-lr5e-4-nowu,multi30k-keel-adam-lr5e-4-nowu,multi30k-admin-adam-lr5e-4-nowu
K="${RUNS_PER_GPU:-7}"
# timed DIR CMD...: run a grid command; write its wall time to DIR.seconds only when DIR did not exist
# before (a grid resumed after an interruption is not timed)
timed() {
  local dir="$1" fresh=1 t0; shift
  [ -e "$dir" ] && { fresh=0; echo "$dir exists: resuming it, not timing it"; rm -f "$dir.seconds"; }
  t0=$(date +%s)
  "$@" | tail -3
  [ "$fresh" = 0 ] || echo $(($(date +%s) - t0)) > "$dir.seconds"
}
if step 5; then
  echo "== 5. Multi30k grid on one GPU: $(echo "$ROWS" | tr ',' '\n' | wc -l) runs, $K side by side"
  timed "$OUT/m30k-grid" "$ROOT/scripts/grid.sh" run --only "$ROWS" --data "$OUT/m30k" --out "$OUT/m30k-grid" \
    --gpus 0 --runs-per-gpu "$K" --evaluators "${EVALUATORS:-1}" --fp16
  [ -s "$OUT/m30k-grid.seconds" ] && echo "wall time $(cat "$OUT/m30k-grid.seconds") s with --runs-per-gpu $K," \
    "--evaluators ${EVALUATORS:-1} (target <= 480 s on an H200)"
  "$ROOT/scripts/make_table.sh" "$OUT/m30k-grid" --no-figures | head -12
fi
if step 6; then
  echo "== 6. one of those runs alone on the GPU, and the aggregate words/s of step 5 against it"
  [ -s "$OUT/m30k-grid.seconds" ] || { echo "gpu_check.sh: error: no timed step 5 in $OUT; run step 5 in a new OUT_DIR first" >&2; exit 2; }
  timed "$OUT/m30k-alone" "$ROOT/scripts/grid.sh" run --only multi30k-preln-adam-lr5e-4-nowu --data "$OUT/m30k" \
    --out "$OUT/m30k-alone" --gpus 0 --fp16
  [ -s "$OUT/m30k-alone.seconds" ] || { echo "gpu_check.sh: error: $OUT/m30k-alone was resumed, not timed; remove it and run step 6 again" >&2; exit 2; }
  "$PY" -m fairseq_lnpos.experiments.throughput "$OUT/m30k-grid" "$(cat "$OUT/m30k-grid.seconds")" \
    --alone "$OUT/m30k-alone" "$(cat "$OUT/m30k-alone.seconds")"
fi
if step 7; then
  echo "== 7. the depth map on one GPU (grid.sh sweep --depth-map --real), ${RUNS_PER_GPU:-7} runs side by side"
  timed "$OUT/depth-real" "$ROOT/scripts/grid.sh" sweep --depth-map --real --data "$OUT/m30k" --out "$OUT/depth-real" \
    --gpus 0 --runs-per-gpu "$K"
  [ -s "$OUT/depth-real.seconds" ] && echo "wall time $(cat "$OUT/depth-real.seconds") s (estimate: 1.5-3.5 hours)"
  "$ROOT/scripts/stability_map.sh" "$OUT/depth-real" | sed -n '/^## Largest trainable depth/,$p'
fi
