#!/usr/bin/env bash
# The tensor-parallel all-reduce carried by the decode GEMVs (the row-parallel GEMV pushes its
# results into every rank's exchange buffer, the next norm-fused GEMV sums them), in one device
# call on TP GPUs (default 2): the kernel checks; greedy runs at tp TP with the exchange and
# with `SGL_DISABLE_GEMV_ALLREDUCE=1` (the one-shot all-reduce kernel after each row-parallel
# GEMV, the previous behaviour), against each other (the same sums in the same order: expected
# bit-identical; their parity against tp 1 is the one-shot path's, results/gpu/README.md), on
# the 32-layer random checkpoint and a 2-layer one; batch-1 decode and the TTFT of 1024 tokens
# at tp 1 and at tp TP both ways, bf16 and FP8; offline throughput of random prompts at tp TP
# both ways. Two device calls: PHASE=1 (checks, greedy runs, bf16 decode), PHASE=2 (FP8
# decode, offline); PHASE=3 is a sweep of the gathering GEMV's prefetch depth. Expects the binaries in .dev/gpu, writes to $OUT.
# Knobs: TP (2), PHASE (1), NUM_PROMPTS (300), BUDGET_S (570), SKIP_CHECKS=1, CHECK_MODE=exchange
# (only the exchange's kernel checks).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
TP=${TP:-2}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|tensor parallel|KV pool|all-reduce"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
PHASE=${PHASE:-1}
if [ $PHASE = 1 ] && [ "${SKIP_CHECKS:-0}" != 1 ]; then
  stage "kernel checks" 150 $D/kernel-check ${CHECK_MODE:-} 2>&1 | grep -vE "^PASS " | tee $OUT/kernel-check.txt
  [ "${CHECK_MODE:-}" = exchange ] && SGL_GEMV_EXCHANGE_OPTS=1 stage "kernel checks, exchange options 1" 60 \
    $D/kernel-check exchange 2>&1 | grep -vE "^PASS " | tee -a $OUT/kernel-check.txt
  grep -q " 0 failed" $OUT/kernel-check.txt || echo "KERNEL CHECK FAILED (see above)"
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
[ -f $W/ckpt2/config.json ] || stage "2-layer checkpoint" 120 python3 scripts/gpu/make_ckpt.py $W/ckpt2 2 || exit 1

for c in ckpt2 ckpt; do
  [ $PHASE = 1 ] || break
  python3 scripts/gpu/tp_compare.py prompts $W/$c $W/g-$c 32
  stage "greedy, $c, tp $TP, exchange" 150 $B check-reference --model $W/$c \
    --prompts $W/g-$c/prompts.json --out $W/g-$c/xchg --cuda-graph-max-bs 64 --tp-size $TP 2>&1 | keep
  SGL_DISABLE_GEMV_ALLREDUCE=1 stage "greedy, $c, tp $TP, one-shot kernel" 150 $B check-reference \
    --model $W/$c --prompts $W/g-$c/prompts.json --out $W/g-$c/oneshot --cuda-graph-max-bs 64 --tp-size $TP 2>&1 | keep
  echo "== $c: exchange against the one-shot kernel"
  python3 scripts/gpu/tp_compare.py compare $W/g-$c/oneshot $W/g-$c/xchg | grep "^|" | tee $OUT/$c-xchg-vs-oneshot.txt
done

QS=bf16; [ $PHASE = 2 ] && QS=fp8; [ $PHASE = 3 ] && QS=
for q in $QS; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  stage "batch-1 decode, tp 1, $q" 120 $B bench-one-batch --model $W/ckpt --batch 1 \
    --input 128 --output 256 --gemv on --ttft-input 1024 $Q 2>&1 | keep | tee $OUT/one-batch-$q-tp1.txt
  for m in xchg oneshot; do
    env=""; [ $m = oneshot ] && env="SGL_DISABLE_GEMV_ALLREDUCE=1"
    stage "batch-1 decode, tp $TP, $q, $m" 150 env $env $B bench-one-batch --model $W/ckpt --batch 1 \
      --input 128 --output 256 --gemv on --ttft-input 1024 --tp-size $TP $Q 2>&1 \
      | keep | tee $OUT/one-batch-$q-$m.txt
  done
done
# PHASE=3: batch-1 decode at tp TP, the exchange with each of XOPTS's options
# (SGL_GEMV_EXCHANGE_OPTS) and XPF's prefetch depths (weight steps the gathering GEMV
# prefetches into L2 before it waits) against the one-shot kernel and tp 1, bf16 and FP8 (Q3,
# default "bf16 fp8").
for q in ${Q3:-bf16 fp8}; do
  [ $PHASE = 3 ] || break
  Q=""; [ $q = fp8 ] && Q="--quantization fp8"
  stage "batch-1 decode, tp 1, $q" 120 $B bench-one-batch --model $W/ckpt --batch 1 \
    --input 128 --output 256 --gemv on $Q 2>&1 | keep | tee $OUT/pf-$q-tp1.txt
  SGL_DISABLE_GEMV_ALLREDUCE=1 stage "batch-1 decode, tp $TP, $q, one-shot" 120 $B bench-one-batch \
    --model $W/ckpt --batch 1 --input 128 --output 256 --gemv on --tp-size $TP $Q 2>&1 | keep | tee $OUT/pf-$q-oneshot.txt
  for o in ${XOPTS:-2}; do
  for pf in ${XPF:-1 4 64}; do
    echo "== exchange options $o, prefetch $pf"
    SGL_GEMV_EXCHANGE_OPTS=$o SGL_GEMV_EXCHANGE_PREFETCH=$pf stage "batch-1 decode, tp $TP, $q, exchange, options $o, prefetch $pf" 120 $B \
      bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 --gemv on --tp-size $TP $Q 2>&1 \
      | keep | tee $OUT/pf-$q-xchg-$o-$pf.txt
  done
  done
done
N=${NUM_PROMPTS:-300}
for m in xchg oneshot; do
  [ $PHASE = 2 ] || break
  env=""; [ $m = oneshot ] && env="SGL_DISABLE_GEMV_ALLREDUCE=1"
  stage "offline, $N random prompts, tp $TP, $m" 150 env $env $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts $N --tp-size $TP 2>&1 \
    | keep | tee $OUT/offline-$m.txt
done
echo "== done in $(elapsed)s"
