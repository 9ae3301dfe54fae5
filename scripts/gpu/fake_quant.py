"""Write a copy of a checkpoint whose linear-layer weights are what --quantization fp8 makes of
them, back in bf16: each output row scaled by max|row| / 448, rounded to e4m3 (nearest even,
saturated), scaled back. The engine in bf16 on this copy runs the FP8 weights' values with bf16
arithmetic, so comparing it with the engine's FP8 run on the original isolates the FP8
arithmetic (the GEMV's scale applied after the sum, the per-token activation quantization of
the prefill GEMMs) from the quantization of the weights itself.
Usage: fake_quant.py SRC_DIR DST_DIR"""
import os, shutil, sys
import torch
from safetensors.torch import load_file, save_file

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if name.endswith(".safetensors"):
        tensors = load_file(path, device="cuda")
        for key, w in tensors.items():
            if key.endswith(".weight") and key.split(".")[-2] in LINEAR:
                wf = w.float()
                amax = wf.abs().amax(dim=1, keepdim=True)
                scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
                q = (wf / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
                tensors[key] = (q.float() * scale).to(torch.bfloat16)
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, os.path.join(dst, name),
                  metadata={"format": "pt"})
    elif os.path.isfile(path):
        shutil.copy(path, os.path.join(dst, name))
print(f"fake-quantized copy of {src} in {dst}")
