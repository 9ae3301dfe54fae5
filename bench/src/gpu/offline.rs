//! `bench-offline-throughput --backend-loop --model DIR --num-prompts N --max-input I
//! --max-output O`: the benchmark's own continuous-batching loop straight on the backend (no
//! scheduler, no radix cache, sampling on the GPU): the engine's upper bound without
//! host-side overheads. Through the engine it is `crate::offline`.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;
use sgl_core::backend::cuda::CudaBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_core::error::{EngineError, Result};

use super::{arg_usize, open, random_tokens};

/// Runs `bench-offline-throughput --backend-loop` (see the module docs).
pub fn run(args: &[String]) -> Result<()> {
    let mut b = open(args)?;
    let r = offline(
        &mut b,
        arg_usize(args, "--num-prompts", 1000)?,
        arg_usize(args, "--max-input", 1024)?,
        arg_usize(args, "--max-output", 1024)?,
        arg_usize(args, "--seed", 1)? as u64,
        arg_usize(args, "--max-running", 256)?,
    )?;
    println!("{}", serde_json::to_string(&r).unwrap_or_default());
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct OfflineReport {
    pub device: String,
    pub num_prompts: usize,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub seconds: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
}

struct Req {
    prompt: Vec<u32>,
    out_len: usize,
    slots: Vec<u32>,
    generated: Vec<u32>,
    prefilled: usize,
}

/// Continuous batching without a radix cache: up to `max_running` requests; each step runs
/// either one prefill chunk batch (new requests, up to 8192 tokens) or one decode batch.
fn offline(
    b: &mut CudaBackend,
    n: usize,
    max_in: usize,
    max_out: usize,
    seed: u64,
    max_running: usize,
) -> Result<OfflineReport> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let v = b.vocab_size();
    let mut waiting: std::collections::VecDeque<Req> = (0..n)
        .map(|_| {
            let il = rng.random_range(1..=max_in);
            let ol = rng.random_range(1..=max_out);
            Req {
                prompt: random_tokens(&mut rng, il, v),
                out_len: ol,
                slots: Vec::new(),
                generated: Vec::new(),
                prefilled: 0,
            }
        })
        .collect();
    let input_tokens: usize = waiting.iter().map(|r| r.prompt.len()).sum();
    let mut free: Vec<u32> = (0..b.kv_capacity() as u32).rev().collect();
    let mut running: Vec<Req> = Vec::new();
    let mut output_tokens = 0;
    let t0 = Instant::now();
    while !waiting.is_empty() || !running.is_empty() {
        // admit
        let mut budget = 8192usize;
        let mut admitted = Vec::new();
        while let Some(r) = waiting.front() {
            let need = r.prompt.len() + r.out_len;
            if running.len() + admitted.len() >= max_running
                || need > free.len()
                || r.prompt.len() > budget
            {
                break;
            }
            let Some(mut r) = waiting.pop_front() else {
                break;
            };
            r.slots = free.split_off(free.len() - need);
            budget -= r.prompt.len();
            admitted.push(r);
        }
        if !admitted.is_empty() {
            let batch: Vec<SeqInput> = admitted
                .iter()
                .map(|r| SeqInput {
                    tokens: &r.prompt,
                    start_pos: 0,
                    kv_slots: &r.slots[..r.prompt.len()],
                    num_logits: 1,
                    prompt: true,
                })
                .collect();
            let toks = b.forward_sample_all(&batch, 0.0)?;
            for (mut r, t) in admitted.into_iter().zip(toks) {
                r.prefilled = r.prompt.len();
                r.generated.push(t);
                output_tokens += 1;
                running.push(r);
            }
        } else if !running.is_empty() {
            let toks: Vec<[u32; 1]> = running
                .iter()
                .map(|r| [*r.generated.last().unwrap_or(&0)])
                .collect();
            let batch: Vec<SeqInput> = running
                .iter()
                .zip(&toks)
                .map(|(r, t)| {
                    let pos = r.prefilled + r.generated.len() - 1;
                    SeqInput {
                        tokens: t,
                        start_pos: pos,
                        kv_slots: &r.slots[..pos + 1],
                        num_logits: 1,
                        prompt: false,
                    }
                })
                .collect();
            let out = b.forward_sample_all(&batch, 0.0)?;
            for (r, t) in running.iter_mut().zip(out) {
                r.generated.push(t);
                output_tokens += 1;
            }
        } else {
            return Err(EngineError::Internal(
                "a request does not fit in the KV pool".into(),
            ));
        }
        // retire finished requests
        let mut i = 0;
        while i < running.len() {
            if running[i].generated.len() >= running[i].out_len {
                let r = running.swap_remove(i);
                free.extend(r.slots);
            } else {
                i += 1;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let r = OfflineReport {
        device: b.device_name().to_string(),
        num_prompts: n,
        input_tokens,
        output_tokens,
        seconds: secs,
        output_tok_s: output_tokens as f64 / secs,
        total_tok_s: (input_tokens + output_tokens) as f64 / secs,
    };
    println!("| device | prompts | input tok | output tok | s | output tok/s | total tok/s |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} |",
        r.device,
        r.num_prompts,
        r.input_tokens,
        r.output_tokens,
        r.seconds,
        r.output_tok_s,
        r.total_tok_s
    );
    Ok(r)
}
