//! Kernels of the serving engine: the CPU kernels ([`cpu`], always built) and, with the
//! `cuda` feature, the CUDA kernels and their typed launchers over cudarc.
//!
//! CUDA: the `.cu` sources under `src/cu/` are compiled by NVRTC (loaded at run time, like
//! every CUDA library here) for the device's architecture when `Kernels::load` is first called;
//! the PTX is cached on disk, keyed by a hash of the source, the architecture and NVRTC's
//! version. `compile_ptx` compiles every kernel without a GPU, which is how CI catches a broken
//! kernel. GEMMs go through cuBLASLt (`Gemm`).

pub mod cpu;

#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
mod source;

#[cfg(feature = "cuda")]
pub use gemm::Gemm;
#[cfg(feature = "cuda")]
pub use launch::{
    AR_BLOCKS, AR_LARGE_BLOCKS, AR_MAX_RANKS, ArPeers, AttnShape, DECODE_TC_MIN_BATCH,
    DecodeAttnPlan, GEMV_MAX_SPLITS, GEMV_MAX_TOKENS, GEMV_PREFETCH_STEPS, GemvEpilogue, GemvPlan,
    GemvWorkspace, Kernels, KvDtype, KvScales, LayerAttn, LogitEdit, MAX_DECODE_SPLITS, NormOut,
    PREFILL_ENTRY_INTS, PREFILL_MAX_SPLITS, PrefillForm, PrefillPartials, PrefillSeq, WeightRef,
    prefill_paired_work, prefill_tiles, prefill_work,
};
#[cfg(feature = "cuda")]
pub use source::{KERNEL_NAMES, SOURCE, compile_ptx, nvrtc_available};

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::{Dptr, KernelError, Result, dptr};
#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use half::bf16;
