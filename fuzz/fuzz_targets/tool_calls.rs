//! The tool-call parsers on any model output, whole and streamed in pieces: the first byte
//! picks the parser and the piece length.
//! The body is `sgl_fuzz::tool_calls` (src/lib.rs), which `engine/tests/fuzz_replay.rs` replays on
//! the seeds in `corpus-seeds/tool_calls/` on stable Rust.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sgl_fuzz::tool_calls(data));
