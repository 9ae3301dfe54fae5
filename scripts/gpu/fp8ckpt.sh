#!/usr/bin/env bash
# FP8 checkpoints in the compressed-tensors layout, in one device call: the kernel checks; the
# random Llama-3.1-8B-shaped checkpoint and its compressed-tensors FP8 copy (fp8_ckpt.py, the
# same arithmetic as --quantization fp8 at load); the greedy run of the FP8 copy against the
# bf16 checkpoint quantized at load (the logits must agree: same bytes, same scales); batch-1
# decode and the TTFT of 1024 tokens on both; the FP8 copy served over HTTP (load time, what
# /get_server_info reports, one generation). With TP=2 (a 2-GPU kind) the FP8 copy at tp 2
# against tp 1 too. Expects the binaries in .dev/gpu and writes to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|KV pool|loaded|PASS|FAIL|checks"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
[ -z "$SKIP_CHECKS" ] && stage "kernel checks" 200 $D/kernel-check 2>&1 | tee $OUT/kernel-check.txt | grep -E "FAIL|checks"
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
[ -f $W/ckpt-fp8/config.json ] || stage "compressed-tensors FP8 copy" 240 python3 scripts/gpu/fp8_ckpt.py $W/ckpt $W/ckpt-fp8 | tee $OUT/fp8-ckpt.txt
du -sh $W/ckpt $W/ckpt-fp8 | tee -a $OUT/fp8-ckpt.txt

python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/cmp 32
stage "greedy run, bf16 checkpoint quantized at load" 150 $B check-reference --model $W/ckpt \
  --prompts $W/cmp/prompts.json --out $W/cmp/atload --cuda-graph-max-bs 64 --quantization fp8 2>&1 | keep
stage "greedy run, compressed-tensors FP8 checkpoint" 150 $B check-reference --model $W/ckpt-fp8 \
  --prompts $W/cmp/prompts.json --out $W/cmp/ckpt --cuda-graph-max-bs 64 2>&1 | keep
echo "== FP8 checkpoint against the same weights quantized at load"
python3 scripts/gpu/tp_compare.py compare $W/cmp/atload $W/cmp/ckpt | grep "^|" | tee $OUT/ckpt-vs-atload.txt
python3 - $W/cmp/atload $W/cmp/ckpt <<'PY' | tee -a $OUT/ckpt-vs-atload.txt
import json, os, sys, glob
a, b = sys.argv[1], sys.argv[2]
same = diff = 0
for f in sorted(glob.glob(os.path.join(a, "*.json"))):
    g = os.path.join(b, os.path.basename(f))
    if not os.path.exists(g): continue
    if open(f, "rb").read() == open(g, "rb").read(): same += 1
    else: diff += 1
print(f"output files byte-identical: {same}, different: {diff}")
PY

for m in atload ckpt; do
  if [ $m = atload ]; then args="--model $W/ckpt --quantization fp8"; else args="--model $W/ckpt-fp8"; fi
  stage "batch-1 decode (in 128, out 256) and TTFT of 1024 tokens, $m" 120 $B bench-one-batch \
    $args --batch 1 --input 128 --output 256 --gemv on --ttft-input 1024 2>&1 | keep | tee $OUT/one-batch-$m.txt
done

for m in atload ckpt; do
  if [ $m = atload ]; then args="--model-path $W/ckpt --quantization fp8"; else args="--model-path $W/ckpt-fp8"; fi
  echo "== serve, $m: $args"
  $E serve $args --skip-tokenizer-init --device cuda --port 30000 > $OUT/serve-$m.log 2>&1 &
  pid=$!; ok=
  for _ in $(seq 1 120); do
    curl -sf localhost:30000/health >/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break; sleep 1
  done
  if [ -n "$ok" ]; then
    curl -s localhost:30000/generate -H 'content-type: application/json' \
      -d '{"input_ids":[128000,791,6864,315,9822,374],"sampling_params":{"temperature":0,"max_new_tokens":16}}' \
      | tee $OUT/generate-$m.json | head -c 400; echo
    curl -s localhost:30000/get_server_info | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("quantization","kv_cache_dtype","device","max_total_num_tokens")})' | tee $OUT/server-info-$m.txt
  else
    echo "== not healthy"; tail -20 $OUT/serve-$m.log
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
  grep -E "model ready|served as|loaded|[Ee]rror" $OUT/serve-$m.log | head -6
done

if [ "${TP:-1}" = 2 ]; then
  stage "greedy run, FP8 checkpoint at tp 2" 200 $B check-reference --model $W/ckpt-fp8 \
    --prompts $W/cmp/prompts.json --out $W/cmp/ckpt-tp2 --cuda-graph-max-bs 64 --tp-size 2 2>&1 | keep
  echo "== FP8 checkpoint, tp 2 against tp 1"
  python3 scripts/gpu/tp_compare.py compare $W/cmp/ckpt $W/cmp/ckpt-tp2 | grep "^|" | tee $OUT/ckpt-tp2-vs-tp1.txt
  stage "batch-1 decode, FP8 checkpoint at tp 2" 150 $B bench-one-batch --model $W/ckpt-fp8 --tp-size 2 \
    --batch 1 --input 128 --output 256 --gemv on --ttft-input 1024 2>&1 | keep | tee $OUT/one-batch-ckpt-tp2.txt
fi
echo "== done in $(elapsed)s"
