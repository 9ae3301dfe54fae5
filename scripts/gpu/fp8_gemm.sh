#!/usr/bin/env bash
# cuBLASLt's FP8 GEMMs in one device call on one GPU: every algorithm the heuristic offers for
# the 8B layer's shapes (kernel-check bench-gemm-fp8), with and without fast accumulation;
# then the engine with fast accumulation (SGL_FP8_FAST_ACCUM=1) against without: TTFT of a
# 1024-token prompt against the FP8 floor, batch-1 and batch-64 decode, the greedy run's
# logits, offline throughput (FP8 weights and KV cache). Expects the binaries in .dev/gpu and
# writes to $OUT.
#
# Knobs: NUM_PROMPTS (300), IN (1000), OUT_LEN (1000), BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|PASS|FAIL|checks"; }
FAST="env SGL_FP8_FAST_ACCUM=1"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stage "FP8 kernel checks" 150 $D/kernel-check fp8 2>&1 | tee $OUT/kernel-check-fp8.txt \
  | grep -E "FAIL|checks|_quant_fp8"
stage "FP8 GEMM algorithms" 150 $D/kernel-check bench-gemm-fp8 2>&1 | tee $OUT/bench-gemm-fp8.txt | grep "^|"

[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }
python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
for acc in promoted fast; do
  run=""; [ $acc = fast ] && run=$FAST
  stage "greedy run, FP8, $acc accumulation" 120 $run $B check-reference --model $W/ckpt \
    --prompts $W/cmp/prompts.json --out $W/cmp/$acc --cuda-graph-max-bs 64 --quantization fp8 2>&1 | keep
done
echo "== fast accumulation against f32 promotion"
python3 scripts/gpu/tp_compare.py compare $W/cmp/promoted $W/cmp/fast | grep "^|" | tee $OUT/fast-vs-promoted.txt
for b in 1 64; do
  for acc in promoted fast; do
    run=""; [ $acc = fast ] && run=$FAST
    stage "batch-$b decode and TTFT of 1024 tokens, FP8, $acc accumulation" 120 $run $B \
      bench-one-batch --model $W/ckpt --batch $b --input 128 --output 256 --gemv on \
      --ttft-input 1024 --quantization fp8 2>&1 | keep | tee $OUT/one-batch-b$b-$acc.txt
  done
done
N=${NUM_PROMPTS:-300}; I=${IN:-1000}; O=${OUT_LEN:-1000}
for acc in promoted fast; do
  run=""; [ $acc = fast ] && run=$FAST
  stage "offline, $N prompts of $I in / $O out, FP8 weights and KV cache, $acc accumulation" 150 \
    $run $B bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len $I \
    --random-output-len $O --random-range-ratio 1 --num-prompts $N --quantization fp8 \
    --kv-cache-dtype fp8_e4m3 2>&1 | keep | tee $OUT/offline-$acc.txt
done
echo "== done in $(elapsed)s"
