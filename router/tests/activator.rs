//! The router as the activator of a service scaled to zero: with no engine it stays ready,
//! holds requests in its bounded queue until a real engine (the `sgl-engine` release binary
//! on the default model, run as a child process) is added, and refuses what does not fit
//! with 503 and `Retry-After`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::engine::Engine;
use common::{client, start};
use serde_json::{Value, json};
use sgl_router::{PolicyKind, RouterConfig};

fn config(queue_size: usize, queue_timeout_secs: u64) -> RouterConfig {
    RouterConfig {
        port: 0,
        policy: PolicyKind::CacheAware,
        health_check_interval_secs: 1,
        health_check_timeout_secs: 5,
        queue_size,
        queue_timeout_secs,
        ..RouterConfig::default()
    }
}

/// The value of an unlabelled sample in the router's /metrics.
async fn metric(c: &reqwest::Client, router: &str, name: &str) -> f64 {
    let text = common::metrics_text(c, router).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

async fn generate(c: &reqwest::Client, router: &str, text: &str) -> reqwest::Response {
    c.post(format!("{router}/generate"))
        .json(&json!({
            "text": text,
            "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": true},
        }))
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_at_zero_engines_are_served_when_one_comes_and_the_overflow_gets_503() {
    let router = start(config(2, 600)).await;
    let c = client();
    let url = router.url();

    // No engine, and the router is ready.
    let health: Value = c
        .get(format!("{url}/readiness"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["workers"], 0);
    assert_eq!(metric(&c, &url, "sgl_router_pending_requests").await, 0.0);

    // Two requests wait in the queue.
    let sent = Instant::now();
    let waiting: Vec<_> = ["The capital of France is", "Once upon a time"]
        .into_iter()
        .map(|prompt| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move {
                let resp = generate(&c, &url, prompt).await;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                (status, body, sent.elapsed())
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&c, &url, "sgl_router_pending_requests").await < 2.0 {
        assert!(Instant::now() < deadline, "the two requests never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The queue holds two: a third is refused at once, with a time to come back.
    let refused_at = Instant::now();
    let resp = generate(&c, &url, "A third request").await;
    assert_eq!(resp.status().as_u16(), 503);
    assert!(
        refused_at.elapsed() < Duration::from_secs(10),
        "refused at once"
    );
    assert_eq!(resp.headers()["retry-after"], "5");
    let body: Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--queue-size"), "{message}");

    // The first engine comes up and is added: both queued requests are served by it.
    let engine = Engine::start();
    let resp = c
        .post(format!("{url}/add_worker?url={}", engine.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut bodies = Vec::new();
    for task in waiting {
        let (status, body, latency) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["meta_info"]["completion_tokens"], 4, "{body}");
        println!("a request sent at zero engines was answered after {latency:?}");
        bodies.push(body);
    }
    // The same prompt again finds its prefix in the engine's cache; the router counts the
    // prompt and cached tokens each response reports (the service-wide hit rate's inputs).
    let resp = generate(&c, &url, "The capital of France is").await;
    assert_eq!(resp.status().as_u16(), 200);
    let again: Value = resp.json().await.unwrap();
    assert!(
        again["meta_info"]["cached_tokens"].as_u64().unwrap() > 0,
        "{again}"
    );
    bodies.push(again);
    let sum = |key: &str| -> f64 {
        bodies
            .iter()
            .map(|b| b["meta_info"][key].as_u64().unwrap() as f64)
            .sum()
    };
    let (prompt, cached) = (sum("prompt_tokens"), sum("cached_tokens"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counted = (
            metric(&c, &url, "sgl_router_prompt_tokens_total").await,
            metric(&c, &url, "sgl_router_cached_tokens_total").await,
        );
        if counted == (prompt, cached) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "router counted {counted:?}, responses reported {:?}",
            (prompt, cached)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("router counted {prompt} prompt tokens, {cached} cached");
    assert_eq!(metric(&c, &url, "sgl_router_pending_requests").await, 0.0);
    assert_eq!(
        metric(&c, &url, "sgl_router_queue_wait_seconds_count").await,
        2.0
    );
    let text = common::metrics_text(&c, &url).await;
    assert!(
        text.contains(r#"sgl_router_request_errors_total{kind="queue_full",route="/generate"} 1"#),
        "{text}"
    );
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_past_the_deadline_gets_503_with_retry_after() {
    let router = start(config(4, 1)).await;
    let c = client();
    let started = Instant::now();
    let resp = generate(&c, &router.url(), "Nobody is serving").await;
    let waited = started.elapsed();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(30),
        "waited {waited:?}"
    );
    let body: Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--queue-timeout-secs"), "{message}");
    assert_eq!(
        metric(&c, &router.url(), "sgl_router_pending_requests").await,
        0.0
    );
    router.shutdown().await.unwrap();
}
