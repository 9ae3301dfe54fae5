//! Why a backend could not be built or could not run a pass. Causes from the checkpoint, the
//! CPU kernels, the CUDA driver and the CUDA kernels stay attached as typed sources.

use crate::model::LoadError;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A tensor could not be read from the checkpoint.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A tensor does not fit the CPU kernels' layout.
    #[error("tensor {name}: {source}")]
    Weight {
        name: String,
        #[source]
        source: sgl_kernels::cpu::KernelError,
    },
    /// A model this backend cannot run, or options it cannot honour.
    #[error("{0}")]
    Unsupported(String),
    /// Device memory too small for what was asked.
    #[error("{0}")]
    OutOfMemory(String),
    /// No CUDA device or driver.
    #[cfg(feature = "cuda")]
    #[error("no usable CUDA device (driver or GPU missing?): {0}")]
    NoDevice(#[source] cudarc::driver::DriverError),
    #[cfg(feature = "cuda")]
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[cfg(feature = "cuda")]
    #[error("CUDA kernels: {0}")]
    Kernels(#[from] sgl_kernels::KernelError),
    /// Tensor parallelism: NCCL failed, or another rank did.
    #[cfg(feature = "cuda")]
    #[error("tensor parallel: {0}")]
    Nccl(#[from] sgl_kernels::nccl::NcclError),
    #[cfg(feature = "cuda")]
    #[error("tensor parallel: {0}")]
    Rank(String),
    /// `--device cuda` in a build without the `cuda` feature.
    #[error(
        "this sgl-engine was built without CUDA support; rebuild with `--features cuda` or use --device cpu"
    )]
    NotCompiled,
}
