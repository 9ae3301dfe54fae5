//! A KEDA `ScaledObject` in place of the HPA, for scale to zero on clusters that run KEDA.
//!
//! Two ways take a service to zero engines and back (the rule is the same; the chart's README
//! says which to pick):
//!
//! - The operator's own HPA (`scaling.rs`) with `minReplicas: 0` and an Object metric of the
//!   router's waiting requests from the chart's prometheus-adapter rules. It needs nothing but
//!   Kubernetes, with the `HPAScaleToZero` feature gate, which is alpha and off by default.
//! - KEDA, when the operator runs with `--keda-prometheus-url` (the chart's `keda.enabled`):
//!   KEDA scales from and to zero itself (it activates a workload when a trigger is above its
//!   activation threshold, and deactivates it `cooldownPeriod` after the last one was), and
//!   creates and owns an HPA for 1..max from the same triggers. Its triggers query Prometheus
//!   directly, so they need no adapter: each is the same signal as the adapter rule of that
//!   name, summed over the service (KEDA divides a trigger by the replicas for an
//!   `AverageValue` target, as the HPA averages a Pods metric).
//!
//! Only services with `minReplicas: 0` get a ScaledObject; others keep the operator's HPA, so
//! turning the option on changes nothing for them. A service never has both (two autoscalers
//! on one scale subresource fight over it).
//!
//! KEDA decides activation (0 → 1) and deactivation (→ 0) in its own loop, every
//! `pollingInterval`; its default of 30 s would add up to 30 s to the wait of a request held in
//! the router (whose `queueTimeoutSeconds` defaults to 60 s, and the engine has to start
//! after), so the ScaledObject polls every [`POLLING_SECONDS`]. Between one engine and more,
//! KEDA's HPA reads the triggers through KEDA's metrics API server (`external.metrics.k8s.io`),
//! which KEDA's installation provides.

use serde_json::json;
use sgl_crds::{AutoscalingSpec, SGLangService};

use super::{KV_USAGE_TARGET, Names, meta};
use crate::Error;

/// How often KEDA checks the triggers of a service's ScaledObject: the most a waiting
/// request waits for KEDA to see it (besides Prometheus's scrape interval and the engine's
/// start). Each check is one Prometheus query a trigger.
pub const POLLING_SECONDS: i32 = 5;

/// The `ScaledObject` of a service, as KEDA's CRD (`keda.sh/v1alpha1`) describes it.
pub fn scaled_object(
    svc: &SGLangService,
    names: &Names,
    a: &AutoscalingSpec,
    prometheus_url: &str,
) -> Result<serde_json::Value, Error> {
    let meta = serde_json::to_value(meta(svc, names, &names.engine, "engine")?)?;
    let engines = format!(
        r#"namespace="{}",service="{}""#,
        names.namespace, names.engine
    );
    let router = format!(
        r#"namespace="{}",service="{}""#,
        names.namespace, names.router
    );
    let trigger = |name: &str, query: String, threshold: f64| {
        json!({
            "type": "prometheus",
            "name": name,
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": prometheus_url,
                "query": query,
                "threshold": threshold.to_string(),
            },
        })
    };
    // Requests waiting in the router: the one signal at zero engines. Any waiting request
    // activates the service (activation threshold 0: active above it); past activation it
    // asks for one engine per `targetQueueLength` waiting there, as the engines' queues do.
    let mut waiting = trigger(
        "router-waiting",
        format!("sum(sgl_router_pending_requests{{{router}}}) or vector(0)"),
        a.target_queue_length,
    );
    waiting["metadata"]["activationThreshold"] = json!("0");
    let mut triggers = vec![
        waiting,
        trigger(
            "queue",
            format!("sum(sglang:num_queue_reqs{{{engines}}}) or vector(0)"),
            a.target_queue_length,
        ),
        trigger(
            "kv-usage",
            format!("sum(sglang:token_usage{{{engines}}}) or vector(0)"),
            KV_USAGE_TARGET,
        ),
        // The scale-down brake, summed: the service's value times its engines, at most the
        // replicas that run (the adapter rules say why it is the service's, not each engine's).
        trigger(
            "scale-down-brake",
            format!(
                "(clamp_max(sum(rate(sglang:cached_tokens_total{{{engines}}}[2m])) \
                 / (sum(rate(sglang:prompt_tokens_total{{{engines}}}[2m])) > 0), 1) \
                 * (sum(sum_over_time(((sglang:num_running_reqs{{{engines}}} > bool 0) \
                 and on (namespace, pod) (sglang:num_requests_total{{{engines}}} > 0))[2m:5s])) \
                 / sum(count_over_time(((sglang:num_running_reqs{{{engines}}} > bool 0) \
                 and on (namespace, pod) (sglang:num_requests_total{{{engines}}} > 0))[2m:5s]))) \
                 * count(sglang:token_usage{{{engines}}})) \
                 or vector(0)"
            ),
            1.0,
        ),
    ];
    if let Some(hit) = a.target_cache_hit_rate {
        triggers.push(trigger(
            "cache-miss",
            format!(
                "sum(sglang:token_usage{{{engines}}} * on (pod) (1 - clamp_max(\
                 sum by (pod) (rate(sglang:cached_tokens_total{{{engines}}}[2m])) \
                 / (sum by (pod) (rate(sglang:prompt_tokens_total{{{engines}}}[2m])) > 0), 1))) \
                 or vector(0)"
            ),
            1.0 - hit,
        ));
    }
    Ok(json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {
                "apiVersion": sgl_crds::GROUP.to_string() + "/" + sgl_crds::VERSION,
                "kind": "SGLangService",
                "name": names.instance,
            },
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "pollingInterval": POLLING_SECONDS,
            // Idle this long after the last active trigger, the service goes to zero; the
            // same window holds scale-down between 1 and max.
            "cooldownPeriod": a.scale_down_stabilization_seconds,
            // A new ScaledObject has no last active trigger: without this window KEDA takes
            // a service to zero at its first check, before its first engine is even ready.
            "initialCooldownPeriod": a.scale_down_stabilization_seconds,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": a.scale_down_stabilization_seconds,
                        },
                    },
                },
            },
            "triggers": triggers,
        },
    }))
}
