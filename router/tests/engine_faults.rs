//! Real engines (`sgl-engine` child processes) that freeze, die and come back behind the
//! router: a frozen engine costs a request one first-byte timeout, not the request timeout;
//! a dead one is marked at once; either is taken back within seconds of its return.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::engine::Engine;
use common::{client, eventually, metrics_text, start, worker_entry};
use serde_json::{Value, json};
use sgl_router::{PolicyKind, RouterConfig};

/// Longest a restarted or thawed engine may wait to be taken back. The periodic checks
/// (every 10 s, two passes needed) alone would take 10 to 20 s.
const BACK_WITHIN: Duration = Duration::from_secs(6);

fn config(engines: &[&Engine]) -> RouterConfig {
    RouterConfig {
        port: 0,
        worker_urls: engines.iter().map(|e| e.url.clone()).collect(),
        policy: PolicyKind::RoundRobin,
        first_byte_timeout_secs: 2,
        health_check_timeout_secs: 1,
        // The default: periodic checks notice a dead worker only after 20 to 30 s.
        health_check_interval_secs: 10,
        request_timeout_secs: 120,
        retry_initial_backoff_ms: 5,
        retry_max_backoff_ms: 50,
        queue_size: 0,
        ..RouterConfig::default()
    }
}

/// A short greedy /generate; (status, body, how long it took).
async fn generate(c: &reqwest::Client, router: &str, text: &str) -> (u16, Value, Duration) {
    let sent = Instant::now();
    let resp = c
        .post(format!("{router}/generate"))
        .json(&json!({
            "text": text,
            "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": true},
        }))
        .timeout(Duration::from_secs(40))
        .send()
        .await
        .unwrap_or_else(|e| panic!("`{text}` got no answer after {:?}: {e}", sent.elapsed()));
    let status = resp.status().as_u16();
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, body, sent.elapsed())
}

async fn healthy(c: &reqwest::Client, router: &str, engine: &str) -> bool {
    worker_entry(c, router, engine).await["healthy"] == true
}

async fn processed(c: &reqwest::Client, router: &str, engine: &str) -> u64 {
    worker_entry(c, router, engine).await["processed"]
        .as_u64()
        .unwrap()
}

/// Sends four requests at once; every one must succeed well within the request timeout.
async fn four_requests(c: &reqwest::Client, router: &str, tag: &str) {
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            let (c, router) = (c.clone(), router.to_string());
            let text = format!("{tag} request number {i} is");
            tokio::spawn(async move { generate(&c, &router, &text).await })
        })
        .collect();
    for task in tasks {
        let (status, body, took) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["meta_info"]["completion_tokens"], 4, "{body}");
        println!("{tag}: answered in {took:?}");
        assert!(
            took < Duration::from_secs(15),
            "{tag}: took {took:?}; the first-byte timeout is 2 s and a probe 1 s"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_engine_costs_one_first_byte_timeout_and_is_back_soon_after_it_thaws() {
    let frozen = Engine::start();
    let other = Engine::start();
    let router = start(config(&[&frozen, &other])).await;
    let c = client();
    let url = router.url();
    for e in [&frozen, &other] {
        assert!(eventually(Duration::from_secs(30), || healthy(&c, &url, &e.url)).await);
    }

    frozen.freeze();
    // Round robin sends some of these to the frozen engine: they wait for its first byte,
    // find it does not answer its health check, and go to the other engine.
    four_requests(&c, &url, "frozen").await;
    assert!(
        processed(&c, &url, &frozen.url).await > 0,
        "no request tried the frozen engine"
    );
    assert!(
        !healthy(&c, &url, &frozen.url).await,
        "the frozen engine is marked dead at once"
    );
    let metrics = metrics_text(&c, &url).await;
    let retries = metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"sgl_router_retries_total{route="/generate"} "#))
        .unwrap_or("0");
    assert_ne!(retries, "0", "the frozen engine's requests were retried");

    frozen.thaw();
    let thawed = Instant::now();
    assert!(
        eventually(BACK_WITHIN, || healthy(&c, &url, &frozen.url)).await,
        "the thawed engine was not taken back within {BACK_WITHIN:?}"
    );
    println!("taken back {:?} after it thawed", thawed.elapsed());
    let before = processed(&c, &url, &frozen.url).await;
    four_requests(&c, &url, "thawed").await;
    assert!(
        processed(&c, &url, &frozen.url).await > before,
        "it serves again"
    );
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_engine_is_marked_at_once_and_a_restarted_one_is_back_within_seconds() {
    let mut dying = Engine::start();
    let other = Engine::start();
    let router = start(config(&[&dying, &other])).await;
    let c = client();
    let url = router.url();
    for e in [&dying, &other] {
        assert!(eventually(Duration::from_secs(30), || healthy(&c, &url, &e.url)).await);
    }

    let dead_url = dying.url.clone();
    let port = dying.port();
    dying.kill();
    // Refused connections are retried on the other engine and mark the dead one.
    four_requests(&c, &url, "dead").await;
    assert!(
        !healthy(&c, &url, &dead_url).await,
        "a refused connection marks the engine dead at once"
    );

    // The engine restarts at the same address (as a restarted container does).
    let restarted = Engine::start_on(port);
    assert_eq!(restarted.url, dead_url);
    let listening = Instant::now();
    assert!(
        eventually(BACK_WITHIN, || healthy(&c, &url, &dead_url)).await,
        "the restarted engine was not taken back within {BACK_WITHIN:?}"
    );
    println!("taken back {:?} after it listened", listening.elapsed());
    let before = processed(&c, &url, &dead_url).await;
    four_requests(&c, &url, "restarted").await;
    assert!(
        processed(&c, &url, &dead_url).await > before,
        "it serves again"
    );
    router.shutdown().await.unwrap();
}
