"""Tensor-parallel parity: the engine's greedy run at tp N against its run at tp 1.

  tp_compare.py prompts CKPT OUT_DIR STEPS   write OUT_DIR/prompts.json (the cases of hf_ref.py:
                                             batch 1, 8, 64 and 8 prompts on a cached prefix;
                                             LONG=N adds a case of one N-token prompt and one of
                                             4 prompts of N/2 to N tokens)
  tp_compare.py compare TP1_DIR TPN_DIR      score `sgl-bench check-reference` outputs

Scores: the prefill logits' difference relative to their size (L2, as compare.py measures the
engine against transformers), and per sequence the first step where
the greedy tokens differ, with tp 1's top-2 margin there (a divergence at a margin within
MARGIN, default 0.25 logits, is counted as a near-tie). These counts describe how far the two
runs drift apart; they are no verdict, because a random 32-layer checkpoint turns rounding
differences into logit differences of several percent. The verdict is CHECK=1 of tp.sh: tp 1
and tp N each against transformers in fp32, next to transformers in bf16 (compare.py).
"""
import json, os, sys
import numpy as np

MARGIN = float(os.environ.get("MARGIN", "0.25"))


def prompts(ckpt, out, steps):
    vocab = json.load(open(os.path.join(ckpt, "config.json")))["vocab_size"]
    rng = np.random.default_rng(7)
    rand = lambda n: rng.integers(0, vocab, int(n)).tolist()
    prefix = rand(160)
    cases = [
        {"name": "b1", "prompts": [rand(100)]},
        {"name": "b8", "prompts": [rand(n) for n in rng.integers(5, 300, 8)]},
        {"name": "b64", "prompts": [rand(n) for n in rng.integers(3, 200, 64)]},
        {"name": "prefix8", "shared_prefix": 160,
         "prompts": [prefix + rand(n) for n in rng.integers(1, 40, 8)]},
    ]
    long = int(os.environ.get("LONG", "0"))
    if long:
        cases.append({"name": f"b1-{long}", "prompts": [rand(long)]})
        cases.append({"name": f"b4-{long}",
                      "prompts": [rand(n) for n in rng.integers(long // 2, long + 1, 4)]})
    os.makedirs(out, exist_ok=True)
    json.dump({"steps": int(steps), "cases": cases}, open(os.path.join(out, "prompts.json"), "w"))


def compare(a_dir, b_dir):
    a = {c["name"]: c for c in json.load(open(os.path.join(a_dir, "ours.json")))}
    b = {c["name"]: c for c in json.load(open(os.path.join(b_dir, "ours.json")))}
    print("| case | seqs | prefill logits rel. diff (L2, worst row) | identical | diverge at a near-tie | diverge elsewhere |")
    print("|---|---|---|---|---|---|")
    for name, ca in a.items():
        cb = b[name]
        la = np.fromfile(os.path.join(a_dir, f"ours_{name}.f32"), dtype=np.float32)
        lb = np.fromfile(os.path.join(b_dir, f"ours_{name}.f32"), dtype=np.float32)
        v = len(la) // len(ca["tokens"])
        la, lb = la.reshape(-1, v), lb.reshape(-1, v)
        rel = float(max(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-9) for x, y in zip(la, lb)))
        same = tie = bad = 0
        for ta, tb, ma in zip(ca["tokens"], cb["tokens"], ca["margins"]):
            k = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
            if k is None:
                same += 1
            elif ma[k] <= MARGIN:
                tie += 1
            else:
                bad += 1
                print(f"  {name}: step {k} differs with tp-1 margin {ma[k]:.3f}")
        print(f"| {name} | {len(ca['tokens'])} | {rel:.3e} | {same} | {tie} | {bad} |")
    print("(descriptive: the verdict is compare.py's, CHECK=1)")


if __name__ == "__main__":
    if sys.argv[1] == "prompts":
        prompts(*sys.argv[2:5])
    else:
        compare(sys.argv[2], sys.argv[3])
