#!/usr/bin/env bash
# The server as users reach it against the engine in process, one device call: N prompts of
# exactly IN in / OUT out (random ids, ignore_eos), FP8 weights and FP8 KV cache (Q to change),
# with the server's own defaults on both sides: `bench-offline-throughput` in process, then
# `serve` and http_offline.py sending every request at once over HTTP. Writes to $OUT.
# Knobs: N (1000), IN (1000), OUT_LEN (1000), Q ("--quantization fp8 --kv-cache-dtype fp8_e4m3").
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
N=${N:-1000}; I=${IN:-1000}; O=${OUT_LEN:-1000}
Q=${Q---quantization fp8 --kv-cache-dtype fp8_e4m3}
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
echo "== in process: $N prompts, $I in / $O out, $Q"
timeout 240 $B bench-offline-throughput --model $W/ckpt --dataset-name random --random-input-len $I \
  --random-output-len $O --random-range-ratio 1 --num-prompts $N $Q 2>&1 | grep -E '^\{|^\| random|rror|KV pool' | tee $OUT/inproc.txt
echo "== over HTTP: the same workload, every request at once"
$E serve --model-path $W/ckpt --device cuda --skip-tokenizer-init --port 30000 $Q > $OUT/serve.log 2>&1 &
pid=$!
for _ in $(seq 1 120); do curl -sf localhost:30000/health >/dev/null && break; sleep 1; done
curl -s localhost:30000/get_server_info | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("max_running_requests","chunked_prefill_size","max_total_num_tokens","quantization","kv_cache_dtype")})' | tee $OUT/server-info.txt
vocab=$(python3 -c "import json; print(json.load(open('$W/ckpt/config.json'))['vocab_size'])")
timeout 300 python3 scripts/gpu/http_offline.py 30000 $N $I $O $vocab | tee $OUT/http.txt
kill $pid; wait $pid 2>/dev/null
python3 - $OUT <<'PY'
import json, sys
o = sys.argv[1]
a = [json.loads(l) for l in open(f"{o}/inproc.txt") if l.startswith("{")][-1]
b = [json.loads(l) for l in open(f"{o}/http.txt") if l.startswith("{")][-1]
print(f"| output tok/s | in process {a['output_tok_s']:.0f} | HTTP {b['output_tok_s']:.0f} | HTTP / in process {b['output_tok_s'] / a['output_tok_s']:.3f} | HTTP failed {b['failed']} |")
PY
