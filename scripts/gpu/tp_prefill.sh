#!/usr/bin/env bash
# Prefill's all-reduces at tp 2 through the one-shot kernel over peer memory (up to 8 MB, 128
# blocks) instead of NCCL, in one device call on 2 GPUs: the all-reduce alone (checked against
# host sums, timed against NCCL by size); greedy runs at tp 2 both ways
# (`SGL_DISABLE_ONESHOT_PREFILL=1`: NCCL, the previous behaviour), compared; the TTFT of a
# 1024-token prompt at tp 1 and at tp 2 both ways (with batch-1 decode); offline throughput of
# random prompts both ways. Expects the binaries in .dev/gpu, writes to $OUT.
# Knobs: NUM_PROMPTS (300), BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|check|all-reduce"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
stage "all-reduce alone, 2 GPUs" 90 $B bench-all-reduce --tp-size 2 2>&1 | grep -v INFO | tee $OUT/all-reduce.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/p-ckpt 32
for m in oneshot nccl; do
  env=""; [ $m = nccl ] && env="SGL_DISABLE_ONESHOT_PREFILL=1"
  stage "greedy, tp 2, $m" 150 env $env $B check-reference --model $W/ckpt --prompts $W/p-ckpt/prompts.json \
    --out $W/p-ckpt/$m --cuda-graph-max-bs 64 --tp-size 2 2>&1 | keep
done
echo "== prefill all-reduces: one-shot against NCCL"
python3 scripts/gpu/tp_compare.py compare $W/p-ckpt/nccl $W/p-ckpt/oneshot | grep "^|" | tee $OUT/greedy-oneshot-vs-nccl.txt
stage "TTFT and decode, tp 1" 120 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 \
  --gemv on --ttft-input 1024 2>&1 | keep | tee $OUT/one-batch-tp1.txt
for m in oneshot nccl; do
  env=""; [ $m = nccl ] && env="SGL_DISABLE_ONESHOT_PREFILL=1"
  stage "TTFT and decode, tp 2, $m" 120 env $env $B bench-one-batch --model $W/ckpt --batch 1 --input 128 \
    --output 256 --gemv on --ttft-input 1024 --tp-size 2 2>&1 | keep | tee $OUT/one-batch-tp2-$m.txt
done
N=${NUM_PROMPTS:-300}
for m in oneshot nccl; do
  env=""; [ $m = nccl ] && env="SGL_DISABLE_ONESHOT_PREFILL=1"
  stage "offline, $N random prompts, tp 2, $m" 150 env $env $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts $N --tp-size 2 2>&1 \
    | keep | tee $OUT/offline-$m.txt
done
echo "== done in $(elapsed)s"
