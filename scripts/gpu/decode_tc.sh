#!/usr/bin/env bash
# Decode attention on tensor cores (decode_attn_tc, for batches of DECODE_TC_MIN_BATCH or more
# sequences that need no split) against the FP32 kernel (SGL_DISABLE_DECODE_TC=1), in one device
# call on one GPU: the kernel checks (every attention form against the host); greedy runs with
# and without it (batch 1 and 8 never take it, batch 64 does: equal tokens until a near-tie,
# logits within the bf16 spread); decode steps at batch 256 with 1000 cached tokens, bf16 and
# FP8 pools; offline throughput on NUM_PROMPTS prompts of exactly IN in / OUT_LEN out with FP8
# weights and the FP8 KV cache, both forms. Expects the binaries in .dev/gpu; writes to $OUT.
#
# Knobs: NUM_PROMPTS (1000), IN (1000), OUT_LEN (1000), BUDGET_S (560), SKIP_CHECKS,
# SKIP_OFFLINE.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|PASS|FAIL|checks"; }
FP32="env SGL_DISABLE_DECODE_TC=1"
FP8="--quantization fp8 --kv-cache-dtype fp8_e4m3"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -z "$SKIP_CHECKS" ]; then
  stage "kernel checks" 180 $D/kernel-check 2>&1 | tee $OUT/kernel-check.txt \
    | grep -E "FAIL|checks|tensor cores"
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }

python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
for kv in bf16 fp8; do
  q=""; [ $kv = fp8 ] && q="$FP8"
  for form in fp32 tc; do
    run=""; [ $form = fp32 ] && run=$FP32
    stage "greedy run, $kv pool, $form attention" 120 $run $B check-reference --model $W/ckpt \
      --prompts $W/cmp/prompts.json --out $W/cmp/$kv-$form --cuda-graph-max-bs 64 $q 2>&1 | keep
  done
  echo "== $kv pool: tensor cores against FP32 (batch 1 and 8 equal; batch 64 within the bf16 spread)"
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$kv-fp32 $W/cmp/$kv-tc | grep "^|" | tee $OUT/greedy-$kv.txt
done

for q in "" "$FP8"; do
  for form in fp32 tc; do
    run=""; [ $form = fp32 ] && run=$FP32
    stage "decode, batch 256, 1000 cached tokens, ${q:-bf16}, $form" 100 $run $B bench-one-batch \
      --model $W/ckpt --batch 256 --input 1000 --output 24 $q 2>&1 | grep -E "^\|" | tail -1 \
      | tee -a $OUT/decode-b256.txt
  done
done

N=${NUM_PROMPTS:-1000}; I=${IN:-1000}; O=${OUT_LEN:-1000}
[ -n "$SKIP_OFFLINE" ] || for form in tc fp32; do
  run=""; [ $form = fp32 ] && run=$FP32
  stage "offline, $N prompts of $I in / $O out, FP8 weights and KV cache, $form" 170 $run $B \
    bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len $I \
    --random-output-len $O --random-range-ratio 1 --num-prompts $N $FP8 2>&1 | keep \
    | tee $OUT/offline-$form.txt
done
echo "== done in $(elapsed)s"
