//! A request body as `/generate` and the OpenAI routes read it: any bytes give a parsed
//! request or an error, never a panic.
//! The body is `sgl_fuzz::request_body` (src/lib.rs), which `engine/tests/fuzz_replay.rs` replays on
//! the seeds in `corpus-seeds/request_body/` on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sgl_fuzz::request_body(data));
