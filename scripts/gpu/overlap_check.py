"""Serve the checkpoint on the GPU twice, with the overlap schedule (the default) and with
`--disable-overlap-schedule`, and check that both give the same tokens:

1. greedy requests one at a time (batch 1 every step; with overlap each step takes its input
   token from the pass in flight), lengths 1..40, with and without a stop token id;
2. 8 greedy prompts in one request, all of the same length and `ignore_eos` (every step batches
   the same sequences in both modes, so the arithmetic is identical); the same 8 from separate
   clients at once must each end at max_new_tokens;
3. seeded sampling (temperature 0.8, top-p 0.9) one at a time;
4. penalties and logit_bias sampled on the GPU (logits edits), against the same request with
   `return_logprob` (which takes the host path: logits copied out, penalties applied on the
   host). The device applies the edits to bf16 logits and the host to their f32 copy, so a
   greedy path may part at a near-tie; the first 8 tokens must agree.

Also checks that a stop token id ends a request at that token in both modes. Prints one line per
check and a verdict.

usage: python3 overlap_check.py ENGINE_BINARY CHECKPOINT_DIR
"""

import random
import subprocess
import sys
import threading

import serve_util

PORT = 30124
BASE = f"http://127.0.0.1:{PORT}"


def post(path, body, timeout=300):
    return serve_util.post(BASE, path, body, timeout)


def wait_ready(proc, limit=240):
    serve_util.wait_ready(BASE, proc, limit)


def workload():
    rng = random.Random(11)
    ids = lambda n: [rng.randrange(1000, 100000) for _ in range(n)]
    single = []
    for i, n in enumerate([1, 2, 3, 7, 16, 40]):
        single.append({"input_ids": ids(rng.randrange(20, 400)),
                       "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
    batch = [{"input_ids": ids(rng.randrange(20, 400)),
              "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}}
             for _ in range(8)]
    sampled = [{"input_ids": ids(100),
                "sampling_params": {"temperature": 0.8, "top_p": 0.9, "seed": 5 + i,
                                    "max_new_tokens": 24, "ignore_eos": True}} for i in range(3)]
    penal = [{"input_ids": ids(60),
              "sampling_params": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True,
                                  "frequency_penalty": 0.8, "presence_penalty": 0.3,
                                  "repetition_penalty": 1.2,
                                  "logit_bias": {str(rng.randrange(1000, 100000)): 5.0}}}
             for _ in range(3)]
    return single, batch, sampled, penal


def run(engine, ckpt, extra):
    proc = subprocess.Popen([engine, "serve", "--model-path", ckpt, "--device", "cuda",
                             "--skip-tokenizer-init", "--port", str(PORT)] + extra,
                            stdout=subprocess.DEVNULL,
                            stderr=open(f"/tmp/sgl/overlap_server{'_sync' if extra else ''}.log", "w"))
    try:
        wait_ready(proc)
        single, batch, sampled, penal = workload()
        out = {"single": [post("/generate", b)["output_ids"] for b in single]}
        # the stop id: the 5th token of the 40-token request
        stop = out["single"][-1][4]
        body = dict(single[-1])
        body["sampling_params"] = dict(body["sampling_params"], stop_token_ids=[stop], ignore_eos=False)
        r = post("/generate", body)
        out["stop"] = (r["output_ids"], r["meta_info"]["finish_reason"])
        # one body with 8 prompts: queued together, so both modes batch them identically
        r = post("/generate", {"input_ids": [b["input_ids"] for b in batch],
                               "sampling_params": batch[0]["sampling_params"]})
        out["batch"] = [x["output_ids"] for x in r]
        # 8 separate clients at once: the batches depend on arrival times, so only lengths are
        # compared (every request must end at its max_new_tokens)
        res = [None] * len(batch)

        def one(i):
            res[i] = len(post("/generate", batch[i])["output_ids"])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        out["concurrent_lengths"] = res
        out["sampled"] = [post("/generate", b)["output_ids"] for b in sampled]
        out["penal_device"] = [post("/generate", b)["output_ids"] for b in penal]
        out["penal_host"] = [post("/generate", dict(b, return_logprob=True))["output_ids"] for b in penal]
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    engine, ckpt = sys.argv[1], sys.argv[2]
    on = run(engine, ckpt, [])
    off = run(engine, ckpt, ["--disable-overlap-schedule"])
    ok = True
    for key in ["single", "batch", "sampled", "penal_device"]:
        same = on[key] == off[key]
        ok &= same
        first = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                 for x, y in zip(on[key], off[key])]
        print(f"| overlap vs sync: {key} | {'equal' if same else 'DIFFERENT'} | "
              f"{sum(len(x) for x in on[key])} tokens | first differing position per request: {first} |")
    lens_ok = on["concurrent_lengths"] == [32] * 8 == off["concurrent_lengths"]
    ok &= lens_ok
    print(f"| 8 concurrent clients end at max_new_tokens | {'yes' if lens_ok else 'NO'} | "
          f"{on['concurrent_lengths']} / {off['concurrent_lengths']} |")
    ids, reason = on["stop"]
    stop_ok = (on["stop"] == off["stop"] and reason.get("type") == "stop" and len(ids) <= 5
               and ids[-1] not in ids[:-1])
    ok &= stop_ok
    print(f"| stop token id ends the request at it | {'yes' if stop_ok else 'NO'} | {len(ids)} tokens, {reason} |")
    agree = [next((i for i, (a, b) in enumerate(zip(d, h)) if a != b), min(len(d), len(h)))
             for d, h in zip(on["penal_device"], on["penal_host"])]
    pen_ok = min(agree) >= 8
    ok &= pen_ok
    print(f"| penalties on the GPU vs on the host: equal leading tokens | {agree} of 24 | "
          f"{'ok' if pen_ok else 'FAIL'} |")
    if not pen_ok:
        for d, h in zip(on["penal_device"], on["penal_host"]):
            print(f"|   device {d} |\n|   host   {h} |")
    print("OVERLAP CHECK " + ("PASS" if ok else "FAIL"))


if __name__ == "__main__":
    main()
