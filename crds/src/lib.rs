//! The `SGLangService` custom resource: one SGLang deployment (engines, router, autoscaler)
//! described by a single namespaced object.
//!
//! Field names mirror the engine's launch flags (`tpSize` ↔ `--tp-size`, `grammarBackend` ↔
//! `--grammar-backend`, ...). Validation lives in the schema itself (enums, minimums and CEL
//! rules under `x-kubernetes-validations`), so the API server refuses a bad spec at apply
//! time; [`SGLangService::validate`] runs the same CEL rules locally, so the operator and its
//! `render` command refuse it too.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapKeySelector, EnvVar, ResourceRequirements, SecretKeySelector, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod defaults;
pub mod served;
pub use defaults::*;

/// API group of every resource this crate defines.
pub const GROUP: &str = "serving.sgl-rs.io";
/// Version of [`SGLangService`].
pub const VERSION: &str = "v1alpha1";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("invalid SGLangService {name}: {message}")]
    Invalid { name: String, message: String },
    #[error("could not serialize: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error("could not write YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// Desired state of one SGLang serving deployment.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "serving.sgl-rs.io",
    version = "v1alpha1",
    kind = "SGLangService",
    plural = "sglangservices",
    shortname = "sgls",
    namespaced,
    status = "SGLangServiceStatus",
    scale(
        spec_replicas_path = ".spec.dpSize",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.path"),
    printcolumn(name = "TP", type_ = "integer", json_path = ".spec.tpSize"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.ready"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 1),
    printcolumn(name = "Commit", type_ = "string", json_path = ".status.modelCommit", priority = 1),
    validation = Rule::new("size(self.metadata.name) <= 40").message("metadata.name must be at most 40 characters (object names derive from it)")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(served::GGUF_ON_CPU_RULE).message(served::GGUF_ON_CPU_MESSAGE))]
#[x_kube(validation = Rule::new(served::TP_ON_CUDA_RULE).message(served::TP_ON_CUDA_MESSAGE))]
#[x_kube(validation = Rule::new(served::FP8_ON_CUDA_RULE).message(served::FP8_ON_CUDA_MESSAGE))]
#[x_kube(validation = Rule::new(served::FP8_KV_ON_CUDA_RULE).message(served::FP8_KV_ON_CUDA_MESSAGE))]
#[x_kube(validation = Rule::new(SCALE_TO_ZERO_RULE).message(SCALE_TO_ZERO_MESSAGE))]
pub struct SGLangServiceSpec {
    /// Which model to serve.
    pub model: ModelSpec,
    /// Engine container image.
    #[serde(default = "default_engine_image")]
    pub image: String,
    /// Image pull policy of the engine and router containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// Where the engine runs: `cuda` requests `tpSize` NVIDIA GPUs per pod, `cpu` none.
    #[serde(default)]
    pub device: Device,
    /// Tensor-parallel degree: GPUs per engine pod (`--tp-size`), 1, 2, 4 or 8 GPUs of one
    /// node (multi-node engines are not served yet); `device: cuda` only. One engine splits
    /// every layer across its GPUs: for a model that does not fit one GPU, or to cut the time
    /// per token; `dpSize` adds replicas.
    #[serde(default = "one")]
    #[x_kube(validation = Rule::new("self in [1, 2, 4, 8]").message("tpSize must be 1, 2, 4 or 8"))]
    pub tp_size: i32,
    /// Data-parallel degree: number of engine pods; the scale subresource (`kubectl scale
    /// sgls`). With autoscaling the HPA sets it through that subresource: leave it out of the
    /// manifests you apply then, or each apply resets the count the HPA chose.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1024))]
    pub dp_size: i32,
    /// Weight quantization (`--quantization`): `fp8` quantizes the linear layers of a bf16
    /// checkpoint to FP8 (e4m3, one scale per output channel) at load, on `device: cuda`
    /// (half the weight memory, faster decode). The other methods are not served by this
    /// engine version; a GGUF model on `device: cpu` carries its own quantized weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(served::QUANTIZATION_RULE).message(served::QUANTIZATION_MESSAGE))]
    pub quantization: Option<Quantization>,
    /// KV cache data type (`--kv-cache-dtype`): `auto` (bf16 on the GPU), or `fp8_e5m2` /
    /// `fp8_e4m3` on `device: cuda` (one byte per element: twice the tokens in the same memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_dtype: Option<KvCacheDtype>,
    /// Grammar backend for structured outputs (`--grammar-backend`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar_backend: Option<GrammarBackend>,
    /// Maximum context length in tokens (`--context-length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub context_length: Option<i64>,
    /// Fraction of accelerator memory for weights and KV cache (`--mem-fraction-static`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self < 1.0").message("memFractionStatic must be between 0 and 1, exclusive"))]
    pub mem_fraction_static: Option<f64>,
    /// Maximum concurrently running requests per engine (`--max-running-requests`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_running_requests: Option<i64>,
    /// Maximum tokens in the KV pool (`--max-total-tokens`), at least 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16))]
    pub max_total_tokens: Option<i64>,
    /// Chunked prefill size in tokens; -1 disables chunking (`--chunked-prefill-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == -1 || self >= 1").message("chunkedPrefillSize must be -1 (off) or positive"))]
    pub chunked_prefill_size: Option<i64>,
    /// Scheduling policy of the waiting queue (`--schedule-policy`): `lpm` (longest cached
    /// prefix first), `fcfs`, `random`, `lof` (longest output first) or `dfs-weight` (requests
    /// sharing cached prefixes together, the largest group first), as in SGLang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_policy: Option<SchedulePolicy>,
    /// Engine log level (`--log-level`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
    /// Further engine flags, appended verbatim after the ones derived from this spec.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// Extra environment variables of the engine container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Engine container resources. With `device: cuda` the operator sets `nvidia.com/gpu` to
    /// `tpSize` in requests and limits. Without CPU or memory requests the engine requests
    /// 1 CPU and 2Gi, so it is never BestEffort (a GPU request alone does not set a QoS class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Seconds an engine or router pod has to finish its in-flight requests (streams included)
    /// after it is told to stop; it exits as soon as they are done.
    #[serde(default = "default_termination_grace_period")]
    #[schemars(range(min = 10, max = 86400))]
    pub termination_grace_period_seconds: i64,
    /// A PersistentVolumeClaim that holds downloaded weights, mounted in every engine pod and
    /// used as the Hugging Face cache, so a restart does not download again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_cache: Option<ModelCacheSpec>,
    /// Secret key holding the API key clients must send (`--api-key`, given to the engine as
    /// `SGLANG_API_KEY` in its environment). `/health` and `/metrics` stay open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeySelector>,
    /// The cache-aware router in front of the engines.
    #[serde(default)]
    pub router: RouterSpec,
    /// Horizontal autoscaling of the engines on their own metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,
    /// Prometheus Operator integration.
    #[serde(default)]
    pub monitoring: MonitoringSpec,
}

/// The model to serve.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.chatTemplate) || !has(self.chatTemplateConfigMap)").message("set model.chatTemplate or model.chatTemplateConfigMap, not both"))]
pub struct ModelSpec {
    /// A path inside the image or a mounted volume, or a Hugging Face id `org/name`
    /// (`--model-path`).
    #[schemars(length(min = 1))]
    pub path: String,
    /// Name clients use in the `model` field (`--served-model-name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// Hugging Face revision (branch, tag or commit) to download (`--revision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Secret key holding a Hugging Face token for gated or private models, given to the
    /// engine as `HF_TOKEN` in its environment (never on its command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_token_secret_ref: Option<SecretKeySelector>,
    /// Tokenizer location when it differs from the model (`--tokenizer-path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_path: Option<String>,
    /// Absolute path of a Jinja chat template file in the image or a mounted volume
    /// (`--chat-template`). Built-in template names are not served by this engine version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(served::CHAT_TEMPLATE_RULE).message(served::CHAT_TEMPLATE_MESSAGE))]
    pub chat_template: Option<String>,
    /// A Jinja chat template from a ConfigMap key: mounted read-only in the engine pod and
    /// passed as `--chat-template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_config_map: Option<ConfigMapKeySelector>,
}

/// A PVC reused as the model cache.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelCacheSpec {
    /// Name of an existing PersistentVolumeClaim in the service's namespace.
    #[schemars(length(min = 1))]
    pub claim_name: String,
    /// Where the claim is mounted in the engine container; `HF_HOME` points here.
    #[serde(default = "default_model_cache_path")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("mountPath must be absolute"))]
    pub mount_path: String,
    /// Mount read-only (weights already present, nothing to download).
    #[serde(default)]
    pub read_only: bool,
}

/// The router Deployment.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    /// Deploy the router. Without it, clients reach the engines' headless Service directly.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Router image.
    #[serde(default = "default_router_image")]
    pub image: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 64))]
    pub replicas: i32,
    /// Load-balancing policy (`--policy`).
    #[serde(default)]
    pub policy: RouterPolicy,
    /// Minimum prefix-match ratio to route by cache rather than by load (`--cache-threshold`).
    #[serde(default = "default_cache_threshold")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 1.0").message("cacheThreshold must be within [0, 1]"))]
    pub cache_threshold: f64,
    /// Load imbalance, in queued requests, above which the router balances by load
    /// (`--balance-abs-threshold`).
    #[serde(default = "default_balance_abs_threshold")]
    #[schemars(range(min = 0))]
    pub balance_abs_threshold: i64,
    /// Load ratio above which the router balances by load (`--balance-rel-threshold`).
    #[serde(default = "default_balance_rel_threshold")]
    #[x_kube(validation = Rule::new("self >= 1.0").message("balanceRelThreshold must be at least 1.0"))]
    pub balance_rel_threshold: f64,
    /// Requests that may wait in the router while no engine can take them (none ready yet,
    /// as while a service scaled to zero starts its first engine, or all of them failing
    /// their health checks) (`--queue-size`); beyond it a request is answered 503 with
    /// `Retry-After`. 0 answers them so at once.
    #[serde(default = "default_router_queue_size")]
    #[schemars(range(min = 0, max = 100000))]
    pub queue_size: i64,
    /// Longest wait of a request in that queue before it is answered 503 with `Retry-After`
    /// (`--queue-timeout-secs`).
    #[serde(default = "default_router_queue_timeout")]
    #[schemars(range(min = 1, max = 3600))]
    pub queue_timeout_seconds: i64,
    /// Router container resources; without CPU or memory requests it requests 100m and 128Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Scale to zero needs the router: it is what holds the requests that arrive while no engine
/// runs, and its count of them is what brings the first engine back.
pub const SCALE_TO_ZERO_RULE: &str = "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0 || !has(self.router) || !has(self.router.enabled) || self.router.enabled";
/// The message of [`SCALE_TO_ZERO_RULE`].
pub const SCALE_TO_ZERO_MESSAGE: &str = "autoscaling.minReplicas 0 needs the router (router.enabled): it holds requests while no engine runs, and its count of them starts the first engine";

/// A HorizontalPodAutoscaler on this service's scale subresource (`spec.dpSize`), fed by the
/// engines' own metrics through the custom metrics API (the chart's prometheus-adapter rules).
/// With `minReplicas: 0` it also reads the router's waiting requests, which bring a service
/// at zero back to one engine (the rule is in the chart's README).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must not exceed maxReplicas"))]
pub struct AutoscalingSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Fewest engines. 0 lets an idle service go to zero engines after
    /// `scaleDownStabilizationSeconds` without load; the first request that then waits in
    /// the router brings one back. Needs the router, and a cluster whose HPA scales to zero
    /// (the `HPAScaleToZero` feature gate of kube-apiserver and kube-controller-manager).
    #[serde(default = "one")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
    #[schemars(range(min = 1, max = 1024))]
    pub max_replicas: i32,
    /// Target average of waiting requests per engine (`sglang:num_queue_reqs`).
    #[serde(default = "default_target_queue_length")]
    #[x_kube(validation = Rule::new("self > 0.0").message("targetQueueLength must be positive"))]
    pub target_queue_length: f64,
    /// Target prefix-cache hit rate. Scaling is driven by its complement, the miss rate
    /// (`1 - sglang:cache_hit_rate`), so that more uncached work means more replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("targetCacheHitRate must be within [0, 1)"))]
    pub target_cache_hit_rate: Option<f64>,
    /// Seconds the HPA waits before acting on a lower recommendation.
    #[serde(default = "default_scale_down_stabilization")]
    #[schemars(range(min = 0, max = 3600))]
    pub scale_down_stabilization_seconds: i32,
}

/// Prometheus Operator integration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// Create a ServiceMonitor for the engines and router (needs the Prometheus Operator CRDs).
    #[serde(default)]
    pub service_monitor: bool,
    /// Scrape interval, e.g. `15s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m)$"))]
    pub interval: Option<String>,
    /// Extra labels on the ServiceMonitor, for a Prometheus that selects ServiceMonitors by
    /// label (kube-prometheus-stack's selects `release: <its release name>` by default). The
    /// operator's own `app.kubernetes.io/*` labels keep their values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// Observed state, computed from the objects that exist.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SGLangServiceStatus {
    /// `Ready`, `Progressing` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Engine pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Engine pods that pass their readiness probe.
    #[serde(default)]
    pub ready_replicas: i32,
    /// `readyReplicas/replicas`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// What is wrong (the `Degraded` reason, e.g. `CrashLoopBackOff` or `Unschedulable`), else
    /// why the service is not ready yet; absent when all is well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The message that goes with `reason`: for an engine that exits, the pod's name and the
    /// engine's own last error line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The commit the model's revision resolved to, as the model download (the engine pods'
    /// `model-download` init container, with `modelCache` and a Hub id in `model.path`)
    /// reported it in its termination message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_commit: Option<String>,
    /// URL clients send requests to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Label selector of the engine pods, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
}

impl SGLangService {
    /// Runs the schema's CEL rules on this object, as the API server would on create.
    pub fn validate(&self) -> Result<(), CrdError> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let crd = Self::crd();
        let schema = crd
            .spec
            .versions
            .first()
            .and_then(|v| v.schema.as_ref())
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .map(serde_json::to_value)
            .transpose()?
            .unwrap_or_default();
        let object = serde_json::to_value(self)?;
        kube::core::cel::Validator::new()
            .validate(&schema, &object, None)
            .map_err(|errors| CrdError::Invalid {
                name,
                message: errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            })
    }

    /// Whether an enabled HPA owns the engine replica count.
    pub fn autoscaled(&self) -> bool {
        self.spec.autoscaling.as_ref().is_some_and(|a| a.enabled)
    }
}

/// The CRD as YAML, exactly as `crdgen` writes it.
pub fn crd_yaml() -> Result<String, CrdError> {
    // Keys sorted at every level: the text is then the same whether or not another crate of the
    // build turns on serde_json's `preserve_order` (which changes the order of schema maps).
    let mut v = serde_json::to_value(SGLangService::crd())?;
    sort_keys(&mut v);
    Ok(serde_yaml::to_string(&v)?)
}

fn sort_keys(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            for child in map.values_mut() {
                sort_keys(child);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort_keys),
        _ => {}
    }
}
