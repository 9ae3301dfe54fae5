#!/usr/bin/env bash
# Prefill's all-reduces hidden behind the row-parallel GEMMs at tp 2 (`SGL_PREFILL_AR_CHUNKS`:
# o_proj and down_proj of a prefill pass of at least 256 tokens run in that many chunks of
# token rows, each chunk's all-reduce on a second stream while the next chunk's GEMM runs;
# 1 is the previous behaviour). One device call on 2 GPUs, within BUDGET_S (420):
#   - the TTFT of a 1024- and a 4096-token prompt (bench-one-batch --ttft-input, median of 3)
#     at tp 1, then at tp 2 with chunks 1, 2 and 4, each as a ratio to tp 1's (goal at 1024:
#     0.6x). At 1024 tokens a chunk of 2 is 4 MB (one-shot kernel), of 4 2 MB (the decode set
#     of one-shot buffers); at 4096 a chunk of 2 is 16 MB (NCCL), of 4 8 MB (one-shot);
#   - the same with --quantization fp8: tp 1, tp 2 chunks 1 and 2;
#   - greedy parity (tp_compare.py prompts: batch 1, 8, 64, a cached prefix; 32 steps) at tp 2
#     with chunks 2 against chunks 1 and against tp 1 (prefill passes of 256 tokens or more
#     are chunked: the b8, b64 and prefix cases; b1 has 100 tokens);
# and one summary table. Expects the binaries in .dev/gpu (scripts/gpu/build.sh); writes to $OUT.
# Knobs: BUDGET_S (420), ROUNDS (1: how many times the tp-2 bf16 TTFT runs repeat, the table
# gives the lowest of them), SKIP_FP8=1.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; rm -f "$OUT"/ttft-*.txt "$OUT"/parity-*.txt
D=.dev/gpu; W=/tmp/sgl; mkdir -p $W
export SGL_KERNEL_CACHE=$W/kcache PYTHONUNBUFFERED=1
B=$D/sgl-bench
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-420}
ROUNDS=${ROUNDS:-1}
. scripts/gpu/stage.sh
keep() { grep --line-buffered -E "^\||^\{|panicked|[Ee]rror|tensor parallel|TP PARITY"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -3
# NCCL: the system's, else the nvidia-nccl wheel that PyTorch brings.
if ! ldconfig -p | grep -q 'libnccl.so.2'; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  [ -f "$NCCL_DIR/libnccl.so.2" ] || NCCL_DIR=$(dirname "$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$NCCL_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NCCL from $NCCL_DIR"
fi

if [ -f $W/ckpt/config.json ]; then echo "== checkpoint: reusing $W/ckpt"
else stage "checkpoint" 240 python3 scripts/gpu/make_ckpt.py $W/ckpt 32 || { echo "no checkpoint"; exit 1; }
fi

# ttft LABEL TP CHUNKS N [engine flags...]: the TTFT of an N-token prompt into $OUT/ttft-LABEL-N.txt
ttft() {
  local label=$1 tp=$2 chunks=$3 n=$4; shift 4
  stage "TTFT of $n tokens, $label" 90 env SGL_PREFILL_AR_CHUNKS=$chunks $B bench-one-batch \
    --model $W/ckpt --batch 1 --input 128 --output 16 --gemv on --ttft-input $n --tp-size $tp "$@" 2>&1 \
    | keep | grep -E "ttft_input|panicked|[Ee]rror" | tee -a $OUT/ttft-$label-$n.txt
}

# bf16 first: the figures the goal is about.
for n in 1024 4096; do ttft tp1 1 1 $n; done
for r in $(seq 1 "$ROUNDS"); do
  for c in 1 2 4; do
    for n in 1024 4096; do ttft tp2-c$c 2 $c $n; done
  done
done

python3 scripts/gpu/tp_compare.py prompts $W/ckpt $W/ovl 32
for run in "tp1 1 1" "tp2-c1 2 1" "tp2-c2 2 2"; do
  set -- $run
  stage "greedy run, $1" 120 env SGL_PREFILL_AR_CHUNKS=$3 $B check-reference --model $W/ckpt \
    --prompts $W/ovl/prompts.json --out $W/ovl/$1 --tp-size $2 --cuda-graph-max-bs 64 2>&1 | keep
done
echo "== greedy, tp 2: chunks 2 against chunks 1"
python3 scripts/gpu/tp_compare.py compare $W/ovl/tp2-c1 $W/ovl/tp2-c2 | tee $OUT/parity-c2-vs-c1.txt
echo "== greedy: tp 2 chunks 2 against tp 1"
python3 scripts/gpu/tp_compare.py compare $W/ovl/tp1 $W/ovl/tp2-c2 | tee $OUT/parity-c2-vs-tp1.txt

if [ -z "$SKIP_FP8" ]; then
  for n in 1024 4096; do
    ttft fp8-tp1 1 1 $n --quantization fp8
    for c in 1 2; do ttft fp8-tp2-c$c 2 $c $n --quantization fp8; done
  done
fi

echo "== summary"
python3 - "$OUT" <<'PY' | tee $OUT/summary.txt
import json, os, sys
out = sys.argv[1]

def ttft(label, n):
    """The lowest TTFT (ms) of the runs of LABEL at N tokens, or None."""
    p = f"{out}/ttft-{label}-{n}.txt"
    if not os.path.exists(p):
        return None
    ms = [json.loads(l)["ttft_ms"] for l in open(p) if l.startswith("{") and "ttft_input" in l]
    return min(ms) if ms else None

def cell(v, base):
    if v is None:
        return "—", "—"
    return f"{v:.2f}", (f"{v / base:.3f}x" if base else "—")

print("| run | TTFT 1024 ms | vs tp 1 | TTFT 4096 ms | vs tp 1 |")
print("|---|---|---|---|---|")
rows = [("bf16, tp 1", "tp1", "tp1"),
        ("bf16, tp 2, chunks 1 (before)", "tp2-c1", "tp1"),
        ("bf16, tp 2, chunks 2 (default)", "tp2-c2", "tp1"),
        ("bf16, tp 2, chunks 4", "tp2-c4", "tp1"),
        ("FP8, tp 1", "fp8-tp1", "fp8-tp1"),
        ("FP8, tp 2, chunks 1 (before)", "fp8-tp2-c1", "fp8-tp1"),
        ("FP8, tp 2, chunks 2 (default)", "fp8-tp2-c2", "fp8-tp1")]
for name, label, base in rows:
    cells = []
    for n in (1024, 4096):
        cells += cell(ttft(label, n), ttft(base, n))
    print(f"| {name} | " + " | ".join(cells) + " |")

def parity(name):
    """Totals of a tp_compare.py table: sequences, identical, near-tie, elsewhere, worst diff."""
    p = f"{out}/parity-{name}.txt"
    tot = [0, 0, 0, 0]
    worst = 0.0
    seen = False
    for l in open(p) if os.path.exists(p) else []:
        f = [x.strip() for x in l.strip().strip("|").split("|")]
        if len(f) == 6 and f[1].isdigit():
            seen = True
            tot = [a + int(b) for a, b in zip(tot, [f[1], f[3], f[4], f[5]])]
            worst = max(worst, float(f[2]))
    if not seen:
        return "no result"
    return (f"{tot[1]} of {tot[0]} sequences identical, {tot[2]} diverge at a near-tie, "
            f"{tot[3]} elsewhere; prefill logits rel. diff {worst:.2e} (worst row)")

print(f"| greedy, tp 2: chunks 2 against chunks 1 | {parity('c2-vs-c1')} | | | |")
print(f"| greedy: tp 2 chunks 2 against tp 1 | {parity('c2-vs-tp1')} | | | |")
PY
echo "== done in $(elapsed)s"
