#!/usr/bin/env bash
# One device call: kernel checks, random 8B checkpoint, transformers reference, engine check,
# benchmarks. Expects the binaries in .dev/gpu (see scripts/gpu/README.md). Writes to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
STAGE=${1:-all}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u
echo "== kernel checks"; $D/kernel-check || echo "KERNEL CHECK FAILED"
echo "== checkpoint"
if [ -f $W/ckpt/config.json ]; then echo "reusing $W/ckpt"; else python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1; fi
echo "== transformers reference"; python3 scripts/gpu/hf_ref.py $W/ckpt $W 64 || exit 1
echo "== engine check"
SGL_CUDA_BENCH="check --model $W/ckpt --prompts $W/prompts.json --out $W --cuda-graph-max-bs 64" \
  $D/engine-tests --ignored --exact backend::cuda::bench::tests::cuda_bench --nocapture 2>&1 | grep -v "^test \|running\|^$"
python3 scripts/gpu/compare.py $W || echo "E2E CHECK FAILED"
echo "== bench one-batch (batch 1, in 128, out 256)"
SGL_CUDA_BENCH="one-batch --model $W/ckpt --batch 1 --input 128 --output 256" $D/engine-tests --ignored --exact backend::cuda::bench::tests::cuda_bench --nocapture 2>&1 | grep "^|\|^{\|panicked\|Error"
echo "== bench one-batch (batch 1, in 1024, out 16): TTFT"
SGL_CUDA_BENCH="one-batch --model $W/ckpt --batch 1 --input 1024 --output 16" $D/engine-tests --ignored --exact backend::cuda::bench::tests::cuda_bench --nocapture 2>&1 | grep "^|\|^{\|panicked\|Error"
echo "== bench one-batch (batch 64, in 512, out 128)"
SGL_CUDA_BENCH="one-batch --model $W/ckpt --batch 64 --input 512 --output 128" $D/engine-tests --ignored --exact backend::cuda::bench::tests::cuda_bench --nocapture 2>&1 | grep "^|\|^{\|panicked\|Error"
if [ -z "$SKIP_HF_PEER" ]; then
echo "== transformers peer"
python3 scripts/gpu/hf_bench.py $W/ckpt 1 128 64
python3 scripts/gpu/hf_bench.py $W/ckpt 128 512 128
fi
echo "== offline throughput (random in/out up to 1024/1024)"
SGL_CUDA_BENCH="offline --model $W/ckpt --num-prompts ${NUM_PROMPTS:-1000} --max-input 1024 --max-output 1024" \
  timeout ${OFFLINE_TIMEOUT:-200} $D/engine-tests --ignored --exact backend::cuda::bench::tests::cuda_bench --nocapture 2>&1 | grep "^|\|^{\|panicked\|Error"
date -u
