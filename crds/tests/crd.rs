//! The generated CRD matches the committed one, and its validation refuses bad specs.
#![allow(clippy::unwrap_used)]

use kube::CustomResourceExt;
use sgl_crds::{SGLangService, crd_yaml};

const COMMITTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../helm/crds/sglangservices.serving.sgl-rs.io.yaml"
);

#[test]
fn committed_crd_matches_a_fresh_generation() {
    let committed = std::fs::read_to_string(COMMITTED).unwrap();
    let fresh = crd_yaml().unwrap();
    assert!(
        committed == fresh,
        "{COMMITTED} is stale: regenerate it with `cargo run --release -p sgl-crds --bin crdgen > helm/crds/sglangservices.serving.sgl-rs.io.yaml`"
    );
}

#[test]
fn crd_declares_scale_status_and_short_name() {
    let crd = SGLangService::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["sgls".to_string()]));
    let version = &crd.spec.versions[0];
    let scale = version
        .subresources
        .as_ref()
        .unwrap()
        .scale
        .as_ref()
        .unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.dpSize");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.to_uppercase())
        .collect();
    assert_eq!(columns, ["MODEL", "TP", "READY", "ENDPOINT", "AGE"]);
}

fn parse(yaml: &str) -> SGLangService {
    serde_yaml::from_str(yaml).unwrap()
}

const GOOD: &str = r#"
apiVersion: serving.sgl-rs.io/v1alpha1
kind: SGLangService
metadata: {name: llama, namespace: ml}
spec:
  model: {path: meta-llama/Llama-3.1-8B-Instruct}
  tpSize: 2
  dpSize: 2
  memFractionStatic: 0.85
  autoscaling: {minReplicas: 1, maxReplicas: 4}
"#;

#[test]
fn a_good_spec_passes_and_gets_defaults() {
    let svc = parse(GOOD);
    svc.validate().unwrap();
    assert!(svc.spec.router.enabled);
    assert_eq!(svc.spec.router.policy.as_flag(), "cache_aware");
    assert_eq!(svc.spec.image, sgl_crds::DEFAULT_ENGINE_IMAGE);
    assert!(svc.autoscaled());
}

fn rejected(from: &str, to: &str, expect: &str) {
    let yaml = GOOD.replace(from, to);
    assert_ne!(yaml, GOOD, "replacement of {from:?} did not apply");
    let err = parse(&yaml).validate().unwrap_err().to_string();
    assert!(err.contains(expect), "{to:?}: got {err}");
}

#[test]
fn cel_rules_refuse_bad_specs() {
    rejected("tpSize: 2", "tpSize: 3", "tpSize must be 1, 2, 4 or 8");
    rejected(
        "memFractionStatic: 0.85",
        "memFractionStatic: 1.5",
        "memFractionStatic",
    );
    rejected(
        "memFractionStatic: 0.85",
        "memFractionStatic: 0.0",
        "memFractionStatic",
    );
    rejected(
        "maxReplicas: 4",
        "maxReplicas: 0",
        "minReplicas must not exceed maxReplicas",
    );
    rejected("dpSize: 2", "chunkedPrefillSize: 0", "chunkedPrefillSize");
    rejected(
        "name: llama",
        &format!("name: {}", "x".repeat(41)),
        "at most 40",
    );
    rejected(
        "dpSize: 2",
        "router: {cacheThreshold: 1.5}",
        "cacheThreshold",
    );
    rejected(
        "dpSize: 2",
        "router: {balanceRelThreshold: 0.5}",
        "balanceRelThreshold",
    );
    rejected(
        "dpSize: 2",
        "modelCache: {claimName: c, mountPath: models}",
        "mountPath",
    );
    rejected(
        "maxReplicas: 4}",
        "maxReplicas: 4, targetCacheHitRate: 1.0}",
        "targetCacheHitRate",
    );
}

#[test]
fn enums_refuse_unknown_values() {
    for (from, to) in [
        ("tpSize: 2", "tpSize: 2\n  grammarBackend: regexes"),
        ("tpSize: 2", "tpSize: 2\n  quantization: int3"),
        ("tpSize: 2", "tpSize: 2\n  device: tpu"),
        ("tpSize: 2", "tpSize: 2\n  router: {policy: fastest}"),
    ] {
        let yaml = GOOD.replace(from, to);
        assert!(
            serde_yaml::from_str::<SGLangService>(&yaml).is_err(),
            "{to}"
        );
    }
}
