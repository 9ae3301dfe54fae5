#!/usr/bin/env python3
"""Writes smollm2_reference.json: llama.cpp's tokenization of varied strings with the SmolLM2
GGUF vocabulary, and transformers-style renderings of its chat template.

Token ids come from llama.cpp itself (through llama-cpp-python, vocab only). Chat template
renderings use transformers' own template compiler when it is installed, else Jinja2
configured as transformers configures it (trim_blocks, lstrip_blocks, loop controls,
raise_exception, its tojson).

    pip install llama-cpp-python gguf jinja2 [transformers]
    python3 core/tests/data/tokenizer/make_reference.py [path/to/SmolLM2.gguf]
"""

import json
import os
import sys

import jinja2
import jinja2.ext
import llama_cpp
from gguf import GGUFReader
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_GGUF = os.path.join(
    HERE, "..", "..", "..", "..", ".cache", "models", "smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    "   leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between words",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "tabs\tand\t\ttabs",
    "   \n  \t  \n",
    "a  b   c    d",
    "1234567890",
    "The year 2024 had 366 days; pi is about 3.14159.",
    "Mixed: abc123def 4.5e-3 0x1F $100.00 50%",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'fn main() { println!("{}", 1 + 2); }',
    '<html><body class="x">&amp;</body></html>',
    "I'm sure you've heard they'll say we'd",
    "URL: https://example.com/path?q=1&r=two#frag, email@example.com @user #tag",
    "emoji: 😀🎉👍🏽 family 👨‍👩‍👧",
    "中文测试：你好，世界！",
    "日本語のテキストとカタカナ",
    "한국어 문장입니다",
    "Café crème brûlée, naïve façade, Ångström",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "Über naïve résumé — “quotes” and ‘single’ … ellipsis",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² + 𝑦² = 𝑧²",
    "Zero-width\u200bspace and non-breaking\u00a0space",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more text<|endoftext|>",
    "<repo_name>sgl<file_sep>main.rs",
    "<|im_start and <|im_end",
    "",
]

CHATS = {
    "system_and_user": {
        "messages": [
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": "Where is the treasure?"},
        ],
        "add_generation_prompt": True,
    },
    "user_only": {
        "messages": [{"role": "user", "content": "What is 2+2?"}],
        "add_generation_prompt": True,
    },
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
        "add_generation_prompt": False,
    },
    "multi_turn_generation_prompt": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye."},
        ],
        "add_generation_prompt": True,
    },
}


def compile_template(source):
    """The chat template compiled by transformers itself when it is installed, else by Jinja2
    set up the way transformers sets it up."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return hf_environment().from_string(source)
    return _compile_jinja_template(source)


def hf_environment():
    """Jinja2 set up the way transformers renders chat templates."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def is_flat(value):
    """A scalar, or a list of scalars."""
    if isinstance(value, list):
        return all(not isinstance(v, (dict, list)) for v in value)
    return not isinstance(value, dict)


def compact_json(value, indent=""):
    """Pretty JSON that writes each object holding only flat values on one line, so a string
    and its ids read together."""
    inner = indent + "  "
    if isinstance(value, dict) and not all(is_flat(v) for v in value.values()):
        items = [f"{inner}{json.dumps(k)}: {compact_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and not is_flat(value):
        items = [inner + compact_json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return json.dumps(value, ensure_ascii=False)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    reader = GGUFReader(path)
    tokens = field(reader, "tokenizer.ggml.tokens")
    template_source = field(reader, "tokenizer.chat_template")
    bos = tokens[field(reader, "tokenizer.ggml.bos_token_id")]
    eos = tokens[field(reader, "tokenizer.ggml.eos_token_id")]

    encodings = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        decoded = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        encodings.append({"text": text, "ids": ids, "decoded": decoded})

    template = compile_template(template_source)
    chats = {}
    for name, chat in CHATS.items():
        rendered = template.render(messages=chat["messages"],
                                   add_generation_prompt=chat["add_generation_prompt"],
                                   bos_token=bos, eos_token=eos, tools=None, documents=None)
        ids = llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)
        chats[name] = dict(chat, rendered=rendered, ids=ids)

    out = {
        "model": os.path.basename(path),
        "tokenizer": f"llama-cpp-python {llama_cpp.__version__}",
        "encodings": encodings,
        "chats": chats,
    }
    dest = os.path.join(HERE, "smollm2_reference.json")
    with open(dest, "w", encoding="utf-8") as f:
        f.write(compact_json(out) + "\n")
    print(f"wrote {dest}: {len(encodings)} strings, {len(chats)} chats")


if __name__ == "__main__":
    main()
