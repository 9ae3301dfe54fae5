//! Structured output: grammars that constrain which tokens a request may generate.
//!
//! A request that asks for JSON matching a schema, text matching a regular expression, or text
//! in the language of an EBNF/Lark grammar carries a [`GrammarSpec`]. The server holds one
//! [`GrammarBackend`] (chosen by `--grammar-backend`, built with [`build_backend`]) that compiles
//! a spec into a [`CompiledGrammar`]; compiled grammars are cached by the spec's text, so
//! requests with the same schema share one. Each request then takes its own
//! [`GrammarMatcher`] from the compiled grammar and, at every decode step:
//!
//! 1. [`GrammarMatcher::fill_mask`] writes the allowed next tokens into a [`TokenMask`] (a
//!    bitset over the model's vocabulary; the EOS ids are allowed exactly when the grammar
//!    accepts the text so far);
//! 2. the sampler calls [`TokenMask::apply_to`] on the request's logits row, which sets every
//!    disallowed token's logit to `-inf`, and samples as usual;
//! 3. [`GrammarMatcher::accept`] advances the matcher by the sampled token (a token the mask
//!    did not allow is rejected with [`GrammarError::TokenRejected`] and the state is unchanged).
//!
//! Once [`GrammarMatcher::is_finished`] returns true only EOS may follow, so the scheduler may
//! end the request right there.
//!
//! # Backends
//!
//! | `--grammar-backend` | JSON schema | `json_object` | regex | EBNF (GBNF) | Lark |
//! |---------------------|-------------|---------------|-------|-------------|------|
//! | `llguidance` (default) | yes      | yes           | yes   | yes         | yes  |
//! | `outlines`          | yes (via regex) | yes (one nested level) | yes | no | no |
//! | `xgrammar`          | served by llguidance |      |       |             |      |
//!
//! * **llguidance** compiles every kind into an Earley parser over regex lexemes and computes
//!   masks lazily by walking the token trie, so even large grammars compile in milliseconds.
//!   EBNF text in the llama.cpp GBNF style SGLang documents (`root ::= "yes" | "no"`) is
//!   converted to llguidance's Lark dialect first (see [`gbnf_to_lark`]); EBNF text that is
//!   already Lark (it has a `start:` rule or begins with `%llguidance`) is used as is. JSON
//!   output allows flexible whitespace between JSON tokens, as llguidance's default does.
//! * **outlines** (`outlines-core`) turns a JSON schema into a regular expression, builds a
//!   DFA and walks every vocabulary token through every DFA state once at compile time. Masks
//!   are then table look-ups (cached per state), but compiling takes time proportional to
//!   states × vocabulary, and grammars beyond regular languages are refused. Regexes whose DFA
//!   would have more than [`OUTLINES_MAX_DFA_STATES`] states are refused too. JSON output
//!   allows at most one space between JSON tokens. outlines-core does not enforce numeric
//!   bounds (`minimum`, `maximum`); `json_object` allows one level of nested objects/arrays.
//! * **xgrammar** is accepted as a name for compatibility with SGLang's flag; its requests are
//!   served by the llguidance backend.
//!
//! Invalid schemas, regexes and grammars give [`GrammarError::Invalid`] carrying the
//! compiler's message (the HTTP layer answers 400 with it, see the `From` conversion into
//! [`EngineError`]); compilation never panics on user input.
//!
//! # Vocabulary
//!
//! Both backends see every token id as the bytes it stands for: byte-level BPE (GPT-2 style)
//! tokens are mapped back through the byte-to-character table, SentencePiece tokens get `▁`
//! replaced by a space and `<0xXX>` byte tokens become that byte. Special tokens never match
//! grammar text. The mask has the model's vocabulary size (the logits width), which may exceed
//! the tokenizer's; ids without a token are never allowed.
//!
//! # Thread safety
//!
//! [`GrammarBackend`] and [`CompiledGrammar`] are `Send + Sync` and shared by all requests.
//! A [`GrammarMatcher`] is `Send` but not `Sync`: it belongs to one request, and only one
//! thread uses it at a time. Mask computation may therefore move to a worker thread that runs
//! while the forward pass of the same step runs on the device; the matcher is then handed back
//! to the scheduler for `accept`. Matchers of one compiled grammar share lexer caches behind a
//! lock, so masks of different requests may be computed concurrently.

mod gbnf;
mod llg;
mod outlines;
#[cfg(test)]
mod tests;
mod vocab;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::EngineError;
use crate::tokenizer::Tokenizer;

pub use gbnf::gbnf_to_lark;
pub use outlines::OUTLINES_MAX_DFA_STATES;

/// Compiled grammars each backend keeps; the least recently used one is dropped beyond this.
pub const GRAMMAR_CACHE_CAPACITY: usize = 256;

/// Specs longer than this are refused before compiling.
pub const MAX_SPEC_BYTES: usize = 1 << 20;

/// What a request's output must follow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GrammarSpec {
    /// A JSON schema, as JSON text (`response_format.json_schema.schema`, SGLang `json_schema`).
    JsonSchema(String),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output must match (Rust `regex` syntax; SGLang `regex`).
    Regex(String),
    /// An EBNF grammar in llama.cpp's GBNF style with a `root` rule (SGLang `ebnf`); Lark text
    /// is accepted too.
    Ebnf(String),
    /// A grammar in llguidance's Lark dialect with a `start` rule.
    Lark(String),
}

impl GrammarSpec {
    /// The request field this kind of spec comes from, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "json_schema",
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Ebnf(_) => "ebnf",
            GrammarSpec::Lark(_) => "lark",
        }
    }

    fn text(&self) -> &str {
        match self {
            GrammarSpec::JsonSchema(s)
            | GrammarSpec::Regex(s)
            | GrammarSpec::Ebnf(s)
            | GrammarSpec::Lark(s) => s,
            GrammarSpec::JsonObject => "",
        }
    }
}

/// Everything that can go wrong while building a backend, compiling a spec, or matching.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    #[error("unknown grammar backend '{0}' (expected llguidance, outlines, xgrammar or none)")]
    UnknownBackend(String),
    /// `--grammar-backend none`: structured output is switched off.
    #[error("structured output is disabled on this server (--grammar-backend none)")]
    Disabled,
    /// The backend cannot handle this kind of spec.
    #[error("{0}")]
    Unsupported(String),
    /// The spec does not compile; `message` is the compiler's.
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    /// `accept` got a token the grammar does not allow at this point.
    #[error("token {token} is not allowed by the grammar at this point")]
    TokenRejected { token: u32 },
    /// `fill_mask` got a mask of another size than the backend's vocabulary.
    #[error("token mask has {got} entries but the vocabulary has {expected}")]
    MaskSize { expected: usize, got: usize },
    /// The matcher reached an internal error state; the request cannot continue.
    #[error("grammar matcher failed: {0}")]
    Matcher(String),
    /// The tokenizer's vocabulary cannot be turned into token bytes.
    #[error("cannot build the grammar vocabulary: {0}")]
    Vocabulary(String),
    /// Every compile slot stayed taken for the whole wait (see [`COMPILE_WAIT`]).
    #[error("{0}")]
    Busy(String),
}

impl GrammarError {
    /// Whether the request is at fault (answer 400) rather than the server.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            GrammarError::Disabled | GrammarError::Unsupported(_) | GrammarError::Invalid { .. }
        )
    }

    fn invalid(kind: &'static str, message: impl std::fmt::Display) -> Self {
        GrammarError::Invalid {
            kind,
            message: truncate_message(message.to_string()),
        }
    }
}

impl From<GrammarError> for EngineError {
    fn from(e: GrammarError) -> Self {
        match e {
            GrammarError::UnknownBackend(_) => EngineError::InvalidArgument(e.to_string()),
            GrammarError::Busy(_) => EngineError::unavailable(e.to_string()),
            e if e.is_user_error() => EngineError::bad_request(e.to_string()),
            e => EngineError::Internal(e.to_string()),
        }
    }
}

/// Compiler messages can quote a whole grammar; keep error bodies bounded.
fn truncate_message(mut message: String) -> String {
    const MAX: usize = 4096;
    if message.len() > MAX {
        let mut cut = MAX;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" ...");
    }
    message
}

/// A structured-output backend; the server builds one at start-up and shares it.
pub trait GrammarBackend: Send + Sync {
    /// The backend's name as `--grammar-backend` spells it (`xgrammar` reports `llguidance`).
    fn name(&self) -> &'static str;

    /// Length of the masks this backend fills: the model's vocabulary size (logits width).
    fn vocab_size(&self) -> usize;

    /// Compiles `spec`, or returns the cached grammar of an identical spec (the same `Arc`).
    /// Errors carry the compiler's message.
    fn compile(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError>;

    /// A mask of the right size, with nothing allowed.
    fn new_mask(&self) -> TokenMask {
        TokenMask::new(self.vocab_size())
    }
}

/// A compiled grammar, shared by every request that uses the same spec.
pub trait CompiledGrammar: Send + Sync {
    /// A fresh matcher at the start of the grammar, for one request.
    fn matcher(&self) -> Box<dyn GrammarMatcher>;
}

/// The grammar state of one request. Not `Sync`: one request, one thread at a time.
pub trait GrammarMatcher: Send {
    /// Writes the allowed next tokens into `mask` (of the backend's vocabulary size). EOS ids
    /// are allowed when the text so far is complete; once finished only EOS is allowed.
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), GrammarError>;

    /// Advances by the sampled `token`. A token the mask does not allow gives
    /// [`GrammarError::TokenRejected`] and leaves the state unchanged. An EOS id is accepted
    /// when the grammar accepts; afterwards only further EOS ids are.
    fn accept(&mut self, token: u32) -> Result<(), GrammarError>;

    /// The grammar reached an accepting state from which only EOS may follow (or EOS was
    /// accepted).
    fn is_finished(&self) -> bool;
}

/// A bitset over the model's vocabulary: bit `id` set means token `id` may be sampled.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl std::fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMask")
            .field("len", &self.len)
            .field("allowed", &self.count_allowed())
            .finish()
    }
}

impl TokenMask {
    /// A mask over `len` ids with nothing allowed.
    pub fn new(len: usize) -> Self {
        TokenMask {
            words: vec![0; len.div_ceil(32)],
            len,
        }
    }

    /// Number of ids the mask covers (the vocabulary size).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Allows (`true`) or forbids every id.
    pub fn set_all(&mut self, allowed: bool) {
        self.words.fill(if allowed { u32::MAX } else { 0 });
        if allowed {
            self.clear_tail();
        }
    }

    /// Sets whether `id` is allowed; ids past the end are ignored.
    pub fn set(&mut self, id: u32, allowed: bool) {
        let i = id as usize;
        if i >= self.len {
            return;
        }
        let bit = 1u32 << (i % 32);
        if allowed {
            self.words[i / 32] |= bit;
        } else {
            self.words[i / 32] &= !bit;
        }
    }

    /// Whether `id` is allowed; ids past the end never are.
    pub fn get(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 32] & (1 << (i % 32)) != 0
    }

    /// Number of allowed ids.
    pub fn count_allowed(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids in increasing order.
    pub fn allowed_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some(wi as u32 * 32 + bit)
            })
        })
    }

    /// The bitset: bit `id % 32` of word `id / 32` (the layout GPU mask kernels take).
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub(crate) fn words_mut(&mut self) -> &mut [u32] {
        &mut self.words
    }

    /// Sets every disallowed entry of `logits` to `-inf`; entries past the mask's length are
    /// disallowed.
    pub fn apply_to(&self, logits: &mut [f32]) {
        for (wi, chunk) in logits.chunks_mut(32).enumerate() {
            let w = self.words.get(wi).copied().unwrap_or(0);
            if w == u32::MAX {
                continue;
            }
            if w == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (bit, logit) in chunk.iter_mut().enumerate() {
                if w & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Clears the bits past `len` in the last word.
    pub(crate) fn clear_tail(&mut self) {
        let rem = self.len % 32;
        if rem != 0
            && let Some(last) = self.words.last_mut()
        {
            *last &= (1u32 << rem) - 1;
        }
    }
}

/// Builds the backend `name` (`llguidance`, `outlines`, `xgrammar`) for `tokenizer`, with masks
/// of `vocab_size` entries (the model's logits width). `none` gives [`GrammarError::Disabled`].
pub fn build_backend(
    name: &str,
    tokenizer: &Tokenizer,
    vocab_size: usize,
) -> Result<Arc<dyn GrammarBackend>, GrammarError> {
    let start = std::time::Instant::now();
    let backend: Arc<dyn GrammarBackend> = match name {
        "llguidance" => Arc::new(llg::LlguidanceBackend::new(tokenizer, vocab_size)?),
        "xgrammar" => {
            tracing::info!(
                "--grammar-backend xgrammar: structured-output requests are served by llguidance"
            );
            Arc::new(llg::LlguidanceBackend::new(tokenizer, vocab_size)?)
        }
        "outlines" => Arc::new(outlines::OutlinesBackend::new(tokenizer, vocab_size)?),
        "none" => return Err(GrammarError::Disabled),
        other => return Err(GrammarError::UnknownBackend(other.to_string())),
    };
    tracing::info!(
        backend = backend.name(),
        vocab_size,
        elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
        "grammar backend ready"
    );
    Ok(backend)
}

/// Stack of the thread each grammar compiles on. Compilers recurse over what the spec nests
/// (JSON schema `$ref` chains, Lark terminal chains, regex groups) and a request controls
/// that: a stack overflow aborts the whole process, so compilation never runs on an async or
/// blocking-pool worker (2 MiB stacks) but on its own thread with this much stack reserved
/// (address space only: pages are touched as the recursion reaches them). Together with
/// [`MAX_SPEC_BYTES`] this bounds every recursion a spec can cause, as the tests check.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Longest wait for a compile slot. A grammar can be built to compile for minutes (llguidance
/// has fuel limits for its lexer, not for every step of building it); such compiles hold at
/// most [`CompileSlots`] cores, and other grammar requests wait this long for one, then get
/// a 503. Requests without a grammar never wait.
pub const COMPILE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Bounds how many grammars compile at once.
pub(crate) struct CompileSlots {
    free: Mutex<usize>,
    freed: parking_lot::Condvar,
}

impl CompileSlots {
    pub(crate) fn new(n: usize) -> Self {
        CompileSlots {
            free: Mutex::new(n.max(1)),
            freed: parking_lot::Condvar::new(),
        }
    }

    /// Half the cores (at least one), shared by every backend of the process.
    fn global() -> &'static CompileSlots {
        static SLOTS: std::sync::OnceLock<CompileSlots> = std::sync::OnceLock::new();
        SLOTS.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            CompileSlots::new(cores / 2)
        })
    }

    /// Takes a slot, waiting at most `wait`; the slot is given back when the guard drops.
    pub(crate) fn take(&self, wait: std::time::Duration) -> Option<CompileSlot<'_>> {
        let deadline = std::time::Instant::now() + wait;
        let mut free = self.free.lock();
        while *free == 0 {
            if self.freed.wait_until(&mut free, deadline).timed_out() && *free == 0 {
                return None;
            }
        }
        *free -= 1;
        Some(CompileSlot(self))
    }
}

pub(crate) struct CompileSlot<'a>(&'a CompileSlots);

impl Drop for CompileSlot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock() += 1;
        self.0.freed.notify_one();
    }
}

/// Runs `compile` on a thread of its own with [`COMPILE_STACK_BYTES`] of stack, once one of
/// `slots` is free. Compilers are third-party code fed user input: a panic becomes an error
/// for this request, never a crash.
pub(crate) fn compile_in_slot(
    kind: &'static str,
    slots: &CompileSlots,
    wait: std::time::Duration,
    compile: impl FnOnce() -> Result<Arc<dyn CompiledGrammar>, GrammarError> + Send,
) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
    let Some(_slot) = slots.take(wait) else {
        return Err(GrammarError::Busy(format!(
            "every grammar compile slot stayed busy for {} s; retry later",
            wait.as_secs()
        )));
    };
    compile_on_own_stack(kind, compile)
}

fn compile_on_own_stack(
    kind: &'static str,
    compile: impl FnOnce() -> Result<Arc<dyn CompiledGrammar>, GrammarError> + Send,
) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
    let outcome = std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("grammar-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, compile)
            .map_err(|e| {
                GrammarError::Matcher(format!("cannot start a grammar compile thread: {e}"))
            })?;
        Ok::<_, GrammarError>(handle.join())
    })?;
    match outcome {
        Ok(result) => result,
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(GrammarError::invalid(
                kind,
                format!("the grammar compiler failed: {reason}"),
            ))
        }
    }
}

/// Compiled grammars by spec, dropping the least recently used beyond the capacity.
pub(crate) struct GrammarCache {
    capacity: usize,
    inner: Mutex<CacheInner>,
}

struct CacheInner {
    tick: u64,
    entries: HashMap<GrammarSpec, (Arc<dyn CompiledGrammar>, u64)>,
}

impl GrammarCache {
    pub(crate) fn new(capacity: usize) -> Self {
        GrammarCache {
            capacity: capacity.max(1),
            inner: Mutex::new(CacheInner {
                tick: 0,
                entries: HashMap::new(),
            }),
        }
    }

    /// The cached grammar of `spec`, or `compile`'s result, inserted. Compilation runs without
    /// the lock; when two threads compile the same spec, both get the grammar stored first.
    pub(crate) fn get_or_compile(
        &self,
        spec: &GrammarSpec,
        compile: impl FnOnce() -> Result<Arc<dyn CompiledGrammar>, GrammarError> + Send,
    ) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        {
            let mut inner = self.inner.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some((grammar, used)) = inner.entries.get_mut(spec) {
                *used = tick;
                return Ok(grammar.clone());
            }
        }
        if spec.text().len() > MAX_SPEC_BYTES {
            return Err(GrammarError::invalid(
                spec.kind(),
                format!(
                    "{} bytes is longer than the limit of {MAX_SPEC_BYTES}",
                    spec.text().len()
                ),
            ));
        }
        let start = std::time::Instant::now();
        let compiled = compile_in_slot(spec.kind(), CompileSlots::global(), COMPILE_WAIT, compile)?;
        tracing::debug!(
            kind = spec.kind(),
            elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
            "grammar compiled"
        );
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some((grammar, used)) = inner.entries.get_mut(spec) {
            *used = tick;
            return Ok(grammar.clone());
        }
        if inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                inner.entries.remove(&oldest);
            }
        }
        inner.entries.insert(spec.clone(), (compiled.clone(), tick));
        Ok(compiled)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }
}
