//! GEMMs through cuBLASLt: `y = x · wᵀ` for row-major activations and `[out, in]` weights
//! (the checkpoint's own layout), with f32 accumulation: bf16 x bf16, and FP8 x FP8 (e4m3, sm_89+)
//! without scales: cuBLASLt's FP8 GEMMs on sm_90 take one scale per matrix only (its per-row
//! and per-block modes have no algorithm there), so the per-channel and per-token scales are
//! applied afterwards ([`crate::Kernels::fp8_rescale`]). Descriptors and the heuristic's
//! algorithm are made once per shape and reused, so a call costs one `cublasLtMatmul`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;

use crate::{Dptr, KernelError, Result};

const WORKSPACE_BYTES: usize = 32 << 20;

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created once by `Gemm::plan` and is destroyed once here.
        unsafe {
            let _ = result::destroy_matrix_layout(self.a);
            let _ = result::destroy_matrix_layout(self.b);
            let _ = result::destroy_matrix_layout(self.c);
            let _ = result::destroy_matmul_desc(self.desc);
        }
    }
}

pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    /// By (tokens, in, out, FP8).
    plans: Mutex<HashMap<(usize, usize, usize, bool), Plan>>,
}

// SAFETY: the cuBLASLt handle and descriptors are only used through &self methods that take
// the plan lock, and every call is ordered on the one stream this Gemm was made for.
unsafe impl Send for Gemm {}
// SAFETY: as above.
unsafe impl Sync for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plans.lock() {
            p.clear();
        }
        // SAFETY: the handle was created in `new` and is destroyed once.
        unsafe {
            let _ = result::destroy_handle(self.handle);
        }
    }
}

impl Gemm {
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let handle = result::create_handle()?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        Ok(Gemm {
            handle,
            workspace,
            stream,
            plans: Mutex::new(HashMap::new()),
        })
    }

    fn plan(&self, tokens: usize, in_f: usize, out_f: usize, fp8: bool) -> Result<Plan> {
        let bf = sys::cudaDataType_t::CUDA_R_16BF;
        let ab = if fp8 {
            sys::cudaDataType_t::CUDA_R_8F_E4M3
        } else {
            bf
        };
        // Column-major view: C (out x tokens) = op(A) B with A = W stored (in x out), op = T.
        let a = result::create_matrix_layout(ab, in_f as u64, out_f as u64, in_f as i64)?;
        let b = result::create_matrix_layout(ab, in_f as u64, tokens as u64, in_f as i64)?;
        let c = result::create_matrix_layout(bf, out_f as u64, tokens as u64, out_f as i64)?;
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )?;
        let trans: i32 = 1;
        let pref = result::create_matmul_pref()?;
        let ws = WORKSPACE_BYTES;
        // SAFETY: attribute buffers are live locals of the documented types and sizes.
        let heur = unsafe {
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans) as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )?;
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )?;
            let h = result::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, pref);
            let _ = result::destroy_matmul_pref(pref);
            h
        };
        match heur {
            Ok(h) => Ok(Plan {
                desc,
                a,
                b,
                c,
                algo: h.algo,
            }),
            Err(e) => {
                // Dropping this plan destroys the descriptors made above, once.
                drop(Plan {
                    desc,
                    a,
                    b,
                    c,
                    algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
                });
                Err(KernelError::Unsupported(format!(
                    "no cuBLASLt algorithm for {tokens}x{in_f} -> {out_f}{}: {e:?}",
                    if fp8 {
                        " (FP8, outer-vector scales)"
                    } else {
                        ""
                    }
                )))
            }
        }
    }

    /// `y[t, o] = Σ_i x[t, i] w[o, i]` (+ `y` when `accumulate`), bf16 in and out, f32 inside.
    ///
    /// # Safety
    /// x: tokens x in_f; w: out_f x in_f; y: tokens x out_f, not overlapping x or w; all on
    /// the device of this Gemm's stream.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn linear(
        &self,
        x: Dptr<bf16>,
        w: Dptr<bf16>,
        y: Dptr<bf16>,
        tokens: usize,
        in_f: usize,
        out_f: usize,
        accumulate: bool,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        // SAFETY: the caller's guarantees for these extents.
        unsafe {
            self.matmul(
                (tokens, in_f, out_f, false),
                w.addr(),
                x.addr(),
                y.addr(),
                beta,
            )
        }
    }

    /// Whether [`Gemm::linear_fp8`] runs here: plans the FP8 GEMM of that shape (kept for
    /// later calls), or says why not.
    pub fn supports_fp8(&self, tokens: usize, in_f: usize, out_f: usize) -> Result<()> {
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| KernelError::Unsupported("GEMM plan cache poisoned".into()))?;
        let key = (tokens, in_f, out_f, true);
        if let std::collections::hash_map::Entry::Vacant(e) = plans.entry(key) {
            e.insert(self.plan(tokens, in_f, out_f, true)?);
        }
        Ok(())
    }

    /// `d[t, o] = Σ_i xq[t, i] wq[o, i]`: e4m3 x and w, bf16 d, f32 sums, no scales (see the
    /// module's note; [`crate::Kernels::fp8_rescale`] applies them). `Unsupported` (nothing
    /// launched) where cuBLASLt has no FP8 algorithm (before sm_89).
    ///
    /// # Safety
    /// xq: tokens x in_f bytes; wq: out_f x in_f bytes; d: tokens x out_f, not overlapping
    /// the inputs; all on the device of this Gemm's stream.
    pub unsafe fn linear_fp8(
        &self,
        xq: Dptr<u8>,
        wq: Dptr<u8>,
        d: Dptr<bf16>,
        tokens: usize,
        in_f: usize,
        out_f: usize,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        if !in_f.is_multiple_of(16) || !out_f.is_multiple_of(16) {
            return Err(KernelError::Unsupported(format!(
                "FP8 GEMM of {tokens}x{in_f} -> {out_f}: in and out must be multiples of 16"
            )));
        }
        // SAFETY: the caller's guarantees for these extents.
        unsafe {
            self.matmul(
                (tokens, in_f, out_f, true),
                wq.addr(),
                xq.addr(),
                d.addr(),
                0.0,
            )
        }
    }

    /// `y = W x + beta y` in the column-major view of [`Gemm::plan`], with the plan of `key`
    /// (tokens, in, out, FP8), made on first use.
    ///
    /// # Safety
    /// The addresses hold the extents and element types of `key` on this Gemm's device.
    unsafe fn matmul(
        &self,
        key: (usize, usize, usize, bool),
        w: u64,
        x: u64,
        y: u64,
        beta: f32,
    ) -> Result<()> {
        let mut plans = self
            .plans
            .lock()
            .map_err(|_| KernelError::Unsupported("GEMM plan cache poisoned".into()))?;
        let p = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(self.plan(key.0, key.1, key.2, key.3)?)
            }
        };
        let alpha: f32 = 1.0;
        let (ws, _sync) = self.workspace.device_ptr(&self.stream);
        // SAFETY: the plan matches these extents and types; the caller guarantees the buffers.
        unsafe {
            result::matmul(
                self.handle,
                p.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                w as *const c_void,
                p.a,
                x as *const c_void,
                p.b,
                y as *const c_void,
                p.c,
                y as *mut c_void,
                p.c,
                (&p.algo) as *const _,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream() as *mut _,
            )?;
        }
        Ok(())
    }
}
