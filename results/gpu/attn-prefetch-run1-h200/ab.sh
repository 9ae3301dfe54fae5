# A/B of the decode attention's early tile fetch: old (.dev/gpu-old) vs new (.dev/gpu) binaries.
export SGL_KERNEL_CACHE=/tmp/sgl/kcache PYTHONUNBUFFERED=1
mkdir -p /tmp/sgl
[ -f /tmp/sgl/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py /tmp/sgl/ckpt 32 > /dev/null
echo "== kernel checks (new)"; .dev/ab/kernel-check 2>&1 | tee $OUT/kernel-check.txt | tail -2
for i in 1 2; do for v in gpu-old ab; do
  echo "== bench-decode $v (round $i)"
  .dev/$v/kernel-check bench-decode 2>&1 | tee $OUT/decode-bench-$v-$i.txt | grep -E "^\| (full|attention only|no attention)" | grep -E "Rope|Skip" | head -6
done; done
for i in 1 2; do for v in gpu-old ab; do for q in "" "--quantization fp8"; do
  echo "== one-batch $v $q (round $i)"
  timeout 120 .dev/$v/sgl-bench bench-one-batch --model /tmp/sgl/ckpt --batch 1 --input 128 --output 256 --gemv on $q 2>&1 | grep "^| NVIDIA" | tail -1
done; done; done
