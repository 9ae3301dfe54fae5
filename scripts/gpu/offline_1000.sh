#!/usr/bin/env bash
# Issue 20's offline workload in one device call on one GPU: 1000 prompts of exactly 1000 in /
# 1000 out, FP8 weights + e4m3 KV cache and bf16, each with its retractions counted and the
# engine's pass breakdown; the tensor-core decode attention's kernel checks first (`kernel-check
# kv`), batch-1 decode and the TTFT of 1024 tokens (FP8) between the runs, and FP8 at each
# further --schedule-conservativeness in VALUES while the budget lasts. Expects the binaries in
# .dev/gpu (scripts/gpu/README.md); writes to $OUT. Knobs: VALUES ("1.3"; "" for none), BF16=0
# (no bf16 run), BUDGET_S (540).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=${BUDGET_S:-540}; . scripts/gpu/stage.sh
F8="--quantization fp8 --kv-cache-dtype fp8_e4m3"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpus.txt
[ -f $W/ckpt/config.json ] || (python3 scripts/gpu/make_ckpt.py $W/ckpt 32 > $OUT/ckpt.txt 2>&1) &
stage "kernel-check kv" 120 $D/kernel-check kv > $OUT/kernel-check-kv.txt 2>&1
grep -E "FAIL|checks, " $OUT/kernel-check-kv.txt | tail -6
wait
[ -f $W/ckpt/config.json ] || { echo "no checkpoint"; exit 1; }
off() {  # NAME FLAGS...: one offline run
  local n=$1; shift
  stage "offline $n" 170 $D/sgl-bench bench-offline-throughput --model $W/ckpt \
    --dataset-name random --random-input-len 1000 --random-output-len 1000 \
    --random-range-ratio 1 --num-prompts 1000 "$@" > $OUT/offline-$n.txt 2>&1
  echo "== $n: $(grep -c retracting $OUT/offline-$n.txt) retractions"
  grep -E "^\| (random|decode only|mixed|all passes)" $OUT/offline-$n.txt
}
off fp8 $F8
stage "batch-1 decode and TTFT, FP8" 60 $D/sgl-bench bench-one-batch --model $W/ckpt --batch 1 \
  --input 128 --output 256 --ttft-input 1024 $F8 > $OUT/one-batch-fp8.txt 2>&1
grep -E "^\|" $OUT/one-batch-fp8.txt | tail -3
[ "${BF16:-1}" = 0 ] || off bf16
for c in ${VALUES-1.3}; do off fp8-c$c $F8 --schedule-conservativeness $c; done
echo "== done in $(elapsed)s"
