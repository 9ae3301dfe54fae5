//! Scale to zero with the router as the activator: a service at zero engines whose router
//! holds requests until an engine serves them (r1), and the HPA taking an idle service to zero
//! and back on the router's waiting requests (s1).

use std::time::Duration;

use kube::api::Api;
use serde_json::json;
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    chat, delete_service, ensure_chart, ensure_namespace, generate_via_router, pod_ip, ready_pods,
    router_pending, wait_no_engine_pods, wait_ready_pods,
};
use crate::metrics::{ROUTER_WAITING_METRIC, ScalingWatch, custom_metrics_served};

/// Scale from zero with the router as the activator: a service at zero engines has a ready
/// router that holds requests in its bounded queue (counted by `sgl_router_pending_requests`,
/// the signal an autoscaler scales from zero on); a request beyond the queue is answered 503
/// with `Retry-After` at once; once the service has an engine (here `kubectl scale`, as an
/// autoscaler would), the held requests are served.
#[tokio::test]
async fn r1_a_service_at_zero_engines_holds_requests_until_its_first_engine_serves() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("zero-e2e", "idle");
    ensure_namespace(c, ns);
    c.apply(&format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: {name}
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
    servedModelName: {name}
  device: cpu
  tpSize: 1
  dpSize: 0
  router:
    queueSize: 2
    queueTimeoutSeconds: 120
"#
    ));
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for("the service to say it is scaled to zero", WAIT, || async {
        let s = api.get(name).await.map_err(|e| e.to_string())?;
        let ready = s.status.as_ref().and_then(|st| {
            st.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| (c.status.clone(), c.reason.clone()))
        });
        (ready == Some(("False".into(), "ScaledToZero".into())))
            .then_some(())
            .ok_or(format!("Ready {ready:?}"))
    })
    .await;
    // The router is ready with no engine at all.
    let router = wait_ready_pods(
        c,
        &client,
        ns,
        &format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=router"),
        1,
        "a ready router with no engine",
    )
    .await;
    let router_ip = pod_ip(&router[0]);
    assert!(
        ready_pods(&client, ns, &format!("serving.sgl-rs.io/engine={name}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty()
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let held: Vec<_> = (0..2)
        .map(|k| {
            let (http, ip) = (http.clone(), router_ip.clone());
            tokio::spawn(async move { chat(&http, &ip, "idle", &format!("Say {k}.")).await })
        })
        .collect();
    wait_for(
        "both requests to wait in the router's queue",
        WAIT,
        || async {
            let n = router_pending(&http, &router_ip).await?;
            (n == 2.0).then_some(()).ok_or(format!("{n} pending"))
        },
    )
    .await;
    // The queue is full: the next request is refused at once, with when to come back.
    let t = std::time::Instant::now();
    let refused = http
        .post(format!("http://{router_ip}:30000/v1/chat/completions"))
        .json(&json!({"model": "idle", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the request beyond the queue: {e}"));
    let refused_in = t.elapsed();
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let retry_after = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s > 0),
        "{:?}",
        refused.headers()
    );
    assert!(
        refused_in < Duration::from_secs(5),
        "refused after {refused_in:?}"
    );

    // The first engine comes; the held requests are served.
    let t = std::time::Instant::now();
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=1"]);
    let mut latencies = Vec::new();
    for h in held {
        let body = h
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("a held request: {e}"));
        latencies.push(t.elapsed().as_secs_f64());
        assert!(
            body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
    }
    let pending = router_pending(&http, &router_ip)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pending, 0.0);
    eprintln!(
        "r1: the request beyond the queue refused in {:.3} s (Retry-After {retry_after:?}); the held requests answered {latencies:.1?} s after the scale to one engine",
        refused_in.as_secs_f64()
    );
    delete_service(&client, ns, name).await;
}

/// Scale to zero and back with no hand on the count: an autoscaled service with
/// `minReplicas: 0` and a 5 s scale-down window is taken to zero engines by the HPA once
/// idle; the first requests then wait in the router (`sgl_router_pending_requests`), one
/// beyond its queue is answered 503 with `Retry-After`, and the HPA, reading the router's
/// waiting requests through the custom metrics API (an Object metric of the router's
/// Service), starts one engine, which serves them; idle again, the service returns to zero.
#[tokio::test]
async fn s1_an_idle_service_scales_to_zero_and_its_first_request_brings_an_engine_back() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    if !custom_metrics_served(c) {
        return;
    }
    ensure_chart(c, &client).await;
    let (ns, name) = ("autozero-e2e", "sleepy");
    ensure_namespace(c, ns);
    // dpSize is left at its default of 1: Kubernetes' HPA brings back from zero only a
    // workload it took to zero itself (a zero set by hand switches autoscaling off).
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
  router:
    queueSize: 2
    queueTimeoutSeconds: 120
  autoscaling:
    minReplicas: 0
    maxReplicas: 2
    scaleDownStabilizationSeconds: 5
"#
    ));
    let t_test = std::time::Instant::now();
    let mut watch = ScalingWatch::new(c, &client, ns, name);
    let engines = format!("serving.sgl-rs.io/engine={name}");
    wait_ready_pods(c, &client, ns, &engines, 1, "the first engine").await;
    let hpa = watch
        .hpas
        .get(&format!("{name}-engine"))
        .await
        .unwrap_or_else(|e| panic!("the service's HPA: {e}"));
    assert_eq!(hpa.spec.min_replicas, Some(0));
    assert!(
        hpa.spec.metrics.iter().flatten().any(|m| m
            .object
            .as_ref()
            .is_some_and(|o| o.metric.name == ROUTER_WAITING_METRIC
                && o.described_object.name == format!("{name}-router"))),
        "the HPA does not read {ROUTER_WAITING_METRIC} of the router: {:?}",
        hpa.spec.metrics
    );

    // Idle: the HPA takes the service to zero (and says so in its ScaledToZero condition).
    let t = std::time::Instant::now();
    watch
        .until("the HPA to take the idle service to zero", WAIT, |s| {
            Ok(s.dp_size == 0 && s.scaled_to_zero.as_deref() == Some("True"))
        })
        .await;
    let to_zero = t.elapsed();
    wait_no_engine_pods(&client, ns, name).await;
    let router = wait_ready_pods(
        c,
        &client,
        ns,
        &format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=router"),
        1,
        "a ready router with no engine",
    )
    .await;
    let router_ip = pod_ip(&router[0]);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));

    // Two requests wait in the router's queue; nobody scales the service.
    let t_first = std::time::Instant::now();
    let held: Vec<_> = (0..2)
        .map(|k| {
            let (http, ip) = (http.clone(), router_ip.clone());
            tokio::spawn(async move {
                let r = generate_via_router(&http, &ip, k).await;
                (r, t_first.elapsed())
            })
        })
        .collect();
    wait_for("both requests to wait in the router", WAIT, || async {
        let n = router_pending(&http, &router_ip).await?;
        (n == 2.0).then_some(()).ok_or(format!("{n} pending"))
    })
    .await;
    // The queue is full: the next request is refused at once, with when to come back.
    let t = std::time::Instant::now();
    let refused = http
        .post(format!("http://{router_ip}:30000/generate"))
        .json(&json!({"text": "Hi.", "sampling_params": {"max_new_tokens": 4}}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap_or_else(|e| panic!("the request beyond the queue: {e}"));
    let refused_in = t.elapsed();
    assert_eq!(refused.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let retry_after = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s > 0),
        "{:?}",
        refused.headers()
    );
    assert!(
        refused_in < Duration::from_secs(5),
        "refused after {refused_in:?}"
    );

    // The HPA starts an engine on the router's signal; the held requests are served.
    let mut latencies = Vec::new();
    for h in held {
        let (body, took) = h.await.unwrap_or_else(|e| panic!("{e}"));
        let body = body.unwrap_or_else(|e| panic!("a held request: {e}\n{}", watch.report()));
        assert!(
            body["meta_info"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
        latencies.push(took.as_secs_f64());
    }
    let events = c.kubectl(&[
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        &format!("involvedObject.name={name}-engine,reason=SuccessfulRescale"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("New size: 1") && l.contains(ROUTER_WAITING_METRIC)),
        "no rescale to 1 on {ROUTER_WAITING_METRIC} among the HPA's events:\n{events}"
    );

    // Idle again: back to zero.
    let t = std::time::Instant::now();
    watch
        .until("the HPA to return the service to zero", WAIT, |s| {
            Ok(s.dp_size == 0 && s.scaled_to_zero.as_deref() == Some("True"))
        })
        .await;
    let back_to_zero = t.elapsed();
    wait_no_engine_pods(&client, ns, name).await;
    eprintln!(
        "s1: to zero {:.1} s after the first engine was ready; from zero, the held requests answered {latencies:.1?} s after they were sent (the one beyond the queue refused in {:.3} s, Retry-After {retry_after:?}); back to zero {:.1} s after the last answer; {:.1} s in all\nHPA events:\n{events}\nscaling seen:\n{}",
        to_zero.as_secs_f64(),
        refused_in.as_secs_f64(),
        back_to_zero.as_secs_f64(),
        t_test.elapsed().as_secs_f64(),
        watch.history.join("\n")
    );
    delete_service(&client, ns, name).await;
}
