"""Per-layer hidden-state comparison of the engine with transformers.

  layer_diff.py ref CKPT DIR   transformers in bf16 and in fp32 (the same bf16 weights, upcast;
                               TF32 off) on a few random prompts, one at a time; saves every
                               layer's output and the last position's logits, and writes
                               DIR/prompts.json for the engine's `check` (one case per prompt).
                               Also a written-out bf16 forward with an fp32 residual stream.
  layer_diff.py cmp DIR        reads the engine's dumps (SGL_CUDA_DUMP_DIR=DIR/dump) and
                               ours_<case>.f32, prints relative errors per layer: engine vs
                               fp32, transformers-bf16 vs fp32, engine vs transformers-bf16.

Relative error of a token's vector: ||a - b|| / ||b||; the table shows the max over tokens.
"""
import sys, json, numpy as np, torch

LENS = [100, 17, 250, 300]


def ref(ckpt, d):
    from transformers import LlamaForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16,
                                             attn_implementation="sdpa").cuda().eval()
    V = model.config.vocab_size
    rng = np.random.default_rng(1234)
    prompts = [rng.integers(0, V, n).tolist() for n in LENS]

    def run(tag):
        out = {}
        for i, p in enumerate(prompts):
            hs = []

            def hook(_m, _i, o):
                hs.append((o[0] if isinstance(o, tuple) else o)[0].float().cpu())

            hooks = [l.register_forward_hook(hook) for l in model.model.layers]
            with torch.no_grad():
                lg = model(torch.tensor([p]).cuda()).logits[0, -1].float().cpu()
            for h in hooks:
                h.remove()
            out[f"p{i}_h"] = torch.stack(hs).numpy()
            out[f"p{i}_logits"] = lg.numpy()
        np.savez(f"{d}/hf_{tag}.npz", **out)

    run("bf16")
    manual(model, prompts, d)
    model.float()
    run("fp32")
    json.dump({"steps": 1, "cases": [{"name": f"p{i}", "prompts": [p]} for i, p in enumerate(prompts)]},
              open(f"{d}/prompts.json", "w"))
    print(f"layer_diff ref: {len(prompts)} prompts, {model.config.num_hidden_layers} layers", flush=True)


def manual(model, prompts, d):
    """transformers-bf16 arithmetic written out, with the residual stream kept in fp32: how
    close a bf16 engine could get to the fp32 reference by that change alone."""
    import torch.nn.functional as F
    m, c = model.model, model.config
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps = c.rms_norm_eps

    def norm(x, w):
        x = x.float()
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)

    def rot(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    out = {}
    for i, p in enumerate(prompts):
        ids = torch.tensor([p]).cuda()
        T = ids.shape[1]
        with torch.no_grad():
            x = m.embed_tokens(ids).float()
            cos, sin = m.rotary_emb(x.to(torch.bfloat16), torch.arange(T, device="cuda")[None])
            cos, sin = cos[:, None], sin[:, None]
            hs = []
            for l in m.layers:
                a = l.self_attn
                h = norm(x, l.input_layernorm.weight)
                q = a.q_proj(h).view(1, T, nh, hd).transpose(1, 2)
                k = a.k_proj(h).view(1, T, nkv, hd).transpose(1, 2)
                v = a.v_proj(h).view(1, T, nkv, hd).transpose(1, 2)
                q, k = rot(q, cos, sin), rot(k, cos, sin)
                k = k.repeat_interleave(nh // nkv, 1)
                v = v.repeat_interleave(nh // nkv, 1)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.o_proj(o.transpose(1, 2).reshape(1, T, nh * hd)).float()
                h = norm(x, l.post_attention_layernorm.weight)
                mlp = l.mlp
                x = x + mlp.down_proj(F.silu(mlp.gate_proj(h)) * mlp.up_proj(h)).float()
                hs.append(x[0].cpu())
            lg = model.lm_head(norm(x, m.norm.weight))[0, -1].float().cpu()
        out[f"p{i}_h"] = torch.stack(hs).numpy()
        out[f"p{i}_logits"] = lg.numpy()
    np.savez(f"{d}/hf_r32.npz", **out)


def rel(a, b):
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return float(np.max(np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)))


def cmp(d):
    bf, fp = np.load(f"{d}/hf_bf16.npz"), np.load(f"{d}/hf_fp32.npz")
    r32 = np.load(f"{d}/hf_r32.npz")
    n = len([k for k in bf.files if k.endswith("_h")])
    L = bf["p0_h"].shape[0]
    show = sorted({0, 1, 2, 3, L // 4 - 1, L // 2 - 1, 3 * L // 4 - 1, L - 1} & set(range(L)))
    print(f"| prompt | tokens | what | " + " | ".join(f"layer {l}" for l in show) + " | logits |")
    print("|---|---|---|" + "---|" * (len(show) + 1))
    for i in range(n):
        hb, hf = bf[f"p{i}_h"], fp[f"p{i}_h"]
        T, H = hb.shape[1], hb.shape[2]
        ours = np.stack([
            np.fromfile(f"{d}/dump/p{i:03}_l{l:02}.bin", dtype=np.uint16).astype(np.uint32) << 16
            for l in range(L)]).view(np.float32).reshape(L, T, H)
        lo = np.fromfile(f"{d}/ours_p{i}.f32", dtype=np.float32)
        lb, lf = bf[f"p{i}_logits"], fp[f"p{i}_logits"]
        for what, a, b, la, lb_ in [("engine vs fp32", ours, hf, lo, lf),
                                    ("hf-bf16 vs fp32", hb, hf, lb, lf),
                                    ("engine vs hf-bf16", ours, hb, lo, lb),
                                    ("bf16, fp32 residual, vs fp32", r32[f"p{i}_h"], hf, r32[f"p{i}_logits"], lf)]:
            cells = " | ".join(f"{rel(a[l], b[l]):.2e}" for l in show)
            print(f"| p{i} | {T} | {what} | {cells} | {rel(la, lb_):.2e} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "ref":
        ref(sys.argv[2], sys.argv[3])
    else:
        cmp(sys.argv[2])
