//! End to end on a real control plane (`tests/k8s/cluster.sh`): the chart installed with the
//! real Helm, the operator running with the chart's service account, engines and routers
//! running as processes in pods bound to kwok nodes (the pod runner), checked with kubectl,
//! the Kubernetes API and HTTP on the pod IPs.
//!
//! Skipped (with a message) when the control plane is not built; `SGL_K8S_REQUIRED=1` (set by
//! `.ci/run`) makes that a failure. The tests share one cluster and take turns on it.
#![allow(
    clippy::await_holding_lock,
    reason = "each test holds the cluster's turn (a std mutex) for its whole body, on its own runtime"
)]

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};
use sgl_crds::SGLangService;
use sgl_e2e_tests::default_model;
use sgl_e2e_tests::k8s::cluster::{Cluster, WAIT, wait_for};

#[path = "k8s/common.rs"]
mod common;
#[path = "k8s/hub.rs"]
mod hub;
#[path = "k8s/keda.rs"]
mod keda;
#[path = "k8s/metrics.rs"]
mod metrics;
#[path = "k8s/rollout.rs"]
mod rollout;

use common::*;
use keda::*;
use metrics::*;
use rollout::MODEL;

macro_rules! cluster {
    () => {
        match Cluster::get(RUNNER) {
            Some(c) => c,
            None => return,
        }
    };
}

#[tokio::test]
async fn a1_control_plane_binds_and_runs_a_tolerating_pod() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    let nodes = c.kubectl(&["get", "nodes", "-o", "name"]);
    for n in ["kwok-node-0", "kwok-gpu-0", "kwok-tainted-0"] {
        assert!(nodes.contains(n), "node {n} missing: {nodes}");
    }
    let ns = "smoke";
    ensure_namespace(c, ns);
    let pod = |name: &str, tolerate: bool| {
        let tol = if tolerate {
            "  tolerations:\n  - {key: kwok.x-k8s.io/node, operator: Exists, effect: NoSchedule}\n"
        } else {
            ""
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  nodeSelector: {{kubernetes.io/hostname: kwok-tainted-0}}\n{tol}  containers:\n  - name: c\n    image: registry.example/anything:1.0\n"
        )
    };
    c.apply(&pod("tolerating", true));
    c.apply(&pod("intolerant", false));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let running = wait_for("the tolerating pod to run", WAIT, || async {
        let p = pods.get("tolerating").await.map_err(|e| e.to_string())?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        (phase.as_deref() == Some("Running") && pod_ready(&p))
            .then_some(p.clone())
            .ok_or(format!("phase {phase:?}"))
    })
    .await;
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("kwok-tainted-0")
    );
    assert!(
        pod_ip(&running).starts_with("127.3."),
        "pod IP {} is not in the node's CIDR",
        pod_ip(&running)
    );
    let intolerant = wait_for(
        "the scheduler to refuse the intolerant pod",
        WAIT,
        || async {
            let p = pods.get("intolerant").await.map_err(|e| e.to_string())?;
            let cond = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled").cloned());
            match cond {
                Some(c) if c.status == "False" => Ok(c),
                other => Err(format!("PodScheduled {other:?}")),
            }
        },
    )
    .await;
    assert_eq!(intolerant.reason.as_deref(), Some("Unschedulable"));
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease = wait_for("the controller manager's leader lease", WAIT, || async {
        leases
            .get("kube-controller-manager")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    c.kubectl(&["delete", "namespace", ns, "--wait=true", "--timeout=180s"]);
}

#[tokio::test]
async fn b1_helm_install_runs_the_operator_with_the_chart_service_account() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let crd = c.kubectl(&[
        "get",
        "crd",
        "sglangservices.serving.sgl-rs.io",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
    ]);
    assert_eq!(crd.trim(), "True");
    let d = operator_deployment(&client).await;
    let sa = d
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| panic!("the operator Deployment names no service account"));
    let me = format!("system:serviceaccount:{CHART_NS}:{sa}");
    // What the operator needs, the chart grants; what it does not, it does not.
    for (verb, resource, sub, expect) in [
        ("patch", "statefulsets.apps", "", "yes"),
        ("create", "horizontalpodautoscalers.autoscaling", "", "yes"),
        ("patch", "sglangservices.serving.sgl-rs.io", "status", "yes"),
        ("patch", "sglangservices.serving.sgl-rs.io", "", "no"),
        ("delete", "nodes", "", "no"),
        ("get", "secrets", "", "no"),
    ] {
        let mut args = vec![
            "auth", "can-i", verb, resource, "-n", "default", "--as", &me,
        ];
        let subresource = format!("--subresource={sub}");
        if !sub.is_empty() {
            args.push(&subresource);
        }
        let out = c.kubectl_raw(&args, None);
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(said, expect, "can {me} {verb} {resource} {sub}?");
    }
    // The operator pods run as processes that use the service account's token: the leader
    // Lease they write is proof that the chart's RBAC lets them work.
    let leases: Api<Lease> = Api::namespaced(client.clone(), CHART_NS);
    let pods = ready_pods(
        &client,
        CHART_NS,
        &format!("app.kubernetes.io/instance={RELEASE}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let names: HashSet<String> = pods.iter().map(|p| p.name_any()).collect();
    let holder = wait_for("an operator pod to hold the leader lease", WAIT, || async {
        let list = leases
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
            .find(|h| names.contains(h))
            .ok_or(format!(
                "leases: {:?}",
                list.items.iter().map(|l| l.name_any()).collect::<Vec<_>>()
            ))
    })
    .await;
    assert!(names.contains(&holder));
}

#[tokio::test]
async fn c1_cpu_example_serves_chat_through_the_router_and_scales_to_three() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("default", "smollm2");
    c.apply(&example("cpu-smollm2.yaml"));
    wait_serving(c, &client, ns, name, 1).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let router = router_pods(&client, ns, name)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let router_ip = pod_ip(&router[0]);
    let body = wait_for("a chat completion through the router", WAIT, || {
        let http = http.clone();
        let ip = router_ip.clone();
        async move { chat(&http, &ip, "smollm2", "Say hello.").await }
    })
    .await;
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!content.is_empty(), "empty completion: {body}");
    assert!(
        body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{body}"
    );

    // `kubectl get sgls` shows the printer columns.
    let table = wait_for("the service to report ready", WAIT, || async {
        let t = c.kubectl(&["get", "sgls", "-n", ns]);
        t.contains("1/1").then_some(t.clone()).ok_or(t)
    })
    .await;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    // The printer columns, in order (others may stand between them).
    let mut at = 0;
    for column in ["NAME", "MODEL", "TP", "READY", "ENDPOINT", "AGE"] {
        match header[at..].iter().position(|h| *h == column) {
            Some(i) => at += i + 1,
            None => panic!("column {column} missing or out of order: {table}"),
        }
    }
    let row = table.lines().nth(1).unwrap_or("");
    assert!(
        row.starts_with(name) && row.contains("/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{table}"
    );

    // `kubectl scale` → three ready engines, and the router sends requests to each.
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=3"]);
    let engines = wait_serving(c, &client, ns, name, 3).await;
    // Ready again: the reason and message shown while scaling are gone, not left stale.
    wait_ready_without_reason(&client, ns, name).await;
    let before = engine_request_counts(&http, &engines).await;
    wait_for(
        "the router to send requests to all three engines",
        WAIT,
        || {
            let http = http.clone();
            let ip = router_ip.clone();
            let engines = engines.clone();
            let before = before.clone();
            async move {
                for i in 0..3 {
                    chat(&http, &ip, "smollm2", &format!("Count to {i}.")).await?;
                }
                let now = engine_request_counts(&http, &engines).await;
                let idle: Vec<&String> = now
                    .iter()
                    .filter(|(pod, n)| before.get(*pod).copied().unwrap_or(0.0) >= **n)
                    .map(|(pod, _)| pod)
                    .collect();
                idle.is_empty().then_some(()).ok_or(format!(
                    "no request reached {idle:?} (before {before:?}, now {now:?})"
                ))
            }
        },
    )
    .await;
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=1"]);
}

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
async fn f1_operator_restart_makes_no_writes() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "restart-e2e";
    ensure_namespace(c, ns);
    c.apply(&fake_service(ns, "steady", 2, ""));
    wait_serving(c, &client, ns, "steady", 2).await;
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for("the service to be Ready", WAIT, || async {
        let s = api.get("steady").await.map_err(|e| e.to_string())?;
        let ready = s.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
        ready.then_some(()).ok_or(format!("{:?}", s.status))
    })
    .await;
    let versions = || async {
        let out = c.kubectl(&[
            "get",
            "sglangservices,statefulsets,deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion}{\"\\n\"}{end}",
        ]);
        out.lines().map(str::to_string).collect::<Vec<_>>()
    };
    let before = versions().await;
    assert!(before.len() >= 4, "{before:?}");
    // Restart: delete the operator pods; the Deployment brings up new ones, which reconcile
    // every service on start.
    let old: HashSet<String> = ready_pods(
        &client,
        CHART_NS,
        &format!("app.kubernetes.io/instance={RELEASE}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
    .iter()
    .map(|p| p.name_any())
    .collect();
    c.kubectl(&[
        "delete",
        "pods",
        "-n",
        CHART_NS,
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
        "--wait=true",
    ]);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    wait_for("a new operator to reconcile the service", WAIT, || async {
        let pods = ready_pods(
            &client,
            CHART_NS,
            &format!("app.kubernetes.io/instance={RELEASE}"),
        )
        .await?;
        for p in pods.iter().filter(|p| !old.contains(&p.name_any())) {
            let url = format!("http://{}:8080/metrics", pod_ip(p));
            let text = http
                .get(&url)
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            let reconciled = text
                .lines()
                .filter(|l| l.starts_with("sgl_operator_reconciliations_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            if reconciled >= 1.0 {
                return Ok(());
            }
        }
        Err("no new operator has reconciled yet".into())
    })
    .await;
    let after = versions().await;
    assert_eq!(
        before, after,
        "the restarted operator wrote to objects that were up to date"
    );
    delete_service(&client, ns, "steady").await;
}

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
async fn z1_helm_upgrade_then_uninstall() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    let (release, ns) = ("sgl-b", "sgl-b");
    c.helm(&[
        "install",
        release,
        &chart_dir(),
        "-n",
        ns,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        "leaderElection.enabled=false",
    ]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let find = || async {
        deployments
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
            .await
            .map_err(|e| e.to_string())
            .map(|l| l.items)
    };
    let env_of = |d: &Deployment| -> Option<String> {
        d.spec.template.spec.as_ref()?.containers[0]
            .env
            .as_ref()?
            .iter()
            .find(|e| e.name == "RUST_LOG")?
            .value
            .clone()
    };
    let d = find().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.len(), 1);
    assert_eq!(env_of(&d[0]).as_deref(), Some("info"));
    c.helm(&[
        "upgrade",
        release,
        &chart_dir(),
        "-n",
        ns,
        "--reuse-values",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "5m",
    ]);
    let d = find().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(env_of(&d[0]).as_deref(), Some("debug"));
    let pods = ready_pods(
        &client,
        ns,
        &format!("app.kubernetes.io/instance={release}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        pods.iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0]
                .env
                .iter()
                .flatten()
                .any(|e| e.name == "RUST_LOG" && e.value.as_deref() == Some("debug")))),
        "the rollout left pods of the old template"
    );
    c.helm(&["uninstall", release, "-n", ns, "--wait", "--timeout", "5m"]);
    let left = find().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        left.is_empty(),
        "the operator Deployment survived uninstall"
    );
    let roles = c.kubectl(&[
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        &format!("app.kubernetes.io/instance={release}"),
        "-o",
        "name",
    ]);
    assert!(
        roles.trim().is_empty(),
        "cluster RBAC survived uninstall: {roles}"
    );
    // The CRD stays (Helm never deletes CRDs), so the main release's services are untouched.
    c.kubectl(&["get", "crd", "sglangservices.serving.sgl-rs.io"]);
    c.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

#[tokio::test]
async fn i1_engine_metrics_stay_open_with_an_api_key() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let ns = "apikey-e2e";
    ensure_namespace(c, ns);
    c.apply(&format!(
        r#"apiVersion: v1
kind: Secret
metadata:
  name: engine-key
  namespace: {ns}
stringData:
  key: s3cret-key
---
apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: keyed
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
  device: cpu
  tpSize: 1
  dpSize: 1
  apiKeySecretRef: {{name: engine-key, key: key}}
"#
    ));
    let engines = wait_for("a ready engine", WAIT, || async {
        let pods = ready_pods(&client, ns, "serving.sgl-rs.io/engine=keyed").await?;
        (!pods.is_empty())
            .then_some(pods.clone())
            .ok_or(c.log_tail("pod-runner", 10))
    })
    .await;
    let ip = pod_ip(&engines[0]);
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let status = |path: &'static str, key: Option<&'static str>| {
        let http = http.clone();
        let url = format!("http://{ip}:30000{path}");
        async move {
            let mut req = http.get(url);
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            req.send().await.map(|r| r.status().as_u16()).unwrap_or(0)
        }
    };
    // The key from the Secret reached the engine through $(SGLANG_API_KEY).
    assert_eq!(status("/v1/models", None).await, 401);
    assert_eq!(status("/v1/models", Some("s3cret-key")).await, 200);
    // Prometheus scrapes without the key: /metrics must stay open.
    assert_eq!(
        status("/metrics", None).await,
        200,
        "/metrics refused a scrape without the API key"
    );
    delete_service(&client, ns, "keyed").await;
}

#[tokio::test]
async fn j1_gpu_examples_are_admitted_or_refused_and_say_why_they_do_not_serve() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    for file in [
        "llama-8b-tp1-dp2.yaml",
        "llama-70b-tp4.yaml",
        "autoscaled.yaml",
    ] {
        let yaml = example(file);
        let out = c.kubectl_raw(&["apply", "--server-side", "-f", "-"], Some(&yaml));
        if !out.status.success() {
            // Refused at admission: the refusal must say why.
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("SGLangService") && stderr.contains("spec"),
                "{file}: {stderr}"
            );
            continue;
        }
        let name = yaml
            .split("kind: SGLangService")
            .nth(1)
            .and_then(|rest| rest.lines().find_map(|l| l.trim().strip_prefix("name: ")))
            .unwrap_or_else(|| panic!("{file}: no SGLangService name"))
            .to_string();
        let api: Api<SGLangService> = Api::namespaced(client.clone(), "default");
        let sts: Api<Deployment> = Api::namespaced(client.clone(), "default");
        wait_for(&format!("{file}: its engine Deployment"), WAIT, || async {
            sts.get(&format!("{name}-engine"))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
        wait_for(
            &format!("{file}: a status that says why it is not serving"),
            WAIT,
            || async {
                let s = api.get(&name).await.map_err(|e| e.to_string())?;
                let conds = s.status.map(|st| st.conditions).unwrap_or_default();
                let ready = conds.iter().find(|c| c.type_ == "Ready");
                match ready {
                    Some(r) if r.status == "False" && !r.message.is_empty() => {
                        let why = conds.iter().any(|c| {
                            (c.type_ == "Degraded" && c.status == "True")
                                || c.type_ == "Progressing"
                        });
                        why.then_some(()).ok_or(format!("{conds:?}"))
                    }
                    _ => Err(format!("{conds:?}")),
                }
            },
        )
        .await;
        delete_service(&client, "default", &name).await;
    }
}

#[tokio::test]
async fn k1_a_hub_model_is_downloaded_once_into_the_cache_and_every_replica_starts_from_it() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("cache-e2e", "hubmodel");
    ensure_namespace(c, ns);
    let model = default_model().unwrap_or_else(|e| panic!("{e}"));
    let file = model
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_else(|| panic!("{}: no file name", model.display()))
        .to_string();
    let size = std::fs::metadata(&model)
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()))
        .len();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let hub = hub::HubServer::start("test-org/smollm2", commit, std::slice::from_ref(&model))
        .unwrap_or_else(|e| panic!("hub server: {e}"));
    let cache = c.work.join(format!("pv-{ns}-hf-cache"));
    let _ = std::fs::remove_dir_all(&cache);
    host_path_claim(c, &client, ns, "hf-cache", &cache.display().to_string()).await;

    // One replica first: its init container downloads the model into the claim.
    c.apply(&format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: {name}
  namespace: {ns}
spec:
  model:
    path: test-org/smollm2/{file}
  device: cpu
  dpSize: 1
  modelCache:
    claimName: hf-cache
    mountPath: /hf-cache
  env:
    - name: HF_ENDPOINT
      value: {endpoint}
  router:
    enabled: false
"#,
        endpoint = hub.endpoint
    ));
    let engines = format!("serving.sgl-rs.io/engine={name}");
    let wait_engines = |n: usize| {
        let engines = engines.clone();
        let client = client.clone();
        async move {
            wait_ready_pods(
                c,
                &client,
                ns,
                &engines,
                n,
                &format!("{n} ready engine pods"),
            )
            .await
        }
    };
    let first = wait_engines(1).await;
    let done = download_state(&first[0])
        .unwrap_or_else(|| panic!("no finished model-download in {:?}", first[0].status));
    assert_eq!(done.exit_code, 0, "{done:?}");
    let fetched = hub.counters();
    assert_eq!(
        (fetched.cdn_get, fetched.cdn_bytes),
        (1, size),
        "the model is fetched once, whole: {fetched:?}"
    );
    // The engine itself started from the cache, offline.
    let snapshot = cache.join(format!(
        "hub/models--test-org--smollm2/snapshots/{commit}/{file}"
    ));
    assert!(snapshot.is_file(), "{} is missing", snapshot.display());
    // The status names the commit the download resolved (from the init container's
    // termination message).
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let shown = c.kubectl(&[
            "get",
            "sgls",
            name,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.modelCommit}",
        ]);
        if shown.trim() == commit {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "status.modelCommit is {shown:?}, not {commit}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A second replica starts from the cache: not one file request reaches the Hub.
    c.kubectl(&["scale", "sgls", name, "-n", ns, "--replicas=2"]);
    let both = wait_engines(2).await;
    for p in &both {
        let done = download_state(p)
            .unwrap_or_else(|| panic!("{}: no finished model-download", p.name_any()));
        assert_eq!(done.exit_code, 0, "{done:?}");
    }
    let after = hub.counters();
    assert_eq!(
        after.file_requests(),
        fetched.file_requests(),
        "the second start fetched from the Hub: before {fetched:?}, after {after:?}"
    );
    assert_eq!(after.cdn_bytes, size, "{after:?}");

    // Both engines serve the model from the cache.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    for p in &both {
        let ip = pod_ip(p);
        let models: Value = http
            .get(format!("http://{ip}:30000/v1/models"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let id = models["data"][0]["id"].as_str().unwrap_or("").to_string();
        let body = chat(&http, &ip, &id, "Say hello.")
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", p.name_any()));
        assert!(
            body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
    }
    assert_eq!(
        hub.counters().file_requests(),
        fetched.file_requests(),
        "serving reached the Hub"
    );

    delete_service(&client, ns, name).await;
    c.kubectl(&["delete", "pvc", "hf-cache", "-n", ns, "--wait=false"]);
    c.kubectl(&["delete", "pv", &format!("{ns}-hf-cache"), "--wait=false"]);
}

#[tokio::test]
async fn l1_two_operators_elect_one_leader_and_the_follower_takes_over_when_it_dies() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = "leader-e2e";
    ensure_namespace(c, ns);
    let (leader, follower) = wait_for("two operators, one of them leading", WAIT, || async {
        let pods = ready_pods(
            &client,
            CHART_NS,
            &format!("app.kubernetes.io/instance={RELEASE}"),
        )
        .await?;
        if pods.len() != 2 {
            return Err(format!("{} ready operator pods", pods.len()));
        }
        let holder = lease_holder(&client).await?;
        let (lead, follow): (Vec<Pod>, Vec<Pod>) =
            pods.into_iter().partition(|p| p.name_any() == holder);
        match (lead.as_slice(), follow.as_slice()) {
            ([l], [f]) => Ok((l.clone(), f.clone())),
            _ => Err(format!(
                "the lease holder {holder} is not one of the two pods"
            )),
        }
    })
    .await;
    // One leads and reconciles; the other follows and does not.
    assert_eq!(
        operator_metric(&http, &leader, "sgl_operator_leader").await,
        Ok(1.0)
    );
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_leader").await,
        Ok(0.0)
    );
    let follower_before = operator_metric(&http, &follower, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    c.apply(&fake_service(ns, "led", 1, ""));
    wait_engine_replicas(&client, ns, "led", 1).await;
    let leader_count = operator_metric(&http, &leader, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(leader_count >= 1.0, "the leader has not reconciled");
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_reconciliations_total").await,
        Ok(follower_before),
        "the follower reconciled while another replica led"
    );
    // Kill the leader and keep it dead: the Deployment goes down to one replica and the
    // ReplicaSet removes the leader (lowest deletion cost), so the follower is the only
    // candidate left and must take over once the dead leader's lease runs out.
    let deployment = operator_deployment(&client).await.name_any();
    for (pod, cost) in [(&leader, "-100"), (&follower, "100")] {
        c.kubectl(&[
            "annotate",
            "pod",
            "-n",
            CHART_NS,
            &pod.name_any(),
            &format!("controller.kubernetes.io/pod-deletion-cost={cost}"),
            "--overwrite",
        ]);
    }
    c.kubectl(&[
        "scale",
        "deployment",
        "-n",
        CHART_NS,
        &deployment,
        "--replicas=1",
    ]);
    wait_for("the follower to take the lease over", WAIT, || async {
        let holder = lease_holder(&client).await?;
        let left: Vec<String> = operator_pods(&client)
            .await?
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        (holder == follower.name_any() && left == [follower.name_any()])
            .then_some(())
            .ok_or(format!("holder {holder}, pods {left:?}"))
    })
    .await;
    // A change made after the takeover is reconciled by the new leader.
    c.apply(&fake_service(ns, "led", 3, ""));
    wait_engine_replicas(&client, ns, "led", 3).await;
    assert_eq!(
        operator_metric(&http, &follower, "sgl_operator_leader").await,
        Ok(1.0)
    );
    let taken_over = operator_metric(&http, &follower, "sgl_operator_reconciliations_total")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        taken_over > follower_before,
        "the new leader has not reconciled"
    );
    delete_service(&client, ns, "led").await;
    c.kubectl(&[
        "scale",
        "deployment",
        "-n",
        CHART_NS,
        &deployment,
        "--replicas=2",
    ]);
    ensure_chart(c, &client).await;
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

#[tokio::test]
async fn n1_the_operator_rides_out_20s_without_the_api_server() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let ns = "outage-e2e";
    ensure_namespace(c, ns);
    // Engines that no node takes: the service stays Progressing and is reconciled every few
    // seconds, so reconciles run into the outage.
    let pinned = "  nodeSelector: {sgl-e2e/nowhere: \"true\"}\n";
    c.apply(&fake_service(ns, "patient", 1, pinned));
    wait_engine_replicas(&client, ns, "patient", 1).await;
    let restarts = operator_restarts(&client).await;
    assert_eq!(restarts.len(), 2, "{restarts:?}");
    let failures = |pods: Vec<Pod>| {
        let http = http.clone();
        async move {
            let mut sum = 0.0;
            for p in &pods {
                sum += operator_metric(&http, p, "sgl_operator_reconcile_failures_total")
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "operator {} does not answer (did it exit?): {e}",
                            p.name_any()
                        )
                    });
            }
            sum
        }
    };
    let pods = operator_pods(&client)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let failed_before = failures(pods.clone()).await;
    // A change, then the API server goes away while the operator reconciles it.
    c.apply(&fake_service(ns, "patient", 2, pinned));
    cluster_script(c, "apiserver-stop");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let failed_during = failures(pods.clone()).await;
    cluster_script(c, "apiserver-start");
    assert!(
        failed_during > failed_before,
        "no reconcile failed while the API server was away ({failed_before} -> {failed_during})"
    );
    wait_engine_replicas(&client, ns, "patient", 2).await;
    // The watches came back: a change made after the outage is seen and applied.
    c.apply(&fake_service(ns, "patient", 3, pinned));
    wait_engine_replicas(&client, ns, "patient", 3).await;
    // One leader again, and no operator process was restarted.
    wait_for("one operator to lead again", WAIT, || async {
        let holder = lease_holder(&client).await?;
        let mut leading = Vec::new();
        for p in &pods {
            if operator_metric(&http, p, "sgl_operator_leader").await? == 1.0 {
                leading.push(p.name_any());
            }
        }
        (leading == [holder.clone()])
            .then_some(())
            .ok_or(format!("lease held by {holder}, leading: {leading:?}"))
    })
    .await;
    assert_eq!(
        operator_restarts(&client).await,
        restarts,
        "an operator was restarted"
    );
    delete_service(&client, ns, "patient").await;
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

/// The service of test q1: real engines behind a router, at `dp` replicas, with `image` and
/// `--max-running-requests` given (each a change of the engine's pod template).
fn rolling_service(ns: &str, dp: i32, image: &str, max_running: u32) -> String {
    format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: rolling
  namespace: {ns}
spec:
  model:
    path: /models/SmolLM2-135M-Instruct.Q4_1.gguf
    servedModelName: {MODEL}
  image: {image}
  device: cpu
  tpSize: 1
  dpSize: {dp}
  maxRunningRequests: {max_running}
  terminationGracePeriodSeconds: 120
  router:
    policy: round_robin
"#
    )
}

/// Starts `n` streams through the router and waits until each has its first event, so each
/// is running on an engine that serves now.
async fn start_long_streams(
    http: &reqwest::Client,
    router_ip: &str,
    n: usize,
    max_tokens: u32,
) -> Vec<tokio::task::JoinHandle<rollout::Record>> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let flags: Vec<Arc<AtomicBool>> = (0..n).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let tasks = flags
        .iter()
        .enumerate()
        .map(|(k, flag)| {
            let (http, ip, flag) = (http.clone(), router_ip.to_string(), flag.clone());
            tokio::spawn(async move {
                let prompt = format!("Long story {k}: begin.");
                rollout::stream_chat(&http, &ip, max_tokens, &prompt, Some(&flag)).await
            })
        })
        .collect();
    wait_for("the long streams' first events", WAIT, || async {
        flags
            .iter()
            .all(|f| f.load(Ordering::Acquire))
            .then_some(())
            .ok_or("waiting".to_string())
    })
    .await;
    tasks
}

async fn join_records(
    tasks: Vec<tokio::task::JoinHandle<rollout::Record>>,
) -> Vec<rollout::Record> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| panic!("a stream task: {e}")));
    }
    out
}

/// Streams of `tokens` tokens per second per stream with `n` streams of 32 tokens at once
/// through the router (alongside whatever load runs).
async fn stream_rate(http: &reqwest::Client, router_ip: &str, n: usize) -> f64 {
    let tokens = 32;
    let t = std::time::Instant::now();
    let probes = join_records(start_long_streams(http, router_ip, n, tokens).await).await;
    for r in &probes {
        assert_eq!(r.outcome, rollout::Outcome::Complete, "{r:?}");
    }
    f64::from(tokens) / t.elapsed().as_secs_f64()
}

/// Rollouts under steady streaming load through the router lose nothing: an engine flag
/// change at dpSize 3 and an image change at dpSize 1 complete (every engine pod of the new
/// template, the old ones gone) with no failed and no truncated stream, and so does the
/// scale-down between them. Streams that started on the old engine before the image change
/// outlive its stop signal (they are longer than the preStop wait) and still complete: the
/// engine drains after SIGTERM.
#[tokio::test]
async fn q1_rollouts_under_streaming_load_lose_no_stream() {
    let (c, _turn) = cluster!();
    let t_test = std::time::Instant::now();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    let (ns, name) = ("rollout-e2e", "rolling");
    ensure_namespace(c, ns);
    let (old_image, new_image) = (
        "ghcr.io/sgl-rs/sgl-engine:0.1.0",
        "ghcr.io/sgl-rs/sgl-engine:0.1.1",
    );
    c.apply(&rolling_service(ns, 3, old_image, 8));
    wait_serving(c, &client, ns, name, 3).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let router_ip = pod_ip(
        &router_pods(&client, ns, name)
            .await
            .unwrap_or_else(|e| panic!("{e}"))[0],
    );
    // Steady load: three clients, streams of about 2 s each at the rate of one stream per
    // engine with three engines sharing the CPU.
    let rate = stream_rate(&http, &router_ip, 3).await;
    let steady_tokens = ((rate * 2.0) as u32).clamp(16, 512);
    // Long streams: about 16 s at that rate, past a new engine's start and the 5 s preStop
    // wait (about 9 s in all), so they are running when the old engine gets SIGTERM. The old
    // engine serves little else once the new one is ready, so they may run faster than this.
    let long_tokens = ((rate * 16.0) as u32).clamp(64, 2000);
    let load = rollout::StreamLoad::start(&http, &router_ip, 3, steady_tokens);
    wait_for("steady streams to complete", WAIT, || async {
        let n = rollout::tally(&load.records()).0;
        (n >= 2).then_some(()).ok_or(format!("{n} complete"))
    })
    .await;
    let t_load = t_test.elapsed().as_secs_f64();

    // dpSize 3, an engine flag change.
    let before = load.records().len();
    c.apply(&rolling_service(ns, 3, old_image, 6));
    let flag_rollout = rollout::wait_rolled_out(c, &client, ns, name, 3, |p| {
        rollout::engine_args(p)
            .windows(2)
            .any(|w| w[0] == "--max-running-requests" && w[1] == "6")
    })
    .await;
    let during_flag = load.records().len() - before;

    // Down to dpSize 1 (the two engines that go drain as in a rollout), then an image change.
    c.apply(&rolling_service(ns, 1, old_image, 6));
    let selector = format!("serving.sgl-rs.io/engine={name}");
    let old_name =
        wait_ready_pods(c, &client, ns, &selector, 1, "one ready engine").await[0].name_any();
    let long = start_long_streams(&http, &router_ip, 2, long_tokens).await;
    let before = load.records().len();
    let applied = std::time::SystemTime::now();
    c.apply(&rolling_service(ns, 1, new_image, 6));
    let image_rollout = rollout::wait_rolled_out(c, &client, ns, name, 1, |p| {
        rollout::engine_image(p) == new_image
    })
    .await;
    let during_image = load.records().len() - before;
    let long = join_records(long).await;
    let records = load.stop().await;

    let sigterm = rollout::stop_signal_time(&c.pod_log(ns, &old_name))
        .unwrap_or_else(|| panic!("{old_name} logged no stop signal"));
    for r in &long {
        assert_eq!(r.outcome, rollout::Outcome::Complete, "{r:?}");
    }
    let outlived = long.iter().filter(|r| r.ended_at > sigterm).count();
    let sigterm_after = sigterm
        .duration_since(applied)
        .unwrap_or_default()
        .as_secs_f64();
    let long_secs: Vec<String> = long
        .iter()
        .map(|r| format!("{:.1}", r.took.as_secs_f64()))
        .collect();
    let (complete, failed, truncated) = rollout::tally(&records);
    eprintln!(
        "q1: {rate:.1} tokens/s per stream; load from {t_load:.1} s; flag rollout at dp 3 in {:.1} s ({during_flag} streams ended meanwhile); image rollout at dp 1 in {:.1} s (old engine's SIGTERM {sigterm_after:.1} s after the apply; {during_image} steady streams ended meanwhile; {outlived} of 2 long streams of {long_tokens} tokens, {long_secs:?} s, outlived the SIGTERM); steady streams of {steady_tokens} tokens: {complete} complete, {} failed, {} truncated; {:.1} s to here",
        flag_rollout.as_secs_f64(),
        image_rollout.as_secs_f64(),
        failed.len(),
        truncated.len(),
        t_test.elapsed().as_secs_f64(),
    );
    assert!(
        failed.is_empty() && truncated.is_empty(),
        "failed: {failed:?}; truncated: {truncated:?}"
    );
    assert!(
        outlived >= 1,
        "no long stream was running when {old_name} got SIGTERM (the streams are too short to show the drain): {long:?}"
    );
    assert!(
        during_image >= 1 && during_flag >= 1,
        "the load did not run through the rollouts: {during_flag} and {during_image} streams ended during them"
    );
    delete_service(&client, ns, name).await;
    eprintln!(
        "q1: {:.1} s with the deletion",
        t_test.elapsed().as_secs_f64()
    );
}

/// The router's `sgl_router_pending_requests` (requests waiting for an engine).
async fn router_pending(http: &reqwest::Client, router_ip: &str) -> Result<f64, String> {
    let text = http
        .get(format!("http://{router_ip}:30000/metrics"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| l.strip_prefix("sgl_router_pending_requests "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no sgl_router_pending_requests".to_string())
}

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

/// A `/generate` request through the router with a prompt of its own (no two share a cached
/// prefix, so the scale-down brake stays at 0); the body, or the status and body.
async fn generate_via_router(
    http: &reqwest::Client,
    router_ip: &str,
    k: usize,
) -> Result<Value, String> {
    let resp = http
        .post(format!("http://{router_ip}:30000/generate"))
        .json(&json!({
            "text": format!("{k} is the number of the lighthouse. Tell its story."),
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        }))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status();
    let body: Value = resp.json().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {body}"));
    }
    Ok(body)
}

/// Waits until no engine pod of `name` exists (deleted, not merely unready).
async fn wait_no_engine_pods(client: &kube::Client, ns: &str, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("serving.sgl-rs.io/engine={name}");
    wait_for("every engine pod to be gone", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .is_empty()
            .then_some(())
            .ok_or(format!("{} engine pods", list.items.len()))
    })
    .await;
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
