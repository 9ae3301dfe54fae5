//! The engine StatefulSet (one pod per data-parallel replica) and its headless Service.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, Service, ServicePort, ServiceSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sgl_crds::{Device, SGLangService};

use super::{ENGINE_LABEL, Names, common_labels, meta, selector_labels};
use crate::Error;

/// Port of the engine's HTTP API (and of the router's).
pub const ENGINE_PORT: i32 = 30000;
const GPU_RESOURCE: &str = "nvidia.com/gpu";
pub(crate) const API_KEY_ENV: &str = "SGLANG_API_KEY";

/// The engine's command line for this spec (after `sgl-engine serve`).
pub fn engine_args(svc: &SGLangService) -> Vec<String> {
    let s = &svc.spec;
    let mut args: Vec<String> = vec![
        "--model-path".into(),
        s.model.path.clone(),
        "--host".into(),
        "0.0.0.0".into(),
        "--port".into(),
        ENGINE_PORT.to_string(),
        "--device".into(),
        match s.device {
            Device::Cuda => "cuda",
            Device::Cpu => "cpu",
        }
        .into(),
        "--tp-size".into(),
        s.tp_size.to_string(),
        "--enable-metrics".into(),
    ];
    let mut flag = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            args.push(name.to_string());
            args.push(v);
        }
    };
    flag("--served-model-name", s.model.served_model_name.clone());
    flag("--tokenizer-path", s.model.tokenizer_path.clone());
    flag("--chat-template", s.model.chat_template.clone());
    flag("--context-length", s.context_length.map(|v| v.to_string()));
    flag("--quantization", s.quantization.map(|v| v.as_flag().into()));
    flag(
        "--kv-cache-dtype",
        s.kv_cache_dtype.map(|v| v.as_flag().into()),
    );
    flag(
        "--grammar-backend",
        s.grammar_backend.map(|v| v.as_flag().into()),
    );
    flag(
        "--mem-fraction-static",
        s.mem_fraction_static.map(|v| v.to_string()),
    );
    flag(
        "--max-running-requests",
        s.max_running_requests.map(|v| v.to_string()),
    );
    flag(
        "--max-total-tokens",
        s.max_total_tokens.map(|v| v.to_string()),
    );
    flag(
        "--chunked-prefill-size",
        s.chunked_prefill_size.map(|v| v.to_string()),
    );
    flag(
        "--schedule-policy",
        s.schedule_policy.map(|v| v.as_flag().into()),
    );
    flag("--log-level", s.log_level.map(|v| v.as_flag().into()));
    // Kubernetes expands $(VAR) in args, so the key never appears in the pod spec.
    flag(
        "--api-key",
        s.api_key_secret_ref
            .as_ref()
            .map(|_| format!("$({API_KEY_ENV})")),
    );
    args.extend(s.extra_args.iter().cloned());
    args
}

fn http_probe(period: i32, timeout: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::String("http".into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(timeout),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

fn resources(svc: &SGLangService) -> Option<ResourceRequirements> {
    let mut res = svc.spec.resources.clone().unwrap_or_default();
    if svc.spec.device == Device::Cuda {
        let gpus = Quantity(svc.spec.tp_size.to_string());
        for list in [&mut res.limits, &mut res.requests] {
            list.get_or_insert_with(BTreeMap::new)
                .insert(GPU_RESOURCE.into(), gpus.clone());
        }
    }
    (res != ResourceRequirements::default()).then_some(res)
}

fn env(svc: &SGLangService) -> Vec<EnvVar> {
    let mut env = Vec::new();
    if let Some(revision) = &svc.spec.model.revision {
        // Read by the Hugging Face download when the model path is a hub id.
        env.push(EnvVar {
            name: "HF_REVISION".into(),
            value: Some(revision.clone()),
            ..EnvVar::default()
        });
    }
    if let Some(cache) = &svc.spec.model_cache {
        env.push(EnvVar {
            name: "HF_HOME".into(),
            value: Some(cache.mount_path.clone()),
            ..EnvVar::default()
        });
    }
    if let Some(key) = &svc.spec.api_key_secret_ref {
        env.push(EnvVar {
            name: API_KEY_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(key.clone()),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    env.extend(svc.spec.env.iter().cloned());
    env
}

fn volumes(svc: &SGLangService) -> (Vec<Volume>, Vec<VolumeMount>) {
    // NCCL and the tokenizer workers share memory through /dev/shm; the runtime's 64 MiB
    // default is far too small.
    let mut volumes = vec![Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "dshm".into(),
        mount_path: "/dev/shm".into(),
        ..VolumeMount::default()
    }];
    if let Some(cache) = &svc.spec.model_cache {
        volumes.push(Volume {
            name: "model-cache".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: cache.claim_name.clone(),
                read_only: Some(cache.read_only),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "model-cache".into(),
            mount_path: cache.mount_path.clone(),
            read_only: Some(cache.read_only),
            ..VolumeMount::default()
        });
    }
    (volumes, mounts)
}

fn pod_template(svc: &SGLangService, names: &Names) -> PodTemplateSpec {
    let s = &svc.spec;
    let (volumes, volume_mounts) = volumes(svc);
    let mut labels = common_labels(names, "engine");
    labels.insert(ENGINE_LABEL.into(), names.instance.clone());
    let mut tolerations = s.tolerations.clone();
    if s.device == Device::Cuda
        && !tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(GPU_RESOURCE))
    {
        tolerations.push(Toleration {
            key: Some(GPU_RESOURCE.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    }
    let container = Container {
        name: "engine".into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["sgl-engine".into(), "serve".into()]),
        args: Some(engine_args(svc)),
        env: Some(env(svc)).filter(|e| !e.is_empty()),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: ENGINE_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        resources: resources(svc),
        volume_mounts: Some(volume_mounts),
        // Loading and warming a large model takes minutes: allow up to 30 of them.
        startup_probe: Some(http_probe(10, 5, 180)),
        readiness_probe: Some(http_probe(10, 5, 3)),
        // A busy engine may answer slowly; restart only after three minutes of silence.
        liveness_probe: Some(http_probe(30, 10, 6)),
        ..Container::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            volumes: Some(volumes),
            node_selector: Some(s.node_selector.clone()).filter(|m| !m.is_empty()),
            tolerations: Some(tolerations).filter(|t| !t.is_empty()),
            affinity: s.affinity.clone(),
            termination_grace_period_seconds: Some(60),
            // The engine image runs as uid 1000: let it write to the model cache volume.
            security_context: Some(PodSecurityContext {
                fs_group: Some(1000),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
    }
}

/// One engine pod per data-parallel replica. Without autoscaling `dpSize` sets the replica
/// count; with it the field is left out so the HPA alone owns it.
pub fn stateful_set(svc: &SGLangService, names: &Names) -> Result<StatefulSet, Error> {
    Ok(StatefulSet {
        metadata: meta(svc, names, &names.engine, "engine")?,
        spec: StatefulSetSpec {
            replicas: (!svc.autoscaled()).then_some(svc.spec.dp_size),
            service_name: Some(names.engine.clone()),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names, "engine")),
                ..LabelSelector::default()
            },
            template: pod_template(svc, names),
            ..StatefulSetSpec::default()
        },
        status: None,
    })
}

/// Headless Service: stable DNS per engine pod, and the endpoint when there is no router.
pub fn headless_service(svc: &SGLangService, names: &Names) -> Result<Service, Error> {
    Ok(Service {
        metadata: meta(svc, names, &names.engine, "engine")?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector_labels(names, "engine")),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: ENGINE_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}
