//! Flags read by name (`--model DIR`, `--batch N`, ...), as the GPU scripts pass them, and
//! random token ids for the benchmarks' prompts.

use rand::Rng;
use sgl_core::error::{EngineError, Result};

pub(crate) fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

pub(crate) fn arg_usize(args: &[String], name: &str, default: usize) -> Result<usize> {
    match arg(args, name) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| EngineError::InvalidArgument(format!("{name} expects a number, got {v}"))),
    }
}

pub(crate) fn random_tokens(rng: &mut impl Rng, n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}
