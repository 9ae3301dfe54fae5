#!/usr/bin/env bash
# The all-reduce of o_proj's and down_proj's product fused with the residual add and the next
# RMSNorm (`allreduce_add_rmsnorm`) at tp 2, in one device call on 2 GPUs: the kernel checked
# against the one-shot kernel followed by the norm, bit for bit, and both timed
# (`bench-all-reduce`); greedy runs at tp 2 fused and not (`SGL_DISABLE_AR_NORM_FUSION=1`, the
# previous behaviour), bf16 and FP8, compared; the TTFT of a 1024-token prompt (median of 9) at
# tp 1 and at tp 2 both ways, bf16 and FP8, with batch-1 decode; offline throughput of random
# prompts at tp 2 both ways. Expects the binaries in .dev/gpu, writes to $OUT.
# Knobs: NUM_PROMPTS (300), BUDGET_S (560), SKIP_OFFLINE=1.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|check|all-reduce|TTFT|tok/s"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
stage "all-reduce alone and fused, 2 GPUs" 120 $B bench-all-reduce --tp-size 2 2>&1 | grep -v INFO | tee $OUT/all-reduce.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/p-ckpt 32
for q in bf16 fp8; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  for m in fused unfused; do
    env=""; [ $m = unfused ] && env="SGL_DISABLE_AR_NORM_FUSION=1"
    stage "greedy, tp 2, $q, $m" 150 env $env $B check-reference --model $W/ckpt --prompts $W/p-ckpt/prompts.json \
      --out $W/p-ckpt/$q-$m --cuda-graph-max-bs 64 --tp-size 2 $Q 2>&1 | keep
  done
  echo "== $q: fused against unfused"
  python3 scripts/gpu/tp_compare.py compare $W/p-ckpt/$q-unfused $W/p-ckpt/$q-fused | grep "^|" | tee $OUT/greedy-$q-fused-vs-unfused.txt
done
for q in bf16 fp8; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  stage "TTFT and decode, tp 1, $q" 120 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 \
    --gemv on --ttft-input 1024 $Q 2>&1 | keep | tee $OUT/one-batch-tp1-$q.txt
  for m in fused unfused; do
    env=""; [ $m = unfused ] && env="SGL_DISABLE_AR_NORM_FUSION=1"
    stage "TTFT and decode, tp 2, $q, $m" 120 env $env $B bench-one-batch --model $W/ckpt --batch 1 --input 128 \
      --output 256 --gemv on --ttft-input 1024 --tp-size 2 $Q 2>&1 | keep | tee $OUT/one-batch-tp2-$q-$m.txt
  done
done
N=${NUM_PROMPTS:-300}
[ -n "$SKIP_OFFLINE" ] || for m in fused unfused; do
  env=""; [ $m = unfused ] && env="SGL_DISABLE_AR_NORM_FUSION=1"
  stage "offline, $N random prompts, tp 2, $m" 150 env $env $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts $N --tp-size 2 2>&1 \
    | keep | tee $OUT/offline-$m.txt
done
echo "== done in $(elapsed)s"
