#!/usr/bin/env python3
"""Greedy reference outputs of SmolLM2-135M-Instruct from llama.cpp.

Tokenizes each prompt with llama.cpp's own tokenizer (chat prompts through the model's chat
template as rendered by our engine's template: ChatML), runs greedy decoding for 32 tokens, and
writes the prompt ids, output ids and each step's top-2 logit margin (to spot near-ties) as JSON.

    pip install llama-cpp-python==0.3.36 numpy
    python3 scripts/reference/llama_cpp_greedy.py "$(scripts/fetch-model.sh)" \
        > engine/tests/data/reference/llama_cpp_greedy.json
"""
import json
import sys

import numpy as np
from llama_cpp import Llama

STEPS = 32
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    chat("What is the boiling point of water in Celsius?"),
    chat("Write a haiku about autumn leaves."),
    chat("List three primary colors."),
    "Q: What is 12 times 7?\nA:",
    "The three states of matter are",
    "Water is made of hydrogen and",
    "The largest planet in our solar system is",
    "import numpy as np\n\n# Create an array of zeros\n",
    "1, 2, 3, 4, 5,",
    "Monday, Tuesday, Wednesday,",
    chat("What is the capital of Japan?"),
    chat("Translate 'thank you' into French."),
    chat("Name a fruit that is yellow."),
    chat("How many legs does a spider have?"),
    "The sun rises in the",
    "Machine learning is a field of",
    "<html>\n<head>\n<title>",
]


def main():
    path = sys.argv[1]
    llm = Llama(model_path=path, n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False)
    out = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        gen, margins = [], []
        for _ in range(STEPS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top2 = np.argsort(logits)[-2:]
            tok = int(top2[1])
            margins.append(float(logits[top2[1]] - logits[top2[0]]))
            gen.append(tok)
            llm.eval([tok])
        out.append({"prompt": text, "input_ids": ids, "output_ids": gen,
                    "top2_margin": [round(m, 4) for m in margins]})
    json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "engine": "llama-cpp-python 0.3.36",
               "steps": STEPS, "cases": out}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
