#!/usr/bin/env bash
# This build against earlier ones at tp 2, in one device call on 2 GPUs: `bench-all-reduce`
# (the fused all-reduce + RMSNorm checked bit for bit against the one-shot kernel and the norm,
# and timed) for each build; greedy runs at tp 2, bf16 and FP8, this build against BASE, byte
# for byte; the TTFT of a 1024-token prompt (median of 9) at tp 1 (this build) and at tp 2 for
# every build, interleaved over ROUNDS rounds. BASE and OTHERS are directories with an
# sgl-bench. Expects the binaries in .dev/gpu, writes to $OUT. Knobs: BASE, OTHERS, ROUNDS (2),
# SKIP_AR=1 (no bench-all-reduce), BUDGET_S.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|check"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
BUILDS="$D ${BASE:-} ${OTHERS:-}"
[ -n "$SKIP_AR" ] || for b in $BUILDS; do
  stage "all-reduce, $b" 90 $b/sgl-bench bench-all-reduce --tp-size 2 2>&1 | grep -E "fused|^\| (rows|[0-9]+ x)" \
    | sed "s#^#$b #" | tee -a $OUT/all-reduce.txt
done
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
if [ -n "$BASE" ]; then
  python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
  for q in bf16 fp8; do
    Q=""; [ $q = fp8 ] && Q="--quantization fp8"
    for b in $D $BASE; do
      stage "greedy, tp 2, $q, $b" 150 $b/sgl-bench check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
        --out $W/cmp/$q-$(basename $b) --cuda-graph-max-bs 64 --tp-size 2 $Q 2>&1 | keep
    done
    if diff -rq $W/cmp/$q-$(basename $D) $W/cmp/$q-$(basename $BASE) >/dev/null; then r="byte-identical"
    else r="DIFFER"; fi
    echo "greedy outputs at tp 2, $q, this build against BASE: $r" | tee -a $OUT/greedy.txt
  done
fi
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 90 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 32 --ttft-input 1024 "$@" \
    2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in $(seq ${ROUNDS:-2}); do
  ttft "tp 1, $D, round $r" $D/sgl-bench
  for b in $BUILDS; do ttft "tp 2, $b, round $r" $b/sgl-bench --tp-size 2; done
done
echo "== done in $(elapsed)s"
