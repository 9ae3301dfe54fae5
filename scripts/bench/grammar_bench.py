#!/usr/bin/env python3
"""Structured-output overhead: decode time per output token of JSON-schema-constrained requests
against unconstrained ones, on the same prompts, at concurrency 1 and 16, plus the grammar
compile time (first request with a schema against the same schema again, cached).

Method, per workload (concurrency c):
  1. constrained run: c prompts sent at once to /generate (streaming, temperature 0) with
     `sampling_params.json_schema`; each request ends by itself when its JSON is complete.
  2. unconstrained run: the same c prompts, no schema, `ignore_eos` and `max_new_tokens` set to
     the token count the constrained run produced for that prompt, so both runs decode the
     same number of tokens per request.
  Per request, the time per output token (TPOT) is (last token time - first token time) /
  (output tokens - 1), from the client's stream timestamps (one chunk per token); the figure is
  the mean over the requests. The pair of runs is repeated (--repeats, alternating which goes
  first) and the medians are compared.

Compile time: `max_new_tokens` 1 requests with a schema never seen before (a fresh `$comment`
makes each one uncached) against the same schema sent again (served from the cache); the
difference of the medians is the cold compile cost as a client sees it.

Only public tools: the Python standard library and the sgl-engine server.

    cargo build --release -p sgl-engine
    python3 scripts/bench/grammar_bench.py --model "$(scripts/fetch-model.sh)"
    python3 scripts/bench/grammar_bench.py --url http://127.0.0.1:30000   # a running server
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCHEMA = {
    "type": "object",
    "properties": {
        "products": {
            "type": "array",
            "minItems": 3,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "category": {"enum": ["kitchen", "garden", "office", "toys", "sports"]},
                    "price": {"type": "integer", "minimum": 1, "maximum": 999},
                    "in_stock": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
                },
                "required": ["name", "category", "price", "in_stock", "tags"],
                "additionalProperties": False,
            },
        },
        "store": {"type": "string", "maxLength": 30},
    },
    "required": ["products", "store"],
    "additionalProperties": False,
}

TOPICS = [
    "a hardware store", "a toy shop", "a sports outlet", "a garden center", "an office supplier",
    "a kitchen boutique", "a bike shop", "a camping store", "a bookshop", "a music store",
    "a pet shop", "a craft store", "a shoe shop", "a tea house", "a ski rental", "a bakery",
]


def prompts(n):
    return [f"List three products sold by {TOPICS[i % len(TOPICS)]} as JSON:" for i in range(n)]


class Server:
    def __init__(self, model, grammar_backend, threads):
        binary = os.path.join(ROOT, "target", "release", "sgl-engine")
        cmd = [binary, "serve", "--model-path", model, "--port", "0", "--log-level", "warning",
               "--grammar-backend", grammar_backend, "--max-running-requests", "64"]
        if threads:
            cmd += ["--num-threads", str(threads)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = line[len("listening on "):].rstrip("/")

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def post(url, body, stream):
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as resp:
        if not stream:
            out = json.loads(resp.read())
            return {"e2e": time.perf_counter() - t0, "out": out}
        stamps, last = [], None
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
                last = json.loads(line[5:])
        if last is None:
            raise RuntimeError("empty stream")
        if "error" in last:
            raise RuntimeError(f"request failed: {last}")
        return {"stamps": stamps, "out": last, "e2e": stamps[-1] - t0}


def run_batch(url, bodies):
    """Send all bodies at once (streaming); returns per-request (tokens, tpot, text, finish)."""
    results = [None] * len(bodies)
    errors = []

    def one(i, body):
        try:
            results[i] = post(url, body, stream=True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    out = []
    for r in results:
        meta = r["out"]["meta_info"]
        n = meta["completion_tokens"]
        st = r["stamps"]
        tpot = (st[-1] - st[0]) / (n - 1) if n > 1 else float("nan")
        out.append({"tokens": n, "tpot": tpot, "text": r["out"]["text"], "finish": meta["finish_reason"]})
    return out


def body(prompt, params):
    return {"text": prompt, "stream": True, "sampling_params": {"temperature": 0, **params}}


def workload(url, concurrency, repeats, max_tokens):
    ps = prompts(concurrency)
    schema = json.dumps(SCHEMA)
    con_runs, unc_runs = [], []
    valid = 0
    constrained = [body(p, {"json_schema": schema, "max_new_tokens": max_tokens}) for p in ps]
    # The constrained output lengths (greedy, so the same every time) fix the unconstrained budget.
    counts = [r["tokens"] for r in run_batch(url, constrained)]
    unconstrained = [body(p, {"max_new_tokens": n, "ignore_eos": True}) for p, n in zip(ps, counts)]
    for rep in range(repeats):
        # Alternate the order so that drifting machine load does not favour one side.
        if rep % 2 == 0:
            con = run_batch(url, constrained)
            unc = run_batch(url, unconstrained)
        else:
            unc = run_batch(url, unconstrained)
            con = run_batch(url, constrained)
        for r in con:
            try:
                json.loads(r["text"])
                valid += 1
            except ValueError:
                pass
        con_runs.append(statistics.mean(r["tpot"] for r in con))
        unc_runs.append(statistics.mean(r["tpot"] for r in unc))
        assert [r["tokens"] for r in unc] == counts, "both runs must decode the same token counts"
    return {
        "concurrency": concurrency,
        "tokens_mean": statistics.mean(counts),
        "constrained_ms": statistics.median(con_runs) * 1e3,
        "unconstrained_ms": statistics.median(unc_runs) * 1e3,
        "valid_json": f"{valid}/{repeats * concurrency}",
    }


def compile_times(url, samples):
    def one(schema):
        b = {"text": "JSON:", "sampling_params": {"temperature": 0, "max_new_tokens": 1, "json_schema": schema}}
        return post(url, b, stream=False)["e2e"]

    cold, warm, plain = [], [], []
    for _ in range(samples):
        s = dict(SCHEMA)
        s["$comment"] = uuid.uuid4().hex
        text = json.dumps(s)
        cold.append(one(text))
        warm.append(one(text))
        plain.append(post(url, {"text": "JSON:", "sampling_params": {"temperature": 0, "max_new_tokens": 1}},
                          stream=False)["e2e"])
    return statistics.median(cold) * 1e3, statistics.median(warm) * 1e3, statistics.median(plain) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (otherwise one is started)")
    ap.add_argument("--model", help="model path for the server this script starts")
    ap.add_argument("--grammar-backend", default="llguidance")
    ap.add_argument("--threads", type=int, default=0, help="--num-threads of the started server")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--compile-samples", type=int, default=5)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()

    server = None
    url = args.url
    if url is None:
        model = args.model or subprocess.check_output(["bash", os.path.join(ROOT, "scripts/fetch-model.sh")],
                                                      text=True).strip()
        server = Server(model, args.grammar_backend, args.threads)
        url = server.url
    try:
        # Warm up: first requests pay one-off costs (page faults, allocator growth).
        run_batch(url, [body("Hello", {"max_new_tokens": 8, "ignore_eos": True})] * 2)
        rows = [workload(url, c, args.repeats, args.max_tokens) for c in (1, 16)]
        cold, warm, plain = compile_times(url, args.compile_samples)
    finally:
        if server is not None:
            server.close()

    print(f"grammar backend: {args.grammar_backend}; server: {url if args.url else 'started by this script'}")
    print()
    print("| workload | output tokens/request | unconstrained ms/token | JSON-schema ms/token | ratio | valid JSON |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["constrained_ms"] / r["unconstrained_ms"]
        print(f"| decode, concurrency {r['concurrency']} | {r['tokens_mean']:.0f} | {r['unconstrained_ms']:.2f} | "
              f"{r['constrained_ms']:.2f} | {ratio:.3f} ({(ratio - 1) * 100:+.1f}%) | {r['valid_json']} |")
    print()
    print("| compile (1-token request, median) | e2e ms |")
    print("|---|---|")
    print(f"| unconstrained | {plain:.1f} |")
    print(f"| new schema (cold compile) | {cold:.1f} |")
    print(f"| same schema again (cached) | {warm:.1f} |")
    print(f"| compile cost (cold - cached) | {cold - warm:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "compile_ms": {"cold": cold, "cached": warm, "plain": plain}}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
