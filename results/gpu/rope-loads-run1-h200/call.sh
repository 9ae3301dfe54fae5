R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=480; . scripts/gpu/stage.sh
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/gpu/base2-sgl-bench.xz'), open('/tmp/base-sgl-bench','wb'))"; chmod +x /tmp/base-sgl-bench
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
for m in fp8 kv; do
  stage "kernel-check $m" 120 .dev/gpu/kernel-check $m > $OUT/kernel-check-$m.txt 2>&1
  grep -E "FAIL|checks, |rope" $OUT/kernel-check-$m.txt | tail -8
done
for r in 1 2; do for kc in base-kernel-check kernel-check; do
  stage "bench-fp8-rows $kc" 40 .dev/gpu/$kc bench-fp8-rows 2>&1 | grep -E "^\|" | grep -iE "rope|kernel \|" | sed "s#^#| $kc r$r #" | tee -a $OUT/bench-fp8-rows.txt
done; done
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
mkdir -p $W/cmp; python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
for q in bf16 fp8; do
  Q=""; [ $q = fp8 ] && Q="--quantization fp8 --kv-cache-dtype fp8_e4m3"
  for bin in base new; do
    B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
    stage "greedy $q, $bin" 80 $B check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
      --out $W/cmp/$q-$bin --cuda-graph-max-bs 64 $Q 2>&1 | grep -E "panicked|[Ee]rror"
  done
  echo "### $q: rope_kv_store with its loads first, against the build before" | tee -a $OUT/greedy.txt
  python3 scripts/gpu/tp_compare.py compare $W/cmp/$q-base $W/cmp/$q-new | tee -a $OUT/greedy.txt
done
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 50 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in 1 2; do
  ttft "fp8+kv8, new, round $r" .dev/gpu/sgl-bench --quantization fp8 --kv-cache-dtype fp8_e4m3
  ttft "fp8+kv8, base, round $r" /tmp/base-sgl-bench --quantization fp8 --kv-cache-dtype fp8_e4m3
  ttft "bf16, new, round $r" .dev/gpu/sgl-bench
  ttft "bf16, base, round $r" /tmp/base-sgl-bench
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
