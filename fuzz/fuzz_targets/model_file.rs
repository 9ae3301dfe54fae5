//! A model file of any bytes (a hostile or damaged download): GGUF header, metadata,
//! tokenizer and weights, or a safetensors header. An error, never a crash or an allocation
//! the file's claims alone ask for.
//! The body is `sgl_fuzz::model_file` (src/lib.rs), which `engine/tests/fuzz_replay.rs` replays on
//! the seeds in `corpus-seeds/model_file/` on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sgl_fuzz::model_file(data));
