//! GPU benchmarks and the end-to-end check driver on the CUDA backend (`--features cuda`).
//!
//! - `bench-one-batch`: [`one_batch`] (SGLang's bench_one_batch, static batch).
//! - `bench-offline-throughput --backend-loop`: [`offline`] (the benchmark's own batching loop
//!   straight on the backend; through the engine, on any device, it is `crate::offline`).
//! - `check-reference`: [`check`] (greedy runs for the transformers comparison).
//! - `bench-all-reduce`: the tensor-parallel all-reduce alone
//!   (`sgl_core::backend::cuda::all_reduce_bench`).
//!
//! Flags are read by name (`--model DIR`, `--batch N`, ...) as the GPU scripts pass them
//! ([`crate::args`]).

mod check;
mod offline;
mod one_batch;

use std::path::PathBuf;

use sgl_core::backend::BackendError;
use sgl_core::backend::cuda::{CudaBackend, CudaOptions};
use sgl_core::error::{EngineError, Result};

pub(crate) use crate::args::{arg, arg_usize, random_tokens};
pub use check::run as check_reference;
pub use offline::run as offline_backend_loop;
pub use one_batch::run as one_batch;

/// `bench-all-reduce --tp-size N` (default 2).
pub fn all_reduce(args: &[String]) -> Result<()> {
    sgl_core::backend::cuda::all_reduce_bench(arg_usize(args, "--tp-size", 2)?)
}

/// A failed CUDA call as the engine's error.
fn cuda_err(e: impl Into<BackendError>) -> EngineError {
    EngineError::from(e.into())
}

pub(crate) fn open(args: &[String]) -> Result<CudaBackend> {
    let model = arg(args, "--model")
        .ok_or_else(|| EngineError::InvalidArgument("--model DIR is required".into()))?;
    let model = sgl_core::model::load(&PathBuf::from(model))?;
    let opts = CudaOptions {
        disable_cuda_graph: args.iter().any(|a| a == "--disable-cuda-graph"),
        cuda_graph_max_bs: arg_usize(args, "--cuda-graph-max-bs", 160)?,
        max_total_tokens: arg(args, "--max-total-tokens").and_then(|v| v.parse().ok()),
        mem_fraction_static: arg(args, "--mem-fraction-static")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.88),
        tensor_parallel: sgl_core::model::llama::TensorParallel {
            rank: 0,
            size: arg_usize(args, "--tp-size", 1)?,
        },
        quantization: match arg(args, "--quantization") {
            None => sgl_core::model::Quantization::AsStored,
            Some("fp8") => sgl_core::model::Quantization::Fp8,
            Some(q) => {
                return Err(EngineError::InvalidArgument(format!(
                    "--quantization {q}: only fp8 is supported"
                )));
            }
        },
        kv: match arg(args, "--kv-cache-dtype") {
            None | Some("auto") => sgl_kernels::KvDtype::Bf16,
            Some("fp8_e4m3") => sgl_kernels::KvDtype::Fp8E4m3,
            Some("fp8_e5m2") => sgl_kernels::KvDtype::Fp8E5m2,
            Some(k) => {
                return Err(EngineError::InvalidArgument(format!(
                    "--kv-cache-dtype {k}: auto, fp8_e4m3 or fp8_e5m2"
                )));
            }
        },
        ..CudaOptions::default()
    };
    CudaBackend::load(&model, &opts)
}

/// Hands out KV slots in order (the benchmarks run without the radix cache).
pub(crate) struct Slots {
    pub(crate) next: u32,
    pub(crate) cap: u32,
}

impl Slots {
    pub(crate) fn take(&mut self, n: usize) -> Result<Vec<u32>> {
        if self.next as usize + n > self.cap as usize {
            return Err(EngineError::Internal(
                "benchmark ran out of KV slots".into(),
            ));
        }
        let v = (self.next..self.next + n as u32).collect();
        self.next += n as u32;
        Ok(v)
    }
}
