//! A shared-prefix workload through the operator's HPA does not oscillate (p2).
//!
//! Every request shares one long prefix and differs only in its last sentence, so the
//! engines' radix caches serve most prompt tokens and the scale-down brake (the windowed hit
//! rate times the busy share) reads high. The service goes through three phases, sampled once
//! a second (the service's `dpSize`, the engine Deployment's replicas, the HPA's status and
//! each metric's average as the HPA read it, and every fifth second each engine's brake as
//! the custom metrics API serves it):
//!
//! 1. two clients: the engine is busy and its cache warm, and one request waits, below the
//!    queue target: the cache signals must not add a replica (two rather than one, so the
//!    engine is busy whatever the machine's load: the brake's 2-minute window still holds this
//!    phase when phase 2 decides, and one client's gaps between requests, long on a loaded
//!    machine, lowered it there);
//! 2. seven clients (one request runs per engine, the rest wait): up to three engines, then a
//!    minute of the same load, while the two new engines warm their caches: the replicas
//!    never go down (the load alone would ask for two at three engines and for three at two:
//!    only the brake keeps the count still);
//! 3. no clients: back to one engine, never up again.
//!
//! Over the whole run the count changes direction once (up, then down), and the HPA's events
//! name a load metric, never a cache one, for every scale-up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::{Cluster, WAIT, wait_for};

use crate::common::{
    delete_service, ensure_chart, ensure_namespace, pod_ip, ready_pods, router_pods,
    wait_ready_pods, wait_serving,
};
use crate::metrics::{
    HpaReading, QUEUE_METRIC, custom_metrics_served, engine_metrics, engine_value, quantity,
};

/// The scale-down brake the operator's HPA reads (the service's hit rate x its engines' busy
/// share, served for each engine).
const BRAKE_METRIC: &str = "sglang_scale_down_brake";
/// KV cache utilisation per engine.
const KV_METRIC: &str = "sglang_token_usage";
/// The metrics that measure load, which may add engines.
const LOAD_METRICS: [&str; 2] = [QUEUE_METRIC, KV_METRIC];
/// The cache's metrics (the brake, and the miss rate weighted by KV use with
/// `targetCacheHitRate`), which must never add one to this load.
const CACHE_METRICS: [&str; 2] = [BRAKE_METRIC, "sglang_cache_miss_rate"];
const MAX_REPLICAS: i32 = 3;
/// Closed-loop clients under load. With one running request per engine, 7 leave 6 waiting
/// at one engine (the queue target 2 asks for 3 engines), 4 at three (1.33 per engine: the
/// load alone asks for 2) and 5 at two (2.5 per engine: it asks for 3 again). Without a
/// brake that holds warm, busy engines, this load goes 3, 2, 3, 2, ...
const CLIENTS: usize = 7;
/// How long the load is held once three engines are ready: more than the scale-down
/// window (5 s) many times over, and long enough for the new engines' caches to warm.
const HOLD: Duration = Duration::from_secs(60);

/// The prefix every prompt shares (about 300 tokens), as a system prompt or a document
/// that many questions are asked about.
const PREFIX: &str = "You keep the log of the old lighthouse on the northern cape. Every \
    evening you write down the weather, the height of the tide, the ships that passed and \
    the state of the lamp. The log is read by the harbour master, who wants short, plain \
    answers: no greetings, no lists, one paragraph at most. When a question asks about a \
    day, answer from what a keeper would have seen from the gallery: the colour of the sea, \
    the wind and where it came from, the fishing boats going out before dawn and coming \
    back at noon, the ferry to the island, the freighters far out on the horizon, the gulls \
    on the rocks below, the fog that comes in from the east in late summer and the storms \
    of the autumn that shake the glass of the lantern room. The lamp burns oil and must be \
    trimmed every four hours; the lens turns on a clockwork that is wound at dusk and at \
    midnight. The keeper lives alone with a dog and a cat, grows potatoes behind the \
    house, and rows to the village once a week for bread, oil and letters. Keep to these \
    facts, and when you do not know something, say what the keeper would have guessed.\n\n";

/// One moment of the service and its HPA.
#[derive(Clone, Debug)]
struct Sample {
    /// Seconds since the service was applied.
    at: f64,
    dp_size: i32,
    /// The engine Deployment's `spec.replicas`.
    engines: Option<i32>,
    /// The HPA's `status.currentReplicas`.
    current: Option<i32>,
    /// The HPA's `status.desiredReplicas` while it reads its metrics (`ScalingActive`).
    desired: Option<i32>,
    /// Each Pods metric's average per engine, as the HPA last read it.
    metrics: BTreeMap<String, f64>,
    /// Each engine's brake as the custom metrics API serves it (every fifth sample).
    brakes: Option<BTreeMap<String, f64>>,
}

impl Sample {
    fn line(&self) -> String {
        let metric = |m: &str| {
            self.metrics
                .get(m)
                .map_or("-".to_string(), |v| format!("{v:.3}"))
        };
        let mut line = format!(
            "{:6.1} s  dpSize {} engines {:?} HPA {:?} -> {:?}  queue {} kv {} brake {} miss {}",
            self.at,
            self.dp_size,
            self.engines,
            self.current,
            self.desired,
            metric(QUEUE_METRIC),
            metric(KV_METRIC),
            metric(BRAKE_METRIC),
            metric("sglang_cache_miss_rate"),
        );
        if let Some(b) = &self.brakes {
            let per_pod: Vec<String> = b
                .iter()
                .map(|(pod, v)| format!("{}={v:.3}", pod.rsplit('-').next().unwrap_or(pod)))
                .collect();
            line.push_str(&format!("  brake per engine [{}]", per_pod.join(" ")));
        }
        line
    }
}

/// Samples the service once a second in the background, keeping every sample.
struct Sampler {
    c: &'static Cluster,
    ns: &'static str,
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(
        c: &'static Cluster,
        client: &Client,
        ns: &'static str,
        name: &'static str,
        applied: Instant,
    ) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let services: Api<SGLangService> = Api::namespaced(client.clone(), ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
        let task = {
            let samples = samples.clone();
            tokio::spawn(async move {
                let engine = format!("{name}-engine");
                for n in 0usize.. {
                    let next = tokio::time::Instant::now() + Duration::from_secs(1);
                    let brakes = if n % 5 == 0 {
                        tokio::task::spawn_blocking(move || served_brakes(c, ns, name))
                            .await
                            .ok()
                            .flatten()
                    } else {
                        None
                    };
                    if let (Ok(svc), Ok(dep), Ok(hpa)) = (
                        services.get(name).await,
                        deployments.get_opt(&engine).await,
                        hpas.get_opt(&engine).await,
                    ) {
                        let r = HpaReading::of(hpa);
                        let sample = Sample {
                            at: applied.elapsed().as_secs_f64(),
                            dp_size: svc.spec.dp_size,
                            engines: dep.and_then(|d| d.spec.replicas),
                            current: r.current,
                            desired: r.desired,
                            metrics: r
                                .pods
                                .iter()
                                .filter_map(|(k, v)| Some((k.clone(), quantity(v).ok()?)))
                                .collect(),
                            brakes,
                        };
                        samples
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(sample);
                    }
                    tokio::time::sleep_until(next).await;
                }
            })
        };
        Self {
            c,
            ns,
            samples,
            task,
        }
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every sample (the changes only, and every per-engine brake reading) and the HPA's
    /// description, for the failure messages and the log.
    fn report(&self) -> String {
        let mut last = String::new();
        let mut lines = Vec::new();
        for s in self.samples() {
            let line = s.line();
            // The time is the line's first 10 characters; keep a sample when anything else changed.
            let key = line.get(10..).unwrap_or_default().to_string();
            if key != last || s.brakes.is_some() {
                lines.push(line);
                last = key;
            }
        }
        let describe = self
            .c
            .kubectl_raw(&["describe", "hpa", "-n", self.ns], None);
        format!(
            "what the test saw (seconds since the service was applied):\n{}\n\
             kubectl describe hpa:\n{}{}",
            lines.join("\n"),
            String::from_utf8_lossy(&describe.stdout),
            String::from_utf8_lossy(&describe.stderr)
        )
    }

    /// Waits (checking every second) until `check` says done; fails at once on `Err` and
    /// after `timeout`, with the report.
    async fn until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&[Sample]) -> Result<bool, String>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let samples = self.samples();
            match check(&samples) {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => panic!("{what}: {e}\n{}", self.report()),
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.report()
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Each engine's brake as the custom metrics API serves it (what the HPA averages).
fn served_brakes(c: &Cluster, ns: &str, name: &str) -> Option<BTreeMap<String, f64>> {
    let path = format!(
        "/apis/custom.metrics.k8s.io/v1beta1/namespaces/{ns}/pods/*/{BRAKE_METRIC}?labelSelector=serving.sgl-rs.io%2Fengine%3D{name}"
    );
    let out = c.kubectl_raw(&["get", "--raw", &path], None);
    let list: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .filter_map(|i| {
                let pod = i["describedObject"]["name"].as_str()?.to_string();
                Some((pod, quantity(i["value"].as_str()?).ok()?))
            })
            .collect(),
    )
}

/// Where a count moved against `rising` (down while it should only rise, or up while it
/// should only fall) among the samples from `from` seconds on.
fn reversal(samples: &[Sample], from: f64, rising: bool) -> Option<String> {
    let counts = |s: &Sample| {
        [
            ("dpSize", Some(s.dp_size)),
            ("the engine Deployment", s.engines),
        ]
    };
    let mut prev: Option<&Sample> = None;
    for s in samples.iter().filter(|s| s.at >= from) {
        if let Some(p) = prev {
            for ((what, before), (_, now)) in counts(p).into_iter().zip(counts(s)) {
                if let (Some(before), Some(now)) = (before, now)
                    && (if rising { now < before } else { now > before })
                {
                    return Some(format!(
                        "{what} went from {before} to {now} at {:.1} s",
                        s.at
                    ));
                }
            }
        }
        prev = Some(s);
    }
    None
}

/// The messages of the HPA's `SuccessfulRescale` events (`New size: 3; reason: pods metric
/// sglang_num_queue_reqs above target`), oldest first.
async fn rescale_events(client: &Client, ns: &str, hpa: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={hpa},reason=SuccessfulRescale"
        )))
        .await
        .unwrap_or_else(|e| panic!("the HPA's events: {e}"));
    let mut found: Vec<(String, String)> = list
        .items
        .into_iter()
        .map(|e| {
            let at = e
                .last_timestamp
                .or(e.first_timestamp)
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            (at, e.message.unwrap_or_default())
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, m)| m).collect()
}

/// Sends `/generate` requests through the router, one after another, each the shared prefix
/// and a question of its own, until aborted. Counts the answered and the refused.
fn prefix_client(
    http: reqwest::Client,
    url: String,
    client: usize,
    answered: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 0.. {
            let day = client * 100_000 + i;
            let body = json!({
                "text": format!("{PREFIX}Question: what did the keeper write on day {day}?"),
                "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": true},
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
                answered.fetch_add(1, Ordering::Relaxed);
            } else {
                refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    })
}

#[tokio::test]
async fn p2_a_shared_prefix_workload_through_the_hpa_does_not_oscillate() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    if !custom_metrics_served(c) {
        return;
    }
    ensure_chart(c, &client).await;
    let (ns, name) = ("prefix-e2e", "shared");
    ensure_namespace(c, ns);
    // One running request per engine, so the others wait in its queue. The router balances
    // as soon as one engine has two requests more than another (SGLang's default of 32 is
    // for engines that run dozens at once; at this size it would keep every request of the
    // one prefix on the first engine, and the new engines would stand idle).
    let applied = Instant::now();
    c.apply(&format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: {name}
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
  device: cpu
  tpSize: 1
  maxRunningRequests: 1
  router:
    balanceAbsThreshold: 1
  autoscaling:
    enabled: true
    minReplicas: 1
    maxReplicas: {MAX_REPLICAS}
    targetQueueLength: 2
    targetCacheHitRate: 0.5
    scaleDownStabilizationSeconds: 5
"#
    ));
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
    let hpa = wait_for("the service's HPA", WAIT, || async {
        hpas.get_opt(&format!("{name}-engine"))
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no HPA yet".to_string())
    })
    .await;
    let read: Vec<String> = hpa
        .spec
        .metrics
        .iter()
        .flatten()
        .filter_map(|m| Some(m.pods.as_ref()?.metric.name.clone()))
        .collect();
    for m in LOAD_METRICS.iter().chain(&CACHE_METRICS) {
        assert!(
            read.iter().any(|r| r == m),
            "the HPA does not read {m}: {read:?}"
        );
    }
    let sampler = Sampler::start(c, &client, ns, name, applied);
    wait_serving(c, &client, ns, name, 1).await;
    let router = router_pods(&client, ns, name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://{}:30000/generate", pod_ip(&router[0]));
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let (answered, refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client_task = |k: usize| {
        prefix_client(
            http.clone(),
            url.clone(),
            k,
            answered.clone(),
            refused.clone(),
        )
    };

    // 1. Two clients: a busy engine with a warm cache and one request waiting stays alone.
    let mut clients = vec![client_task(0), client_task(1)];
    let at_min = |s: &Sample| {
        if s.dp_size != 1 || s.desired.is_some_and(|d| d != 1) {
            return Err(format!(
                "two clients' load fits one engine, but dpSize is {} and the HPA desires {:?}",
                s.dp_size, s.desired
            ));
        }
        Ok(())
    };
    sampler
        .until(
            "the HPA to read the warm engine's brake above 0.5 (two clients)",
            Duration::from_secs(150),
            |s| {
                s.iter().try_for_each(at_min)?;
                Ok(s.last().is_some_and(|l| {
                    l.desired.is_some() && l.metrics.get(BRAKE_METRIC).is_some_and(|b| *b > 0.5)
                }))
            },
        )
        .await;
    let warm = Instant::now();
    sampler
        .until(
            "three more HPA syncs at one engine (two clients)",
            Duration::from_secs(60),
            |s| {
                s.iter().try_for_each(at_min)?;
                Ok(warm.elapsed() >= Duration::from_secs(15)
                    && s.last().is_some_and(|l| l.desired.is_some()))
            },
        )
        .await;

    // 2. Seven clients: up to three engines, then the load held; never down meanwhile.
    let load_from = applied.elapsed().as_secs_f64();
    clients.extend((2..CLIENTS).map(client_task));
    let rising = |s: &[Sample]| match reversal(s, load_from, true) {
        Some(e) => Err(format!("under steady shared-prefix load, {e}")),
        None => Ok(()),
    };
    sampler
        .until(
            &format!("the HPA to scale up to {MAX_REPLICAS} under {CLIENTS} clients"),
            WAIT,
            |s| {
                rising(s)?;
                Ok(s.last().is_some_and(|l| l.dp_size == MAX_REPLICAS))
            },
        )
        .await;
    let selector = format!("serving.sgl-rs.io/engine={name}");
    wait_ready_pods(
        c,
        &client,
        ns,
        &selector,
        MAX_REPLICAS as usize,
        "every engine ready",
    )
    .await;
    let ready = Instant::now();
    sampler
        .until(
            &format!("{HOLD:?} of steady load at {MAX_REPLICAS} engines"),
            HOLD + Duration::from_secs(30),
            |s| {
                rising(s)?;
                Ok(ready.elapsed() >= HOLD)
            },
        )
        .await;
    // A real shared-prefix load: the engines' radix caches served most prompt tokens.
    let mut totals = (0.0, 0.0);
    let mut per_engine = Vec::new();
    for p in ready_pods(&client, ns, &selector)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    {
        let m = engine_metrics(&http, &format!("http://{}:30000/metrics", pod_ip(&p)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let cached =
            engine_value(&m, "sglang:cached_tokens_total").unwrap_or_else(|e| panic!("{e}"));
        let prompt =
            engine_value(&m, "sglang:prompt_tokens_total").unwrap_or_else(|e| panic!("{e}"));
        per_engine.push(format!("{} {cached}/{prompt}", p.name_any()));
        totals = (totals.0 + cached, totals.1 + prompt);
    }
    let hit_rate = totals.0 / totals.1.max(1.0);
    eprintln!(
        "p2: cached/prompt tokens per engine: {per_engine:?}; service hit rate {hit_rate:.3}"
    );
    assert!(
        hit_rate > 0.8,
        "the workload is not a shared-prefix one: hit rate {hit_rate:.3} ({per_engine:?})"
    );

    // 3. No load: back to one engine, never up meanwhile.
    for t in &clients {
        t.abort();
    }
    let stop_from = applied.elapsed().as_secs_f64();
    sampler
        .until(
            "the HPA to scale back to one engine without load",
            Duration::from_secs(240),
            |s| {
                if let Some(e) = reversal(s, stop_from, false) {
                    return Err(format!("without load, {e}"));
                }
                Ok(s.last()
                    .is_some_and(|l| l.dp_size == 1 && l.engines == Some(1)))
            },
        )
        .await;

    let samples = sampler.samples();
    let report = sampler.report();
    eprintln!(
        "p2: {} requests answered, {} refused or failed\n{report}",
        answered.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    );
    // The whole run: up, then down (one change of direction).
    let mut directions = Vec::new();
    for w in samples.windows(2) {
        let d = (w[1].dp_size - w[0].dp_size).signum();
        if d != 0 && directions.last() != Some(&d) {
            directions.push(d);
        }
    }
    assert!(
        directions == [1, -1],
        "dpSize should go up once and down once, went {directions:?}\n{report}"
    );
    // Every scale-up was the load's: the HPA names the metric that asked for it in its
    // event, and no cache metric ever did.
    let rescales = rescale_events(&client, ns, &format!("{name}-engine")).await;
    eprintln!("p2: the HPA's rescales: {rescales:?}");
    let ups: Vec<&String> = rescales
        .iter()
        .filter(|m| m.contains("above target"))
        .collect();
    assert!(!ups.is_empty(), "no scale-up event: {rescales:?}");
    for up in ups {
        assert!(
            LOAD_METRICS.iter().any(|m| up.contains(m))
                && !CACHE_METRICS.iter().any(|m| up.contains(m)),
            "a scale-up was not asked for by the load metrics {LOAD_METRICS:?}: {up}"
        );
    }
    assert!(
        answered.load(Ordering::Relaxed) > 0,
        "no request was answered"
    );
    drop(sampler);
    delete_service(&client, ns, name).await;
}
