R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=500; . scripts/gpu/stage.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
stage "kernel-check (every check)" 240 .dev/gpu/kernel-check > $OUT/kernel-check-all.txt 2>&1
grep -E "FAIL|checks, " $OUT/kernel-check-all.txt | tail -6
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
printf '#!/bin/sh\nSGL_DISABLE_PREFILL_KV_ROWS=1 exec .dev/gpu/sgl-bench "$@"\n' > /tmp/sgl-bench-pool; chmod +x /tmp/sgl-bench-pool
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 60 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
F="--quantization fp8"
for r in 1 2 3; do
  ttft "fp8+kv8, rows, round $r" .dev/gpu/sgl-bench $F --kv-cache-dtype fp8_e4m3
  ttft "fp8+kv8, pool, round $r" /tmp/sgl-bench-pool $F --kv-cache-dtype fp8_e4m3
  ttft "fp8, bf16 pool, round $r" .dev/gpu/sgl-bench $F
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
