R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=300; . scripts/gpu/stage.sh
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/gpu/base2-sgl-bench.xz'), open('/tmp/base-sgl-bench','wb'))"; chmod +x /tmp/base-sgl-bench
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
stage "kernel-check prefill" 90 .dev/gpu/kernel-check prefill > $OUT/kernel-check-prefill.txt 2>&1
grep -E "FAIL|checks, " $OUT/kernel-check-prefill.txt | tail -4; grep -c "two heads a block.*pass" $OUT/kernel-check-prefill.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 100 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
mkdir -p $W/cmp; python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
Q="--quantization fp8 --kv-cache-dtype fp8_e4m3"
for bin in base new; do
  B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
  stage "greedy fp8+kv8, $bin" 60 $B check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
    --out $W/cmp/f8-$bin --cuda-graph-max-bs 64 $Q 2>&1 | grep -E "panicked|[Ee]rror"
done
echo "### fp8 + e4m3 pool: the launcher with PrefillForm against 48df1dc" | tee -a $OUT/greedy.txt
python3 scripts/gpu/tp_compare.py compare $W/cmp/f8-base $W/cmp/f8-new | tee -a $OUT/greedy.txt
for r in 1 2; do for bin in new base; do
  B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
  stage "TTFT $bin" 40 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 --ttft-input 1024 $Q 2>&1 \
    | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| fp8+kv8 $bin r$r #" | tee -a $OUT/ttft.txt
done; done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
