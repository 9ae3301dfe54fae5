//! The GBNF/EBNF grammar converter on any text: a Lark grammar or an error, never a panic
//! or a stack overflow (requests choose the nesting depth).
//! The body is `sgl_fuzz::gbnf` (src/lib.rs), which `engine/tests/fuzz_replay.rs` replays on
//! the seeds in `corpus-seeds/gbnf/` on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sgl_fuzz::gbnf(data));
