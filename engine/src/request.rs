//! Types that cross the boundary between the HTTP layer and the scheduler thread.
//!
//! The HTTP layer parses a user's request into a [`GenerateRequest`] (already tokenized and
//! validated), submits it through [`crate::engine::EngineHandle`], and reads [`StreamEvent`]s
//! from the returned channel until a `Finished` (or `Error`) event arrives.

use serde::Serialize;

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
    /// Stop strings; the matched stop string is not part of the output text.
    pub stop: Vec<String>,
    /// Extra token ids that end generation (besides the model's EOS ids unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// Per-request seed; `None` draws from the server's seeded generator.
    pub seed: Option<u64>,
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
        }
    }
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
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
}

/// Why a request stopped, shaped like SGLang's `meta_info.finish_reason`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FinishReason {
    /// Hit max_new_tokens (or the context length).
    Length { length: usize },
    /// Hit an EOS / stop token id (`matched` is the token id) or a stop string (`matched` is it).
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
    /// possible stop string is still pending).
    Tokens { ids: Vec<u32>, text: String },
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
