#!/usr/bin/env bash
# Prefill's last layer on the logit rows only (`forward/tail.rs`) against every row
# (`SGL_DISABLE_LOGIT_ROWS_ONLY=1`), same binary, one device call (2 GPUs for the tp 2 rows):
# greedy runs of tp_compare.py's 81 sequences (batch 1, 8, 64, and 8 prompts after a cached
# prefix, whose prefix pass needs no logits at all) compared with tp_compare.py, on the 32-layer
# checkpoint (bf16, FP8, tp 2 when TP2=1) and on its first 2 layers (where rounding is not
# amplified); then the TTFT of a 1024-token prompt (median of 9), both forms interleaved over
# ROUNDS rounds, bf16 and FP8 at tp 1 (FP8 against its compute floor) and bf16 at tp 2 with
# tp 1 beside it. Expects the binaries in .dev/gpu, writes to $OUT.
# Knobs: ROUNDS (2), TP2 (1: the tp 2 rows; 0 on one GPU), GREEDY (1), BUDGET_S (570).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
. scripts/gpu/stage.sh
B=$D/sgl-bench
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
if [ "${TP2:-1}" = 1 ] && ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
[ -f $W/ckpt2/config.json ] || python3 scripts/gpu/make_ckpt.py --truncate $W/ckpt $W/ckpt2 2 >/dev/null

greedy() {  # LABEL CKPT ARGS...: both forms, then their comparison
  local l=$1 c=$2; shift 2
  for form in rows all; do
    local env=""; [ $form = all ] && env="SGL_DISABLE_LOGIT_ROWS_ONLY=1"
    stage "greedy, $l, $form" 120 env $env $B check-reference --model $c --prompts $W/cmp/prompts.json \
      --out $W/cmp/$l-$form --cuda-graph-max-bs 64 "$@" 2>&1 | keep
  done
  echo "### $l: logit rows only against every row" | tee -a $OUT/greedy.txt
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$l-all $W/cmp/$l-rows | tee -a $OUT/greedy.txt
}
if [ "${GREEDY:-1}" = 1 ]; then
  python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
  greedy bf16-2layers $W/ckpt2
  greedy bf16 $W/ckpt
  greedy fp8 $W/ckpt --quantization fp8
  [ "${TP2:-1}" = 1 ] && greedy bf16-tp2 $W/ckpt --tp-size 2
fi

ttft() {  # LABEL ENV ARGS...
  local l=$1 e=$2; shift 2
  stage "TTFT, $l" 80 env $e $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in $(seq ${ROUNDS:-2}); do
  for form in rows all; do
    e="SGL_DISABLE_LOGIT_ROWS_ONLY=0"; [ $form = all ] && e="SGL_DISABLE_LOGIT_ROWS_ONLY=1"
    ttft "bf16, tp 1, $form, round $r" $e
    ttft "fp8, tp 1, $form, round $r" $e --quantization fp8
    [ "${TP2:-1}" = 1 ] && ttft "bf16, tp 2, $form, round $r" $e --tp-size 2
  done
done
echo "== done in $(elapsed)s"
