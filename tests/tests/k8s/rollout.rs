//! Streaming load through a router, as a client sees it during a rollout: each stream is
//! complete (its `finish_reason` and `[DONE]` arrived), failed (no stream: a connection error
//! or an error status) or truncated (the stream began but ended without `[DONE]`, broke off,
//! or carried an error event).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sgl_e2e_tests::k8s::cluster::{Cluster, WAIT, wait_for};

use crate::common::pod_ready;

/// How one stream ended.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    Complete,
    Failed(String),
    Truncated(String),
}

/// One stream as its client saw it.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    pub took: Duration,
    pub ended_at: SystemTime,
    pub outcome: Outcome,
}

/// The served model name of the service under test.
pub(crate) const MODEL: &str = "rolling";

/// Streams one chat completion of exactly `max_tokens` tokens from `http://{ip}:30000`;
/// `first_byte` is set when its first event arrives.
pub(crate) async fn stream_chat(
    http: &reqwest::Client,
    ip: &str,
    max_tokens: u32,
    prompt: &str,
    first_byte: Option<&AtomicBool>,
) -> Record {
    let started = Instant::now();
    let outcome = stream_outcome(http, ip, max_tokens, prompt, first_byte).await;
    Record {
        took: started.elapsed(),
        ended_at: SystemTime::now(),
        outcome,
    }
}

async fn stream_outcome(
    http: &reqwest::Client,
    ip: &str,
    max_tokens: u32,
    prompt: &str,
    first_byte: Option<&AtomicBool>,
) -> Outcome {
    let sent = http
        .post(format!("http://{ip}:30000/v1/chat/completions"))
        .json(&json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": true,
            "stream": true,
        }))
        .timeout(Duration::from_secs(300))
        .send()
        .await;
    let mut resp = match sent {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("request: {e}")),
    };
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return Outcome::Failed(format!("{status}: {body}"));
    }
    let mut buf = String::new();
    let mut finished = false;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => return Outcome::Truncated(format!("body broke off: {e}")),
        };
        if let Some(flag) = first_byte {
            flag.store(true, Ordering::Release);
        }
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                return if finished {
                    Outcome::Complete
                } else {
                    Outcome::Truncated("[DONE] without a finish_reason".into())
                };
            }
            let event: Value = match serde_json::from_str(data) {
                Ok(v) => v,
                Err(e) => return Outcome::Truncated(format!("bad event {data:?}: {e}")),
            };
            if event.get("error").is_some() {
                return Outcome::Truncated(format!("error event: {event}"));
            }
            finished |= event["choices"][0]["finish_reason"].is_string();
        }
    }
    Outcome::Truncated("the stream ended without [DONE]".into())
}

/// Clients that each stream one completion after another through the router until stopped.
pub(crate) struct StreamLoad {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    records: Arc<Mutex<Vec<Record>>>,
}

impl StreamLoad {
    pub(crate) fn start(http: &reqwest::Client, ip: &str, clients: usize, max_tokens: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..clients)
            .map(|k| {
                let (http, ip) = (http.clone(), ip.to_string());
                let (stop, records) = (stop.clone(), records.clone());
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Acquire) {
                        let prompt = format!("Client {k}, request {i}: tell a long story.");
                        let r = stream_chat(&http, &ip, max_tokens, &prompt, None).await;
                        records.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                        i += 1;
                    }
                })
            })
            .collect();
        Self {
            stop,
            tasks,
            records,
        }
    }

    pub(crate) fn records(&self) -> Vec<Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Lets every client finish the stream it is reading, then returns all records.
    pub(crate) async fn stop(mut self) -> Vec<Record> {
        self.stop.store(true, Ordering::Release);
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        self.records()
    }
}

/// Complete, failed and truncated streams among `records`, with the first problem of each.
pub(crate) fn tally(records: &[Record]) -> (usize, Vec<String>, Vec<String>) {
    let mut complete = 0;
    let (mut failed, mut truncated) = (Vec::new(), Vec::new());
    for r in records {
        match &r.outcome {
            Outcome::Complete => complete += 1,
            Outcome::Failed(why) => failed.push(why.clone()),
            Outcome::Truncated(why) => truncated.push(why.clone()),
        }
    }
    (complete, failed, truncated)
}

/// The engine pods of service `name` (ready or not, terminating included).
pub(crate) async fn engine_pods(client: &Client, ns: &str, name: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("serving.sgl-rs.io/engine={name}"));
    pods.list(&lp).await.map(|l| l.items).unwrap_or_default()
}

/// Waits until the engine Deployment of `name` has rolled out: its status counts `dp`
/// updated, ready replicas and no others, and exactly `dp` engine pods exist, all ready, none
/// terminating, each passing `new` (the new template). Returns the time it took.
pub(crate) async fn wait_rolled_out(
    c: &Cluster,
    client: &Client,
    ns: &str,
    name: &str,
    dp: usize,
    new: impl Fn(&Pod) -> bool,
) -> Duration {
    let t0 = Instant::now();
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let what = format!("{ns}/{name}: {dp} engines of the new template, the old ones gone");
    wait_for(&what, WAIT, || async {
        let d = deploys
            .get(&format!("{name}-engine"))
            .await
            .map_err(|e| e.to_string())?;
        let s = d.status.clone().unwrap_or_default();
        let seen = s.observed_generation >= d.metadata.generation;
        let dp32 = dp as i32;
        let counts_done = seen
            && s.updated_replicas == Some(dp32)
            && s.ready_replicas == Some(dp32)
            && s.replicas == Some(dp32);
        let pods = engine_pods(client, ns, name).await;
        let done = counts_done
            && pods.len() == dp
            && pods
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p) && new(p));
        done.then_some(()).ok_or_else(|| {
            let states: Vec<String> = pods
                .iter()
                .map(|p| {
                    format!(
                        "{} ready={} new={} deleting={}",
                        p.name_any(),
                        pod_ready(p),
                        new(p),
                        p.metadata.deletion_timestamp.is_some()
                    )
                })
                .collect();
            format!(
                "status {s:?}; pods {states:?}; runner log:\n{}",
                c.log_tail("pod-runner", 10)
            )
        })
    })
    .await;
    t0.elapsed()
}

/// When the engine of a pod logged that it got its stop signal (the timestamp that starts its
/// "shutting down" log line).
pub(crate) fn stop_signal_time(log: &str) -> Option<SystemTime> {
    let line = log.lines().find(|l| l.contains("shutting down"))?;
    // Log lines may carry terminal colours: the timestamp is the first word without them.
    let mut plain = String::new();
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(ch);
        }
    }
    let stamp: k8s_openapi::jiff::Timestamp = plain.split_whitespace().next()?.parse().ok()?;
    Some(SystemTime::from(stamp))
}

/// The image of a pod's engine container.
pub(crate) fn engine_image(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "engine"))
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// The arguments of a pod's engine container.
pub(crate) fn engine_args(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == "engine"))
        .and_then(|c| c.args.clone())
        .unwrap_or_default()
}
