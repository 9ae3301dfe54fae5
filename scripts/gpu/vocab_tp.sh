#!/usr/bin/env bash
# The vocabulary-parallel LM head (tensor parallelism) in one device call on TP GPUs (default
# 2): greedy runs at tp TP with the head split by vocabulary and with it whole on every rank
# (`SGL_DISABLE_VOCAB_PARALLEL=1`), each against tp 1 and against each other (the 32-layer
# random checkpoint and a 2-layer one, on which rounding is amplified less); batch-1 decode and
# the TTFT of 1024 tokens, the all-reduce's share; offline throughput of random prompts; the
# same for the FP8 weights (`--quantization fp8`). Expects the binary in .dev/gpu, writes to $OUT.
# Knobs: TP (2), NUM_PROMPTS (300), BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
TP=${TP:-2}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|tensor parallel|KV pool|loaded"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
[ -f $W/ckpt2/config.json ] || stage "2-layer checkpoint" 120 python3 scripts/gpu/make_ckpt.py $W/ckpt2 2 || exit 1

for c in ckpt2 ckpt; do
  python3 scripts/gpu/tp_compare.py prompts $W/$c $W/v-$c 32
  stage "greedy, $c, tp 1" 150 $B check-reference --model $W/$c --prompts $W/v-$c/prompts.json \
    --out $W/v-$c/tp1 --cuda-graph-max-bs 64 2>&1 | keep
  stage "greedy, $c, tp $TP, vocabulary-parallel head" 150 $B check-reference --model $W/$c \
    --prompts $W/v-$c/prompts.json --out $W/v-$c/vp --cuda-graph-max-bs 64 --tp-size $TP 2>&1 | keep
  SGL_DISABLE_VOCAB_PARALLEL=1 stage "greedy, $c, tp $TP, whole head on rank 0" 150 $B check-reference \
    --model $W/$c --prompts $W/v-$c/prompts.json --out $W/v-$c/whole --cuda-graph-max-bs 64 --tp-size $TP 2>&1 | keep
  for pair in "tp1 vp" "tp1 whole" "whole vp"; do
    set -- $pair
    echo "== $c: $2 against $1"
    python3 scripts/gpu/tp_compare.py compare $W/v-$c/$1 $W/v-$c/$2 | grep "^|" | tee $OUT/$c-$2-vs-$1.txt
  done
done

for q in bf16 fp8; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  for m in vp whole; do
    env=""; [ $m = whole ] && env="SGL_DISABLE_VOCAB_PARALLEL=1"
    stage "batch-1 decode, tp $TP, $q, $m" 150 env $env $B bench-one-batch --model $W/ckpt --batch 1 \
      --input 128 --output 256 --gemv on --ttft-input 1024 --tp-size $TP $Q 2>&1 \
      | keep | tee $OUT/one-batch-$q-$m.txt
  done
done
N=${NUM_PROMPTS:-300}
for m in vp whole; do
  env=""; [ $m = whole ] && env="SGL_DISABLE_VOCAB_PARALLEL=1"
  stage "offline, $N random prompts, tp $TP, $m" 150 env $env $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts $N --tp-size $TP 2>&1 \
    | keep | tee $OUT/offline-$m.txt
done
echo "== done in $(elapsed)s"
