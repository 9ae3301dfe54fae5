"""Write a checkpoint's FP8 form in the compressed-tensors layout the Hub publishes for
Llama-family models (format float-quantized: e4m3 linear weights with one f32 `weight_scale`
per output row, `[out, 1]`; activations quantized per token at run time; `lm_head` and every
other tensor left as they are). Each row is scaled by max|row| / 448 and rounded to e4m3 (nearest
even, saturated): the same arithmetic --quantization fp8 applies at load, so the engine must
give the same logits on both.
Usage: fp8_ckpt.py SRC_DIR DST_DIR"""
import json, os, shutil, sys
import torch
from safetensors.torch import load_file, save_file

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
index = {}
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if name.endswith(".safetensors"):
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
            "kv_cache_scheme": None,
        }
        json.dump(cfg, open(os.path.join(dst, name), "w"), indent=2)
    elif os.path.isfile(path):
        shutil.copy(path, os.path.join(dst, name))
if os.path.exists(os.path.join(src, "model.safetensors.index.json")):
    json.dump({"metadata": {}, "weight_map": index},
              open(os.path.join(dst, "model.safetensors.index.json"), "w"))
size = sum(os.path.getsize(os.path.join(dst, f)) for f in os.listdir(dst))
print(f"compressed-tensors FP8 copy of {src} in {dst}: {size / 1e9:.2f} GB")
