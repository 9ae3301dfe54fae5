//! Requests that break workers, and limits that keep the router itself standing.

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use parking_lot::Mutex;
use sgl_router::PolicyKind;
use sgl_router::sim::SimConfig;

/// A request that makes its worker die while handling it is answered 502 and not sent to
/// the next worker: a poison request must not walk through the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_kills_its_worker_is_not_retried_elsewhere() {
    let workers = spawn_workers(
        ["a", "b", "c"]
            .into_iter()
            .map(|n| SimConfig {
                poison: Some("POISON".into()),
                ..sim(n)
            })
            .collect(),
    );
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.retry_max_retries = 5;
    cfg.disable_circuit_breaker = true;
    // Health checks would not notice in time; the router must mark the worker itself.
    cfg.health_check_interval_secs = 3600;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(10), || async {
            every_worker(&c, &url, |w| w["healthy"] == true).await
        })
        .await
    );

    let (status, _, body) = generate(&c, &url, "please eat this POISON").await;
    assert_eq!(status, 502, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("not retried"), "{msg}");
    let hit: Vec<&str> = workers
        .iter()
        .filter(|w| w.requests() > 0)
        .map(|w| w.name())
        .collect();
    assert_eq!(hit.len(), 1, "the poison reached {hit:?}");

    // The dead worker is out of rotation at once; the two others serve everything.
    let dead = workers.iter().find(|w| w.requests() > 0).unwrap();
    assert_eq!(
        worker_entry(&c, &url, &dead.url()).await["healthy"],
        false,
        "marked dead"
    );
    for i in 0..10 {
        let (status, served_by, body) = generate(&c, &url, &format!("normal {i}")).await;
        assert_eq!(status, 200, "{body}");
        assert_ne!(served_by, dead.name());
    }
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_are_retried_and_mark_the_worker_dead() {
    let mut workers = spawn_workers(vec![sim("a"), sim("b")]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.health_check_interval_secs = 3600;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(10), || async {
            every_worker(&c, &url, |w| w["healthy"] == true).await
        })
        .await
    );
    let dead_url = workers[0].url();
    workers[0].kill();
    // The health checks left an idle keep-alive connection to the killed worker in the
    // router's pool; it is dropped once the pool sees the close. A request sent before that
    // meets a reset, which the router rightly does not retry (it cannot tell it from a worker
    // dying mid-request): this test is about refused connections, so let the pool see it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..4 {
        let (status, served_by, body) = generate(&c, &url, &format!("q {i}")).await;
        assert_eq!((status, served_by.as_str()), (200, "b"), "{body}");
    }
    assert_eq!(
        worker_entry(&c, &url, &dead_url).await["healthy"],
        false,
        "a refused connection marks the worker dead without waiting for health checks"
    );
    router.shutdown().await.unwrap();
}

/// Every route an engine serves works through the router, errors included, in the engine's
/// error shape; `/health_generate` needs the key like every other route that generates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_the_engines_routes_with_its_error_shapes() {
    let workers = spawn_workers(vec![sim("a")]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.api_key = Some("secret".into());
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(10), || async {
            c.get(format!("{url}/list_workers"))
                .bearer_auth("secret")
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()["workers"][0]["healthy"]
                == true
        })
        .await
    );
    let call = |method: reqwest::Method, path: &str| {
        c.request(method, format!("{url}{path}"))
            .bearer_auth("secret")
    };
    let resp = call(reqwest::Method::PUT, "/generate")
        .json(&serde_json::json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "PUT /generate");
    for path in ["/parse_function_call", "/function_call"] {
        let resp = call(reqwest::Method::POST, path)
            .json(&serde_json::json!({"text": "hello", "tools": [], "tool_call_parser": "qwen25"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["normal_text"], "hello", "{path}: {body}");
    }
    let resp = call(reqwest::Method::GET, "/v1/models/sim-model")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = call(reqwest::Method::GET, "/v1/models/other")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "the engine's 404 passes through");

    for (method, path, want) in [
        (reqwest::Method::GET, "/generate", 405),
        (reqwest::Method::DELETE, "/v1/chat/completions", 405),
        (reqwest::Method::GET, "/no/such/route", 404),
    ] {
        let resp = call(method.clone(), path).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want, "{method} {path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["object"], "error", "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], want, "{method} {path}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(path),
            "{method} {path}: {body}"
        );
    }

    // A query string that does not parse is the router's 400, in the same shape.
    let resp = call(
        reqwest::Method::POST,
        "/add_worker?url=http://a:1&url=http://b:1",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("url"),
        "{body}"
    );

    let anon = client();
    let resp = anon
        .get(format!("{url}/health_generate"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "/health_generate without the key");
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error", "{body}");
    assert_eq!(workers[0].requests(), 1, "only PUT /generate generated");
    let resp = anon.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(resp.status(), 200, "/health stays open for probes");
    router.shutdown().await.unwrap();
}

/// A TCP server that takes every connection and request and never answers (a frozen
/// process); returns its URL and the request lines it received.
fn black_hole() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let log = log.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut logged = false;
                let mut buf = [0u8; 4096];
                // Reads until the peer goes away; answers nothing.
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if !logged {
                        head.extend_from_slice(&buf[..n]);
                        if let Some(end) = head.windows(2).position(|w| w == b"\r\n") {
                            log.lock()
                                .push(String::from_utf8_lossy(&head[..end]).into_owned());
                            logged = true;
                        }
                    }
                }
            });
        }
    });
    (url, seen)
}

/// One frozen worker is skipped; a request that a second worker froze on is answered 502
/// instead of being sent to a third (it may be what freezes them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_two_workers_froze_on_goes_to_no_third() {
    let holes: Vec<_> = (0..3).map(|_| black_hole()).collect();
    let mut cfg = config(&[], PolicyKind::RoundRobin);
    cfg.worker_urls = holes.iter().map(|(u, _)| u.clone()).collect();
    cfg.first_byte_timeout_secs = 1;
    cfg.health_check_timeout_secs = 1;
    cfg.health_check_interval_secs = 3600;
    cfg.retry_max_retries = 5;
    cfg.disable_circuit_breaker = true;
    let router = start(cfg).await;
    // They fail their first checks: mark them healthy to send them the request.
    for (u, _) in &holes {
        router.state().workers.get(u).unwrap().mark_healthy();
    }
    let c = client();
    let url = router.url();
    let sent = Instant::now();
    let (status, _, body) = generate(&c, &url, "freeze them all").await;
    let took = sent.elapsed();
    assert_eq!(status, 502, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("2 workers froze"), "{msg}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let reached: Vec<usize> = holes
        .iter()
        .enumerate()
        .filter(|(_, (_, seen))| seen.lock().iter().any(|l| l.starts_with("POST /generate")))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(reached.len(), 2, "the request reached workers {reached:?}");
    for i in reached {
        assert_eq!(
            worker_entry(&c, &url, &holes[i].0).await["healthy"],
            false,
            "a frozen worker is marked dead"
        );
    }
    router.shutdown().await.unwrap();
}

/// The body limit is the engine's (32 MiB; `tests/proxy.rs` checks the 413), and a request
/// a worker refuses leaves no text in the prefix tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_leave_nothing_behind() {
    let workers = spawn_workers(vec![SimConfig {
        failure_rate: 1.0,
        failure_status: 400,
        ..sim("picky")
    }]);
    let cfg = config(&workers, PolicyKind::CacheAware);
    assert_eq!(cfg.max_payload_size, 32 << 20, "the engine's body limit");
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    assert!(
        eventually(Duration::from_secs(10), || async {
            list_workers(&c, &url).await["workers"][0]["healthy"] == true
        })
        .await
    );
    let prompt = "y".repeat(1 << 20);
    for _ in 0..3 {
        let (status, _, body) = generate(&c, &url, &prompt).await;
        assert_eq!(status, 400, "{body}");
    }
    assert_eq!(workers[0].requests(), 3);
    let entry = worker_entry(&c, &url, &workers[0].url()).await;
    assert_eq!(
        entry["tree_chars"], 0,
        "refused prompts are not kept: {entry}"
    );
    router.shutdown().await.unwrap();
}

mod connections {
    //! The listener's limits, on a small app served by `serve_with_limits` over loopback.

    use std::time::{Duration, Instant};

    use axum::Router;
    use axum::routing::get;
    use sgl_http::listen::{ConnLimits, serve_with_limits};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(limits: ConnLimits) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let app = Router::new().route("/", get(|| async { "ok" }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_limits(listener, app, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Reads until the server closes the connection (or answers); false at the deadline.
    async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
        let mut buf = [0u8; 1024];
        let start = Instant::now();
        while start.elapsed() < limit {
            match tokio::time::timeout(limit - start.elapsed(), stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    #[tokio::test]
    async fn half_sent_headers_and_idle_connections_are_closed() {
        let (addr, _stop) = start(ConnLimits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(1),
        })
        .await;
        let mut half = TcpStream::connect(&addr).await.unwrap();
        half.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-")
            .await
            .unwrap();
        assert!(
            closed_within(&mut half, Duration::from_secs(20)).await,
            "a half-sent request head is dropped"
        );
        let mut idle = TcpStream::connect(&addr).await.unwrap();
        idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
        assert!(
            closed_within(&mut idle, Duration::from_secs(20)).await,
            "an idle keep-alive connection is closed"
        );
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_wait_for_a_free_slot() {
        let (addr, _stop) = start(ConnLimits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(3600),
        })
        .await;
        // Two clients that hold their connections without finishing a request.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
            held.push(s);
        }
        let mut third = TcpStream::connect(&addr).await.unwrap();
        third
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        // While both slots are held the third connection is not served.
        let early = tokio::time::timeout(Duration::from_secs(1), third.read(&mut buf)).await;
        assert!(early.is_err(), "served beyond the connection cap");
        drop(held.pop());
        let n = tokio::time::timeout(Duration::from_secs(20), third.read(&mut buf))
            .await
            .expect("served once a slot is free")
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    }
}
