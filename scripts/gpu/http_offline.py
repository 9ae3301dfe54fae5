"""The offline benchmark's workload sent through the HTTP server, as users reach it: N prompts
of exactly IN random token ids, each asking for exactly OUT tokens (`ignore_eos`), all sent at
once as native `/generate` requests on their own connections (plain asyncio sockets, no client
library); prints one JSON line with the output tokens per second over the whole run.
Usage: http_offline.py PORT N IN OUT VOCAB [SEED]"""
import asyncio, json, random, resource, sys, time

port, n, inp, out, vocab = (int(a) for a in sys.argv[1:6])
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 1
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
rng = random.Random(seed)
bodies = [json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(inp)],
                      "sampling_params": {"max_new_tokens": out, "ignore_eos": True,
                                          "temperature": 0}}).encode() for _ in range(n)]


async def one(body):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /generate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
    await w.drain()
    resp = await r.read()
    w.close()
    head, _, payload = resp.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    if b"transfer-encoding: chunked" in head.lower():
        chunks, rest = [], payload
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            k = int(size, 16)
            if k == 0:
                break
            chunks.append(rest[:k])
            rest = rest[k + 2:]
        payload = b"".join(chunks)
    return json.loads(payload)["meta_info"]["completion_tokens"]


async def main():
    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(b) for b in bodies), return_exceptions=True)
    secs = time.perf_counter() - t0
    ok = [d for d in done if isinstance(d, int)]
    print(json.dumps({"num_prompts": n, "input_len": inp, "output_len": out, "ok": len(ok),
                      "failed": n - len(ok), "output_tokens": sum(ok), "seconds": secs,
                      "output_tok_s": sum(ok) / secs}))

asyncio.run(main())
