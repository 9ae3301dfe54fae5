//! Types that cross the boundary between the HTTP layer and the scheduler thread.
//!
//! The HTTP layer parses a user's request into a [`GenerateRequest`] (already tokenized and
//! validated), submits it through [`crate::engine::EngineHandle`], and reads [`StreamEvent`]s
//! from the returned channel until a `Finished` (or `Error`) event arrives.
//!
//! Logprobs follow SGLang: they are the log-softmax of the model's raw logits (before
//! temperature, penalties and `logit_bias`). A request that asks for them gets the logprob of
//! every output token (with its top alternatives when `top_k` > 0) on each `Tokens` event, and
//! its prompt logprobs once, in a `PromptLogprobs` event sent when the prompt is computed.

use std::sync::Arc;

use serde::Serialize;

use crate::grammar::CompiledGrammar;

/// Validated sampling parameters, in SGLang's names. Defaults match SGLang's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0.0 means greedy.
    pub temperature: f32,
    /// 1.0 means off.
    pub top_p: f32,
    /// -1 means off.
    pub top_k: i32,
    /// 0.0 means off.
    pub min_p: f32,
    pub max_new_tokens: usize,
    /// Stop strings; the matched stop string is not part of the output text unless
    /// `no_stop_trim`.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (besides the model's EOS ids unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// Per-request seed; `None` draws from the server's seeded generator.
    pub seed: Option<u64>,
    /// Subtracted from a token's logit once per time it occurs in the output so far (-2..2).
    pub frequency_penalty: f32,
    /// Subtracted from the logit of every token that occurs in the output so far (-2..2).
    pub presence_penalty: f32,
    /// Hugging Face style penalty on every token of the prompt and the output: positive
    /// logits are divided by it, negative ones multiplied. 1.0 means off; range (0, 2].
    pub repetition_penalty: f32,
    /// EOS and `stop_token_ids` cannot be sampled before this many output tokens.
    pub min_new_tokens: usize,
    /// Accepted for SGLang compatibility. Fast (Rust) tokenizers decode special tokens the
    /// same way either way, as SGLang's default fast tokenizers do.
    pub spaces_between_special_tokens: bool,
    /// Keep the matched stop string (or the stop token's text) at the end of the output.
    pub no_stop_trim: bool,
    /// Added to the logits of the given token ids before sampling (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// The compiled grammar the output must follow (`json_schema`, `regex`, `ebnf`,
    /// `response_format`, forced tool calls); `None` leaves the output free. Each request
    /// (each of `n` samples) takes its own matcher from it in the scheduler.
    pub grammar: Option<RequestGrammar>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            max_new_tokens: 128,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            seed: None,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            min_new_tokens: 0,
            spaces_between_special_tokens: true,
            no_stop_trim: false,
            logit_bias: Vec::new(),
            grammar: None,
        }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether anything changes the logits before sampling (penalties, bias, min tokens).
    pub fn adjusts_logits(&self) -> bool {
        self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.repetition_penalty != 1.0
            || self.min_new_tokens > 0
            || !self.logit_bias.is_empty()
    }
}

/// Which logprobs a request wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobRequest {
    /// First prompt position of the prompt logprobs (SGLang's `logprob_start_len`, already
    /// resolved: `prompt_len - 1` asks for output logprobs only). Entries cover the prompt
    /// positions after it, plus position 0 (with a null logprob) when it is 0.
    pub start_len: usize,
    /// How many most likely alternatives to report per position (0: none).
    pub top_k: usize,
}

/// The logprob of one token at one position, with the position's most likely tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    /// `None` for the first prompt token, which has no context to be predicted from.
    pub logprob: Option<f32>,
    /// The `top_k` most likely tokens, best first (empty when `top_k` is 0); `None` where
    /// `logprob` is.
    pub top: Option<Vec<(u32, f32)>>,
}

/// One generation request, tokenized and validated.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Request id (user-given `rid` or a fresh uuid).
    pub rid: String,
    pub input_ids: Vec<u32>,
    pub sampling: SamplingParams,
    /// When false the scheduler does not detokenize (`--skip-tokenizer-init` or input_ids-only
    /// clients); stop strings are then rejected at validation.
    pub detokenize: bool,
    /// Logprobs to return; `None` returns none.
    pub logprobs: Option<LogprobRequest>,
}

/// A compiled grammar attached to a request, with the kind of spec it came from. Two are
/// equal when they share the same compiled grammar.
#[derive(Clone)]
pub struct RequestGrammar {
    /// `json_schema`, `json_object`, `regex`, `ebnf` or `lark`, for logs and messages.
    pub kind: &'static str,
    pub compiled: Arc<dyn CompiledGrammar>,
}

impl PartialEq for RequestGrammar {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && std::ptr::addr_eq(Arc::as_ptr(&self.compiled), Arc::as_ptr(&other.compiled))
    }
}

impl std::fmt::Debug for RequestGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestGrammar")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Why a request stopped, shaped like SGLang's `meta_info.finish_reason`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FinishReason {
    /// Hit max_new_tokens (or the context length); `length` 0 for a prefill-only request.
    Length { length: usize },
    /// Hit an EOS / stop token id (`matched` is the token id) or a stop string (`matched` is
    /// it), or completed its grammar (`matched` is null: the output is complete and only EOS
    /// could follow, so generation ends without sampling it).
    Stop { matched: serde_json::Value },
    /// Aborted (client disconnect, flush, server shutdown).
    Abort { message: String },
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn openai_str(&self) -> &'static str {
        match self {
            FinishReason::Length { .. } => "length",
            FinishReason::Stop { .. } => "stop",
            FinishReason::Abort { .. } => "abort",
        }
    }
}

/// Counters reported with the final event.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the radix cache.
    pub cached_tokens: usize,
}

/// Messages from the scheduler to one request's handler.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// New output tokens and the text they complete (may be empty while a UTF-8 character or a
    /// possible stop string is still pending), with their logprobs when the request asked for
    /// them (one per id; empty otherwise).
    Tokens {
        ids: Vec<u32>,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The prompt logprobs of a request that asked for logprobs, sent once when its prompt has
    /// been computed (before its first `Tokens` event).
    PromptLogprobs { logprobs: Vec<TokenLogprob> },
    /// The request is done. `text` is any text flushed at the end (e.g. a held-back partial stop
    /// string that turned out not to match).
    Finished {
        reason: FinishReason,
        usage: Usage,
        text: String,
    },
    /// The request failed inside the engine.
    Error { message: String },
}
