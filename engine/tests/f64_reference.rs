//! CPU numerics against a plain reference: the same dequantized weights, every product and
//! the KV cache in f64, no activation quantization, no f16 cache. Greedy tokens of our engine
//! and of llama.cpp (`data/reference/llama_cpp_greedy.json`) are both compared with it.
//!
//! `agrees_with_the_reference_on_short_runs` runs in the suite (3 prompts, 8 tokens). The full
//! comparison, 20 prompts of 32 tokens (about two minutes):
//! `cargo test --release -p sgl-engine --test f64_reference -- --ignored --nocapture`.

mod common;

use serde_json::Value;
use sgl_core::backend::cpu::CpuBackend;
use sgl_core::backend::{Backend, SeqInput};
use sgl_core::model::Model;
use sgl_core::model::config::ModelConfig;
use sgl_core::model::llama::{Part, TensorParallel};
use sgl_core::sampling::argmax;

/// A matrix `[rows, cols]`, row-major, dequantized to f32 (exact for the checkpoint's formats).
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}

impl Mat {
    /// `W x` with f64 sums, rows spread over the available cores.
    fn mul(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        let mut y = vec![0f64; self.rows];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = self.rows.div_ceil(threads).max(1);
        std::thread::scope(|s| {
            for (ys, ws) in y.chunks_mut(per).zip(self.w.chunks(per * self.cols)) {
                s.spawn(move || {
                    for (y, row) in ys.iter_mut().zip(ws.chunks_exact(self.cols)) {
                        *y = row.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum();
                    }
                });
            }
        });
        y
    }
}

/// One vector per position.
type Rows = Vec<Vec<f64>>;

struct Layer {
    attn_norm: Vec<f32>,
    q: Mat,
    k: Mat,
    v: Mat,
    o: Mat,
    biases: Option<[Vec<f32>; 3]>,
    ffn_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
}

struct Reference {
    cfg: ModelConfig,
    embed: Mat,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Option<Mat>,
    inv_freq: Vec<f64>,
}

fn mat(t: sgl_core::model::Tensor<'_>) -> Mat {
    let (rows, cols) = t.matrix_dims().expect("a matrix");
    Mat {
        rows,
        cols,
        w: t.to_f32().expect("dequantize"),
    }
}

impl Reference {
    fn new(model: &Model) -> Reference {
        let t = model.llama(TensorParallel::default());
        let cfg = t.config().clone();
        let vec = |x: sgl_core::model::Tensor<'_>| x.to_f32().expect("dequantize");
        let layers = (0..cfg.num_layers)
            .map(|i| Layer {
                attn_norm: vec(t.layer(i, Part::AttnNorm).expect("attn norm")),
                q: mat(t.layer(i, Part::Q).expect("q")),
                k: mat(t.layer(i, Part::K).expect("k")),
                v: mat(t.layer(i, Part::V).expect("v")),
                o: mat(t.layer(i, Part::O).expect("o")),
                biases: t.has(i, Part::QBias).then(|| {
                    [Part::QBias, Part::KBias, Part::VBias]
                        .map(|p| vec(t.layer(i, p).expect("bias")))
                }),
                ffn_norm: vec(t.layer(i, Part::FfnNorm).expect("ffn norm")),
                gate: mat(t.layer(i, Part::Gate).expect("gate")),
                up: mat(t.layer(i, Part::Up).expect("up")),
                down: mat(t.layer(i, Part::Down).expect("down")),
            })
            .collect();
        Reference {
            embed: mat(t.embed().expect("embedding")),
            norm: vec(t.final_norm().expect("norm")),
            lm_head: t.has_lm_head().then(|| mat(t.lm_head().expect("lm head"))),
            inv_freq: cfg.rope_inv_freq().iter().map(|&f| f as f64).collect(),
            layers,
            cfg,
        }
    }

    fn rms_norm(&self, x: &[f64], w: &[f32]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + self.cfg.rms_norm_eps as f64).sqrt();
        x.iter().zip(w).map(|(v, &g)| v * inv * g as f64).collect()
    }

    fn rope(&self, head: &mut [f64], pos: usize) {
        let half = head.len() / 2;
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            let (a, b) = if self.cfg.rope_interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x, y) = (head[a], head[b]);
            head[a] = x * c - y * s;
            head[b] = x * s + y * c;
        }
    }

    /// Greedy-decodes `steps` tokens after `prompt`; also the margin between the top two
    /// logits at each step.
    fn greedy(&self, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f64>) {
        let c = &self.cfg;
        let (hd, group) = (c.head_dim, c.num_heads / c.num_kv_heads);
        // Per layer: keys and values of every position so far, `[pos][kv_dim]`.
        let mut cache: Vec<(Rows, Rows)> = vec![(Vec::new(), Vec::new()); c.num_layers];
        let mut out = Vec::new();
        let mut margins = Vec::new();
        let mut next = prompt.to_vec();
        let mut pos = 0;
        while out.len() < steps {
            let mut logits = Vec::new();
            for &tok in &next {
                let e = &self.embed.w[tok as usize * self.embed.cols..][..self.embed.cols];
                let mut x: Vec<f64> = e.iter().map(|&v| v as f64).collect();
                for (l, layer) in self.layers.iter().enumerate() {
                    let h = self.rms_norm(&x, &layer.attn_norm);
                    let (mut q, mut k, mut v) = (layer.q.mul(&h), layer.k.mul(&h), layer.v.mul(&h));
                    if let Some([qb, kb, vb]) = &layer.biases {
                        for (y, b) in [(&mut q, qb), (&mut k, kb), (&mut v, vb)] {
                            y.iter_mut()
                                .zip(b.iter())
                                .for_each(|(y, &b)| *y += b as f64);
                        }
                    }
                    q.chunks_exact_mut(hd).for_each(|h| self.rope(h, pos));
                    k.chunks_exact_mut(hd).for_each(|h| self.rope(h, pos));
                    let (keys, values) = &mut cache[l];
                    keys.push(k);
                    values.push(v);
                    let mut att = vec![0f64; q.len()];
                    for (head, qh) in q.chunks_exact(hd).enumerate() {
                        let kv = head / group * hd;
                        let scores: Vec<f64> = keys
                            .iter()
                            .map(|k| {
                                qh.iter()
                                    .zip(&k[kv..kv + hd])
                                    .map(|(a, b)| a * b)
                                    .sum::<f64>()
                                    / (hd as f64).sqrt()
                            })
                            .collect();
                        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                        let total: f64 = p.iter().sum();
                        let o = &mut att[head * hd..(head + 1) * hd];
                        for (p, v) in p.iter().zip(values.iter()) {
                            for (o, v) in o.iter_mut().zip(&v[kv..kv + hd]) {
                                *o += p / total * v;
                            }
                        }
                    }
                    x.iter_mut()
                        .zip(layer.o.mul(&att))
                        .for_each(|(x, y)| *x += y);
                    let h = self.rms_norm(&x, &layer.ffn_norm);
                    let (g, u) = (layer.gate.mul(&h), layer.up.mul(&h));
                    let a: Vec<f64> = g
                        .iter()
                        .zip(&u)
                        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                        .collect();
                    x.iter_mut()
                        .zip(layer.down.mul(&a))
                        .for_each(|(x, y)| *x += y);
                }
                pos += 1;
                let h = self.rms_norm(&x, &self.norm);
                logits = self.lm_head.as_ref().unwrap_or(&self.embed).mul(&h);
            }
            let best = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                .expect("logits");
            let second = (0..logits.len())
                .filter(|&i| i != best)
                .map(|i| logits[i])
                .fold(f64::NEG_INFINITY, f64::max);
            margins.push(logits[best] - second);
            out.push(best as u32);
            next = vec![best as u32];
        }
        assert_eq!(self.embed.rows, c.vocab_size);
        (out, margins)
    }
}

/// Our greedy tokens, one sequence at a time.
fn ours(backend: &mut CpuBackend, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut slots: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut tokens = prompt.to_vec();
    let mut start = 0;
    let mut out = Vec::new();
    while out.len() < steps {
        let logits = backend
            .forward(&[SeqInput {
                tokens: &tokens,
                start_pos: start,
                kv_slots: &slots,
                num_logits: 1,
                prompt: true,
            }])
            .expect("forward");
        let t = argmax(&logits);
        out.push(t);
        start = slots.len();
        slots.push(start as u32);
        tokens = vec![t];
    }
    out
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Per prompt: tokens ours shares with the reference, tokens llama.cpp shares with it, and the
/// reference's top-2 margin where ours leaves it (infinite when it does not).
fn compare(prompts: usize, steps: usize) -> Vec<(usize, usize, f64)> {
    let data: Value = serde_json::from_str(include_str!("data/reference/llama_cpp_greedy.json"))
        .expect("reference json");
    let model = sgl_core::model::load(&common::model_path()).expect("load model");
    let reference = Reference::new(&model);
    let mut backend = CpuBackend::with_capacity(&model, 4096, 4096).expect("backend");
    let cases = data["cases"].as_array().expect("cases");
    cases
        .iter()
        .take(prompts)
        .map(|case| {
            let prompt = ids(&case["input_ids"]);
            let theirs = ids(&case["output_ids"]);
            let (want, margins) = reference.greedy(&prompt, steps);
            let got = ours(&mut backend, &prompt, steps);
            let (a, b) = (
                common_prefix(&got, &want),
                common_prefix(&theirs[..steps], &want),
            );
            let at = |n: usize| {
                margins
                    .get(n)
                    .map_or(String::new(), |m| format!(" (margin {m:.3})"))
            };
            println!(
                "{:>2}{} / {:>2}{} tokens match the reference (ours / llama.cpp): {:?}",
                a,
                at(a),
                b,
                at(b),
                case["prompt"].as_str().unwrap_or_default()
            );
            (a, b, margins.get(a).copied().unwrap_or(f64::INFINITY))
        })
        .collect()
}

/// Where the reference's top two logits are closer than this, the f16 KV cache and 8-bit
/// activations of both engines may pick either (the same bound as the llama.cpp test).
const NEAR_TIE: f64 = 0.5;

#[test]
fn agrees_with_the_reference_on_short_runs() {
    for (i, (ours, _, margin)) in compare(3, 8).iter().enumerate() {
        assert!(
            *ours == 8 || *margin < NEAR_TIE,
            "prompt {i}: ours leaves the f64 reference at token {ours}, where its margin is {margin}"
        );
    }
}

#[test]
#[ignore = "about two minutes: the 20 reference prompts, 32 tokens each"]
fn agrees_with_the_reference_at_least_as_often_as_llama_cpp() {
    let rows = compare(20, 32);
    let full =
        |pick: fn(&(usize, usize, f64)) -> usize| rows.iter().filter(|r| pick(r) == 32).count();
    let mean = |pick: fn(&(usize, usize, f64)) -> usize| {
        rows.iter().map(pick).sum::<usize>() as f64 / rows.len() as f64
    };
    let (ours_full, theirs_full) = (full(|r| r.0), full(|r| r.1));
    println!(
        "all 32 tokens equal to the f64 reference: ours {ours_full} of 20, llama.cpp {theirs_full} \
         of 20; mean tokens before the first difference: ours {:.1}, llama.cpp {:.1}",
        mean(|r| r.0),
        mean(|r| r.1)
    );
    assert!(
        ours_full >= theirs_full,
        "ours agree fully on {ours_full} prompts, llama.cpp on {theirs_full}"
    );
}
