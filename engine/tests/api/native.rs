//! SGLang's native routes: /generate, metrics, cache report, --skip-tokenizer-init.

use serde_json::{Value, json};

use crate::common::sse_json;
use crate::{assert_error, server, skip_tokenizer_server};

#[tokio::test]
async fn generate_native_single_batch_and_ids() {
    let s = server();
    let (status, r) = s
        .post("/generate", &json!({"text": "The sky is", "sampling_params": {"max_new_tokens": 5, "temperature": 0}}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["text"].is_string());
    let m = &r["meta_info"];
    for key in [
        "id",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
        "e2e_latency",
    ] {
        assert!(m.get(key).is_some(), "meta_info lacks {key}: {r}");
    }
    assert!(m["completion_tokens"].as_u64().unwrap() <= 5);
    let single_text = r["text"].as_str().unwrap().to_string();

    let (status, b) = s
        .post(
            "/generate",
            &json!({"text": ["The sky is", "Water is"], "sampling_params": [{"max_new_tokens": 5, "temperature": 0}, {"max_new_tokens": 3, "temperature": 0}], "rid": ["r-a", "r-b"]}),
        )
        .await;
    assert_eq!(status, 200, "{b}");
    let list = b.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["text"].as_str().unwrap(), single_text);
    assert_eq!(list[0]["meta_info"]["id"], json!("r-a"));
    assert!(list[1]["meta_info"]["completion_tokens"].as_u64().unwrap() <= 3);

    let (status, i) = s
        .post("/generate", &json!({"input_ids": [504, 3459, 314], "sampling_params": {"max_new_tokens": 4, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{i}");
    assert_eq!(i["output_ids"].as_array().unwrap().len(), 4, "{i}");
    assert_eq!(
        i["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 4})
    );
    assert_eq!(i["meta_info"]["prompt_tokens"], json!(3));

    let (status, ib) = s
        .post("/generate", &json!({"input_ids": [[504, 3459], [314]], "sampling_params": {"max_new_tokens": 2, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{ib}");
    assert_eq!(ib.as_array().unwrap().len(), 2);

    // Streaming: cumulative text, the last chunk carries finish_reason.
    let chunks = sse_json(
        &s.post_sse(
            "/generate",
            &json!({"text": "The sky is", "stream": true, "sampling_params": {"max_new_tokens": 5, "temperature": 0}}),
        )
        .await,
    );
    assert!(chunks.len() >= 2, "{chunks:?}");
    let mut prev = String::new();
    for c in &chunks {
        let t = c["text"].as_str().unwrap();
        assert!(
            t.starts_with(&prev),
            "text must be cumulative: {prev:?} then {t:?}"
        );
        prev = t.to_string();
    }
    assert_eq!(prev, single_text);
    assert!(!chunks.last().unwrap()["meta_info"]["finish_reason"].is_null());
    assert!(chunks[0]["meta_info"]["finish_reason"].is_null());

    // A streamed batch tags each chunk with its prompt's index.
    let chunks = sse_json(
        &s.post_sse(
            "/generate",
            &json!({"input_ids": [[504, 3459], [314]], "stream": true, "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}}),
        )
        .await,
    );
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["index"] == json!(index))
            .collect();
        let last = mine
            .last()
            .unwrap_or_else(|| panic!("no chunk for index {index}"));
        assert_eq!(last["output_ids"].as_array().unwrap().len(), 3, "{last}");
        assert_eq!(last["meta_info"]["finish_reason"]["type"], json!("length"));
    }
}

#[tokio::test]
async fn metrics_have_sglang_names() {
    let s = server();
    let (status, _) = s
        .post(
            "/generate",
            &json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(status, 200);
    let resp = s.client().get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    for name in [
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}");
    }
}

#[tokio::test]
async fn cache_report_counts_a_repeated_prompt() {
    let s = server();
    let prompt = "Here is a long shared prefix about rivers, mountains, forests and the sea, repeated so \
                  that the radix cache has something to keep: rivers, mountains, forests and the sea. ";
    let req = json!({"prompt": prompt.repeat(3), "max_tokens": 2, "temperature": 0});
    // Another test may flush the cache between two requests: try a few times.
    let mut cached = 0;
    for _ in 0..4 {
        let (status, r) = s.post("/v1/completions", &req).await;
        assert_eq!(status, 200, "{r}");
        cached = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cache report");
        if cached > 0 {
            assert!(cached <= r["usage"]["prompt_tokens"].as_u64().unwrap());
            break;
        }
    }
    assert!(cached > 0, "a repeated prompt must hit the radix cache");
}

/// Requests sharing a long prompt prefix, sent together, compute it once: the first computes
/// it (in chunks), the others wait until it is in the radix cache and reuse it.
#[tokio::test]
async fn shared_prefix_sent_together_is_computed_once() {
    let s = server();
    // Token ids no other test uses, so that nothing else shares or caches this prefix.
    let prefix: Vec<u64> = (0..600u64).map(|i| 20_000 + (i * 7_919) % 9_000).collect();
    let prompts: Vec<Vec<u64>> = (0..4u64)
        .map(|k| {
            let mut p = prefix.clone();
            p.extend((0..8).map(|j| 31_000 + 10 * k + j));
            p
        })
        .collect();
    let (status, r) = s
        .post("/generate", &json!({"input_ids": prompts, "sampling_params": {"max_new_tokens": 2, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{r}");
    let mut cached: Vec<u64> = r
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["meta_info"]["cached_tokens"].as_u64().unwrap())
        .collect();
    cached.sort_unstable();
    assert!(
        cached[0] < 600,
        "the first request computes the prefix: {cached:?}"
    );
    assert!(
        cached[1..].iter().all(|&c| c >= 600),
        "the others reuse the whole shared prefix: {cached:?}"
    );
}

#[tokio::test]
async fn skip_tokenizer_takes_ids_only() {
    let s = skip_tokenizer_server();
    let (status, r) = s
        .post("/generate", &json!({"input_ids": [504, 3459, 314], "sampling_params": {"max_new_tokens": 3, "ignore_eos": true}}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["output_ids"].as_array().unwrap().len(), 3);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/generate", json!({"text": "hello"}), "skip-tokenizer-init"),
        (
            "/generate",
            json!({"input_ids": [1, 2], "sampling_params": {"stop": "x"}}),
            "skip-tokenizer-init",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
            "tokenizer",
        ),
        ("/v1/completions", json!({"prompt": "hello"}), "tokenizer"),
    ];
    for (path, body, text) in cases {
        let (got, resp) = s.post(path, &body).await;
        assert_error(got, &resp, 400, text, &format!("{path} {body}"));
    }
    // Routes are open without --api-key.
    let (status, _) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    // Metrics are off without --enable-metrics.
    let (status, _) = s.get("/metrics").await;
    assert_eq!(status, 404);
}
