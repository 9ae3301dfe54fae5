//! What the k8s end-to-end tests share: the chart, namespaces, pods, services, the operator,
//! the router's queue and the cluster script, each wait with a deadline (`wait_for`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sgl_crds::SGLangService;
use sgl_e2e_tests::k8s::cluster::{Cluster, WAIT, wait_for};
use sgl_e2e_tests::workspace_root;

pub(crate) const RUNNER: &str = env!("CARGO_BIN_EXE_k8s-pod-runner");
pub(crate) const CHART_NS: &str = "sgl-system";
pub(crate) const RELEASE: &str = "sgl";

pub(crate) fn chart_dir() -> String {
    workspace_root().join("helm").display().to_string()
}

/// Installs the chart once (release `sgl` in `sgl-system`) and waits for the operator.
pub(crate) async fn ensure_chart(c: &Cluster, client: &Client) {
    if !c
        .helm_raw(&["status", RELEASE, "-n", CHART_NS])
        .status
        .success()
    {
        c.helm(&[
            "install",
            RELEASE,
            &chart_dir(),
            "-n",
            CHART_NS,
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
        ]);
    }
    wait_for("the operator Deployment to be available", WAIT, || async {
        let d = operator_deployment(client).await;
        let want = d.spec.replicas.unwrap_or(1);
        let ready = d
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        (ready >= want)
            .then_some(())
            .ok_or(format!("{ready}/{want} ready"))
    })
    .await;
}

/// The operator Deployment of the main release.
pub(crate) async fn operator_deployment(client: &Client) -> Deployment {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), CHART_NS);
    let list = deployments
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await
        .unwrap_or_else(|e| panic!("listing deployments: {e}"));
    list.items
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no operator Deployment for release {RELEASE}"))
}

pub(crate) fn ensure_namespace(c: &Cluster, ns: &str) {
    c.apply(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n"
    ));
}

pub(crate) async fn ready_pods(
    client: &Client,
    ns: &str,
    selector: &str,
) -> Result<Vec<Pod>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .collect())
}

pub(crate) fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| panic!("pod {} has no IP", p.name_any()))
}

pub(crate) fn example(name: &str) -> String {
    let path = workspace_root().join("examples").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Waits until exactly `n` pods matching `selector` in `ns` are ready; fails with how many
/// were and the pod runner's log.
pub(crate) async fn wait_ready_pods(
    c: &Cluster,
    client: &Client,
    ns: &str,
    selector: &str,
    n: usize,
    what: &str,
) -> Vec<Pod> {
    wait_for(what, WAIT, || async {
        let pods = ready_pods(client, ns, selector).await?;
        (pods.len() == n).then_some(pods.clone()).ok_or_else(|| {
            format!(
                "{} ready; runner log:\n{}",
                pods.len(),
                c.log_tail("pod-runner", 15)
            )
        })
    })
    .await
}

/// Waits until `n` engine pods and one router pod of service `name` are ready.
pub(crate) async fn wait_serving(
    c: &Cluster,
    client: &Client,
    ns: &str,
    name: &str,
    n: usize,
) -> Vec<Pod> {
    let engines = format!("serving.sgl-rs.io/engine={name}");
    let what = format!("{n} ready engine pods of {ns}/{name}");
    let pods = wait_ready_pods(c, client, ns, &engines, n, &what).await;
    wait_for("a ready router pod", WAIT, || async {
        let routers = router_pods(client, ns, name).await?;
        (!routers.is_empty())
            .then_some(())
            .ok_or_else(|| "no ready router pod".to_string())
    })
    .await;
    pods
}

pub(crate) async fn router_pods(client: &Client, ns: &str, name: &str) -> Result<Vec<Pod>, String> {
    ready_pods(
        client,
        ns,
        &format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=router"),
    )
    .await
}

pub(crate) async fn chat(
    http: &reqwest::Client,
    ip: &str,
    model: &str,
    prompt: &str,
) -> Result<Value, String> {
    let resp = http
        .post(format!("http://{ip}:30000/v1/chat/completions"))
        .json(&json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
            "temperature": 0,
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

/// Deletes a service and waits until it is gone.
pub(crate) async fn delete_service(client: &Client, ns: &str, name: &str) {
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    let _ = api.delete(name, &DeleteParams::foreground()).await;
    wait_for(&format!("{ns}/{name} to be deleted"), WAIT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".into()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// A service of an image that is not ours: kwok reports its pods Running and Ready without
/// running anything, so the operator's objects are checked without loading engines.
pub(crate) fn fake_service(ns: &str, name: &str, dp: i32, extra: &str) -> String {
    format!(
        r#"apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata:
  name: {name}
  namespace: {ns}
spec:
  model:
    path: /models/fake.gguf
  image: example.com/fake-engine:1
  device: cpu
  tpSize: 1
  dpSize: {dp}
  router:
    image: example.com/fake-router:1
{extra}"#
    )
}

/// Waits until the service is Ready and its top-level `reason` and `message` are cleared.
pub(crate) async fn wait_ready_without_reason(client: &Client, ns: &str, name: &str) {
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the service to be Ready with no reason or message",
        WAIT,
        || async {
            let st = api
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let ready = st
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ready && st.reason.is_none() && st.message.is_none())
                .then_some(())
                .ok_or(format!(
                    "ready {ready}, reason {:?}, message {:?}",
                    st.reason, st.message
                ))
        },
    )
    .await;
}

/// Each engine's prompt-token counter, read from its own /metrics on its pod IP.
pub(crate) async fn engine_request_counts(
    http: &reqwest::Client,
    engines: &[Pod],
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for p in engines {
        let url = format!("http://{}:30000/metrics", pod_ip(p));
        let text = match http.get(&url).send().await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        let total: f64 = text
            .lines()
            .filter(|l| l.starts_with("sglang:prompt_tokens_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        out.insert(p.name_any(), total);
    }
    out
}

/// Waits until the operator has reconciled the service's current generation.
pub(crate) async fn wait_observed(client: &Client, ns: &str, name: &str) {
    let api: Api<SGLangService> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the operator to observe the new generation",
        WAIT,
        || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            let observed = s.status.as_ref().and_then(|st| st.observed_generation);
            (observed == s.metadata.generation)
                .then_some(())
                .ok_or(format!(
                    "generation {:?}, observed {observed:?}",
                    s.metadata.generation
                ))
        },
    )
    .await;
}

/// A PersistentVolume on a host folder and a claim bound to it (what a cluster's RWX storage
/// gives): the pod runner mounts that folder in every pod of the claim.
pub(crate) async fn host_path_claim(c: &Cluster, client: &Client, ns: &str, name: &str, dir: &str) {
    c.apply(&format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata:
  name: {ns}-{name}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {{path: "{dir}", type: DirectoryOrCreate}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {name}
  namespace: {ns}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: {ns}-{name}
  resources: {{requests: {{storage: 1Gi}}}}
"#
    ));
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), ns);
    wait_for("the model cache claim to be bound", WAIT, || async {
        let phase = claims
            .get(name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .and_then(|s| s.phase);
        (phase.as_deref() == Some("Bound"))
            .then_some(())
            .ok_or(format!("phase {phase:?}"))
    })
    .await;
}

/// The `model-download` init container's final state in an engine pod.
pub(crate) fn download_state(
    p: &Pod,
) -> Option<k8s_openapi::api::core::v1::ContainerStateTerminated> {
    p.status
        .as_ref()?
        .init_container_statuses
        .as_ref()?
        .iter()
        .find(|s| s.name == "model-download")?
        .state
        .as_ref()?
        .terminated
        .clone()
}

/// The operator pods of the main release, ready or not (not being deleted).
pub(crate) async fn operator_pods(client: &Client) -> Result<Vec<Pod>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), CHART_NS);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The sum of every series of `metric` on an operator pod's /metrics.
pub(crate) async fn operator_metric(
    http: &reqwest::Client,
    pod: &Pod,
    metric: &str,
) -> Result<f64, String> {
    let text = http
        .get(format!("http://{}:8080/metrics", pod_ip(pod)))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The holder of the operator's leader Lease (`<fullname>-leader` in the chart's namespace).
pub(crate) async fn lease_holder(client: &Client) -> Result<String, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), CHART_NS);
    let list = leases
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .iter()
        .filter(|l| l.name_any().ends_with("-leader"))
        .find_map(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "no operator lease is held".to_string())
}

/// Waits until the engine Deployment of `name` asks for `replicas`.
pub(crate) async fn wait_engine_replicas(client: &Client, ns: &str, name: &str, replicas: i32) {
    let sts: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let what = format!("{ns}/{name}-engine to ask for {replicas} replicas");
    wait_for(&what, WAIT, || async {
        let s = sts
            .get(&format!("{name}-engine"))
            .await
            .map_err(|e| e.to_string())?;
        let r = s.spec.replicas;
        (r == Some(replicas))
            .then_some(())
            .ok_or(format!("replicas {r:?}"))
    })
    .await;
}

/// Runs `tests/k8s/cluster.sh <cmd>` on the test cluster.
pub(crate) fn cluster_script(c: &Cluster, cmd: &str) {
    let out = std::process::Command::new(workspace_root().join("tests/k8s/cluster.sh"))
        .arg(cmd)
        .arg("--work")
        .arg(&c.work)
        .output()
        .unwrap_or_else(|e| panic!("cluster.sh {cmd}: {e}"));
    assert!(
        out.status.success(),
        "cluster.sh {cmd} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Restart counts of the operator pods, by pod name.
pub(crate) async fn operator_restarts(client: &Client) -> BTreeMap<String, i32> {
    operator_pods(client)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (p.name_any(), restarts)
        })
        .collect()
}

/// The router's `sgl_router_pending_requests` (requests waiting for an engine).
pub(crate) async fn router_pending(http: &reqwest::Client, router_ip: &str) -> Result<f64, String> {
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

/// A `/generate` request through the router with a prompt of its own (no two share a cached
/// prefix, so the scale-down brake stays at 0); the body, or the status and body.
pub(crate) async fn generate_via_router(
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
pub(crate) async fn wait_no_engine_pods(client: &kube::Client, ns: &str, name: &str) {
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
