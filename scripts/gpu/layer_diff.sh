#!/usr/bin/env bash
# Per-layer comparison with transformers (bf16 and fp32) on a 2-layer and a 32-layer random
# Llama-3.1-8B-shaped checkpoint. Expects .dev/gpu/sgl-bench (see README.md).
set -o pipefail
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
[ -f $W/ck2/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ck2 2 || exit 1
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
for m in ck2 ckpt; do
  echo "== layer diff $m"
  mkdir -p $W/ld_$m
  python3 scripts/gpu/layer_diff.py ref $W/$m $W/ld_$m || continue
  SGL_CUDA_DUMP_DIR=$W/ld_$m/dump $D/sgl-bench check-reference --model $W/$m \
    --prompts $W/ld_$m/prompts.json --out $W/ld_$m 2>&1 | grep -v "^$"
  python3 scripts/gpu/layer_diff.py cmp $W/ld_$m
done
