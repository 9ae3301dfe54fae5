//! The bytes each token id stands for, as grammar backends need them.

use std::collections::HashMap;

use tokenizers::DecoderWrapper;

use super::GrammarError;
use crate::tokenizer::Tokenizer;

/// How a tokenizer's vocabulary entries spell their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2 byte-level BPE: every byte is one printable character (`Ġ` for a space).
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xXX>` tokens for raw bytes.
    SentencePiece,
    /// The token text is the text.
    Plain,
}

/// Token bytes of a vocabulary, indexed by id, sized to the model's vocabulary.
#[derive(Debug)]
pub(crate) struct TokenVocab {
    /// `bytes[id]`: what the token decodes to; empty for ids without a token, for special
    /// tokens, and for ids past the model's vocabulary.
    pub(crate) bytes: Vec<Vec<u8>>,
    /// `special[id]`: a control token (never matches grammar text). Its text is in
    /// `special_text`.
    pub(crate) special: Vec<bool>,
    pub(crate) special_text: HashMap<u32, String>,
    /// Ids that end generation, the main one first; all below `model_vocab`.
    pub(crate) eos: Vec<u32>,
    /// The logits width; masks have this many entries.
    pub(crate) model_vocab: usize,
}

impl TokenVocab {
    pub(crate) fn new(tokenizer: &Tokenizer, model_vocab: usize) -> Result<Self, GrammarError> {
        if model_vocab == 0 {
            return Err(GrammarError::Vocabulary("the vocabulary size is 0".into()));
        }
        let tok_vocab = tokenizer.vocab_size();
        let size = tok_vocab.max(model_vocab);
        let spelling = spelling(tokenizer);
        let byte_of_char = byte_level_table();
        let added = tokenizer.inner().get_added_tokens_decoder();

        let mut bytes = vec![Vec::new(); size];
        let mut special = vec![false; size];
        let mut special_text = HashMap::new();
        for id in 0..size.min(model_vocab) {
            let id32 = id as u32;
            let Some(text) = tokenizer.id_to_token(id32) else {
                continue;
            };
            let added_token = added.get(&id32);
            if tokenizer.is_special(id32) || added_token.is_some_and(|t| t.special) {
                special[id] = true;
                special_text.insert(id32, text);
                continue;
            }
            bytes[id] = if added_token.is_some() {
                // Added tokens decode to their content.
                text.into_bytes()
            } else {
                token_bytes(&text, spelling, &byte_of_char)
            };
        }

        let eos: Vec<u32> = tokenizer
            .eos_token_ids()
            .iter()
            .copied()
            .filter(|&id| (id as usize) < model_vocab)
            .collect();
        if eos.is_empty() {
            return Err(GrammarError::Vocabulary(
                "the tokenizer has no EOS token inside the model's vocabulary".into(),
            ));
        }
        for &id in &eos {
            // An EOS id is never grammar text, whatever its token type says.
            bytes[id as usize].clear();
            if !special[id as usize] {
                special[id as usize] = true;
                special_text.insert(id, tokenizer.id_to_token(id).unwrap_or_default());
            }
        }
        Ok(TokenVocab {
            bytes,
            special,
            special_text,
            eos,
            model_vocab,
        })
    }

    /// Number of ids the backends index: the larger of the tokenizer's and the model's sizes.
    pub(crate) fn size(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }
}

fn spelling(tokenizer: &Tokenizer) -> Spelling {
    fn of(decoder: &DecoderWrapper) -> Option<Spelling> {
        match decoder {
            DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
            DecoderWrapper::ByteFallback(_) | DecoderWrapper::Metaspace(_) => {
                Some(Spelling::SentencePiece)
            }
            DecoderWrapper::Sequence(seq) => {
                let found: Vec<Spelling> = seq.get_decoders().iter().filter_map(of).collect();
                if found.contains(&Spelling::ByteLevel) {
                    Some(Spelling::ByteLevel)
                } else {
                    found.first().copied()
                }
            }
            _ => None,
        }
    }
    tokenizer
        .inner()
        .get_decoder()
        .and_then(of)
        .unwrap_or(Spelling::Plain)
}

/// GPT-2's byte-to-unicode table, inverted: printable Latin-1 bytes map to themselves, the
/// others to U+0100 onwards in byte order.
fn byte_level_table() -> HashMap<char, u8> {
    let mut table = HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
        table.insert(c, b);
    }
    table
}

fn token_bytes(text: &str, spelling: Spelling, byte_of_char: &HashMap<char, u8>) -> Vec<u8> {
    match spelling {
        Spelling::ByteLevel => {
            // As the byte-level decoder does: a token with a character outside the table
            // (an added token spelled in plain text) decodes to its text.
            let mapped: Option<Vec<u8>> = text
                .chars()
                .map(|c| byte_of_char.get(&c).copied())
                .collect();
            mapped.unwrap_or_else(|| text.as_bytes().to_vec())
        }
        Spelling::SentencePiece => {
            if let Some(b) = parse_byte_token(text) {
                vec![b]
            } else {
                text.replace('\u{2581}', " ").into_bytes()
            }
        }
        Spelling::Plain => text.as_bytes().to_vec(),
    }
}

/// `<0xAB>` → 0xAB.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn byte_level_table_is_a_bijection() {
        let table = byte_level_table();
        assert_eq!(table.len(), 256);
        assert_eq!(table.get(&'Ġ'), Some(&b' '));
        assert_eq!(table.get(&'Ċ'), Some(&b'\n'));
        assert_eq!(table.get(&'a'), Some(&b'a'));
    }

    #[test]
    fn sentencepiece_spelling() {
        let table = byte_level_table();
        assert_eq!(
            token_bytes("<0x0A>", Spelling::SentencePiece, &table),
            b"\n"
        );
        assert_eq!(
            token_bytes("\u{2581}the", Spelling::SentencePiece, &table),
            b" the"
        );
        assert_eq!(
            token_bytes("<0x0>", Spelling::SentencePiece, &table),
            b"<0x0>"
        );
    }
}
