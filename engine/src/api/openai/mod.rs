//! The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//!
//! Response shapes follow SGLang 0.4.3's OpenAI adapter: OpenAI's fields plus `matched_stop`
//! on each choice, and `usage.prompt_tokens_details.cached_tokens` with
//! `--enable-cache-report`. Without `max_tokens` (absent or null) a chat request may use the
//! rest of the context window, capped at [`OPENAI_DEFAULT_MAX_TOKENS_CAP`] tokens, and a
//! completion gets OpenAI's default of [`COMPLETIONS_DEFAULT_MAX_TOKENS`] tokens. Bodies are
//! read and checked in [`request`].
//!
//! [`OPENAI_DEFAULT_MAX_TOKENS_CAP`]: super::validate::OPENAI_DEFAULT_MAX_TOKENS_CAP
//! [`COMPLETIONS_DEFAULT_MAX_TOKENS`]: super::validate::COMPLETIONS_DEFAULT_MAX_TOKENS
//!
//! Logprobs: chat takes `logprobs: true` and `top_logprobs` (0..=20) and answers with
//! `choices[].logprobs.content[] = {token, logprob, bytes, top_logprobs}`; completions take
//! `logprobs: k` (0..=5) and answer with `{tokens, token_logprobs, top_logprobs, text_offset}`
//! (with `echo`, the prompt's tokens come first, the first one with a null logprob). Streamed
//! chunks carry the logprobs of the tokens whose text they carry. `n` samples of a prompt
//! share its KV: the prompt is computed once before they start.
//!
//! Structured output: `response_format` (`json_object`, `json_schema`) and the extra fields
//! `regex` / `ebnf` constrain every choice (see [`super::validate`]).
//!
//! Tools (chat): `tools` are shown to the chat template unless `tool_choice` is `"none"`.
//! With `--tool-call-parser`, the output of a request with tools is split into normal text
//! and tool calls: `message.tool_calls` (with `content` the normal text, or null), or
//! `delta.tool_calls` fragments when streaming, and `finish_reason` `"tool_calls"` when the
//! choice made calls. The text the parser reads keeps special tokens (the format's markers
//! may be special tokens). `tool_choice` `"required"` or a named function constrains the
//! output with a grammar of the parser's format, so the calls always parse and their
//! arguments follow the function's `parameters`; that needs `--tool-call-parser`.

mod request;

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use super::generation::{Output, Step, finish_all, merge, prefill_shared_prompts, submit_all};
use super::validate::check_model;
use super::{ApiResult, JsonObject, run_blocking, sse};
use request::{parse_chat, parse_completion};
use sgl_core::engine::EngineHandle;
use sgl_core::request::{FinishReason, GenerateRequest, TokenLogprob, Usage};
use sgl_core::tokenizer::Tokenizer;
use sgl_core::tool_parser::{StreamDelta, ToolCallDelta, ToolParser, ToolParserKind, ToolSpec};

/// Most alternatives per token on chat (`top_logprobs`), as OpenAI allows.
pub const MAX_CHAT_TOP_LOGPROBS: usize = 20;
/// Most alternatives per token on completions (`logprobs`), as OpenAI allows.
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `matched_stop`: the stop token id or stop string that ended the choice.
fn matched_stop(reason: &FinishReason) -> Value {
    match reason {
        FinishReason::Stop { matched } => matched.clone(),
        _ => Value::Null,
    }
}

/// Which of the two completion routes a request came through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// A request body turned into generations, plus what the response needs.
struct Parsed {
    kind: Kind,
    id: String,
    model: String,
    reqs: Vec<GenerateRequest>,
    stream: bool,
    include_usage: bool,
    /// Samples per prompt: choice `i * n + j` is sample `j` of prompt `i`.
    n: usize,
    /// Text put before each choice's output (`echo` on completions), per prompt.
    echo: Vec<String>,
    /// Alternatives per token when logprobs are returned (`None`: no logprobs).
    logprobs: Option<usize>,
    /// Decodes the tokens of logprob entries.
    tokenizer: Option<std::sync::Arc<Tokenizer>>,
    /// The request's tools (chat).
    tools: Vec<ToolSpec>,
    /// Set when the output is split into text and tool calls (chat with tools, server
    /// started with `--tool-call-parser`, `tool_choice` not `"none"`).
    tool_parser: Option<ToolParserKind>,
}

/// A token as logprob entries show it: its text (token ids without a tokenizer).
fn token_text(tok: Option<&Tokenizer>, id: u32) -> String {
    match tok {
        Some(t) => t.decode(&[id], false).unwrap_or_default(),
        None => format!("token_id:{id}"),
    }
}

/// Chat's `logprobs.content` entries.
fn chat_logprob_content(entries: &[TokenLogprob], tok: Option<&Tokenizer>) -> Value {
    let item = |id: u32, logprob: Option<f32>| {
        let token = token_text(tok, id);
        json!({ "token": token, "logprob": logprob, "bytes": token.as_bytes() })
    };
    entries
        .iter()
        .map(|e| {
            let mut v = item(e.id, e.logprob);
            v["top_logprobs"] = e
                .top
                .iter()
                .flatten()
                .map(|&(id, lp)| item(id, Some(lp)))
                .collect();
            v
        })
        .collect()
}

/// Completions' logprobs object; `offset` is the character offset of the first entry's text
/// in the choice's text, advanced past the entries.
fn completion_logprob_object(
    entries: &[TokenLogprob],
    tok: Option<&Tokenizer>,
    offset: &mut usize,
) -> Value {
    let mut tokens = Vec::with_capacity(entries.len());
    let mut offsets = Vec::with_capacity(entries.len());
    for e in entries {
        let t = token_text(tok, e.id);
        offsets.push(*offset);
        *offset += t.chars().count();
        tokens.push(t);
    }
    let top: Vec<Value> = entries
        .iter()
        .map(|e| match &e.top {
            Some(top) => Value::Object(
                top.iter()
                    .map(|&(id, lp)| (token_text(tok, id), json!(lp)))
                    .collect(),
            ),
            None => Value::Null,
        })
        .collect();
    json!({
        "tokens": tokens,
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

/// The `logprobs` value of a choice (or chunk) for `entries`; null when none were asked for.
fn logprobs_json(p: &Parsed, entries: &[TokenLogprob], offset: &mut usize) -> Value {
    if p.logprobs.is_none() {
        return Value::Null;
    }
    let tok = p.tokenizer.as_deref();
    match p.kind {
        Kind::Chat => json!({ "content": chat_logprob_content(entries, tok) }),
        Kind::Completion => completion_logprob_object(entries, tok, offset),
    }
}

fn usage_json(engine: &EngineHandle, prompt: usize, completion: usize, cached: usize) -> Value {
    let mut u = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if engine.args().enable_cache_report {
        u["prompt_tokens_details"] = json!({ "cached_tokens": cached });
    }
    u
}

/// Sum usage over choices: each prompt's tokens count once, not once per sample.
#[derive(Default)]
struct UsageSum {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl UsageSum {
    /// Prompt and cached tokens count once per prompt (from its first sample), completion
    /// tokens for every sample.
    fn add(&mut self, index: usize, n: usize, u: &Usage) {
        if index.is_multiple_of(n) {
            self.prompt += u.prompt_tokens;
            self.cached += u.cached_tokens;
        }
        self.completion += u.completion_tokens;
    }
}

fn respond(engine: &EngineHandle, p: &Parsed, outs: Vec<Output>) -> Response {
    let mut sum = UsageSum::default();
    let choices: Vec<Value> = outs
        .into_iter()
        .enumerate()
        .map(|(index, o)| {
            sum.add(index, p.n, &o.usage);
            let mut entries = o.input_logprobs.clone().unwrap_or_default();
            entries.extend_from_slice(&o.output_logprobs);
            let mut c = json!({
                "index": index,
                "logprobs": logprobs_json(p, &entries, &mut 0),
                "finish_reason": o.reason.openai_str(),
                "matched_stop": matched_stop(&o.reason),
            });
            match p.kind {
                Kind::Chat => match p.tool_parser {
                    Some(kind) => {
                        let parsed = kind.parser().parse_complete(&o.text, &p.tools);
                        let mut message =
                            json!({ "role": "assistant", "content": parsed.normal_text });
                        if !parsed.calls.is_empty() {
                            if parsed.normal_text.is_empty() {
                                message["content"] = Value::Null;
                            }
                            message["tool_calls"] =
                                parsed.calls.iter().map(|c| c.to_openai_json()).collect();
                            c["finish_reason"] = json!("tool_calls");
                        }
                        c["message"] = message;
                    }
                    None => c["message"] = json!({ "role": "assistant", "content": o.text }),
                },
                Kind::Completion => {
                    let echo = p.echo.get(index / p.n).map(String::as_str).unwrap_or("");
                    c["text"] = Value::String(format!("{echo}{}", o.text));
                }
            }
            c
        })
        .collect();
    let object = match p.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    Json(json!({
        "id": p.id,
        "object": object,
        "created": unix_now(),
        "model": p.model,
        "choices": choices,
        "usage": usage_json(engine, sum.prompt, sum.completion, sum.cached),
    }))
    .into_response()
}

/// One streamed chunk for choice `index`: `piece` is new text (chat `delta.content`,
/// completion `text`), `finish` is set on the choice's last chunk.
fn chunk(
    p: &Parsed,
    created: u64,
    index: usize,
    piece: Option<&str>,
    finish: Option<&FinishReason>,
    logprobs: Value,
) -> Value {
    let mut choice = json!({
        "index": index,
        "logprobs": logprobs,
        "finish_reason": finish.map(FinishReason::openai_str),
        "matched_stop": finish.map(matched_stop).unwrap_or(Value::Null),
    });
    let object = match p.kind {
        Kind::Chat => {
            choice["delta"] = match piece {
                Some(t) => json!({ "content": t }),
                None => json!({}),
            };
            "chat.completion.chunk"
        }
        Kind::Completion => {
            choice["text"] = Value::String(piece.unwrap_or("").to_string());
            "text_completion"
        }
    };
    json!({
        "id": p.id,
        "object": object,
        "created": created,
        "model": p.model,
        "choices": [choice],
    })
}

/// A chat chunk for what a tool parser let through: normal text as `delta.content`, calls as
/// `delta.tool_calls`. `None` when there is nothing to send and no `finish`.
fn tool_chunk(
    p: &Parsed,
    created: u64,
    index: usize,
    delta: &StreamDelta,
    finish: Option<&FinishReason>,
    made_calls: bool,
    logprobs: Value,
) -> Option<Value> {
    if delta.is_empty() && finish.is_none() {
        return None;
    }
    let piece = (!delta.normal_text.is_empty()).then_some(delta.normal_text.as_str());
    let mut c = chunk(p, created, index, piece, finish, logprobs);
    if !delta.calls.is_empty() {
        c["choices"][0]["delta"]["tool_calls"] = delta
            .calls
            .iter()
            .map(ToolCallDelta::to_openai_json)
            .collect();
    }
    if finish.is_some() && made_calls {
        c["choices"][0]["finish_reason"] = json!("tool_calls");
    }
    Some(c)
}

fn stream_response(
    engine: EngineHandle,
    p: Parsed,
    gens: Vec<super::generation::Generation>,
) -> Response {
    let created = unix_now();
    let events = async_stream::stream! {
        let choices = gens.len();
        // The first chunk of each choice: the assistant role (chat) or the echoed prompt.
        for index in 0..choices {
            match p.kind {
                Kind::Chat => {
                    let mut c = chunk(&p, created, index, Some(""), None, Value::Null);
                    c["choices"][0]["delta"]["role"] = json!("assistant");
                    yield sse::json(&c);
                }
                Kind::Completion => {
                    if let Some(echo) = p.echo.get(index / p.n).filter(|e| !e.is_empty()) {
                        yield sse::json(&chunk(&p, created, index, Some(echo), None, Value::Null));
                    }
                }
            }
        }
        let mut sum = UsageSum::default();
        // Logprobs of tokens whose text is still held back, and text offsets, per choice.
        let mut pending: Vec<Vec<TokenLogprob>> = vec![Vec::new(); choices];
        let mut offsets = vec![0usize; choices];
        // One tool parser per choice, and whether the choice has made calls.
        let mut parsers: Vec<Option<Box<dyn ToolParser>>> =
            (0..choices).map(|_| p.tool_parser.map(ToolParserKind::parser)).collect();
        let mut made_calls = vec![false; choices];
        let mut steps = merge(gens, false);
        while let Some(t) = steps.next().await {
            let i = t.index;
            if let Some(parser) = parsers.get_mut(i).and_then(Option::as_mut) {
                match t.step {
                    Ok(Step::Delta { text, logprobs }) => {
                        pending[i].extend(logprobs);
                        let delta = parser.parse_increment(&text, &p.tools);
                        made_calls[i] |= !delta.calls.is_empty();
                        if !delta.is_empty() {
                            let lp = logprobs_json(&p, &std::mem::take(&mut pending[i]), &mut offsets[i]);
                            if let Some(c) = tool_chunk(&p, created, i, &delta, None, false, lp) {
                                yield sse::json(&c);
                            }
                        }
                    }
                    Ok(Step::Done { reason, usage, text }) => {
                        sum.add(i, p.n, &usage);
                        let mut delta = parser.parse_increment(&text, &p.tools);
                        let rest = parser.finish(&p.tools);
                        delta.normal_text.push_str(&rest.normal_text);
                        delta.calls.extend(rest.calls);
                        made_calls[i] |= !delta.calls.is_empty();
                        let lp = logprobs_json(&p, &std::mem::take(&mut pending[i]), &mut offsets[i]);
                        if let Some(c) = tool_chunk(&p, created, i, &delta, Some(&reason), made_calls[i], lp) {
                            yield sse::json(&c);
                        }
                    }
                    Err(e) => {
                        yield sse::error(&e);
                        yield sse::done();
                        return;
                    }
                }
                continue;
            }
            match t.step {
                Ok(Step::Delta { text, logprobs }) => {
                    pending[i].extend(logprobs);
                    if !text.is_empty() {
                        let lp = logprobs_json(&p, &std::mem::take(&mut pending[i]), &mut offsets[i]);
                        yield sse::json(&chunk(&p, created, i, Some(&text), None, lp));
                    }
                }
                Ok(Step::Done { reason, usage, text }) => {
                    sum.add(i, p.n, &usage);
                    let piece = (!text.is_empty()).then_some(text.as_str());
                    let lp = logprobs_json(&p, &std::mem::take(&mut pending[i]), &mut offsets[i]);
                    yield sse::json(&chunk(&p, created, i, piece, Some(&reason), lp));
                }
                Err(e) => {
                    yield sse::error(&e);
                    yield sse::done();
                    return;
                }
            }
        }
        if p.include_usage {
            yield sse::json(&json!({
                "id": p.id,
                "object": match p.kind { Kind::Chat => "chat.completion.chunk", Kind::Completion => "text_completion" },
                "created": created,
                "model": p.model,
                "choices": [],
                "usage": usage_json(&engine, sum.prompt, sum.completion, sum.cached),
            }));
        }
        yield sse::done();
    };
    sse::response(events)
}

async fn run(engine: EngineHandle, mut p: Parsed) -> ApiResult<Response> {
    if p.n > 1 {
        prefill_shared_prompts(&engine, &p.reqs).await?;
    }
    let gens = submit_all(&engine, std::mem::take(&mut p.reqs))?;
    if p.stream {
        return Ok(stream_response(engine, p, gens));
    }
    let outs = finish_all(gens).await?;
    Ok(respond(&engine, &p, outs))
}

/// `POST /v1/chat/completions`
pub async fn chat_completions(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let e = engine.clone();
    let parsed = run_blocking(move || parse_chat(&e, body)).await?;
    run(engine, parsed).await
}

/// `POST /v1/completions`
pub async fn completions(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let e = engine.clone();
    let parsed = run_blocking(move || parse_completion(&e, body)).await?;
    run(engine, parsed).await
}

fn model_card(engine: &EngineHandle) -> Value {
    let info = engine.info();
    json!({
        "id": info.served_model_name,
        "object": "model",
        "created": unix_now(),
        "owned_by": "sglang",
        "root": info.served_model_name,
        "max_model_len": info.context_length,
    })
}

/// `GET /v1/models`
pub async fn list_models(State(engine): State<EngineHandle>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [model_card(&engine)] }))
}

/// `GET /v1/models/{model}`
pub async fn retrieve_model(
    State(engine): State<EngineHandle>,
    Path(model): Path<String>,
) -> ApiResult<Json<Value>> {
    check_model(&engine, Some(&model))?;
    Ok(Json(model_card(&engine)))
}
