"""SGLang's own benchmark client (`sglang.bench_serving`, backend `sglang`) against a running
sgl-engine: 24 streamed `/generate` requests at concurrency 16, every one a success.

Run by engine/tests/sglang_frontend.rs, which starts the server with one running request at a
time. A long request holds that slot for 7 s while the benchmark's requests wait in the queue,
past the server's keep-alive interval (5 s). The client reads every non-empty line of the
stream as a `data:` payload; the test fails if the server sends anything else while a stream
waits.

`sglang.bench_serving` imports `transformers` for its tokenizer helpers, which this client
function does not use; a placeholder module stands in for it when transformers is absent.
"""

import argparse
import asyncio
import time
import os
import sys
import types

BASE_URL = os.environ.get("SGL_BASE_URL", "http://127.0.0.1:30000").rstrip("/")

try:
    import transformers  # noqa: F401
except ImportError:
    placeholder = types.ModuleType("transformers")
    for name in (
        "AutoTokenizer",
        "PreTrainedTokenizer",
        "PreTrainedTokenizerBase",
        "PreTrainedTokenizerFast",
    ):
        setattr(placeholder, name, type(name, (), {}))
    sys.modules["transformers"] = placeholder

from sglang import bench_serving  # noqa: E402

REQUESTS = 20
CONCURRENCY = 16
OUTPUT_LEN = 16
HOLD_SECONDS = 7.0


def test_streamed_requests_at_concurrency_16_all_succeed():
    # The module-level options the request function reads (bench_serving's defaults).
    bench_serving.args = argparse.Namespace(
        disable_ignore_eos=False, disable_stream=False, return_logprob=False
    )
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i):
        async with gate:
            return await bench_serving.async_request_sglang_generate(
                bench_serving.RequestFuncInput(
                    prompt=f"Request {i}: write a long story about a lighthouse keeper.",
                    api_url=BASE_URL + "/generate",
                    prompt_len=12,
                    output_len=OUTPUT_LEN,
                    model="default",
                    lora_name=None,
                    extra_request_body={},
                )
            )

    async def run():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            # The long request takes the only running slot (its first chunk proves it runs),
            # then leaves after HOLD_SECONDS, which aborts it and frees the slot.
            blocker = await session.post(
                BASE_URL + "/generate",
                json={
                    "text": "Hold the slot:",
                    "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True},
                    "stream": True,
                },
            )
            assert blocker.status == 200, await blocker.text()
            await blocker.content.readline()
            started = time.perf_counter()
            tasks = [asyncio.create_task(one(i)) for i in range(REQUESTS)]
            await asyncio.sleep(HOLD_SECONDS)
            blocker.close()
            outputs = await asyncio.gather(*tasks)
            return outputs, time.perf_counter() - started

    outputs, _ = asyncio.run(run())
    failed = [o.error for o in outputs if not o.success]
    assert not failed, f"{len(failed)} of {REQUESTS} failed; first: {failed[0]}"
    assert all(o.generated_text for o in outputs)
    # Some streams waited in the queue past the keep-alive interval (so the server wrote
    # keep-alives into them): otherwise this test would prove nothing.
    longest = max(o.ttft for o in outputs)
    assert longest > HOLD_SECONDS - 0.5, (
        f"no stream waited past the keep-alive interval (longest wait {longest:.1f} s)"
    )


if __name__ == "__main__":
    test_streamed_requests_at_concurrency_16_all_succeed()
    print("PASS test_streamed_requests_at_concurrency_16_all_succeed")
