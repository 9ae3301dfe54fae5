//! HorizontalPodAutoscaler, PodDisruptionBudget and ServiceMonitor.

use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HPAScalingRules, HorizontalPodAutoscaler,
    HorizontalPodAutoscalerBehavior, HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec,
    MetricTarget, ObjectMetricSource, PodsMetricSource,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde_json::json;
use sgl_crds::SGLangService;

use super::{Names, common_labels, meta, owner_ref, selector_labels};
use crate::Error;

/// Custom metric (per pod) of waiting requests, exposed by the chart's adapter rules from
/// `sglang:num_queue_reqs`.
pub const QUEUE_METRIC: &str = "sglang_num_queue_reqs";
/// Custom metric (per pod): the windowed miss rate weighted by KV utilisation, so that a cold,
/// idle replica does not raise it (see the chart's adapter rules).
pub const CACHE_MISS_METRIC: &str = "sglang_cache_miss_rate";
/// Custom metric (per pod): KV cache utilisation, `sglang:token_usage` (0..1).
pub const KV_USAGE_METRIC: &str = "sglang_token_usage";
/// The KV utilisation each engine is scaled towards.
pub const KV_USAGE_TARGET: f64 = 0.8;
/// Custom metric (per pod, the same value for each): the service's windowed hit rate times
/// its engines' busy share, 0..1. With an average target of 1 the HPA's recommendation from
/// it never exceeds the replicas that run: it can only hold replicas while the traffic is
/// cache-friendly and the engines busy, never add one. It is the service's value so that an
/// engine just added, whose cache is still cold, does not let the others go (the rule and why
/// are in the chart's adapter rules and README).
pub const SCALE_DOWN_BRAKE_METRIC: &str = "sglang_scale_down_brake";

/// Custom metric (on the router's Service): 1 while requests wait in the router for an engine,
/// else 0 (`sgl_router_pending_requests` clamped to 1 by the chart's adapter rules). With a
/// target value of 1 it asks for one engine while requests wait and for none otherwise: it
/// brings a service at zero engines back to one, and never holds or adds more.
pub const ROUTER_WAITING_METRIC: &str = "sgl_router_has_pending_requests";

/// A decimal quantity in thousandths, exact for the targets a spec can hold.
fn quantity(value: f64) -> Quantity {
    let milli = (value * 1000.0).round() as i64;
    if milli % 1000 == 0 {
        Quantity((milli / 1000).to_string())
    } else {
        Quantity(format!("{milli}m"))
    }
}

fn pods_metric(name: &str, average: f64) -> MetricSpec {
    MetricSpec {
        type_: "Pods".into(),
        pods: Some(PodsMetricSource {
            metric: MetricIdentifier {
                name: name.into(),
                selector: None,
            },
            target: MetricTarget {
                type_: "AverageValue".into(),
                average_value: Some(quantity(average)),
                ..MetricTarget::default()
            },
        }),
        ..MetricSpec::default()
    }
}

/// An Object metric of the router's Service with a target value.
fn router_metric(names: &Names, name: &str, value: f64) -> MetricSpec {
    MetricSpec {
        type_: "Object".into(),
        object: Some(ObjectMetricSource {
            described_object: CrossVersionObjectReference {
                api_version: Some(Service::api_version(&()).into_owned()),
                kind: Service::kind(&()).into_owned(),
                name: names.router.clone(),
            },
            metric: MetricIdentifier {
                name: name.into(),
                selector: None,
            },
            target: MetricTarget {
                type_: "Value".into(),
                value: Some(quantity(value)),
                ..MetricTarget::default()
            },
        }),
        ..MetricSpec::default()
    }
}

/// The HPA, or `None` when autoscaling is off.
///
/// It scales the `SGLangService` itself through its scale subresource (`spec.dpSize`), never
/// the engine Deployment: the operator always applies the Deployment's replicas from
/// `dpSize`, so there is one owner of the count. Turning autoscaling on starts the HPA from the replicas
/// that run; turning it off keeps the last count the HPA set.
pub fn hpa(svc: &SGLangService, names: &Names) -> Result<Option<HorizontalPodAutoscaler>, Error> {
    let Some(a) = svc.spec.autoscaling.as_ref().filter(|a| a.enabled) else {
        return Ok(None);
    };
    // Replicas follow load (queue and KV utilisation); the cache only brakes scale-down.
    let mut metrics = vec![
        pods_metric(QUEUE_METRIC, a.target_queue_length),
        pods_metric(KV_USAGE_METRIC, KV_USAGE_TARGET),
        pods_metric(SCALE_DOWN_BRAKE_METRIC, 1.0),
    ];
    if let Some(hit) = a.target_cache_hit_rate {
        metrics.push(pods_metric(CACHE_MISS_METRIC, 1.0 - hit));
    }
    // Scale to zero: with no engine the Pods metrics have no pods to read, so an HPA at zero
    // acts on this one alone (Kubernetes scales from zero only on Object or External
    // metrics). The engines' metrics take over once one runs; without load all of them read
    // 0 and, after the scale-down window, the HPA goes back to zero.
    if a.min_replicas == 0 && svc.spec.router.enabled {
        metrics.push(router_metric(names, ROUTER_WAITING_METRIC, 1.0));
    }
    Ok(Some(HorizontalPodAutoscaler {
        metadata: meta(svc, names, &names.engine, "engine")?,
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(SGLangService::api_version(&()).into_owned()),
                kind: SGLangService::kind(&()).into_owned(),
                name: names.instance.clone(),
            },
            min_replicas: Some(a.min_replicas),
            max_replicas: a.max_replicas,
            metrics: Some(metrics),
            behavior: Some(HorizontalPodAutoscalerBehavior {
                scale_down: Some(HPAScalingRules {
                    stabilization_window_seconds: Some(a.scale_down_stabilization_seconds),
                    ..HPAScalingRules::default()
                }),
                scale_up: None,
            }),
        },
        status: None,
    }))
}

/// At most one engine down at a time for voluntary disruptions (drains, upgrades).
pub fn pdb(svc: &SGLangService, names: &Names) -> Result<PodDisruptionBudget, Error> {
    Ok(PodDisruptionBudget {
        metadata: meta(svc, names, &names.engine, "engine")?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(names, "engine")),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// At most one router down at a time for voluntary disruptions; with one replica a drain may
/// still take it (a PDB that allows nothing would block node drains forever).
pub fn router_pdb(svc: &SGLangService, names: &Names) -> Result<PodDisruptionBudget, Error> {
    Ok(PodDisruptionBudget {
        metadata: meta(svc, names, &names.router, "router")?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(names, "router")),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// A Prometheus Operator ServiceMonitor over the engine and router Services.
pub fn service_monitor(svc: &SGLangService, names: &Names) -> Result<serde_json::Value, Error> {
    let mut endpoint = json!({"port": "http", "path": "/metrics"});
    if let Some(interval) = &svc.spec.monitoring.interval {
        endpoint["interval"] = json!(interval);
    }
    // The spec's labels first, so that ours (which the selectors use) keep their values.
    let mut labels = svc.spec.monitoring.labels.clone();
    labels.extend(common_labels(names, "engine"));
    labels.remove("app.kubernetes.io/component");
    let mut selector = selector_labels(names, "engine");
    selector.remove("app.kubernetes.io/component");
    Ok(json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {
            "name": names.instance,
            "namespace": names.namespace,
            "labels": labels,
            "ownerReferences": [owner_ref(svc)?],
        },
        "spec": {
            "selector": {"matchLabels": selector},
            "endpoints": [endpoint],
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::quantity;

    #[test]
    fn quantities_are_exact_decimals() {
        assert_eq!(quantity(4.0).0, "4");
        assert_eq!(quantity(0.25).0, "250m");
        assert_eq!(quantity(1.0 - 0.7).0, "300m");
    }
}
