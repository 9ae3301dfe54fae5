//! The `restricted` Pod Security Standard on the real API server (t1): in a namespace that
//! enforces it, a pod without a security context is refused, while every example's engine and
//! router pods are admitted, and none of them is BestEffort. The API server's PodSecurity
//! admission checks each pod when its ReplicaSet creates it, so a rendering that breaks the
//! standard shows here as pods that never appear and `FailedCreate` events, not as a refused
//! Deployment.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use sgl_crds::{Device, SGLangService};
use sgl_e2e_tests::k8s::cluster::{WAIT, wait_for};
use sgl_e2e_tests::workspace_root;

use crate::common::{delete_service, ensure_chart, wait_serving};

/// The namespace that enforces the `restricted` standard.
const NS: &str = "restricted-e2e";

/// What the API server says when PodSecurity admission refuses a pod under `restricted`.
const REFUSAL: &str = "violates PodSecurity \"restricted:";

#[tokio::test]
async fn t1_every_example_is_admitted_under_the_restricted_pod_security_standard() {
    let (c, _turn) = cluster!();
    let client = c.client().await.unwrap_or_else(|e| panic!("{e}"));
    ensure_chart(c, &client).await;
    c.apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
"#
    ));

    // Enforcement is on: a pod with no security context is refused, and says why.
    let out = c.kubectl_raw(
        &["apply", "--server-side", "--field-manager=e2e", "-f", "-"],
        Some(&format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: unrestricted
  namespace: {NS}
spec:
  containers:
  - name: main
    image: example.com/fake:1
"#
        )),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(REFUSAL) && stderr.contains("runAsNonRoot"),
        "a pod without a security context was not refused under `restricted` \
         (is PodSecurity admission off?): {}\n{stderr}",
        out.status
    );

    // Every example, moved into the namespace.
    let mut services = Vec::new();
    for (file, docs) in examples() {
        for mut doc in docs {
            doc["metadata"]["namespace"] = Value::from(NS);
            if doc["kind"] == "SGLangService" {
                let name = doc["metadata"]["name"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{file}: an SGLangService without a name"));
                services.push((file.clone(), name.to_string()));
            }
            c.apply(&doc.to_string());
        }
    }
    assert!(
        services.iter().any(|(f, _)| f == "cpu-smollm2.yaml"),
        "the CPU example is missing: {services:?}"
    );

    // Their workloads, as the operator renders them.
    let api: Api<SGLangService> = Api::namespaced(client.clone(), NS);
    let mut workloads = Vec::new();
    let mut cpu_services = Vec::new();
    for (file, name) in &services {
        let svc = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{file}: {name}: {e}"));
        workloads.push(format!("{name}-engine"));
        if svc.spec.router.enabled {
            workloads.push(format!("{name}-router"));
        }
        if svc.spec.device == Device::Cpu {
            cpu_services.push(name.clone());
        }
    }

    let pods = wait_for(
        "every example's engine and router pods to be created",
        WAIT,
        || all_pods_created(&client, &workloads),
    )
    .await
    .unwrap_or_else(|refused| {
        panic!("PodSecurity admission refused the operator's pods in {NS}:\n{refused}")
    });

    eprintln!(
        "admitted under restricted: {:?}",
        pods.iter()
            .map(|p| format!("{} {}", p.name_any(), qos_class(p).unwrap_or("-")))
            .collect::<Vec<_>>()
    );
    // The API server sets each pod's QoS class when it admits it.
    let best_effort: Vec<String> = pods
        .iter()
        .filter(|p| qos_class(p).is_none_or(|q| q == "BestEffort"))
        .map(|p| format!("{} ({:?})", p.name_any(), qos_class(p)))
        .collect();
    assert!(
        best_effort.is_empty(),
        "pods without requests (BestEffort, or no QoS class): {best_effort:?}"
    );

    // The CPU example's pods start under the standard's constraints and serve.
    for name in &cpu_services {
        let engines: Api<Deployment> = Api::namespaced(client.clone(), NS);
        let replicas = engines
            .get(&format!("{name}-engine"))
            .await
            .unwrap_or_else(|e| panic!("{name}-engine: {e}"))
            .spec
            .replicas
            .unwrap_or(1);
        let n = usize::try_from(replicas).unwrap_or_else(|e| panic!("{replicas}: {e}"));
        wait_serving(c, &client, NS, name, n).await;
    }

    for (_, name) in &services {
        delete_service(&client, NS, name).await;
    }
    // The example's Secret and the namespace go with it.
    c.kubectl(&["delete", "namespace", NS, "--wait=false"]);
}

/// Every file in `examples/`, sorted, as JSON documents.
fn examples() -> Vec<(String, Vec<Value>)> {
    let dir = workspace_root().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // One document per `---` line; comments and empty documents read as null.
            let docs = text
                .split("\n---\n")
                .map(|doc| {
                    serde_yaml::from_str::<Value>(doc)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                })
                .filter(|d| !d.is_null())
                .collect();
            let file = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            (file, docs)
        })
        .collect()
}

fn qos_class(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.qos_class.as_deref()
}

/// The pods of `workloads` (Deployments in [`NS`]) once each has as many as it asks for;
/// `Ok(Err(..))` at once when PodSecurity admission refused one of them, `Err` (wait on)
/// with what is missing and every `FailedCreate` event.
async fn all_pods_created(
    client: &Client,
    workloads: &[String],
) -> Result<Result<Vec<Pod>, String>, String> {
    let failed = failed_creates(client).await?;
    let refused: Vec<&String> = failed.iter().filter(|e| e.contains(REFUSAL)).collect();
    if !refused.is_empty() {
        return Ok(Err(refused
            .iter()
            .map(|e| e.as_str())
            .collect::<Vec<_>>()
            .join("\n")));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut all = Vec::new();
    let mut missing = Vec::new();
    for name in workloads {
        let Some(d) = deployments.get_opt(name).await.map_err(|e| e.to_string())? else {
            missing.push(format!("{name}: no Deployment yet"));
            continue;
        };
        let spec = d.spec;
        let want = usize::try_from(spec.replicas.unwrap_or(1)).map_err(|e| e.to_string())?;
        let selector = spec
            .selector
            .match_labels
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let have: Vec<Pod> = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        if want == 0 || have.len() < want {
            missing.push(format!("{name}: {} of {want} pods", have.len()));
        }
        all.extend(have);
    }
    if missing.is_empty() {
        return Ok(Ok(all));
    }
    Err(format!(
        "{}; FailedCreate events: {failed:?}",
        missing.join(", ")
    ))
}

/// `FailedCreate` events in [`NS`] (a ReplicaSet that could not create a pod), as
/// `Kind/name: message`.
async fn failed_creates(client: &Client) -> Result<Vec<String>, String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = events
        .list(&ListParams::default().fields("reason=FailedCreate"))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .map(|e| {
            let o = &e.involved_object;
            format!(
                "{}/{}: {}",
                o.kind.as_deref().unwrap_or("?"),
                o.name.as_deref().unwrap_or("?"),
                e.message.as_deref().unwrap_or("")
            )
        })
        .collect())
}
