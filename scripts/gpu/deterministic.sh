#!/usr/bin/env bash
# `--enable-deterministic-inference` on one GPU, in one device call: the same greedy request
# alone and inside batches of 1..63 random others over HTTP (deterministic_check.py), with the
# flag and without it (the default, whose GEMM algorithm, GEMV and attention splits follow the
# batch), bf16 and FP8 weights; and the flag's cost: a single request's decode rate and the
# offline throughput of N random prompts, both over HTTP (det-refT: the GEMMs' algorithm
# taken at T tokens instead of 256). Expects .dev/gpu/sgl-engine; writes to $OUT.
# Knobs: MODES ("default det det-fp8 default-fp8 det-ref1024"), N (500), ROUNDS (4), TP (1),
# BUDGET_S (560).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
. scripts/gpu/stage.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${TP:-1}" -gt 1 ] && ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || exit 1
vocab=$(python3 -c "import json; print(json.load(open('$W/ckpt/config.json'))['vocab_size'])")
N=${N:-500}
port=30000
for mode in ${MODES:-default det det-fp8 default-fp8 det-ref1024}; do
  flags="--tp-size ${TP:-1}"; ref=""
  case $mode in
    det*) flags="$flags --enable-deterministic-inference" ;;
  esac
  case $mode in
    *fp8) flags="$flags --quantization fp8" ;;
  esac
  case $mode in
    *-ref[0-9]*) ref=${mode##*-ref} ;;
  esac
  port=$((port + 1))
  [ "$(elapsed)" -gt $((BUDGET_S - 90)) ] && { echo "== $mode skipped: out of time"; continue; }
  echo "== $mode: serve $flags"
  env ${ref:+SGL_INVARIANT_GEMM_TOKENS=$ref} $E serve --model-path $W/ckpt --device cuda \
    --skip-tokenizer-init --port $port $flags > $OUT/serve-$mode.log 2>&1 &
  pid=$!
  for _ in $(seq 1 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 1; done
  curl -s localhost:$port/get_server_info | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ("enable_deterministic_inference","quantization","max_running_requests","chunked_prefill_size")})'
  timeout 200 python3 scripts/gpu/deterministic_check.py $port $vocab $mode ${ROUNDS:-4} | tee $OUT/check-$mode.txt
  # decode rate of one request: (time of 257 tokens - time of 1) / 256, best of 3
  timeout 60 python3 - $port $vocab $mode <<'PY' | tee $OUT/single-$mode.txt
import json, random, sys, time, urllib.request
port, vocab, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ids = [random.Random(3).randrange(vocab) for _ in range(128)]
def run(n):
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}).encode()
    t = time.perf_counter()
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body, headers={"content-type": "application/json"}), timeout=60).read()
    return time.perf_counter() - t
t1 = min(run(1) for _ in range(3)); t257 = min(run(257) for _ in range(3))
print(json.dumps({"mode": mode, "ttft_128_ms": t1 * 1e3, "decode_tok_s": 256 / (t257 - t1)}))
PY
  timeout 150 python3 scripts/gpu/http_offline.py $port $N 512 256 $vocab | tee $OUT/offline-$mode.txt
  kill $pid; wait $pid 2>/dev/null
  grep -E "panicked|ERROR" $OUT/serve-$mode.log | head -5
done
python3 - $OUT <<'PY'
import glob, json, os, sys
o = sys.argv[1]
def last(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")][-1]
    except (OSError, IndexError):
        return None
print("| mode | target identical to alone | alone: cached = fresh | single-request decode tok/s | TTFT 128 (ms) | offline output tok/s |")
for f in sorted(glob.glob(f"{o}/check-*.txt")):
    m = os.path.basename(f)[6:-4]
    c, s, x = last(f), last(f"{o}/single-{m}.txt"), last(f"{o}/offline-{m}.txt")
    print(f"| {m} | {c and str(c['identical']) + ' of ' + str(c['runs'])} | {c and c['fresh_equals_cached']} | {s and round(s['decode_tok_s'], 1)} | {s and round(s['ttft_128_ms'], 1)} | {x and round(x['output_tok_s'])} ({x and x['failed']} failed) |")
PY
echo "== done in $(elapsed)s"
