#!/usr/bin/env bash
# Offline throughput, 1000 prompts of exactly 1000 in / 1000 out, FP8 weights and KV cache, in one
# device call on one GPU: admission keeping room for the running requests' output (the default,
# --schedule-conservativeness 1) against admission taking every prompt that fits (0), each with
# its retractions counted and the engine's pass breakdown. Expects sgl-bench in .dev/gpu; writes
# to $OUT. Knobs: NUM_PROMPTS (1000), VALUES ("1 0").
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
for c in ${VALUES:-1 0}; do
  timeout 200 $D/sgl-bench bench-offline-throughput --model $W/ckpt --dataset-name random \
    --random-input-len 1000 --random-output-len 1000 --random-range-ratio 1 \
    --num-prompts ${NUM_PROMPTS:-1000} --quantization fp8 --kv-cache-dtype fp8_e4m3 \
    --schedule-conservativeness $c > $OUT/offline-c$c.txt 2>&1
  echo "== conservativeness $c: $(grep -c retracting $OUT/offline-c$c.txt) retractions"
  grep -E "^\|" $OUT/offline-c$c.txt | grep -vE "^\|---" | head -40
done
