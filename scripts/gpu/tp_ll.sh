#!/usr/bin/env bash
# The low-latency all-reduce (`allreduce_ll_bf16`: the epoch travels in each line beside the
# data, no flags) for decode messages (up to 512 KB at tp 2, 64 KB at tp 4), in one device call
# on TP GPUs:
# `bench-all-reduce` (its bits against the one-shot kernel's on every rank, and every kernel
# timed per size); greedy runs at tp TP with it and without (`SGL_DISABLE_LL_ALLREDUCE=1`),
# bf16 and FP8, byte for byte (GREEDY=0: skipped); decode at tp TP both ways for each of BATCHES
# (default "1 16"), interleaved over ROUNDS rounds, against tp 1 on the same machine. Expects the
# binaries in .dev/gpu, writes to $OUT. Knobs: TP (2; 4 or 8 on such a machine), BATCHES,
# ROUNDS (2), GREEDY, BUDGET_S (540).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|check"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
TP=${TP:-2}
stage "all-reduce, $TP GPUs" 120 $B bench-all-reduce --tp-size $TP 2>&1 | grep -v INFO | tee $OUT/all-reduce.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
[ "${GREEDY:-1}" = 0 ] || python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
[ "${GREEDY:-1}" = 0 ] || for q in bf16 fp8; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  for m in ll oneshot; do
    env=""; [ $m = oneshot ] && env="SGL_DISABLE_LL_ALLREDUCE=1"
    stage "greedy, tp $TP, $q, $m" 150 env $env $B check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
      --out $W/cmp/$q-$m --cuda-graph-max-bs 64 --tp-size $TP $Q 2>&1 | keep
  done
  if diff -rq $W/cmp/$q-ll $W/cmp/$q-oneshot >/dev/null; then r="byte-identical"; else r="DIFFER"; fi
  echo "greedy outputs at tp $TP, $q, low-latency all-reduce against the one-shot kernel: $r" | tee -a $OUT/greedy.txt
done
decode() {  # LABEL BATCH ENV ARGS...
  local l=$1 bs=$2 env=$3; shift 3
  stage "decode, $l" 90 env $env $B bench-one-batch --model $W/ckpt --batch $bs --input 128 --output 256 "$@" 2>&1 \
    | grep -E "^\| (NVIDIA|all-reduce)" | sed "s#^#| $l #" | tee -a $OUT/decode.txt
}
BATCHES=${BATCHES:-1 16}
for bs in $BATCHES; do decode "tp 1, batch $bs" $bs ""; done
for r in $(seq ${ROUNDS:-2}); do
  for bs in $BATCHES; do
    decode "tp $TP, batch $bs, low-latency, round $r" $bs "" --tp-size $TP
    decode "tp $TP, batch $bs, one-shot, round $r" $bs SGL_DISABLE_LL_ALLREDUCE=1 --tp-size $TP
  done
done
echo "== done in $(elapsed)s"
