#!/usr/bin/env bash
# The FP8 path's fused quantization (RMSNorm and SiLU-mul writing e4m3 rows, the GEMMs'
# rescales folded into the kernel after them) against the separate passes
# (SGL_DISABLE_FP8_FUSION=1), in one device call on one GPU: the FP8 kernel checks (the fused
# kernels against the unfused ones and the host); greedy runs fused and unfused (the same
# tokens and logits are expected: the fused kernels compute the same values); TTFT of a
# 1024-token prompt against the FP8 compute floor, batch-1 and batch-64 decode; offline
# throughput on prompts of exactly IN in / OUT out with the FP8 KV cache. Expects the binaries
# in .dev/gpu and writes to $OUT.
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
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|loaded|PASS|FAIL|checks"; }
# unfused: the same binary with the separate quantization and rescale passes
UNFUSED="env SGL_DISABLE_FP8_FUSION=1"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stage "FP8 kernel checks" 150 $D/kernel-check fp8 2>&1 | tee $OUT/kernel-check-fp8.txt \
  | grep -E "FAIL|checks|_quant_fp8"

[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }

python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
for form in fused unfused; do
  run=""; [ $form = unfused ] && run=$UNFUSED
  stage "greedy run, FP8 $form" 120 $run $B check-reference --model $W/ckpt \
    --prompts $W/cmp/prompts.json --out $W/cmp/$form --cuda-graph-max-bs 64 --quantization fp8 2>&1 | keep
done
echo "== fused against unfused (the same values expected: logits difference 0, no divergence)"
python3 scripts/gpu/tp_compare.py compare $W/cmp/unfused $W/cmp/fused | grep "^|" | tee $OUT/fused-vs-unfused.txt
if diff -rq $W/cmp/unfused $W/cmp/fused >/dev/null; then echo "outputs byte-identical" | tee -a $OUT/fused-vs-unfused.txt
else echo "outputs DIFFER" | tee -a $OUT/fused-vs-unfused.txt; fi

for b in 1 64; do
  for form in unfused fused; do
    run=""; [ $form = unfused ] && run=$UNFUSED
    stage "batch-$b decode (in 128, out 256) and TTFT of 1024 tokens, FP8 $form" 120 $run $B \
      bench-one-batch --model $W/ckpt --batch $b --input 128 --output 256 --gemv on \
      --ttft-input 1024 --quantization fp8 2>&1 | keep | tee $OUT/one-batch-b$b-$form.txt
  done
done

N=${NUM_PROMPTS:-300}; I=${IN:-1000}; O=${OUT_LEN:-1000}
for form in unfused fused; do
  run=""; [ $form = unfused ] && run=$UNFUSED
  stage "offline, $N prompts of $I in / $O out, FP8 weights and KV cache, $form" 150 $run $B \
    bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len $I \
    --random-output-len $O --random-range-ratio 1 --num-prompts $N --quantization fp8 \
    --kv-cache-dtype fp8_e4m3 2>&1 | keep | tee $OUT/offline-$form.txt
done
echo "== done in $(elapsed)s"
