#!/usr/bin/env bash
# Batch-1 decode in the engine for each decode-graph split plan (SGL_DECODE_GRAPH_PLAN_LEN),
# attention form (SGL_DECODE_ATTN_FUSION) and PDL trigger point (SGL_PDL_EARLY_TRIGGER),
# then the TTFT of a 1024-token prompt per trigger point. Expects .dev/gpu/sgl-bench.
W=/tmp/sgl; B=.dev/gpu/sgl-bench
export SGL_KERNEL_CACHE=$W/kcache
[ -f $W/ckpt/config.json ] || python3 scripts/gpu/make_ckpt.py $W/ckpt 32 2>&1 | tail -1
for trig in end early; do
  for len in 131072 4096 1024 256; do
    for attn in fused separate; do
      ex="SGL_DECODE_ATTN_FUSION=1"; [ $attn = separate ] && ex="SGL_DECODE_ATTN_FUSION=0"
      tr=""; [ $trig = early ] && tr="SGL_PDL_EARLY_TRIGGER=1"
      r=$(env $ex $tr SGL_DECODE_GRAPH_PLAN_LEN=$len timeout 60 $B bench-one-batch --model $W/ckpt --batch 1 --input 128 --output 256 2>/dev/null | grep '^{' | tail -1)
      echo "trigger=$trig plan_len=$len attn=$attn $(echo "$r" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read() or "{}"); print(d.get("decode_ms_per_step"), d.get("roofline_fraction"), d.get("copy_bw_gb_s"))')"
    done
  done
done
for trig in end early; do
  tr=""; [ $trig = early ] && tr="SGL_PDL_EARLY_TRIGGER=1"
  env $tr timeout 60 $B bench-one-batch --model $W/ckpt --batch 1 --input 16 --output 2 --ttft-input 1024 2>/dev/null | grep '^| 1024' | sed "s/^/trigger=$trig TTFT /"
done
