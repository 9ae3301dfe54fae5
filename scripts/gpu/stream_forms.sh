#!/usr/bin/env bash
# The FP8 forms that stream rows and tiles through shared memory, against the forms in use, in
# one device call on one GPU (binaries in .dev/gpu, output in $OUT):
# - `decode_attn_tcs_*` (`SGL_DECODE_TC_STREAM=1`): the tensor-core decode attention on an FP8
#   pool with the pool's bytes copied into shared memory by cp.async, two tiles deep, and
#   widened in the MMA fragments, against the form that widens each tile into shared memory;
# - `silu_mul_quant_fp8`'s ring form (`SGL_ROW_STAGES=3`): the next rows' gate and up vectors
#   copied into shared memory while a row is computed, against the register form.
# Kernel checks (`kv`: both decode forms against the host on e4m3 and e5m2 pools; `fp8`: every
# ring depth and the register form the same bytes), the row kernels alone, a decode step at the
# offline run's batch (456 sequences of 1500 cached tokens), TTFT of 1024 tokens, and Nsight
# Compute on the streamed attention kernel. Each comparison runs the same binary both ways.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=${BUDGET_S:-585}; . scripts/gpu/stage.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee $OUT/gpus.txt
[ -f $W/ckpt/config.json ] || (python3 scripts/gpu/make_ckpt.py $W/ckpt 32 > $OUT/ckpt.txt 2>&1) &
stage "kernel-check kv" 150 $D/kernel-check kv > $OUT/kernel-check-kv.txt 2>&1
grep -E "FAIL|checks, |tensor cores" $OUT/kernel-check-kv.txt | tail -14
stage "kernel-check fp8" 120 $D/kernel-check fp8 > $OUT/kernel-check-fp8.txt 2>&1
grep -E "FAIL|checks, " $OUT/kernel-check-fp8.txt | tail -4
stage "bench-fp8-rows" 90 $D/kernel-check bench-fp8-rows > $OUT/bench-fp8-rows.txt 2>&1
grep -E "^\| (silu|add_rms)" $OUT/bench-fp8-rows.txt
wait
[ -f $W/ckpt/config.json ] || { echo "no checkpoint"; exit 1; }
wrap() {  # NAME ENV: a wrapper of sgl-bench with ENV set
  printf '#!/bin/sh\n%s exec %s/sgl-bench "$@"\n' "$2" "$PWD/$D" > /tmp/$1; chmod +x /tmp/$1
}
wrap sgl-bench-stream SGL_DECODE_TC_STREAM=1
wrap sgl-bench-ring SGL_ROW_STAGES=3
F="--quantization fp8 --kv-cache-dtype fp8_e4m3"
dec() {  # LABEL BIN
  stage "decode b456 i1500, $1" 70 $2 bench-one-batch --model $W/ckpt --batch 456 --input 1500 \
    --output 24 $F 2>&1 | grep -E "^\|" | tail -1 | sed "s#^#| $1 #" | tee -a $OUT/decode-b456.txt
}
ttft() {  # LABEL BIN
  stage "TTFT, $1" 60 $2 bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 $F 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $1 #" | tee -a $OUT/ttft.txt
}
for r in 1 2; do
  dec "streamed attention, round $r" /tmp/sgl-bench-stream
  dec "widened tiles, round $r" $D/sgl-bench
done
for r in 1 2; do
  ttft "SiLU ring, round $r" /tmp/sgl-bench-ring
  ttft "SiLU register form, round $r" $D/sgl-bench
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SGL_DECODE_TC_STREAM=1 stage "streamed decode attention under Nsight Compute" 120 $NCU \
  --profile-from-start off -k regex:decode_attn_tc -c 1 --set full $D/sgl-bench bench-one-batch \
  --model $W/ckpt --batch 456 --input 1500 --output 4 --profile-steps 2 $F > $OUT/ncu-attn.txt 2>&1
grep -E "Duration|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Registers Per|Achieved Occupancy" \
  $OUT/ncu-attn.txt | head -12
echo "== done in $(elapsed)s"
