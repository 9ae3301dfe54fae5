//! SGLang's native routes: `/generate`, `/health`, `/health_generate`, `/get_model_info`,
//! `/get_server_info`, `/flush_cache`, `/metrics`.
//!
//! `/generate` takes SGLang's logprob fields (`return_logprob`, `logprob_start_len`,
//! `top_logprobs_num`, `return_text_in_logprobs`; the first three also as one value per prompt)
//! and answers in SGLang 0.4's shapes: `meta_info.input_token_logprobs` and
//! `output_token_logprobs` are lists of `[logprob, token_id, text_or_null]`, and with
//! `top_logprobs_num` > 0 `input_top_logprobs` / `output_top_logprobs` hold, per position, a
//! list of such triples. Prompt entries cover the positions after `logprob_start_len`, plus
//! position 0 (logprob null) when it is 0; the default -1 reports output logprobs only.
//! `sampling_params.n` > 1 answers with a list of `n` results for one prompt.
//! `sampling_params.json_schema` / `regex` / `ebnf` constrain the output (structured output).
//!
//! `POST /parse_function_call` (also served as `/function_call`) splits a model output into
//! normal text and tool calls with a `--tool-call-parser` format.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::generation::{
    Output, Step, Tagged, finish_all, merge, prefill_shared_prompts, submit_all,
};
use super::schema::{self, Count, GenerateBody, InputIds, Int, OneOrMany};
use super::validate::{
    Dialect, Fields, Limits, LogprobInput, MaxTokensDefault, NATIVE_DEFAULT_MAX_NEW_TOKENS,
    SamplingInput, build_request, compile_grammar, describe, new_rid, parse_sampling,
};
use super::{ApiError, ApiResult, JsonObject, run_blocking, sse};
use sgl_core::config::ServerArgs;
use sgl_core::engine::EngineHandle;
use sgl_core::error::{EngineError, Result};
use sgl_core::request::{FinishReason, GenerateRequest, SamplingParams, TokenLogprob};
use sgl_core::tokenizer::Tokenizer;

/// Most alternatives per position `/generate` returns (`top_logprobs_num`).
pub const MAX_TOP_LOGPROBS_NUM: usize = 100;

/// A `/generate` body turned into requests.
struct ParsedGenerate {
    reqs: Vec<GenerateRequest>,
    /// The input was a list: answer with a list (and tag stream chunks with `index`).
    batch: bool,
    stream: bool,
    /// Return `output_ids` (the input was token ids, or there is no tokenizer).
    want_ids: bool,
    /// Per request: the number of alternatives per position when it returns logprobs.
    logprob_top: Vec<Option<usize>>,
    /// Decode the tokens of logprob entries (`return_text_in_logprobs`).
    logprob_text: Option<std::sync::Arc<Tokenizer>>,
}

/// The prompts of a `/generate` body: `text` (string or list) or `input_ids` (list or list of
/// lists). Returns the token ids of each prompt and whether the input was a batch.
fn generate_prompts(
    engine: &EngineHandle,
    text: Option<OneOrMany<String>>,
    input_ids: Option<InputIds>,
) -> Result<(Vec<Vec<u32>>, bool)> {
    match (text, input_ids) {
        (Some(_), Some(_)) => Err(EngineError::bad_request(
            "give either `text` or `input_ids`, not both",
        )),
        (None, None) => Err(EngineError::bad_request(
            "give the prompt as `text` (a string or a list of strings) or `input_ids` (a list of token ids or a list of lists)",
        )),
        (Some(text), None) => {
            let tok = engine.tokenizer().ok_or_else(|| {
                EngineError::bad_param(
                    "text",
                    "`text` needs a tokenizer, but this server runs with --skip-tokenizer-init; send `input_ids`",
                )
            })?;
            let encode = |s: &str, field: &str| -> Result<Vec<u32>> {
                if s.is_empty() {
                    return Err(EngineError::bad_param(
                        field,
                        format!("`{field}` is empty: give some prompt text"),
                    ));
                }
                tok.encode(s, true)
                    .map_err(|e| EngineError::bad_param(field, e.to_string()))
            };
            match text {
                OneOrMany::One(s) => Ok((vec![encode(&s, "text")?], false)),
                OneOrMany::Many(items) if items.is_empty() => Err(EngineError::bad_param(
                    "text",
                    "`text` is an empty list: give at least one prompt",
                )),
                OneOrMany::Many(items) => {
                    let out = items
                        .iter()
                        .enumerate()
                        .map(|(i, s)| encode(s, &format!("text[{i}]")))
                        .collect::<Result<Vec<_>>>()?;
                    Ok((out, true))
                }
            }
        }
        (None, Some(InputIds::One(ids))) => Ok((vec![ids], false)),
        (None, Some(InputIds::Batch(lists))) => Ok((lists, true)),
    }
}

/// `sampling_params`: one object for every prompt, or a list with one per prompt.
fn generate_sampling(
    params: Option<&Value>,
    prompts: usize,
    batch: bool,
) -> Result<Vec<SamplingInput>> {
    let f = Fields::new("");
    let key = "sampling_params";
    let empty = Value::Object(Map::new());
    match params {
        None | Some(Value::Null) => Ok(vec![parse_sampling(&empty, "", Dialect::Native)?; prompts]),
        Some(v @ Value::Object(_)) => Ok(vec![parse_sampling(v, key, Dialect::Native)?; prompts]),
        Some(Value::Array(list)) if batch => {
            if list.len() != prompts {
                return Err(f.err(
                    key,
                    format!(
                        "has {} entries but the batch has {prompts} prompts",
                        list.len()
                    ),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(_) => parse_sampling(v, &format!("{key}[{i}]"), Dialect::Native),
                    Value::Null => parse_sampling(&empty, "", Dialect::Native),
                    other => Err(f.err(
                        &format!("{key}[{i}]"),
                        format!("must be an object, got {}", describe(other)),
                    )),
                })
                .collect()
        }
        Some(other) => Err(f.err(
            key,
            format!(
                "must be an object{}, got {}",
                if batch {
                    " or a list of objects (one per prompt)"
                } else {
                    ""
                },
                describe(other)
            ),
        )),
    }
}

/// A top-level field given once for every prompt, or (in a batch) as a list with one value
/// per prompt. `check` takes each value and its field name for errors. `default` fills the
/// prompts when the field is absent.
fn per_prompt<T: Clone, U: Clone>(
    key: &str,
    value: Option<OneOrMany<T>>,
    prompts: usize,
    batch: bool,
    default: U,
    check: impl Fn(T, &str) -> Result<U>,
) -> Result<Vec<U>> {
    let f = Fields::new("");
    match value {
        None => Ok(vec![default; prompts]),
        Some(OneOrMany::One(v)) => Ok(vec![check(v, key)?; prompts]),
        Some(OneOrMany::Many(list)) if batch => {
            if list.len() != prompts {
                return Err(f.err(
                    key,
                    format!(
                        "has {} entries but the batch has {prompts} prompts",
                        list.len()
                    ),
                ));
            }
            list.into_iter()
                .enumerate()
                .map(|(i, v)| check(v, &format!("{key}[{i}]")))
                .collect()
        }
        Some(OneOrMany::Many(_)) => Err(f.err(
            key,
            "must be one value for a single prompt, got a list (lists give one value per prompt of a batch)",
        )),
    }
}

/// `rid`: a string (single prompt) or a list of strings (batch).
fn generate_rids(
    rid: Option<OneOrMany<String>>,
    prompts: usize,
    batch: bool,
) -> Result<Vec<String>> {
    match rid {
        None => Ok((0..prompts).map(|_| new_rid()).collect()),
        Some(OneOrMany::One(s)) if !batch => Ok(vec![s]),
        Some(OneOrMany::Many(list)) if batch && list.len() == prompts => Ok(list),
        Some(other) => Err(Fields::new("").err(
            "rid",
            format!(
                "must be {}, got {}",
                if batch {
                    format!("a list of {prompts} strings")
                } else {
                    "a string".into()
                },
                match other {
                    OneOrMany::One(_) => "a single string".to_string(),
                    OneOrMany::Many(l) => format!("a list of {}", l.len()),
                }
            ),
        )),
    }
}

/// The logprob fields of a `/generate` body, one entry per prompt.
fn generate_logprobs(
    body: &mut GenerateBody,
    prompts: usize,
    batch: bool,
) -> Result<Vec<Option<LogprobInput>>> {
    let want = per_prompt(
        "return_logprob",
        body.return_logprob.take(),
        prompts,
        batch,
        false,
        |b, _| Ok(b),
    )?;
    let start = per_prompt(
        "logprob_start_len",
        body.logprob_start_len.take(),
        prompts,
        batch,
        -1,
        |Int(x), name| {
            if x >= -1 {
                Ok(x)
            } else {
                Err(EngineError::bad_param(
                    name,
                    format!(
                        "`{name}` must be -1 (output logprobs only) or a prompt position >= 0, got {x}"
                    ),
                ))
            }
        },
    )?;
    let top = per_prompt(
        "top_logprobs_num",
        body.top_logprobs_num.take(),
        prompts,
        batch,
        0,
        |Count(x), name| {
            if x <= MAX_TOP_LOGPROBS_NUM {
                Ok(x)
            } else {
                Err(EngineError::bad_param(
                    name,
                    format!("`{name}` must be an integer in [0, {MAX_TOP_LOGPROBS_NUM}], got {x}"),
                ))
            }
        },
    )?;
    Ok((0..prompts)
        .map(|i| {
            want[i].then_some(LogprobInput {
                start_len: start[i],
                top_k: top[i],
                start_field: "logprob_start_len",
            })
        })
        .collect())
}

fn parse_generate(engine: &EngineHandle, body: Map<String, Value>) -> Result<ParsedGenerate> {
    let mut body: GenerateBody = schema::read_owned(Value::Object(body), "")?;
    let f = Fields::new("");
    f.unsupported(
        "return_hidden_states",
        body.return_hidden_states.as_ref(),
        &[Value::Bool(false)],
        "hidden states",
    )?;
    f.unsupported("image_data", body.image_data.as_ref(), &[], "images")?;
    f.unsupported("lora_path", body.lora_path.as_ref(), &[], "LoRA adapters")?;
    f.unsupported(
        "input_embeds",
        body.input_embeds.as_ref(),
        &[],
        "input embeddings",
    )?;
    f.unsupported(
        "custom_logit_processor",
        body.custom_logit_processor.as_ref(),
        &[],
        "custom logit processors",
    )?;
    let field = if body.text.is_some() {
        "text"
    } else {
        "input_ids"
    };
    let (prompts, batch) = generate_prompts(engine, body.text.take(), body.input_ids.take())?;
    let mut sampling = generate_sampling(body.sampling_params.as_ref(), prompts.len(), batch)?;
    let logprobs = generate_logprobs(&mut body, prompts.len(), batch)?;
    for (s, lp) in sampling.iter_mut().zip(logprobs) {
        s.logprobs = lp;
    }
    let return_text = body.return_text_in_logprobs.unwrap_or(false);
    let rids = generate_rids(body.rid.take(), prompts.len(), batch)?;
    let stream = body.stream.unwrap_or(false);
    let total: usize = sampling.iter().map(|s| s.n).sum();
    if total > super::validate::MAX_FAN_OUT {
        return Err(EngineError::bad_request(format!(
            "this request asks for {total} generations; at most {} per request",
            super::validate::MAX_FAN_OUT
        )));
    }
    for s in sampling.iter_mut() {
        compile_grammar(engine, s)?;
    }
    let limits = Limits::of(engine);
    let mut reqs = Vec::with_capacity(total);
    for ((ids, s), rid) in prompts.into_iter().zip(&sampling).zip(rids) {
        let default = MaxTokensDefault::Fixed(NATIVE_DEFAULT_MAX_NEW_TOKENS);
        for j in 0..s.n {
            let rid = if s.n == 1 {
                rid.clone()
            } else {
                format!("{rid}-{j}")
            };
            let mut req = build_request(rid, ids.clone(), field, s, default, &limits)?;
            // Parallel samples with a seed get seed, seed + 1, ... so that they differ.
            req.sampling.seed = s.params.seed.map(|seed| seed.wrapping_add(j as u64));
            reqs.push(req);
        }
    }
    // More than one generation is answered as a list even for one prompt (`n` > 1).
    let batch = batch || reqs.len() > 1;
    let want_ids = field == "input_ids" || !limits.detokenize;
    let logprob_top = reqs.iter().map(|r| r.logprobs.map(|l| l.top_k)).collect();
    Ok(ParsedGenerate {
        reqs,
        batch,
        stream,
        want_ids,
        logprob_top,
        logprob_text: if return_text {
            engine.tokenizer().cloned()
        } else {
            None
        },
    })
}

/// `[logprob, token_id, text_or_null]`.
fn logprob_triple(logprob: Option<f32>, id: u32, tok: Option<&Tokenizer>) -> Value {
    let text = tok.map(|t| t.decode(&[id], false).unwrap_or_default());
    json!([logprob, id, text])
}

/// The logprob fields of `meta_info` for one request (SGLang's shapes).
fn add_logprobs(
    meta: &mut Value,
    top_k: usize,
    input: Option<&[TokenLogprob]>,
    output: &[TokenLogprob],
    tok: Option<&Tokenizer>,
) {
    let input = input.unwrap_or(&[]);
    let tokens = |entries: &[TokenLogprob]| -> Value {
        entries
            .iter()
            .map(|e| logprob_triple(e.logprob, e.id, tok))
            .collect()
    };
    let tops = |entries: &[TokenLogprob]| -> Value {
        entries
            .iter()
            .map(|e| match &e.top {
                Some(top) => top
                    .iter()
                    .map(|&(id, lp)| logprob_triple(Some(lp), id, tok))
                    .collect(),
                None => Value::Null,
            })
            .collect()
    };
    meta["input_token_logprobs"] = tokens(input);
    meta["output_token_logprobs"] = tokens(output);
    if top_k > 0 {
        meta["input_top_logprobs"] = tops(input);
        meta["output_top_logprobs"] = tops(output);
    }
}

fn meta_info(
    rid: &str,
    reason: Option<&FinishReason>,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    e2e_latency: f64,
) -> Value {
    json!({
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "e2e_latency": e2e_latency,
    })
}

fn output_json(o: &Output, index: usize, p: &ParsedGenerate) -> Value {
    let mut v = json!({
        "text": o.text,
        "meta_info": meta_info(
            &o.rid,
            Some(&o.reason),
            o.usage.prompt_tokens,
            o.usage.completion_tokens,
            o.usage.cached_tokens,
            o.e2e_latency,
        ),
    });
    if p.want_ids {
        v["output_ids"] = json!(o.ids);
    }
    if let Some(Some(top_k)) = p.logprob_top.get(index) {
        add_logprobs(
            &mut v["meta_info"],
            *top_k,
            o.input_logprobs.as_deref(),
            &o.output_logprobs,
            p.logprob_text.as_deref(),
        );
    }
    v
}

/// One streamed chunk: the whole output so far, as SGLang streams it.
fn chunk_json(t: &Tagged, p: &ParsedGenerate) -> Value {
    let (reason, cached, prompt) = match &t.step {
        Ok(Step::Done { reason, usage, .. }) => {
            (Some(reason), usage.cached_tokens, usage.prompt_tokens)
        }
        _ => (None, 0, t.prompt_tokens),
    };
    let mut v = json!({
        "text": t.text,
        "meta_info": meta_info(&t.rid, reason, prompt, t.completion_tokens, cached, t.started.elapsed().as_secs_f64()),
    });
    if p.want_ids {
        v["output_ids"] = json!(t.ids);
    }
    if let Some(Some(top_k)) = p.logprob_top.get(t.index) {
        add_logprobs(
            &mut v["meta_info"],
            *top_k,
            t.input_logprobs.as_deref(),
            &t.output_logprobs,
            p.logprob_text.as_deref(),
        );
    }
    if p.batch {
        v["index"] = json!(t.index);
    }
    v
}

/// `POST /generate`
pub async fn generate(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let e = engine.clone();
    let mut p = run_blocking(move || parse_generate(&e, body)).await?;
    prefill_shared_prompts(&engine, &p.reqs).await?;
    let gens = submit_all(&engine, std::mem::take(&mut p.reqs))?;
    if p.stream {
        let events = async_stream::stream! {
            let mut steps = merge(gens, true);
            while let Some(t) = steps.next().await {
                if let Err(e) = &t.step {
                    yield sse::error(e);
                    break;
                }
                yield sse::json(&chunk_json(&t, &p));
            }
            yield sse::done();
        };
        return Ok(sse::response(events));
    }
    let outs = finish_all(gens).await?;
    let body = if p.batch {
        Value::Array(
            outs.iter()
                .enumerate()
                .map(|(i, o)| output_json(o, i, &p))
                .collect(),
        )
    } else {
        outs.first()
            .map(|o| output_json(o, 0, &p))
            .unwrap_or(Value::Null)
    };
    Ok(Json(body).into_response())
}

/// `POST /parse_function_call` and `POST /function_call`: `{"text", "tool_call_parser",
/// "tools"}` to `{"normal_text", "calls"}`; without `tool_call_parser` the server's
/// `--tool-call-parser` is used.
pub async fn parse_function_call(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let default = engine.args().tool_call_parser;
    run_blocking(move || {
        sgl_core::tool_parser::function_call_response_with_default(&Value::Object(body), default)
    })
    .await
    .map(Json)
    .map_err(ApiError)
}

/// `GET /health`: 200 while the scheduler runs.
pub async fn health(State(engine): State<EngineHandle>) -> Response {
    if engine.stats().alive.load(Ordering::Acquire) {
        StatusCode::OK.into_response()
    } else {
        ApiError(EngineError::unavailable(
            "the engine's scheduler is not running",
        ))
        .into_response()
    }
}

/// How long `/health_generate` waits for its one token.
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// `GET /health_generate`: 200 once a one-token generation went through the whole engine.
pub async fn health_generate(State(engine): State<EngineHandle>) -> ApiResult<Response> {
    let input_ids = engine
        .tokenizer()
        .and_then(|t| t.encode("Hello", false).ok())
        .filter(|ids| !ids.is_empty())
        .unwrap_or_else(|| vec![0]);
    let req = GenerateRequest {
        rid: format!("health-generate-{}", new_rid()),
        input_ids,
        sampling: SamplingParams {
            temperature: 0.0,
            max_new_tokens: 1,
            ignore_eos: true,
            ..SamplingParams::default()
        },
        detokenize: false,
        logprobs: None,
    };
    let gens = submit_all(&engine, vec![req])?;
    match tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, finish_all(gens)).await {
        Ok(Ok(_)) => Ok(StatusCode::OK.into_response()),
        Ok(Err(e)) => Err(ApiError(EngineError::unavailable(format!(
            "health generation failed: {e}"
        )))),
        Err(_) => Err(ApiError(EngineError::unavailable(format!(
            "health generation did not finish within {} s",
            HEALTH_GENERATE_TIMEOUT.as_secs()
        )))),
    }
}

/// `GET /get_model_info`
pub async fn get_model_info(State(engine): State<EngineHandle>) -> Json<Value> {
    let args = engine.args();
    let tokenizer_path = args.tokenizer_path.as_ref().unwrap_or(&args.model_path);
    Json(json!({
        "model_path": engine.info().model_path,
        "tokenizer_path": tokenizer_path.to_string_lossy(),
        "is_generation": true,
    }))
}

/// A flag value as it is spelled on the command line (`dfs-weight`, `cuda`).
fn enum_name(v: &impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// The server's flags as SGLang names them; the API key is never shown.
fn server_args_json(args: &ServerArgs) -> Map<String, Value> {
    let path = |p: &std::path::Path| Value::String(p.to_string_lossy().into_owned());
    let v = json!({
        "model_path": path(&args.model_path),
        "tokenizer_path": path(args.tokenizer_path.as_deref().unwrap_or(&args.model_path)),
        "host": args.host,
        "port": args.port,
        "served_model_name": args.model_name(),
        "chat_template": args.chat_template.as_deref().map(path),
        "api_key": args.api_key.as_ref().map(|_| "<hidden>"),
        "chunked_prefill_size": args.chunked_prefill_size,
        "schedule_policy": enum_name(&args.schedule_policy),
        "schedule_conservativeness": args.schedule_conservativeness,
        "disable_radix_cache": args.disable_radix_cache,
        "enable_metrics": args.enable_metrics,
        "enable_cache_report": args.enable_cache_report,
        "random_seed": args.random_seed,
        "log_level": args.log_level.as_filter(),
        "log_requests": args.log_requests,
        "skip_tokenizer_init": args.skip_tokenizer_init,
        "device": enum_name(&args.device()),
        "num_threads": args.num_threads,
        "max_queued_requests": args.max_queued_requests,
        "queue_timeout_secs": args.queue_timeout_secs,
        // Through its decimal text, so 0.88 stays 0.88 and does not widen to 0.8799999952.
        "mem_fraction_static": args.mem_fraction_static.to_string().parse::<f64>().ok(),
        "tp_size": args.tp_size,
        "dp_size": args.dp_size,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "grammar_backend": args.grammar_backend,
        "tool_call_parser": args.tool_call_parser.map(|k| k.name()),
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "disable_cuda_graph": args.disable_cuda_graph,
        "enable_deterministic_inference": args.enable_deterministic_inference,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// `GET /get_server_info`: the flags (with the limits the model settled), and live counters.
pub async fn get_server_info(State(engine): State<EngineHandle>) -> Json<Value> {
    let mut out = server_args_json(engine.args());
    let info = engine.info();
    let stats = engine.stats();
    let used = stats.num_used_tokens.load(Ordering::Relaxed);
    let prompt = stats.total_prompt_tokens.load(Ordering::Relaxed);
    let cached = stats.total_cached_tokens.load(Ordering::Relaxed);
    let live = json!({
        "served_model_name": info.served_model_name,
        "context_length": info.context_length,
        "vocab_size": info.vocab_size,
        "max_total_num_tokens": info.max_total_tokens,
        "max_running_requests": info.max_running_requests,
        "max_queued_requests": engine.queue_bounds().0,
        "max_queued_tokens": engine.queue_bounds().1,
        "eos_token_ids": info.eos_token_ids,
        "architecture": info.architecture,
        "version": env!("CARGO_PKG_VERSION"),
        "alive": stats.alive.load(Ordering::Relaxed),
        "num_running_reqs": stats.num_running_reqs.load(Ordering::Relaxed),
        "num_queue_reqs": stats.num_queue_reqs.load(Ordering::Relaxed),
        "num_used_tokens": used,
        "token_usage": if info.max_total_tokens > 0 { used as f64 / info.max_total_tokens as f64 } else { 0.0 },
        "total_generated_tokens": stats.total_generated.load(Ordering::Relaxed),
        "cache_hit_rate": if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 },
        "uptime_s": engine.uptime_secs(),
    });
    if let Value::Object(m) = live {
        out.extend(m);
    }
    Json(Value::Object(out))
}

/// `GET|POST /flush_cache`: 200 when the radix cache was dropped; 400 while requests run, as
/// SGLang does.
pub async fn flush_cache(State(engine): State<EngineHandle>) -> ApiResult<Response> {
    if engine.flush_cache().await {
        Ok((StatusCode::OK, "Cache flushed.\n").into_response())
    } else {
        Err(EngineError::bad_request(
            "Cache not flushed: requests are running or waiting. Retry when the server is idle.",
        )
        .into())
    }
}

/// `GET /metrics` (with `--enable-metrics`).
pub async fn metrics(State(engine): State<EngineHandle>) -> ApiResult<Response> {
    if !engine.args().enable_metrics {
        return Err(EngineError::NotFound(
            "metrics are off: start the server with --enable-metrics".into(),
        )
        .into());
    }
    let text = engine
        .metrics()
        .encode()
        .map_err(|e| EngineError::Internal(format!("failed to encode metrics: {e}")))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
