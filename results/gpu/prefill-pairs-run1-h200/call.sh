R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=540; . scripts/gpu/stage.sh
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/gpu/base-sgl-bench.xz'), open('/tmp/base-sgl-bench','wb'))"; chmod +x /tmp/base-sgl-bench
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
for m in prefill kv; do
  stage "kernel-check $m" 150 .dev/gpu/kernel-check $m > $OUT/kernel-check-$m.txt 2>&1
  grep -E "FAIL|checks, |two heads" $OUT/kernel-check-$m.txt | tail -12
done
stage "bench-prefill-attn" 90 .dev/gpu/kernel-check bench-prefill-attn 2>&1 | grep -E "^\||blocks" | tee $OUT/bench-prefill-attn.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
mkdir -p $W/cmp; python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
Q="--quantization fp8 --kv-cache-dtype fp8_e4m3"
for bin in base new; do
  B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
  stage "greedy fp8+kv8, $bin" 90 $B check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
    --out $W/cmp/f8-$bin --cuda-graph-max-bs 64 $Q 2>&1 | grep -E "panicked|[Ee]rror"
done
echo "### fp8 weights + e4m3 pool: paired-head prefill attention against the build before" | tee -a $OUT/greedy.txt
python3 scripts/gpu/tp_compare.py compare $W/cmp/f8-base $W/cmp/f8-new | tee -a $OUT/greedy.txt
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 60 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
printf '#!/bin/sh\nSGL_DISABLE_PREFILL_PAIRS=1 exec .dev/gpu/sgl-bench "$@"\n' > .dev/gpu/sgl-bench-nopairs; chmod +x .dev/gpu/sgl-bench-nopairs
for r in 1 2; do
  ttft "fp8+kv8, new, round $r" .dev/gpu/sgl-bench $Q
  ttft "fp8+kv8, base, round $r" /tmp/base-sgl-bench $Q
  ttft "fp8+kv8, new, pairs off, round $r" .dev/gpu/sgl-bench-nopairs $Q
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
