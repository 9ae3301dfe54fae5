//! Running submitted requests: one [`Generation`] per request, read to the end (non-streaming
//! routes) or event by event and merged across a batch (streaming routes).
//!
//! A `Generation` owns its [`RequestStream`]; dropping it (a client that went away drops the
//! handler future or the response body) aborts the request in the scheduler.
//!
//! Parallel sampling (`n` > 1) first runs each distinct prompt once with `max_new_tokens` 0
//! ([`prefill_shared_prompts`]), which computes its KV and leaves it in the radix cache, and
//! only then submits the `n` samples, which find the prompt there.

use std::time::Instant;

use futures::Stream;
use futures::stream::{self, StreamExt};

use sgl_core::engine::{EngineHandle, RequestStream};
use sgl_core::error::{EngineError, Result};
use sgl_core::request::{
    FinishReason, GenerateRequest, SamplingParams, StreamEvent, TokenLogprob, Usage,
};

/// One request in flight, with the output received so far.
pub struct Generation {
    stream: RequestStream,
    pub rid: String,
    pub prompt_tokens: usize,
    /// Output token ids so far.
    pub ids: Vec<u32>,
    /// Output text so far (stop strings trimmed by the scheduler).
    pub text: String,
    /// Prompt logprobs, once the engine sent them (only for requests that asked).
    pub input_logprobs: Option<Vec<TokenLogprob>>,
    /// Logprobs of the output tokens so far (only for requests that asked).
    pub output_logprobs: Vec<TokenLogprob>,
    pub started: Instant,
    log: bool,
    /// The engine sent the final event (or failed): nothing to abort on drop.
    over: bool,
}

/// What one step of a generation brought.
pub enum Step {
    /// New tokens and the text they completed (the text may be empty), with the tokens'
    /// logprobs when the request asked for them.
    Delta {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    /// The end; `text` is the last piece of text, flushed with the final event.
    Done {
        reason: FinishReason,
        usage: Usage,
        text: String,
    },
}

/// The whole output of a finished generation.
#[derive(Debug, Clone)]
pub struct Output {
    pub rid: String,
    pub ids: Vec<u32>,
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    pub e2e_latency: f64,
    pub input_logprobs: Option<Vec<TokenLogprob>>,
    pub output_logprobs: Vec<TokenLogprob>,
}

impl Generation {
    /// Read the next step. Engine failures become errors (the request is over then).
    pub async fn step(&mut self) -> Result<Step> {
        let mut event = self.stream.next().await;
        // Prompt logprobs come once, before any token: keep them and read on.
        while let Some(StreamEvent::PromptLogprobs { logprobs }) = event {
            self.input_logprobs = Some(logprobs);
            event = self.stream.next().await;
        }
        self.over = !matches!(event, Some(StreamEvent::Tokens { .. }));
        match event {
            Some(StreamEvent::Tokens {
                ids,
                text,
                logprobs,
            }) => {
                self.ids.extend_from_slice(&ids);
                self.text.push_str(&text);
                self.output_logprobs.extend_from_slice(&logprobs);
                Ok(Step::Delta { text, logprobs })
            }
            Some(StreamEvent::PromptLogprobs { .. }) => Err(EngineError::Internal(
                "prompt logprobs arrived out of order".into(),
            )),
            Some(StreamEvent::Finished {
                reason,
                usage,
                text,
            }) => {
                self.text.push_str(&text);
                if self.log {
                    tracing::info!(
                        rid = %self.rid,
                        finish_reason = ?reason,
                        prompt_tokens = usage.prompt_tokens,
                        completion_tokens = usage.completion_tokens,
                        cached_tokens = usage.cached_tokens,
                        latency_s = self.started.elapsed().as_secs_f64(),
                        output = %self.text,
                        output_ids = ?self.ids,
                        "request finished"
                    );
                }
                Ok(Step::Done {
                    reason,
                    usage,
                    text,
                })
            }
            Some(StreamEvent::Error { message }) => {
                tracing::warn!(rid = %self.rid, %message, "request failed in the engine");
                Err(EngineError::Internal(message))
            }
            None => Err(self.stream.expired().unwrap_or_else(|| {
                EngineError::unavailable("the engine stopped before the request finished")
            })),
        }
    }

    /// Read to the end.
    pub async fn finish(mut self) -> Result<Output> {
        loop {
            if let Step::Done { reason, usage, .. } = self.step().await? {
                return Ok(Output {
                    rid: std::mem::take(&mut self.rid),
                    ids: std::mem::take(&mut self.ids),
                    text: std::mem::take(&mut self.text),
                    reason,
                    usage,
                    e2e_latency: self.started.elapsed().as_secs_f64(),
                    input_logprobs: self.input_logprobs.take(),
                    output_logprobs: std::mem::take(&mut self.output_logprobs),
                });
            }
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // Dropping `stream` aborts the request; say so when requests are logged.
        if self.log && !self.over {
            tracing::info!(
                rid = %self.rid,
                completion_tokens = self.ids.len(),
                "request aborted: the client went away"
            );
        }
    }
}

/// Submit every request, or none: if one submission fails, the ones already queued are
/// dropped (aborted) and the error is returned.
pub fn submit_all(engine: &EngineHandle, reqs: Vec<GenerateRequest>) -> Result<Vec<Generation>> {
    let log = engine.args().log_requests;
    let started = Instant::now();
    let mut out = Vec::with_capacity(reqs.len());
    for req in reqs {
        if log {
            tracing::info!(
                rid = %req.rid,
                input_ids = ?req.input_ids,
                sampling = ?req.sampling,
                "request received"
            );
        }
        let rid = req.rid.clone();
        let prompt_tokens = req.input_ids.len();
        let stream = engine.submit(req)?;
        out.push(Generation {
            stream,
            rid,
            prompt_tokens,
            ids: Vec::new(),
            text: String::new(),
            input_logprobs: None,
            output_logprobs: Vec::new(),
            started,
            log,
            over: false,
        });
    }
    Ok(out)
}

/// Run each prompt that occurs more than once in `reqs` (the samples of `n` > 1) once with
/// `max_new_tokens` 0, so that its KV is in the radix cache before the samples start and is
/// computed once, not once per sample. Does nothing with the radix cache off.
pub async fn prefill_shared_prompts(engine: &EngineHandle, reqs: &[GenerateRequest]) -> Result<()> {
    if engine.args().disable_radix_cache {
        return Ok(());
    }
    let mut prefills: Vec<GenerateRequest> = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let shared = reqs[i + 1..].iter().any(|o| o.input_ids == r.input_ids);
        if !shared || prefills.iter().any(|p| p.input_ids == r.input_ids) {
            continue;
        }
        prefills.push(GenerateRequest {
            rid: format!("{}-prefill", r.rid),
            input_ids: r.input_ids.clone(),
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 0,
                ..SamplingParams::default()
            },
            detokenize: false,
            logprobs: None,
        });
    }
    if !prefills.is_empty() {
        finish_all(submit_all(engine, prefills)?).await?;
    }
    Ok(())
}

/// Read every generation to its end, concurrently; results keep the input order.
pub async fn finish_all(gens: Vec<Generation>) -> Result<Vec<Output>> {
    futures::future::join_all(gens.into_iter().map(Generation::finish))
        .await
        .into_iter()
        .collect()
}

/// One step of one generation of a batch, tagged with its index in the batch.
pub struct Tagged {
    pub index: usize,
    pub step: Result<Step>,
    /// Output tokens so far.
    pub completion_tokens: usize,
    /// Cumulative output text, ids and logprobs (only when `merge` was asked for them).
    pub text: String,
    pub ids: Vec<u32>,
    pub input_logprobs: Option<Vec<TokenLogprob>>,
    pub output_logprobs: Vec<TokenLogprob>,
    pub prompt_tokens: usize,
    pub rid: String,
    pub started: Instant,
}

/// Merge the steps of all generations into one stream, in arrival order. Each generation
/// contributes steps up to and including its `Done` (or its error). Dropping the stream
/// drops (aborts) every generation still running. With `cumulative`, each step carries the
/// whole output so far (the native API streams that way).
pub fn merge(gens: Vec<Generation>, cumulative: bool) -> impl Stream<Item = Tagged> + Send {
    let per_gen = gens.into_iter().enumerate().map(move |(index, g)| {
        stream::unfold(Some(g), move |state| async move {
            let mut g = state?;
            let step = g.step().await;
            let over = !matches!(step, Ok(Step::Delta { .. }));
            let tagged = Tagged {
                index,
                step,
                completion_tokens: g.ids.len(),
                text: if cumulative {
                    g.text.clone()
                } else {
                    String::new()
                },
                ids: if cumulative {
                    g.ids.clone()
                } else {
                    Vec::new()
                },
                input_logprobs: if cumulative {
                    g.input_logprobs.clone()
                } else {
                    None
                },
                output_logprobs: if cumulative {
                    g.output_logprobs.clone()
                } else {
                    Vec::new()
                },
                prompt_tokens: g.prompt_tokens,
                rid: g.rid.clone(),
                started: g.started,
            };
            Some((tagged, if over { None } else { Some(g) }))
        })
        .boxed()
    });
    stream::select_all(per_gen)
}
