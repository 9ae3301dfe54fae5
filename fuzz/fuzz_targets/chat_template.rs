//! Chat templates on any conversation a request can send: the input is JSON (`messages`,
//! `tools`, `chat_template_kwargs`) rendered with the default model's template and a
//! tool-calling template; a rendered prompt or an error, never a panic.
//! The body is `sgl_fuzz::chat_template` (src/lib.rs), which `engine/tests/fuzz_replay.rs` replays on
//! the seeds in `corpus-seeds/chat_template/` on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sgl_fuzz::chat_template(data));
