//! KEDA: the operator's ScaledObject against KEDA's own CRD (s2), and KEDA itself taking an
//! idle service to zero and back when a request waits in the router (s3); what the tests read
//! of KEDA is in [`crate::keda`].
//!
//! The module's name sorts after every other test module's, since the harness starts the tests
//! in the order of their paths and s3 leaves KEDA running on the cluster.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::Api;
use serde_json::json;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    cluster_script, delete_service, ensure_chart, ensure_namespace, generate_via_router, pod_ip,
    router_pending, wait_no_engine_pods, wait_ready_pods,
};
use crate::keda::{
    KedaChart, KedaWatch, external_metric, keda_built, ports_env, scaled_object_events,
};
use crate::metrics::custom_metrics_served;

/// With the chart's KEDA option the operator scales a `minReplicas: 0` service with a KEDA
/// ScaledObject instead of its HPA. Here KEDA's own ScaledObject CRD (from its Go module, by
/// `tests/k8s/build.sh`) is installed, and the API server validates the ScaledObject
/// `sgl-operator render` plans (the same plan the controller applies) against that schema,
/// every field of it (s3 runs KEDA itself on what the operator applies); a broken one is
/// refused, so the check can fail. The CRD stays installed (as `cluster.sh keda-start`
/// installs it).
#[tokio::test]
async fn s2_the_keda_scaled_object_is_valid_against_kedas_own_crd() {
    let (c, _turn) = cluster!();
    let crd = c.bin.join("keda/crds/keda.sh_scaledobjects.yaml");
    if !crd.is_file() {
        let why = format!(
            "no KEDA ScaledObject CRD at {} (tests/k8s/build.sh copies it from KEDA's module)",
            crd.display()
        );
        assert!(
            std::env::var(sgl_e2e_tests::k8s::cluster::REQUIRED_ENV).as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED: {why}");
        return;
    }
    let crd_path = crd.display().to_string();
    c.kubectl(&["apply", "--server-side", "-f", &crd_path]);
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/scaledobjects.keda.sh",
        "--timeout=60s",
    ]);
    let ns = "keda-e2e";
    ensure_namespace(c, ns);
    let service = format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata: {{name: sleepy, namespace: {ns}}}
spec:
  model: {{path: /models/SmolLM2-135M-Instruct.Q4_1.gguf}}
  device: cpu
  autoscaling: {{minReplicas: 0, maxReplicas: 4, targetQueueLength: 2, targetCacheHitRate: 0.5, scaleDownStabilizationSeconds: 30}}
"#
    );
    let operator = sgl_e2e_tests::release_binary("sgl-operator").unwrap_or_else(|e| panic!("{e}"));
    let mut render = std::process::Command::new(operator)
        .args([
            "render",
            "-f",
            "-",
            "--keda-prometheus-url",
            "http://prometheus-operated.monitoring.svc:9090",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("sgl-operator render: {e}"));
    if let Some(mut stdin) = render.stdin.take() {
        use std::io::Write;
        stdin
            .write_all(service.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let out = render
        .wait_with_output()
        .unwrap_or_else(|e| panic!("sgl-operator render: {e}"));
    assert!(out.status.success(), "sgl-operator render failed");
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let scaled: Vec<&str> = rendered
        .split("---\n")
        .filter(|d| d.contains("kind: ScaledObject"))
        .collect();
    assert_eq!(scaled.len(), 1, "{rendered}");
    assert!(
        !rendered.contains("kind: HorizontalPodAutoscaler"),
        "{rendered}"
    );
    // The owner reference names a uid that does not exist: validation only, nothing stored.
    let dry_run = ["apply", "--dry-run=server", "-f", "-"];
    let ok = c.kubectl_raw(&dry_run, Some(scaled[0]));
    assert!(
        ok.status.success(),
        "KEDA's schema refused the ScaledObject: {}\n{}",
        String::from_utf8_lossy(&ok.stderr),
        scaled[0]
    );
    let broken = scaled[0].replace("minReplicaCount: 0", "minReplicaCount: none");
    assert_ne!(broken, scaled[0]);
    let refused = c.kubectl_raw(&dry_run, Some(&broken));
    assert!(
        !refused.status.success(),
        "a ScaledObject with minReplicaCount \"none\" passed KEDA's schema"
    );
    eprintln!(
        "s2: the ScaledObject passed the schema of {crd_path}; a broken one was refused: {}",
        String::from_utf8_lossy(&refused.stderr).trim()
    );
    c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// KEDA for real: with the chart's KEDA option the operator gives a `minReplicas: 0` service a
/// ScaledObject (and no HPA of its own) whose triggers query the cluster's Prometheus; KEDA
/// (built from its module, its operator and metrics API server running as its service account
/// with its RBAC) creates its HPA for one engine and more, serves every trigger's value through
/// `external.metrics.k8s.io`, takes the idle service to zero engines itself, activates it
/// (0 → 1) when a request waits in the router (`sgl_router_pending_requests`, the
/// `router-waiting` trigger), its HPA then reads every trigger, and it takes the service back
/// to zero `cooldownPeriod` (the service's `scaleDownStabilizationSeconds`) after the last
/// active trigger.
#[tokio::test]
async fn s3_keda_takes_an_idle_service_to_zero_and_a_waiting_request_brings_an_engine_back() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    if !custom_metrics_served(c) || !keda_built(c) {
        return;
    }
    cluster_script(c, "keda-start");
    ensure_chart(c, &client).await;
    let (ns, name) = ("kedazero-e2e", "drowsy");
    let so_name = format!("{name}-engine");
    let keda_hpa = format!("keda-hpa-{so_name}");
    let prometheus = ports_env(c, "PROMETHEUS_URL");
    let _keda = KedaChart::enable(c, &prometheus, ns);
    ensure_chart(c, &client).await;
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
  device: cpu
  tpSize: 1
  router:
    queueSize: 2
    queueTimeoutSeconds: 120
  autoscaling:
    minReplicas: 0
    maxReplicas: 2
    scaleDownStabilizationSeconds: 15
"#
    ));
    let t_test = std::time::Instant::now();
    let mut watch = KedaWatch::new(c, &client, ns, name);

    // The operator's ScaledObject, and KEDA's HPA from it; no HPA of the operator's.
    let s = watch
        .until(
            "KEDA to accept the ScaledObject and create its HPA",
            WAIT,
            |s| s.so_ready.as_ref().is_some_and(|(st, _)| st == "True") && s.keda_hpa,
        )
        .await;
    assert_eq!(s.so_status["hpaName"], keda_hpa.as_str(), "{}", s.so_status);
    assert_eq!(
        s.so_status["scaleTargetKind"], "serving.sgl-rs.io/v1alpha1.SGLangService",
        "{}",
        s.so_status
    );
    let metric_count = s.so_status["externalMetricNames"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(
        metric_count, 4,
        "one external metric a trigger: {}",
        s.so_status
    );
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), ns);
    assert!(
        hpas.get_opt(&so_name)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none(),
        "the operator made an HPA beside the ScaledObject"
    );
    let hpa = hpas
        .get(&keda_hpa)
        .await
        .unwrap_or_else(|e| panic!("KEDA's HPA: {e}"));
    assert_eq!(hpa.spec.min_replicas, Some(1));
    assert_eq!(hpa.spec.max_replicas, 2);
    assert_eq!(hpa.spec.scale_target_ref.kind, "SGLangService");
    assert_eq!(hpa.spec.scale_target_ref.name, name);
    let external = hpa
        .spec
        .metrics
        .iter()
        .flatten()
        .filter(|m| m.type_ == "External")
        .count();
    assert_eq!(external, 4, "{:?}", hpa.spec.metrics);
    let window = hpa
        .spec
        .behavior
        .as_ref()
        .and_then(|b| b.scale_down.as_ref())
        .and_then(|d| d.stabilization_window_seconds);
    assert_eq!(window, Some(15));

    // Idle: KEDA takes the service to zero engines (no trigger is active).
    let t = std::time::Instant::now();
    watch
        .until("KEDA to take the idle service to zero", WAIT, |s| {
            s.dp_size == 0
                && s.ready == Some(("False".into(), "ScaledToZero".into()))
                && s.so_active.as_ref().is_some_and(|(st, _)| st == "False")
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
    // KEDA's metrics API serves each trigger's value (what KEDA's HPA reads): all 0 while idle.
    let metric_names: Vec<String> = s.so_status["externalMetricNames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect();
    for m in &metric_names {
        let v = wait_for(&format!("{m} through KEDA's metrics API"), WAIT, || async {
            external_metric(c, ns, &so_name, m)
        })
        .await;
        assert_eq!(v, 0.0, "{m} of the idle service");
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));

    // A request waits in the router; nobody but KEDA scales the service.
    let t_sent = std::time::Instant::now();
    let held = {
        let (http, ip) = (http.clone(), router_ip.clone());
        tokio::spawn(async move {
            let r = generate_via_router(&http, &ip, 7).await;
            (r, t_sent.elapsed())
        })
    };
    wait_for("the request to wait in the router", WAIT, || async {
        let n = router_pending(&http, &router_ip).await?;
        (n == 1.0).then_some(()).ok_or(format!("{n} pending"))
    })
    .await;
    let active = watch
        .until("KEDA to activate the service", WAIT, |s| {
            s.dp_size == 1 && s.so_active.as_ref().is_some_and(|(st, _)| st == "True")
        })
        .await;
    let activated_after = t_sent.elapsed();
    let router_waiting_active = active.so_status["triggersActivity"]
        .as_object()
        .and_then(|m| m.iter().find(|(k, _)| k.starts_with("s0-")))
        .map(|(_, v)| v["isActive"].clone());
    let (body, latency) = held.await.unwrap_or_else(|e| panic!("{e}"));
    let body = body.unwrap_or_else(|e| panic!("the held request: {e}\n{}", watch.report()));
    assert!(
        body["meta_info"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{body}"
    );
    watch
        .until("the service to be Ready with its engine", WAIT, |s| {
            s.ready.as_ref().is_some_and(|(st, _)| st == "True") && s.replicas.1 == 1
        })
        .await;
    // With an engine, KEDA's HPA reads every trigger through KEDA's metrics API.
    watch
        .until(
            "KEDA's HPA to read its metrics",
            Duration::from_secs(60),
            |s| s.dp_size == 1 && s.hpa_active == Some(("True".into(), "ValidMetricFound".into())),
        )
        .await;
    let hpa = hpas
        .get(&keda_hpa)
        .await
        .unwrap_or_else(|e| panic!("KEDA's HPA: {e}"));
    let current = hpa
        .status
        .as_ref()
        .and_then(|st| st.current_metrics.as_ref())
        .map_or(0, |m| {
            m.iter()
                .filter(|m| {
                    m.external
                        .as_ref()
                        .is_some_and(|e| e.current.average_value.is_some())
                })
                .count()
        });
    assert_eq!(current, 4, "KEDA's HPA status: {:?}", hpa.status);

    // Idle again: back to zero after the cooldown.
    let t = std::time::Instant::now();
    watch
        .until("KEDA to return the service to zero", WAIT, |s| {
            s.dp_size == 0 && s.ready == Some(("False".into(), "ScaledToZero".into()))
        })
        .await;
    let back_to_zero = t.elapsed();
    wait_no_engine_pods(&client, ns, name).await;
    let events = scaled_object_events(c, ns, &so_name);
    let activated: Vec<&str> = events
        .lines()
        .filter(|l| l.starts_with("KEDAScaleTargetActivated:"))
        .collect();
    assert!(
        activated
            .iter()
            .any(|l| l.contains(&format!("{ns}/{name} from 0 to 1"))),
        "no activation from 0 to 1 among KEDA's events:\n{events}"
    );
    let deactivated = events
        .lines()
        .filter(|l| l.starts_with("KEDAScaleTargetDeactivated:") && l.contains("to 0"))
        .count();
    assert!(
        deactivated >= 2,
        "KEDA deactivated the service {deactivated} times (idle at the start, idle after the request):\n{events}"
    );
    eprintln!(
        "s3: to zero {:.1} s after KEDA's HPA existed; the held request activated the service after {:.1} s (router-waiting trigger active: {router_waiting_active:?}) and was answered after {:.1} s; back to zero {:.1} s after the answer; {:.1} s in all\nKEDA's events:\n{events}\nscaling seen:\n{}",
        to_zero.as_secs_f64(),
        activated_after.as_secs_f64(),
        latency.as_secs_f64(),
        back_to_zero.as_secs_f64(),
        t_test.elapsed().as_secs_f64(),
        watch.history.join("\n")
    );
    assert_eq!(
        router_waiting_active,
        Some(json!(true)),
        "the router-waiting trigger (s0) was not the active one:\n{}",
        watch.report()
    );
    delete_service(&client, ns, name).await;
}
