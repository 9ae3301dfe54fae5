//! Shared helpers: simulated workers, a router on a free loopback port, a client.
#![allow(dead_code, clippy::unwrap_used)]

pub mod engine;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sgl_router::sim::{SimConfig, SimWorker};
use sgl_router::{PolicyKind, RouterConfig, RunningRouter, launch};

pub fn sim(name: &str) -> SimConfig {
    SimConfig {
        name: name.to_string(),
        ..SimConfig::default()
    }
}

pub fn spawn_workers(configs: Vec<SimConfig>) -> Vec<SimWorker> {
    configs
        .into_iter()
        .map(|c| SimWorker::spawn(c).unwrap())
        .collect()
}

/// Router settings for tests: fast retries, one-second health checks, and no queue (a
/// request without an available worker is refused at once; `activator.rs` tests the queue).
pub fn config(workers: &[SimWorker], policy: PolicyKind) -> RouterConfig {
    RouterConfig {
        port: 0,
        worker_urls: workers.iter().map(SimWorker::url).collect(),
        policy,
        retry_initial_backoff_ms: 5,
        retry_max_backoff_ms: 50,
        health_check_interval_secs: 1,
        health_check_timeout_secs: 1,
        queue_size: 0,
        ..RouterConfig::default()
    }
}

pub async fn start(config: RouterConfig) -> RunningRouter {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    launch(config, listener).await.unwrap()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// POSTs a non-streaming /generate; returns (status, serving worker name, body).
pub async fn generate(c: &reqwest::Client, router: &str, text: &str) -> (u16, String, Value) {
    let resp = c
        .post(format!("{router}/generate"))
        .json(&json!({"text": text, "sampling_params": {"max_new_tokens": 4}}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let worker = resp
        .headers()
        .get("x-sim-worker")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, worker, body)
}

/// The router's Prometheus exposition text.
pub async fn metrics_text(c: &reqwest::Client, router: &str) -> String {
    c.get(format!("{router}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub async fn list_workers(c: &reqwest::Client, router: &str) -> Value {
    c.get(format!("{router}/list_workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Whether every worker `/list_workers` shows satisfies `pred` now.
pub async fn every_worker(
    c: &reqwest::Client,
    router: &str,
    pred: impl Fn(&Value) -> bool,
) -> bool {
    list_workers(c, router).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(pred)
}

/// The `/list_workers` entry of `url`.
pub async fn worker_entry(c: &reqwest::Client, router: &str, url: &str) -> Value {
    let all = list_workers(c, router).await;
    all["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Polls `cond` every 50 ms until it holds or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A system prompt of group `g` followed by question `i`.
pub fn grouped_prompt(g: usize, i: usize) -> String {
    format!(
        "System: You are assistant #{g}. Follow the house style guide for group {g} closely, \
         cite sources, and answer in three sentences.\nUser: question {i} for group {g}?"
    )
}
