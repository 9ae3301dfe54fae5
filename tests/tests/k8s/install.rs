//! The control plane and the chart: a pod bound to a tainted kwok node and one the scheduler
//! refuses (a1), the chart's install with the operator running as the chart's service account
//! under the chart's RBAC (b1), and a second release upgraded and uninstalled (z1).

use std::collections::HashSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};

use crate::common::{
    CHART_NS, RELEASE, chart_dir, ensure_chart, ensure_namespace, operator_deployment, pod_ip,
    pod_ready, ready_pods,
};

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
