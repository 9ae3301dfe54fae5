#!/usr/bin/env bash
# A Llama-3.1-70B-shaped checkpoint (random bf16 weights, 141 GB) at tensor parallel TP (4 or 8)
# on a machine with that many GPUs, in phases that fit one device call each (a phase that finds
# no checkpoint writes it first, ~2 minutes):
#   PHASE=1  the all-reduce alone; batch-1 decode and the TTFT of a 1024-token prompt, bf16 and
#            FP8; the engine's greedy run on the parity prompts, bf16 and FP8
#   PHASE=2  parity: the first 8 layers of the same checkpoint against transformers in fp32
#            (compare.py: within the spread of transformers in bf16), and the whole model
#            against transformers in bf16 over the same GPUs (device_map="auto"; tp_compare.py);
#            FP8 against bf16 at tp TP
#   PHASE=3  offline throughput (NUM_PROMPTS random prompts, in/out 1..1024), bf16 and FP8; the
#            llama-70b example's engine flags (ARGS_FILE, rendered by `sgl-operator render`)
#            serving the checkpoint through HTTP
# Expects the binary in .dev/gpu (scripts/gpu/README.md) and writes to $OUT.
# Knobs: TP (4), PHASE (1), NUM_PROMPTS (1000), BUDGET_S (570), ARGS_FILE (.dev/gpu/l70-args.txt);
# phase 3: OFFLINE_MODES (bf16 fp8; fp8kv = FP8 weights and an fp8_e5m2 KV cache), ONE_BATCH_MODES
# (none; fp8 and/or fp8kv: batch-1 decode and TTFT before the example).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
E=$D/sgl-engine; B=$D/sgl-bench
TP=${TP:-4}
PHASE=${PHASE:-1}
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|tensor parallel|KV pool|loaded|all-reduce"; }
C=$W/ckpt70; C8=$W/ckpt70-8

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -$((TP + 1))
df -h /tmp | tail -1; free -g | head -2
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

if [ -f $C/config.json ]; then echo "== checkpoint: reusing $C"
else
  stage "70B-shaped checkpoint" 300 python3 scripts/gpu/make_ckpt.py $C 80 70b 2>&1 | tee -a $OUT/checkpoint.txt \
    || { echo "no checkpoint"; exit 1; }
  python3 scripts/gpu/make_ckpt.py --truncate $C $C8 8
fi
du -sh -L $C 2>/dev/null | tail -1

if [ "$PHASE" = 1 ]; then
  stage "all-reduce alone, $TP GPUs" 90 $B bench-all-reduce --tp-size $TP 2>&1 | tee $OUT/all-reduce.txt
  for q in bf16 fp8; do
    Q=; [ $q = fp8 ] && Q="--quantization fp8"
    stage "batch-1 decode (in 128, out 256) and TTFT of 1024 tokens, tp $TP, $q" 150 $B bench-one-batch \
      --model $C --batch 1 --input 128 --output 256 --gemv on --ttft-input 1024 --tp-size $TP $Q 2>&1 \
      | keep | tee $OUT/one-batch-tp$TP-$q.txt
  done
  python3 scripts/gpu/tp_compare.py prompts $C $W/parity 32
  for q in bf16 fp8; do
    Q=; [ $q = fp8 ] && Q="--quantization fp8"
    stage "greedy run on the parity prompts, tp $TP, $q" 150 $B check-reference --model $C \
      --prompts $W/parity/prompts.json --out $W/parity/tp$TP-$q --tp-size $TP --cuda-graph-max-bs 64 $Q 2>&1 | keep
  done
  tar -C $W -czf $OUT/parity-engine.tgz parity
fi

if [ "$PHASE" = 2 ]; then
  # The verdict at this shape: 8 layers fit one GPU in fp32, so compare.py's test applies.
  mkdir -p $W/ref8 $W/ref8-tp$TP
  stage "transformers fp32 + bf16 on the first 8 layers" 200 python3 scripts/gpu/hf_ref.py $C8 $W/ref8 32 && {
    cp $W/ref8/ref.npz $W/ref8/prompts.json $W/ref8-tp$TP/
    stage "engine at tp $TP on the 8-layer reference prompts" 120 $B check-reference --model $C8 \
      --prompts $W/ref8/prompts.json --out $W/ref8-tp$TP --tp-size $TP --cuda-graph-max-bs 64 2>&1 | keep
    echo "== 8 layers of the 70B shape: engine at tp $TP against transformers fp32"
    python3 scripts/gpu/compare.py $W/ref8-tp$TP | tee $OUT/check8-tp$TP.txt
  }
  # The whole model: transformers in bf16 over the GPUs, on the parity prompts of phase 1.
  if [ -f $W/parity/tp$TP-bf16/ours.json ]; then
    mkdir -p $W/hf80; cp $W/parity/prompts.json $W/hf80/
    export HF_BF16_ONLY=1
    stage "transformers bf16, 80 layers, device_map=auto" 300 python3 scripts/gpu/hf_ref.py $C $W/hf80 32 \
      && { echo "== 80 layers: engine tp $TP bf16 against transformers bf16"
           python3 scripts/gpu/tp_compare.py compare $W/hf80 $W/parity/tp$TP-bf16 | tee $OUT/parity80-hf-vs-tp$TP.txt; }
    unset HF_BF16_ONLY
    echo "== 80 layers: engine tp $TP, FP8 against bf16"
    python3 scripts/gpu/tp_compare.py compare $W/parity/tp$TP-bf16 $W/parity/tp$TP-fp8 | tee $OUT/parity80-fp8-vs-bf16.txt
  else
    echo "== no engine run of phase 1 on this machine: the 80-layer comparison is skipped"
  fi
fi

if [ "$PHASE" = 3 ]; then
  N=${NUM_PROMPTS:-1000}
  OFF="--model $C --dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts $N"
  for q in ${OFFLINE_MODES:-bf16 fp8}; do
    Q=; [ $q = fp8 ] && Q="--quantization fp8"
    [ $q = fp8kv ] && Q="--quantization fp8 --kv-cache-dtype fp8_e5m2"
    stage "offline random, $N prompts, tp $TP, $q" 240 $B bench-offline-throughput $OFF --tp-size $TP $Q 2>&1 \
      | keep | tee $OUT/offline-tp$TP-$q.txt
  done
  if [ -n "$ONE_BATCH_MODES" ]; then
    for q in $ONE_BATCH_MODES; do
      Q="--quantization fp8"; [ $q = fp8kv ] && Q="--quantization fp8 --kv-cache-dtype fp8_e5m2"
      stage "batch-1 decode and TTFT of 1024 tokens, tp $TP, $q" 150 $B bench-one-batch \
        --model $C --batch 1 --input 128 --output 256 --gemv on --ttft-input 1024 --tp-size $TP $Q 2>&1 \
        | keep | tee $OUT/one-batch-tp$TP-$q.txt
    done
  fi
  A=${ARGS_FILE:-$D/l70-args.txt}
  if [ -f "$A" ]; then
    # The example's flags as rendered, with the model path pointing at the checkpoint here.
    mapfile -t args < <(sed "s#^meta-llama/Llama-3.1-70B-Instruct\$#$C#" "$A")
    echo "== the llama-70b example's engine: sgl-engine serve ${args[*]}"
    $E serve "${args[@]}" --skip-tokenizer-init > $OUT/example-serve.log 2>&1 &
    pid=$!
    ok=
    for _ in $(seq 1 150); do
      curl -sf localhost:30000/health >/dev/null && { ok=1; break; }
      kill -0 $pid 2>/dev/null || break
      sleep 1
    done
    if [ -n "$ok" ]; then
      curl -s localhost:30000/generate -H 'content-type: application/json' \
        -d '{"input_ids":[128000,791,6864,315,9822,374],"sampling_params":{"temperature":0,"max_new_tokens":16}}' \
        | tee $OUT/example-generate.json; echo
      curl -s localhost:30000/get_server_info | tee $OUT/example-server-info.json | head -c 600; echo
    else
      echo "== the example's engine did not become healthy"; tail -20 $OUT/example-serve.log
    fi
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    grep -E "tensor parallel|KV pool|loaded|[Ee]rror" $OUT/example-serve.log | head -12
  fi
fi
echo "== phase $PHASE done in $(elapsed)s"
