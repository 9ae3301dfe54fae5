"""Prompt logprobs through the server with prefill's last layer on the logit rows only, against
the same server with it on every row (SGL_DISABLE_LOGIT_ROWS_ONLY=1): 16 greedy requests sent at
once, so their prompts share prefill passes, 4 of them asking for prompt logprobs from position 0
(their every row needs logits) or from the middle, the rest for none (only their last row does).
A row taken from the wrong place shows as prompt logprobs or tokens far apart; the same rows
differ by the last layer's rounding only (its GEMMs see fewer rows). Verdict: every request's
first 4 output tokens equal, and the prompt logprobs within 0.1 of each other.

usage: python3 logprob_rows.py ENGINE_BINARY CHECKPOINT_DIR
"""

import os
import random
import subprocess
import sys
import threading

import serve_util

PORT = 30124
BASE = f"http://127.0.0.1:{PORT}"


def serve_and_ask(engine, ckpt, env_extra, bodies):
    env = dict(os.environ, **env_extra)
    proc = subprocess.Popen([engine, "serve", "--model-path", ckpt, "--device", "cuda",
                             "--skip-tokenizer-init", "--port", str(PORT)], env=env,
                            stdout=subprocess.DEVNULL, stderr=open("/tmp/sgl/logprob_rows.log", "a"))
    try:
        serve_util.wait_ready(BASE, proc)
        serve_util.post(BASE, "/generate", bodies[0])  # warm-up
        out = [None] * len(bodies)

        def ask(i):
            out[i] = serve_util.post(BASE, "/generate", bodies[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    engine, ckpt = sys.argv[1], sys.argv[2]
    rng = random.Random(11)
    bodies = []
    for i in range(16):
        prompt = [rng.randrange(1000, 100000) for _ in range(rng.randrange(40, 400))]
        body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        if i % 4 == 0:
            body["return_logprob"] = True
            body["logprob_start_len"] = 0 if i % 8 == 0 else len(prompt) // 2
        bodies.append(body)
    rows = serve_and_ask(engine, ckpt, {}, bodies)
    every = serve_and_ask(engine, ckpt, {"SGL_DISABLE_LOGIT_ROWS_ONLY": "1"}, bodies)
    worst, same_tokens, n_lp = 0.0, 0, 0
    for a, b, body in zip(rows, every, bodies):
        ta = a.get("output_ids") or [x[1] for x in a["meta_info"].get("output_token_logprobs", [])]
        tb = b.get("output_ids") or [x[1] for x in b["meta_info"].get("output_token_logprobs", [])]
        if ta[:4] == tb[:4]:
            same_tokens += 1
        if body.get("return_logprob"):
            la = a["meta_info"]["input_token_logprobs"]
            lb = b["meta_info"]["input_token_logprobs"]
            assert len(la) == len(lb), (len(la), len(lb))
            n_lp += len(la)
            for x, y in zip(la, lb):
                if x[0] is not None and y[0] is not None:
                    worst = max(worst, abs(x[0] - y[0]))
    ok = same_tokens == len(bodies) and worst < 0.1
    print(f"| prompt logprobs, logit rows only vs every row | requests with equal first 4 tokens: "
          f"{same_tokens} of {len(bodies)} | prompt logprobs compared: {n_lp}, largest difference "
          f"{worst:.2e} | {'pass' if ok else 'FAIL'} |")


if __name__ == "__main__":
    main()
