//! Request bodies in, [`GenerateRequest`]s out ("parse, don't validate").
//!
//! Bodies are read into the serde types of [`super::schema`], whose errors name the field
//! path and the type expected; this module checks their values (ranges, limits, conflicts),
//! naming the field at fault (`sampling_params[1].top_p`) and what would be accepted. Fields
//! this engine cannot honour yet (custom logit processors, `best_of`) are refused unless they
//! carry their neutral value, so that a client never gets output that silently ignores what
//! it asked for.
//!
//! Structured output ([`GrammarInput`]): `/generate` takes SGLang's `json_schema` (a string,
//! or the schema object itself), `regex` and `ebnf` in `sampling_params`; the OpenAI routes
//! take `response_format` (`text`, `json_object`, `json_schema`) and the extra body fields
//! `regex` and `ebnf`. At most one may be given. [`compile_grammar`] compiles it with the
//! server's grammar backend (an invalid spec is a 400 with the compiler's message) and
//! attaches it to the sampling parameters.
//!
//! Sampling fields take SGLang's names and ranges: `frequency_penalty` and `presence_penalty`
//! in [-2, 2], `repetition_penalty` in (0, 2], `min_new_tokens` (OpenAI routes: `min_tokens`)
//! at most the output budget, `logit_bias` as `{"token id": bias in [-100, 100]}`,
//! `no_stop_trim`, `spaces_between_special_tokens`, `seed`, `stop`, `stop_token_ids`, and `n`
//! in 1..=[`MAX_N`]. Logprob options ([`LogprobInput`]) are read by each route in its own
//! names and checked against the prompt here.

use serde_json::Value;

use super::schema::{
    self, CommonSampling, Count, Int, LogitBias, NativeSampling, Number, OpenAiSampling,
    ResponseFormat, Seed,
};
use sgl_core::engine::EngineHandle;
use sgl_core::error::{EngineError, Result};
use sgl_core::grammar::GrammarSpec;
use sgl_core::request::{GenerateRequest, LogprobRequest, RequestGrammar, SamplingParams};

/// `/generate` default for `max_new_tokens` (SGLang's).
pub const NATIVE_DEFAULT_MAX_NEW_TOKENS: usize = 128;
/// `/v1/chat/completions` without `max_tokens` gets the rest of the context, but at most
/// this many.
pub const OPENAI_DEFAULT_MAX_TOKENS_CAP: usize = 4096;
/// `/v1/completions` without `max_tokens` (absent or null): OpenAI's documented default.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;
/// Most stop strings per request (`stop`); each is matched against every generated token.
pub const MAX_STOP_STRINGS: usize = 64;
/// Longest stop string, in bytes (output that could begin one is held back until it cannot).
pub const MAX_STOP_STRING_BYTES: usize = 256;
/// Most `stop_token_ids` per request.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// Most generations one HTTP request may start (prompts × `n`).
pub const MAX_FAN_OUT: usize = 1024;
/// Most samples per prompt (`n`).
pub const MAX_N: usize = 16;
/// Range of `frequency_penalty` and `presence_penalty`.
pub const PENALTY_RANGE: f32 = 2.0;
/// Range of a `logit_bias` value.
pub const LOGIT_BIAS_RANGE: f32 = 100.0;

/// Short description of a JSON value for error messages.
pub fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(b) => return format!("boolean {b}"),
        Value::Number(n) => return format!("number {n}"),
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let mut text = v.to_string();
    if text.len() > 40 {
        let mut cut = 40;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    format!("{kind} {text}")
}

/// Names fields in errors: `prefix` is where the object being checked sits in the body
/// (`sampling_params[1]`; empty at the top level).
#[derive(Debug, Clone, Copy)]
pub struct Fields<'a> {
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(prefix: &'a str) -> Self {
        Fields { prefix }
    }

    /// Full field name as shown to the user.
    pub fn name(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    pub fn err(&self, key: &str, message: impl std::fmt::Display) -> EngineError {
        let name = self.name(key);
        EngineError::bad_param(&name, format!("`{name}` {message}"))
    }

    /// Refuse a feature this engine does not have, unless the field holds `neutral` (or is
    /// absent/null).
    pub fn unsupported(
        &self,
        key: &str,
        value: Option<&Value>,
        neutral: &[Value],
        what: &str,
    ) -> Result<()> {
        match value {
            Some(v) if !v.is_null() && !neutral.contains(v) => {
                Err(self.err(key, format!("is not supported by this server yet ({what})")))
            }
            _ => Ok(()),
        }
    }

    /// A finite `f32` from a JSON number.
    fn f32(&self, key: &str, v: Option<Number>) -> Result<Option<f32>> {
        match v {
            None => Ok(None),
            Some(Number(x)) if (x as f32).is_finite() => Ok(Some(x as f32)),
            Some(Number(x)) => Err(self.err(key, format!("is out of range, got {x}"))),
        }
    }
}

/// Which API's field names a body uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `/v1/chat/completions`, `/v1/completions`.
    OpenAi,
    /// `/generate`'s `sampling_params`.
    Native,
}

/// Sampling fields read from a body, before they meet a prompt.
#[derive(Debug, Clone)]
pub struct SamplingInput {
    pub params: SamplingParams,
    /// What the user asked for; `None` takes the route's default.
    pub max_tokens: Option<usize>,
    /// The field `max_tokens` came from, for error messages.
    pub max_tokens_field: String,
    /// Samples per prompt.
    pub n: usize,
    /// The field `min_new_tokens` came from, for error messages.
    pub min_tokens_field: String,
    /// Logprobs to return (set by the route that reads its own logprob fields).
    pub logprobs: Option<LogprobInput>,
    /// The grammar the output must follow, before it is compiled.
    pub grammar: Option<GrammarInput>,
}

/// A structured-output spec as a request gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct GrammarInput {
    pub spec: GrammarSpec,
    /// The field it came from (`sampling_params.regex`, `response_format.json_schema`), for
    /// error messages.
    pub field: String,
}

/// Logprob options as a route read them, before they meet a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobInput {
    /// SGLang's `logprob_start_len`: -1 for output logprobs only, otherwise the first prompt
    /// position to report.
    pub start_len: i64,
    /// Alternatives per position.
    pub top_k: usize,
    /// The field `start_len` came from, for error messages.
    pub start_field: &'static str,
}

/// `logit_bias`: `{"<token id>": bias}` with biases in [-100, 100], sorted by id.
fn parse_logit_bias(f: &Fields<'_>, bias: Option<LogitBias>) -> Result<Vec<(u32, f32)>> {
    let key = "logit_bias";
    let Some(LogitBias(entries)) = bias else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(entries.len());
    for (k, Number(v)) in entries {
        let id: u32 = k.trim().parse().map_err(|_| {
            f.err(
                key,
                format!("keys must be token ids (integers >= 0, as strings), got key {k:?}"),
            )
        })?;
        let bias = v as f32;
        if !(bias.is_finite() && bias.abs() <= LOGIT_BIAS_RANGE) {
            return Err(f.err(
                key,
                format!(
                    "values must be numbers in [-{LOGIT_BIAS_RANGE}, {LOGIT_BIAS_RANGE}], got {v} for token {id}"
                ),
            ));
        }
        out.push((id, bias));
    }
    out.sort_by_key(|e| e.0);
    out.dedup_by_key(|e| e.0);
    Ok(out)
}

/// The dialect's own sampling fields, as one shape.
struct DialectSampling {
    /// `(field, value)` of the output budget, in the order they take precedence.
    max_tokens: Vec<(&'static str, Option<Count>)>,
    min_tokens: (&'static str, Option<Count>),
    grammar: Option<GrammarInput>,
}

/// Read the sampling fields of the object `body`, which sits at `prefix` in the request
/// (empty at the top level), in the given dialect.
pub fn parse_sampling(body: &Value, prefix: &str, dialect: Dialect) -> Result<SamplingInput> {
    let common: CommonSampling = schema::read(body, prefix)?;
    let f = Fields::new(prefix);
    let own = match dialect {
        Dialect::OpenAi => {
            let own: OpenAiSampling = schema::read(body, prefix)?;
            // Features the scheduler does not implement yet: accept only their neutral values.
            f.unsupported(
                "best_of",
                own.best_of.as_ref(),
                &[Value::from(1)],
                "best_of",
            )?;
            f.unsupported("suffix", own.suffix.as_ref(), &[Value::from("")], "suffix")?;
            DialectSampling {
                max_tokens: vec![
                    ("max_completion_tokens", own.max_completion_tokens),
                    ("max_tokens", own.max_tokens),
                ],
                min_tokens: ("min_tokens", own.min_tokens),
                grammar: response_format_grammar(&f, own.response_format)?,
            }
        }
        Dialect::Native => {
            let own: NativeSampling = schema::read(body, prefix)?;
            let key = "json_schema";
            let grammar = match own.json_schema {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(GrammarSpec::JsonSchema(s)),
                Some(v @ (Value::Object(_) | Value::Bool(_))) => {
                    Some(GrammarSpec::JsonSchema(v.to_string()))
                }
                Some(v) => {
                    return Err(f.err(
                        key,
                        format!(
                            "must be a JSON schema (as a string or an object), got {}",
                            describe(&v)
                        ),
                    ));
                }
            };
            DialectSampling {
                max_tokens: vec![("max_new_tokens", own.max_new_tokens)],
                min_tokens: ("min_new_tokens", own.min_new_tokens),
                grammar: grammar.map(|spec| GrammarInput {
                    spec,
                    field: f.name(key),
                }),
            }
        }
    };
    check_sampling(&f, common, own, dialect)
}

/// Checks the values of the sampling fields and turns them into [`SamplingInput`].
fn check_sampling(
    f: &Fields<'_>,
    c: CommonSampling,
    own: DialectSampling,
    dialect: Dialect,
) -> Result<SamplingInput> {
    let mut p = SamplingParams::default();
    // OpenAI's documented default temperature is 1.0, as is SGLang's.
    if let Some(t) = f.f32("temperature", c.temperature)? {
        if t < 0.0 {
            return Err(f.err(
                "temperature",
                format!("must be >= 0 (0 means greedy), got {t}"),
            ));
        }
        p.temperature = t;
    }
    if let Some(x) = f.f32("top_p", c.top_p)? {
        if !(x > 0.0 && x <= 1.0) {
            return Err(f.err("top_p", format!("must be in (0, 1], got {x}")));
        }
        p.top_p = x;
    }
    if let Some(Int(k)) = c.top_k {
        if k == 0 || k < -1 {
            return Err(f.err("top_k", format!("must be -1 (off) or at least 1, got {k}")));
        }
        p.top_k = i32::try_from(k).unwrap_or(i32::MAX);
    }
    if let Some(x) = f.f32("min_p", c.min_p)? {
        if !(0.0..=1.0).contains(&x) {
            return Err(f.err("min_p", format!("must be in [0, 1], got {x}")));
        }
        p.min_p = x;
    }
    let mut max_tokens = None;
    let mut max_tokens_field = f.name(own.max_tokens.last().map_or("max_tokens", |m| m.0));
    for (key, value) in &own.max_tokens {
        if let Some(Count(m)) = *value {
            // /generate takes 0 (prefill only, e.g. to score a prompt); OpenAI routes do not.
            if m == 0 && dialect == Dialect::OpenAi {
                return Err(f.err(key, "must be at least 1"));
            }
            max_tokens = Some(m);
            max_tokens_field = f.name(key);
            break;
        }
    }
    p.stop = c.stop.map(|s| s.0).unwrap_or_default();
    if p.stop.len() > MAX_STOP_STRINGS {
        return Err(f.err(
            "stop",
            format!(
                "has {} stop strings; at most {MAX_STOP_STRINGS} are allowed",
                p.stop.len()
            ),
        ));
    }
    if let Some((i, s)) = p
        .stop
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > MAX_STOP_STRING_BYTES)
    {
        return Err(f.err(
            "stop",
            format!(
                "string {i} is {} bytes long; a stop string may have at most {MAX_STOP_STRING_BYTES}",
                s.len()
            ),
        ));
    }
    p.stop_token_ids = c.stop_token_ids.map(|t| t.0).unwrap_or_default();
    if p.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(f.err(
            "stop_token_ids",
            format!(
                "has {} token ids; at most {MAX_STOP_TOKEN_IDS} are allowed",
                p.stop_token_ids.len()
            ),
        ));
    }
    if let Some(b) = c.ignore_eos {
        p.ignore_eos = b;
    }
    if let Some(b) = c.skip_special_tokens {
        p.skip_special_tokens = b;
    }
    // `sampling_seed` (SGLang's name) wins over `seed`; negative seeds keep their bits.
    if let Some(Seed(s)) = c.sampling_seed.or(c.seed) {
        p.seed = Some(s);
    }
    let n = c.n.map_or(1, |n| n.0);
    if n == 0 || n > MAX_N {
        return Err(f.err("n", format!("must be between 1 and {MAX_N}, got {n}")));
    }
    for (key, value) in [
        ("frequency_penalty", c.frequency_penalty),
        ("presence_penalty", c.presence_penalty),
    ] {
        if let Some(x) = f.f32(key, value)? {
            if x.abs() > PENALTY_RANGE {
                return Err(f.err(
                    key,
                    format!(
                        "must be in [-{PENALTY_RANGE}, {PENALTY_RANGE}] (0 means off), got {x}"
                    ),
                ));
            }
            if key == "frequency_penalty" {
                p.frequency_penalty = x;
            } else {
                p.presence_penalty = x;
            }
        }
    }
    if let Some(x) = f.f32("repetition_penalty", c.repetition_penalty)? {
        if !(x > 0.0 && x <= 2.0) {
            return Err(f.err(
                "repetition_penalty",
                format!("must be in (0, 2] (1 means off), got {x}"),
            ));
        }
        p.repetition_penalty = x;
    }
    let (min_key, min_tokens) = own.min_tokens;
    if let Some(Count(m)) = min_tokens {
        p.min_new_tokens = m;
    }
    if let Some(b) = c.no_stop_trim {
        p.no_stop_trim = b;
    }
    if let Some(b) = c.spaces_between_special_tokens {
        p.spaces_between_special_tokens = b;
    }
    p.logit_bias = parse_logit_bias(f, c.logit_bias)?;
    f.unsupported(
        "custom_params",
        c.custom_params.as_ref(),
        &[],
        "custom logit processors",
    )?;

    let mut found: Vec<GrammarInput> = Vec::new();
    if let Some(regex) = c.regex {
        found.push(GrammarInput {
            spec: GrammarSpec::Regex(regex),
            field: f.name("regex"),
        });
    }
    if let Some(ebnf) = c.ebnf {
        found.push(GrammarInput {
            spec: GrammarSpec::Ebnf(ebnf),
            field: f.name("ebnf"),
        });
    }
    found.extend(own.grammar);
    let grammar = match found.len() {
        0 | 1 => found.pop(),
        _ => {
            let names: Vec<String> = found.iter().map(|g| format!("`{}`", g.field)).collect();
            return Err(EngineError::bad_param(
                &found[1].field,
                format!(
                    "{} cannot be combined: give at most one way to constrain the output",
                    names.join(" and ")
                ),
            ));
        }
    };
    Ok(SamplingInput {
        params: p,
        max_tokens,
        max_tokens_field,
        n,
        min_tokens_field: f.name(min_key),
        logprobs: None,
        grammar,
    })
}

/// OpenAI's `response_format`: `text` (no constraint), `json_object` or `json_schema`.
fn response_format_grammar(
    f: &Fields<'_>,
    rf: Option<ResponseFormat>,
) -> Result<Option<GrammarInput>> {
    let Some(rf) = rf else {
        return Ok(None);
    };
    let field = f.name("response_format");
    let rff = Fields::new(&field);
    match rf.kind.as_deref() {
        None => Err(rff.err(
            "type",
            "is required (\"text\", \"json_object\" or \"json_schema\")",
        )),
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarInput {
            spec: GrammarSpec::JsonObject,
            field,
        })),
        Some("json_schema") => {
            let Some(js) = rf.json_schema else {
                return Err(rff.err(
                    "json_schema",
                    "is required with `type` \"json_schema\": {\"name\": ..., \"schema\": {...}}",
                ));
            };
            let js_field = rff.name("json_schema");
            let jsf = Fields::new(&js_field);
            let schema = match js.schema {
                Some(v @ (Value::Object(_) | Value::Bool(_))) => v.to_string(),
                None | Some(Value::Null) => {
                    return Err(jsf.err("schema", "is required: the JSON schema of the output"));
                }
                Some(v) => {
                    return Err(jsf.err(
                        "schema",
                        format!("must be a JSON schema object, got {}", describe(&v)),
                    ));
                }
            };
            Ok(Some(GrammarInput {
                spec: GrammarSpec::JsonSchema(schema),
                field: jsf.name("schema"),
            }))
        }
        Some(other) => Err(rff.err(
            "type",
            format!("`{other}` is not supported (\"text\", \"json_object\" or \"json_schema\")"),
        )),
    }
}

/// Compiles the grammar of `sampling` (if any) with the server's grammar backend and attaches
/// it to the sampling parameters. Compiling can take a while for large specs: call this off
/// the async runtime. Errors are 400s naming the field: an invalid spec (with the compiler's
/// message), a spec the backend cannot handle, or structured output being off.
pub fn compile_grammar(engine: &EngineHandle, sampling: &mut SamplingInput) -> Result<()> {
    let Some(input) = &sampling.grammar else {
        return Ok(());
    };
    let field = &input.field;
    let backend = engine
        .grammar_backend()
        .map_err(|e| EngineError::bad_param(field, format!("`{field}` cannot be served: {e}")))?;
    let compiled = backend.compile(&input.spec).map_err(|e| {
        if e.is_user_error() {
            EngineError::bad_param(field, format!("`{field}`: {e}"))
        } else {
            EngineError::from(e)
        }
    })?;
    sampling.params.grammar = Some(RequestGrammar {
        kind: input.spec.kind(),
        compiled,
    });
    Ok(())
}

/// What a route does when the user gives no output budget.
#[derive(Debug, Clone, Copy)]
pub enum MaxTokensDefault {
    /// At most this many (clamped to the room left in the context).
    Fixed(usize),
}

/// Limits a request is checked against.
#[derive(Debug, Clone)]
pub struct Limits {
    pub context_length: usize,
    pub vocab_size: usize,
    /// Text output exists (a tokenizer is loaded).
    pub detokenize: bool,
}

impl Limits {
    pub fn of(engine: &EngineHandle) -> Self {
        let info = engine.info();
        Limits {
            context_length: info.context_length,
            vocab_size: info.vocab_size,
            detokenize: engine.tokenizer().is_some(),
        }
    }
}

/// Check `input_ids` against the model and turn prompt + sampling into a request.
/// `prompt_field` names the field the prompt came from.
pub fn build_request(
    rid: String,
    input_ids: Vec<u32>,
    prompt_field: &str,
    sampling: &SamplingInput,
    default: MaxTokensDefault,
    limits: &Limits,
) -> Result<GenerateRequest> {
    if input_ids.is_empty() {
        return Err(EngineError::bad_param(
            prompt_field,
            format!("`{prompt_field}` is empty: give at least one token of prompt"),
        ));
    }
    if let Some((i, id)) = input_ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= limits.vocab_size)
    {
        return Err(EngineError::bad_param(
            prompt_field,
            format!(
                "`{prompt_field}` token {i} is {id}, out of range: the vocabulary has {} tokens (ids 0..{})",
                limits.vocab_size,
                limits.vocab_size.saturating_sub(1)
            ),
        ));
    }
    let ctx = limits.context_length;
    let n = input_ids.len();
    if n >= ctx {
        return Err(EngineError::bad_param(
            prompt_field,
            format!(
                "prompt has {n} tokens, context length {ctx}: no room is left for output; shorten the prompt to at most {} tokens",
                ctx.saturating_sub(1)
            ),
        ));
    }
    let room = ctx - n;
    let mut params = sampling.params.clone();
    params.max_new_tokens = match (sampling.max_tokens, default) {
        (Some(m), _) if m > room => {
            let field = &sampling.max_tokens_field;
            return Err(EngineError::bad_param(
                field,
                format!(
                    "prompt has {n} tokens, {field} {m}, context length {ctx}: {n} + {m} > {ctx}; lower {field} to at most {room} or shorten the prompt"
                ),
            ));
        }
        (Some(m), _) => m,
        (None, MaxTokensDefault::Fixed(d)) => d.min(room),
    };
    if params.min_new_tokens > params.max_new_tokens {
        let field = &sampling.min_tokens_field;
        return Err(EngineError::bad_param(
            field,
            format!(
                "`{field}` is {}, more than the output budget of {} tokens; it must be in [0, {}]",
                params.min_new_tokens, params.max_new_tokens, params.max_new_tokens
            ),
        ));
    }
    if let Some((id, _)) = params
        .logit_bias
        .iter()
        .find(|(id, _)| *id as usize >= limits.vocab_size)
    {
        return Err(EngineError::bad_param(
            "logit_bias",
            format!(
                "`logit_bias` token id {id} is out of range: the vocabulary has {} tokens",
                limits.vocab_size
            ),
        ));
    }
    let logprobs = match sampling.logprobs {
        None => None,
        Some(lp) => {
            // -1 (SGLang's default) reports output logprobs only.
            let start = usize::try_from(lp.start_len).unwrap_or(n - 1);
            if start >= n {
                let field = lp.start_field;
                return Err(EngineError::bad_param(
                    field,
                    format!(
                        "`{field}` is {start} but the prompt has {n} tokens: it must be less than the prompt length, or -1 for output logprobs only"
                    ),
                ));
            }
            Some(LogprobRequest {
                start_len: start,
                top_k: lp.top_k,
            })
        }
    };
    if !params.stop.is_empty() && !limits.detokenize {
        return Err(EngineError::bad_param(
            "stop",
            "stop strings need a tokenizer, but this server runs with --skip-tokenizer-init; use stop_token_ids",
        ));
    }
    if let Some(id) = params
        .stop_token_ids
        .iter()
        .find(|id| **id as usize >= limits.vocab_size)
    {
        return Err(EngineError::bad_param(
            "stop_token_ids",
            format!(
                "stop token id {id} is out of range: the vocabulary has {} tokens",
                limits.vocab_size
            ),
        ));
    }
    Ok(GenerateRequest {
        rid,
        input_ids,
        sampling: params,
        detokenize: limits.detokenize,
        logprobs,
    })
}

/// A fresh request id (SGLang uses uuid4 hex).
pub fn new_rid() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The OpenAI `model` field: accept the served name, "default" and the model path; refuse
/// anything else with the names that would work.
pub fn check_model(engine: &EngineHandle, model: Option<&str>) -> Result<String> {
    let served = engine.info().served_model_name.clone();
    let Some(name) = model else {
        return Ok(served);
    };
    let path = engine.info().model_path.clone();
    let arg_path = engine.args().model_path.to_string_lossy().into_owned();
    if name == served || name == "default" || name == path || name == arg_path {
        return Ok(served);
    }
    Err(EngineError::NotFound(format!(
        "The model `{name}` does not exist. This server serves `{served}` (also reachable as `default`)."
    )))
}

#[cfg(test)]
mod tests;
