//! Every flag the operator renders is one the engine accepts: the rendered command lines are
//! parsed by the engine's own clap definition (`sgl-engine serve`) and checked by its own
//! validation, so the CRD cannot promise what the engine refuses at start.
#![allow(clippy::unwrap_used)]

use clap::Parser;
use serde_json::{Value, json};
use sgl_core::config::ServerArgs;
use sgl_crds::{GrammarBackend, KvCacheDtype, LogLevel, Quantization, SGLangService, served};
use sgl_operator::objects::engine_args;

/// `sgl-engine serve` as the engine's binary parses it.
#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: ServerArgs,
}

/// Parses and validates `args` as the engine does at start. The model and chat template named
/// on the command line live in the pod; stand-ins that exist here take their place, so what is
/// checked is every flag and value, not the files.
fn engine_accepts(args: &[String]) -> Result<(), String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let mut argv = vec!["serve".to_string()];
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        argv.push(arg.clone());
        let stand_in = match arg.as_str() {
            "--model-path" => dir,
            "--chat-template" => file,
            _ => continue,
        };
        rest.next();
        argv.push(stand_in.to_string());
    }
    let serve = Serve::try_parse_from(&argv).map_err(|e| e.to_string())?;
    serve.args.validate().map_err(|e| e.to_string())
}

fn service(spec: Value) -> SGLangService {
    let mut full = json!({"model": {"path": "meta-llama/Llama-3.1-8B-Instruct"}});
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "apiVersion": "serving.sgl-rs.io/v1alpha1",
        "kind": "SGLangService",
        "metadata": {"name": "llama", "namespace": "ml", "uid": "u"},
        "spec": full,
    }))
    .unwrap()
}

/// Renders `spec` (without the CRD's rules) and asks the engine.
fn engine_accepts_spec(spec: Value) -> Result<(), String> {
    engine_accepts(&engine_args(&service(spec)))
}

/// Each value of a flag enum is served by the engine exactly when the served list says so.
fn check_served<T: Copy + PartialEq + std::fmt::Debug>(
    field: &str,
    all: &[T],
    served: &[T],
    flag: impl Fn(T) -> &'static str,
) {
    for &value in all {
        let result = engine_accepts_spec(json!({ field: flag(value) }));
        assert_eq!(
            result.is_ok(),
            served.contains(&value),
            "{field}: {value:?}: the engine says {result:?}, sgl_crds::served says {}",
            if served.contains(&value) {
                "served"
            } else {
                "not served"
            }
        );
    }
}

#[test]
fn the_served_lists_are_what_the_engine_accepts() {
    for tp in [1, 2, 4, 8] {
        let result = engine_accepts_spec(json!({"tpSize": tp}));
        assert_eq!(
            result.is_ok(),
            served::TP_SIZES.contains(&tp),
            "tpSize {tp}: {result:?}"
        );
    }
    // The CRD refuses tpSize > 1 on device: cpu (TP_ON_CUDA_RULE), and so does the engine.
    let cpu = engine_accepts_spec(json!({"tpSize": 2, "device": "cpu"}));
    assert!(
        cpu.as_ref().is_err_and(|e| e.contains("--device cuda")),
        "{cpu:?}"
    );
    // The same for FP8 weights (FP8_ON_CUDA_RULE) and an FP8 KV cache (FP8_KV_ON_CUDA_RULE).
    let cpu = engine_accepts_spec(json!({"quantization": "fp8", "device": "cpu"}));
    assert!(
        cpu.as_ref().is_err_and(|e| e.contains("--device cuda")),
        "{cpu:?}"
    );
    let cpu = engine_accepts_spec(json!({"kvCacheDtype": "fp8_e5m2", "device": "cpu"}));
    assert!(
        cpu.as_ref().is_err_and(|e| e.contains("--device cuda")),
        "{cpu:?}"
    );
    check_served(
        "quantization",
        Quantization::ALL,
        served::QUANTIZATIONS,
        Quantization::as_flag,
    );
    check_served(
        "kvCacheDtype",
        KvCacheDtype::ALL,
        served::KV_CACHE_DTYPES,
        KvCacheDtype::as_flag,
    );
    check_served(
        "schedulePolicy",
        sgl_crds::SchedulePolicy::ALL,
        served::SCHEDULE_POLICIES,
        sgl_crds::SchedulePolicy::as_flag,
    );
    check_served(
        "grammarBackend",
        GrammarBackend::ALL,
        served::GRAMMAR_BACKENDS,
        GrammarBackend::as_flag,
    );
    check_served("logLevel", LogLevel::ALL, LogLevel::ALL, LogLevel::as_flag);
    for device in ["cpu", "cuda"] {
        engine_accepts_spec(json!({"device": device})).unwrap();
    }
}

#[test]
fn a_spec_with_every_engine_field_renders_flags_the_engine_accepts() {
    let svc = service(json!({
        "model": {
            "path": "/models/llama",
            "servedModelName": "llama",
            "tokenizerPath": "/models/llama",
            "chatTemplateConfigMap": {"name": "templates", "key": "llama.jinja"},
            "hfTokenSecretRef": {"name": "hf", "key": "token"},
        },
        "device": "cpu",
        "contextLength": 4096,
        "memFractionStatic": 0.8,
        "maxRunningRequests": 8,
        "maxTotalTokens": 16,
        "chunkedPrefillSize": -1,
        "schedulePolicy": "fcfs",
        "grammarBackend": "outlines",
        "kvCacheDtype": "auto",
        "logLevel": "debug",
        "apiKeySecretRef": {"name": "key", "key": "key"},
        "extraArgs": ["--enable-cache-report"],
    }));
    svc.validate().unwrap();
    let args = engine_args(&svc);
    engine_accepts(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    // The secrets reach the engine through its environment, never its command line.
    assert!(
        !args
            .iter()
            .any(|a| a.contains("api-key") || a.contains("API_KEY")),
        "{args:?}"
    );
    // The check is not vacuous: the engine refuses a flag it does not know.
    let mut unknown = args.clone();
    unknown.push("--no-such-flag".into());
    assert!(engine_accepts(&unknown).is_err());
}

/// Examples the CRD refuses until the engine serves what they ask for, with the rule messages
/// the API server answers (none today: every example is served).
const REFUSED_EXAMPLES: &[(&str, &[&str])] = &[];

#[test]
fn every_example_passes_the_crd_and_the_engine_or_is_refused_as_documented() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    let mut served_examples = 0;
    let mut refused = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Value = serde::Deserialize::deserialize(doc).unwrap();
            if value["kind"] != "SGLangService" {
                continue;
            }
            let svc: SGLangService = serde_json::from_value(value).unwrap();
            match REFUSED_EXAMPLES.iter().find(|(name, _)| *name == file) {
                Some((_, messages)) => {
                    let err = svc.validate().unwrap_err().to_string();
                    for m in *messages {
                        assert!(err.contains(m), "{file}: {m:?} not in {err}");
                    }
                    // The header and the README say so.
                    assert!(text.contains("refused at apply time"), "{file}");
                    refused.push(file.clone());
                }
                None => {
                    svc.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
                    let args = engine_args(&svc);
                    engine_accepts(&args).unwrap_or_else(|e| panic!("{file}: {args:?}: {e}"));
                    served_examples += 1;
                }
            }
        }
    }
    assert_eq!(refused.len(), REFUSED_EXAMPLES.len(), "{refused:?}");
    assert!(served_examples >= 3, "only {served_examples} examples");
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    for (name, _) in REFUSED_EXAMPLES {
        assert!(
            readme
                .lines()
                .any(|l| l.contains(name) && l.contains("refused at apply time")),
            "examples/README.md does not say that {name} is refused at apply time"
        );
    }
}

/// The operator decides that `model.path` is a Hub id (and renders a download for it) exactly
/// when the engine would fetch it from the Hub: the two parsers cannot drift apart.
#[test]
fn hub_ids_are_read_as_the_engine_reads_them() {
    for path in [
        "meta-llama/Llama-3.1-8B-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "org/name/file.Q4_K_M.gguf",
        "org/name/sub/file.gguf",
        "org/name/file.bin",
        "org/name/",
        "/models/llama",
        "/models/smollm2.gguf",
        "single",
        "org--x/name",
        "-org/name",
        "org/name.",
        "org/..",
        "org/na..me",
        "o_r.g/n-a_m.e",
        "org/name/../../etc/passwd",
        "org/name/.gguf",
        "",
    ] {
        let engine = sgl_core::model::hub::RepoRef::from_model_path(std::path::Path::new(path));
        assert_eq!(
            sgl_operator::objects::is_hub_id(path),
            engine.is_some(),
            "{path:?}: operator and engine disagree (engine reads {engine:?})"
        );
    }
}
