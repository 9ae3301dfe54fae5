//! tokenizer
