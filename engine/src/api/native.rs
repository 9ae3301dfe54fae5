//! SGLang's native routes: `/generate`, `/health`, `/health_generate`, `/get_model_info`,
//! `/get_server_info`, `/flush_cache`, `/metrics`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Map, Value, json};

use super::generation::{Output, Step, Tagged, finish_all, merge, submit_all};
use super::validate::{
    Dialect, Limits, MaxTokensDefault, NATIVE_DEFAULT_MAX_NEW_TOKENS, Obj, SamplingInput,
    build_request, describe, new_rid, parse_sampling, token_id_list,
};
use super::{JsonObject, run_blocking, sse};
use crate::config::ServerArgs;
use crate::engine::EngineHandle;
use crate::error::{EngineError, Result};
use crate::request::{FinishReason, GenerateRequest, SamplingParams};

/// A `/generate` body turned into requests.
struct ParsedGenerate {
    reqs: Vec<GenerateRequest>,
    /// The input was a list: answer with a list (and tag stream chunks with `index`).
    batch: bool,
    stream: bool,
    /// Return `output_ids` (the input was token ids, or there is no tokenizer).
    want_ids: bool,
}

/// The prompts of a `/generate` body: `text` (string or list) or `input_ids` (list or list of
/// lists). Returns the token ids of each prompt and whether the input was a batch.
fn generate_prompts(engine: &EngineHandle, obj: &Obj<'_>) -> Result<(Vec<Vec<u32>>, bool)> {
    match (obj.get("text"), obj.get("input_ids")) {
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
                Value::String(s) => Ok((vec![encode(s, "text")?], false)),
                Value::Array(items) if items.is_empty() => Err(EngineError::bad_param(
                    "text",
                    "`text` is an empty list: give at least one prompt",
                )),
                Value::Array(items) => {
                    let mut out = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        let field = format!("text[{i}]");
                        let s = item.as_str().ok_or_else(|| {
                            EngineError::bad_param(
                                &field,
                                format!("`{field}` must be a string, got {}", describe(item)),
                            )
                        })?;
                        out.push(encode(s, &field)?);
                    }
                    Ok((out, true))
                }
                other => Err(obj.err(
                    "text",
                    format!(
                        "must be a string or a list of strings, got {}",
                        describe(other)
                    ),
                )),
            }
        }
        (None, Some(ids)) => match ids {
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_array) => {
                let out = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| token_id_list(item, &format!("input_ids[{i}]")))
                    .collect::<Result<Vec<_>>>()?;
                Ok((out, true))
            }
            other => Ok((vec![token_id_list(other, "input_ids")?], false)),
        },
    }
}

/// `sampling_params`: one object for every prompt, or a list with one per prompt.
fn generate_sampling(obj: &Obj<'_>, prompts: usize, batch: bool) -> Result<Vec<SamplingInput>> {
    let one = |m: &Map<String, Value>, prefix: String| {
        parse_sampling(&Obj::with_prefix(m, prefix), Dialect::Native)
    };
    match obj.get("sampling_params") {
        None => Ok(vec![one(&Map::new(), String::new())?; prompts]),
        Some(Value::Object(m)) => Ok(vec![one(m, "sampling_params.".into())?; prompts]),
        Some(Value::Array(list)) if batch => {
            if list.len() != prompts {
                return Err(obj.err(
                    "sampling_params",
                    format!(
                        "has {} entries but the batch has {prompts} prompts",
                        list.len()
                    ),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(m) => one(m, format!("sampling_params[{i}].")),
                    Value::Null => one(&Map::new(), String::new()),
                    other => Err(obj.err(
                        &format!("sampling_params[{i}]"),
                        format!("must be an object, got {}", describe(other)),
                    )),
                })
                .collect()
        }
        Some(other) => Err(obj.err(
            "sampling_params",
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

/// `rid`: a string (single prompt) or a list of strings (batch).
fn generate_rids(obj: &Obj<'_>, prompts: usize, batch: bool) -> Result<Vec<String>> {
    match obj.get("rid") {
        None => Ok((0..prompts).map(|_| new_rid()).collect()),
        Some(Value::String(s)) if !batch => Ok(vec![s.clone()]),
        Some(Value::Array(list)) if batch && list.len() == prompts => list
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    obj.err(
                        &format!("rid[{i}]"),
                        format!("must be a string, got {}", describe(v)),
                    )
                })
            })
            .collect(),
        Some(other) => Err(obj.err(
            "rid",
            format!(
                "must be {}, got {}",
                if batch {
                    format!("a list of {prompts} strings")
                } else {
                    "a string".into()
                },
                describe(other)
            ),
        )),
    }
}

fn parse_generate(engine: &EngineHandle, body: &Map<String, Value>) -> Result<ParsedGenerate> {
    let obj = Obj::new(body);
    obj.unsupported("return_logprob", &[Value::Bool(false)], "logprobs")?;
    obj.unsupported(
        "return_hidden_states",
        &[Value::Bool(false)],
        "hidden states",
    )?;
    obj.unsupported("image_data", &[], "images")?;
    obj.unsupported("lora_path", &[], "LoRA adapters")?;
    obj.unsupported("input_embeds", &[], "input embeddings")?;
    obj.unsupported("custom_logit_processor", &[], "custom logit processors")?;
    let (prompts, batch) = generate_prompts(engine, &obj)?;
    let sampling = generate_sampling(&obj, prompts.len(), batch)?;
    let rids = generate_rids(&obj, prompts.len(), batch)?;
    let stream = obj.bool("stream")?.unwrap_or(false);
    let total: usize = sampling.iter().map(|s| s.n).sum();
    if total > super::validate::MAX_FAN_OUT {
        return Err(EngineError::bad_request(format!(
            "this request asks for {total} generations; at most {} per request",
            super::validate::MAX_FAN_OUT
        )));
    }
    let limits = Limits::of(engine);
    let field = if obj.has("text") { "text" } else { "input_ids" };
    let mut reqs = Vec::with_capacity(total);
    for ((ids, s), rid) in prompts.into_iter().zip(&sampling).zip(rids) {
        let default = MaxTokensDefault::Fixed(NATIVE_DEFAULT_MAX_NEW_TOKENS);
        for j in 0..s.n {
            let rid = if s.n == 1 {
                rid.clone()
            } else {
                format!("{rid}-{j}")
            };
            reqs.push(build_request(rid, ids.clone(), field, s, default, &limits)?);
        }
    }
    // More than one generation is answered as a list even for one prompt (`n` > 1).
    let batch = batch || reqs.len() > 1;
    let want_ids = field == "input_ids" || !limits.detokenize;
    Ok(ParsedGenerate {
        reqs,
        batch,
        stream,
        want_ids,
    })
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

fn output_json(o: &Output, want_ids: bool) -> Value {
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
    if want_ids {
        v["output_ids"] = json!(o.ids);
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
    if p.batch {
        v["index"] = json!(t.index);
    }
    v
}

/// `POST /generate`
pub async fn generate(
    State(engine): State<EngineHandle>,
    JsonObject(body): JsonObject,
) -> Result<Response> {
    let e = engine.clone();
    let mut p = run_blocking(move || parse_generate(&e, &body)).await?;
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
        Value::Array(outs.iter().map(|o| output_json(o, p.want_ids)).collect())
    } else {
        outs.first()
            .map(|o| output_json(o, p.want_ids))
            .unwrap_or(Value::Null)
    };
    Ok(Json(body).into_response())
}

/// `GET /health`: 200 while the scheduler runs.
pub async fn health(State(engine): State<EngineHandle>) -> Response {
    if engine.stats().alive.load(Ordering::Acquire) {
        StatusCode::OK.into_response()
    } else {
        EngineError::Unavailable("the engine's scheduler is not running".into()).into_response()
    }
}

/// How long `/health_generate` waits for its one token.
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// `GET /health_generate`: 200 once a one-token generation went through the whole engine.
pub async fn health_generate(State(engine): State<EngineHandle>) -> Result<Response> {
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
    };
    let gens = submit_all(&engine, vec![req])?;
    match tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, finish_all(gens)).await {
        Ok(Ok(_)) => Ok(StatusCode::OK.into_response()),
        Ok(Err(e)) => Err(EngineError::Unavailable(format!(
            "health generation failed: {e}"
        ))),
        Err(_) => Err(EngineError::Unavailable(format!(
            "health generation did not finish within {} s",
            HEALTH_GENERATE_TIMEOUT.as_secs()
        ))),
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

fn enum_name(v: &impl std::fmt::Debug) -> String {
    format!("{v:?}").to_lowercase()
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
        "disable_radix_cache": args.disable_radix_cache,
        "enable_metrics": args.enable_metrics,
        "enable_cache_report": args.enable_cache_report,
        "random_seed": args.random_seed,
        "log_level": args.log_level.as_filter(),
        "log_requests": args.log_requests,
        "skip_tokenizer_init": args.skip_tokenizer_init,
        "device": enum_name(&args.device),
        "num_threads": args.num_threads,
        "max_queued_requests": args.max_queued_requests,
        // Through its decimal text, so 0.88 stays 0.88 and does not widen to 0.8799999952.
        "mem_fraction_static": args.mem_fraction_static.to_string().parse::<f64>().ok(),
        "tp_size": args.tp_size,
        "dp_size": args.dp_size,
        "quantization": args.quantization,
        "kv_cache_dtype": args.kv_cache_dtype,
        "grammar_backend": args.grammar_backend,
        "cuda_graph_max_bs": args.cuda_graph_max_bs,
        "disable_cuda_graph": args.disable_cuda_graph,
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
pub async fn flush_cache(State(engine): State<EngineHandle>) -> Result<Response> {
    if engine.flush_cache().await {
        Ok((StatusCode::OK, "Cache flushed.\n").into_response())
    } else {
        Err(EngineError::bad_request(
            "Cache not flushed: requests are running or waiting. Retry when the server is idle.",
        ))
    }
}

/// `GET /metrics` (with `--enable-metrics`).
pub async fn metrics(State(engine): State<EngineHandle>) -> Result<Response> {
    if !engine.args().enable_metrics {
        return Err(EngineError::NotFound(
            "metrics are off: start the server with --enable-metrics".into(),
        ));
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
