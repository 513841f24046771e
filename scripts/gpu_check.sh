#!/usr/bin/env bash
# GPU checks that the CPU test suite cannot make (fairseq's fp16/bf16 need CUDA):
#  1. per-layer gradient norms of the first update agree between fp32, --fp16 and --bf16
#     (the loss scale is removed), for Post-LN and Keel;
#  2. every plugin arch trains for a few hundred updates with --fp16 and RAdam;
#  3. a two-run tiny grid on GPU 0 with --fp16, scored and tabled;
#  4. throughput ratios against fairseq's transformer on the GPU (fp32 and fp16);
#  5. with MULTI30K_ORIG=DIR (the six .gz files of Multi30k task 1): the multi30k-* rows the paper
#     compares (Post-LN without warm-up and with 500 updates at 5e-4, Pre-LN, RAdam, DeepNorm, Keel,
#     Admin; 7 runs, 12 epochs, --fp16) side by side on GPU 0 (--runs-per-gpu 7): wall time, and the
#     aggregate training words/s against one of those runs alone.
# Usage: [MULTI30K_ORIG=DIR] scripts/gpu_check.sh OUT_DIR   (needs torch with CUDA and fairseq installed)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/_env.sh"  # $ROOT, $PY (the interpreter grid.sh below uses too), PYTHONPATH
OUT="${1:?usage: gpu_check.sh OUT_DIR}"
mkdir -p "$OUT"
FS=("$(dirname "$(command -v "$PY")")/fairseq-train")
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no GPU"; print(torch.__version__, torch.cuda.get_device_name(0))'

echo "== synthetic corpus"
"$PY" -m fairseq_lnpos.data.synthetic --out "$OUT/syn.text" --bin "$OUT/syn" --train 8000 --workers 4 | tail -3

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

echo "== 2. every arch, 300 updates, --fp16, RAdam, no warm-up"
for v in $("$PY" -c 'from fairseq_lnpos.variants import VARIANTS; print(" ".join(VARIANTS))'); do
  "${FS[@]}" "$OUT/syn" --user-dir "$ROOT/fairseq_lnpos" --arch "transformer_${v}_tiny" --fp16 \
    --optimizer radam --adam-betas '(0.9, 0.98)' --lr 5e-4 --lr-scheduler warmup_inverse_sqrt --warmup-updates 1 \
    --decay-anchor 4000 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 \
    --max-update 300 --save-dir "$OUT/train-$v" --no-save --log-format json --log-interval 50 > "$OUT/train-$v.log" 2>&1
  grep -o '"train_loss": "[0-9.]*"\|"valid_loss": "[0-9.]*"' "$OUT/train-$v.log" | tr '\n' ' ' | sed "s/^/$v: /"; echo
done

echo "== 3. tiny grid on GPU 0 with --fp16"
"$ROOT/scripts/grid.sh" run --only iwslt-postln-adam-lr5e-4-wu4000,iwslt-preln-adam-lr5e-4-step8 --arch-size tiny \
  --data "$OUT/syn" --out "$OUT/grid" --gpus 0 --fp16 --max-epoch 2 --set max_tokens=4096 --set batch_tokens=4096 | tail -4
"$ROOT/scripts/make_table.sh" "$OUT/grid" | head -12

echo "== 4. throughput ratios on the GPU"
"$PY" -m fairseq_lnpos.bench --device cuda --data "$OUT/syn" --sizes tiny,iwslt_de_en --steps 20 --reps 5 \
  --max-tokens 4096 --no-analysis --out "$OUT/bench-gpu-fp32.json" | tail -12
"$PY" -m fairseq_lnpos.bench --device cuda --data "$OUT/syn" --sizes iwslt_de_en --steps 20 --reps 5 \
  --max-tokens 4096 --no-analysis --fairseq-args=--fp16 --out "$OUT/bench-gpu-fp16.json" | tail -8

[ -n "${MULTI30K_ORIG:-}" ] || { echo "== 5. skipped: set MULTI30K_ORIG=DIR to run the Multi30k grid"; exit 0; }
echo "== 5. Multi30k grid on one GPU: 7 runs side by side, then one run alone"
"$ROOT/data-prep/prepare-multi30k.sh" --orig "$MULTI30K_ORIG" --out "$OUT/m30k.text" --bin "$OUT/m30k" --workers 8 | tail -2
ROWS=multi30k-postln-adam-lr5e-4-nowu,multi30k-postln-adam-lr5e-4-wu500,multi30k-preln-adam-lr5e-4-nowu,multi30k-postln-radam-lr5e-4-linear,multi30k-deepnorm-adam-lr5e-4-nowu,multi30k-keel-adam-lr5e-4-nowu,multi30k-admin-adam-lr5e-4-nowu
t0=$(date +%s)
"$ROOT/scripts/grid.sh" run --only "$ROWS" --data "$OUT/m30k" --out "$OUT/m30k-grid" --gpus 0 --runs-per-gpu 7 --fp16 | tail -3
t1=$(date +%s)
"$ROOT/scripts/grid.sh" run --only multi30k-preln-adam-lr5e-4-nowu --max-epoch 2 --data "$OUT/m30k" --out "$OUT/m30k-alone" --gpus 0 --fp16 | tail -1
t2=$(date +%s)
"$ROOT/scripts/make_table.sh" "$OUT/m30k-grid" --no-figures | head -12
"$PY" - "$OUT" $((t1 - t0)) $((t2 - t1)) <<'PYEOF'
import json, glob, sys
out, grid_s, alone_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def words(folder):  # target words trained, from fairseq's per-epoch train records
    total = 0.0
    for log in glob.glob(f"{folder}/*/seed*/train.log"):
        for line in open(log, errors="replace"):
            if " | train | " in line:
                rec = json.loads(line.split(" | ", 3)[3])
                total += float(rec["train_wps"]) * float(rec["train_wall"])
    return total
g, a = words(f"{out}/m30k-grid") / grid_s, words(f"{out}/m30k-alone") / alone_s
print(f"Multi30k grid, 7 runs x 12 epochs on one GPU: {grid_s} s wall (target <= 480 s); "
      f"aggregate {g:.0f} words/s vs one run alone {a:.0f} words/s: ratio {g / a:.2f} (target >= 2.5)")
PYEOF
