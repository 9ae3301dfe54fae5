//! End-to-end on a real cluster: install the CRD, run the controller in this process, apply
//! the CPU SmolLM2 example in a fresh namespace and wait until the service reports Ready.
//!
//! Needs a cluster reachable through KUBECONFIG (kind, k3d, minikube...) that can pull the
//! engine and router images, with about 3 CPUs and 3 GiB free:
//!   cargo test --release -p sgl-operator --test cluster -- --ignored --nocapture
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use sgl_crds::SGLangService;
use sgl_operator::controller::{self, Context};
use sgl_operator::metrics::Metrics;

const NAMESPACE: &str = "sgl-operator-e2e";

#[tokio::test]
#[ignore = "needs a Kubernetes cluster (KUBECONFIG) that can pull the sgl-engine and sgl-router images"]
async fn cpu_example_becomes_ready_on_a_real_cluster() {
    let client = Client::try_default().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "sglangservices.serving.sgl-rs.io",
        &PatchParams::apply("sgl-operator-e2e").force(),
        &Patch::Apply(SGLangService::crd()),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}})).unwrap();
    let _ = namespaces.create(&PostParams::default(), &ns).await;

    let ctx = Arc::new(Context::new(
        client.clone(),
        Arc::new(Metrics::new().unwrap()),
        Some("e2e".into()),
    ));
    let controller = tokio::spawn(controller::run(ctx));

    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/cpu-smollm2.yaml"
    ))
    .unwrap();
    let mut svc: SGLangService = serde_yaml::from_str(&text).unwrap();
    svc.metadata.namespace = Some(NAMESPACE.into());
    let services: Api<SGLangService> = Api::namespaced(client.clone(), NAMESPACE);
    services
        .patch(
            "smollm2",
            &PatchParams::apply("sgl-operator-e2e").force(),
            &Patch::Apply(&svc),
        )
        .await
        .unwrap();

    let mut ready = None;
    for _ in 0..180 {
        let current = services.get("smollm2").await.unwrap();
        let status = current.status.unwrap_or_default();
        eprintln!(
            "ready={:?} conditions={:?}",
            status.ready,
            status
                .conditions
                .iter()
                .map(|c| (&c.type_, &c.status, &c.reason))
                .collect::<Vec<_>>()
        );
        if sgl_operator::status::is_ready(&status) {
            ready = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    controller.abort();
    let _ = namespaces.delete(NAMESPACE, &DeleteParams::default()).await;
    let status = ready.expect("SGLangService did not become Ready within 15 minutes");
    assert_eq!(status.ready.as_deref(), Some("1/1"));
    assert_eq!(
        status.endpoint.as_deref(),
        Some("http://smollm2-router.sgl-operator-e2e.svc:30000")
    );
}
