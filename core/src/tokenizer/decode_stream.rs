//! Incremental detokenization for streaming responses.
//!
//! Decoding one token at a time is wrong for most tokenizers: byte-level BPE tokens can hold a
//! fraction of a UTF-8 character, and SentencePiece decoders drop the leading space of the
//! first token they see. So each step decodes a short window of recent ids twice: the ids
//! already emitted since `prefix_offset` (the context), and the same plus the pending ones.
//! The difference is the new text. It is held back while it ends in U+FFFD, which is what the
//! decoder gives for an incomplete character, until the next token completes it.

use std::sync::Arc;

use super::{Tokenizer, TokenizerError};

/// A UTF-8 character takes at most 4 bytes, so a byte-level tokenizer completes one within 4
/// tokens. Text still ending in U+FFFD after this many pending tokens is not an incomplete
/// character but invalid bytes, and is emitted as it decodes.
const MAX_PENDING_TOKENS: usize = 8;

/// Turns generated token ids into text chunks, never splitting a character.
#[derive(Debug)]
pub struct DecodeStream {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// Ids from `prefix_offset` on; older ones are dropped as the window moves.
    ids: Vec<u32>,
    /// Start of the context window within `ids`.
    prefix_offset: usize,
    /// End of the ids whose text has been emitted.
    read_offset: usize,
}

impl DecodeStream {
    pub fn new(tokenizer: Arc<Tokenizer>, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one generated id; returns the text it completes ("" while a character is
    /// still incomplete).
    pub fn step(&mut self, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let prefix = self.decode(self.prefix_offset..self.read_offset)?;
        let full = self.decode(self.prefix_offset..self.ids.len())?;
        let pending = self.ids.len() - self.read_offset;
        if full.ends_with('\u{FFFD}') && pending < MAX_PENDING_TOKENS {
            return Ok(String::new());
        }
        let new_text = suffix_after(&prefix, &full);
        if new_text.is_empty() && full.len() <= prefix.len() {
            // The token decoded to nothing (a skipped special token): nothing to emit, but
            // it still counts as read so the window keeps moving.
            self.read_offset = self.ids.len();
            self.trim();
            return Ok(String::new());
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.trim();
        Ok(new_text.to_owned())
    }

    /// Ends the stream: returns the text of ids still held back (incomplete characters
    /// become U+FFFD) and resets the stream.
    pub fn flush(&mut self) -> String {
        let rest = if self.read_offset < self.ids.len() {
            let prefix = self.decode(self.prefix_offset..self.read_offset);
            let full = self.decode(self.prefix_offset..self.ids.len());
            match (prefix, full) {
                (Ok(prefix), Ok(full)) => suffix_after(&prefix, &full).to_owned(),
                _ => String::new(),
            }
        } else {
            String::new()
        };
        self.ids.clear();
        self.prefix_offset = 0;
        self.read_offset = 0;
        rest
    }

    fn decode(&self, range: std::ops::Range<usize>) -> Result<String, TokenizerError> {
        self.tokenizer
            .decode(&self.ids[range], self.skip_special_tokens)
    }

    /// Drops ids before the context window so memory stays bounded on long generations.
    fn trim(&mut self) {
        if self.prefix_offset > 0 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `full` after its common prefix with `prefix`, cut at a character boundary.
/// Decoders extend the context's text, so normally this is just `full[prefix.len()..]`.
fn suffix_after<'a>(prefix: &str, full: &'a str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let common = prefix
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(prefix.len().min(full.len()));
    full.get(common..).unwrap_or_default()
}
