//! Tokenizers, chat templates and incremental detokenization.
//!
//! [`Tokenizer`] wraps a `tokenizers::Tokenizer` built either from a Hugging Face
//! `tokenizer.json` (plus the `tokenizer_config.json` / `generation_config.json` beside it) or
//! from the vocabulary stored in a GGUF file's metadata, so that both kinds of model directory
//! tokenize the way their reference implementation does (transformers and llama.cpp).
//! [`ChatTemplate`] renders Hugging Face Jinja chat templates with minijinja, and
//! [`DecodeStream`] turns a stream of generated token ids into text without ever splitting a
//! UTF-8 character.

mod chat_template;
mod decode_stream;
mod gguf;
mod hf;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

pub use chat_template::ChatTemplate;
pub use decode_stream::DecodeStream;

/// Everything that can go wrong while loading a tokenizer, tokenizing, or rendering a chat
/// template. Messages name the file or the setting to fix.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no tokenizer found at {}: expected a tokenizer.json file, a folder containing one, or a .gguf file",
        .0.display()
    )]
    NotFound(PathBuf),
    #[error("invalid tokenizer file {}: {message}", path.display())]
    InvalidFile { path: PathBuf, message: String },
    #[error("invalid GGUF tokenizer metadata: {0}")]
    Gguf(String),
    #[error(
        "unsupported GGUF tokenizer model '{0}' (supported: \"gpt2\" byte-level BPE and \"llama\" SentencePiece); pass --tokenizer-path to a tokenizer.json instead"
    )]
    UnsupportedModel(String),
    #[error("tokenization failed: {0}")]
    Encode(String),
    #[error("detokenization failed: {0}")]
    Decode(String),
    /// A chat template failed to compile or to render. For `raise_exception(...)` in the
    /// template this is exactly the template's message.
    #[error("{0}")]
    Template(String),
}

/// A model's tokenizer with the metadata serving needs: end-of-generation ids, BOS handling,
/// special tokens and the chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Prepend this id when encoding with special tokens. Set for GGUF vocabularies, whose
    /// tokenizer carries no post-processor; tokenizer.json files add BOS/EOS themselves.
    manual_bos: Option<u32>,
    manual_eos: Option<u32>,
    bos_token_id: Option<u32>,
    eos_token_ids: Vec<u32>,
    special_ids: HashSet<u32>,
    chat_template: Option<ChatTemplate>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token_id", &self.bos_token_id)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer stored in a GGUF file's metadata (`tokenizer.ggml.*`) and its
    /// `tokenizer.chat_template`.
    pub fn from_gguf(
        content: &candle_core::quantized::gguf_file::Content,
    ) -> Result<Self, TokenizerError> {
        gguf::from_gguf(content)
    }

    /// Loads a Hugging Face tokenizer: `path` is a model folder, a `tokenizer.json`, or a
    /// `.gguf` file. The folder's `tokenizer_config.json` supplies the chat template and the
    /// BOS/EOS tokens, `generation_config.json` any further EOS ids.
    pub fn from_dir_or_file(path: &Path) -> Result<Self, TokenizerError> {
        hf::from_dir_or_file(path)
    }

    /// Encodes `text`. Special-token text in the input (`<|im_start|>`) always maps to its
    /// single id; `add_special_tokens` controls only the BOS/EOS the model adds around a prompt.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        // GGUF-built tokenizers have no post-processor, so `add_special_tokens` only reaches
        // tokenizer.json post-processors here; the GGUF BOS/EOS are added below.
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let ids = encoding.get_ids();
        if !add_special_tokens {
            return Ok(ids.to_vec());
        }
        let mut out = Vec::with_capacity(ids.len() + 2);
        out.extend(self.manual_bos);
        out.extend_from_slice(ids);
        out.extend(self.manual_eos);
        Ok(out)
    }

    /// Decodes `ids` to text; invalid UTF-8 (a character cut between tokens) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Number of ids the tokenizer knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Every id that ends generation; the model's main EOS id comes first.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of `id` as stored (byte-level BPE tokens show `Ġ` for a space).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token, dropped by `skip_special_tokens`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replaces the model's chat template (the `--chat-template` flag).
    pub fn set_chat_template(&mut self, template: ChatTemplate) {
        self.chat_template = Some(template);
    }

    /// The wrapped `tokenizers` tokenizer, for callers that need offsets or batch encoding.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The text of the BOS token, as chat templates see it in `bos_token`.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_token_id.and_then(|id| self.id_to_token(id))
    }

    /// The text of the main EOS token, as chat templates see it in `eos_token`.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_token_ids
            .first()
            .and_then(|&id| self.id_to_token(id))
    }

    /// Loads a chat template for the `--chat-template` flag: a path to a Jinja file (or to a
    /// `chat_template.json`), or, when `arg` is no file but looks like Jinja, the template
    /// source itself. BOS/EOS come from this tokenizer.
    pub fn load_chat_template(&self, arg: &str) -> Result<ChatTemplate, TokenizerError> {
        let source = chat_template::load_template_source(arg)?;
        ChatTemplate::new(&source, self.bos_token(), self.eos_token())
    }
}
