//! The operator's HPA: turning autoscaling on and off never lowers a dp 4 service's replicas
//! (g1), the custom metrics API serves every metric the HPA reads with the engine's own
//! values and the HPA's status holds each (o1), and the HPA scales a CPU service up on its
//! queue and back to the minimum (p1).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    delete_service, ensure_chart, ensure_namespace, fake_service, pod_ip, wait_engine_replicas,
    wait_observed, wait_ready_pods, wait_serving,
};
use crate::metrics::{
    EngineReadings, QUEUE_METRIC, Scaling, ScalingWatch, check_served_metric,
    custom_metrics_served, engine_metrics, engine_value, generate_loop, quantity, same_prompt_loop,
    served_pod_metric,
};

#[tokio::test]
async fn g1_autoscaling_a_dp4_service_never_lowers_its_replicas() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "hpa-e2e";
    ensure_namespace(c, ns);
    c.apply(&fake_service(ns, "wide", 4, ""));
    wait_serving(c, &client, ns, "wide", 4).await;
    let sts: Api<Deployment> = Api::namespaced(client.clone(), ns);
    // Watch the engine Deployment's replicas from now on, while autoscaling is turned on and off.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<i32>::new()));
    let watch = {
        let sts = sts.clone();
        let seen = seen.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let cfg = kube::runtime::watcher::Config::default().fields("metadata.name=wide-engine");
            let mut stream = std::pin::pin!(kube::runtime::watcher(sts, cfg));
            while let Some(ev) = stream.next().await {
                if let Ok(
                    kube::runtime::watcher::Event::Apply(s)
                    | kube::runtime::watcher::Event::InitApply(s),
                ) = ev
                {
                    let r = s.spec.replicas.unwrap_or(-1);
                    seen.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                }
            }
        })
    };
    c.apply(&fake_service(
        ns,
        "wide",
        4,
        "  autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 8, targetQueueLength: 4}\n",
    ));
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the HPA controller to have synced the HPA",
        WAIT,
        || async {
            let list = hpas
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let synced = list.items.iter().any(|h| {
                h.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "AbleToScale")
                })
            });
            synced
                .then_some(())
                .ok_or(format!("{} HPAs, none synced", list.items.len()))
        },
    )
    .await;
    wait_observed(&client, ns, "wide").await;
    c.apply(&fake_service(
        ns,
        "wide",
        4,
        "  autoscaling: {enabled: false, minReplicas: 2, maxReplicas: 8}\n",
    ));
    wait_observed(&client, ns, "wide").await;
    wait_for("the HPA to be removed", WAIT, || async {
        let list = hpas
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .is_empty()
            .then_some(())
            .ok_or(format!("{} HPAs left", list.items.len()))
    })
    .await;
    watch.abort();
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(!seen.is_empty(), "the watch saw nothing");
    assert!(
        seen.iter().all(|r| *r >= 4),
        "replicas went below 4: {seen:?}"
    );
    delete_service(&client, ns, "wide").await;
}

#[tokio::test]
async fn o1_the_custom_metrics_api_serves_every_metric_the_hpa_reads_with_the_engines_values() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    if !custom_metrics_served(c) {
        return;
    }
    ensure_chart(c, &client).await;
    let ns = "metrics-e2e";
    ensure_namespace(c, ns);
    // One running request at a time, so the others wait in the queue; a small KV cache, so
    // the running request's share of it is well above the API's thousandths. The targets
    // are far from what the test's load reaches: the HPA keeps one replica.
    c.apply(&format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: scraped
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
  device: cpu
  tpSize: 1
  dpSize: 1
  maxRunningRequests: 1
  maxTotalTokens: 8192
  router: {{enabled: false}}
  autoscaling:
    enabled: true
    minReplicas: 1
    maxReplicas: 2
    targetQueueLength: 4
    targetCacheHitRate: 0.5
"#
    ));
    let selector = "serving.sgl-rs.io/engine=scraped";
    let engines = wait_ready_pods(c, &client, ns, selector, 1, "a ready engine").await;
    let engine = engines[0].name_any();
    // The metrics are the ones the operator's HPA asks for, not names copied here.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
    let hpa = wait_for("the service's HPA", WAIT, || async {
        let list = hpas
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .next()
            .ok_or_else(|| "no HPA".to_string())
    })
    .await;
    let hpa_name = hpa.name_any();
    let metrics: Vec<String> = hpa
        .spec
        .metrics
        .iter()
        .flatten()
        .filter_map(|m| Some(m.pods.as_ref()?.metric.name.clone()))
        .collect();
    for wanted in ["queue", "token_usage", "brake", "miss"] {
        assert!(
            metrics.iter().any(|m| m.contains(wanted)),
            "the HPA reads no per-pod {wanted} metric: {metrics:?}"
        );
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let metrics_url = format!("http://{}:30000/metrics", pod_ip(&engines[0]));
    let generate_url = format!("http://{}:30000/generate", pod_ip(&engines[0]));
    // Every metric served for the idle engine first: Prometheus then holds a scrape with the
    // token counters at 0, so the rules' 2-minute windows cover all the traffic that follows.
    wait_for(
        "every HPA metric served for the idle engine",
        WAIT,
        || async {
            let idle = engine_metrics(&http, &metrics_url).await?;
            if engine_value(&idle, "sglang:prompt_tokens_total")? != 0.0 {
                return Err(format!("the idle engine counted prompt tokens: {idle:?}"));
            }
            for m in &metrics {
                served_pod_metric(c, ns, selector, m, &engine)?;
            }
            Ok(())
        },
    )
    .await;

    // One request puts a long prompt in the prefix cache; then three clients send it again
    // and again with a long generation: one runs (its prompt found in the cache, its KV
    // growing), two wait.
    let prompt = "The keeper of the lighthouse wrote the weather, the ships and the tides in \
                  his log every evening. "
        .repeat(24);
    let body = |max_new_tokens: u32| {
        json!({
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": true},
        })
    };
    let first = http
        .post(&generate_url)
        .json(&body(1))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the first request: {e}"));
    assert!(
        first.status().is_success(),
        "the first request: {}",
        first.status()
    );
    let clients: Vec<_> = (0..3)
        .map(|_| same_prompt_loop(http.clone(), generate_url.clone(), body(4000)))
        .collect();
    // Each metric as the custom metrics API serves it is what the adapter's rule makes of the
    // engine's own numbers (all above 0: the rules' windows and ratios at work, not their
    // fallbacks).
    let served = wait_for(
        "every HPA metric served with the engine's values",
        Duration::from_secs(120),
        || async {
            let before = engine_metrics(&http, &metrics_url).await?;
            let mut served = BTreeMap::new();
            for m in &metrics {
                served.insert(m.clone(), served_pod_metric(c, ns, selector, m, &engine)?);
            }
            let readings = EngineReadings {
                before,
                after: engine_metrics(&http, &metrics_url).await?,
            };
            let mut wrong = Vec::new();
            for (m, v) in &served {
                if let Err(e) = check_served_metric(m, *v, &readings) {
                    wrong.push(e);
                }
            }
            if wrong.is_empty() {
                Ok(served)
            } else {
                Err(wrong.join("; "))
            }
        },
    )
    .await;
    eprintln!("o1: served {served:?}");
    // The HPA controller reads each of them through the same API: its status holds a current
    // value for every metric of its spec, not only the queue.
    let current = wait_for(
        "the HPA's status to hold every metric it reads",
        WAIT,
        || async {
            let h = hpas.get(&hpa_name).await.map_err(|e| e.to_string())?;
            let current: BTreeMap<String, String> = h
                .status
                .iter()
                .flat_map(|s| s.current_metrics.iter().flatten())
                .filter_map(|m| {
                    let p = m.pods.as_ref()?;
                    Some((
                        p.metric.name.clone(),
                        p.current.average_value.as_ref()?.0.clone(),
                    ))
                })
                .collect();
            let missing: Vec<&String> = metrics
                .iter()
                .filter(|m| !current.contains_key(*m))
                .collect();
            if missing.is_empty() {
                Ok(current)
            } else {
                Err(format!(
                    "no current value for {missing:?} in {current:?}; conditions {:?}",
                    h.status.map(|s| s.conditions)
                ))
            }
        },
    )
    .await;
    eprintln!("o1: the HPA read {current:?}");
    for task in &clients {
        task.abort();
    }
    delete_service(&client, ns, "scraped").await;
}

#[tokio::test]
async fn p1_the_hpa_scales_a_cpu_service_up_on_its_queue_and_back_to_the_minimum() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    if !custom_metrics_served(c) {
        return;
    }
    ensure_chart(c, &client).await;
    let (ns, name) = ("hpa-load-e2e", "busy");
    ensure_namespace(c, ns);
    // One running request per engine, so concurrent requests wait in its queue; the HPA
    // reads the queue, KV use, the scale-down brake and the cache miss rate.
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
  router: {{enabled: false}}
  autoscaling:
    enabled: true
    minReplicas: 1
    maxReplicas: 3
    targetQueueLength: 2
    targetCacheHitRate: 0.5
    scaleDownStabilizationSeconds: 5
"#
    ));
    let mut watch = ScalingWatch::new(c, &client, ns, name);
    let at_min = |s: &Scaling| {
        if s.dp_size != 1 || s.desired.is_some_and(|d| d != 1) {
            return Err(format!(
                "without load the service left its minimum: dpSize {}, desired {:?}",
                s.dp_size, s.desired
            ));
        }
        Ok(())
    };
    let selector = format!("serving.sgl-rs.io/engine={name}");
    let engine = wait_ready_pods(c, &client, ns, &selector, 1, "a ready engine")
        .await
        .remove(0);
    let hpa = watch
        .hpas
        .get(&format!("{name}-engine"))
        .await
        .unwrap_or_else(|e| panic!("the service's HPA: {e}"));
    let spec = hpa.spec;
    assert!(
        spec.metrics.iter().flatten().any(|m| m
            .pods
            .as_ref()
            .is_some_and(|p| p.metric.name == QUEUE_METRIC)),
        "the HPA does not read {QUEUE_METRIC}: {:?}",
        spec.metrics
    );
    let window = spec
        .behavior
        .and_then(|b| b.scale_down?.stabilization_window_seconds);
    assert_eq!(
        window,
        Some(5),
        "scaleDownStabilizationSeconds not rendered"
    );

    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let url = format!("http://{}:30000/generate", pod_ip(&engine));
    // A trickle of requests with unique prompts (every prompt a cache miss) while the HPA
    // acts on the metrics: the cache may brake a scale-down, never ask for a replica.
    let trickled = Arc::new(AtomicUsize::new(0));
    let trickle = generate_loop(
        http.clone(),
        url.clone(),
        0,
        16,
        Duration::from_millis(500),
        trickled.clone(),
    );
    watch
        .until(
            "the HPA to read its metrics through the adapter (ScalingActive=True)",
            WAIT,
            |s| {
                at_min(s)?;
                Ok(s.active
                    .as_ref()
                    .is_some_and(|(status, _)| status == "True")
                    && s.queue.is_some())
            },
        )
        .await;
    // Three more HPA syncs (every 5 s) with valid metrics: still at the minimum.
    let end = std::time::Instant::now() + Duration::from_secs(15);
    watch
        .until(
            "15 s at the minimum with a trickle of cache misses",
            Duration::from_secs(60),
            |s| {
                at_min(s)?;
                // A scrape missed on a busy machine may leave a sync without metrics: the
                // window ends on a sync that read them.
                let active = s
                    .active
                    .as_ref()
                    .is_some_and(|(status, _)| status == "True");
                Ok(std::time::Instant::now() >= end && active)
            },
        )
        .await;
    trickle.abort();
    let trickled = trickled.load(Ordering::Relaxed);
    assert!(trickled > 0, "no trickle request was answered");

    // Load: 12 clients, one running, the rest waiting: the queue is far above 2 per engine.
    let answered = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..12)
        .map(|k| {
            generate_loop(
                http.clone(),
                url.clone(),
                1_000_000 * (k + 1),
                64,
                Duration::ZERO,
                answered.clone(),
            )
        })
        .collect();
    // Up to 3, and the HPA's own reading of the queue (average per engine) above target: it
    // scaled on the queue (the status may trail the scale by one sync; the load goes on).
    let mut peak = 0.0_f64;
    watch
        .until(
            "the HPA to scale up to 3 on a queue above 2 per engine",
            WAIT,
            |s| {
                if let Some(q) = &s.queue {
                    peak = peak.max(quantity(q)?);
                }
                Ok(s.dp_size == 3 && peak > 2.0)
            },
        )
        .await;
    wait_engine_replicas(&client, ns, name, 3).await;
    for l in &load {
        l.abort();
    }
    eprintln!(
        "p1: {trickled} trickle requests and {} under load answered",
        answered.load(Ordering::Relaxed)
    );
    watch
        .until("the HPA to scale back to 1 without load", WAIT, |s| {
            Ok(s.dp_size == 1)
        })
        .await;
    wait_engine_replicas(&client, ns, name, 1).await;
    eprintln!("p1 scaling seen:\n{}", watch.history.join("\n"));
    delete_service(&client, ns, name).await;
}
