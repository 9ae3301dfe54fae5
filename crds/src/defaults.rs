//! Enumerations and defaults of the `SGLangService` spec.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Engine image the operator deploys unless `spec.image` says otherwise.
pub const DEFAULT_ENGINE_IMAGE: &str = "ghcr.io/sgl-rs/sgl-engine:0.1.0";
/// Router image the operator deploys unless `spec.router.image` says otherwise.
pub const DEFAULT_ROUTER_IMAGE: &str = "ghcr.io/sgl-rs/sgl-router:0.1.0";

pub(crate) fn default_engine_image() -> String {
    DEFAULT_ENGINE_IMAGE.to_string()
}
pub(crate) fn default_router_image() -> String {
    DEFAULT_ROUTER_IMAGE.to_string()
}
pub(crate) fn default_model_cache_path() -> String {
    "/models".to_string()
}
pub(crate) fn one() -> i32 {
    1
}
pub(crate) fn yes() -> bool {
    true
}
pub(crate) fn default_cache_threshold() -> f64 {
    0.5
}
pub(crate) fn default_balance_abs_threshold() -> i64 {
    32
}
pub(crate) fn default_balance_rel_threshold() -> f64 {
    1.0001
}
pub(crate) fn default_target_queue_length() -> f64 {
    4.0
}
pub(crate) fn default_scale_down_stabilization() -> i32 {
    300
}
pub(crate) fn default_termination_grace_period() -> i64 {
    300
}
pub(crate) fn default_router_queue_size() -> i64 {
    100
}
pub(crate) fn default_router_queue_timeout() -> i64 {
    60
}

impl Default for super::RouterSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            image: default_router_image(),
            replicas: 1,
            policy: RouterPolicy::default(),
            cache_threshold: default_cache_threshold(),
            balance_abs_threshold: default_balance_abs_threshold(),
            balance_rel_threshold: default_balance_rel_threshold(),
            queue_size: default_router_queue_size(),
            queue_timeout_seconds: default_router_queue_timeout(),
            resources: None,
        }
    }
}

/// Where the engine computes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    #[default]
    Cuda,
    Cpu,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Declares a string enum whose wire names are the engine's flag values.
macro_rules! flag_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $wire)] $variant,)+
        }
        impl $name {
            /// Every value of the enum.
            pub const ALL: &[Self] = &[$(Self::$variant),+];

            /// The value as the engine's command line spells it.
            pub fn as_flag(self) -> &'static str {
                match self { $(Self::$variant => $wire,)+ }
            }
        }
    };
}

flag_enum!(
    /// Weight quantization methods (`--quantization`).
    Quantization {
        Fp8 = "fp8",
        Awq = "awq",
        AwqMarlin = "awq_marlin",
        Gptq = "gptq",
        GptqMarlin = "gptq_marlin",
        Marlin = "marlin",
        Bitsandbytes = "bitsandbytes",
        Gguf = "gguf",
        W8a8Int8 = "w8a8_int8",
        W8a8Fp8 = "w8a8_fp8",
    }
);

flag_enum!(
    /// KV cache element types (`--kv-cache-dtype`).
    KvCacheDtype { Auto = "auto", Fp8E5m2 = "fp8_e5m2", Fp8E4m3 = "fp8_e4m3" }
);

flag_enum!(
    /// Structured-output backends (`--grammar-backend`).
    GrammarBackend { Llguidance = "llguidance", Outlines = "outlines", Xgrammar = "xgrammar" }
);

flag_enum!(
    /// Waiting-queue policies (`--schedule-policy`).
    SchedulePolicy { Lpm = "lpm", Random = "random", Fcfs = "fcfs", DfsWeight = "dfs-weight", Lof = "lof" }
);

flag_enum!(
    /// Log levels (`--log-level`).
    LogLevel { Debug = "debug", Info = "info", Warning = "warning", Error = "error" }
);

flag_enum!(
    /// Router load-balancing policies (`--policy`).
    #[derive(Default)]
    RouterPolicy {
        #[default] CacheAware = "cache_aware",
        RoundRobin = "round_robin",
        Random = "random",
        PowerOfTwo = "power_of_two",
    }
);
