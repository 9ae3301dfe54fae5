//! Faults: failing, slow, dying, unhealthy and broken workers behind the router.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use sgl_router::PolicyKind;
use sgl_router::sim::SimConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_answers_are_retried_elsewhere_and_open_the_breaker() {
    let workers = spawn_workers(vec![
        SimConfig {
            failure_rate: 1.0,
            failure_status: 503,
            ..sim("bad")
        },
        sim("good"),
    ]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.cb_failure_threshold = 3;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    for i in 0..20 {
        let (status, worker, _) = generate(&c, &url, &format!("request {i}")).await;
        assert_eq!((status, worker.as_str()), (200, "good"), "request {i}");
    }
    // Three failures opened the breaker: the bad worker got no more attempts.
    assert_eq!(workers[0].requests(), 3);
    let bad = worker_entry(&c, &url, &workers[0].url()).await;
    assert_eq!(bad["circuit"], "open");
    assert_eq!(
        bad["healthy"], true,
        "health checks pass; only requests fail"
    );
    let metrics = metrics_text(&c, &url).await;
    assert!(
        metrics.contains(r#"sgl_router_retries_total{route="/generate"} 3"#),
        "{metrics}"
    );
    assert!(metrics.contains(&format!(
        "sgl_router_worker_circuit_state{{worker=\"{}\"}} 1",
        workers[0].url()
    )));
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_attempts_answer_is_passed_through_when_every_worker_fails() {
    let workers = spawn_workers(vec![SimConfig {
        failure_rate: 1.0,
        failure_status: 503,
        ..sim("bad")
    }]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.retry_max_retries = 2;
    cfg.disable_circuit_breaker = true;
    let router = start(cfg).await;
    let (status, worker, body) = generate(&client(), &router.url(), "hello").await;
    assert_eq!((status, worker.as_str()), (503, "bad"));
    assert_eq!(body["error"]["message"], "simulated failure");
    assert_eq!(workers[0].requests(), 3, "one attempt and two retries");
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_worker_mid_load_loses_no_request() {
    let mut workers = spawn_workers(
        ["a", "b", "c"]
            .into_iter()
            .map(|n| SimConfig {
                latency: Duration::from_millis(30),
                ..sim(n)
            })
            .collect(),
    );
    let router = start(config(&workers, PolicyKind::RoundRobin)).await;
    let url = router.url();
    let c = client();
    let total = 240;
    let tasks: Vec<_> = (0..total)
        .map(|i| {
            let c = c.clone();
            let url = url.clone();
            tokio::spawn(async move {
                // Spread the load over time so the kill lands mid-run.
                tokio::time::sleep(Duration::from_millis(2 * i as u64)).await;
                generate(&c, &url, &format!("request {i}")).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = workers[1].requests();
    workers[1].kill();
    assert!(before > 0, "the killed worker was serving");

    let mut by_worker: HashMap<String, usize> = HashMap::new();
    let mut cut = 0;
    for t in tasks {
        let (status, worker, body) = t.await.unwrap();
        // Requests the dying worker held are answered 502 (not retried: the request may be
        // what killed it); every other one is served.
        if status == 502 {
            let msg = body["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("not retried"), "{body}");
            cut += 1;
            continue;
        }
        assert_eq!(status, 200, "{body}");
        *by_worker.entry(worker).or_default() += 1;
    }
    assert_eq!(by_worker.values().sum::<usize>() + cut, total);
    assert!(
        cut < 30,
        "only the requests in flight on the killed worker fail: {cut}"
    );
    let killed_served = by_worker.get("b").copied().unwrap_or(0) as u64;
    assert!(
        killed_served < before,
        "requests sent after the kill were retried elsewhere"
    );
    // The killed worker is out of rotation. (Whether any request was retried depends on
    // timing: the first broken connection may take it out before a new request picks it.)
    let metrics = metrics_text(&c, &url).await;
    assert!(
        metrics.contains(&format!(
            "sgl_router_worker_health{{worker=\"{}\"}} 0",
            workers[1].url()
        )),
        "{metrics}"
    );
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_a_dying_worker_ends_without_taking_the_router_down() {
    let mut workers = spawn_workers(vec![sim("a"), sim("b")]);
    workers[0].hold_streams();
    workers[1].hold_streams();
    let router = start(config(&workers, PolicyKind::RoundRobin)).await;
    let c = client();
    let url = router.url();
    let resp = c
        .post(format!("{url}/generate"))
        .json(&json!({"text": "stream", "stream": true}))
        .send()
        .await
        .unwrap();
    let name = resp.headers()["x-sim-worker"].to_str().unwrap().to_string();
    let idx = usize::from(name == "b");
    let mut body = resp.bytes_stream();
    use futures::StreamExt;
    let first = body.next().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("tok0"));
    workers[idx].kill();
    let mut broke = false;
    while let Some(chunk) = body.next().await {
        if chunk.is_err() {
            broke = true;
            break;
        }
    }
    assert!(broke, "the client sees the stream break, not a clean end");
    // The router survives and serves from the other worker.
    workers[1 - idx].release(100);
    let (status, worker, _) = generate(&c, &url, "after the crash").await;
    assert_eq!(status, 200);
    assert_eq!(worker, workers[1 - idx].name());
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_workers_leave_the_tree_and_come_back_when_healthy() {
    let workers = spawn_workers(vec![sim("a"), sim("b")]);
    let mut cfg = config(&workers, PolicyKind::CacheAware);
    cfg.health_failure_threshold = 1;
    cfg.health_success_threshold = 1;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    let prompt = "A long system prompt that should stay with one worker while it lives.";
    let (_, first, _) = generate(&c, &url, prompt).await;
    let (idx, other) = if first == "a" { (0, 1) } else { (1, 0) };
    let (_, again, _) = generate(&c, &url, prompt).await;
    assert_eq!(again, first, "cache hit");

    workers[idx].set_healthy(false);
    let wurl = workers[idx].url();
    assert!(
        eventually(Duration::from_secs(5), || async {
            worker_entry(&c, &url, &wurl).await["healthy"] == false
        })
        .await
    );
    assert_eq!(
        worker_entry(&c, &url, &wurl).await["tree_chars"],
        0,
        "entries dropped"
    );
    let (status, moved, _) = generate(&c, &url, prompt).await;
    assert_eq!((status, moved.as_str()), (200, workers[other].name()));
    let metrics = metrics_text(&c, &url).await;
    assert!(metrics.contains(&format!("sgl_router_worker_health{{worker=\"{wurl}\"}} 0")));

    workers[idx].set_healthy(true);
    assert!(
        eventually(Duration::from_secs(5), || async {
            worker_entry(&c, &url, &wurl).await["healthy"] == true
        })
        .await
    );
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_worker_times_out_with_504() {
    let workers = spawn_workers(vec![SimConfig {
        latency: Duration::from_secs(3),
        ..sim("slow")
    }]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.request_timeout_secs = 1;
    let router = start(cfg).await;
    let (status, _, body) = generate(&client(), &router.url(), "hi").await;
    assert_eq!(status, 504);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("did not answer")
    );
    router.shutdown().await.unwrap();
}

/// A TCP server that answers every connection with bytes that are not HTTP.
fn garbage_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"\x00\x01 this is not HTTP \xff\r\n\r\n");
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_a_worker_is_a_502_not_a_crash() {
    let garbage = garbage_server();
    let mut cfg = config(&[], PolicyKind::RoundRobin);
    cfg.worker_urls = vec![garbage.clone()];
    cfg.retry_max_retries = 1;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    // The garbage server fails its health check: mark it healthy to force traffic to it.
    router.state().workers.get(&garbage).unwrap().mark_healthy();
    let resp = c
        .post(format!("{url}/generate"))
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 attempt"),
        "{body}"
    );
    assert_eq!(
        c.get(format!("{url}/list_workers"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    router.shutdown().await.unwrap();
}
