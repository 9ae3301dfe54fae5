"""Batch invariance of greedy decoding through the HTTP server. One target request (fixed token
ids, greedy, `ignore_eos`) runs alone twice: with an empty cache (its whole prompt prefilled)
and again (its prompt found in the radix cache, so only its last token is computed). Then,
for K in 1, 3, 7, 15, 31 and 63, it runs ROUNDS times while K other random requests (random
prompt and output lengths) are sent around it at once: even rounds after /flush_cache (its
prompt prefilled beside the others' prompts; compared with the first alone run), odd rounds
with its prompt cached (compared with the second). Prints one table row per K and a JSON
summary line. Without `--enable-deterministic-inference` the two alone runs may differ: a
cached prompt's last token goes through the decode attention kernel, a fresh one through the
prefill kernel; with the flag both take the prefill kernel and must be identical.
Usage: deterministic_check.py PORT VOCAB LABEL [ROUNDS] [SEED]"""
import json
import random
import sys
import threading
import urllib.error
import urllib.request

port, vocab, label = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 7
base = f"http://127.0.0.1:{port}"
rng = random.Random(seed)
TARGET = [rng.randrange(vocab) for _ in range(300)]
TARGET_OUT = 96
errors = []


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def generate(ids, out):
    try:
        body = {"input_ids": ids, "sampling_params": {
            "max_new_tokens": out, "temperature": 0, "ignore_eos": True}}
        return json.loads(post("/generate", body))["output_ids"]
    except urllib.error.HTTPError as e:
        errors.append(f"{e.code}: {e.read()[:300]!r}")
    except OSError as e:
        errors.append(repr(e))
    return None


def flush():
    post("/flush_cache", {})


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


flush()
fresh = generate(TARGET, TARGET_OUT)
cached = generate(TARGET, TARGET_OUT)
print(f"| {label} | alone, prompt cached, against alone, prompt fresh | "
      f"{'identical' if fresh == cached else 'differ from token ' + str(first_diff(fresh, cached))} | |")
same_total = runs_total = 0
for k in (1, 3, 7, 15, 31, 63):
    same = {"fresh": 0, "cached": 0}
    diffs = []
    for r in range(rounds):
        kind = "fresh" if r % 2 == 0 else "cached"
        if kind == "fresh":
            flush()
        others = [([rng.randrange(vocab) for _ in range(rng.randrange(16, 1200))],
                   rng.randrange(8, 160)) for _ in range(k)]
        got = {}

        def other(i, ids, out):
            got[i] = generate(ids, out)

        def target():
            got["target"] = generate(TARGET, TARGET_OUT)

        # the target goes in the middle, so it shares prefill and decode passes with others
        threads = [threading.Thread(target=other, args=(i, ids, out))
                   for i, (ids, out) in enumerate(others)]
        threads.insert(len(threads) // 2, threading.Thread(target=target))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        want = fresh if kind == "fresh" else cached
        t = got.get("target")
        if t == want:
            same[kind] += 1
        else:
            diffs.append(f"{kind}@{first_diff(want, t or [])}")
    n_fresh = (rounds + 1) // 2
    same_total += same["fresh"] + same["cached"]
    runs_total += rounds
    print(f"| {label} | {k} others | prompt fresh: {same['fresh']} of {n_fresh}, cached: "
          f"{same['cached']} of {rounds - n_fresh} identical to alone | differing (first token): "
          f"{', '.join(diffs) or '-'} |", flush=True)
for e in errors[:5]:
    print(f"request failed: {e}")
print(json.dumps({"label": label, "identical": same_total, "runs": runs_total,
                  "target_tokens": TARGET_OUT, "fresh_equals_cached": fresh == cached,
                  "failed_requests": len(errors)}))
