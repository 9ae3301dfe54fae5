#!/usr/bin/env python3
"""CPU benchmark: sgl-engine against llama.cpp on the same GGUF, measured in the same run.

Workloads (token ids drawn from a fixed-seed generator, so both engines see the same input):
  1. batch-1 decode: 128-token prompt, 128 output tokens (tok/s of the decode phase)
  2. prefill: one 800-token prompt (tok/s of the prompt phase)
  3. 16 concurrent requests, 128-token prompts, 128 output tokens each: end-to-end output tok/s,
     and decode tok/s while all 16 decode together (compared with batch-1 decode; batch-1 and
     16-way decode run --repeat times in turn on one server, and the medians are compared, since
     a single short run on a shared 2-core machine moves by +-15%);
     llama.cpp through llama-cpp-python serves one request at a time, so its figure is the
     same 16 requests run back to back
  4. shared prefix: 8 groups x 8 prompts, 512-token shared prefix per group, 32-token question,
     32 output tokens, all 64 sent at once, with the radix cache on and off

    pip install llama-cpp-python==0.3.36
    cargo build --release -p sgl-engine
    python3 scripts/bench/cpu_bench.py --model "$(scripts/fetch-model.sh)" [--threads 2] [--json out.json]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB_LO, VOCAB_HI = 1000, 40000


def ids(rng, n):
    return [rng.randrange(VOCAB_LO, VOCAB_HI) for _ in range(n)]


class Server:
    def __init__(self, model, threads, extra):
        # SGL_ENGINE_BINARY: another build to measure (say, an older commit's, for an A/B run)
        binary = os.environ.get("SGL_ENGINE_BINARY") or os.path.join(ROOT, "target", "release", "sgl-engine")
        cmd = [binary, "serve", "--model-path", model, "--port", "0", "--num-threads", str(threads),
               "--log-level", "warning", "--max-running-requests", "128"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = line[len("listening on "):]

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)

    def generate(self, input_ids, max_new, stream=False):
        body = {"input_ids": input_ids, "stream": stream,
                "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}
        req = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as resp:
            if not stream:
                out = json.loads(resp.read())
                return {"e2e": time.perf_counter() - t0, "tokens": out["meta_info"]["completion_tokens"]}
            stamps = []
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:") and line != "data: [DONE]":
                    stamps.append(time.perf_counter())
            return {"ttft": stamps[0] - t0, "stamps": stamps, "e2e": stamps[-1] - t0}


def ours_decode(s, prompt, n_out):
    r = s.generate(prompt, n_out, stream=True)
    st = r["stamps"]
    return (len(st) - 1) / (st[-1] - st[0])


def ours_prefill(s, prompt):
    r = s.generate(prompt, 1, stream=True)
    return len(prompt) / r["ttft"]


def ours_concurrent(s, prompts, n_out):
    results = [None] * len(prompts)

    def run(i):
        results[i] = s.generate(prompts[i], n_out)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    return sum(r["tokens"] for r in results) / elapsed, elapsed


def ours_concurrent_decode(s, prompts, n_out):
    """All requests streamed at once. Returns (end-to-end output tok/s, decode tok/s while all
    requests were decoding together: from the last first-token to the first last-token)."""
    results = [None] * len(prompts)

    def run(i):
        results[i] = s.generate(prompts[i], n_out, stream=True)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    total = sum(len(r["stamps"]) for r in results)
    start = max(r["stamps"][0] for r in results)
    end = min(r["stamps"][-1] for r in results)
    inside = sum(1 for r in results for x in r["stamps"] if start < x <= end)
    decode = inside / (end - start) if end > start else float("nan")
    return total / elapsed, decode


def llama_cpp_runs(model, threads, decode_prompt, n_dec, prefill_prompt, conc_prompts, n_conc):
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)

    def greedy(prompt, n):
        """Returns (seconds to the first token, seconds for the remaining n - 1 tokens)."""
        llm.reset()
        t0 = time.perf_counter()
        t1, got = None, 0
        for _tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0):
            got += 1
            if t1 is None:
                t1 = time.perf_counter()
            if got == n:
                break
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    greedy(decode_prompt[:16], 4)  # warm-up
    _, dec = greedy(decode_prompt, n_dec + 1)
    pre, _ = greedy(prefill_prompt, 1)
    t0 = time.perf_counter()
    for p in conc_prompts:
        greedy(p, n_conc)
    conc = time.perf_counter() - t0
    return {"decode_tok_s": n_dec / dec, "prefill_tok_s": len(prefill_prompt) / pre,
            "concurrent16_tok_s": len(conc_prompts) * n_conc / conc}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--repeat", type=int, default=5,
                    help="rounds of batch-1 and 16-way decode (medians reported)")
    a = ap.parse_args()
    rng = random.Random(0)
    decode_prompt, n_dec = ids(rng, 128), 128
    prefill_prompt = ids(rng, 800)
    conc_prompts, n_conc = [ids(rng, 128) for _ in range(16)], 128
    groups = [ids(rng, 512) for _ in range(8)]
    shared = [g + ids(rng, 32) for g in groups for _ in range(8)]
    rng.shuffle(shared)

    res = {"workload": {"decode": "in 128 / out 128, batch 1", "prefill": "800-token prompt",
                        "concurrent": "16 x (in 128 / out 128), sent at once",
                        "shared_prefix": "8 groups x 8 prompts, 512 shared + 32 question, out 32"},
           "threads": a.threads}
    s = Server(a.model, a.threads, [])
    try:
        ours_decode(s, decode_prompt[:16], 8)  # warm-up
        res["ours"] = {"prefill_tok_s": ours_prefill(s, prefill_prompt)}
        # Round 1 sends the prompts cold (its end-to-end figure includes their prefill); later
        # rounds find them in the radix cache, which the decode-only figures do not see.
        rounds = {"decode_tok_s": [], "concurrent16_tok_s": [], "concurrent16_decode_tok_s": []}
        for _ in range(max(1, a.repeat)):
            rounds["decode_tok_s"].append(ours_decode(s, decode_prompt, n_dec))
            e2e, dec = ours_concurrent_decode(s, conc_prompts, n_conc)
            rounds["concurrent16_tok_s"].append(e2e)
            rounds["concurrent16_decode_tok_s"].append(dec)
        res["ours"]["rounds"] = rounds
        res["ours"]["decode_tok_s"] = statistics.median(rounds["decode_tok_s"])
        res["ours"]["concurrent16_tok_s"] = rounds["concurrent16_tok_s"][0]
        res["ours"]["concurrent16_decode_tok_s"] = statistics.median(
            rounds["concurrent16_decode_tok_s"])
        res["ours"]["shared_prefix_radix_tok_s"], t_on = ours_concurrent(s, shared, 32)
    finally:
        s.close()
    s = Server(a.model, a.threads, ["--disable-radix-cache"])
    try:
        res["ours"]["shared_prefix_no_radix_tok_s"], t_off = ours_concurrent(s, shared, 32)
    finally:
        s.close()
    if not a.skip_llama_cpp:
        res["llama_cpp"] = llama_cpp_runs(a.model, a.threads, decode_prompt, n_dec, prefill_prompt,
                                          conc_prompts, n_conc)
    o, l = res["ours"], res.get("llama_cpp")
    print(f"workload: {json.dumps(res['workload'])}; threads {a.threads}")
    print(f"{'metric':34} {'sgl-engine':>12} {'llama.cpp':>12} {'ratio':>8}")
    for k, name in [("decode_tok_s", "batch-1 decode (tok/s)"), ("prefill_tok_s", "prefill (tok/s)"),
                    ("concurrent16_tok_s", "16 concurrent, cold (output tok/s)")]:
        peer = f"{l[k]:12.1f} {o[k] / l[k]:7.2f}x" if l else f"{'-':>12} {'-':>8}"
        print(f"{name:34} {o[k]:12.1f} {peer}")
    print(f"{'16 decoding together (tok/s)':34} {o['concurrent16_decode_tok_s']:12.1f}")
    r = o["rounds"]
    print(f"  rounds: batch-1 {', '.join(f'{v:.1f}' for v in r['decode_tok_s'])}; 16 together "
          f"{', '.join(f'{v:.1f}' for v in r['concurrent16_decode_tok_s'])} (medians above)")
    print(f"{'16-way decode / our batch-1':34} {o['concurrent16_decode_tok_s'] / o['decode_tok_s']:11.2f}x  (goal >= 4x)")
    print(f"{'shared prefix, radix on (tok/s)':34} {o['shared_prefix_radix_tok_s']:12.1f}")
    print(f"{'shared prefix, radix off (tok/s)':34} {o['shared_prefix_no_radix_tok_s']:12.1f}")
    print(f"{'shared prefix speedup':34} {t_off / t_on:11.2f}x  (goal >= 3x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
