//! The overlap schedule (`--enable-overlap-schedule` runs it on the CPU backend, whose passes
//! are synchronous, so the scheduling is exactly a GPU's): each step is launched before the
//! previous one's tokens are processed, and a request decodes with its last token taken from
//! the pass in flight. Outputs must equal the synchronous server's token for token, requests
//! that end early (stop strings, EOS, max_tokens) must end at the same token, and nothing may
//! leak when clients leave while their tokens are in flight.

use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use crate::common::{Server, sse_json};
use crate::lifecycle::assert_no_leak;
use crate::server;

fn overlap_server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| Server::start("overlap", &["--enable-overlap-schedule"]))
}

/// A mix of requests that end in every way: length (1, 2, 9, 24 tokens), stop strings, EOS,
/// seeded sampling, penalties and bias (logits edits), min_new_tokens.
fn workload() -> Vec<Value> {
    let mut v = Vec::new();
    for (i, max) in [1u64, 2, 9, 24].into_iter().enumerate() {
        v.push(json!({"text": format!("Count to ten, take {i}:"),
            "sampling_params": {"temperature": 0, "max_new_tokens": max, "ignore_eos": true}}));
    }
    v.push(json!({"text": "The capital of France is",
        "sampling_params": {"temperature": 0, "max_new_tokens": 32, "stop": ["."]}}));
    v.push(
        json!({"text": "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
        "sampling_params": {"temperature": 0, "max_new_tokens": 64}}),
    );
    v.push(json!({"text": "Once upon a time",
        "sampling_params": {"temperature": 0.8, "top_p": 0.9, "seed": 7, "max_new_tokens": 20}}));
    v.push(json!({"text": "List: apple, apple, apple,",
        "sampling_params": {"temperature": 0, "max_new_tokens": 12, "ignore_eos": true,
            "frequency_penalty": 1.5, "repetition_penalty": 1.3, "logit_bias": {"28": -5.0}}}));
    v.push(
        json!({"text": "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
        "sampling_params": {"temperature": 0, "max_new_tokens": 24, "min_new_tokens": 12}}),
    );
    v
}

async fn run_all(s: &Server, reqs: &[Value]) -> Vec<(String, Value, Value)> {
    let calls = reqs.iter().map(|r| s.post("/generate", r));
    futures::future::join_all(calls)
        .await
        .into_iter()
        .zip(reqs)
        .map(|((status, body), req)| {
            assert_eq!(status, 200, "{req}: {body}");
            (
                body["text"].as_str().unwrap().to_string(),
                body["meta_info"]["completion_tokens"].clone(),
                body["meta_info"]["finish_reason"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn overlap_schedule_matches_the_synchronous_server() {
    let reqs = workload();
    // One at a time on the synchronous server, all at once (batched) here: first those that
    // overlap (nothing but a token needed), then those with logits edits, which run
    // synchronously with the edits applied by the sampler.
    let mut want = Vec::new();
    for r in &reqs {
        want.extend(run_all(server(), std::slice::from_ref(r)).await);
    }
    let (plain, edited) = reqs.split_at(7);
    let mut got = run_all(overlap_server(), plain).await;
    got.extend(run_all(overlap_server(), edited).await);
    for ((g, w), r) in got.iter().zip(&want).zip(&reqs) {
        assert_eq!(g, w, "{r}");
    }
    // The workload ends in each way.
    let reasons: Vec<String> = got.iter().map(|g| g.2["type"].to_string()).collect();
    assert!(reasons.iter().any(|r| r.contains("length")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("stop")), "{reasons:?}");
    // Again with the prompts cached.
    let again = run_all(overlap_server(), plain).await;
    assert_eq!(again[..], got[..7]);
}

#[tokio::test]
async fn overlap_streams_and_parallel_samples_work() {
    let s = overlap_server();
    let body = json!({"model": "default", "prompt": "The sky is", "max_tokens": 10,
        "temperature": 0, "ignore_eos": true, "stream": true});
    let events = sse_json(&s.post_sse("/v1/completions", &body).await);
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    let (status, r) = server().post("/v1/completions", &plain).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(streamed, r["choices"][0]["text"].as_str().unwrap());
    // n = 3 (a prefill-only pass, then three samples over the cached prompt).
    let (status, r) = s
        .post(
            "/v1/completions",
            &json!({"model": "default", "prompt": "Name a color:", "max_tokens": 6,
                "temperature": 0.9, "seed": 3, "n": 3}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"].as_array().unwrap().len(), 3, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], json!(18), "{r}");
}

#[tokio::test]
async fn overlap_frees_requests_whose_client_left() {
    let s = overlap_server();
    let mut streams = Vec::new();
    for i in 0..4 {
        let req = json!({"model": "default", "prompt": format!("Story number {i}:"),
            "max_tokens": 7000, "ignore_eos": true, "stream": true});
        let resp = s
            .client()
            .post(s.url("/v1/completions"))
            .json(&req)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        streams.push(resp.bytes_stream());
    }
    for body in &mut streams {
        body.next().await.unwrap().unwrap();
    }
    drop(streams);
    assert_no_leak(s, Duration::from_secs(45)).await;
    let (status, body) = s
        .post(
            "/generate",
            &json!({"text": "Hi", "sampling_params": {"max_new_tokens": 3}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}
