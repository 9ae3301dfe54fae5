//! The GBNF/EBNF grammar converter on any text: a Lark grammar or an error, never a panic
//! or a stack overflow (requests choose the nesting depth).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = sgl_engine::grammar::gbnf_to_lark(text);
});
