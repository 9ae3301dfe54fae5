//! The one entry that builds a device's backend from an opened [`Model`].

use super::{Backend, BackendError, HostSampling};
use crate::config::DeviceKind;
use crate::error::Result;
use crate::model::Model;
use crate::model::llama::TensorParallel;
use crate::model::tensors::Quantization;

/// The KV cache's element type (`--kv-cache-dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The backend's own (bf16 on the GPU, f32 on the CPU).
    #[default]
    Auto,
    /// One FP8 byte per element, no scale (CUDA only): `fp8_e4m3` saturates at +-448,
    /// `fp8_e5m2` at +-57344 with a coarser mantissa. Half the bytes of bf16: twice the tokens.
    Fp8E4m3,
    Fp8E5m2,
}

/// What a backend is built with (SGLang's flags of the same names where there are).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// KV cache size in tokens (`--max-total-tokens`); each backend sizes it when `None`.
    pub max_total_tokens: Option<usize>,
    /// Most tokens (prompt + output) of one sequence.
    pub context_length: usize,
    /// The form weights are stored in (`--quantization`).
    pub quantization: Quantization,
    /// The KV cache's element type (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// This process's share of the weights (`--tp-size`).
    pub tensor_parallel: TensorParallel,
    /// CPU: sample on the host with passes handed out one step late, so that the scheduler's
    /// overlap schedule runs as on a GPU (`--enable-overlap-schedule`).
    pub host_overlap: bool,
    /// Share of device memory for weights and the KV cache (`--mem-fraction-static`).
    pub mem_fraction_static: f32,
    /// Largest decode batch served by a CUDA graph (`--cuda-graph-max-bs`).
    pub cuda_graph_max_bs: usize,
    pub disable_cuda_graph: bool,
    /// Tensor parallelism: NCCL for every all-reduce (`--disable-custom-all-reduce`).
    pub disable_custom_all_reduce: bool,
    /// Results of a sequence independent of the rest of its batch
    /// (`--enable-deterministic-inference`).
    pub deterministic: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_total_tokens: None,
            context_length: 4096,
            quantization: Quantization::AsStored,
            kv_cache_dtype: KvCacheDtype::Auto,
            tensor_parallel: TensorParallel::default(),
            host_overlap: false,
            mem_fraction_static: 0.88,
            cuda_graph_max_bs: 160,
            disable_cuda_graph: false,
            disable_custom_all_reduce: false,
            deterministic: false,
        }
    }
}

/// The backend of `device` with `model`'s weights on it.
pub fn load(device: DeviceKind, model: &Model, opts: &LoadOptions) -> Result<Box<dyn Backend>> {
    if opts.tensor_parallel.size > 1 && device != DeviceKind::Cuda {
        return Err(BackendError::Unsupported(format!(
            "tensor parallelism ({} ranks) runs on GPUs (--device cuda)",
            opts.tensor_parallel.size
        ))
        .into());
    }
    if opts.kv_cache_dtype != KvCacheDtype::Auto && device != DeviceKind::Cuda {
        return Err(BackendError::Unsupported(crate::config::FP8_KV_ON_CPU.into()).into());
    }
    match device {
        DeviceKind::Cpu => {
            let cpu = Box::new(super::cpu::CpuBackend::load(model, opts)?);
            if opts.host_overlap {
                return Ok(Box::new(HostSampling::new(cpu, true)));
            }
            Ok(cpu)
        }
        DeviceKind::Cuda => cuda(model, opts),
    }
}

/// The device to serve on when `--device` is not given, and why.
pub fn detect_device() -> (DeviceKind, String) {
    match gpu_count() {
        Ok(0) => (DeviceKind::Cpu, "the CUDA driver sees no GPU".into()),
        Ok(n) => (
            DeviceKind::Cuda,
            format!("this build has CUDA and the driver sees {n} GPU(s)"),
        ),
        Err(why) => (DeviceKind::Cpu, why),
    }
}

#[cfg(feature = "cuda")]
fn gpu_count() -> std::result::Result<usize, String> {
    // The driver library is loaded at run time; cudarc panics when it is missing.
    match std::panic::catch_unwind(cudarc::driver::CudaContext::device_count) {
        Ok(Ok(n)) => Ok(usize::try_from(n).unwrap_or(0)),
        Ok(Err(e)) => Err(format!("the CUDA driver reports no usable GPU: {e}")),
        Err(_) => Err("no CUDA driver library (libcuda) on this machine".into()),
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_count() -> std::result::Result<usize, String> {
    Err("this build has no CUDA support (`--features cuda`)".into())
}

#[cfg(feature = "cuda")]
fn cuda(model: &Model, opts: &LoadOptions) -> Result<Box<dyn Backend>> {
    Ok(Box::new(super::cuda::CudaBackend::load(
        model,
        &opts.into(),
    )?))
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &Model, _: &LoadOptions) -> Result<Box<dyn Backend>> {
    Err(BackendError::NotCompiled.into())
}
