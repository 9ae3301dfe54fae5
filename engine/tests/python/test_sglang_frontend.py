"""SGLang's own frontend language (`sglang.RuntimeEndpoint`) against a running sgl-engine.

Run by engine/tests/sglang_frontend.rs, which starts the server and sets SGL_BASE_URL.
Needs `pip install --no-deps sglang==0.4.3` plus its light imports (requests, numpy, tqdm,
ipython, setproctitle, aiohttp). Runs under pytest, or as a plain script.

The programs use `gen` (with stop strings, a regex and an int dtype), `select` (scored by the
server's prompt logprobs), `fork`/`join` (parallel continuations of one cached prefix), batches
and streaming.
"""

import os
import re
import sys

import sglang as sgl

BASE_URL = os.environ.get("SGL_BASE_URL", "http://127.0.0.1:30000").rstrip("/")

_backend = None


def backend():
    global _backend
    if _backend is None:
        _backend = sgl.RuntimeEndpoint(BASE_URL)
        sgl.set_default_backend(_backend)
    return _backend


@sgl.function
def capital(s, country):
    s += "Q: What is the capital of " + country + "?\nA: The capital of " + country + " is"
    s += sgl.gen("answer", max_tokens=12, temperature=0, stop="\n")


@sgl.function
def counting(s):
    s += "Count from one to twenty in words: one, two,"
    s += sgl.gen("answer", max_tokens=24, temperature=0, ignore_eos=True)


@sgl.function
def quiz(s):
    s += "The capital of France is the city of "
    s += sgl.select("city", choices=["Paris", "Tokyo xylophone", "Berlin submarine"])
    s += ".\nA number from 10 to 99: "
    s += sgl.gen("number", max_tokens=6, regex=r"[1-9][0-9]", temperature=0)
    s += "\nHow many legs does a cat have? "
    s += sgl.gen("legs", max_tokens=6, dtype=int, temperature=0)


@sgl.function
def brainstorm(s, topic):
    s += "Here are three short ideas about " + topic + ".\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f"Idea {i + 1}:"
        f += sgl.gen("idea", max_tokens=10, temperature=0.8, stop="\n")
    forks.join()
    s += "Ideas: " + " | ".join(f["idea"] for f in forks)


def test_model_info():
    b = backend()
    assert b.get_model_name()
    info = b.get_server_info()
    assert isinstance(info, dict)


def test_gen_and_stop():
    backend()
    state = capital.run(country="France")
    answer = state["answer"]
    assert isinstance(answer, str) and answer.strip(), state.text()
    assert "\n" not in answer
    assert state.text().endswith(answer)


def test_select_regex_and_int():
    backend()
    state = quiz.run()
    assert state["city"] == "Paris", state.text()
    assert re.fullmatch(r"[1-9][0-9]", state["number"]), repr(state["number"])
    assert re.fullmatch(r"-?\d+", state["legs"].strip()), repr(state["legs"])
    meta = state.get_meta_info("city")
    assert meta is not None and len(meta["normalized_prompt_logprobs"]) == 3, meta


def test_fork_join():
    backend()
    state = brainstorm.run(topic="gardening")
    text = state.text()
    assert text.count(" | ") == 2, text
    ideas = text.split("Ideas: ", 1)[1].split(" | ")
    assert len(ideas) == 3


def test_run_batch():
    backend()
    states = capital.run_batch([{"country": c} for c in ["France", "Japan", "Italy", "Spain"]], num_threads=4)
    assert len(states) == 4
    for st in states:
        assert st["answer"].strip(), st.text()
    # Greedy output is the same alone and in a batch.
    again = capital.run(country="Japan")
    assert again["answer"] == states[1]["answer"]


def test_streaming():
    backend()
    # 24 tokens over as many decode steps: the frontend reads them as they come, in several
    # pieces (a reader that falls behind merges what arrived meanwhile, so a two-token answer
    # may legitimately come as one piece).
    state = counting.run(stream=True)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) >= 2, pieces
    assert "".join(pieces) == state["answer"]


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}")
            except Exception as e:  # noqa: BLE001 - report every failure
                failed += 1
                print(f"FAIL {name}: {e!r}")
    sys.exit(1 if failed else 0)
