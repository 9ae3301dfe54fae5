//! Reading the OpenAI bodies: the typed body and sampling fields of `super::super::schema`
//! checked and turned into [`Parsed`] generations (chat: messages through the chat template,
//! tools and forced tool calls; completions: the prompt forms and `echo`).

use serde_json::{Map, Value};

use super::{Kind, MAX_CHAT_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS, Parsed};
use crate::api::schema::{
    self, ChatBody, CompletionBody, CompletionPrompt, Count, Message, MessageContent, Messages,
};
use crate::api::validate::{
    self, COMPLETIONS_DEFAULT_MAX_TOKENS, Dialect, Fields, GrammarInput, Limits, LogprobInput,
    MaxTokensDefault, OPENAI_DEFAULT_MAX_TOKENS_CAP, SamplingInput, build_request, check_model,
    compile_grammar, new_rid, parse_sampling,
};
use sgl_core::engine::EngineHandle;
use sgl_core::error::{EngineError, Result};
use sgl_core::grammar::GrammarSpec;
use sgl_core::tokenizer::Tokenizer;
use sgl_core::tool_parser::{ToolChoice, ToolParserKind, ToolSpec, constraint_grammar};

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
    if total > validate::MAX_FAN_OUT {
        return Err(EngineError::bad_param(
            "n",
            format!(
                "{} prompts × n = {n} is {total} generations; at most {} per request",
                prompts.len(),
                validate::MAX_FAN_OUT
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

pub(super) fn parse_chat(engine: &EngineHandle, body: Map<String, Value>) -> Result<Parsed> {
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

pub(super) fn parse_completion(engine: &EngineHandle, body: Map<String, Value>) -> Result<Parsed> {
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
