R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=470; . scripts/gpu/stage.sh
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/gpu/prev-sgl-bench.xz'), open('/tmp/prev-sgl-bench','wb'))"; chmod +x /tmp/prev-sgl-bench
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
stage "kernel-check (every check)" 210 .dev/gpu/kernel-check > $OUT/kernel-check.txt 2>&1
grep -E "FAIL|checks, " $OUT/kernel-check.txt | tail -6; grep -c PASS $OUT/kernel-check.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
mkdir -p $W/cmp; python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
for bin in prev new; do
  B=.dev/gpu/sgl-bench; [ $bin = prev ] && B=/tmp/prev-sgl-bench
  stage "greedy fp8, $bin" 90 $B check-reference --model $W/ckpt --prompts $W/cmp/prompts.json \
    --out $W/cmp/fp8-$bin --cuda-graph-max-bs 64 --quantization fp8 2>&1 | grep -E "panicked|[Ee]rror"
done
echo "### fp8: SiLU through ex2.approx and rcp.approx against the IEEE expression" | tee -a $OUT/greedy.txt
python3 scripts/gpu/tp_compare.py compare $W/cmp/fp8-prev $W/cmp/fp8-new | tee -a $OUT/greedy.txt
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 60 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in 1 2; do
  for bin in new prev; do
    B=.dev/gpu/sgl-bench; [ $bin = prev ] && B=/tmp/prev-sgl-bench
    ttft "fp8, $bin, round $r" $B --quantization fp8
    ttft "bf16, $bin, round $r" $B
  done
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
