//! `check-reference --model DIR --prompts FILE --out DIR`: runs the prompts of FILE greedily
//! (the transformers comparison script, `scripts/gpu/hf_ref.py`, writes FILE; `compare.py`
//! reads what this writes).

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sgl_core::backend::cuda::CudaBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_core::error::{EngineError, Result};

use super::{Slots, arg, open};

/// Runs `check-reference` (see the module docs).
pub fn run(args: &[String]) -> Result<()> {
    let mut b = open(args)?;
    let prompts = arg(args, "--prompts")
        .ok_or_else(|| EngineError::InvalidArgument("--prompts FILE is required".into()))?;
    let out = arg(args, "--out")
        .ok_or_else(|| EngineError::InvalidArgument("--out DIR is required".into()))?;
    check(&mut b, Path::new(prompts), Path::new(out))
}

#[derive(Deserialize)]
struct CheckCase {
    name: String,
    prompts: Vec<Vec<u32>>,
    /// Tokens every prompt of the case shares; run once, then reused as a cached prefix.
    #[serde(default)]
    shared_prefix: usize,
}

#[derive(Deserialize)]
struct CheckFile {
    steps: usize,
    cases: Vec<CheckCase>,
}

#[derive(Serialize)]
struct CheckOut {
    name: String,
    tokens: Vec<Vec<u32>>,
    /// Per sequence and step, the gap between the two largest logits (how near a tie the
    /// greedy choice was).
    margins: Vec<Vec<f32>>,
}

/// The gap between the largest and the second largest value.
fn top2_margin(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy generation through `Backend::forward` (host logits), for the transformers check.
/// Writes `<out>/ours.json` (tokens) and `<out>/ours_<case>.f32` (prefill logits, row-major).
fn check(b: &mut CudaBackend, prompts: &Path, out: &Path) -> Result<()> {
    let text = std::fs::read_to_string(prompts)
        .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", prompts.display())))?;
    let f: CheckFile = serde_json::from_str(&text)
        .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", prompts.display())))?;
    std::fs::create_dir_all(out).map_err(|e| EngineError::Internal(e.to_string()))?;
    let v = b.vocab_size();
    let mut results = Vec::new();
    for case in &f.cases {
        let mut slots = Slots {
            next: 0,
            cap: b.kv_capacity() as u32,
        };
        let p = case.shared_prefix;
        let prefix_slots = slots.take(p)?;
        if p > 0 {
            let pre = SeqInput {
                tokens: &case.prompts[0][..p],
                start_pos: 0,
                kv_slots: &prefix_slots,
                num_logits: 0,
                prompt: true,
            };
            b.forward(&[pre])?;
        }
        let mut seq_slots = Vec::new();
        for pr in &case.prompts {
            let mut s = prefix_slots.clone();
            s.extend(slots.take(pr.len() - p + f.steps)?);
            seq_slots.push(s);
        }
        let t0 = Instant::now();
        let batch: Vec<SeqInput> = case
            .prompts
            .iter()
            .zip(&seq_slots)
            .map(|(pr, s)| SeqInput {
                tokens: &pr[p..],
                start_pos: p,
                kv_slots: &s[..pr.len()],
                num_logits: 1,
                prompt: true,
            })
            .collect();
        let logits = b.forward(&batch)?;
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(out.join(format!("ours_{}.f32", case.name)), bytes)
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let mut generated: Vec<Vec<u32>> = logits.chunks(v).map(|r| vec![argmax(r)]).collect();
        let mut margins: Vec<Vec<f32>> = logits.chunks(v).map(|r| vec![top2_margin(r)]).collect();
        for step in 1..f.steps {
            let toks: Vec<[u32; 1]> = generated.iter().map(|g| [g[step - 1]]).collect();
            let batch: Vec<SeqInput> = case
                .prompts
                .iter()
                .zip(&seq_slots)
                .zip(&toks)
                .map(|((pr, s), t)| {
                    let pos = pr.len() + step - 1;
                    SeqInput {
                        tokens: t,
                        start_pos: pos,
                        kv_slots: &s[..pos + 1],
                        num_logits: 1,
                        prompt: false,
                    }
                })
                .collect();
            let logits = b.forward(&batch)?;
            for ((g, m), r) in generated
                .iter_mut()
                .zip(margins.iter_mut())
                .zip(logits.chunks(v))
            {
                g.push(argmax(r));
                m.push(top2_margin(r));
            }
        }
        eprintln!(
            "check {}: {} prompts, {:.2}s",
            case.name,
            case.prompts.len(),
            t0.elapsed().as_secs_f64()
        );
        results.push(CheckOut {
            name: case.name.clone(),
            tokens: generated,
            margins,
        });
    }
    let j = serde_json::to_string(&results).map_err(|e| EngineError::Internal(e.to_string()))?;
    std::fs::write(out.join("ours.json"), j).map_err(|e| EngineError::Internal(e.to_string()))?;
    Ok(())
}
