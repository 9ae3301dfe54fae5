//! Tokenizers from GGUF metadata, built to tokenize as llama.cpp does.
//!
//! `tokenizer.ggml.model = "gpt2"`: byte-level BPE. The vocabulary and merges go into a
//! `tokenizers` BPE model; `tokenizer.ggml.pre` names the pre-tokenization regexes, which are
//! applied in order, each splitting the pieces of the previous one and keeping both the matches
//! and the text between them (llama.cpp's `unicode_regex_split`).
//!
//! `tokenizer.ggml.model = "llama"`: SentencePiece vocabulary with scores. llama.cpp merges the
//! adjacent pair whose concatenation has the highest score; a BPE model whose merge ranks follow
//! the merged token's score does the same, with `<0xXX>` byte tokens as fallback.
//!
//! Token types 3 (control) and 4 (user-defined) become added tokens, so their text in the
//! input always maps to their single id; control tokens are special (skipped on request).

use std::collections::{HashMap, HashSet};

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use super::{ChatTemplate, Tokenizer, TokenizerError};

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_NORMAL: i64 = 1;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Token texts llama.cpp treats as end of generation when the vocabulary has them.
const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// GPT-2's pre-tokenization regex. llama.cpp's own matcher for it also takes a whitespace run
/// that the lookahead alternative leaves over, hence the final `\s+` (as in `tokenizers`).
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a `tokenizer.ggml.pre` value pre-tokenizes: its regexes in order, and whether whole
/// words found in the vocabulary skip the merges (llama.cpp `ignore_merges`).
struct PreTokenization {
    regexes: &'static [&'static str],
    ignore_merges: bool,
}

fn pre_tokenization(pre: Option<&str>) -> PreTokenization {
    const DEFAULT: &[&str] = &[
        r"[\p{P}\$\+<=>\^~\|]+",
        GPT2_REGEX,
        r"\p{N}+",
        r"[0-9][0-9][0-9]",
    ];
    let (regexes, ignore_merges): (&'static [&'static str], bool) = match pre {
        None | Some("default") => (DEFAULT, false),
        Some(
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "dbrx"
            | "smaug-bpe" | "lfm2",
        ) => (&[LLAMA3_REGEX], true),
        Some(
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b",
        ) => (&[r"\p{N}", GPT2_REGEX], false),
        Some(
            "gpt-2" | "gpt2" | "phi-2" | "jina-es" | "jina-de" | "jina-v2-es" | "jina-v2-de"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "trillion",
        ) => (&[GPT2_REGEX], false),
        Some("qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" | "hunyuan") => {
            (&[QWEN2_REGEX], false)
        }
        Some(other) => {
            tracing::warn!(
                pre = other,
                "unknown GGUF pre-tokenizer; using llama.cpp's default regexes, tokenization may differ from the model's"
            );
            (DEFAULT, false)
        }
    };
    PreTokenization {
        regexes,
        ignore_merges,
    }
}

/// Typed access to the `tokenizer.*` metadata, with errors that name the key.
struct Metadata<'a>(&'a HashMap<String, Value>);

impl<'a> Metadata<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key)
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(type_error(key, "a string", v)),
        }
    }

    fn id(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let id = integer(value).ok_or_else(|| type_error(key, "an integer", value))?;
        // Some converters write -1 for "no such token".
        Ok(u32::try_from(id).ok())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => match integer(v) {
                Some(i) => Ok(Some(i != 0)),
                None => Err(type_error(key, "a boolean", v)),
            },
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [Value]>, TokenizerError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items.as_slice())),
            Some(v) => Err(type_error(key, "an array", v)),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
        let Some(items) = self.array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(type_error(key, "an array of strings", other)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

fn integer(value: &Value) -> Option<i64> {
    match *value {
        Value::U8(v) => Some(v.into()),
        Value::I8(v) => Some(v.into()),
        Value::U16(v) => Some(v.into()),
        Value::I16(v) => Some(v.into()),
        Value::U32(v) => Some(v.into()),
        Value::I32(v) => Some(v.into()),
        Value::U64(v) => i64::try_from(v).ok(),
        Value::I64(v) => Some(v),
        _ => None,
    }
}

fn float(value: &Value) -> Option<f64> {
    match *value {
        Value::F32(v) => Some(v.into()),
        Value::F64(v) => Some(v),
        _ => integer(value).map(|i| i as f64),
    }
}

fn type_error(key: &str, expected: &str, got: &Value) -> TokenizerError {
    TokenizerError::Gguf(format!(
        "{key} should be {expected}, found {:?}",
        got.value_type()
    ))
}

/// The vocabulary shared by both GGUF tokenizer models.
struct GgufVocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<i64>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
}

impl GgufVocab<'_> {
    fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).copied()
    }

    fn token_type(&self, id: usize) -> i64 {
        self.types.get(id).copied().unwrap_or(TOKEN_TYPE_NORMAL)
    }

    /// Token id by text; for duplicated texts the first id wins.
    fn vocab_map(&self) -> Vocab {
        let mut vocab = Vocab::with_capacity(self.tokens.len());
        for (id, token) in self.tokens.iter().enumerate() {
            vocab.entry((*token).to_owned()).or_insert(id as u32);
        }
        vocab
    }

    /// Control and user-defined tokens, to be matched as whole tokens in input text.
    fn added_tokens(&self) -> Vec<AddedToken> {
        self.tokens
            .iter()
            .enumerate()
            .filter_map(|(id, token)| match self.token_type(id) {
                TOKEN_TYPE_CONTROL if !token.is_empty() => {
                    Some(AddedToken::from(*token, true).normalized(false))
                }
                TOKEN_TYPE_USER_DEFINED if !token.is_empty() => {
                    Some(AddedToken::from(*token, false).normalized(false))
                }
                _ => None,
            })
            .collect()
    }

    fn special_ids(&self) -> HashSet<u32> {
        (0..self.tokens.len())
            .filter(|&id| self.token_type(id) == TOKEN_TYPE_CONTROL)
            .map(|id| id as u32)
            .collect()
    }

    fn eos_ids(&self, md: &Metadata<'_>) -> Result<Vec<u32>, TokenizerError> {
        let mut ids: Vec<u32> = Vec::new();
        let mut push = |id: u32| {
            if (id as usize) < self.tokens.len() && !ids.contains(&id) {
                ids.push(id);
            }
        };
        if let Some(id) = self.eos_id {
            push(id);
        }
        for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(id) = md.id(key)? {
                push(id);
            }
        }
        for (id, token) in self.tokens.iter().enumerate() {
            let kind = self.token_type(id);
            if (kind == TOKEN_TYPE_CONTROL || kind == TOKEN_TYPE_USER_DEFINED)
                && END_OF_GENERATION_TOKENS.contains(token)
            {
                push(id as u32);
            }
        }
        Ok(ids)
    }
}

pub(super) fn from_gguf(content: &Content) -> Result<Tokenizer, TokenizerError> {
    let md = Metadata(&content.metadata);
    let model = md
        .string("tokenizer.ggml.model")?
        .ok_or_else(|| TokenizerError::Gguf("tokenizer.ggml.model is missing: this GGUF file has no tokenizer; pass --tokenizer-path".into()))?;
    let tokens = md
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| TokenizerError::Gguf("tokenizer.ggml.tokens is missing".into()))?;
    if tokens.is_empty() {
        return Err(TokenizerError::Gguf(
            "tokenizer.ggml.tokens is empty".into(),
        ));
    }
    let types = match md.array("tokenizer.ggml.token_type")? {
        Some(items) => items
            .iter()
            .map(|v| {
                integer(v).ok_or_else(|| {
                    type_error("tokenizer.ggml.token_type", "an array of integers", v)
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let vocab = GgufVocab {
        bos_id: md.id("tokenizer.ggml.bos_token_id")?,
        eos_id: md.id("tokenizer.ggml.eos_token_id")?,
        tokens,
        types,
    };

    let (mut inner, default_add_bos) = match model {
        "gpt2" => (build_byte_level_bpe(&md, &vocab)?, false),
        "llama" => (build_sentencepiece(&md, &vocab)?, true),
        other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
    };
    inner.add_tokens(&vocab.added_tokens());

    let add_bos = md
        .bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    let add_eos = md.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let bos_token = vocab
        .bos_id
        .and_then(|id| vocab.token(id))
        .map(str::to_owned);
    let eos_token = vocab
        .eos_id
        .and_then(|id| vocab.token(id))
        .map(str::to_owned);
    let chat_template = md
        .string("tokenizer.chat_template")?
        .map(|source| ChatTemplate::new(source, bos_token.clone(), eos_token.clone()))
        .transpose()?;
    let eos_token_ids = vocab.eos_ids(&md)?;
    let valid = |id: Option<u32>| id.filter(|&i| (i as usize) < vocab.tokens.len());

    Ok(Tokenizer {
        inner,
        manual_bos: valid(vocab.bos_id).filter(|_| add_bos),
        manual_eos: valid(vocab.eos_id).filter(|_| add_eos),
        bos_token_id: valid(vocab.bos_id),
        eos_token_ids,
        special_ids: vocab.special_ids(),
        chat_template,
    })
}

fn build_byte_level_bpe(
    md: &Metadata<'_>,
    vocab: &GgufVocab<'_>,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let merges = md
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| {
            TokenizerError::Gguf(
                "tokenizer.ggml.merges is missing (required for a \"gpt2\" vocabulary)".into(),
            )
        })?
        .into_iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| {
                    TokenizerError::Gguf(format!(
                        "merge {merge:?} is not two tokens separated by a space"
                    ))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pre = pre_tokenization(md.string("tokenizer.ggml.pre")?);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab.vocab_map(), merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("cannot build the BPE model: {e}")))?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for regex in pre.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Gguf(format!("bad pre-tokenizer regex {regex:?}: {e}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner
        .with_pre_tokenizer(Some(PreTokenizerSequence::new(steps)))
        .with_decoder(Some(ByteLevel::default()));
    Ok(inner)
}

/// SentencePiece vocabulary as a BPE model: every split of a token into two tokens is a merge,
/// ranked by the merged token's score (higher first), so merging follows llama.cpp's
/// highest-score-first rule.
fn build_sentencepiece(
    md: &Metadata<'_>,
    vocab: &GgufVocab<'_>,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let scores: Vec<f64> = match md.array("tokenizer.ggml.scores")? {
        Some(items) => items
            .iter()
            .map(|v| {
                float(v).ok_or_else(|| type_error("tokenizer.ggml.scores", "an array of floats", v))
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => Vec::new(),
    };
    let token_ids = vocab.vocab_map();
    let score = |id: u32| scores.get(id as usize).copied().unwrap_or(0.0);

    let mut ranked: Vec<(f64, u32, u32, &str, &str)> = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        // Merges build normal tokens from normal tokens; added tokens are matched whole
        // before merging and byte tokens are only the fallback.
        if vocab.token_type(id) != TOKEN_TYPE_NORMAL {
            continue;
        }
        let merged_id = id as u32;
        for (split, _) in token.char_indices().skip(1) {
            let (left, right) = token.split_at(split);
            if let (Some(&l), Some(&r)) = (token_ids.get(left), token_ids.get(right))
                && vocab.token_type(l as usize) == TOKEN_TYPE_NORMAL
                && vocab.token_type(r as usize) == TOKEN_TYPE_NORMAL
            {
                ranked.push((score(merged_id), merged_id, l, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges = ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_owned(), r.to_owned()))
        .collect();

    let unk_id = md.id("tokenizer.ggml.unknown_token_id")?.unwrap_or(0);
    let mut builder = BPE::builder()
        .vocab_and_merges(token_ids, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = vocab.token(unk_id) {
        builder = builder.unk_token(unk.to_owned());
    }
    let bpe = builder
        .build()
        .map_err(|e| TokenizerError::Gguf(format!("cannot build the SentencePiece model: {e}")))?;

    let add_space_prefix = md.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let replace_space = Replace::new(" ", "▁")
        .map_err(|e| TokenizerError::Gguf(format!("cannot build the normalizer: {e}")))?;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        normalizers.push(Prepend::new("▁".to_owned()).into());
    }
    normalizers.push(replace_space.into());

    let space_back = Replace::new("▁", " ")
        .map_err(|e| TokenizerError::Gguf(format!("cannot build the decoder: {e}")))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        space_back.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(tokenizers::normalizers::Sequence::new(normalizers)))
        .with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(inner)
}
