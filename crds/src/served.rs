//! What this engine version serves, for every spec field that maps to an engine flag with a
//! fixed set of values.
//!
//! The CRD keeps SGLang's full vocabulary (so a field means what it means in SGLang), and its
//! CEL rules refuse at apply time every value the engine would refuse at start, with a message
//! saying what to use instead. These lists are the single statement of what is served: this
//! crate's tests check that the CEL rules refuse exactly the values outside them, and the
//! operator's tests check them against the engine's own argument parser and validation, so
//! the CRD can neither promise what the engine refuses nor refuse what it has learned to serve.

use crate::{GrammarBackend, KvCacheDtype, Quantization, SchedulePolicy};

/// `tpSize` values the engine serves (`--tp-size`: the GPUs of one node; on `device: cuda`).
pub const TP_SIZES: &[i32] = &[1, 2, 4, 8];
/// `quantization` values the engine serves (`--quantization`).
pub const QUANTIZATIONS: &[Quantization] = &[Quantization::Fp8];
/// `kvCacheDtype` values the engine serves (`--kv-cache-dtype`; the FP8 types on `device: cuda`).
pub const KV_CACHE_DTYPES: &[KvCacheDtype] = &[
    KvCacheDtype::Auto,
    KvCacheDtype::Fp8E5m2,
    KvCacheDtype::Fp8E4m3,
];
/// `schedulePolicy` values the engine serves (`--schedule-policy`).
pub const SCHEDULE_POLICIES: &[SchedulePolicy] = &[
    SchedulePolicy::Lpm,
    SchedulePolicy::Fcfs,
    SchedulePolicy::Random,
    SchedulePolicy::Lof,
    SchedulePolicy::DfsWeight,
];
/// `grammarBackend` values the engine serves (`--grammar-backend`; `xgrammar` requests are
/// compiled by llguidance).
pub const GRAMMAR_BACKENDS: &[GrammarBackend] = &[
    GrammarBackend::Llguidance,
    GrammarBackend::Outlines,
    GrammarBackend::Xgrammar,
];

pub const TP_ON_CUDA_RULE: &str =
    "!has(self.tpSize) || self.tpSize == 1 || !has(self.device) || self.device == 'cuda'";
pub const TP_ON_CUDA_MESSAGE: &str = "tpSize > 1 splits the model across GPUs: it needs device: cuda (a CPU engine runs one rank; use dpSize for more replicas)";

pub const QUANTIZATION_RULE: &str = "self == 'fp8'";
pub const QUANTIZATION_MESSAGE: &str = "quantization: only fp8 is served by this engine version (weights quantized to FP8 at load, device: cuda); awq, gptq, marlin, bitsandbytes, gguf and w8a8 are not: leave it unset or use fp8 (a GGUF model on device: cpu carries its own quantized weights)";

pub const FP8_ON_CUDA_RULE: &str =
    "!has(self.quantization) || !has(self.device) || self.device == 'cuda'";
pub const FP8_ON_CUDA_MESSAGE: &str = "quantization fp8 runs on device: cuda (FP8 tensor cores); a CPU engine serves the checkpoint's own format or a GGUF file's quantization";

pub const FP8_KV_ON_CUDA_RULE: &str = "!has(self.kvCacheDtype) || self.kvCacheDtype == 'auto' || !has(self.device) || self.device == 'cuda'";
pub const FP8_KV_ON_CUDA_MESSAGE: &str = "kvCacheDtype fp8_e5m2 and fp8_e4m3 run on device: cuda; a CPU engine keeps its KV cache in f32 (kvCacheDtype auto)";

pub const CHAT_TEMPLATE_RULE: &str = "self.startsWith('/')";
pub const CHAT_TEMPLATE_MESSAGE: &str = "model.chatTemplate must be the absolute path of a Jinja template file in the image or a mounted volume (or use model.chatTemplateConfigMap); built-in template names such as chatml are not served by this engine version";

pub const GGUF_ON_CPU_RULE: &str =
    "!self.model.path.endsWith('.gguf') || (has(self.device) && self.device == 'cpu')";
pub const GGUF_ON_CPU_MESSAGE: &str = "a GGUF model (model.path ending in .gguf) runs on device: cpu; device cuda serves Hugging Face safetensors models";
