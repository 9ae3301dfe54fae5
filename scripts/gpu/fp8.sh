#!/usr/bin/env bash
# FP8 weights (--quantization fp8) in one device call on one GPU: the FP8 kernel checks
# (quantization bit for bit against the host, the FP8 GEMV in every form and the cuBLASLt FP8
# GEMM against f64 references of the same FP8 arithmetic); the greedy run quantized against
# bf16 (prefill logits' relative difference, where the greedy tokens part; batch 1, 8, 64 and
# a cached prefix); batch-1 and batch-8 decode and the TTFT of a 1024-token prompt, bf16 and
# FP8 on the same machine, each against its own weight roofline; offline throughput, bf16 and
# FP8, on prompts of exactly IN in / OUT out. Expects the binaries in .dev/gpu
# (scripts/gpu/README.md) and writes to $OUT.
#
# Knobs: NUM_PROMPTS (300), IN (1000), OUT_LEN (1000), SKIP_OFFLINE=1, BUDGET_S (540).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|loaded|PASS|FAIL|checks"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stage "FP8 kernel checks" 150 $D/kernel-check fp8 2>&1 | tee $OUT/kernel-check-fp8.txt | grep -E "FAIL|checks"
stage "FP8 GEMV speed on the 8B shapes" 90 $D/kernel-check bench-gemv-fp8 2>&1 | tee $OUT/bench-gemv-fp8.txt | grep -E "^\||FP8 layer"
# registers and spills of the FP8 GEMVs (ptxas on the cached PTX)
ptx=$(ls -t $W/kcache/*.ptx 2>/dev/null | head -1)
[ -n "$ptx" ] && ptxas -arch=sm_90 -v "$ptx" -o /dev/null 2>&1 | grep -A2 -E "Compiling entry function '(gemv_(rms_)?fp8|gemv_bf16)" \
  | grep -E "Compiling|registers|spill" | tee $OUT/ptxas-gemv.txt

if [ -f $W/ckpt/config.json ]; then echo "== checkpoint: reusing $W/ckpt"
else stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi

# The FP8 arithmetic alone: the engine's FP8 run against its bf16 run on a copy whose weights
# are the FP8 values (fake_quant.py), on a 2-layer checkpoint (little amplification of
# rounding) and on the 32-layer one.
[ -f $W/ckpt2/config.json ] || stage "2-layer checkpoint" 120 python3 scripts/gpu/make_ckpt.py $W/ckpt2 2
for c in ckpt2 ckpt; do
  [ -f $W/$c-fq/config.json ] || stage "fake-quantized $c" 240 python3 scripts/gpu/fake_quant.py $W/$c $W/$c-fq
  python3 scripts/gpu/tp_compare.py prompts $W/$c $W/fq-$c 32
  stage "greedy run, $c bf16" 120 $B check-reference --model $W/$c --prompts $W/fq-$c/prompts.json \
    --out $W/fq-$c/bf16 --cuda-graph-max-bs 64 2>&1 | keep
  stage "greedy run, $c FP8" 120 $B check-reference --model $W/$c --prompts $W/fq-$c/prompts.json \
    --out $W/fq-$c/fp8 --cuda-graph-max-bs 64 --quantization fp8 2>&1 | keep
  stage "greedy run, $c fake-quantized in bf16" 120 $B check-reference --model $W/$c-fq \
    --prompts $W/fq-$c/prompts.json --out $W/fq-$c/fq --cuda-graph-max-bs 64 2>&1 | keep
  echo "== $c: FP8 run against bf16 (weights quantized + FP8 arithmetic)"
  python3 scripts/gpu/tp_compare.py compare $W/fq-$c/bf16 $W/fq-$c/fp8 | grep "^|" | tee $OUT/fp8-vs-bf16-$c.txt
  echo "== $c: FP8 run against bf16 on the FP8 weights' values (FP8 arithmetic only)"
  python3 scripts/gpu/tp_compare.py compare $W/fq-$c/fq $W/fq-$c/fp8 | grep "^|" | tee $OUT/fp8-vs-fakequant-$c.txt
done

for b in 1 8; do
  for q in bf16 fp8; do
    flag=""; [ $q = fp8 ] && flag="--quantization fp8"
    stage "batch-$b decode (in 128, out 256) and TTFT of 1024 tokens, $q" 120 $B bench-one-batch \
      --model $W/ckpt --batch $b --input 128 --output 256 --gemv on --ttft-input 1024 $flag 2>&1 \
      | keep | tee $OUT/one-batch-b$b-$q.txt
  done
done

[ -n "$SKIP_OFFLINE" ] && { echo "== done in $(elapsed)s"; exit 0; }
N=${NUM_PROMPTS:-300}; I=${IN:-1000}; O=${OUT_LEN:-1000}
for q in bf16 fp8; do
  flag=""; [ $q = fp8 ] && flag="--quantization fp8"
  stage "offline, $N prompts of $I in / $O out, $q" 200 $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len $I --random-output-len $O --random-range-ratio 1 \
    --num-prompts $N $flag 2>&1 | keep | tee $OUT/offline-$q.txt
done
echo "== done in $(elapsed)s"
