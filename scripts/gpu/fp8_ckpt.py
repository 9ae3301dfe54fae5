"""Write a checkpoint's FP8 form in the compressed-tensors layout the Hub publishes for
Llama-family models (format float-quantized: e4m3 linear weights with one f32 `weight_scale`
per output row, `[out, 1]`; activations quantized per token at run time; `lm_head` and every
other tensor left as they are). Each row is scaled by max|row| / 448 and rounded to e4m3 (nearest
even, saturated): the same arithmetic --quantization fp8 applies at load, so the engine must
give the same logits on both.

KV_SCALES=1 also calibrates KV-cache scales and declares them, as compressed-tensors writes a
checkpoint quantized with a kv_cache_scheme (8-bit float, one static scale per tensor): the bf16
model runs in transformers over KV_CALIB_PROMPTS (8) random prompts of KV_CALIB_LEN (512) tokens;
each layer's K scale is max |k| / 448 over them, k after RoPE (what the cache stores, read from
transformers' KV cache), and its V scale max |v| / 448. They are written as f32 tensors
`model.layers.N.self_attn.k_scale` / `v_scale` in a file of their own, kv_cache_scales.safetensors
(listed in the index), so a copy without them is the other files' links and an edited config.
Usage: [KV_SCALES=1] fp8_ckpt.py SRC_DIR DST_DIR"""
import json, os, shutil, sys
import torch
from safetensors.torch import load_file, save_file

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KV_FILE = "kv_cache_scales.safetensors"
KV_SCHEME = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
             "strategy": "tensor", "block_structure": None, "dynamic": False, "actorder": None,
             "observer": "minmax", "observer_kwargs": {}}


def cache_layers(cache):
    """(k, v) per layer of a transformers KV cache, across its versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    return [(kv[0], kv[1]) for kv in cache]


def calibrate_kv(src):
    """Per-layer K and V scales of the bf16 model at SRC: max |k| / 448 and max |v| / 448."""
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(src, torch_dtype=torch.bfloat16).to("cuda").eval()
    n = int(os.environ.get("KV_CALIB_PROMPTS", "8"))
    length = int(os.environ.get("KV_CALIB_LEN", "512"))
    layers = model.config.num_hidden_layers
    kmax = torch.zeros(layers, device="cuda")
    vmax = torch.zeros(layers, device="cuda")
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for first in range(0, n, 4):
            ids = torch.randint(0, model.config.vocab_size, (min(4, n - first), length),
                                generator=gen)
            out = model(input_ids=ids.to("cuda"), use_cache=True)
            for i, (k, v) in enumerate(cache_layers(out.past_key_values)):
                kmax[i] = torch.maximum(kmax[i], k.float().abs().amax())
                vmax[i] = torch.maximum(vmax[i], v.float().abs().amax())
            del out
    del model
    torch.cuda.empty_cache()
    # true divisions, as for the weight scales; an all-zero layer keeps a scale of 1
    scale = lambda m: torch.where(m > 0, m / torch.full_like(m, 448.0), torch.ones_like(m)).cpu()
    return scale(kmax), scale(vmax), n, length


src, dst = sys.argv[1], sys.argv[2]
KV = os.environ.get("KV_SCALES") == "1"
os.makedirs(dst, exist_ok=True)
index = {}
if KV:
    ks, vs, n, length = calibrate_kv(src)
    kv_tensors = {}
    for i in range(len(ks)):
        kv_tensors[f"model.layers.{i}.self_attn.k_scale"] = ks[i : i + 1].float().contiguous()
        kv_tensors[f"model.layers.{i}.self_attn.v_scale"] = vs[i : i + 1].float().contiguous()
    save_file(kv_tensors, os.path.join(dst, KV_FILE), metadata={"format": "pt"})
    for key in kv_tensors:
        index[key] = KV_FILE
    print(f"KV-cache scales from {n} prompts of {length} tokens: K {ks.min():.3e}..{ks.max():.3e}, "
          f"V {vs.min():.3e}..{vs.max():.3e} (max |x| / 448 per layer)")
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if name.endswith(".safetensors") and name != KV_FILE:
        tensors = load_file(path, device="cuda")
        out = {}
        for key, w in tensors.items():
            if key.endswith(".weight") and key.split(".")[-2] in LINEAR:
                wf = w.float()
                amax = wf.abs().amax(dim=1, keepdim=True)
                # amax / 448 as a true division (a Python scalar divisor would be applied as
                # a multiplication by its reciprocal, which can differ by one ulp)
                scale = torch.where(amax > 0, amax / torch.full_like(amax, 448.0),
                                    torch.ones_like(amax))
                out[key] = (wf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
                out[key[: -len(".weight")] + ".weight_scale"] = scale
            else:
                out[key] = w
        for key in out:
            index[key] = name
        save_file({k: v.contiguous().cpu() for k, v in out.items()}, os.path.join(dst, name),
                  metadata={"format": "pt"})
    elif name == "model.safetensors.index.json":
        continue
    elif name == "config.json":
        cfg = json.load(open(path))
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"type": "float", "num_bits": 8, "strategy": "channel",
                            "symmetric": True, "dynamic": False, "observer": "minmax"},
                "input_activations": {"type": "float", "num_bits": 8, "strategy": "token",
                                      "symmetric": True, "dynamic": True},
                "output_activations": None}},
            "ignore": ["lm_head"],
            "kv_cache_scheme": KV_SCHEME if KV else None,
        }
        json.dump(cfg, open(os.path.join(dst, name), "w"), indent=2)
    elif os.path.isfile(path):
        shutil.copy(path, os.path.join(dst, name))
if KV or os.path.exists(os.path.join(src, "model.safetensors.index.json")):
    json.dump({"metadata": {}, "weight_map": index},
              open(os.path.join(dst, "model.safetensors.index.json"), "w"))
size = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))
print(f"compressed-tensors FP8 copy of {src} in {dst}: {size / 1e9:.2f} GB")
