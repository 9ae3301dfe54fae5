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
    assert_eq!(
        columns,
        [
            "MODEL", "TP", "READY", "REASON", "ENDPOINT", "AGE", "MESSAGE", "COMMIT"
        ]
    );
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
  tpSize: 1
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
    rejected("tpSize: 1", "tpSize: 3", "tpSize must be 1, 2, 4 or 8");
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
        ("tpSize: 1", "tpSize: 1\n  grammarBackend: regexes"),
        ("tpSize: 1", "tpSize: 1\n  quantization: int3"),
        ("tpSize: 1", "tpSize: 1\n  device: tpu"),
        ("tpSize: 1", "tpSize: 1\n  router: {policy: fastest}"),
    ] {
        let yaml = GOOD.replace(from, to);
        assert!(
            serde_yaml::from_str::<SGLangService>(&yaml).is_err(),
            "{to}"
        );
    }
}

/// The spec with one more top-level field (replacing `tpSize: 1` when `field` is tpSize).
fn with(line: &str) -> SGLangService {
    let yaml = if line.starts_with("tpSize:") {
        GOOD.replace("tpSize: 1", line)
    } else {
        GOOD.replace("tpSize: 1", &format!("tpSize: 1\n  {line}"))
    };
    parse(&yaml)
}

/// Asserts that `line` passes the CEL rules when `served`, and is refused with `message`
/// otherwise.
fn served_or_refused(line: &str, served: bool, message: &str) {
    match (with(line).validate(), served) {
        (Ok(()), true) => {}
        (Err(e), false) => assert!(e.to_string().contains(message), "{line}: {e}"),
        (Ok(()), false) => panic!("{line}: accepted, but the engine does not serve it"),
        (Err(e), true) => panic!("{line}: refused, but the engine serves it: {e}"),
    }
}

#[test]
fn cel_rules_refuse_exactly_what_the_engine_does_not_serve() {
    use sgl_crds::{GrammarBackend, KvCacheDtype, Quantization, SchedulePolicy, served};
    for tp in [1, 2, 4, 8] {
        served_or_refused(
            &format!("tpSize: {tp}"),
            served::TP_SIZES.contains(&tp),
            "tpSize must be 1, 2, 4 or 8",
        );
    }
    for q in Quantization::ALL {
        served_or_refused(
            &format!("quantization: {}", q.as_flag()),
            served::QUANTIZATIONS.contains(q),
            "quantization: only fp8 is served by this engine version",
        );
    }
    // Every kvCacheDtype value is served; the FP8 ones on device: cuda only.
    for d in KvCacheDtype::ALL {
        assert!(served::KV_CACHE_DTYPES.contains(d), "{d:?}");
        with(&format!("kvCacheDtype: {}", d.as_flag()))
            .validate()
            .unwrap_or_else(|e| panic!("kvCacheDtype {d:?}: {e}"));
        let on_cpu = with(&format!("kvCacheDtype: {}\n  device: cpu", d.as_flag())).validate();
        if *d == KvCacheDtype::Auto {
            on_cpu.unwrap_or_else(|e| panic!("kvCacheDtype auto on cpu: {e}"));
        } else {
            let e = on_cpu.expect_err("an FP8 KV cache on device: cpu was accepted");
            assert!(
                e.to_string()
                    .contains("kvCacheDtype fp8_e5m2 and fp8_e4m3 run on device: cuda"),
                "{e}"
            );
        }
    }
    // Every schedulePolicy value is served.
    for p in SchedulePolicy::ALL {
        assert!(served::SCHEDULE_POLICIES.contains(p), "{p:?}");
        with(&format!("schedulePolicy: {}", p.as_flag()))
            .validate()
            .unwrap_or_else(|e| panic!("schedulePolicy {p:?}: {e}"));
    }
    for g in GrammarBackend::ALL {
        served_or_refused(
            &format!("grammarBackend: {}", g.as_flag()),
            served::GRAMMAR_BACKENDS.contains(g),
            "grammarBackend",
        );
    }
    // Something is refused, so the loops above are not vacuous.
    assert!(with("quantization: awq").validate().is_err());
}

#[test]
fn tensor_parallelism_needs_gpus() {
    let on = |tp: i32, device: &str| {
        parse(&GOOD.replace("tpSize: 1", &format!("tpSize: {tp}\n  device: {device}"))).validate()
    };
    assert!(on(4, "cuda").is_ok());
    assert!(
        with("tpSize: 8").validate().is_ok(),
        "the default device is cuda"
    );
    let e = on(2, "cpu").expect_err("tpSize 2 on cpu");
    assert!(e.to_string().contains("needs device: cuda"), "{e}");
    assert!(on(1, "cpu").is_ok());
}

#[test]
fn fp8_weights_need_gpus() {
    let q = |device: &str| {
        parse(&GOOD.replace(
            "tpSize: 1",
            &format!("tpSize: 1\n  quantization: fp8\n  device: {device}"),
        ))
        .validate()
    };
    assert!(q("cuda").is_ok());
    assert!(
        with("quantization: fp8").validate().is_ok(),
        "the default device is cuda"
    );
    let e = q("cpu").expect_err("fp8 on cpu");
    assert!(
        e.to_string()
            .contains("quantization fp8 runs on device: cuda"),
        "{e}"
    );
}

#[test]
fn chat_templates_are_files_not_names() {
    let model = |extra: &str| {
        let yaml = GOOD.replace(
            "model: {path: meta-llama/Llama-3.1-8B-Instruct}",
            &format!("model: {{path: meta-llama/Llama-3.1-8B-Instruct, {extra}}}"),
        );
        parse(&yaml).validate()
    };
    model("chatTemplate: /templates/chatml.jinja").unwrap();
    model("chatTemplateConfigMap: {name: templates, key: chatml.jinja}").unwrap();
    let name = model("chatTemplate: chatml").unwrap_err().to_string();
    assert!(
        name.contains("built-in template names such as chatml are not served"),
        "{name}"
    );
    let both = model(
        "chatTemplate: /t.jinja, chatTemplateConfigMap: {name: templates, key: chatml.jinja}",
    )
    .unwrap_err()
    .to_string();
    assert!(both.contains("not both"), "{both}");
}

#[test]
fn gguf_models_run_on_the_cpu() {
    let gguf = |device: &str| {
        let yaml = GOOD
            .replace(
                "meta-llama/Llama-3.1-8B-Instruct",
                "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            )
            .replace("tpSize: 1", &format!("tpSize: 1\n  device: {device}"));
        parse(&yaml).validate()
    };
    gguf("cpu").unwrap();
    let err = gguf("cuda").unwrap_err().to_string();
    assert!(err.contains("runs on device: cpu"), "{err}");
    // Without a device the default (cuda) applies.
    let yaml = GOOD.replace(
        "meta-llama/Llama-3.1-8B-Instruct",
        "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    );
    assert!(parse(&yaml).validate().is_err());
}

#[test]
fn kv_pool_minimum_is_the_engines() {
    let crd = serde_json::to_value(SGLangService::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert_eq!(spec["properties"]["maxTotalTokens"]["minimum"], 16.0);
}

#[test]
fn scale_to_zero_needs_the_router() {
    let zero = GOOD.replace("minReplicas: 1", "minReplicas: 0");
    parse(&zero).validate().unwrap();
    let err = parse(&zero.replace("dpSize: 2", "dpSize: 2\n  router: {enabled: false}"))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(err.contains("minReplicas 0 needs the router"), "{err}");
    // Without the router, one engine at least is fine.
    parse(&GOOD.replace("dpSize: 2", "dpSize: 2\n  router: {enabled: false}"))
        .validate()
        .unwrap();
    let schema = serde_json::to_value(SGLangService::crd()).unwrap();
    let min = &schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["autoscaling"]["properties"]["minReplicas"]["minimum"];
    assert_eq!(min.as_f64(), Some(0.0), "{min}");
}
