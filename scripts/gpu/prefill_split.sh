#!/usr/bin/env bash
# Prefill attention with the key ranges of a launch's longest query tiles split (the default)
# against whole query tiles (`SGL_DISABLE_PREFILL_SPLIT=1`), same binary, one device call (2
# GPUs for the tp 2 rows): `kernel-check prefill` (split work lists against the host and
# launched twice), `kernel-check bench-prefill-attn` (both work lists), the TTFT of a 1024-token
# prompt (median of 9), both forms interleaved over ROUNDS rounds: bf16 and FP8 at tp 1 (FP8
# against its compute floor), bf16 at tp 2; then greedy runs of tp_compare.py's sequences plus
# a 1000-token prompt and four of 500-1000 (LONG) compared with tp_compare.py (32-layer
# checkpoint in bf16 and FP8, tp 2 when TP2=1). Expects the binaries in .dev/gpu,
# writes to $OUT.
# Knobs: CHECKS (1), GREEDY (1), ROUNDS (2), TP2 (1; 0 on one GPU), LONG (1000), BUDGET_S (570).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
. scripts/gpu/stage.sh
B=$D/sgl-bench
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|FAIL|passed|slots"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
if [ "${TP2:-1}" = 1 ] && ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if [ "${CHECKS:-1}" = 1 ]; then
  stage "kernel-check prefill" 200 $D/kernel-check prefill 2>&1 | tee $OUT/kernel-check-prefill.txt | grep -E "FAIL|passed|checks" | tail -5
  stage "kernel-check bench-prefill-attn" 90 $D/kernel-check bench-prefill-attn 2>&1 | tee $OUT/bench-prefill-attn.txt | keep
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1

ttft() {  # LABEL ENV ARGS...
  local l=$1 e=$2; shift 2
  stage "TTFT, $l" 80 env $e $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in $(seq ${ROUNDS:-2}); do
  for form in split whole; do
    e="SGL_DISABLE_PREFILL_SPLIT=0"; [ $form = whole ] && e="SGL_DISABLE_PREFILL_SPLIT=1"
    ttft "bf16, tp 1, $form, round $r" $e
    ttft "fp8, tp 1, $form, round $r" $e --quantization fp8
    [ "${TP2:-1}" = 1 ] && ttft "bf16, tp 2, $form, round $r" $e --tp-size 2
  done
done
greedy() {  # LABEL CKPT ARGS...: both forms, then their comparison
  local l=$1 c=$2; shift 2
  for form in split whole; do
    local env=""; [ $form = whole ] && env="SGL_DISABLE_PREFILL_SPLIT=1"
    stage "greedy, $l, $form" 120 env $env $B check-reference --model $c --prompts $W/cmp/prompts.json \
      --out $W/cmp/$l-$form --cuda-graph-max-bs 64 "$@" 2>&1 | keep
  done
  echo "### $l: key ranges split against whole query tiles" | tee -a $OUT/greedy.txt
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$l-whole $W/cmp/$l-split | tee -a $OUT/greedy.txt
}
if [ "${GREEDY:-1}" = 1 ]; then
  LONG=${LONG:-1000} python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
  greedy bf16 $W/ckpt
  greedy fp8 $W/ckpt --quantization fp8
  [ "${TP2:-1}" = 1 ] && greedy bf16-tp2 $W/ckpt --tp-size 2
fi

echo "== done in $(elapsed)s"
