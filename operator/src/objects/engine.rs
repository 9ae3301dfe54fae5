//! The engine Deployment (one pod per data-parallel replica) and its headless Service.
//!
//! Why a Deployment and not a StatefulSet: an update must bring a new engine up before an old
//! one goes, or a service at `dpSize: 1` is down on every spec change and a larger one loses
//! a share of its capacity while a model loads (minutes on a GPU). A StatefulSet's rolling
//! update always deletes a pod before it creates its replacement (its `maxUnavailable` only
//! lets more go at once; it never surges), so surge there would take the operator raising
//! `replicas` and walking the `partition` down by hand. Engines need no per-pod identity: the
//! router finds them by label, each loads the same weights from the same (shared, read-mostly)
//! cache, and no engine talks to another (multi-node tensor parallelism, which would need
//! stable names, is refused). So the Deployment controller does the surge: `maxSurge: 1`,
//! `maxUnavailable: 0` starts one new pod, waits until its readiness probe passes, then stops
//! one old pod, and so on. A stopping pod leaves the router's worker set as soon as it is
//! marked for deletion, keeps serving through the preStop wait, then gets SIGTERM, stops
//! accepting connections and finishes its in-flight streams within
//! `terminationGracePeriodSeconds`. The cost: a rollout needs room for one more replica (one
//! more pod's GPUs); without it the new pod stays Pending and the old ones keep serving.
//!
//! A service made by an older operator has an engine StatefulSet of the same name: the
//! controller deletes it only once this Deployment has all its replicas available, so the
//! move to a Deployment is itself a surge.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretKeySelector, Service, ServicePort, ServiceSpec, Toleration,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sgl_crds::{Device, SGLangService};

use super::{
    ENGINE_LABEL, Names, common_labels, meta, pre_stop, restricted_container, restricted_pod,
    selector_labels, with_default_requests,
};
use crate::Error;

/// Port of the engine's HTTP API (and of the router's).
pub const ENGINE_PORT: i32 = 30000;
const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The engine reads `--api-key` from this variable when the flag is absent.
pub(crate) const API_KEY_ENV: &str = "SGLANG_API_KEY";
/// Where a chat template from a ConfigMap is mounted in the engine container.
pub const CHAT_TEMPLATE_DIR: &str = "/etc/sgl-engine/chat-template";
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

const MODEL_CACHE_VOLUME: &str = "model-cache";
/// The init container that fills the model cache before the engine starts.
pub const MODEL_DOWNLOAD: &str = "model-download";

/// One part of a Hub repository id (`org` or `name`), by the Hub's rule: letters, digits,
/// `-`, `_`, `.`, neither starting nor ending with `-` or `.`, without `--` or `..`.
fn is_hub_id_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

/// Whether `model.path` names a Hugging Face Hub repository, as the engine reads
/// `--model-path`: `org/name`, or `org/name/file.gguf` for one GGUF file; an absolute path
/// is always local.
pub fn is_hub_id(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    if path.starts_with('/') || parts.len() < 2 || !parts[..2].iter().all(|p| is_hub_id_part(p)) {
        return false;
    }
    parts.len() == 2
        || (parts[2..]
            .iter()
            .all(|p| !p.is_empty() && *p != "." && *p != "..")
            && parts
                .last()
                .is_some_and(|f| f.to_ascii_lowercase().ends_with(".gguf")))
}

/// With a writable `modelCache` and a Hub id, the pod downloads the model once, before the
/// engine starts, into the cache every replica shares (the engine's per-file lock makes a
/// second downloader wait for the first instead of fetching the same bytes).
fn downloads_model(svc: &SGLangService) -> bool {
    svc.spec.model_cache.as_ref().is_some_and(|c| !c.read_only) && is_hub_id(&svc.spec.model.path)
}

/// The engine then never reaches the Hub: its weights come from the cache alone.
fn serves_offline(svc: &SGLangService) -> bool {
    svc.spec.model_cache.is_some() && is_hub_id(&svc.spec.model.path)
}

/// The download's command line (after `sgl-engine download`). It prints the local path and
/// the resolved commit, and writes them to the container's termination message, where the
/// operator reads the commit into `status.modelCommit`.
pub fn download_args(svc: &SGLangService) -> Vec<String> {
    let mut args = vec![
        svc.spec.model.path.clone(),
        "--termination-message-path".into(),
        "/dev/termination-log".into(),
    ];
    if let Some(rev) = &svc.spec.model.revision {
        args.extend(["--revision".into(), rev.clone()]);
    }
    args
}

/// The chat template file the engine reads, from the spec's path or its ConfigMap.
fn chat_template_path(svc: &SGLangService) -> Option<String> {
    let model = &svc.spec.model;
    if model.chat_template_config_map.is_some() {
        return Some(format!("{CHAT_TEMPLATE_DIR}/{CHAT_TEMPLATE_FILE}"));
    }
    model.chat_template.clone()
}

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
    flag("--revision", s.model.revision.clone());
    flag("--tokenizer-path", s.model.tokenizer_path.clone());
    flag("--chat-template", chat_template_path(svc));
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
    // The API key reaches the engine through SGLANG_API_KEY (see `env`), never through its
    // command line, which any process on the node can read.
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

/// The engine image's user (docker/engine.Dockerfile).
const ENGINE_UID: i64 = 1000;
/// Memory-backed `/dev/shm`: enough for the tokenizer and NCCL at one GPU per pod, and bounded
/// (it counts against the pod's memory).
const SHM_SIZE: &str = "1Gi";

fn resources(svc: &SGLangService) -> ResourceRequirements {
    let mut res = with_default_requests(svc.spec.resources.clone(), "1", "2Gi");
    if svc.spec.device == Device::Cuda {
        let gpus = Quantity(svc.spec.tp_size.to_string());
        for list in [&mut res.limits, &mut res.requests] {
            list.get_or_insert_with(BTreeMap::new)
                .insert(GPU_RESOURCE.into(), gpus.clone());
        }
    }
    res
}

fn secret_env(name: &str, key: &SecretKeySelector) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(key.clone()),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// What both the download and the engine read to reach the Hub and its cache.
fn hub_env(svc: &SGLangService) -> Vec<EnvVar> {
    let mut env = Vec::new();
    if let Some(token) = &svc.spec.model.hf_token_secret_ref {
        env.push(secret_env("HF_TOKEN", token));
    }
    if let Some(cache) = &svc.spec.model_cache {
        env.push(plain_env("HF_HOME", &cache.mount_path));
    }
    env
}

/// Appends the spec's own variables; one of the same name replaces ours (an env list may
/// not name a variable twice under server-side apply).
fn with_spec_env(mut env: Vec<EnvVar>, svc: &SGLangService) -> Vec<EnvVar> {
    env.retain(|e| !svc.spec.env.iter().any(|s| s.name == e.name));
    env.extend(svc.spec.env.iter().cloned());
    env
}

fn env(svc: &SGLangService) -> Vec<EnvVar> {
    let mut env = hub_env(svc);
    if serves_offline(svc) {
        env.push(plain_env("HF_HUB_OFFLINE", "1"));
    }
    if let Some(key) = &svc.spec.api_key_secret_ref {
        env.push(secret_env(API_KEY_ENV, key));
    }
    with_spec_env(env, svc)
}

/// The `model-download` init container: `sgl-engine download` into the model cache, with the
/// engine's image and the Hub settings of the engine (token, cache, the spec's `env`, where
/// `HF_ENDPOINT` names a mirror). A failure's last log lines become its termination message,
/// which the operator reports as `Degraded`.
fn download_container(svc: &SGLangService, cache_mount: VolumeMount) -> Container {
    let s = &svc.spec;
    let mut args = vec!["download".to_string()];
    args.extend(download_args(svc));
    Container {
        name: MODEL_DOWNLOAD.into(),
        image: Some(s.image.clone()),
        image_pull_policy: s.image_pull_policy.map(|p| p.as_str().into()),
        command: Some(vec!["sgl-engine".into()]),
        args: Some(args),
        env: Some(with_spec_env(hub_env(svc), svc)).filter(|e| !e.is_empty()),
        // Network and disk bound: no accelerator, and less than the engine (a pod's request is
        // the larger of its init containers' and the sum of its containers').
        resources: Some(with_default_requests(None, "500m", "512Mi")),
        volume_mounts: Some(vec![cache_mount]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(restricted_container(false)),
        ..Container::default()
    }
}

fn volumes(svc: &SGLangService) -> (Vec<Volume>, Vec<VolumeMount>) {
    // NCCL and the tokenizer workers share memory through /dev/shm; the runtime's 64 MiB
    // default is far too small.
    let mut volumes = vec![Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(SHM_SIZE.into())),
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
            name: MODEL_CACHE_VOLUME.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: cache.claim_name.clone(),
                read_only: Some(cache.read_only),
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: MODEL_CACHE_VOLUME.into(),
            mount_path: cache.mount_path.clone(),
            read_only: Some(cache.read_only),
            ..VolumeMount::default()
        });
    }
    if let Some(template) = &svc.spec.model.chat_template_config_map {
        volumes.push(Volume {
            name: "chat-template".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: template.name.clone(),
                items: Some(vec![KeyToPath {
                    key: template.key.clone(),
                    path: CHAT_TEMPLATE_FILE.into(),
                    ..KeyToPath::default()
                }]),
                optional: template.optional,
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "chat-template".into(),
            mount_path: CHAT_TEMPLATE_DIR.into(),
            read_only: Some(true),
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
        resources: Some(resources(svc)),
        volume_mounts: Some(volume_mounts),
        // Loading and warming a large model takes minutes: allow up to 30 of them.
        startup_probe: Some(http_probe(10, 5, 180)),
        readiness_probe: Some(http_probe(10, 5, 3)),
        // A busy engine may answer slowly; restart only after three minutes of silence.
        liveness_probe: Some(http_probe(30, 10, 6)),
        // An engine that exits on an error leaves its last log lines (its own error message)
        // in the container status, where the operator reports them as Degraded.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        lifecycle: Some(pre_stop()),
        security_context: Some(restricted_container(false)),
        ..Container::default()
    };
    let init_containers = downloads_model(svc).then(|| {
        let cache_mount = container
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == MODEL_CACHE_VOLUME)
            .cloned()
            .unwrap_or_default();
        vec![download_container(svc, cache_mount)]
    });
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            init_containers,
            containers: vec![container],
            volumes: Some(volumes),
            node_selector: Some(s.node_selector.clone()).filter(|m| !m.is_empty()),
            tolerations: Some(tolerations).filter(|t| !t.is_empty()),
            affinity: s.affinity.clone(),
            topology_spread_constraints: Some(vec![spread_over_nodes(names)]),
            // In-flight streams finish within the grace period (after the preStop wait).
            termination_grace_period_seconds: Some(
                s.termination_grace_period_seconds + super::PRE_STOP_SECONDS,
            ),
            // fsGroup lets the engine's user write to the model cache volume.
            security_context: Some(restricted_pod(ENGINE_UID, Some(ENGINE_UID))),
            ..PodSpec::default()
        }),
    }
}

/// Engines of one service spread over nodes (so one node's loss takes at most its share of
/// the replicas), as a preference: where one node has room for all of them, they still start.
/// Rendered whatever `dpSize` is, so that scaling never changes the pod template (which would
/// restart every engine).
fn spread_over_nodes(names: &Names) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(names, "engine")),
            ..LabelSelector::default()
        }),
        ..TopologySpreadConstraint::default()
    }
}

/// Seconds a rollout may go without progress before the Deployment reports it stalled: the
/// startup probe's whole window (a large model may load for 30 minutes).
const PROGRESS_DEADLINE_SECONDS: i32 = 1800;

/// One engine pod per data-parallel replica: `dpSize` always sets the count. With
/// autoscaling the HPA writes `dpSize` through the service's scale subresource, so the count
/// never leaves this apply (dropping it would reset the Deployment to one replica). Updates
/// surge by one pod and never take a ready engine away first (see the top of this file).
pub fn deployment(svc: &SGLangService, names: &Names) -> Result<Deployment, Error> {
    Ok(Deployment {
        metadata: meta(svc, names, &names.engine, "engine")?,
        spec: DeploymentSpec {
            replicas: Some(svc.spec.dp_size),
            selector: LabelSelector {
                match_labels: Some(selector_labels(names, "engine")),
                ..LabelSelector::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            progress_deadline_seconds: Some(PROGRESS_DEADLINE_SECONDS),
            revision_history_limit: Some(3),
            template: pod_template(svc, names),
            ..DeploymentSpec::default()
        },
        status: None,
    })
}

/// Headless Service: the engines' endpoint when there is no router (one DNS record per ready
/// engine pod).
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
