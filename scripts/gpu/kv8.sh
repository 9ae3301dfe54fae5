#!/usr/bin/env bash
# The FP8 KV cache (`--kv-cache-dtype fp8_e4m3 | fp8_e5m2`) in one device call on one GPU:
# the kernel checks (the store and every attention form on FP8 pools against host references,
# the fused decode forms bit for bit against the unfused ones, and the bf16 checks unchanged);
# the KV pool's size, batch-1 and batch-32 decode and the TTFT of a 1024-token prompt with a
# bf16 pool and each FP8 pool; the greedy run of the parity prompts (tp_compare.py) on the
# 32-layer and a 2-layer checkpoint with each pool, FP8 against bf16; offline throughput
# (NUM_PROMPTS random prompts, in/out 1..1024) with each pool.
# Expects the binaries in .dev/gpu (scripts/gpu/README.md) and writes to $OUT.
# Knobs: NUM_PROMPTS (400), BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool"; }
KVS="auto fp8_e4m3 fp8_e5m2"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
stage "kernel checks" 240 $D/kernel-check 2>&1 | grep -E "FAIL|checks|pool" | tee $OUT/kernel-check.txt

if [ -f $W/ckpt/config.json ]; then echo "== checkpoint: reusing $W/ckpt"
else stage "checkpoint" 200 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi
[ -f $W/ckpt2/config.json ] || python3 scripts/gpu/make_ckpt.py --truncate $W/ckpt $W/ckpt2 2

for kv in $KVS; do
  for b in 1 32; do
    T=; [ $b = 1 ] && T="--ttft-input 1024"
    stage "decode batch $b (in 512, out 256)${T:+ and TTFT of 1024 tokens}, KV $kv" 90 $B bench-one-batch \
      --model $W/ckpt --batch $b --input 512 --output 256 --gemv on $T --kv-cache-dtype $kv 2>&1 \
      | keep | tee $OUT/one-batch-b$b-$kv.txt
  done
done

for c in ckpt ckpt2; do
  python3 scripts/gpu/tp_compare.py prompts $W/$c $W/kv-$c 32
  for kv in $KVS; do
    stage "greedy run on the parity prompts, $c, KV $kv" 90 $B check-reference --model $W/$c \
      --prompts $W/kv-$c/prompts.json --out $W/kv-$c/$kv --cuda-graph-max-bs 64 --kv-cache-dtype $kv 2>&1 | keep
  done
  for kv in fp8_e4m3 fp8_e5m2; do
    echo "== $c: KV $kv against bf16"
    python3 scripts/gpu/tp_compare.py compare $W/kv-$c/auto $W/kv-$c/$kv | tee $OUT/parity-$c-$kv.txt
  done
done

N=${NUM_PROMPTS:-400}
for kv in $KVS; do
  stage "offline random, $N prompts, KV $kv" 120 $B bench-offline-throughput --model $W/ckpt --dataset-name random \
    --random-input-len 1024 --random-output-len 1024 --num-prompts $N --kv-cache-dtype $kv 2>&1 \
    | keep | tee $OUT/offline-$kv.txt
done
echo "== done in $(elapsed)s"
