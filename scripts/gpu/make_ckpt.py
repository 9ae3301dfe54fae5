"""Write a Llama-3.1-8B-shaped checkpoint with random weights (bf16 safetensors).
Usage: make_ckpt.py OUT_DIR [NUM_LAYERS]"""
import sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 32
cfg = LlamaConfig(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
    rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    bos_token_id=128000, eos_token_id=128001,
)
t = time.time()
torch.manual_seed(int(time.time()))
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg)
model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
print(f"checkpoint {out}: {layers} layers, {sum(p.numel() for p in model.parameters())/1e9:.2f} B params, {time.time()-t:.1f}s", flush=True)
