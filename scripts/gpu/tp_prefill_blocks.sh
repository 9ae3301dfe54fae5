#!/usr/bin/env bash
# The prefill set of one-shot buffers at tp 2 with 64 / 128 / 264 / 528 blocks per launch
# (`SGL_ONESHOT_PREFILL_BLOCKS`): bench-all-reduce's 2-8 MB rows for each, the TTFT of 1024
# tokens at 128 and 264 blocks and at tp 1. One device call on 2 GPUs, ~80 s; writes to $OUT.
set -o pipefail
D=.dev/gpu; B=$D/sgl-bench; W=/tmp/sgl; mkdir -p $W $OUT
export SGL_KERNEL_CACHE=$W/kcache
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
for b in 64 128 264 528; do
  echo "== blocks $b"
  SGL_ONESHOT_PREFILL_BLOCKS=$b timeout 90 $B bench-all-reduce --tp-size 2 2>&1 | grep -E "check \(|^\| (2|4|8) MB" | tee $OUT/ar-blocks-$b.txt
done
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32
for b in 128 264; do
  echo "== TTFT, blocks $b"
  SGL_ONESHOT_PREFILL_BLOCKS=$b timeout 120 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 16 --gemv on --ttft-input 1024 --tp-size 2 2>&1 | grep -E "^\| 1024" | tee $OUT/ttft-blocks-$b.txt
done
timeout 120 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 16 --gemv on --ttft-input 1024 2>&1 | grep -E "^\| 1024" | tee $OUT/ttft-tp1.txt
