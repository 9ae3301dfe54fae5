#!/usr/bin/env bash
# Tensor parallelism in one device call on a machine with TP GPUs (default 2): the all-reduce
# alone (checked against host sums, timed, bus bandwidth against the GPU-to-GPU copy peak);
# greedy parity of tp TP against tp 1 (batch 1, 8, 64 and a cached prefix); batch-1 decode
# tok/s and the TTFT of a 1024-token prompt at tp 1 and tp TP on the same machine; offline
# throughput at tp TP against TP tp-1 engines, one per GPU, each given its share of the
# prompts (the best any router could do with TP replicas). Expects the binary in .dev/gpu
# (scripts/gpu/README.md) and writes to $OUT.
#
# Knobs: TP (2), QUANT=fp8 (every engine run with --quantization fp8), NUM_PROMPTS (400: offline
# prompts, in/out uniform 1..1024), SKIP_OFFLINE=1,
# CHECK=1 (also the transformers comparison of run.sh at tp 1 and tp TP; ~3 minutes more),
# BUDGET_S (540).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
TP=${TP:-2}
Q=${QUANT:+--quantization $QUANT}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|tensor parallel|KV pool|loaded|TP PARITY|all-reduce"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -5
# NCCL: the system's, else the nvidia-nccl wheel that PyTorch brings.
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NCCL from $NCCL_DIR"
fi

stage "all-reduce alone, $TP GPUs" 90 $B bench-all-reduce --tp-size $TP 2>&1 | tee $OUT/all-reduce.txt

if [ -f $W/ckpt/config.json ]; then echo "== checkpoint: reusing $W/ckpt"
else stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi

python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/parity 32
for tp in 1 $TP; do
  stage "greedy run at tp $tp" 120 $B check-reference --model $W/ckpt --prompts $W/parity/prompts.json \
    --out $W/parity/tp$tp --tp-size $tp --cuda-graph-max-bs 64 $Q 2>&1 | keep
done
python3 scripts/gpu/tp_compare.py compare $W/parity/tp1 $W/parity/tp$TP | tee $OUT/parity.txt

if [ -n "$CHECK" ]; then
  # The same transformers comparison as run.sh's CHECK=1, for tp 1 and tp TP: each must come
  # out within the bf16 spread of the fp32 reference.
  mkdir -p $W/ref
  if stage "transformers reference" 300 python3 scripts/gpu/hf_ref.py $W/ckpt $W/ref 64; then
    for tp in 1 $TP; do
      mkdir -p $W/ref-tp$tp; cp $W/ref/ref.npz $W/ref/prompts.json $W/ref-tp$tp/
      stage "engine at tp $tp on the reference prompts" 120 $B check-reference --model $W/ckpt \
        --prompts $W/ref/prompts.json --out $W/ref-tp$tp --tp-size $tp --cuda-graph-max-bs 64 2>&1 | keep
      echo "== transformers comparison, tp $tp"
      python3 scripts/gpu/compare.py $W/ref-tp$tp | tee $OUT/check-tp$tp.txt
    done
  fi
fi

for tp in 1 $TP; do
  stage "batch-1 decode (in 128, out 256) and TTFT of 1024 tokens at tp $tp" 120 $B bench-one-batch \
    --model $W/ckpt --batch 1 --input 128 --output 256 --gemv on --ttft-input 1024 --tp-size $tp $Q 2>&1 \
    | keep | tee $OUT/one-batch-tp$tp.txt
done

[ -n "$SKIP_OFFLINE" ] && { echo "== done in $(elapsed)s"; exit 0; }
N=${NUM_PROMPTS:-400}
OFF="--model $W/ckpt --dataset-name random --random-input-len 1024 --random-output-len 1024"
stage "offline random, $N prompts, tp $TP" 150 $B bench-offline-throughput $OFF --num-prompts $N --tp-size $TP $Q 2>&1 \
  | keep | tee $OUT/offline-tp$TP.txt
echo "== offline random, $N prompts split over $TP tp-1 engines (one per GPU, run at once)" >&2
for g in $(seq 0 $((TP - 1))); do
  CUDA_VISIBLE_DEVICES=$g stage "offline tp 1 on GPU $g" 150 $B bench-offline-throughput $OFF \
    --num-prompts $((N / TP)) --seed $((g + 1)) $Q > $OUT/offline-tp1-gpu$g.txt 2>&1 &
done
wait
grep -hE "^\{|^\|" $OUT/offline-tp1-gpu*.txt
python3 - "$OUT" "$TP" <<'PY' || true
import json, sys, glob
out, tp = sys.argv[1], int(sys.argv[2])
def last(p):
    rows = [json.loads(l) for l in open(p) if l.startswith("{")]
    return rows[-1] if rows else None
t = last(f"{out}/offline-tp{tp}.txt")
reps = [last(p) for p in sorted(glob.glob(f"{out}/offline-tp1-gpu*.txt"))]
if t and all(reps):
    # the replicas ran at once: their combined rate is the tokens of all over the slowest wall time
    wall = max(r["seconds"] for r in reps)
    o = sum(r["output_tokens"] for r in reps) / wall
    print(f"| offline output tok/s | tp {tp}: {t['output_tok_s']:.0f} | {tp} x tp 1: {o:.0f} | ratio {t['output_tok_s'] / o:.2f} |")
else:
    print("offline comparison: a run did not finish")
PY
echo "== done in $(elapsed)s"
