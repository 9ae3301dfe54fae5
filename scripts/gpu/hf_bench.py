"""transformers generate as the peer: tokens/s at a static batch. Usage: hf_bench.py CKPT B IN OUT"""
import sys, time, torch
from transformers import LlamaForCausalLM

ckpt, b, n_in, n_out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16).cuda().eval()
model.generation_config.eos_token_id = None
ids = torch.randint(0, model.config.vocab_size, (b, n_in), device="cuda")
with torch.no_grad():
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    t = time.time()
    model.generate(ids, max_new_tokens=n_out, min_new_tokens=n_out, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
dt = time.time() - t
print(f"| transformers generate | batch {b} | in {n_in} | out {n_out} | {dt:.1f}s | {b*n_out/dt:.1f} output tok/s |", flush=True)
