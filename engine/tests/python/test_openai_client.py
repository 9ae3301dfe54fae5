"""The official `openai` Python client against a running sgl-engine.

Run by engine/tests/openai_client.rs, which starts the server and sets:
  SGL_BASE_URL  e.g. http://127.0.0.1:40123
  SGL_API_KEY   the server's --api-key
Runs under pytest, or as a plain script (`python3 test_openai_client.py`).
"""

import json
import os
import sys

import jsonschema
import openai

BASE_URL = os.environ.get("SGL_BASE_URL", "http://127.0.0.1:30000").rstrip("/") + "/v1"
API_KEY = os.environ.get("SGL_API_KEY", "")


def client(key=None):
    return openai.OpenAI(base_url=BASE_URL, api_key=key or API_KEY or "none", max_retries=0, timeout=300)


def model_name():
    models = client().models.list()
    assert len(models.data) == 1, models
    return models.data[0].id


def test_models():
    assert model_name()


def test_chat():
    r = client().chat.completions.create(
        model=model_name(),
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0,
        max_tokens=12,
    )
    assert r.object == "chat.completion"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_default_model_name_and_seed():
    kwargs = dict(
        model="default",
        messages=[{"role": "user", "content": "Pick a random word."}],
        temperature=1.0,
        seed=1234,
        max_tokens=8,
    )
    a = client().chat.completions.create(**kwargs)
    b = client().chat.completions.create(**kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_chat_stream():
    kwargs = dict(
        model=model_name(),
        messages=[{"role": "user", "content": "Write a short sentence about cats."}],
        temperature=0,
        max_tokens=12,
    )
    full = client().chat.completions.create(**kwargs)
    stream = client().chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    pieces, roles, finish, usage = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        if delta.content:
            pieces.append(delta.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert roles == ["assistant"]
    assert len(pieces) > 1
    assert "".join(pieces) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


def test_completion_and_stream():
    kwargs = dict(model=model_name(), prompt="The quick brown fox", temperature=0, max_tokens=8)
    r = client().completions.create(**kwargs)
    assert r.object == "text_completion"
    text = r.choices[0].text
    assert text
    pieces = [c.choices[0].text for c in client().completions.create(stream=True, **kwargs) if c.choices]
    assert "".join(pieces) == text
    batch = client().completions.create(**{**kwargs, "prompt": ["The quick brown fox", "Hello"]})
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == text


def test_stop():
    kwargs = dict(
        model=model_name(),
        prompt="Count: 1, 2, 3, 4,",
        temperature=0,
        max_tokens=20,
        extra_body={"ignore_eos": True},
    )
    full = client().completions.create(**kwargs).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[1]
    want = full[: full.index(stop)]
    r = client().completions.create(stop=[stop], **kwargs)
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client().completions.create(stop=stop, stream=True, **kwargs) if c.choices)
    assert streamed == want


def test_chat_logprobs():
    kwargs = dict(
        model=model_name(),
        messages=[{"role": "user", "content": "Name three colors."}],
        temperature=0,
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    r = client().chat.completions.create(**kwargs)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        assert bytes(t.bytes) == t.token.encode("utf-8")
        assert len(t.top_logprobs) == 2
        # Greedy decoding picks the most likely token.
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == t.logprob
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
    streamed = [
        t
        for chunk in client().chat.completions.create(stream=True, **kwargs)
        if chunk.choices and chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content))


def test_completion_logprobs():
    r = client().completions.create(
        model=model_name(),
        prompt="The quick brown fox",
        temperature=0,
        max_tokens=5,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5
    assert "".join(lp.tokens) == choice.text
    for token, logprob, top, offset in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert choice.text[offset:].startswith(token)
        assert len(top) == 3
        assert max(top.values()) == logprob
    echoed = client().completions.create(
        model=model_name(), prompt="The quick brown fox", temperature=0, max_tokens=2, logprobs=1, echo=True
    )
    lp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith("The quick brown fox")
    assert lp.token_logprobs[0] is None
    assert len(lp.tokens) == echoed.usage.prompt_tokens + echoed.usage.completion_tokens


def test_parallel_samples():
    kwargs = dict(
        model=model_name(),
        messages=[{"role": "user", "content": "Write a word about the sea."}],
        temperature=1.0,
        seed=7,
        max_tokens=6,
        n=3,
        extra_body={"ignore_eos": True},
    )
    r = client().chat.completions.create(**kwargs)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    again = client().chat.completions.create(**kwargs)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    finished = {}
    for chunk in client().completions.create(
        model=model_name(), prompt="Hello", temperature=0, max_tokens=4, n=2, stream=True
    ):
        for c in chunk.choices:
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert sorted(finished) == [0, 1]


def expect_bad_request(param_fragment, **kwargs):
    try:
        client().chat.completions.create(**kwargs)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert param_fragment in str(e), str(e)
        return
    raise AssertionError(f"expected a 400 for {kwargs}")


def test_errors():
    msgs = [{"role": "user", "content": "hi"}]
    name = model_name()
    expect_bad_request("temperature", model=name, messages=msgs, temperature=-1)
    expect_bad_request("top_p", model=name, messages=msgs, top_p=1.5)
    expect_bad_request("max_tokens", model=name, messages=msgs, max_tokens=0)
    expect_bad_request("messages", model=name, messages=[])
    expect_bad_request("top_k", model=name, messages=msgs, extra_body={"top_k": 0})
    expect_bad_request("top_logprobs", model=name, messages=msgs, logprobs=True, top_logprobs=50)
    expect_bad_request("frequency_penalty", model=name, messages=msgs, frequency_penalty=3)
    expect_bad_request("logit_bias", model=name, messages=msgs, logit_bias={"not-a-token": 1})
    expect_bad_request("n", model=name, messages=msgs, n=0)
    try:
        client().chat.completions.create(model="no-such-model", messages=msgs)
        raise AssertionError("expected a 404 for an unknown model")
    except openai.NotFoundError as e:
        assert name in str(e)


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"enum": ["chess", "music", "running"]}, "maxItems": 2},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}


def test_response_format_json_schema():
    kwargs = dict(
        model=model_name(),
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
        },
        max_tokens=300,
    )
    for temperature in (0, 0.8):
        r = client().chat.completions.create(temperature=temperature, seed=5, **kwargs)
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content), PERSON_SCHEMA)
    pieces = [
        c.choices[0].delta.content
        for c in client().chat.completions.create(temperature=0, stream=True, **kwargs)
        if c.choices and c.choices[0].delta.content
    ]
    jsonschema.validate(json.loads("".join(pieces)), PERSON_SCHEMA)
    # json_object, and an invalid schema (a 400 with the compiler's message).
    r = client().chat.completions.create(
        model=model_name(),
        messages=[{"role": "user", "content": "Return a JSON object with the keys name and color for a cat."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=300,
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    expect_bad_request(
        "frobnicate",
        model=model_name(),
        messages=[{"role": "user", "content": "hi"}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
    )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


def test_tools_named_choice():
    kwargs = dict(
        model=model_name(),
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=120,
    )
    r = client().chat.completions.create(**kwargs)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])

    # Streamed: the fragments join to the same arguments.
    names, fragments, finish = [], [], None
    for chunk in client().chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        for tc in c.delta.tool_calls or []:
            assert tc.index == 0
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.function and tc.function.arguments:
                fragments.append(tc.function.arguments)
        if c.finish_reason:
            finish = c.finish_reason
    assert names == ["get_weather"]
    assert finish == "tool_calls"
    assert json.loads("".join(fragments)) == arguments

    # The conversation goes on with the call and the tool's answer.
    follow = client().chat.completions.create(
        model=model_name(),
        messages=kwargs["messages"]
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'},
        ],
        tools=[WEATHER_TOOL],
        temperature=0,
        max_tokens=12,
    )
    assert follow.choices[0].message.role == "assistant"


def test_auth():
    if not API_KEY:
        return
    try:
        client(key="wrong-key").models.list()
        raise AssertionError("expected a 401 with a wrong key")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


if __name__ == "__main__":
    failed = 0
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    for name, fn in tests:
        try:
            fn()
            print(f"PASS {name}")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit non-zero
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
