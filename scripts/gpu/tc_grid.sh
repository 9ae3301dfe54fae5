#!/usr/bin/env bash
# decode attention on tensor cores with the grid (kv_heads, batch): kernel checks, then batch-256
# decode with 1000 cached tokens, FP8 weights + FP8 KV, this build against the session's first
# binary (grid (batch, kv_heads)), interleaved; then offline 1000 x 1000/1000 if time allows
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/sgl; D=.dev/gpu
export SGL_KERNEL_CACHE=$W/kcache
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$D/base/sgl-bench.xz'),open('$D/base/sgl-bench','wb'))" && chmod +x $D/base/sgl-bench
timeout 150 $D/kernel-check > $OUT/kernel-check.txt 2>&1; grep -E "FAIL|checks" $OUT/kernel-check.txt | tail -3
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32
for i in 1 2; do for b in $D/base/sgl-bench $D/sgl-bench; do
  timeout 90 $b bench-one-batch --model $W/ckpt --batch 256 --input 1000 --output 24 --quantization fp8 --kv-cache-dtype fp8_e4m3 2>&1 | grep -E "^\| NVIDIA" | tail -1 | sed "s#^#| $b #" | tee -a $OUT/decode-b256.txt
done; done
timeout 150 $D/sgl-bench bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len 1000 --random-output-len 1000 --random-range-ratio 1 --num-prompts 1000 --quantization fp8 --kv-cache-dtype fp8_e4m3 > $OUT/offline.txt 2>&1; grep -E "^\| (random|decode|mixed)" $OUT/offline.txt
