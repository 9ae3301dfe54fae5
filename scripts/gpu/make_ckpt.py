"""Write a Llama-3.1-shaped checkpoint with random weights (bf16 safetensors), as transformers
initialises a LlamaForCausalLM (linear and embedding weights normal(0, 0.02), norms 1), but
streamed: tensors are drawn on the GPUs and written shard by shard by parallel workers, so the
70B shape (141 GB) needs neither a whole model in one GPU's memory nor minutes of serial writes.

Usage: make_ckpt.py OUT_DIR [NUM_LAYERS] [SHAPE]     SHAPE: 8b (default) or 70b
           the weights depend only on CKPT_SEED (default 1), so two device calls write the same
           checkpoint and their results compare
       make_ckpt.py --truncate SRC_DIR OUT_DIR LAYERS
           a checkpoint of SRC_DIR's first LAYERS layers (config, index and links to SRC_DIR's
           shards; the 70B shape has two layers per shard, so LAYERS should be even)"""
import json, os, sys, time
import multiprocessing as mp

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, layers=32),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, layers=80),
}
LAYERS_PER_SHARD = 2


def config(shape, layers):
    s = SHAPES[shape]
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
        "vocab_size": 128256, "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"], "num_hidden_layers": layers,
        "num_attention_heads": s["num_attention_heads"], "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu", "initializer_range": 0.02,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "bos_token_id": 128000, "eos_token_id": 128001,
    }


def shard_plan(cfg):
    """[(file name, [(tensor name, shape, init)])], init 'normal' or 'ones'."""
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    groups = [[("model.embed_tokens.weight", (v, h), "normal")]]
    layers = cfg["num_hidden_layers"]
    for first in range(0, layers, LAYERS_PER_SHARD):
        g = []
        for i in range(first, min(first + LAYERS_PER_SHARD, layers)):
            p = f"model.layers.{i}."
            g += [(p + "input_layernorm.weight", (h,), "ones"),
                  (p + "self_attn.q_proj.weight", (q, h), "normal"),
                  (p + "self_attn.k_proj.weight", (kv, h), "normal"),
                  (p + "self_attn.v_proj.weight", (kv, h), "normal"),
                  (p + "self_attn.o_proj.weight", (h, q), "normal"),
                  (p + "post_attention_layernorm.weight", (h,), "ones"),
                  (p + "mlp.gate_proj.weight", (f, h), "normal"),
                  (p + "mlp.up_proj.weight", (f, h), "normal"),
                  (p + "mlp.down_proj.weight", (h, f), "normal")]
        groups.append(g)
    groups.append([("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "normal")])
    n = len(groups)
    return [(f"model-{k + 1:05d}-of-{n:05d}.safetensors", g) for k, g in enumerate(groups)]


def write_shards(args):
    worker, workers, out, plan, seed = args
    import torch
    from safetensors.torch import save_file
    ngpu = torch.cuda.device_count()
    dev = f"cuda:{worker % ngpu}" if ngpu else "cpu"
    gen = torch.Generator(device=dev)
    nbytes = 0
    for k in range(worker, len(plan), workers):
        name, tensors = plan[k]
        gen.manual_seed(seed * 1000 + k)
        t = {}
        for tname, shape, init in tensors:
            if init == "ones":
                x = torch.ones(shape, dtype=torch.bfloat16, device=dev)
            else:
                x = torch.randn(shape, generator=gen, dtype=torch.float32, device=dev).mul_(0.02)
                x = x.to(torch.bfloat16)
            t[tname] = x.cpu()
            nbytes += x.numel() * 2
        save_file(t, os.path.join(out, name), metadata={"format": "pt"})
    return nbytes


def write_index(out, plan):
    wmap = {tname: name for name, ts in plan for tname, _, _ in ts}
    total = sum(2 * _numel(s) for _, ts in plan for _, s, _ in ts)
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def make(out, layers, shape):
    t = time.time()
    os.makedirs(out, exist_ok=True)
    cfg = config(shape, layers)
    plan = shard_plan(cfg)
    workers = min(len(plan), int(os.environ.get("CKPT_WORKERS", "8")))
    seed = int(os.environ.get("CKPT_SEED", "1"))
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        nbytes = sum(pool.map(write_shards, [(w, workers, out, plan, seed) for w in range(workers)]))
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump({"bos_token_id": 128000, "eos_token_id": 128001},
              open(os.path.join(out, "generation_config.json"), "w"))
    write_index(out, plan)
    dt = time.time() - t
    print(f"checkpoint {out}: {shape} shape, {layers} layers, {nbytes / 2e9:.2f} B params, "
          f"{len(plan)} shards, {dt:.1f}s ({nbytes / 1e9 / dt:.1f} GB/s)", flush=True)


def truncate(src, out, layers):
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["num_hidden_layers"] = layers
    plan = [(name, ts) for name, ts in shard_plan(cfg)]
    full = json.load(open(os.path.join(src, "model.safetensors.index.json")))["weight_map"]
    os.makedirs(out, exist_ok=True)
    keep = {}
    for _, ts in plan:
        for tname, _, _ in ts:
            keep[tname] = full[tname]  # the file of SRC that holds it
    for f in sorted(set(keep.values())):
        dst = os.path.join(out, f)
        if not os.path.exists(dst):
            os.symlink(os.path.abspath(os.path.join(src, f)), dst)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    json.dump({"metadata": {}, "weight_map": keep},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    print(f"checkpoint {out}: the first {layers} layers of {src} ({len(set(keep.values()))} shards linked)")


if __name__ == "__main__":
    if sys.argv[1] == "--truncate":
        truncate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        shape = sys.argv[3] if len(sys.argv) > 3 else "8b"
        layers = int(sys.argv[2]) if len(sys.argv) > 2 else SHAPES[shape]["layers"]
        make(sys.argv[1], layers, shape)
