//! The overlap schedule and the radix cache together: a greedy prompt run cold, then again
//! with all but its last token served from the cache, gives the same tokens, and the same as
//! with the overlap schedule off. The cached run recomputes the prompt's last token (its
//! logits are needed) while the cache holds that token's KV too; its first decode is launched
//! before that pass is processed, and must read the prompt's KV as every later decode does.

#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use serde_json::{Value, json};

const PROMPT: usize = 200;
const NEW_TOKENS: usize = 24;

fn body(prompt: &[u32]) -> Value {
    json!({
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": true},
    })
}

/// Output ids and cached prompt tokens of one request.
async fn generate(s: &Server, prompt: &[u32]) -> (Vec<u64>, u64) {
    let (status, r) = s.post("/generate", &body(prompt)).await;
    assert_eq!(status, 200, "{r}\n{}", s.log_tail());
    let ids = r["output_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    (ids, r["meta_info"]["cached_tokens"].as_u64().unwrap())
}

#[tokio::test]
async fn a_cached_prompt_continues_as_it_did_cold_with_the_overlap_schedule() {
    let prompt: Vec<u32> = (0..PROMPT)
        .map(|j| (1000 + (j * 104_729) % 30_000) as u32)
        .collect();
    let overlap = Server::start(
        "overlap-cache-on",
        &["--enable-overlap-schedule", "--skip-tokenizer-init"],
    );
    let (cold, cached_cold) = generate(&overlap, &prompt).await;
    let (cached, cached_tokens) = generate(&overlap, &prompt).await;
    assert_eq!(cold.len(), NEW_TOKENS);
    assert_eq!(cached_cold, 0);
    assert_eq!(
        cached_tokens,
        PROMPT as u64 - 1,
        "the second run must hit the cache"
    );
    assert_eq!(cold, cached, "overlap on: cold and cached runs differ");
    drop(overlap);

    let sync = Server::start("overlap-cache-off", &["--skip-tokenizer-init"]);
    let (reference, _) = generate(&sync, &prompt).await;
    assert_eq!(cold, reference, "overlap on and off differ");
}
