//! Reconcile against a scripted API server: every request the controller makes is recorded
//! and asserted.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use super::{backoff, error_policy, reconcile};
use crate::fixtures::{FakeApi, engine_pod, existing, pod_list, ready_statuses, service, timeout};

fn no_override() -> crate::fixtures::Responder {
    Box::new(|_| None)
}

fn not_ready() -> (Value, Value) {
    (json!({"replicas": 0}), json!({}))
}

fn condition<'a>(status_body: &'a Value, type_: &str) -> &'a Value {
    status_body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status_body}"))
}

fn args(sts: &Value) -> Vec<String> {
    serde_json::from_value(sts["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .unwrap()
}

#[tokio::test]
async fn create_applies_every_object_and_reports_progress() {
    let svc = service(json!({}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    let action = timeout(reconcile(Arc::new(svc), ctx.clone()))
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));

    let summary = api.summary();
    let expected = [
        "PATCH /api/v1/namespaces/ml/services/llama-engine",
        "PATCH /apis/apps/v1/namespaces/ml/deployments/llama-engine",
        "PATCH /apis/policy/v1/namespaces/ml/poddisruptionbudgets/llama-engine",
        "PATCH /api/v1/namespaces/ml/serviceaccounts/llama-router",
        "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/ml/roles/llama-router",
        "PATCH /apis/rbac.authorization.k8s.io/v1/namespaces/ml/rolebindings/llama-router",
        "PATCH /apis/apps/v1/namespaces/ml/deployments/llama-router",
        "PATCH /api/v1/namespaces/ml/services/llama-router",
        "PATCH /apis/policy/v1/namespaces/ml/poddisruptionbudgets/llama-router",
        // excluded kinds are read first; none exists, so nothing is deleted
        "GET /apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/llama-engine",
        "GET /apis/monitoring.coreos.com/v1/namespaces/ml/servicemonitors/llama",
        "GET /api/v1/namespaces/ml/pods",
        "PATCH /apis/serving.sgl-rs.io/v1alpha1/namespaces/ml/sglangservices/llama/status",
    ];
    assert_eq!(&summary[..expected.len()], expected);
    let pods = api
        .calls()
        .into_iter()
        .find(|c| c.is("GET", "/pods"))
        .unwrap();
    assert!(
        pods.query.contains(
            "labelSelector=app.kubernetes.io/component=engine,app.kubernetes.io/instance=llama,app.kubernetes.io/name=sglang"
        ),
        "{}",
        pods.query
    );
    // One event per new condition.
    let events: Vec<_> = summary[expected.len()..].to_vec();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        events
            .iter()
            .all(|e| e == "POST /apis/events.k8s.io/v1/namespaces/ml/events")
    );

    let engines = api.body("PATCH", "/deployments/llama-engine");
    assert_eq!(engines["spec"]["replicas"], 2);
    assert_eq!(
        engines["metadata"]["ownerReferences"][0]["uid"],
        "1234-abcd"
    );
    assert_eq!(
        engines["metadata"]["ownerReferences"][0]["controller"],
        true
    );
    let limits = &engines["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpu"], "1");

    let status = api.body("PATCH", "/status");
    assert_eq!(condition(&status, "Ready")["status"], "False");
    assert_eq!(condition(&status, "Ready")["reason"], "EnginesNotReady");
    assert_eq!(condition(&status, "Progressing")["status"], "True");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(
        status["status"]["endpoint"],
        "http://llama-router.ml.svc:30000"
    );
    assert_eq!(status["status"]["ready"], "0/2");
    assert_eq!(
        status["status"]["selector"],
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=llama,app.kubernetes.io/name=sglang"
    );
}

#[tokio::test]
async fn ready_workloads_make_the_service_ready() {
    let svc = service(json!({}));
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), no_override());
    let action = timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let status = api.body("PATCH", "/status");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert_eq!(condition(&status, "Progressing")["status"], "False");
    assert_eq!(status["status"]["ready"], "2/2");
    assert_eq!(status["status"]["readyReplicas"], 2);
}

#[tokio::test]
async fn unchanged_status_is_not_written_again_and_emits_no_event() {
    let svc = service(json!({}));
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), no_override());
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    let written = api.body("PATCH", "/status");

    let mut again = svc;
    again.status = Some(serde_json::from_value(written["status"].clone()).unwrap());
    let (ctx, api) = FakeApi::start(&again, ready_statuses(), no_override());
    timeout(reconcile(Arc::new(again), ctx)).await.unwrap();
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.path.ends_with("/status") || c.path.contains("/events")),
        "{:?}",
        api.summary()
    );
}

/// An engine StatefulSet of an older operator keeps serving until the engine Deployment has
/// every replica available; then it is deleted.
#[tokio::test]
async fn an_old_engine_stateful_set_goes_only_once_the_deployment_serves() {
    let deletes_sts = |api: &FakeApi| {
        api.calls()
            .iter()
            .any(|c| c.is("DELETE", "/statefulsets/llama-engine"))
    };
    let svc = service(json!({}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    assert!(!deletes_sts(&api), "{:?}", api.summary());

    // Ready but not yet available (minReadySeconds, or pods of the old template).
    let ready_not_updated = (
        json!({"replicas": 3, "readyReplicas": 3, "updatedReplicas": 1, "availableReplicas": 3,
               "observedGeneration": 1}),
        json!({"replicas": 1, "readyReplicas": 1}),
    );
    let (ctx, api) = FakeApi::start(&svc, ready_not_updated, no_override());
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    assert!(!deletes_sts(&api), "{:?}", api.summary());

    // Available: it goes, if it is there and this service's.
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), no_override());
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    assert!(!deletes_sts(&api), "{:?}", api.summary());
    let sts: &'static [&'static str] = &["/statefulsets/llama-engine"];
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), existing(sts, Some("1234-abcd")));
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert!(deletes_sts(&api), "{:?}", api.summary());
    let delete = api.body("DELETE", "/statefulsets/llama-engine");
    assert_eq!(delete["preconditions"]["uid"], "uid-of-llama-engine");
    assert_eq!(delete["propagationPolicy"], "Background");
}

#[tokio::test]
async fn spec_updates_reach_the_applied_engine_deployment() {
    let svc = service(
        json!({"schedulePolicy": "fcfs", "grammarBackend": "outlines", "contextLength": 8192, "extraArgs": ["--enable-cache-report"]}),
    );
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    let engines = api.body("PATCH", "/deployments/llama-engine");
    let args = args(&engines);
    for pair in [
        ["--schedule-policy", "fcfs"],
        ["--grammar-backend", "outlines"],
        ["--context-length", "8192"],
    ] {
        assert!(
            args.windows(2).any(|w| w == pair),
            "{pair:?} not in {args:?}"
        );
    }
    assert_eq!(
        args.last().map(String::as_str),
        Some("--enable-cache-report")
    );
}

#[tokio::test]
async fn dp_size_sets_the_replicas_with_or_without_the_hpa() {
    let svc = service(json!({"dpSize": 5}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(
        api.body("PATCH", "/deployments/llama-engine")["spec"]["replicas"],
        5
    );

    let svc = service(
        json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 6, "targetQueueLength": 8}}),
    );
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(
        api.body("PATCH", "/deployments/llama-engine")["spec"]["replicas"],
        2
    );
    let hpa = api.body("PATCH", "/horizontalpodautoscalers/");
    assert_eq!(hpa["spec"]["maxReplicas"], 6);
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "SGLangService");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "llama");
    assert_eq!(
        hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"],
        "8"
    );
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.is("DELETE", "/horizontalpodautoscalers/"))
    );
}

/// The replicas each reconcile applies to the engine Deployment, for a service at `dp_size`.
async fn applied_replicas(spec: Value) -> Value {
    let svc = service(spec);
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    api.body("PATCH", "/deployments/llama-engine")["spec"]["replicas"].clone()
}

#[tokio::test]
async fn turning_autoscaling_on_or_off_keeps_the_running_replicas() {
    let autoscaling =
        |enabled: bool| json!({"enabled": enabled, "minReplicas": 1, "maxReplicas": 8});
    // A dp=4 service: before, as autoscaling turns on (before the HPA acts), and after.
    assert_eq!(applied_replicas(json!({"dpSize": 4})).await, 4);
    assert_eq!(
        applied_replicas(json!({"dpSize": 4, "autoscaling": autoscaling(true)})).await,
        4
    );
    // The HPA scaled the service to 6 through its scale subresource; turning autoscaling off
    // keeps 6.
    assert_eq!(
        applied_replicas(json!({"dpSize": 6, "autoscaling": autoscaling(true)})).await,
        6
    );
    assert_eq!(
        applied_replicas(json!({"dpSize": 6, "autoscaling": autoscaling(false)})).await,
        6
    );
}

const ROUTER_OBJECTS: &[&str] = &[
    "/serviceaccounts/llama-router",
    "/roles/llama-router",
    "/rolebindings/llama-router",
    "/deployments/llama-router",
    "/services/llama-router",
    "/poddisruptionbudgets/llama-router",
];

#[tokio::test]
async fn disabling_the_router_deletes_its_objects() {
    let svc = service(json!({"router": {"enabled": false}}));
    let (ctx, api) = FakeApi::start(
        &svc,
        not_ready(),
        existing(ROUTER_OBJECTS, Some("1234-abcd")),
    );
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    for part in ROUTER_OBJECTS {
        assert!(
            api.calls().iter().any(|c| c.is("DELETE", part)),
            "no DELETE {part}"
        );
        assert!(
            !api.calls().iter().any(|c| c.is("PATCH", part)),
            "PATCH {part}"
        );
    }
    assert_eq!(
        api.body("PATCH", "/status")["status"]["endpoint"],
        "http://llama-engine.ml.svc:30000"
    );
}

/// Same-named objects the service does not own (someone's own HPA, a router another tool
/// made) are read and left alone, never deleted.
#[tokio::test]
async fn objects_the_service_does_not_own_are_never_deleted() {
    let svc = service(json!({"router": {"enabled": false}}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), existing(ROUTER_OBJECTS, None));
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    let other: &'static [&'static str] = &["/horizontalpodautoscalers/llama-engine"];
    let (ctx, api2) = FakeApi::start(&svc, not_ready(), existing(other, Some("another-uid")));
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    for (api, parts) in [(&api, ROUTER_OBJECTS), (&api2, other)] {
        for part in parts {
            assert!(
                api.calls().iter().any(|c| c.is("GET", part)),
                "no GET {part}"
            );
            assert!(
                !api.calls().iter().any(|c| c.is("DELETE", part)),
                "DELETE {part} of an object the service does not own"
            );
        }
    }
}

#[tokio::test]
async fn a_service_being_deleted_is_left_to_the_garbage_collector() {
    let mut svc = service(json!({}));
    svc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    let action = timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(api.calls().is_empty(), "{:?}", api.summary());
}

#[tokio::test]
async fn api_errors_show_as_degraded_and_back_off() {
    let svc = service(json!({}));
    let fail: crate::fixtures::Responder = Box::new(|c| {
        c.is("PATCH", "/deployments/llama-engine").then(|| {
            (500, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "reason": "InternalError", "message": "etcdserver: request timed out"}))
        })
    });
    let (ctx, api) = FakeApi::start(&svc, not_ready(), fail);
    let svc = Arc::new(svc);
    let err = timeout(reconcile(svc.clone(), ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "kube");
    // Nothing after the failed apply, except recording the failure.
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.is("PATCH", "/deployments/llama-router"))
    );
    let status = api.body("PATCH", "/status");
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ApplyFailed");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("etcdserver: request timed out")
    );
    let warnings = api
        .calls()
        .into_iter()
        .filter(|c| c.path.contains("/events") && c.body["type"] == "Warning")
        .count();
    assert_eq!(warnings, 1);

    let delays: Vec<_> = (0..3)
        .map(|_| error_policy(svc.clone(), &err, ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [5, 10, 20].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    let failures = ctx.metrics.encode().unwrap();
    assert!(
        failures
            .contains(r#"sgl_operator_reconcile_failures_total{error="kube",namespace="ml"} 1"#),
        "{failures}"
    );
}

#[tokio::test]
async fn conflicts_are_errors_with_their_own_label() {
    let svc = service(json!({}));
    let conflict: crate::fixtures::Responder = Box::new(|c| {
        c.is("PATCH", "/services/llama-engine").then(|| {
            (409, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict", "message": "Apply failed with 1 conflict"}))
        })
    });
    let (ctx, api) = FakeApi::start(&svc, not_ready(), conflict);
    let err = timeout(reconcile(Arc::new(svc), ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.metric_label(), "conflict");
    assert_eq!(
        condition(&api.body("PATCH", "/status"), "Degraded")["reason"],
        "ApplyFailed"
    );
    assert!(
        ctx.metrics
            .encode()
            .unwrap()
            .contains(r#"error="conflict""#)
    );
}

#[tokio::test]
async fn a_bad_spec_is_degraded_and_applies_nothing() {
    let svc = service(json!({"tpSize": 3}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    let action = timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.method == "PATCH" && !c.path.ends_with("/status")),
        "{:?}",
        api.summary()
    );
    let status = api.body("PATCH", "/status");
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["reason"], "InvalidSpec");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("tpSize must be 1, 2, 4 or 8")
    );
    assert_eq!(condition(&status, "Ready")["reason"], "InvalidSpec");
}

#[tokio::test]
async fn a_spec_the_engine_would_refuse_applies_nothing_and_says_why() {
    let svc = service(json!({"tpSize": 4, "device": "cpu", "quantization": "fp8"}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert!(
        !api.calls()
            .iter()
            .any(|c| c.is("PATCH", "/deployments/llama-engine"))
    );
    let status = api.body("PATCH", "/status");
    let message = condition(&status, "Degraded")["message"]
        .as_str()
        .unwrap()
        .to_string();
    for expected in [
        "tpSize > 1 splits the model across GPUs: it needs device: cuda",
        "quantization fp8 runs on device: cuda",
    ] {
        assert!(message.contains(expected), "{message}");
    }
}

#[tokio::test]
async fn missing_service_monitor_crd_is_a_warning_not_a_failure() {
    let svc = service(json!({"monitoring": {"serviceMonitor": true}}));
    let missing: crate::fixtures::Responder = Box::new(|c| {
        c.is("PATCH", "/servicemonitors/").then(|| (404, json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound", "message": "the server could not find the requested resource"})))
    });
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), missing);
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    let event = api
        .calls()
        .into_iter()
        .find(|c| c.path.contains("/events") && c.body["reason"] == "ServiceMonitorUnavailable");
    assert_eq!(
        event.map(|e| e.body["type"].clone()),
        Some(json!("Warning"))
    );
    assert_eq!(
        condition(&api.body("PATCH", "/status"), "Ready")["status"],
        "True"
    );
}

#[test]
fn backoff_doubles_and_caps() {
    assert_eq!(backoff(1), Duration::from_secs(5));
    assert_eq!(backoff(4), Duration::from_secs(40));
    assert_eq!(backoff(30), Duration::from_secs(300));
}

/// A reconcile that sees `pods`, with engine Deployment counts of a 2-replica service where one
/// engine is ready.
async fn reconcile_with_pods(pods: Vec<Value>) -> FakeApi {
    let svc = service(json!({}));
    let list = pod_list(pods);
    let responder: crate::fixtures::Responder =
        Box::new(move |c| c.is("GET", "/pods").then(|| (200, list.clone())));
    let statuses = (
        json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "observedGeneration": 1}),
        json!({"replicas": 1, "readyReplicas": 1}),
    );
    let (ctx, api) = FakeApi::start(&svc, statuses, responder);
    let action = timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    assert_eq!(action, Action::requeue(Duration::from_secs(10)));
    api
}

#[tokio::test]
async fn a_crash_looping_engine_is_degraded_with_its_own_error() {
    let crashing = engine_pod(
        "llama-engine-1",
        json!({"phase": "Running", "containerStatuses": [{
            "name": "engine", "ready": false, "restartCount": 4, "image": "e", "imageID": "",
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 1m20s restarting failed container=engine pod=llama-engine-1"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "2026-11-26T04:00:00Z  INFO loading model\nerror: --model-path meta-llama/Llama-3.1-8B-Instruct does not exist (a GGUF file or a Hugging Face model folder)\n"}},
        }]}),
    );
    let healthy = engine_pod(
        "llama-engine-0",
        json!({"phase": "Running", "containerStatuses": [{
            "name": "engine", "ready": true, "restartCount": 0, "image": "e", "imageID": "",
            "state": {"running": {}}}]}),
    );
    let api = reconcile_with_pods(vec![healthy, crashing]).await;
    let status = api.body("PATCH", "/status");
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "CrashLoopBackOff");
    assert_eq!(
        degraded["message"],
        "pod llama-engine-1: container engine crash-loops, exit code 1: error: --model-path meta-llama/Llama-3.1-8B-Instruct does not exist (a GGUF file or a Hugging Face model folder)"
    );
    assert_eq!(condition(&status, "Ready")["status"], "False");
    assert_eq!(condition(&status, "Ready")["reason"], "CrashLoopBackOff");
    assert_eq!(condition(&status, "Progressing")["status"], "False");
    assert_eq!(status["status"]["reason"], "CrashLoopBackOff");
    assert_eq!(status["status"]["message"], degraded["message"]);
    assert_eq!(status["status"]["ready"], "1/2");
    let warning = api
        .calls()
        .into_iter()
        .find(|c| {
            c.path.contains("/events")
                && c.body["reason"] == "CrashLoopBackOff"
                && c.body["note"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("Degraded=True"))
        })
        .unwrap();
    assert_eq!(warning.body["type"], "Warning");
    assert!(
        warning.body["note"]
            .as_str()
            .unwrap()
            .contains("does not exist")
    );
}

#[tokio::test]
async fn an_unschedulable_engine_says_why() {
    let pending = engine_pod(
        "llama-engine-0",
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}),
    );
    let api = reconcile_with_pods(vec![pending]).await;
    let status = api.body("PATCH", "/status");
    let degraded = condition(&status, "Degraded");
    assert_eq!(degraded["reason"], "Unschedulable");
    assert_eq!(
        degraded["message"],
        "pod llama-engine-0 cannot be scheduled: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    );
    assert_eq!(status["status"]["reason"], "Unschedulable");
}

#[tokio::test]
async fn pods_that_run_leave_the_service_progressing_not_degraded() {
    // Starting, and running again after an earlier crash: nothing is stuck.
    let starting = engine_pod(
        "llama-engine-0",
        json!({"phase": "Running", "containerStatuses": [{
            "name": "engine", "ready": false, "restartCount": 1, "image": "e", "imageID": "",
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}),
    );
    let api = reconcile_with_pods(vec![starting]).await;
    let status = api.body("PATCH", "/status");
    assert_eq!(condition(&status, "Degraded")["status"], "False");
    assert_eq!(condition(&status, "Progressing")["status"], "True");
    assert_eq!(status["status"]["reason"], "EnginesNotReady");
}

/// RFC 7386, as the API server applies a merge patch.
fn apply_merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().unwrap();
    for (key, value) in fields {
        if value.is_null() {
            map.remove(key);
        } else {
            apply_merge_patch(map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[tokio::test]
async fn a_service_that_becomes_ready_clears_its_reason_and_message() {
    // Scaled up: not ready yet, with a reason and a message for `kubectl get`.
    let mut svc = service(json!({}));
    let (ctx, api) = FakeApi::start(&svc, not_ready(), no_override());
    timeout(reconcile(Arc::new(svc.clone()), ctx))
        .await
        .unwrap();
    let mut stored = json!({});
    apply_merge_patch(&mut stored, &api.body("PATCH", "/status")["status"]);
    assert_eq!(stored["reason"], "EnginesNotReady");
    assert!(stored["message"].is_string(), "{stored}");

    // The replicas come up: the patch, applied as the API server does, leaves no stale field.
    svc.status = Some(serde_json::from_value(stored.clone()).unwrap());
    let (ctx, api) = FakeApi::start(&svc, ready_statuses(), no_override());
    timeout(reconcile(Arc::new(svc), ctx)).await.unwrap();
    apply_merge_patch(&mut stored, &api.body("PATCH", "/status")["status"]);
    assert_eq!(
        condition(&json!({ "status": stored }), "Ready")["status"],
        "True"
    );
    assert!(stored.get("reason").is_none(), "{stored}");
    assert!(stored.get("message").is_none(), "{stored}");
    assert_eq!(stored["ready"], "2/2");
}
