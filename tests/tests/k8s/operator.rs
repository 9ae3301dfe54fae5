//! What the operator admits, writes and reports: the CRD's rules refusing an invalid spec with
//! their messages (d1), the garbage collector removing a deleted service's children through
//! owner references (e1), an engine's own error reported as `Degraded` (h1), a conflicting
//! field manager overridden and named in an event (m1), and a same-named object the service
//! does not own left alone where the spec excludes that object (n1).

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    delete_service, ensure_chart, ensure_namespace, fake_service, wait_observed, wait_ready_pods,
    wait_serving,
};

#[tokio::test]
async fn d1_invalid_spec_is_refused_with_the_rule_message() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    for (spec, message) in [
        ("  tpSize: 3\n", "tpSize must be 1, 2, 4 or 8"),
        (
            "  autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}\n",
            "minReplicas must not exceed maxReplicas",
        ),
        (
            "  memFractionStatic: 1.5\n",
            "memFractionStatic must be between 0 and 1",
        ),
    ] {
        let yaml = fake_service("default", "refused", 1, "").replace("  tpSize: 1\n", "") + spec;
        let out = c.kubectl_raw(&["apply", "--server-side", "-f", "-"], Some(&yaml));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{spec} was admitted");
        assert!(
            stderr.contains(message),
            "refusal of {spec} lacks {message:?}: {stderr}"
        );
    }
    let api: Api<SGLangService> = Api::namespaced(client.clone(), "default");
    assert!(api.get_opt("refused").await.unwrap_or(None).is_none());
}

#[tokio::test]
async fn e1_deleting_a_service_removes_every_child_through_the_gc() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "gc-e2e";
    ensure_namespace(c, ns);
    c.apply(&fake_service(ns, "doomed", 2, ""));
    wait_serving(c, &client, ns, "doomed", 2).await;
    let kinds = "statefulsets,deployments,replicasets,services,serviceaccounts,roles,rolebindings,pods,poddisruptionbudgets,horizontalpodautoscalers";
    let owned = c.kubectl(&[
        "get",
        kinds,
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/instance=doomed",
        "-o",
        "name",
    ]);
    assert!(owned.contains("deployment.apps/doomed-engine"), "{owned}");
    assert!(owned.contains("deployment.apps/doomed-router"), "{owned}");
    // Not the operator: the garbage collector, through owner references.
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    api.delete("doomed", &DeleteParams::background())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("every child to be collected", WAIT, || async {
        let left = c.kubectl(&[
            "get",
            kinds,
            "-n",
            ns,
            "-l",
            "app.kubernetes.io/instance=doomed",
            "-o",
            "name",
        ]);
        left.trim().is_empty().then_some(()).ok_or(left)
    })
    .await;
}

#[tokio::test]
async fn h1_engine_error_is_reported_as_degraded() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "degraded-e2e";
    ensure_namespace(c, ns);
    // A real engine with a flag it refuses: it exits at once with its own error.
    let yaml = format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: broken
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
  device: cpu
  tpSize: 1
  dpSize: 1
  extraArgs: ["--no-such-flag"]
"#
    );
    c.apply(&yaml);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let message = wait_for("the pod to report the engine's exit", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("serving.sgl-rs.io/engine=broken"))
            .await
            .map_err(|e| e.to_string())?;
        let p = list.items.first().ok_or("no engine pod")?;
        let st = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first().cloned())
            .ok_or("no container status")?;
        st.last_state
            .and_then(|l| l.terminated)
            .and_then(|t| t.message)
            .ok_or(format!("state {:?}", st.state))
    })
    .await;
    assert!(message.contains("--no-such-flag"), "{message}");
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the service to say Degraded with the engine's error",
        Duration::from_secs(120),
        || async {
            let s = api.get("broken").await.map_err(|e| e.to_string())?;
            let conds = s.status.map(|st| st.conditions).unwrap_or_default();
            conds
                .iter()
                .find(|c| {
                    c.type_ == "Degraded"
                        && c.status == "True"
                        && c.message.contains("--no-such-flag")
                })
                .map(|_| ())
                .ok_or(format!("{conds:?}"))
        },
    )
    .await;
    delete_service(&client, ns, "broken").await;
}

#[tokio::test]
async fn m1_a_conflicting_field_manager_is_overridden_and_reported_in_events() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "conflict-e2e";
    ensure_namespace(c, ns);
    let env = "  env:\n  - {name: SGL_E2E_MARK, value: from-spec}\n";
    c.apply(&fake_service(ns, "contested", 2, env));
    wait_serving(c, &client, ns, "contested", 2).await;
    wait_observed(&client, ns, "contested").await;
    // Someone else takes the replicas and an env var of the operator's engine Deployment.
    let intruder = format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: contested-engine
  namespace: {ns}
spec:
  replicas: 5
  template:
    spec:
      containers:
      - name: engine
        env:
        - {{name: SGL_E2E_MARK, value: intruded}}
"#
    );
    let args = [
        "apply",
        "--server-side",
        "--field-manager=intruder",
        "--force-conflicts",
        "-f",
        "-",
    ];
    let out = c.kubectl_raw(&args, Some(&intruder));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sts: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait_for("the operator to restore its values", WAIT, || async {
        let s = sts
            .get("contested-engine")
            .await
            .map_err(|e| e.to_string())?;
        let spec = &s.spec;
        let mark = spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.containers.iter().find(|c| c.name == "engine"))
            .and_then(|c| c.env.as_ref())
            .and_then(|env| env.iter().find(|e| e.name == "SGL_E2E_MARK"))
            .and_then(|e| e.value.clone());
        let owners: Vec<String> = s
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
            })
            .filter_map(|m| m.manager.clone())
            .collect();
        (spec.replicas == Some(2)
            && mark.as_deref() == Some("from-spec")
            && !owners.iter().any(|o| o == "intruder"))
        .then_some(())
        .ok_or(format!(
            "replicas {:?}, mark {mark:?}, replicas owned by {owners:?}",
            spec.replicas
        ))
    })
    .await;
    let events = wait_for("a FieldManagerConflict event", WAIT, || async {
        let out = c.kubectl(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            "involvedObject.kind=SGLangService,involvedObject.name=contested,reason=FieldManagerConflict",
            "-o",
            "jsonpath={range .items[*]}{.type} {.message}{\"\\n\"}{end}",
        ]);
        (!out.trim().is_empty()).then_some(out.clone()).ok_or(out)
    })
    .await;
    assert!(
        events.starts_with("Warning ")
            && events.contains("intruder")
            && events.contains(".spec.replicas")
            && events.contains("Deployment contested-engine"),
        "the event does not say who held which field: {events}"
    );
    delete_service(&client, ns, "contested").await;
}

/// A service whose spec excludes an HPA (autoscaling off) and a router Service (router off)
/// must not delete same-named objects someone else made: the operator removes only what it
/// owns. The service still becomes ready, and after the operator has seen several generations
/// both objects are there, unchanged.
#[tokio::test]
async fn n1_same_named_objects_the_service_does_not_own_are_left_alone() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "foreign-e2e";
    ensure_namespace(c, ns);
    c.apply(&format!(
        r#"apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: mine-engine
  namespace: {ns}
  labels: {{made-by: someone-else}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: something-else}}
  minReplicas: 1
  maxReplicas: 2
  metrics:
    - type: Resource
      resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 80}}}}
---
apiVersion: v1
kind: Service
metadata:
  name: mine-router
  namespace: {ns}
  labels: {{made-by: someone-else}}
spec:
  ports: [{{port: 80}}]
  selector: {{app: something-else}}
"#
    ));
    let foreign = || {
        c.kubectl(&[
            "get",
            "horizontalpodautoscalers,services",
            "-n",
            ns,
            "-l",
            "made-by=someone-else",
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name}/{.metadata.uid} {end}",
        ])
    };
    let before = foreign();
    assert!(
        before.contains("HorizontalPodAutoscaler/mine-engine/")
            && before.contains("Service/mine-router/"),
        "{before}"
    );
    // autoscaling off (fake_service's default) and the router off: both names excluded
    let yaml = |dp: i32| {
        fake_service(ns, "mine", dp, "").replace(
            "  router:\n    image: example.com/fake-router:1\n",
            "  router:\n    enabled: false\n",
        )
    };
    assert!(yaml(1).contains("enabled: false"), "{}", yaml(1));
    c.apply(&yaml(1));
    let engines = "serving.sgl-rs.io/engine=mine";
    wait_ready_pods(c, &client, ns, engines, 1, "a ready engine pod of mine").await;
    // two more generations, so the operator runs its delete pass again
    for dp in [2, 1] {
        c.apply(&yaml(dp));
        wait_observed(&client, ns, "mine").await;
    }
    let after = foreign();
    assert_eq!(after, before, "objects the service does not own changed");
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    let svc = api.get("mine").await.unwrap_or_else(|e| panic!("{e}"));
    let degraded = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|cond| cond.type_ == "Degraded"))
        .map(|cond| cond.status.clone());
    assert_eq!(degraded.as_deref(), Some("False"), "{:?}", svc.status);
    delete_service(&client, ns, "mine").await;
}
