//! Benchmark of the structured-output grammar backends with the default model's tokenizer
//! (SmolLM2-135M-Instruct, 49152 tokens).
//!
//! Prints, per backend (llguidance, outlines): the time to build the backend (token trie /
//! vocabulary), the cold compile time of a few JSON schemas, regexes and EBNF grammars, the
//! time of a cached compile, and the per-step cost of `fill_mask`, `accept` and both together
//! (mean / p50 / p99 / max) on the workload "JSON-schema walk": a matcher of a nested schema
//! (objects, arrays, enums, required fields, a pattern) walked to EOS many times, each step
//! taking the allowed token with the best fixed pseudo-random score (a simulated model that
//! avoids whitespace-only tokens and, after a few steps, prefers closing tokens and EOS).
//!
//! Usage: `sgl-bench grammar [path/to/model.gguf | tokenizer.json]` (default: the file
//! `scripts/fetch-model.sh` fetches). `SGL_BENCH_WALKS` sets the number of walks (default 20).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use sgl_core::grammar::{GrammarBackend, GrammarSpec, build_backend};
use sgl_core::tokenizer::Tokenizer;

const DEFAULT_MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../.cache/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
);

const SIMPLE_SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}"#;

const NESTED_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    "address": {
      "type": "object",
      "properties": {
        "city": {"type": "string", "maxLength": 30},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}
      },
      "required": ["city", "zip"],
      "additionalProperties": false
    },
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "role", "address"],
  "additionalProperties": false
}"#;

const TOOL_SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"enum": ["get_weather", "search", "calculator"]},
    "arguments": {
      "anyOf": [
        {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]},
        {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}}, "required": ["query"]},
        {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
      ]
    }
  },
  "required": ["name", "arguments"]
}"#;

const LIST_EBNF: &str = r#"root ::= "[" ws item (ws "," ws item)* ws "]"
item ::= [0-9]+ | "\"" [a-z ]* "\""
ws ::= [ ]?"#;

fn specs() -> Vec<(&'static str, GrammarSpec)> {
    vec![
        (
            "json_schema simple",
            GrammarSpec::JsonSchema(SIMPLE_SCHEMA.into()),
        ),
        (
            "json_schema nested",
            GrammarSpec::JsonSchema(NESTED_SCHEMA.into()),
        ),
        (
            "json_schema tool anyOf",
            GrammarSpec::JsonSchema(TOOL_SCHEMA.into()),
        ),
        ("json_object", GrammarSpec::JsonObject),
        (
            "regex email",
            GrammarSpec::Regex(r"[a-z]{3,8}@[a-z]{2,5}\.(com|org|net)".into()),
        ),
        (
            "regex date",
            GrammarSpec::Regex(r"\d{4}-\d{2}-\d{2}".into()),
        ),
        (
            "ebnf yes/no",
            GrammarSpec::Ebnf(r#"root ::= "yes" | "no""#.into()),
        ),
        ("ebnf list", GrammarSpec::Ebnf(LIST_EBNF.into())),
    ]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// splitmix64 score of (seed, step, token) in [0, 1).
fn score(seed: u64, step: usize, token: u32) -> f64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((step as u64) << 32 | token as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// Per token: whitespace only / contains a closing character.
struct TokenClasses {
    blank: Vec<bool>,
    closer: Vec<bool>,
    eos: Vec<u32>,
}

impl TokenClasses {
    fn new(tok: &Tokenizer) -> Self {
        let n = tok.vocab_size();
        let mut blank = vec![false; n];
        let mut closer = vec![false; n];
        for id in 0..n as u32 {
            let text = tok.decode(&[id], false).unwrap_or_default();
            blank[id as usize] = !text.is_empty() && text.chars().all(char::is_whitespace);
            closer[id as usize] = text.contains(['"', '}', ']']);
        }
        TokenClasses {
            blank,
            closer,
            eos: tok.eos_token_ids().to_vec(),
        }
    }

    fn preference(&self, seed: u64, step: usize, id: u32) -> f64 {
        let s = score(seed, step, id);
        if self.eos.contains(&id) {
            return if step > 12 { s + 10.0 } else { s - 1.0 };
        }
        let i = id as usize;
        let mut s = s;
        if self.blank.get(i).copied().unwrap_or(false) {
            s -= 5.0;
        }
        if step > 12 && self.closer.get(i).copied().unwrap_or(false) {
            s += 2.0;
        }
        s
    }
}

#[derive(Default)]
struct Samples(Vec<f64>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d.as_secs_f64() * 1e6);
    }

    fn row(&mut self, label: &str) -> String {
        self.0.sort_by(f64::total_cmp);
        let n = self.0.len().max(1);
        let mean = self.0.iter().sum::<f64>() / n as f64;
        let pct = |p: f64| {
            self.0
                .get(((n as f64 * p) as usize).min(n - 1))
                .copied()
                .unwrap_or(0.0)
        };
        format!(
            "{label:<28} {mean:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            pct(0.5),
            pct(0.99),
            self.0.last().copied().unwrap_or(0.0)
        )
    }
}

struct WalkStats {
    fill: Samples,
    accept: Samples,
    both: Samples,
    steps: usize,
    first_mask_us: Vec<f64>,
}

fn walk_bench(
    backend: &dyn GrammarBackend,
    spec: &GrammarSpec,
    classes: &TokenClasses,
    walks: u64,
) -> anyhow::Result<WalkStats> {
    let grammar = backend.compile(spec)?;
    let mut stats = WalkStats {
        fill: Samples::default(),
        accept: Samples::default(),
        both: Samples::default(),
        steps: 0,
        first_mask_us: Vec::new(),
    };
    let mut mask = backend.new_mask();
    for seed in 0..walks {
        let mut m = grammar.matcher();
        let mut done = false;
        for step in 0..3000 {
            let t0 = Instant::now();
            m.fill_mask(&mut mask)?;
            let fill = t0.elapsed();
            if step == 0 {
                stats.first_mask_us.push(fill.as_secs_f64() * 1e6);
            }
            let best = mask
                .allowed_ids()
                .max_by(|&a, &b| {
                    classes
                        .preference(seed, step, a)
                        .total_cmp(&classes.preference(seed, step, b))
                })
                .context("empty mask")?;
            let t1 = Instant::now();
            m.accept(best)?;
            let accept = t1.elapsed();
            stats.fill.push(fill);
            stats.accept.push(accept);
            stats.both.push(fill + accept);
            stats.steps += 1;
            if classes.eos.contains(&best) {
                done = true;
                break;
            }
        }
        anyhow::ensure!(done, "walk {seed} did not reach EOS");
    }
    Ok(stats)
}

/// Runs the grammar benchmark on the tokenizer of `model` (default: the fetched model).
pub fn run(model: Option<String>) -> anyhow::Result<()> {
    let path = model.unwrap_or_else(|| DEFAULT_MODEL.to_string());
    let walks: u64 = std::env::var("SGL_BENCH_WALKS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let tok = Tokenizer::from_dir_or_file(Path::new(&path))
        .with_context(|| format!("loading the tokenizer from {path}"))?;
    let vocab = tok.vocab_size();
    println!("grammar backends, tokenizer {path} ({vocab} tokens)");
    let classes = TokenClasses::new(&tok);

    let names = ["llguidance", "outlines"];
    let mut backends: Vec<Arc<dyn GrammarBackend>> = Vec::new();
    println!();
    for name in names {
        let t = Instant::now();
        let b = build_backend(name, &tok, vocab)?;
        println!("build backend {name:<12} {:>9.1} ms", ms(t.elapsed()));
        backends.push(b);
    }

    println!();
    println!("compile, cold (ms); a cached compile of the same spec below");
    println!("{:<28} {:>14} {:>14}", "spec", names[0], names[1]);
    let mut notes = Vec::new();
    for (label, spec) in specs() {
        let mut cells = Vec::new();
        for (name, b) in names.iter().zip(&backends) {
            let t = Instant::now();
            let r = b.compile(&spec);
            let d = t.elapsed();
            cells.push(match r {
                Ok(_) => format!("{:>14.2}", ms(d)),
                Err(e) if e.is_user_error() => {
                    let mut msg = e.to_string();
                    if let Some((cut, _)) = msg.char_indices().nth(160) {
                        msg.truncate(cut);
                    }
                    notes.push(format!("  [{}] {name} {label}: {msg}", notes.len() + 1));
                    format!("{:>14}", format!("refused [{}]", notes.len()))
                }
                Err(e) => return Err(e.into()),
            });
        }
        println!("{label:<28} {}", cells.join(" "));
    }
    let mut cells = Vec::new();
    for b in &backends {
        let spec = GrammarSpec::JsonSchema(NESTED_SCHEMA.into());
        let t = Instant::now();
        let n = 1000;
        for _ in 0..n {
            b.compile(&spec)?;
        }
        cells.push(format!(
            "{:>11.2} µs",
            t.elapsed().as_secs_f64() * 1e6 / n as f64
        ));
    }
    println!("{:<28} {}", "cached (nested schema)", cells.join(" "));
    for note in &notes {
        println!("{note}");
    }

    // Applying a mask to a logits row (the sampler's side of every constrained step).
    {
        let b = &backends[0];
        let grammar = b.compile(&GrammarSpec::JsonSchema(NESTED_SCHEMA.into()))?;
        let mut m = grammar.matcher();
        let mut mask = b.new_mask();
        let mut cells = Vec::new();
        // At the start (only `{` and whitespace allowed) and inside a string (most allowed).
        for prefix in ["", "{\"name\":\"Al"] {
            for id in tok.encode(prefix, false)? {
                m.accept(id)?;
            }
            m.fill_mask(&mut mask)?;
            let mut logits = vec![0.5f32; vocab];
            let n = 2000;
            let t = Instant::now();
            for _ in 0..n {
                mask.apply_to(std::hint::black_box(&mut logits));
            }
            cells.push(format!(
                "{:.1} µs with {} allowed",
                t.elapsed().as_secs_f64() * 1e6 / n as f64,
                mask.count_allowed()
            ));
        }
        println!();
        println!(
            "TokenMask::apply_to on {vocab} logits: {}",
            cells.join(", ")
        );
    }

    for (label, spec) in [
        (
            "JSON-schema walk (nested schema)",
            GrammarSpec::JsonSchema(NESTED_SCHEMA.into()),
        ),
        (
            "JSON-schema walk (tool anyOf)",
            GrammarSpec::JsonSchema(TOOL_SCHEMA.into()),
        ),
    ] {
        println!();
        println!("workload: {label}, {walks} walks to EOS, simulated model; per-step cost in µs");
        println!(
            "{:<28} {:>9} {:>9} {:>9} {:>9}",
            "backend / op", "mean", "p50", "p99", "max"
        );
        for (name, b) in names.iter().zip(&backends) {
            let mut s = walk_bench(b.as_ref(), &spec, &classes, walks)?;
            println!("{}", s.fill.row(&format!("{name} fill_mask")));
            println!("{}", s.accept.row(&format!("{name} accept")));
            println!("{}", s.both.row(&format!("{name} fill_mask+accept")));
            let first = s.first_mask_us.iter().sum::<f64>() / s.first_mask_us.len().max(1) as f64;
            println!(
                "{:<28} {} steps, {:.1} steps/walk, first mask of a walk {:.1} µs mean",
                format!("{name} totals"),
                s.steps,
                s.steps as f64 / walks as f64,
                first
            );
        }
    }
    Ok(())
}
