//! Real engines (`sgl-engine` child processes) that freeze, die and come back behind the
//! router: a frozen engine costs a request one first-byte timeout, not the request timeout;
//! a dead one is marked at once; either is taken back within seconds of its return. A stream
//! that stalls mid-way (a real engine frozen while it streams, or a worker whose stream just
//! stops) is ended after the stream idle timeout with an error event, and the request is
//! freed in the router and in the engine.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::engine::Engine;
use common::{client, eventually, metrics_text, start, worker_entry};
use futures::StreamExt;
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

/// Stream idle timeout of the stall tests.
const IDLE_SECS: u64 = 3;

/// Streams a long /generate through the router; after `chunks` data events calls `then`,
/// then reads to the end. Returns every `data:` payload and how long the stream took to end
/// after `then`.
async fn stream_until_end(
    c: &reqwest::Client,
    router: &str,
    chunks: usize,
    then: impl FnOnce(),
) -> (Vec<String>, Duration) {
    let resp = c
        .post(format!("{router}/generate"))
        .json(&json!({
            "text": "Count slowly:",
            "stream": true,
            "sampling_params": {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": true},
        }))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let mut then = Some(then);
    let mut since = Instant::now();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap_or_else(|e| panic!("the stream broke instead of ending: {e}"));
        text.push_str(&String::from_utf8_lossy(&chunk));
        let events = text.lines().filter(|l| l.starts_with("data:")).count();
        if events >= chunks
            && let Some(f) = then.take()
        {
            f();
            since = Instant::now();
        }
    }
    assert!(
        then.is_none(),
        "the stream ended after fewer than {chunks} events: {text}"
    );
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.trim().to_string())
        .collect();
    (data, since.elapsed())
}

/// The stream ends with the router's error event (504, naming the flag), then `[DONE]`.
fn assert_ends_with_stall_error(data: &[String]) {
    let n = data.len();
    assert!(n >= 2, "{data:?}");
    assert_eq!(data[n - 1], "[DONE]", "{data:?}");
    let event: Value = serde_json::from_str(&data[n - 2]).unwrap();
    assert_eq!(event["error"]["code"], 504, "{event}");
    let msg = event["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("--stream-idle-timeout-secs"), "{event}");
    // Everything before it is the worker's own.
    for d in &data[..n - 2] {
        let chunk: Value = serde_json::from_str(d).unwrap();
        assert!(chunk.get("error").is_none(), "{chunk}");
    }
}

fn stall_errors(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                r#"sgl_router_request_errors_total{kind="stream_idle_timeout",route="/generate"} "#,
            )
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_frozen_mid_stream_ends_the_stream_after_the_idle_timeout() {
    let engine = Engine::start();
    let router = start(RouterConfig {
        stream_idle_timeout_secs: IDLE_SECS,
        ..config(&[&engine])
    })
    .await;
    let c = client();
    let url = router.url();
    assert!(eventually(Duration::from_secs(30), || healthy(&c, &url, &engine.url)).await);

    let (data, after_freeze) = stream_until_end(&c, &url, 3, || engine.freeze()).await;
    println!(
        "{} events, the stream ended {after_freeze:?} after the freeze",
        data.len()
    );
    assert_ends_with_stall_error(&data);
    // The router's wait began at its last chunk, a moment before the client saw it and froze
    // the engine.
    assert!(
        after_freeze >= Duration::from_secs(IDLE_SECS - 1)
            && after_freeze < Duration::from_secs(30),
        "ended {after_freeze:?} after the freeze; the idle timeout is {IDLE_SECS} s"
    );
    assert_eq!(stall_errors(&metrics_text(&c, &url).await), 1);
    // Freed in the router: no load left on the worker; and, failing its health probe, the
    // frozen engine is out of rotation.
    assert!(
        eventually(Duration::from_secs(10), || async {
            let w = worker_entry(&c, &url, &engine.url).await;
            w["load"] == 0 && w["healthy"] == false
        })
        .await,
        "{}",
        worker_entry(&c, &url, &engine.url).await
    );

    // Thawed, the engine finds its client gone and drops the request.
    engine.thaw();
    let info_url = format!("{}/get_server_info", engine.url);
    assert!(
        eventually(Duration::from_secs(30), || async {
            let Ok(resp) = c.get(&info_url).send().await else {
                return false;
            };
            let info: Value = resp.json().await.unwrap_or(Value::Null);
            info["num_running_reqs"] == 0 && info["num_queue_reqs"] == 0
        })
        .await,
        "the engine still runs the abandoned request"
    );
    assert!(eventually(BACK_WITHIN, || healthy(&c, &url, &engine.url)).await);
    router.shutdown().await.unwrap();
}

/// A worker that answers its health checks and sends three chunks of a stream, then nothing.
async fn stalling_worker() -> String {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::{get, post};

    async fn stream() -> axum::response::Response {
        let chunks = futures::stream::iter((0..3).map(|i| {
            Ok::<_, std::io::Error>(bytes::Bytes::from(format!(
                "data: {}\n\n",
                json!({"text": format!("chunk {i}"), "meta_info": {"id": "stall"}})
            )))
        }))
        .chain(futures::stream::pending());
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(chunks))
            .unwrap()
    }
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/generate", post(stream));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_stops_is_ended_after_the_idle_timeout_and_the_worker_stays() {
    let worker = stalling_worker().await;
    let router = start(RouterConfig {
        port: 0,
        worker_urls: vec![worker.clone()],
        policy: PolicyKind::RoundRobin,
        stream_idle_timeout_secs: IDLE_SECS,
        health_check_timeout_secs: 1,
        queue_size: 0,
        ..RouterConfig::default()
    })
    .await;
    let c = client();
    let url = router.url();
    assert!(eventually(Duration::from_secs(10), || healthy(&c, &url, &worker)).await);

    let (data, after) = stream_until_end(&c, &url, 3, || {}).await;
    assert_eq!(data.len(), 5, "three chunks, the error, [DONE]: {data:?}");
    assert_ends_with_stall_error(&data);
    assert!(
        after >= Duration::from_secs(IDLE_SECS - 1) && after < Duration::from_secs(30),
        "ended {after:?} after the last chunk; the idle timeout is {IDLE_SECS} s"
    );
    assert_eq!(stall_errors(&metrics_text(&c, &url).await), 1);
    assert!(
        eventually(Duration::from_secs(10), || async {
            worker_entry(&c, &url, &worker).await["load"] == 0
        })
        .await,
        "the request still counts on the worker"
    );
    // It answers its health check: a stalled request, not a frozen worker.
    assert!(healthy(&c, &url, &worker).await);
    router.shutdown().await.unwrap();
}
