#!/usr/bin/env bash
# Start-up time of `sgl-engine serve` on the GPU, broken down from its log: the random
# Llama-3.1-8B-shaped checkpoint (make_ckpt.py; files in the page cache), no `--device` (the
# default must pick the GPU), first with an empty kernel cache (a fresh node), then warm.
# Prints the seconds from process start to the first 200 from /health and the timed log lines.
# Expects the stripped binary in .dev/gpu (see README.md). Writes to $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
E=.dev/gpu/sgl-engine; W=/tmp/sgl; mkdir -p $W
PORT=30125
if [ ! -f $W/ckpt/config.json ]; then
  timeout 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi
# The weights in the page cache, as on a node that served the model before.
cat $W/ckpt/*.safetensors > /dev/null
start() {  # start NAME: serve until /health answers, print the seconds and the log
  local name=$1 log=$OUT/startup-$1.log
  local t0; t0=$(date +%s.%N)
  $E serve --model-path $W/ckpt --skip-tokenizer-init --port $PORT --log-level info > /dev/null 2> "$log" &
  local pid=$!
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    kill -0 $pid 2> /dev/null || break
    sleep 0.05
  done
  local t1; t1=$(date +%s.%N)
  local dev; dev=$(curl -sf "http://127.0.0.1:$PORT/get_server_info" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("device"))')
  # The same greedy tokens whichever way the weights were uploaded.
  local ids; ids=$(curl -sf "http://127.0.0.1:$PORT/generate" -H 'content-type: application/json' \
    -d '{"input_ids":[128000,791,6864,315,9822,374,12366,13,578,6864,315,9635,374],"sampling_params":{"temperature":0,"max_new_tokens":16,"ignore_eos":true}}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_ids"])')
  echo "$ids" > "$OUT/startup-$name.ids"
  printf '| %s | %.1f s to ready | device %s | greedy %s |\n' "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$dev" "$ids"
  kill $pid; wait $pid 2> /dev/null
  grep -vE "^\s*$" "$log" | sed 's/^/    /' | head -30
}
export SGL_KERNEL_CACHE=$W/kcache-startup
rm -rf "$SGL_KERNEL_CACHE" ~/.nv/ComputeCache
start cold-kernel-cache
start warm-kernel-cache
start warm-again
SGL_LOAD_PAGEABLE=1 start warm-pageable-upload
if cmp -s "$OUT/startup-warm-again.ids" "$OUT/startup-warm-pageable-upload.ids"; then
  echo "| pinned vs pageable upload | same greedy tokens |"
else
  echo "| pinned vs pageable upload | DIFFERENT greedy tokens |"
fi
