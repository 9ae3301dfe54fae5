//! Greedy decoding of the default model matches llama.cpp on the same GGUF.
//!
//! Reference ids come from `scripts/reference/llama_cpp_greedy.py` (llama-cpp-python), stored in
//! `tests/data/reference/llama_cpp_greedy.json` with each step's top-2 logit margin.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use sgl_engine::backend::cpu::CpuBackend;
use sgl_engine::backend::{Backend, SeqInput};
use sgl_engine::sampling::argmax;
use sgl_engine::tokenizer::Tokenizer;

fn model_path() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/fetch-model.sh"))
        .output()
        .expect("run scripts/fetch-model.sh");
    assert!(
        out.status.success(),
        "fetch-model.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

/// llama.cpp keeps the KV cache and parts of attention in f16 and sums in another order, so
/// the two engines' logits differ (measured: standard deviation about 0.13 over the vocabulary
/// on these prompts, up to about 0.9 on single tokens). Where llama.cpp's top two logits are
/// closer than four standard deviations of that difference, either choice is a faithful
/// greedy step.
const NEAR_TIE: f64 = 0.5;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Greedy-decode `steps` tokens, one sequence, slots 0.. in order.
fn greedy(backend: &mut CpuBackend, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut slots: Vec<u32> = (0..prompt.len() as u32).collect();
    let logits = backend
        .forward(&[SeqInput {
            tokens: prompt,
            start_pos: 0,
            kv_slots: &slots,
            num_logits: 1,
        }])
        .expect("prefill");
    let mut out = vec![argmax(&logits)];
    while out.len() < steps {
        let pos = prompt.len() + out.len() - 1;
        slots.push(pos as u32);
        let last = [*out.last().expect("one token")];
        let logits = backend
            .forward(&[SeqInput {
                tokens: &last,
                start_pos: pos,
                kv_slots: &slots,
                num_logits: 1,
            }])
            .expect("decode");
        out.push(argmax(&logits));
    }
    out
}

#[test]
fn greedy_tokens_match_llama_cpp() {
    let path = model_path();
    let data: Value = serde_json::from_str(include_str!("data/reference/llama_cpp_greedy.json"))
        .expect("reference json");
    let loaded = sgl_engine::model::load(&path).expect("load model");
    let tokenizer =
        Tokenizer::from_gguf(loaded.gguf.as_ref().expect("gguf header")).expect("tokenizer");
    let cfg = loaded.config.clone();
    let mut backend = CpuBackend::new(cfg, loaded.weights, 4096, 4096).expect("backend");

    let mut full_matches = 0;
    let cases = data["cases"].as_array().expect("cases");
    for case in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let want_in = ids(&case["input_ids"]);
        let got_in = tokenizer.encode(prompt, false).expect("encode");
        assert_eq!(
            got_in, want_in,
            "tokenization of {prompt:?} differs from llama.cpp"
        );

        let want = ids(&case["output_ids"]);
        let margins: Vec<f64> = case["top2_margin"]
            .as_array()
            .expect("margins")
            .iter()
            .map(|m| m.as_f64().expect("f64"))
            .collect();
        let got = greedy(&mut backend, &want_in, want.len());
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => full_matches += 1,
            Some(i) => {
                // A divergence is only acceptable where llama.cpp itself had a near-tie.
                assert!(
                    margins[i] < NEAR_TIE,
                    "prompt {prompt:?}: token {i} is {} but llama.cpp chose {} with a clear margin {}\nours:  {got:?}\ntheirs: {want:?}",
                    got[i],
                    want[i],
                    margins[i]
                );
                eprintln!(
                    "prompt {prompt:?}: diverged at step {i} on a near-tie (margin {})",
                    margins[i]
                );
            }
        }
    }
    assert!(
        full_matches >= 5,
        "only {full_matches} of {} prompts matched all 32 tokens",
        cases.len()
    );
}
