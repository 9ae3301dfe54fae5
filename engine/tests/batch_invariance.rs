//! Greedy output does not depend on the batch: one sequence's logits are the same, bit for bit,
//! whether it runs alone or among others, with its prompt computed at once or in chunks, and
//! on any number of kernel threads.

mod common;

use sgl_core::backend::cpu::CpuBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_core::sampling::argmax;
use sgl_kernels::cpu::set_num_threads;

/// Slots per sequence: sequence `i` owns slots `i * REGION..`.
const REGION: usize = 1024;
/// The sequence under test: a prompt long enough that its context spans several attention
/// chunks, then `STEPS` decodes.
const PROMPT: usize = 700;
const STEPS: usize = 5;

fn tokens(seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (1000 + (seed * 7919 + j * 104_729) % 30_000) as u32)
        .collect()
}

fn slots(seq: usize, len: usize) -> Vec<u32> {
    (0..len).map(|j| (seq * REGION + j) as u32).collect()
}

/// How the sequence under test is run.
struct Plan {
    threads: usize,
    /// Prompt chunk sizes (computed in turn); the last chunk asks for the logits.
    chunks: Vec<usize>,
    /// Other sequences decoding beside it at every step (prefilled first, one by one).
    companions: usize,
    split_decode: bool,
}

/// The logits of the sequence under test after its prompt and after each decode step, which
/// feeds `feed[k]` as the token of step `k`.
fn run(backend: &mut CpuBackend, plan: &Plan, prompt: &[u32], feed: &[u32]) -> Vec<Vec<f32>> {
    set_num_threads(plan.threads);
    backend.set_split_decode(plan.split_decode);
    let vocab = backend.config().vocab_size;
    // Companions: sequences 1..=companions, prompts of 20 to 400 tokens.
    let others: Vec<Vec<u32>> = (1..=plan.companions)
        .map(|i| tokens(i, 20 + (i * 53) % 380))
        .collect();
    let mut other_slots: Vec<Vec<u32>> = others
        .iter()
        .enumerate()
        .map(|(k, p)| slots(k + 1, p.len()))
        .collect();
    let mut other_last: Vec<u32> = Vec::new();
    for (p, s) in others.iter().zip(&other_slots) {
        let l = backend
            .forward(&[SeqInput {
                tokens: p,
                start_pos: 0,
                kv_slots: s,
                num_logits: 1,
                prompt: true,
            }])
            .expect("companion prefill");
        other_last.push(argmax(&l));
    }

    let mut out = Vec::new();
    let mut mine = slots(0, prompt.len());
    let mut at = 0;
    for (c, &len) in plan.chunks.iter().enumerate() {
        let last = c + 1 == plan.chunks.len();
        // Each chunk runs beside a decode step of the first companion, when there is one.
        let step_tok = other_last.first().map(|&t| [t]);
        if let Some(s) = other_slots.first_mut() {
            let pos = s.len();
            s.push((REGION + pos) as u32);
        }
        let mut batch = vec![SeqInput {
            tokens: &prompt[at..at + len],
            start_pos: at,
            kv_slots: &mine[..at + len],
            num_logits: usize::from(last),
            prompt: true,
        }];
        if let (Some(t), Some(s)) = (&step_tok, other_slots.first()) {
            batch.push(SeqInput {
                tokens: t,
                start_pos: s.len() - 1,
                kv_slots: s,
                num_logits: 1,
                prompt: false,
            });
        }
        let l = backend.forward(&batch).expect("prefill chunk");
        if last {
            out.push(l[..vocab].to_vec());
        }
        if step_tok.is_some() {
            let skip = usize::from(last) * vocab;
            other_last[0] = argmax(&l[skip..skip + vocab]);
        }
        at += len;
    }
    assert_eq!(at, prompt.len(), "chunks cover the prompt");

    for &tok in feed {
        let pos = mine.len();
        mine.push(pos as u32);
        for (k, s) in other_slots.iter_mut().enumerate() {
            let p = s.len();
            s.push(((k + 1) * REGION + p) as u32);
        }
        let toks: Vec<[u32; 1]> = std::iter::once(tok)
            .chain(other_last.iter().copied())
            .map(|t| [t])
            .collect();
        let mut batch = vec![SeqInput {
            tokens: &toks[0],
            start_pos: pos,
            kv_slots: &mine,
            num_logits: 1,
            prompt: false,
        }];
        for (k, s) in other_slots.iter().enumerate() {
            batch.push(SeqInput {
                tokens: &toks[k + 1],
                start_pos: s.len() - 1,
                kv_slots: s,
                num_logits: 1,
                prompt: false,
            });
        }
        let l = backend.forward(&batch).expect("decode");
        out.push(l[..vocab].to_vec());
        for (k, t) in other_last.iter_mut().enumerate() {
            *t = argmax(&l[(k + 1) * vocab..(k + 2) * vocab]);
        }
    }
    out
}

#[test]
fn logits_do_not_depend_on_the_batch_chunks_or_threads() {
    let model = sgl_core::model::load(&common::model_path()).expect("load model");
    let mut backend = CpuBackend::with_capacity(&model, 17 * REGION, 2048).expect("backend");
    let prompt = tokens(0, PROMPT);

    // The reference: alone, one thread, the prompt at once, greedy.
    let alone = Plan {
        threads: 1,
        chunks: vec![PROMPT],
        companions: 0,
        split_decode: false,
    };
    let mut feed = Vec::new();
    let mut reference = run(&mut backend, &alone, &prompt, &[]);
    for _ in 0..STEPS {
        feed.push(argmax(reference.last().expect("logits")));
        reference = run(&mut backend, &alone, &prompt, &feed);
    }
    assert_eq!(reference.len(), STEPS + 1);

    let plans = [
        // Alone on several threads (batch-1 decode splits the context over them).
        Plan {
            threads: 2,
            chunks: vec![PROMPT],
            companions: 0,
            split_decode: true,
        },
        Plan {
            threads: 4,
            chunks: vec![PROMPT],
            companions: 0,
            split_decode: true,
        },
        // Chunked prompt beside another sequence's decode, then a batch of 16 decodes, run
        // whole and split over the threads.
        Plan {
            threads: 2,
            chunks: vec![256, 100, 300, 44],
            companions: 15,
            split_decode: false,
        },
        Plan {
            threads: 2,
            chunks: vec![1, 511, 188],
            companions: 15,
            split_decode: true,
        },
        Plan {
            threads: 3,
            chunks: vec![350, 350],
            companions: 3,
            split_decode: true,
        },
    ];
    for (p, plan) in plans.iter().enumerate() {
        let got = run(&mut backend, plan, &prompt, &feed);
        for (step, (a, b)) in got.iter().zip(&reference).enumerate() {
            let differ = a
                .iter()
                .zip(b)
                .filter(|(x, y)| x.to_bits() != y.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "plan {p} ({} threads, chunks {:?}, {} companions): {differ} logits differ from \
                 the sequence alone at step {step}",
                plan.threads, plan.chunks, plan.companions
            );
        }
    }
}
