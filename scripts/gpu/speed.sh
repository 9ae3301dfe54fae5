#!/usr/bin/env bash
# This build against an earlier one (BASE: a directory with its sgl-bench, optional) on one GPU,
# in one device call, stage by stage (STAGES, a space-separated subset of the default):
#   checks   every kernel check (kernel-check)
#   kernels  kernel timings: prefill attention old/new (bench-prefill-attn), the FP8 row kernels
#            (bench-fp8-rows)
#   ttft     TTFT of a 1024-token prompt and batch-1 decode (in 128 / out 256), FP8 and bf16,
#            this build and BASE
#   greedy   greedy runs (batch 1, 8, 64, cached prefix) with the FP8 path's fused kernels and
#            with separate passes (SGL_DISABLE_FP8_FUSION=1): the same bytes expected
#   decode   decode steps at batch 256 with 1000 cached tokens, FP8 weights and KV cache, with the
#            tensor-core decode attention and without (SGL_DISABLE_DECODE_TC=1)
#   offline  offline throughput, NUM_PROMPTS prompts of exactly 1000 in / 1000 out, FP8 weights
#            and KV cache
# Expects the binaries in .dev/gpu; writes to $OUT. Knobs: STAGES, BASE, NUM_PROMPTS (1000),
# BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|PASS|FAIL|checks"; }
STAGES=${STAGES:-checks kernels ttft greedy decode offline}
on() { [[ " $STAGES " == *" $1 "* ]]; }
FP8="--quantization fp8 --kv-cache-dtype fp8_e4m3"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if on checks; then
  stage "kernel checks" 240 $D/kernel-check > $OUT/kernel-check.txt 2>&1
  grep -E "FAIL|checks" $OUT/kernel-check.txt
fi
if on kernels; then
  stage "prefill attention timings" 90 $D/kernel-check bench-prefill-attn 2>&1 \
    | grep -E "^\||GB/s|copy" | tee $OUT/bench-prefill-attn.txt
  stage "FP8 row kernel timings" 90 $D/kernel-check bench-fp8-rows 2>&1 \
    | grep -E "^\||GB/s|copy" | tee $OUT/bench-fp8-rows.txt
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }
if on ttft; then
  for bin in $B ${BASE:+$BASE/sgl-bench}; do
    for q in "--quantization fp8" ""; do
      # rows: the batch-1 decode's (device, ..., tok/s, ms/step, of roofline) and the TTFT's
      stage "TTFT 1024 and batch-1 decode, ${q:-bf16}, $bin" 100 $bin bench-one-batch \
        --model $W/ckpt --batch 1 --input 128 --output 256 --ttft-input 1024 $q 2>&1 \
        | grep -E "^\| (NVIDIA|[0-9])" | sed "s#^#| $bin ${q:-bf16} #" | tee -a $OUT/ttft.txt
    done
  done
fi
if on greedy; then
  python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
  for form in fused unfused; do
    run=""; [ $form = unfused ] && run="env SGL_DISABLE_FP8_FUSION=1"
    stage "greedy run, FP8 $form" 120 $run $B check-reference --model $W/ckpt \
      --prompts $W/cmp/prompts.json --out $W/cmp/$form --cuda-graph-max-bs 64 \
      --quantization fp8 2>&1 | keep
  done
  python3 scripts/gpu/tp_compare.py compare $W/cmp/unfused $W/cmp/fused | grep "^|" \
    | tee $OUT/fused-vs-unfused.txt
  if diff -rq $W/cmp/unfused $W/cmp/fused >/dev/null; then r="outputs byte-identical"
  else r="outputs DIFFER"; fi
  echo "$r" | tee -a $OUT/fused-vs-unfused.txt
fi
if on decode; then
  for form in tc fp32; do
    run=""; [ $form = fp32 ] && run="env SGL_DISABLE_DECODE_TC=1"
    stage "decode, batch 256, 1000 cached tokens, FP8 weights and KV, $form" 100 $run $B \
      bench-one-batch --model $W/ckpt --batch 256 --input 1000 --output 24 $FP8 2>&1 \
      | grep -E "^\|" | tail -1 | sed "s/^/| $form /" | tee -a $OUT/decode-b256.txt
  done
fi
if on offline; then
  N=${NUM_PROMPTS:-1000}
  stage "offline, $N prompts of 1000 in / 1000 out, FP8 weights and KV cache" 170 $B \
    bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len 1000 \
    --random-output-len 1000 --random-range-ratio 1 --num-prompts $N $FP8 2>&1 | keep \
    | tee $OUT/offline.txt
fi
echo "== done in $(elapsed)s"
