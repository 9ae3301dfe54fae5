//! Service discovery through kube-rs against a minimal fake Kubernetes API server: Ready
//! Pods join the worker set, others leave.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use common::*;
use parking_lot::Mutex;
use serde_json::{Value, json};
use sgl_router::PolicyKind;
use sgl_router::discovery::{DiscoveryConfig, run_with_client};
use sgl_router::sim::SimWorker;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Serves `GET /api/v1/namespaces/default/pods`: a list, or a watch fed by `send`.
struct FakeApi {
    pods: Vec<Value>,
    events: broadcast::Sender<String>,
    watchers: AtomicUsize,
    selectors: Mutex<Vec<String>>,
}

async fn pods(
    State(api): State<Arc<FakeApi>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    api.selectors
        .lock()
        .push(q.get("labelSelector").cloned().unwrap_or_default());
    if q.get("watch").map(String::as_str) == Some("true") {
        let rx = api.events.subscribe();
        api.watchers.fetch_add(1, Ordering::SeqCst);
        let lines = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv()
                .await
                .ok()
                .map(|line| (Ok::<_, Infallible>(line), rx))
        });
        return Body::from_stream(lines).into_response();
    }
    Json(json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "1"},
        "items": api.pods,
    }))
    .into_response()
}

fn pod(name: &str, ip: Option<&str>, ready: bool, version: u32) -> Value {
    let mut status = json!({
        "phase": if ip.is_some() { "Running" } else { "Pending" },
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    });
    if let Some(ip) = ip {
        status["podIP"] = ip.into();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app": "sglang"},
            "resourceVersion": version.to_string(),
        },
        "status": status,
    })
}

/// Two simulated workers on 127.0.0.2 and 127.0.0.3 with the same port, as Pods would be.
fn two_workers_on_one_port() -> (SimWorker, SimWorker, u16) {
    for _ in 0..20 {
        let first = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if let Ok(second) = std::net::TcpListener::bind(("127.0.0.3", port)) {
            let a = SimWorker::start(sim("a"), first).unwrap();
            let b = SimWorker::start(sim("b"), second).unwrap();
            return (a, b, port);
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

async fn urls(c: &reqwest::Client, router: &str) -> HashSet<String> {
    list_workers(c, router).await["urls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_pods_join_and_the_rest_leave() {
    let (a, b, port) = two_workers_on_one_port();
    let (events, _) = broadcast::channel(16);
    let api = Arc::new(FakeApi {
        pods: vec![
            pod("pod-a", Some("127.0.0.2"), true, 1),
            pod("pod-b", None, false, 1),
        ],
        events,
        watchers: AtomicUsize::new(0),
        selectors: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/api/v1/namespaces/default/pods", axum::routing::get(pods))
        .with_state(api.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let router = start(config(&[], PolicyKind::RoundRobin)).await;
    let kube_client = kube::Client::try_from(kube::Config::new(api_url.parse().unwrap())).unwrap();
    let cancel = CancellationToken::new();
    let discovery = tokio::spawn(run_with_client(
        router.state().clone(),
        kube_client,
        DiscoveryConfig {
            selector: [("app".to_string(), "sglang".to_string())]
                .into_iter()
                .collect(),
            namespace: Some("default".into()),
            port,
        },
        cancel.clone(),
    ));
    let c = client();
    let url = router.url();
    let want = |list: &[&SimWorker]| -> HashSet<String> { list.iter().map(|w| w.url()).collect() };
    let limit = Duration::from_secs(10);

    assert!(eventually(limit, || async { urls(&c, &url).await == want(&[&a]) }).await);
    // A discovered worker is listed at once and routed to once its first health check passes;
    // only pod-a is ready, so pod-a serves.
    let served_by = |name: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        move || {
            let (c, url) = (c.clone(), url.clone());
            async move {
                let (status, worker, _) = generate(&c, &url, "hello").await;
                (status, worker.as_str()) == (200, name)
            }
        }
    };
    assert!(
        eventually(limit, served_by("a")).await,
        "pod-a never served"
    );

    assert!(eventually(limit, || async { api.watchers.load(Ordering::SeqCst) > 0 }).await);
    let send = |kind: &str, pod: Value| {
        api.events
            .send(format!("{}\n", json!({"type": kind, "object": pod})))
            .unwrap();
    };
    send("MODIFIED", pod("pod-b", Some("127.0.0.3"), true, 2));
    assert!(eventually(limit, || async { urls(&c, &url).await == want(&[&a, &b]) }).await);
    send("MODIFIED", pod("pod-a", Some("127.0.0.2"), false, 3));
    assert!(eventually(limit, || async { urls(&c, &url).await == want(&[&b]) }).await);
    assert!(
        eventually(limit, served_by("b")).await,
        "pod-b never served"
    );
    send("DELETED", pod("pod-b", Some("127.0.0.3"), true, 4));
    assert!(eventually(limit, || async { urls(&c, &url).await.is_empty() }).await);

    assert!(api.selectors.lock().iter().all(|s| s == "app=sglang"));
    cancel.cancel();
    discovery.await.unwrap().unwrap();
    router.shutdown().await.unwrap();
}
