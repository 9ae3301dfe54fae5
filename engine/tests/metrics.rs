//! The counters behind a windowed prefix-cache hit rate, read the way Prometheus reads them:
//! the real binary on the real model, `/metrics` scraped over HTTP between requests.
//!
//! The server is this test binary's own, so no other test moves its counters.

#![allow(clippy::unwrap_used)]

mod common;

use common::Server;
use serde_json::{Value, json};

/// The value of the series `name{model_name=...}` in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("/metrics has no series {name}:\n{text}"));
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable sample line {line:?}"))
}

#[derive(Clone, Copy)]
struct Counters {
    prompt: f64,
    cached: f64,
    requests: f64,
}

async fn scrape(s: &Server) -> (Counters, String) {
    let resp = reqwest::get(s.url("/metrics")).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(ct.starts_with("text/plain"), "content-type {ct}");
    let text = resp.text().await.unwrap();
    let c = Counters {
        prompt: sample(&text, "sglang:prompt_tokens_total"),
        cached: sample(&text, "sglang:cached_tokens_total"),
        requests: sample(&text, "sglang:num_requests_total"),
    };
    (c, text)
}

async fn generate(s: &Server, text: &str) -> (u64, u64) {
    let (status, r) = s
        .post(
            "/generate",
            &json!({"text": text, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let meta: &Value = &r["meta_info"];
    (
        meta["prompt_tokens"].as_u64().unwrap(),
        meta["cached_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn shared_prefix_moves_the_hit_rate_counters_by_what_responses_report() {
    let s = Server::start("metrics", &["--enable-metrics"]);
    let (before, text) = scrape(&s).await;
    for line in [
        "# TYPE sglang:prompt_tokens_total counter",
        "# TYPE sglang:cached_tokens_total counter",
        "# TYPE sglang:num_requests_total counter",
        "# TYPE sglang:token_usage gauge",
        "# TYPE sglang:num_queue_reqs gauge",
        "# TYPE sglang:cache_hit_rate gauge",
    ] {
        assert!(text.contains(line), "/metrics lacks `{line}`:\n{text}");
    }

    let prefix = "You are a careful assistant for a railway company. Timetables, platforms, \
                  ticket classes, refunds and delays are your subjects; answer in one short \
                  sentence and never invent a train that is not in the timetable. ";
    let mut last = before;
    let mut cached = Vec::new();
    for (nth, question) in [
        "when does the first train leave?",
        "can I get a refund for a delay?",
    ]
    .into_iter()
    .enumerate()
    {
        let (p, c) = generate(&s, &format!("{prefix}Question: {question}")).await;
        let (now, _) = scrape(&s).await;
        assert_eq!(
            now.prompt - last.prompt,
            p as f64,
            "prompt tokens of request {nth}"
        );
        assert_eq!(
            now.cached - last.cached,
            c as f64,
            "cached tokens of request {nth}"
        );
        assert_eq!(now.requests - last.requests, 1.0);
        cached.push((p, c));
        last = now;
    }
    let [(p1, c1), (p2, c2)] = [cached[0], cached[1]];
    let after = last;
    // The second request finds the shared prefix (40+ tokens) in the radix cache.
    assert!(c2 >= 40 && c2 < p2, "cached {c2} of {p2} prompt tokens");

    // What `rate(cached)/rate(prompt)` over a window holding both requests computes.
    let windowed = (after.cached - before.cached) / (after.prompt - before.prompt);
    let expected = (c1 + c2) as f64 / (p1 + p2) as f64;
    assert!(
        (windowed - expected).abs() < 1e-12,
        "{windowed} vs {expected}"
    );
    assert!(windowed > 0.2, "hit rate {windowed}");
    println!(
        "prompt tokens {p1} + {p2}, cached {c1} + {c2}: windowed hit rate {windowed:.3} \
         (counter deltas {} / {})",
        after.cached - before.cached,
        after.prompt - before.prompt
    );
}
