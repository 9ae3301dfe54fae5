//! The router in front of simulated workers on loopback: routes, routing, streaming,
//! bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use futures::StreamExt;
use serde_json::{Value, json};
use sgl_router::PolicyKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_route_is_proxied() {
    let workers = spawn_workers(vec![sim("a"), sim("b")]);
    let router = start(config(&workers, PolicyKind::RoundRobin)).await;
    let c = client();
    let url = router.url();

    for path in [
        "/v1/models",
        "/get_model_info",
        "/get_server_info",
        "/health_generate",
    ] {
        let resp = c.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(
            resp.headers().contains_key("x-sim-worker"),
            "{path} reached a worker"
        );
    }
    let models: Value = c
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "sim-model");

    let (status, _, body) = generate(&c, &url, "Hello").await;
    assert_eq!(status, 200);
    assert_eq!(body["text"], "tok0 tok1 tok2 tok3 ");

    let body: Value = c
        .post(format!("{url}/v1/completions"))
        .json(&json!({"model": "m", "prompt": "Once upon a time"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["object"], "text_completion");
    let body: Value = c
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");

    let resp = c.post(format!("{url}/flush_cache")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["flushed"].as_array().unwrap().len(), 2);
    assert!(
        workers.iter().all(|w| w.flushes() == 1),
        "flush reaches every worker"
    );

    let resp = c.get(format!("{url}/no/such/route")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    router.shutdown().await.unwrap();
}

/// Sends `groups` x `per_group` prompts, `per_group` at a time concurrently per round;
/// returns the workers that served each group.
async fn run_groups(url: &str, groups: usize, per_group: usize) -> HashMap<usize, HashSet<String>> {
    let c = client();
    let mut served: HashMap<usize, HashSet<String>> = HashMap::new();
    for i in 0..per_group {
        let calls = (0..groups).map(|g| {
            let c = c.clone();
            async move { (g, generate(&c, url, &grouped_prompt(g, i)).await) }
        });
        for (g, (status, worker, _)) in futures::future::join_all(calls).await {
            assert_eq!(status, 200);
            served.entry(g).or_default().insert(worker);
        }
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_groups_each_land_on_one_worker() {
    let workers = spawn_workers(vec![sim("a"), sim("b"), sim("c")]);
    let router = start(config(&workers, PolicyKind::CacheAware)).await;
    let served = run_groups(&router.url(), 6, 8).await;
    for (g, ws) in &served {
        assert_eq!(ws.len(), 1, "group {g} was split over {ws:?}");
    }
    let used: HashSet<&String> = served.values().flatten().collect();
    assert_eq!(used.len(), 3, "six groups spread over all three workers");

    let metrics = metrics_text(&client(), &router.url()).await;
    assert!(
        metrics.contains("sgl_router_cache_hits_total 42"),
        "{metrics}"
    );
    assert!(metrics.contains("sgl_router_cache_misses_total 6"));
    assert!(metrics.contains(r#"sgl_router_requests_total{route="/generate"} 48"#));
    assert!(metrics.contains("sgl_router_routing_latency_seconds_count 48"));
    assert!(metrics.contains(r#"sgl_router_tree_size{worker=""#));
    assert!(metrics.contains(r#"sgl_router_worker_load{worker=""#));
    router.shutdown().await.unwrap();

    // Round robin splits groups, so the assertion above can fail. Four groups per round (not a
    // multiple of the three workers) so the rotation cannot line up with the groups.
    let router = start(config(&workers, PolicyKind::RoundRobin)).await;
    let served = run_groups(&router.url(), 4, 8).await;
    assert!(served.values().all(|ws| ws.len() > 1));
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_arrives_token_by_token_and_holds_load_until_it_ends() {
    let workers = spawn_workers(vec![sim("a")]);
    workers[0].hold_streams();
    let router = start(config(&workers, PolicyKind::CacheAware)).await;
    let c = client();
    let url = router.url();
    let resp = c
        .post(format!("{url}/generate"))
        .json(&json!({"text": "stream me", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.bytes_stream();
    let mut seen = String::new();
    // The worker holds token 1 until released: token 0 must arrive on its own.
    while !seen.contains("tok0") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    assert!(!seen.contains("tok1"), "{seen}");
    assert_eq!(worker_entry(&c, &url, &workers[0].url()).await["load"], 1);
    for n in 1..4 {
        workers[0].release(1);
        while !seen.contains(&format!("tok{n}")) {
            seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
        }
        assert!(!seen.contains(&format!("tok{}", n + 1)));
    }
    while let Some(chunk) = body.next().await {
        seen.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(seen.ends_with("data: [DONE]\n\n"), "{seen}");
    assert_eq!(seen.matches("data: ").count(), 5);
    assert_eq!(worker_entry(&c, &url, &workers[0].url()).await["load"], 0);
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_bodies_never_reach_a_worker() {
    let workers = spawn_workers(vec![sim("a")]);
    let mut cfg = config(&workers, PolicyKind::CacheAware);
    cfg.max_payload_size = 1024;
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    let cases: [(&str, String, u16); 6] = [
        ("/generate", "{not json".into(), 400),
        ("/generate", r#"{"sampling_params": {}}"#.into(), 400),
        ("/v1/completions", "[1, 2, 3]".into(), 400),
        ("/v1/chat/completions", r#"{"messages": []}"#.into(), 400),
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": 1}]}"#.into(),
            400,
        ),
        (
            "/generate",
            json!({"text": "x".repeat(2_000)}).to_string(),
            413,
        ),
    ];
    for (path, body, expected) in cases {
        let resp = c
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), expected, "{path} {body:.40}");
        let err: Value = resp.json().await.unwrap();
        assert!(
            err["error"]["message"].as_str().unwrap().len() > 10,
            "{err}"
        );
    }
    // No Content-Length: the limit is enforced while reading.
    let chunks = futures::stream::iter(
        (0..20).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 100]))),
    );
    let resp = c
        .post(format!("{url}/generate"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(workers[0].requests(), 0, "nothing reached the worker");
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_worker_is_a_clear_503() {
    let router = start(config(&[], PolicyKind::CacheAware)).await;
    let c = client();
    let resp = c
        .post(format!("{}/generate", router.url()))
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no healthy worker")
    );
    // The router's own health does not depend on workers: it stays ready without any.
    for path in ["/health", "/liveness", "/readiness"] {
        let resp = c
            .get(format!("{}{path}", router.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(!resp.headers().contains_key("x-sim-worker"), "{path}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["workers"], 0, "{path}");
    }
    router.shutdown().await.unwrap();

    let workers = spawn_workers(vec![sim("sick")]);
    workers[0].set_healthy(false);
    let router = start(config(&workers, PolicyKind::RoundRobin)).await;
    let (status, _, _) = generate(&c, &router.url(), "hi").await;
    assert_eq!(status, 503);
    assert_eq!(workers[0].requests(), 0);
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_everything_but_probes() {
    let workers = spawn_workers(vec![sim("a")]);
    let mut cfg = config(&workers, PolicyKind::RoundRobin);
    cfg.api_key = Some("s3cret".into());
    let router = start(cfg).await;
    let c = client();
    let url = router.url();
    let body = json!({"text": "hi"});
    let resp = c
        .post(format!("{url}/generate"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = c
        .post(format!("{url}/generate"))
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = c.get(format!("{url}/list_workers")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let resp = c
        .post(format!("{url}/generate"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    for path in ["/health", "/metrics"] {
        assert_eq!(
            c.get(format!("{url}{path}")).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
    router.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_added_listed_and_removed_through_the_api() {
    let workers = spawn_workers(vec![sim("a")]);
    let router = start(config(&[], PolicyKind::CacheAware)).await;
    let c = client();
    let url = router.url();
    let wurl = workers[0].url();

    let resp = c
        .post(format!("{url}/add_worker?url={wurl}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["healthy"], true);
    let resp = c
        .post(format!("{url}/add_worker?url={wurl}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409, "same worker, trailing slash");
    let resp = c
        .post(format!("{url}/add_worker?url=not-a-url"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = c.post(format!("{url}/add_worker")).send().await.unwrap();
    assert_eq!(resp.status(), 400);

    let listed = list_workers(&c, &url).await;
    assert_eq!(listed["urls"], json!([wurl]));
    assert_eq!(listed["policy"], "cache_aware");
    let (status, worker, _) = generate(&c, &url, "a prompt to remember").await;
    assert_eq!((status, worker.as_str()), (200, "a"));
    assert!(
        worker_entry(&c, &url, &wurl).await["tree_chars"]
            .as_u64()
            .unwrap()
            > 0
    );

    let resp = c
        .post(format!("{url}/remove_worker?url={wurl}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = c
        .post(format!("{url}/remove_worker?url={wurl}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(list_workers(&c, &url).await["urls"], json!([]));
    let (status, _, _) = generate(&c, &url, "a prompt to remember").await;
    assert_eq!(status, 503);
    let tree = router.state().policy.tree().unwrap();
    assert_eq!(
        tree.tenant_chars(&wurl),
        0,
        "a removed worker leaves the tree"
    );
    router.shutdown().await.unwrap();
}
