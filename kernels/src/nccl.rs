//! NCCL for tensor parallelism: the few calls the engine makes (unique id, communicator per
//! rank, in-place all-reduce and broadcast on a stream), loaded at run time like the other
//! CUDA libraries.
//!
//! The library is looked up as `$SGL_NCCL_LIBRARY` when set, else by its soname
//! `libnccl.so.2` and then `libnccl.so` on the loader's path (`LD_LIBRARY_PATH`, the system
//! directories): NCCL packages, and the `nvidia-nccl` wheels, install the `.so.2` name, which
//! cudarc's own loader does not try.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::CudaStream;

use crate::Dptr;

/// `ncclUniqueId`: 128 opaque bytes made by rank 0 and handed to every rank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [c_char; 128],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

type CommPtr = *mut c_void;
type RawResult = c_int;

/// ncclDataType_t values used here.
const NCCL_INT32: c_int = 2;
const NCCL_UINT32: c_int = 3;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
/// ncclRedOp_t ncclSum.
const NCCL_SUM: c_int = 0;

/// An element type NCCL can reduce.
pub trait NcclType {
    const CODE: c_int;
}
impl NcclType for half::bf16 {
    const CODE: c_int = NCCL_BFLOAT16;
}
impl NcclType for f32 {
    const CODE: c_int = NCCL_FLOAT32;
}
impl NcclType for i32 {
    const CODE: c_int = NCCL_INT32;
}
impl NcclType for u32 {
    const CODE: c_int = NCCL_UINT32;
}

struct Api {
    _lib: libloading::Library,
    version: unsafe extern "C" fn(*mut c_int) -> RawResult,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> RawResult,
    comm_init_rank: unsafe extern "C" fn(*mut CommPtr, c_int, UniqueId, c_int) -> RawResult,
    comm_abort: unsafe extern "C" fn(CommPtr) -> RawResult,
    comm_destroy: unsafe extern "C" fn(CommPtr) -> RawResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        CommPtr,
        *mut c_void,
    ) -> RawResult,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        CommPtr,
        *mut c_void,
    ) -> RawResult,
    error_string: unsafe extern "C" fn(RawResult) -> *const c_char,
}

/// Errors of the NCCL layer.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    #[error(
        "NCCL (libnccl.so.2) could not be loaded: {0}; install NCCL (the nvidia-nccl-cu13 wheel or the libnccl2 package) and put its folder on LD_LIBRARY_PATH, or set SGL_NCCL_LIBRARY to the file"
    )]
    Missing(String),
    #[error("NCCL {call}: {message} (code {code})")]
    Call {
        call: &'static str,
        code: c_int,
        message: String,
    },
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, NcclError> {
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| NcclError::Missing(e.clone()))
}

fn load() -> Result<Api, String> {
    let names: Vec<String> = match std::env::var("SGL_NCCL_LIBRARY") {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec!["libnccl.so.2".into(), "libnccl.so".into()],
    };
    let mut last = String::new();
    for name in &names {
        // SAFETY: loading NCCL runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => last = format!("{name}: {e}"),
        }
    }
    Err(last)
}

fn bind(lib: libloading::Library) -> Result<Api, libloading::Error> {
    // SAFETY: the symbol types are NCCL's documented C signatures (nccl.h, NCCL 2.x).
    unsafe {
        Ok(Api {
            version: *lib.get(b"ncclGetVersion\0")?,
            get_unique_id: *lib.get(b"ncclGetUniqueId\0")?,
            comm_init_rank: *lib.get(b"ncclCommInitRank\0")?,
            comm_abort: *lib.get(b"ncclCommAbort\0")?,
            comm_destroy: *lib.get(b"ncclCommDestroy\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            broadcast: *lib.get(b"ncclBroadcast\0")?,
            error_string: *lib.get(b"ncclGetErrorString\0")?,
            _lib: lib,
        })
    }
}

fn check(api: &Api, call: &'static str, code: RawResult) -> Result<(), NcclError> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let message = unsafe {
        let p = (api.error_string)(code);
        if p.is_null() {
            String::from("unknown error")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(NcclError::Call {
        call,
        code,
        message,
    })
}

/// Whether NCCL can be loaded (without initialising anything).
pub fn available() -> Result<(), NcclError> {
    api().map(|_| ())
}

/// NCCL's version as `major.minor.patch`.
pub fn version() -> Result<String, NcclError> {
    let a = api()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check(a, "ncclGetVersion", unsafe { (a.version)(&mut v) })?;
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

impl UniqueId {
    /// A fresh id (made once, by rank 0).
    pub fn new() -> Result<Self, NcclError> {
        let a = api()?;
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes the 128-byte id.
        check(a, "ncclGetUniqueId", unsafe { (a.get_unique_id)(&mut id) })?;
        Ok(id)
    }
}

/// One rank's communicator. Collectives are queued on the stream given to each call; the
/// communicator belongs to the device whose context was current at [`Comm::init`].
pub struct Comm {
    raw: CommPtr,
    rank: usize,
    size: usize,
    aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `Comm` is
// only used through `&self` from the thread that owns the rank's backend.
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Comm(rank {} of {})", self.rank, self.size)
    }
}

impl Comm {
    /// Joins rank `rank` of `size` to the group of `id`. Blocks until every rank has joined, so
    /// the ranks must call it concurrently (a thread each). The stream's context is made
    /// current on this thread first: NCCL binds the communicator to that device.
    pub fn init(
        stream: &CudaStream,
        id: UniqueId,
        rank: usize,
        size: usize,
    ) -> Result<Self, NcclError> {
        let a = api()?;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| NcclError::Call {
                call: "cuCtxSetCurrent",
                code: -1,
                message: e.to_string(),
            })?;
        let mut raw: CommPtr = std::ptr::null_mut();
        // SAFETY: `raw` receives the communicator; id is passed by value as nccl.h declares.
        check(a, "ncclCommInitRank", unsafe {
            (a.comm_init_rank)(&mut raw, size as c_int, id, rank as c_int)
        })?;
        Ok(Comm {
            raw,
            rank,
            size,
            aborted: AtomicBool::new(false),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// `buf[..count] = sum over ranks of buf[..count]`, in place, queued on `stream`.
    ///
    /// # Safety
    /// `buf` holds `count` elements on this communicator's device, and every rank queues the
    /// same collectives in the same order.
    pub unsafe fn all_reduce_sum<T: NcclType>(
        &self,
        buf: Dptr<T>,
        count: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let a = api()?;
        let p = buf.addr() as *mut c_void;
        // SAFETY: the caller's guarantee; in-place (send == receive) is allowed by NCCL.
        check(a, "ncclAllReduce", unsafe {
            (a.all_reduce)(
                p,
                p,
                count,
                T::CODE,
                NCCL_SUM,
                self.raw,
                stream.cu_stream() as *mut c_void,
            )
        })
    }

    /// Rank `root`'s `buf[..count]` copied into every rank's `buf`, queued on `stream`.
    ///
    /// # Safety
    /// As for [`Comm::all_reduce_sum`].
    pub unsafe fn broadcast<T: NcclType>(
        &self,
        buf: Dptr<T>,
        count: usize,
        root: usize,
        stream: &CudaStream,
    ) -> Result<(), NcclError> {
        let a = api()?;
        let p = buf.addr() as *mut c_void;
        // SAFETY: the caller's guarantee; in place is allowed.
        check(a, "ncclBroadcast", unsafe {
            (a.broadcast)(
                p,
                p,
                count,
                T::CODE,
                root as c_int,
                self.raw,
                stream.cu_stream() as *mut c_void,
            )
        })
    }

    /// Aborts the communicator: collectives queued on any rank of it stop waiting (used when a
    /// rank failed, so the others do not hang).
    pub fn abort(&self) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(a) = api() {
            // SAFETY: `raw` is a live communicator; `aborted` keeps it from being used or
            // destroyed after this.
            let _ = unsafe { (a.comm_abort)(self.raw) };
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if *self.aborted.get_mut() {
            return;
        }
        if let Ok(a) = api() {
            // SAFETY: `raw` is a live communicator, dropped once, after its stream's work.
            let _ = unsafe { (a.comm_destroy)(self.raw) };
        }
    }
}
