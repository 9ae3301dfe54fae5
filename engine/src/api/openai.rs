//! The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//!
//! Response shapes follow SGLang 0.4.3's OpenAI adapter: OpenAI's fields plus `matched_stop`
//! on each choice, and `usage.prompt_tokens_details.cached_tokens` with
//! `--enable-cache-report`. Without `max_tokens` (absent or null) a chat request may use the
//! rest of the context window, capped at [`OPENAI_DEFAULT_MAX_TOKENS_CAP`] tokens, and a
//! completion gets OpenAI's default of [`COMPLETIONS_DEFAULT_MAX_TOKENS`] tokens.
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

use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::generation::{Output, Step, finish_all, merge, prefill_shared_prompts, submit_all};
use super::schema::{
    self, ChatBody, CompletionBody, CompletionPrompt, Count, Message, MessageContent, Messages,
};
use super::validate::{
    COMPLETIONS_DEFAULT_MAX_TOKENS, Dialect, Fields, GrammarInput, Limits, LogprobInput,
    MaxTokensDefault, OPENAI_DEFAULT_MAX_TOKENS_CAP, SamplingInput, build_request, check_model,
    compile_grammar, new_rid, parse_sampling,
};
use super::{JsonObject, run_blocking, sse};
use crate::engine::EngineHandle;
use crate::error::{EngineError, Result};
use crate::grammar::GrammarSpec;
use crate::request::{FinishReason, GenerateRequest, TokenLogprob, Usage};
use crate::tokenizer::Tokenizer;
use crate::tool_parser::{
    StreamDelta, ToolCallDelta, ToolChoice, ToolParser, ToolParserKind, ToolSpec,
    constraint_grammar,
};

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

fn no_tokenizer(what: &str) -> EngineError {
    EngineError::bad_request(format!(
        "{what} needs a tokenizer, but this server runs with --skip-tokenizer-init; send token ids to /v1/completions or /generate"
    ))
}

/// The fields both OpenAI bodies share beside the sampling ones.
struct RouteFields {
    model: Option<String>,
    stream: bool,
    include_usage: bool,
}

/// Read the shared fields and fan prompts out into requests.
fn build(
    engine: &EngineHandle,
    route: RouteFields,
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    prompt_field: &str,
    echo: Vec<String>,
    mut sampling: SamplingInput,
) -> Result<Parsed> {
    let model = check_model(engine, route.model.as_deref())?;
    let RouteFields {
        stream,
        include_usage,
        ..
    } = route;
    let n = sampling.n;
    let total = prompts.len().saturating_mul(n);
    if total > super::validate::MAX_FAN_OUT {
        return Err(EngineError::bad_param(
            "n",
            format!(
                "{} prompts × n = {n} is {total} generations; at most {} per request",
                prompts.len(),
                super::validate::MAX_FAN_OUT
            ),
        ));
    }
    compile_grammar(engine, &mut sampling)?;
    let limits = Limits::of(engine);
    let base = new_rid();
    let default = MaxTokensDefault::Fixed(match kind {
        Kind::Chat => OPENAI_DEFAULT_MAX_TOKENS_CAP,
        Kind::Completion => COMPLETIONS_DEFAULT_MAX_TOKENS,
    });
    let mut reqs = Vec::with_capacity(total);
    for (i, ids) in prompts.into_iter().enumerate() {
        for j in 0..n {
            let rid = if total == 1 {
                base.clone()
            } else {
                format!("{base}-{}", i * n + j)
            };
            let mut req =
                build_request(rid, ids.clone(), prompt_field, &sampling, default, &limits)?;
            // Parallel samples with a seed get seed, seed + 1, ... so that they differ.
            req.sampling.seed = sampling.params.seed.map(|s| s.wrapping_add(j as u64));
            reqs.push(req);
        }
    }
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{base}"),
        Kind::Completion => format!("cmpl-{base}"),
    };
    Ok(Parsed {
        kind,
        id,
        model,
        reqs,
        stream,
        include_usage,
        n,
        echo,
        logprobs: sampling.logprobs.map(|l| l.top_k),
        tokenizer: engine.tokenizer().cloned(),
        tools: Vec::new(),
        tool_parser: None,
    })
}

/// Chat's `logprobs` (a boolean) and `top_logprobs` (0..=20).
fn chat_logprobs(logprobs: Option<bool>, top: Option<Count>) -> Result<Option<LogprobInput>> {
    let f = Fields::new("");
    let want = logprobs.unwrap_or(false);
    if let Some(Count(k)) = top {
        if k > MAX_CHAT_TOP_LOGPROBS {
            return Err(f.err(
                "top_logprobs",
                format!("must be an integer in [0, {MAX_CHAT_TOP_LOGPROBS}], got {k}"),
            ));
        }
        if k > 0 && !want {
            return Err(f.err("top_logprobs", "needs `logprobs: true`"));
        }
    }
    Ok(want.then_some(LogprobInput {
        start_len: -1,
        top_k: top.map_or(0, |c| c.0),
        start_field: "logprobs",
    }))
}

/// Completions' `logprobs` (0..=5 alternatives per token); with `echo` the prompt's tokens
/// get logprobs too.
fn completion_logprobs(logprobs: Option<Count>, echo: bool) -> Result<Option<LogprobInput>> {
    let k = match logprobs {
        None => return Ok(None),
        Some(Count(k)) if k <= MAX_COMPLETION_LOGPROBS => k,
        Some(Count(k)) => {
            return Err(Fields::new("").err(
                "logprobs",
                format!("must be an integer in [0, {MAX_COMPLETION_LOGPROBS}], got {k}"),
            ));
        }
    };
    Ok(Some(LogprobInput {
        start_len: if echo { 0 } else { -1 },
        top_k: k,
        start_field: "logprobs",
    }))
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

/// Check `messages` and turn them into what the chat template reads (see
/// [`Message::into_template_value`]).
fn check_messages(messages: Option<Messages>) -> Result<Vec<Value>> {
    let Some(Messages(messages)) = messages else {
        return Err(EngineError::bad_param(
            "messages",
            "`messages` is required: a list of {\"role\": ..., \"content\": ...} objects",
        ));
    };
    if messages.is_empty() {
        return Err(Fields::new("").err("messages", "is empty: give at least one message"));
    }
    for (i, m) in messages.iter().enumerate() {
        let name = format!("messages[{i}]");
        let msg = Fields::new(&name);
        if m.role.is_none() {
            return Err(msg.err(
                "role",
                "is required (\"system\", \"user\", \"assistant\" or \"tool\")",
            ));
        }
        if let Some(MessageContent::Parts(parts)) = &m.content {
            for (j, part) in parts.iter().enumerate() {
                let pname = format!("{name}.content[{j}]");
                let p = Fields::new(&pname);
                match part.kind.as_deref() {
                    Some("text") => {
                        if part.text.is_none() {
                            return Err(p.err("text", "is required for a text part"));
                        }
                    }
                    Some(other) => {
                        return Err(p.err(
                            "type",
                            format!(
                                "`{other}` is not supported: this server takes text content only"
                            ),
                        ));
                    }
                    None => return Err(p.err("type", "is required (\"text\")")),
                }
            }
        }
    }
    Ok(messages
        .into_iter()
        .map(Message::into_template_value)
        .collect())
}

fn parse_chat(engine: &EngineHandle, body: Map<String, Value>) -> Result<Parsed> {
    let body = Value::Object(body);
    let mut sampling = parse_sampling(&body, "", Dialect::OpenAi)?;
    let body: ChatBody = schema::read_owned(body, "")?;
    let messages = check_messages(body.messages)?;
    sampling.logprobs = chat_logprobs(body.logprobs, body.top_logprobs)?;
    let tok = engine
        .tokenizer()
        .ok_or_else(|| no_tokenizer("/v1/chat/completions"))?;
    let template = tok.chat_template().ok_or_else(|| {
        EngineError::bad_request(
            "this model has no chat template: start the server with --chat-template FILE, or use /v1/completions",
        )
    })?;
    let tools = ToolSpec::parse_list(body.tools.as_ref().unwrap_or(&Value::Null))?;
    let choice = ToolChoice::parse(body.tool_choice.as_ref(), &tools)?;
    let parser = engine.args().tool_call_parser;
    let tool_parser = parser.filter(|_| !tools.is_empty() && choice.shows_tools());
    if choice.forces_call() {
        let Some(parser) = parser else {
            return Err(EngineError::bad_param(
                "tool_choice",
                format!(
                    "`tool_choice` {} needs tool calls to be parsed from the output: start the server with --tool-call-parser ({})",
                    choice.to_json(),
                    ToolParserKind::ALL.map(ToolParserKind::name).join(", ")
                ),
            ));
        };
        if let Some(other) = &sampling.grammar {
            return Err(EngineError::bad_param(
                "tool_choice",
                format!(
                    "`tool_choice` {} cannot be combined with `{}`: a forced tool call already constrains the output",
                    choice.to_json(),
                    other.field
                ),
            ));
        }
        if let Some(lark) = constraint_grammar(parser.name(), &tools, &choice) {
            sampling.grammar = Some(GrammarInput {
                spec: GrammarSpec::Lark(lark),
                field: "tool_choice".into(),
            });
        }
    }
    if tool_parser.is_some() {
        // The parser reads the format's markers, which may be special tokens.
        sampling.params.skip_special_tokens = false;
    }
    let template_tools: Option<Vec<Value>> = (choice.shows_tools() && !tools.is_empty())
        .then(|| tools.iter().map(ToolSpec::to_json).collect());
    let extra = body.chat_template_kwargs.unwrap_or_default().0;
    let prompt = template
        .render_with(&messages, true, template_tools.as_deref(), &extra)
        .map_err(|e| {
            EngineError::bad_param(
                "messages",
                format!("the chat template failed on these messages: {e}"),
            )
        })?;
    // The template already wrote any BOS it wants; HF's apply_chat_template adds none.
    let ids = tok
        .encode(&prompt, false)
        .map_err(|e| EngineError::bad_param("messages", e.to_string()))?;
    let route = RouteFields {
        model: body.model,
        stream: body.stream.unwrap_or(false),
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    };
    let mut parsed = build(
        engine,
        route,
        Kind::Chat,
        vec![ids],
        "messages",
        Vec::new(),
        sampling,
    )?;
    parsed.tools = tools;
    parsed.tool_parser = tool_parser;
    Ok(parsed)
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of such lists.
/// Returns the token ids of each prompt and its text (for `echo`).
fn completion_prompts(
    prompt: Option<CompletionPrompt>,
    tok: Option<&Tokenizer>,
) -> Result<(Vec<Vec<u32>>, Vec<String>)> {
    let Some(prompt) = prompt else {
        return Err(EngineError::bad_param(
            "prompt",
            "`prompt` is required: a string, a list of strings, a list of token ids, or a list of token-id lists",
        ));
    };
    let encode = |text: &str| -> Result<Vec<u32>> {
        let tok = tok.ok_or_else(|| no_tokenizer("a text prompt"))?;
        tok.encode(text, true)
            .map_err(|e| EngineError::bad_param("prompt", e.to_string()))
    };
    let decode = |ids: &[u32]| -> String {
        tok.and_then(|t| t.decode(ids, false).ok())
            .unwrap_or_default()
    };
    let empty =
        || EngineError::bad_param("prompt", "`prompt` is empty: give some text or token ids");
    match prompt {
        CompletionPrompt::Text(s) => {
            if s.is_empty() {
                return Err(empty());
            }
            Ok((vec![encode(&s)?], vec![s]))
        }
        CompletionPrompt::Texts(items) if items.is_empty() => Err(empty()),
        CompletionPrompt::Ids(ids) if ids.is_empty() => Err(empty()),
        CompletionPrompt::Texts(items) => {
            let mut ids = Vec::with_capacity(items.len());
            for (i, s) in items.iter().enumerate() {
                if s.is_empty() {
                    return Err(EngineError::bad_param(
                        "prompt",
                        format!("`prompt[{i}]` is empty"),
                    ));
                }
                ids.push(encode(s)?);
            }
            Ok((ids, items))
        }
        CompletionPrompt::Batch(ids) => {
            let texts = ids.iter().map(|p| decode(p)).collect();
            Ok((ids, texts))
        }
        CompletionPrompt::Ids(ids) => {
            let text = decode(&ids);
            Ok((vec![ids], vec![text]))
        }
    }
}

fn parse_completion(engine: &EngineHandle, body: Map<String, Value>) -> Result<Parsed> {
    let body = Value::Object(body);
    let mut sampling = parse_sampling(&body, "", Dialect::OpenAi)?;
    let body: CompletionBody = schema::read_owned(body, "")?;
    let tok = engine.tokenizer().map(|t| t.as_ref());
    let (prompts, texts) = completion_prompts(body.prompt, tok)?;
    let echo_on = body.echo.unwrap_or(false);
    let stream = body.stream.unwrap_or(false);
    sampling.logprobs = completion_logprobs(body.logprobs, echo_on)?;
    if echo_on && sampling.logprobs.is_some() && stream {
        return Err(Fields::new("").err(
            "echo",
            "with `logprobs` is not supported by this server when streaming",
        ));
    }
    let echo = if echo_on {
        texts
    } else {
        vec![String::new(); prompts.len()]
    };
    let route = RouteFields {
        model: body.model,
        stream,
        include_usage: body
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    };
    build(
        engine,
        route,
        Kind::Completion,
        prompts,
        "prompt",
        echo,
        sampling,
    )
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

async fn run(engine: EngineHandle, mut p: Parsed) -> Result<Response> {
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
) -> Result<Response> {
    let e = engine.clone();
    let parsed = run_blocking(move || parse_chat(&e, body)).await?;
    run(engine, parsed).await
}

/// `POST /v1/completions`
pub async fn completions(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> Result<Response> {
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
) -> Result<Json<Value>> {
    check_model(&engine, Some(&model))?;
    Ok(Json(model_card(&engine)))
}
