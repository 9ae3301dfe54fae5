#!/usr/bin/env bash
# The decode GEMV's plans and L2 prefetch depth, in one device call on one GPU:
#   1. `kernel-check bench-gemv-fp8`: the FP8 GEMV on the 8B shapes, then every plan (16/32 rows
#      per block, 1-4 blocks along k) x weight steps prefetched into L2 (0/1/2/4) on the FP8
#      shapes and on the bf16 shapes of a tensor-parallel rank (tp 2);
#   2. batch-1 decode (in 128 / out 256), FP8 and bf16, at several prefetch settings
#      (SGL_GEMV_PREFETCH), this build and BASE (a directory with an earlier sgl-bench);
#   3. the FP8 batch-1 decode step kernel by kernel under Nsight Compute (decode_profile.sh).
# Expects the binaries in .dev/gpu; writes to $OUT. Knobs: BASE, PFS ("1 0 2 4"), BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stage "GEMV plans and prefetch" 150 $D/kernel-check bench-gemv-fp8 2>&1 \
  | grep -E "^\||GB/s|copy|floor" | tee $OUT/bench-gemv-sweep.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }
one() {  # label, binary, prefetch, quantization flags
  stage "batch-1 decode $1" 80 env SGL_GEMV_PREFETCH=$3 $2 bench-one-batch --model $W/ckpt \
    --batch 1 --input 128 --output 256 $4 2>&1 | grep -E "^\| (NVIDIA|[0-9])" \
    | sed "s#^#| $1 #" | tee -a $OUT/batch1.txt
}
for q in "--quantization fp8" ""; do
  [ -n "$BASE" ] && one "base ${q:-bf16} pf1" $BASE/sgl-bench 1 "$q"
  for pf in ${PFS:-1 0 2 4}; do
    [ -z "$q" ] && [ $pf = 0 -o $pf = 4 ] && continue
    one "new ${q:-bf16} pf$pf" $B $pf "$q"
  done
  [ -n "$BASE" ] && one "base ${q:-bf16} pf1 again" $BASE/sgl-bench 1 "$q"
done
BATCH=1 INPUT=128 STEPS=4 QUANT="--quantization fp8" BUDGET_S=$((BUDGET_S - $(elapsed))) \
  bash scripts/gpu/decode_profile.sh
echo "== done in $(elapsed)s"
