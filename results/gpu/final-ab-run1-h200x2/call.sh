R=$OUT; export OUT=/tmp/o; mkdir -p $OUT
W=/tmp/sgl; mkdir -p $W; export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
T0=$(date +%s); BUDGET_S=570; . scripts/gpu/stage.sh
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/gpu/base-sgl-bench.xz'), open('/tmp/base-sgl-bench','wb'))"; chmod +x /tmp/base-sgl-bench
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpus.txt
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32
ttft() {  # LABEL BIN ARGS...
  local l=$1 b=$2; shift 2
  stage "TTFT, $l" 70 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 8 \
    --ttft-input 1024 "$@" 2>&1 | grep -A2 "TTFT prompt" | tail -1 | sed "s#^#| $l #" | tee -a $OUT/ttft.txt
}
for r in 1 2; do
  for bin in new base; do
    B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
    ttft "bf16, tp 1, $bin, round $r" $B
    ttft "bf16, tp 2, $bin, round $r" $B --tp-size 2
    ttft "fp8, tp 1, $bin, round $r" $B --quantization fp8
  done
done
dec() { # LABEL BIN ARGS
  local l=$1 b=$2; shift 2
  stage "decode, $l" 70 $b bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 "$@" 2>&1 \
    | grep -E "^\| (NVIDIA|all-reduce)" | sed "s#^#| $l #" | tee -a $OUT/decode.txt
}
for bin in new base; do
  B=.dev/gpu/sgl-bench; [ $bin = base ] && B=/tmp/base-sgl-bench
  dec "bf16, tp 1, $bin" $B
  dec "bf16, tp 2, $bin" $B --tp-size 2
done
echo "== done in $(elapsed)s"
tar czf $R/all.tgz -C /tmp/o .
