//! Load shedding by the router, by the engines' own rule: each worker holds at most what its
//! `/get_server_info` reports (`max_running_requests` + `max_queued_requests`); when every
//! worker is full, a generation request is answered 429 with `Retry-After` and the engine's
//! error shape at once, without reaching an engine; an engine's own 429 is passed to the
//! client and not retried on the others. Real engines (the `sgl-engine` release binary on the
//! default model) with small bounds, the router's real HTTP stack on loopback.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::engine::Engine;
use common::{client, eventually, every_worker, list_workers, start};
use serde_json::{Value, json};
use sgl_router::sim::SimConfig;
use sgl_router::{PolicyKind, RouterConfig};

/// One running and one waiting request per engine.
const ENGINE_BOUNDS: [&str; 4] = ["--max-running-requests", "1", "--max-queued-requests", "1"];

fn router_config(workers: Vec<String>) -> RouterConfig {
    RouterConfig {
        port: 0,
        worker_urls: workers,
        policy: PolicyKind::RoundRobin,
        health_check_interval_secs: 1,
        health_check_timeout_secs: 5,
        queue_size: 0,
        retry_initial_backoff_ms: 5,
        retry_max_backoff_ms: 50,
        ..RouterConfig::default()
    }
}

/// A greedy /generate that runs `tokens` tokens whatever the model says.
fn generation(text: &str, tokens: u32, stream: bool) -> Value {
    json!({
        "text": text,
        "stream": stream,
        "sampling_params": {"temperature": 0, "max_new_tokens": tokens, "ignore_eos": true},
    })
}

async fn post(c: &reqwest::Client, base: &str, body: &Value) -> reqwest::Response {
    c.post(format!("{base}/generate"))
        .json(body)
        .timeout(Duration::from_secs(600))
        .send()
        .await
        .unwrap()
}

/// Reads a stream until its first token event: the request is running on its engine (a
/// request waiting behind it is then the engine's one waiting request, not a second one).
async fn wait_running(resp: &mut reqwest::Response) {
    let mut seen = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        seen.extend_from_slice(&chunk);
        if String::from_utf8_lossy(&seen).contains("data:") {
            return;
        }
    }
    panic!("the stream ended without an event");
}

/// Whether an engine has nothing running or waiting.
async fn idle(c: &reqwest::Client, engine: &str) -> bool {
    let info: Value = c
        .get(format!("{engine}/get_server_info"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    info["num_running_reqs"] == 0 && info["num_queue_reqs"] == 0
}

/// Sum of a labelled counter's samples in the router's /metrics (0 when absent).
async fn counter_sum(c: &reqwest::Client, router: &str, name: &str) -> f64 {
    let text = common::metrics_text(c, router).await;
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The `load` of every worker, in `/list_workers` order.
async fn loads(c: &reqwest::Client, router: &str) -> Vec<u64> {
    list_workers(c, router).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"].as_u64().unwrap())
        .collect()
}

/// Checks a shed answer: `status`, `Retry-After` in whole seconds, the engine's error shape.
async fn assert_shed(resp: reqwest::Response, status: u16, kind: &str) -> String {
    assert_eq!(resp.status().as_u16(), status);
    let retry_after: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "Retry-After {retry_after}");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["object"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body["error"]["code"], status, "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_fleet_is_answered_429_by_the_router_and_nothing_leaks() {
    let engines = [
        Engine::start_with(0, &ENGINE_BOUNDS),
        Engine::start_with(0, &ENGINE_BOUNDS),
    ];
    let router = start(router_config(
        engines.iter().map(|e| e.url.clone()).collect(),
    ))
    .await;
    let c = client();
    let url = router.url();
    // The router learns each engine's bound: 1 running + 1 waiting.
    assert!(
        eventually(Duration::from_secs(60), || async {
            every_worker(&c, &url, |w| {
                w["healthy"] == true && w["max_in_flight"] == 2
            })
            .await
        })
        .await,
        "bounds not read: {}",
        list_workers(&c, &url).await
    );

    // Four long streams fill both engines (each: one running, one waiting); round robin
    // sends the first two to one engine each.
    let mut hogs = Vec::new();
    for i in 0..4 {
        let mut resp = post(&c, &url, &generation(&format!("hog {i}"), 4000, true)).await;
        assert_eq!(resp.status(), 200);
        if i < 2 {
            wait_running(&mut resp).await;
        }
        hogs.push(resp);
    }
    assert_eq!(loads(&c, &url).await, [2, 2]);
    let forwarded = counter_sum(&c, &url, "sgl_router_processed_requests_total").await;
    assert_eq!(forwarded, 4.0);

    // Every further generation request is refused by the router itself, in the engine's
    // shape, on every generation route.
    let mut times = Vec::new();
    for i in 0..6 {
        let started = Instant::now();
        let resp = post(&c, &url, &generation(&format!("extra {i}"), 8, false)).await;
        times.push(started.elapsed());
        let msg = assert_shed(resp, 429, "rate_limit_error").await;
        assert!(msg.contains("every available worker is full"), "{msg}");
    }
    let chat = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_shed(chat, 429, "rate_limit_error").await;
    eprintln!("router's own 429s answered in {times:?}");
    assert_eq!(
        counter_sum(&c, &url, "sgl_router_processed_requests_total").await,
        forwarded,
        "a shed request reached an engine"
    );
    // Routes an engine does not admit against its bounds still pass.
    let models = c.get(format!("{url}/v1/models")).send().await.unwrap();
    assert_eq!(models.status(), 200);

    // The clients go away: every place is given back, and new requests complete.
    drop(hogs);
    assert!(
        eventually(Duration::from_secs(30), || async {
            loads(&c, &url).await == [0, 0]
        })
        .await,
        "loads after the clients left: {:?}",
        loads(&c, &url).await
    );
    for e in &engines {
        assert!(
            eventually(Duration::from_secs(60), || idle(&c, &e.url)).await,
            "the engine kept the abandoned requests"
        );
    }
    for i in 0..4 {
        let resp = post(&c, &url, &generation(&format!("after {i}"), 4, false)).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["meta_info"]["completion_tokens"], 4, "{body}");
    }
    assert_eq!(loads(&c, &url).await, [0, 0]);
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engines_own_429_is_passed_through_once_and_not_retried_on_the_others() {
    let engines = [
        Engine::start_with(0, &ENGINE_BOUNDS),
        Engine::start_with(0, &ENGINE_BOUNDS),
    ];
    let mut cfg = router_config(engines.iter().map(|e| e.url.clone()).collect());
    cfg.retry_max_retries = 5;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(60), || async {
            every_worker(&c, &url, |w| {
                w["healthy"] == true && w["max_in_flight"] == 2
            })
            .await
        })
        .await
    );

    // Other clients fill both engines directly: the router's own count says they are empty.
    let mut direct = Vec::new();
    for e in &engines {
        for i in 0..2 {
            let mut resp = post(&c, &e.url, &generation(&format!("direct {i}"), 4000, true)).await;
            assert_eq!(resp.status(), 200);
            if i == 0 {
                wait_running(&mut resp).await;
            }
            direct.push(resp);
        }
    }

    // The first request reaches one engine, which refuses it: its 429 comes back as it is,
    // and the request goes to no other engine.
    let resp = post(&c, &url, &generation("first", 8, false)).await;
    let msg = assert_shed(resp, 429, "rate_limit_error").await;
    assert!(msg.contains("--max-queued-requests"), "the engine's: {msg}");
    assert_eq!(
        counter_sum(&c, &url, "sgl_router_processed_requests_total").await,
        1.0
    );
    assert_eq!(counter_sum(&c, &url, "sgl_router_retries_total").await, 0.0);
    // The second goes to the other engine, refused the same way.
    let resp = post(&c, &url, &generation("second", 8, false)).await;
    assert_shed(resp, 429, "rate_limit_error").await;
    assert_eq!(
        counter_sum(&c, &url, "sgl_router_processed_requests_total").await,
        2.0
    );
    // Both refused and nothing has left them: the router answers the rest itself.
    for i in 0..4 {
        let resp = post(&c, &url, &generation(&format!("more {i}"), 8, false)).await;
        let msg = assert_shed(resp, 429, "rate_limit_error").await;
        assert!(msg.contains("answered 429"), "the router's: {msg}");
    }
    assert_eq!(
        counter_sum(&c, &url, "sgl_router_processed_requests_total").await,
        2.0,
        "a request the router knew would be refused reached an engine"
    );

    // The other clients leave; once the engines' advice has passed, requests are served.
    drop(direct);
    let served = eventually(Duration::from_secs(120), || async {
        post(&c, &url, &generation("later", 4, false))
            .await
            .status()
            == 200
    })
    .await;
    assert!(served, "not served after the engines emptied");
    assert!(
        eventually(Duration::from_secs(30), || async {
            loads(&c, &url).await == [0, 0]
        })
        .await
    );
    router.shutdown().await.unwrap();
}

/// `--max-concurrent-requests` bounds the generation requests in flight through the router,
/// across workers; a client that goes away gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_requests_bounds_the_router_across_workers() {
    let workers = common::spawn_workers(vec![
        SimConfig {
            tokens: 8,
            ..common::sim("a")
        },
        SimConfig {
            tokens: 8,
            ..common::sim("b")
        },
    ]);
    for w in &workers {
        w.hold_streams();
    }
    let mut cfg = common::config(&workers, PolicyKind::RoundRobin);
    cfg.max_concurrent_requests = 2;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(10), || async {
            every_worker(&c, &url, |w| w["healthy"] == true).await
        })
        .await
    );
    let mut held = Vec::new();
    for i in 0..2 {
        let resp = post(&c, &url, &generation(&format!("held {i}"), 8, true)).await;
        assert_eq!(resp.status(), 200);
        held.push(resp);
    }
    assert_eq!(loads(&c, &url).await, [1, 1]);
    let resp = post(&c, &url, &generation("third", 8, false)).await;
    let msg = assert_shed(resp, 429, "rate_limit_error").await;
    assert!(msg.contains("--max-concurrent-requests"), "{msg}");
    assert_eq!(workers[0].requests() + workers[1].requests(), 2);

    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || async {
            loads(&c, &url).await == [0, 0]
        })
        .await
    );
    // Both places came back: two new streams are taken, and a third is refused again.
    let mut again = Vec::new();
    for i in 0..2 {
        let resp = post(&c, &url, &generation(&format!("again {i}"), 8, true)).await;
        assert_eq!(resp.status(), 200);
        again.push(resp);
    }
    let resp = post(&c, &url, &generation("third again", 8, false)).await;
    assert_shed(resp, 429, "rate_limit_error").await;
    drop(again);
    assert!(
        eventually(Duration::from_secs(10), || async {
            loads(&c, &url).await == [0, 0]
        })
        .await
    );
    for w in &workers {
        w.release(1000);
    }
    let (status, _, body) = common::generate(&c, &url, "fourth").await;
    assert_eq!(status, 200, "{body}");
    router.shutdown().await.unwrap();
}
