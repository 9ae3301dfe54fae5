"""Compare the engine's check output with the transformers reference; print a table.
Usage: compare.py DIR (holds ref.npz, prompts.json, ours.json, ours_<case>.f32)"""
import sys, json, numpy as np

d = sys.argv[1]
ref = np.load(f"{d}/ref.npz")
ours = {c["name"]: c["tokens"] for c in json.load(open(f"{d}/ours.json"))}
TIE = 0.1  # top-2 gap (logits) under which a greedy choice is a near-tie
ok_all = True
print("| case | prompts | max rel logit err | greedy steps equal (min / mean of 64) | mismatches not at a near-tie | result |")
print("|---|---|---|---|---|---|")
for name, toks in ours.items():
    rt, rl, rm = ref[name + "_tokens"], ref[name + "_prefill"], ref[name + "_margin"]
    ol = np.fromfile(f"{d}/ours_{name}.f32", dtype=np.float32).reshape(rl.shape)
    errs = [np.linalg.norm(ol[i] - rl[i]) / np.linalg.norm(rl[i]) for i in range(len(rl))]
    eq, bad = [], 0
    for i, t in enumerate(toks):
        t = np.array(t)
        diff = np.nonzero(t != rt[i])[0]
        first = diff[0] if len(diff) else len(t)
        eq.append(first)
        if first < len(t) and rm[i, first] > TIE:
            bad += 1
    ok = max(errs) <= 1e-2 and bad == 0
    ok_all &= ok
    print(f"| {name} | {len(toks)} | {max(errs):.2e} | {min(eq)} / {np.mean(eq):.1f} | {bad} | {'pass' if ok else 'FAIL'} |")
sys.exit(0 if ok_all else 1)
