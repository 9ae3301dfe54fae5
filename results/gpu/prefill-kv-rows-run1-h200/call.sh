R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=590; . scripts/gpu/stage.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
for m in prefill kv; do
  stage "kernel-check $m" 150 .dev/gpu/kernel-check $m > $OUT/kernel-check-$m.txt 2>&1
  grep -E "FAIL|checks, |qkv rows" $OUT/kernel-check-$m.txt | tail -14
done
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
mkdir -p $W/cmp; LONG=1000 python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
printf '#!/bin/sh\nSGL_DISABLE_PREFILL_KV_ROWS=1 exec .dev/gpu/sgl-bench "$@"\n' > /tmp/sgl-bench-pool; chmod +x /tmp/sgl-bench-pool
run() { # NAME BIN ARGS
  local n=$1 b=$2; shift 2
  stage "greedy $n" 80 $b check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
    --out $W/cmp/$n --cuda-graph-max-bs 64 "$@" 2>&1 | grep -E "panicked|[Ee]rror"
}
F="--quantization fp8"
run f8-kvbf .dev/gpu/sgl-bench $F
run f8-rows .dev/gpu/sgl-bench $F --kv-cache-dtype fp8_e4m3
run f8-pool /tmp/sgl-bench-pool $F --kv-cache-dtype fp8_e4m3
for p in "f8-kvbf f8-rows" "f8-kvbf f8-pool" "f8-pool f8-rows"; do
  set -- $p; echo "### $1 against $2" | tee -a $OUT/greedy.txt
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$1 $W/cmp/$2 | tee -a $OUT/greedy.txt
done
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 60 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in 1 2; do
  ttft "fp8+kv8, rows, round $r" .dev/gpu/sgl-bench $F --kv-cache-dtype fp8_e4m3
  ttft "fp8+kv8, pool, round $r" /tmp/sgl-bench-pool $F --kv-cache-dtype fp8_e4m3
done
ttft "bf16+kv8, rows" .dev/gpu/sgl-bench --kv-cache-dtype fp8_e4m3
ttft "bf16+kv8, pool" /tmp/sgl-bench-pool --kv-cache-dtype fp8_e4m3
run bf-kvbf .dev/gpu/sgl-bench
run bf-rows .dev/gpu/sgl-bench --kv-cache-dtype fp8_e4m3
run bf-pool /tmp/sgl-bench-pool --kv-cache-dtype fp8_e4m3
for p in "bf-kvbf bf-rows" "bf-kvbf bf-pool"; do
  set -- $p; echo "### $1 against $2" | tee -a $OUT/greedy.txt
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$1 $W/cmp/$2 | tee -a $OUT/greedy.txt
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
