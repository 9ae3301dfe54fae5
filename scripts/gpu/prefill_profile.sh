#!/usr/bin/env bash
# Where the time of a 1024-token prefill and of batch-1 decode steps goes, kernel by kernel,
# in one device call on one GPU: Nsight Compute times every kernel of a greedy run (one prompt
# of 1024 tokens, STEPS steps, decode in a CUDA graph) of the random 8B checkpoint, with QUANT's
# flags, and the durations are summed by kernel name and grid. Kernels run one at a time under
# the profiler (no overlap, no programmatic dependent launch), so the sums are an upper bound
# of what each kernel costs in the real run; their shares are what this is for. Expects the
# binaries in .dev/gpu and writes to $OUT.
#
# Knobs: QUANT ("--quantization fp8"), STEPS (6), BUDGET_S (240).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-240}
. scripts/gpu/stage.sh
Q=${QUANT---quantization fp8}
tag=$(echo "${Q:-bf16}" | tr -c 'a-z0-9\n' '_' | sed 's/^_*//')

[ -f $W/ckpt/config.json ] || stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 \
  || { echo "no checkpoint"; exit 1; }
python3 - $W/ckpt $W/prof.json ${STEPS:-6} <<'PY'
import json, sys
import numpy as np
vocab = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
rng = np.random.default_rng(3)
json.dump({"steps": int(sys.argv[3]),
           "cases": [{"name": "p1024", "prompts": [rng.integers(0, vocab, 1024).tolist()]}]},
          open(sys.argv[2], "w"))
PY
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
stage "kernel times under Nsight Compute ($Q)" 200 $NCU --clock-control none --cache-control none \
  --metrics gpu__time_duration.sum --csv --page raw \
  $B check-reference --model $W/ckpt --prompts $W/prof.json --out $W/prof-out --cuda-graph-max-bs 1 \
  $Q > $OUT/ncu-$tag.csv 2> $OUT/ncu-$tag.err
tail -3 $OUT/ncu-$tag.err
python3 scripts/gpu/ncu_sum.py $OUT/ncu-$tag.csv | tee $OUT/profile-$tag.txt
echo "== done in $(elapsed)s"
