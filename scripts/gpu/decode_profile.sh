#!/usr/bin/env bash
# Where the time of a large-batch decode step goes, kernel by kernel, in one device call on one
# GPU: `bench-one-batch` times BATCH sequences of INPUT prompt tokens decoding (ms/step and tok/s
# with the engine's defaults), then runs again under Nsight Compute with the profiler's range on
# the last STEPS decode steps only (`--profile-steps`), and the kernels' durations are summed by
# name and grid. Under the profiler kernels run one at a time (no overlap, no programmatic
# dependent launch): the sums are an upper bound of each kernel's cost, their shares are what
# this is for. Expects the binaries in .dev/gpu and writes to $OUT.
#
# Knobs: BATCH (256), INPUT (1000), STEPS (2), QUANT ("--quantization fp8 --kv-cache-dtype
# fp8_e4m3"), BUDGET_S (240).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-240}
. scripts/gpu/stage.sh
BATCH=${BATCH:-256}; INPUT=${INPUT:-1000}; STEPS=${STEPS:-2}
Q=${QUANT---quantization fp8 --kv-cache-dtype fp8_e4m3}
tag=b${BATCH}-i${INPUT}-$(echo "${Q:-bf16}" | tr -c 'a-z0-9\n' '_' | sed 's/^_*//')

[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }
stage "decode, batch $BATCH, input $INPUT ($Q)" 150 $B bench-one-batch --model $W/ckpt \
  --batch $BATCH --input $INPUT --output 24 $Q 2>&1 | tee $OUT/decode-$tag.txt | grep -E "^\|"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
stage "kernel times under Nsight Compute, last $STEPS steps" 200 $NCU --profile-from-start off \
  --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  $B bench-one-batch --model $W/ckpt --batch $BATCH --input $INPUT --output $((STEPS + 2)) \
  --profile-steps $STEPS $Q > $OUT/ncu-$tag.csv 2> $OUT/ncu-$tag.err
tail -3 $OUT/ncu-$tag.err
python3 scripts/gpu/ncu_sum.py $OUT/ncu-$tag.csv 30 | tee $OUT/profile-$tag.txt
echo "== done in $(elapsed)s"
