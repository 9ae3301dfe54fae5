"""transformers reference for the engine check: writes prompts.json (for the engine) and
ref.npz (greedy tokens, prefill logits, top-2 margins). The reference is transformers in fp32
on the checkpoint's bf16 weights (upcast, TF32 off); the same run in bf16 is saved beside it
(keys with a `bf16_` prefix) to show the spread that bf16 arithmetic alone causes.
Usage: hf_ref.py CKPT OUT_DIR STEPS

For a model too large for one GPU in fp32 (the 70B shape), HF_BF16_ONLY=1 runs transformers in
bf16 alone with device_map="auto" over all visible GPUs, on OUT_DIR/prompts.json when it exists,
and writes its output as `sgl-bench check-reference` does (ours.json, ours_<case>.f32), so that
tp_compare.py compares the two like two engine runs."""
import os, sys, json, time, numpy as np, torch
from transformers import LlamaForCausalLM

ckpt, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
rng = np.random.default_rng(int(time.time()))
bf16_only = os.environ.get("HF_BF16_ONLY") == "1"
if bf16_only:
    model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16, attn_implementation="sdpa",
                                             device_map="auto").eval()
else:
    model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
dev = next(model.parameters()).device
model.generation_config.eos_token_id = None
V = model.config.vocab_size

def rand_prompt(n):
    return rng.integers(0, V, n).tolist()

prefix = rand_prompt(160)
cases = json.load(open(f"{out}/prompts.json"))["cases"] if os.path.exists(f"{out}/prompts.json") else [
    {"name": "b1", "prompts": [rand_prompt(100)]},
    {"name": "b8", "prompts": [rand_prompt(int(n)) for n in rng.integers(5, 300, 8)]},
    {"name": "b64", "prompts": [rand_prompt(int(n)) for n in rng.integers(3, 200, 64)]},
    {"name": "prefix8", "shared_prefix": 160,
     "prompts": [prefix + rand_prompt(int(n)) for n in rng.integers(1, 40, 8)]},
]
ref = {}
ours = []
for tag in (["bf16_"] if bf16_only else ["bf16_", ""]):
    if tag == "":
        model.float()
    for c in cases:
        ps = c["prompts"]
        L = max(len(p) for p in ps)
        ids = torch.zeros(len(ps), L, dtype=torch.long)
        mask = torch.zeros(len(ps), L, dtype=torch.long)
        for i, p in enumerate(ps):  # left padding
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        t = time.time()
        with torch.no_grad():
            g = model.generate(ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=steps, do_sample=False,
                               output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        toks = g.sequences[:, L:].cpu().numpy()
        logits = torch.stack(g.logits, 1).float()  # [B, steps, V]
        top2 = logits.topk(2, dim=-1).values
        ref[tag + c["name"] + "_tokens"] = toks
        ref[tag + c["name"] + "_prefill"] = logits[:, 0].cpu().numpy()
        ref[tag + c["name"] + "_margin"] = (top2[..., 0] - top2[..., 1]).cpu().numpy()
        if bf16_only:
            logits[:, 0].cpu().numpy().astype(np.float32).tofile(f"{out}/ours_{c['name']}.f32")
            ours.append({"name": c["name"], "tokens": toks.tolist(),
                         "margins": (top2[..., 0] - top2[..., 1]).cpu().numpy().tolist()})
        print(f"hf {tag or 'fp32_'}{c['name']}: {len(ps)} prompts, {time.time()-t:.2f}s", flush=True)
if bf16_only:
    json.dump(ours, open(f"{out}/ours.json", "w"))
else:
    np.savez(f"{out}/ref.npz", **ref)
json.dump({"steps": steps, "cases": cases}, open(f"{out}/prompts.json", "w"))
