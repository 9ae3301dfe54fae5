//! Kubernetes service discovery: watch the Pods matching a label selector and keep the
//! worker set equal to the Ready ones.
//!
//! A Pod is a worker when it is Running, its `Ready` condition is true, it has a Pod IP and
//! it is not being deleted; its URL is `http://<podIP>:<--service-discovery-port>`. Every
//! other Pod (pending, not ready, terminating, deleted) is removed from the worker set.
//! After a watch restart the full listing replaces what was known, so Pods deleted while
//! the watch was down are removed too. The router needs `get`, `list` and `watch` on Pods.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::app::AppState;
use crate::error::{Result, RouterError};

#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    pub selector: BTreeMap<String, String>,
    pub namespace: Option<String>,
    pub port: u16,
}

impl DiscoveryConfig {
    /// The selector in Kubernetes' `k1=v1,k2=v2` form.
    pub fn label_selector(&self) -> String {
        self.selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The worker URL of `pod`, if it should receive traffic now.
pub fn pod_url(pod: &Pod, port: u16) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready = status
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    let ip = status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    // IPv6 addresses need brackets in a URL.
    if ip.contains(':') {
        Some(format!("http://[{ip}]:{port}"))
    } else {
        Some(format!("http://{ip}:{port}"))
    }
}

/// A change to apply to the worker set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Add(String),
    Remove(String),
}

/// Which Pods currently provide which worker URL; turns watch events into changes.
#[derive(Debug)]
pub struct PodTracker {
    port: u16,
    pods: HashMap<String, String>,
    /// Pods listed since the last `Init`, while a relist is in progress.
    relisted: Option<HashSet<String>>,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

impl PodTracker {
    pub fn new(port: u16) -> Self {
        Self {
            port,
            pods: HashMap::new(),
            relisted: None,
        }
    }

    fn url_in_use(&self, url: &str) -> bool {
        self.pods.values().any(|u| u == url)
    }

    fn set(&mut self, key: String, url: Option<String>) -> Vec<Change> {
        let old = match &url {
            Some(u) => self.pods.insert(key, u.clone()),
            None => self.pods.remove(&key),
        };
        if old == url {
            return Vec::new();
        }
        let mut changes = Vec::new();
        if let Some(old) = old
            && !self.url_in_use(&old)
        {
            changes.push(Change::Remove(old));
        }
        if let Some(new) = url
            && self.pods.values().filter(|u| **u == new).count() == 1
        {
            changes.push(Change::Add(new));
        }
        changes
    }

    /// A Pod was added or changed.
    pub fn apply(&mut self, pod: &Pod) -> Vec<Change> {
        let url = pod_url(pod, self.port);
        self.set(pod_key(pod), url)
    }

    pub fn delete(&mut self, pod: &Pod) -> Vec<Change> {
        self.set(pod_key(pod), None)
    }

    /// The watch restarted: a full listing follows.
    pub fn init(&mut self) {
        self.relisted = Some(HashSet::new());
    }

    pub fn init_apply(&mut self, pod: &Pod) -> Vec<Change> {
        if let Some(seen) = &mut self.relisted {
            seen.insert(pod_key(pod));
        }
        self.apply(pod)
    }

    /// The listing is complete: Pods it did not contain are gone.
    pub fn init_done(&mut self) -> Vec<Change> {
        let Some(seen) = self.relisted.take() else {
            return Vec::new();
        };
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.into_iter().flat_map(|k| self.set(k, None)).collect()
    }

    pub fn handle(&mut self, event: Event<Pod>) -> Vec<Change> {
        match event {
            Event::Apply(p) => self.apply(&p),
            Event::Delete(p) => self.delete(&p),
            Event::Init => {
                self.init();
                Vec::new()
            }
            Event::InitApply(p) => self.init_apply(&p),
            Event::InitDone => self.init_done(),
        }
    }
}

async fn apply_change(state: &AppState, change: Change) {
    match change {
        Change::Add(url) => match state.add_worker(&url).await {
            Ok(_) | Err(RouterError::WorkerExists(_)) => {}
            Err(e) => tracing::warn!(%url, error = %e, "could not add discovered worker"),
        },
        Change::Remove(url) => match state.remove_worker(&url) {
            Ok(_) | Err(RouterError::WorkerNotFound(_)) => {}
            Err(e) => tracing::warn!(%url, error = %e, "could not remove worker"),
        },
    }
}

/// Watches Pods until `cancel` fires, applying changes to the worker set. The client comes
/// from the in-cluster service account or the local kubeconfig.
pub async fn run(
    state: AppState,
    config: DiscoveryConfig,
    cancel: CancellationToken,
) -> Result<()> {
    let client = Client::try_default()
        .await
        .map_err(|e| RouterError::Discovery(format!("no Kubernetes client configuration: {e}")))?;
    run_with_client(state, client, config, cancel).await
}

/// [`run`] with a given Kubernetes client.
pub async fn run_with_client(
    state: AppState,
    client: Client,
    config: DiscoveryConfig,
    cancel: CancellationToken,
) -> Result<()> {
    let api: Api<Pod> = match &config.namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let selector = config.label_selector();
    tracing::info!(%selector, namespace = ?config.namespace, "watching worker pods");
    let stream =
        watcher::watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut tracker = PodTracker::new(config.port);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            next = stream.next() => next,
        };
        match next {
            None => return Err(RouterError::Discovery("the pod watch ended".into())),
            Some(Err(e)) => tracing::warn!(error = %e, "pod watch failed; retrying with backoff"),
            Some(Ok(event)) => {
                for change in tracker.handle(event) {
                    apply_change(&state, change).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: Option<&str>, phase: &str, ready: bool) -> Pod {
        let mut status = serde_json::json!({
            "phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        });
        if let Some(ip) = ip {
            status["podIP"] = ip.into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": "sglang"}},
            "status": status,
        }))
        .unwrap()
    }

    fn terminating(mut p: Pod) -> Pod {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        p
    }

    #[test]
    fn only_running_ready_pods_with_an_ip_are_workers() {
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.1"), "Running", true), 30000).as_deref(),
            Some("http://10.0.0.1:30000")
        );
        assert_eq!(
            pod_url(&pod("a", Some("fd00::1"), "Running", true), 80).as_deref(),
            Some("http://[fd00::1]:80")
        );
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.1"), "Running", false), 80),
            None
        );
        assert_eq!(
            pod_url(&pod("a", Some("10.0.0.1"), "Pending", true), 80),
            None
        );
        assert_eq!(pod_url(&pod("a", None, "Running", true), 80), None);
        assert_eq!(
            pod_url(
                &terminating(pod("a", Some("10.0.0.1"), "Running", true)),
                80
            ),
            None
        );
    }

    #[test]
    fn pods_becoming_ready_and_unready_add_and_remove_workers() {
        let mut t = PodTracker::new(8000);
        assert_eq!(t.apply(&pod("a", None, "Pending", false)), []);
        assert_eq!(
            t.apply(&pod("a", Some("10.0.0.1"), "Running", true)),
            [Change::Add("http://10.0.0.1:8000".into())]
        );
        assert_eq!(
            t.apply(&pod("a", Some("10.0.0.1"), "Running", true)),
            [],
            "no change"
        );
        assert_eq!(
            t.apply(&pod("a", Some("10.0.0.1"), "Running", false)),
            [Change::Remove("http://10.0.0.1:8000".into())]
        );
        t.apply(&pod("b", Some("10.0.0.2"), "Running", true));
        assert_eq!(
            t.apply(&terminating(pod("b", Some("10.0.0.2"), "Running", true))),
            [Change::Remove("http://10.0.0.2:8000".into())]
        );
        t.apply(&pod("c", Some("10.0.0.3"), "Running", true));
        assert_eq!(
            t.delete(&pod("c", Some("10.0.0.3"), "Running", true)),
            [Change::Remove("http://10.0.0.3:8000".into())]
        );
    }

    #[test]
    fn a_relist_removes_pods_that_vanished_while_the_watch_was_down() {
        let mut t = PodTracker::new(80);
        t.handle(Event::Apply(pod("a", Some("10.0.0.1"), "Running", true)));
        t.handle(Event::Apply(pod("b", Some("10.0.0.2"), "Running", true)));
        t.handle(Event::Init);
        assert_eq!(
            t.handle(Event::InitApply(pod(
                "a",
                Some("10.0.0.1"),
                "Running",
                true
            ))),
            []
        );
        assert_eq!(
            t.handle(Event::InitApply(pod(
                "c",
                Some("10.0.0.3"),
                "Running",
                true
            ))),
            [Change::Add("http://10.0.0.3:80".into())]
        );
        assert_eq!(
            t.handle(Event::InitDone),
            [Change::Remove("http://10.0.0.2:80".into())]
        );
    }

    #[test]
    fn a_reused_ip_is_removed_only_when_no_pod_serves_it() {
        let mut t = PodTracker::new(80);
        t.apply(&pod("old", Some("10.0.0.9"), "Running", true));
        // A new pod got the same IP before the old one's deletion arrived.
        assert_eq!(t.apply(&pod("new", Some("10.0.0.9"), "Running", true)), []);
        assert_eq!(t.delete(&pod("old", Some("10.0.0.9"), "Running", true)), []);
        assert_eq!(
            t.delete(&pod("new", Some("10.0.0.9"), "Running", true)),
            [Change::Remove("http://10.0.0.9:80".into())]
        );
    }

    #[test]
    fn selector_renders_in_kubernetes_form() {
        let cfg = DiscoveryConfig {
            selector: [
                ("app".to_string(), "sglang".to_string()),
                ("tier".into(), "gpu".into()),
            ]
            .into_iter()
            .collect(),
            namespace: None,
            port: 80,
        };
        assert_eq!(cfg.label_selector(), "app=sglang,tier=gpu");
    }
}
