#!/usr/bin/env python3
"""Writes tiny_spm.gguf and tiny_spm_reference.json: a small SentencePiece BPE vocabulary
(byte fallback, as Llama 2 and Mistral have) in a vocab-only GGUF with
`tokenizer.ggml.model = "llama"`, and llama.cpp's tokenization of varied strings with it.

The vocabulary is trained here with sentencepiece on a small built-in corpus; llama.cpp (through
llama-cpp-python, vocab only) gives the reference ids.

    pip install sentencepiece gguf llama-cpp-python
    python3 core/tests/data/tokenizer/make_tiny_spm.py
"""

import codecs
import json
import os
import tempfile
import this

import gguf
import llama_cpp
import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))

CORPUS_EXTRA = """The quick brown fox jumps over the lazy dog. Hello world! How are you today?
Café crème brûlée, naïve façade. Привет, мир! 你好，世界！ 1234567890 def main(): return 0
Streaming tokenizers must never split a character across chunks. Numbers like 3.14159 and 2024.
"""

TEXTS = [
    "Hello world",
    "Beautiful is better than ugly.",
    " leading space",
    "  two leading spaces and trailing  ",
    "line one\nline two\n\n",
    "tabs\tand\ttabs",
    "1234567890 and 3.14159",
    "Errors should never pass silently.",
    "Café crème brûlée",
    "Привет, мир!",
    "你好，世界！ unseen 漢字",
    "emoji 😀 needs byte fallback 👍🏽",
    "<|user|>Hi there<|end|>",
    "text<|end|>more",
    "",
]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def train(workdir):
    corpus = os.path.join(workdir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write((codecs.decode(this.s, "rot13") + "\n" + CORPUS_EXTRA) * 3)
    prefix = os.path.join(workdir, "tiny")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=600, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False, split_digits=True,
        allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", user_defined_symbols=["<|user|>"],
        control_symbols=["<|end|>"], num_threads=1, minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def token_type(sp, i):
    if sp.is_unknown(i):
        return TOKEN_UNKNOWN
    if sp.is_control(i):
        return TOKEN_CONTROL
    if sp.is_unused(i):
        return TOKEN_UNUSED
    if sp.is_byte(i):
        return TOKEN_BYTE
    piece = sp.id_to_piece(i)
    return TOKEN_USER_DEFINED if piece == "<|user|>" else TOKEN_NORMAL


def write_gguf(sp, path):
    n = sp.get_piece_size()
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types([token_type(sp, i) for i in range(n)])
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    with tempfile.TemporaryDirectory() as workdir:
        sp = train(workdir)
    model_path = os.path.join(HERE, "tiny_spm.gguf")
    write_gguf(sp, model_path)
    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    encodings = []
    for text in TEXTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        decoded = llm.detokenize(ids, special=True).decode("utf-8", errors="replace")
        encodings.append({"text": text, "ids": ids, "decoded": decoded})
    out = {"model": "tiny_spm.gguf", "tokenizer": f"llama-cpp-python {llama_cpp.__version__}",
           "encodings": encodings}
    dest = os.path.join(HERE, "tiny_spm_reference.json")
    with open(dest, "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write(f'  "model": {json.dumps(out["model"])},\n')
        f.write(f'  "tokenizer": {json.dumps(out["tokenizer"])},\n')
        f.write('  "encodings": [\n')
        f.write(",\n".join("    " + json.dumps(e, ensure_ascii=False) for e in encodings))
        f.write("\n  ]\n}\n")
    print(f"wrote {model_path} ({os.path.getsize(model_path)} bytes) and {dest}")


if __name__ == "__main__":
    main()
