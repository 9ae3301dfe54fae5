//! What every CUDA launcher shares: the kernel layer's error and device addresses.

use std::marker::PhantomData;

/// Errors of the kernel layer.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLASLt: {0:?}")]
    Blas(#[source] cudarc::cublaslt::result::CublasError),
    #[error("NVRTC could not compile the kernels: {0}")]
    Compile(String),
    #[error("NVRTC (libnvrtc.so) was not found; install the CUDA toolkit or nvidia-cuda-nvrtc")]
    NvrtcMissing,
    #[error("unsupported shape: {0}")]
    Unsupported(String),
}

impl From<cudarc::cublaslt::result::CublasError> for KernelError {
    fn from(e: cudarc::cublaslt::result::CublasError) -> Self {
        KernelError::Blas(e)
    }
}

pub type Result<T, E = KernelError> = std::result::Result<T, E>;

/// A device address of elements of type `T` (no ownership, no length): what the launchers
/// take. Obtain one from an allocation with [`dptr`] and move within it with [`Dptr::add`].
pub struct Dptr<T> {
    addr: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for Dptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Dptr<T> {}

impl<T> std::fmt::Debug for Dptr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dptr({:#x})", self.addr)
    }
}

impl<T> Dptr<T> {
    /// # Safety
    /// `addr` must be a device address of `T`s that stays allocated while it is used.
    pub const unsafe fn from_raw(addr: u64) -> Self {
        Dptr {
            addr,
            _t: PhantomData,
        }
    }

    /// The null address (for optional kernel arguments).
    pub const fn null() -> Self {
        Dptr {
            addr: 0,
            _t: PhantomData,
        }
    }

    /// The address `n` elements further on (pointer arithmetic, not `std::ops::Add`).
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, n: usize) -> Self {
        Dptr {
            addr: self.addr + (n * std::mem::size_of::<T>()) as u64,
            _t: PhantomData,
        }
    }

    pub fn addr(self) -> u64 {
        self.addr
    }

    /// The same address, as one of `U`s (the KV pool's bytes hold elements of its dtype).
    pub const fn cast<U>(self) -> Dptr<U> {
        Dptr {
            addr: self.addr,
            _t: PhantomData,
        }
    }
}

/// The device address of an allocation.
pub fn dptr<T>(s: &cudarc::driver::CudaSlice<T>, stream: &cudarc::driver::CudaStream) -> Dptr<T> {
    use cudarc::driver::DevicePtr;
    let (addr, _sync) = s.device_ptr(stream);
    Dptr {
        addr,
        _t: PhantomData,
    }
}
