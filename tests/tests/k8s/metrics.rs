//! The custom metrics API, the engines' own metrics and the HPA as the k8s end-to-end tests
//! see them (tests o1, p1 and s1).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::Cluster;

/// A metric value as the custom metrics API and the HPA's status write it (`3`, `2500m`).
pub(crate) fn quantity(value: &str) -> Result<f64, String> {
    match value.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().map(|v| v / 1000.0),
        None => value.parse::<f64>(),
    }
    .map_err(|e| format!("value {value}: {e}"))
}

/// Whether the cluster serves the custom metrics API (it does when a prometheus binary was
/// there); prints a skip otherwise, and fails with `SGL_K8S_REQUIRED=1`.
pub(crate) fn custom_metrics_served(c: &Cluster) -> bool {
    let served = c.kubectl_raw(
        &["get", "apiservice", "v1beta1.custom.metrics.k8s.io"],
        None,
    );
    if !served.status.success() {
        let why = "the test cluster serves no custom metrics API (no prometheus binary)";
        assert!(
            std::env::var(sgl_e2e_tests::k8s::cluster::REQUIRED_ENV).as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED: {why}");
        return false;
    }
    true
}

/// The numbers of one engine's `/metrics` (the first series of each name: an engine exports
/// one `model_name`).
pub(crate) async fn engine_metrics(
    http: &reqwest::Client,
    url: &str,
) -> Result<BTreeMap<String, f64>, String> {
    let text = http
        .get(url)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (Some(name), Some(value)) = (
            line.split(['{', ' ']).next(),
            line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
        ) else {
            continue;
        };
        out.entry(name.to_string()).or_insert(value);
    }
    Ok(out)
}

/// One engine number by name, or an error naming it.
pub(crate) fn engine_value(m: &BTreeMap<String, f64>, name: &str) -> Result<f64, String> {
    m.get(name)
        .copied()
        .ok_or(format!("the engine reports no {name}"))
}

/// A per-pod custom metric of one pod as the custom metrics API serves it (through the
/// aggregation layer, the adapter and Prometheus).
pub(crate) fn served_pod_metric(
    c: &Cluster,
    ns: &str,
    selector: &str,
    metric: &str,
    pod: &str,
) -> Result<f64, String> {
    let path = format!(
        "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{metric}?labelSelector={}",
        selector.replace('=', "%3D")
    );
    let out = c.kubectl_raw(&["get", "--raw", &path], None);
    if !out.status.success() {
        return Err(format!(
            "{metric}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let list: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let item = list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["describedObject"]["name"] == pod))
        .ok_or(format!("{metric}: no item for pod {pod}: {list}"))?;
    if item["metricName"] != metric || item["describedObject"]["kind"] != "Pod" {
        return Err(format!("{metric}: unexpected item {item}"));
    }
    quantity(
        item["value"]
            .as_str()
            .ok_or(format!("{metric}: no value in {item}"))?,
    )
}

/// What one engine reported just before and just after the custom metrics API was read.
pub(crate) struct EngineReadings {
    pub(crate) before: BTreeMap<String, f64>,
    pub(crate) after: BTreeMap<String, f64>,
}

/// Whether the custom metrics API's value of `metric` is what the adapter's rule makes of the
/// engine's own numbers (before and after the read: the API serves a scrape at most a few
/// seconds old, and the engine keeps decoding). Every metric the operator's HPA reads must
/// have a check here, so a metric added to the HPA without one fails the test.
pub(crate) fn check_served_metric(
    metric: &str,
    served: f64,
    e: &EngineReadings,
) -> Result<(), String> {
    // The adapter writes values in thousandths, truncated.
    const MILLI: f64 = 0.001;
    // How far the KV use may grow between the scrape the API serves and the read before it.
    const DRIFT: f64 = 0.05;
    let value = |m: &BTreeMap<String, f64>, name: &str| engine_value(m, name);
    // The hit rate over the rule's 2-minute window: the engine's counters since it started,
    // as long as the counters stood still around the read (the window holds the scrape
    // before any request, with both counters at 0).
    let hit_rate = || -> Result<f64, String> {
        let (cached, prompt) = (
            value(&e.before, "sglang:cached_tokens_total")?,
            value(&e.before, "sglang:prompt_tokens_total")?,
        );
        if value(&e.after, "sglang:cached_tokens_total")? != cached
            || value(&e.after, "sglang:prompt_tokens_total")? != prompt
        {
            return Err("the engine's token counters moved during the read".into());
        }
        if cached <= 0.0 || prompt <= 0.0 {
            return Err(format!(
                "no cache hits yet ({cached} of {prompt} prompt tokens)"
            ));
        }
        Ok((cached / prompt).min(1.0))
    };
    let usage = (
        value(&e.before, "sglang:token_usage")?,
        value(&e.after, "sglang:token_usage")?,
    );
    let (ok, expected) = match metric {
        // Requests waiting: the engine's own gauge, exactly.
        "sglang_num_queue_reqs" => {
            let (before, after) = (
                value(&e.before, "sglang:num_queue_reqs")?,
                value(&e.after, "sglang:num_queue_reqs")?,
            );
            (
                served > 0.0 && served == before && served == after,
                format!("{before} (before) and {after} (after), above 0"),
            )
        }
        // KV utilisation: the engine's gauge at the scrape, between what it was a little
        // before the read and what it is after.
        "sglang_token_usage" => (
            served > 0.0 && served >= usage.0 - DRIFT && served <= usage.1 + MILLI,
            format!("above 0, in {:.3} - {DRIFT} ..= {:.3}", usage.0, usage.1),
        ),
        // Windowed hit rate times the busy share of the window: above 0 while cache hits
        // are served, never above the hit rate.
        "sglang_scale_down_brake" => {
            let hit = hit_rate()?;
            (
                served > 0.0 && served <= hit + MILLI,
                format!("in 0 <..= the hit rate {hit:.3}"),
            )
        }
        // Miss rate weighted by KV utilisation.
        "sglang_cache_miss_rate" => {
            let miss = 1.0 - hit_rate()?;
            let (lo, hi) = (
                (usage.0 - DRIFT).max(0.0) * miss - MILLI,
                usage.1 * miss + MILLI,
            );
            (
                served > 0.0 && served >= lo && served <= hi,
                format!("above 0, in {lo:.3} ..= {hi:.3} (KV use x miss rate {miss:.3})"),
            )
        }
        other => {
            return Err(format!(
                "the HPA reads {other}, which this test has no check for"
            ));
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{metric} is served as {served}, expected {expected}"
        ))
    }
}

/// Sends the same `/generate` request to an engine, one after another, until aborted.
pub(crate) fn same_prompt_loop(
    http: reqwest::Client,
    url: String,
    body: Value,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let sent = http
                .post(&url)
                .json(&body)
                .timeout(Duration::from_secs(300))
                .send()
                .await;
            if !matches!(&sent, Ok(r) if r.status().is_success()) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if let Ok(r) = sent {
                let _ = r.bytes().await;
            }
        }
    })
}

/// What the test sees of one autoscaled service at a moment.
pub(crate) struct Scaling {
    /// `spec.dpSize`, which the HPA sets through the scale subresource.
    pub(crate) dp_size: i32,
    /// The HPA's `status.desiredReplicas` while it reads its metrics (`ScalingActive`).
    pub(crate) desired: Option<i32>,
    /// The HPA's `ScalingActive` condition: status and reason.
    pub(crate) active: Option<(String, String)>,
    /// The queue metric's average per pod as the HPA last read it.
    pub(crate) queue: Option<String>,
    /// The HPA's `ScaledToZero` condition (with minReplicas 0): `True` once it took the
    /// service to zero itself, which is when it may bring it back.
    pub(crate) scaled_to_zero: Option<String>,
}

/// What an HPA's status says, as the tests read it.
#[derive(Debug, Default)]
pub(crate) struct HpaReading {
    /// The `ScalingActive` condition's status and reason.
    pub(crate) active: Option<(String, String)>,
    /// `desiredReplicas`, only while `ScalingActive` is `True`: a recommendation only once
    /// metrics were read (it is 0 before the first sync, and while the controller cannot reach
    /// the scale subresource yet).
    pub(crate) desired: Option<i32>,
    /// `currentReplicas`.
    pub(crate) current: Option<i32>,
    /// The `ScaledToZero` condition's status (with minReplicas 0).
    pub(crate) scaled_to_zero: Option<String>,
    /// Each Pods metric's average per pod as the HPA last read it, as written (`2500m`).
    pub(crate) pods: BTreeMap<String, String>,
}

impl HpaReading {
    pub(crate) fn of(hpa: Option<HorizontalPodAutoscaler>) -> Self {
        let Some(status) = hpa.and_then(|h| h.status) else {
            return Self::default();
        };
        let condition = |kind: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == kind)
                .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        };
        let active = condition("ScalingActive");
        let valid = active.as_ref().is_some_and(|(status, _)| status == "True");
        let pods = status
            .current_metrics
            .iter()
            .flatten()
            .filter_map(|m| {
                let p = m.pods.as_ref()?;
                let v = p.current.average_value.as_ref()?;
                Some((p.metric.name.clone(), v.0.clone()))
            })
            .collect();
        Self {
            desired: valid.then_some(status.desired_replicas),
            current: status.current_replicas,
            scaled_to_zero: condition("ScaledToZero").map(|(s, _)| s),
            active,
            pods,
        }
    }
}

/// Samples a service and its HPA once a second, keeping a history of what changed for the
/// failure messages (with `kubectl describe hpa`: conditions, metrics and events).
pub(crate) struct ScalingWatch<'a> {
    pub(crate) c: &'a Cluster,
    pub(crate) services: Api<SGLangService>,
    pub(crate) hpas: Api<HorizontalPodAutoscaler>,
    pub(crate) ns: &'a str,
    pub(crate) name: &'a str,
    pub(crate) started: std::time::Instant,
    pub(crate) last: String,
    pub(crate) history: Vec<String>,
}

impl<'a> ScalingWatch<'a> {
    pub(crate) fn new(c: &'a Cluster, client: &Client, ns: &'a str, name: &'a str) -> Self {
        Self {
            c,
            services: Api::namespaced(client.clone(), ns),
            hpas: Api::namespaced(client.clone(), ns),
            ns,
            name,
            started: std::time::Instant::now(),
            last: String::new(),
            history: Vec::new(),
        }
    }

    async fn sample(&mut self) -> Result<Scaling, String> {
        let svc = self
            .services
            .get(self.name)
            .await
            .map_err(|e| e.to_string())?;
        let hpa = self
            .hpas
            .get_opt(&format!("{}-engine", self.name))
            .await
            .map_err(|e| e.to_string())?;
        let r = HpaReading::of(hpa);
        let s = Scaling {
            dp_size: svc.spec.dp_size,
            desired: r.desired,
            queue: r.pods.get(QUEUE_METRIC).cloned(),
            active: r.active,
            scaled_to_zero: r.scaled_to_zero,
        };
        let line = format!(
            "dpSize {} desired {:?} ScalingActive {:?} queue {:?} ScaledToZero {:?}",
            s.dp_size, s.desired, s.active, s.queue, s.scaled_to_zero
        );
        if line != self.last {
            let at = self.started.elapsed().as_secs_f64();
            self.history.push(format!("{at:6.1} s  {line}"));
            self.last = line;
        }
        Ok(s)
    }

    pub(crate) fn report(&self) -> String {
        let describe = self
            .c
            .kubectl_raw(&["describe", "hpa", "-n", self.ns], None);
        format!(
            "what the test saw (seconds since the service was applied):\n{}\n\
             kubectl describe hpa:\n{}{}",
            self.history.join("\n"),
            String::from_utf8_lossy(&describe.stdout),
            String::from_utf8_lossy(&describe.stderr)
        )
    }

    /// Samples once a second until `check` says done (`Ok(true)`); fails at once on
    /// `Err`, and after `timeout`, with the history and the HPA's description.
    pub(crate) async fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Scaling) -> Result<bool, String>,
    ) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let last = match self.sample().await {
                Ok(s) => match check(&s) {
                    Ok(true) => return,
                    Ok(false) => "not yet".to_string(),
                    Err(e) => panic!("{what}: {e}\n{}", self.report()),
                },
                Err(e) => e,
            };
            if std::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what} ({last})\n{}",
                    self.report()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The queue metric the operator's HPA reads (the test checks the HPA's own spec for it too).
pub(crate) const QUEUE_METRIC: &str = "sglang_num_queue_reqs";

/// Sends `/generate` requests to an engine, one after another, each with a prompt that starts
/// with a number of its own (so no two share a cached prefix), until aborted (which closes
/// the connection, and the engine drops the request). Counts the answered requests.
pub(crate) fn generate_loop(
    http: reqwest::Client,
    url: String,
    first: usize,
    max_new_tokens: u32,
    pause: Duration,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in first.. {
            let body = json!({
                "text": format!("{i} is the number of the lighthouse. Tell its long story."),
                "sampling_params": {
                    "max_new_tokens": max_new_tokens,
                    "temperature": 0,
                    "ignore_eos": true,
                },
            });
            let sent = http
                .post(&url)
                .json(&body)
                .timeout(Duration::from_secs(300))
                .send()
                .await;
            let ok = match sent {
                Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                Err(_) => false,
            };
            if ok {
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            } else {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            tokio::time::sleep(pause).await;
        }
    })
}

/// The router's waiting requests as the operator's HPA reads them with minReplicas 0 (an
/// Object metric of the router's Service, from the chart's adapter rules).
pub(crate) const ROUTER_WAITING_METRIC: &str = "sgl_router_has_pending_requests";
