#!/usr/bin/env bash
# One device call (about 9 minutes at most): kernel checks, the decode GEMV micro-benchmark, a
# random Llama-3.1-8B-shaped checkpoint, batch-1 decode with the GEMV on and off (roofline %),
# TTFT of a 1024-token prompt, offline throughput through the engine's scheduler (random
# dataset, then the generated-shared-prefix dataset with the radix cache on and off), and
# transformers as the peer. Every stage has its own time limit, so one slow stage cannot eat
# the call. Expects the binaries in .dev/gpu (see scripts/gpu/README.md). Writes to $OUT.
#
# Knobs (environment): SCHED_BATCH1=1 (one request through the scheduler, overlap on and off),
# SKIP_RANDOM=1 (no offline random run), SKIP_OFFLINE=1 (stop after the checks and batch-1 benchmarks), GEMV_MODE (ablate: bench-one-batch --gemv mode), SKIP_OVERLAP_CHECK=1,
# OVERLAP_AB=1 (the offline random run again with --disable-overlap-schedule), NUM_PROMPTS (300), GSP_GROUPS (16), GSP_PER_GROUP (16),
# GSP_SYSTEM_LEN (2048), GSP_QUESTION_LEN (128), GSP_OUTPUT_LEN (256), SKIP_HF_PEER=1,
# ATTN_SWEEP=1,8,64 (decode steps with the one-launch and the three-launch decode attention at
# those batch sizes), SKIP_CHECKS=1 (no kernel checks, GEMV micro-benchmark or batch-1 benchmark), CHECK=1 (also the transformers greedy comparison; adds minutes), BUDGET_S (540: stages that would start past it are skipped).
#
# Scaled down: the targets are 1000 random prompts and 64 shared-prefix groups; at ~6K output
# tok/s on an H100 they take ~85 s and ~4 minutes, too much beside every other stage in one
# call. Set NUM_PROMPTS=1000 GSP_GROUPS=64 SKIP_CHECKS=1 in a call of their own.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
E=$D/sgl-engine; B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|^GEMV|panicked|[Ee]rror|warm-up|progress|FAIL|seed"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
date -u

if [ -z "$SKIP_CHECKS" ]; then
stage "kernel checks" 150 $D/kernel-check 2>&1 | grep -vE "^(PASS|FAIL) " | tee $OUT/kernel-check.txt
grep -q " 0 failed" $OUT/kernel-check.txt || echo "KERNEL CHECK FAILED (see above)"
stage "GEMV micro-benchmark (Llama-3.1-8B shapes)" 75 $D/kernel-check bench-gemv 2>&1 \
  | grep -E "^\||bandwidth|GEMMs of|[Ee]rror" | tee $OUT/gemv-bench.txt
[ -z "$SKIP_DECODE_BENCH" ] && stage "one decode step in a CUDA graph: norm fusion, PDL, prefetch depth" 120 \
  $D/kernel-check bench-decode 2>&1 | grep -vE "^\s*$" | tee $OUT/decode-bench.txt
fi

if [ -f $W/ckpt/config.json ]; then echo "== checkpoint: reusing $W/ckpt"
else stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi

if [ -n "$CHECK" ]; then
  if stage "transformers reference" 300 python3 scripts/gpu/hf_ref.py $W/ckpt $W 64; then
    stage "engine check" 120 $B check-reference --model $W/ckpt --prompts $W/prompts.json --out $W \
      --cuda-graph-max-bs 64 2>&1 | grep -vE "^\s*$"
    python3 scripts/gpu/compare.py $W || echo "E2E CHECK FAILED"
  fi
fi

[ -z "$SKIP_CHECKS" ] && stage "bench one-batch: batch 1, in 128, out 256, decode forms ($GEMV_MODE); TTFT of 1024 tokens" 200 \
  $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 --gemv ${GEMV_MODE:-ablate} --ttft-input 1024 ${ATTN_SWEEP:+--attn-sweep $ATTN_SWEEP} 2>&1 \
  | keep | tee $OUT/one-batch.txt

if [ -z "$SKIP_OVERLAP_CHECK" ]; then
  stage "overlap schedule vs synchronous: same tokens" 150 python3 scripts/gpu/overlap_check.py $E $W/ckpt 2>&1 \
    | grep -E "^\||CHECK|Error|error" | tee $OUT/overlap-check.txt
fi

if [ -n "$SCHED_BATCH1" ]; then
  for mode in overlap sync; do
    extra=""; [ $mode = sync ] && extra="--disable-overlap-schedule"
    stage "one request (in 128, out 256) through the scheduler, $mode" 90 $B bench-offline-throughput \
      --model $W/ckpt --dataset-name random --num-prompts 1 --random-input-len 128 --random-output-len 256 \
      --random-range-ratio 1 --warmup-requests 2 $extra 2>&1 | keep | tee $OUT/sched-batch1-$mode.txt
  done
fi

if [ -n "$SKIP_OFFLINE" ]; then echo "== offline benchmarks skipped (SKIP_OFFLINE)"; echo "== done in $(elapsed)s"; exit 0; fi
N=${NUM_PROMPTS:-300}
if [ -z "$SKIP_RANDOM" ]; then
[ "$N" -lt 1000 ] && echo "== offline random SCALED DOWN from 1000 to $N prompts (scheduler path, see the head of run.sh)"
echo "== offline random: $N prompts, in/out uniform 1..1024, through the scheduler"
stage "offline random" ${OFFLINE_TIMEOUT:-150} $B bench-offline-throughput --model $W/ckpt --dataset-name random \
  --num-prompts $N --random-input-len 1024 --random-output-len 1024 2>&1 \
  | keep | tee $OUT/offline-random.txt
if [ -n "$OVERLAP_AB" ]; then
  stage "offline random, overlap schedule off" ${OFFLINE_TIMEOUT:-150} $B bench-offline-throughput --model $W/ckpt \
    --dataset-name random --num-prompts $N --random-input-len 1024 --random-output-len 1024 \
    --disable-overlap-schedule 2>&1 | keep | tee $OUT/offline-random-sync.txt
fi
fi

if [ -n "$SKIP_GSP" ]; then echo "== shared-prefix benchmarks skipped (SKIP_GSP)"; echo "== done in $(elapsed)s"; exit 0; fi
G=${GSP_GROUPS:-16}; P=${GSP_PER_GROUP:-16}
[ "$G" -lt 64 ] && echo "== generated-shared-prefix SCALED DOWN from 64 to $G groups (scheduler path, see the head of run.sh)"
GSP="--dataset-name generated-shared-prefix --gsp-num-groups $G --gsp-prompts-per-group $P \
  --gsp-system-prompt-len ${GSP_SYSTEM_LEN:-2048} --gsp-question-len ${GSP_QUESTION_LEN:-128} \
  --gsp-output-len ${GSP_OUTPUT_LEN:-256}"
# Scale the shared-prefix runs to what is left: on an H100 both together take about 3 s per
# group of 16 prompts plus 2 x 20 s of start-up; radix off takes about 2x radix on.
left=$(( BUDGET_S - $(elapsed) - ${HF_RESERVE_S:-60} ))
need=$(( 40 + G * P * 3 / 16 ))
if [ "$left" -lt "$need" ]; then
  G2=$(( (left - 40) * 16 / (3 * P) )); [ "$G2" -lt 2 ] && G2=2
  echo "== generated-shared-prefix SCALED DOWN from $G to $G2 groups (${left}s left for both runs)"
  GSP=${GSP/--gsp-num-groups $G /--gsp-num-groups $G2 }
  G=$G2
fi
echo "== generated-shared-prefix: $G groups x $P prompts, radix cache on, then off"
stage "shared prefix, radix on" $(( left * 2 / 5 > 60 ? left * 2 / 5 : 60 )) \
  $B bench-offline-throughput --model $W/ckpt $GSP 2>&1 | keep | tee $OUT/gsp-radix-on.txt
stage "shared prefix, radix off" $(( left * 3 / 5 > 90 ? left * 3 / 5 : 90 )) \
  $B bench-offline-throughput --model $W/ckpt $GSP --disable-radix-cache 2>&1 | keep | tee $OUT/gsp-radix-off.txt
python3 - "$OUT" <<'PY' || true
import json, sys
def last(path):
    try:
        rows = [json.loads(l) for l in open(path) if l.startswith("{")]
        return rows[-1] if rows else None
    except OSError:
        return None
on, off = last(f"{sys.argv[1]}/gsp-radix-on.txt"), last(f"{sys.argv[1]}/gsp-radix-off.txt")
if on and off:
    print(f"| radix on / off | output tok/s {on['output_tok_s']:.0f} / {off['output_tok_s']:.0f} = "
          f"{on['output_tok_s'] / off['output_tok_s']:.2f}x | total tok/s {on['total_tok_s']:.0f} / "
          f"{off['total_tok_s']:.0f} = {on['total_tok_s'] / off['total_tok_s']:.2f}x | cache hit "
          f"{100 * on['cache_hit_rate']:.1f}% / {100 * off['cache_hit_rate']:.1f}% |")
else:
    print("radix on/off ratio: a run did not finish")
PY

if [ -z "$SKIP_HF_PEER" ]; then
  stage "transformers peer (batch 128, in 512, out 128)" 120 python3 scripts/gpu/hf_bench.py $W/ckpt 128 512 128 \
    2>&1 | grep -E "^\||Error" | tee $OUT/hf-peer.txt
fi
echo "== done in $(elapsed)s"
date -u
