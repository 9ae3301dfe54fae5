//! GEMMs through cuBLASLt: `y = x · wᵀ` for row-major activations and `[out, in]` weights
//! (the checkpoint's own layout), with f32 accumulation: bf16 x bf16, and FP8 x FP8 (e4m3, sm_89+)
//! without scales: cuBLASLt's FP8 GEMMs on sm_90 take one scale per matrix only (its per-row
//! and per-block modes have no algorithm there), so the per-channel and per-token scales are
//! applied afterwards ([`crate::Kernels::fp8_rescale`]). Descriptors and the heuristic's
//! algorithm are made once per shape and reused, so a call costs one `cublasLtMatmul`.
//!
//! Batch invariance ([`Gemm::set_batch_invariant`]): cuBLASLt's heuristic picks a different
//! algorithm (tile shape, split-k) for each token count, so a token's row of `y` can differ in
//! its last bits with the batch it came in. A batch-invariant Gemm takes, for each weight
//! shape, the algorithm the heuristic gives at [`INVARIANT_REF_TOKENS`] tokens with split-k
//! reductions excluded, and runs it for every token count: each output element is then one
//! block's sum over k in a fixed order, whatever the other rows are.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;

use crate::{Dptr, KernelError, Result};

const WORKSPACE_BYTES: usize = 32 << 20;

/// The token count whose algorithm a batch-invariant Gemm runs for every token count
/// (`SGL_INVARIANT_GEMM_TOKENS` overrides it, to compare): large enough that prefill keeps a
/// tile of a good shape, small enough that a decode batch still spreads over the GPU.
pub const INVARIANT_REF_TOKENS: usize = 256;

/// The placeholder algorithm of a plan that failed or of a heuristic result not filled in.
const NO_ALGO: sys::cublasLtMatmulAlgo_t = sys::cublasLtMatmulAlgo_t { data: [0; 8] };

/// Algorithms the heuristic is asked for when one without split-k is wanted.
const HEURISTIC_CANDIDATES: usize = 8;

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

/// The algorithm of each (in, out, FP8) for a batch-invariant Gemm.
type AlgoCache = Mutex<HashMap<(usize, usize, bool), sys::cublasLtMatmulAlgo_t>>;

pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    /// By (tokens, in, out, FP8).
    plans: Mutex<HashMap<(usize, usize, usize, bool), Plan>>,
    /// Batch invariance: the one algorithm of each (in, out, FP8), for every token count.
    invariant: Option<AlgoCache>,
    /// FP8 GEMMs accumulate in the tensor cores only (cuBLASLt's fast accumulation) instead of
    /// moving partial sums to f32 registers at intervals.
    fast_accum: bool,
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
            invariant: None,
            fast_accum: false,
        })
    }

    /// FP8 GEMMs with cuBLASLt's fast accumulation (sums kept in the tensor cores' own
    /// precision). Plans made before are dropped.
    pub fn set_fp8_fast_accum(&mut self, on: bool) {
        if let Ok(p) = self.plans.get_mut() {
            p.clear();
        }
        if let Some(Ok(c)) = self.invariant.as_mut().map(|c| c.get_mut()) {
            c.clear();
        }
        self.fast_accum = on;
    }

    pub fn fp8_fast_accum(&self) -> bool {
        self.fast_accum
    }

    /// The operation's descriptor: f32 compute, `W` transposed, fast accumulation for FP8
    /// when set.
    fn matmul_desc(&self, fp8: bool) -> Result<sys::cublasLtMatmulDesc_t> {
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )?;
        let trans: i32 = 1;
        let fast: i8 = 1;
        // SAFETY: attribute buffers are live locals of the documented types and sizes.
        let r = unsafe {
            result::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&trans) as *const i32 as *const c_void,
                std::mem::size_of::<i32>(),
            )
            .and_then(|()| {
                if fp8 && self.fast_accum {
                    result::set_matmul_desc_attribute(
                        desc,
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                        (&fast) as *const i8 as *const c_void,
                        std::mem::size_of::<i8>(),
                    )
                } else {
                    Ok(())
                }
            })
        };
        if let Err(e) = r {
            // SAFETY: made above, destroyed once.
            let _ = unsafe { result::destroy_matmul_desc(desc) };
            return Err(e.into());
        }
        Ok(desc)
    }

    /// Timing only: the heuristic's first `n` algorithms for an FP8 GEMM of this shape, each
    /// run `iters` times after a warm-up on the given buffers (`d` is overwritten): the
    /// algorithm's description and µs per call, in the heuristic's order.
    ///
    /// # Safety
    /// As [`Gemm::linear_fp8`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn time_fp8_algos(
        &self,
        xq: Dptr<u8>,
        wq: Dptr<u8>,
        d: Dptr<bf16>,
        tokens: usize,
        in_f: usize,
        out_f: usize,
        n: usize,
        iters: usize,
    ) -> Result<Vec<(AlgoInfo, f64)>> {
        use cudarc::driver::sys::CUevent_flags;
        let desc = self.matmul_desc(true)?;
        let (a, b, c) = layouts(tokens, in_f, out_f, true)?;
        let plan = Plan {
            desc,
            a,
            b,
            c,
            algo: NO_ALGO,
        };
        let found = self
            .heuristic(plan.desc, plan.a, plan.b, plan.c, n, false)
            .map_err(|why| {
                KernelError::Unsupported(format!(
                    "no FP8 algorithm for {tokens}x{in_f} -> {out_f}: {why}"
                ))
            })?;
        let ctx = self.stream.context();
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        let (wsp, _sync) = self.workspace.device_ptr(&self.stream);
        let mut out = Vec::new();
        for h in &found {
            let run = || {
                // SAFETY: the plan matches these extents and types; the caller guarantees the
                // buffers.
                unsafe {
                    result::matmul(
                        self.handle,
                        plan.desc,
                        (&alpha) as *const f32 as *const c_void,
                        (&beta) as *const f32 as *const c_void,
                        wq.addr() as *const c_void,
                        plan.a,
                        xq.addr() as *const c_void,
                        plan.b,
                        d.addr() as *const c_void,
                        plan.c,
                        d.addr() as *mut c_void,
                        plan.c,
                        (&h.algo) as *const _,
                        wsp as *mut c_void,
                        WORKSPACE_BYTES,
                        self.stream.cu_stream() as *mut _,
                    )
                }
            };
            for _ in 0..3 {
                run()?;
            }
            let e0 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            let e1 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            e0.record(&self.stream)?;
            for _ in 0..iters.max(1) {
                run()?;
            }
            e1.record(&self.stream)?;
            let us = e0.elapsed_ms(&e1)? as f64 * 1e3 / iters.max(1) as f64;
            out.push((AlgoInfo::of(h), us));
        }
        Ok(out)
    }

    /// Batch-invariant GEMMs (see the module's note): on, every later plan takes its shape's
    /// one algorithm. Plans made before are dropped.
    pub fn set_batch_invariant(&mut self, on: bool) {
        if let Ok(p) = self.plans.get_mut() {
            p.clear();
        }
        self.invariant = on.then(|| Mutex::new(HashMap::new()));
    }

    pub fn batch_invariant(&self) -> bool {
        self.invariant.is_some()
    }

    /// The heuristic's first `n` algorithms for `desc` on these layouts, in its order, keeping
    /// those cuBLASLt can run with this Gemm's workspace; with `no_reduction`, only algorithms
    /// without a split-k reduction are asked for. `Err` says why the query failed.
    fn heuristic(
        &self,
        desc: sys::cublasLtMatmulDesc_t,
        a: sys::cublasLtMatrixLayout_t,
        b: sys::cublasLtMatrixLayout_t,
        c: sys::cublasLtMatrixLayout_t,
        n: usize,
        no_reduction: bool,
    ) -> std::result::Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, String> {
        let pref = result::create_matmul_pref().map_err(|e| format!("{e:?}"))?;
        let ws = WORKSPACE_BYTES;
        let none = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        let mut found = vec![heuristic_result(NO_ALGO); n.max(1)];
        let mut count: i32 = 0;
        // SAFETY: attribute buffers are live locals of the documented types and sizes; `found`
        // holds found.len() entries; the preference is destroyed once.
        let status = unsafe {
            let r = result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .and_then(|()| {
                if !no_reduction {
                    return Ok(());
                }
                result::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    (&none) as *const u32 as *const c_void,
                    std::mem::size_of::<u32>(),
                )
            })
            .map(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    a,
                    b,
                    c,
                    c,
                    pref,
                    found.len() as i32,
                    found.as_mut_ptr(),
                    &mut count,
                )
            });
            let _ = result::destroy_matmul_pref(pref);
            r
        };
        let status = status.map_err(|e| format!("{e:?}"))?;
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("{status:?}"));
        }
        found.truncate(count.clamp(0, found.len() as i32) as usize);
        found.retain(|h| h.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        Ok(found)
    }

    /// The one algorithm of (in, out, FP8) for a batch-invariant Gemm: the heuristic's first
    /// at [`INVARIANT_REF_TOKENS`] tokens with no split-k reduction, made once.
    fn invariant_algo(
        &self,
        desc: sys::cublasLtMatmulDesc_t,
        in_f: usize,
        out_f: usize,
        fp8: bool,
        cache: &AlgoCache,
    ) -> Result<sys::cublasLtMatmulAlgo_t> {
        let mut cache = cache
            .lock()
            .map_err(|_| KernelError::Unsupported("GEMM algorithm cache poisoned".into()))?;
        if let Some(a) = cache.get(&(in_f, out_f, fp8)) {
            return Ok(*a);
        }
        let tokens = std::env::var("SGL_INVARIANT_GEMM_TOKENS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&t| t > 0)
            .unwrap_or(INVARIANT_REF_TOKENS);
        let (a, b, c) = layouts(tokens, in_f, out_f, fp8)?;
        let found = self.heuristic(desc, a, b, c, HEURISTIC_CANDIDATES, true);
        // SAFETY: made above, destroyed once.
        unsafe {
            let _ = result::destroy_matrix_layout(a);
            let _ = result::destroy_matrix_layout(b);
            let _ = result::destroy_matrix_layout(c);
        }
        let unsupported = |why: String| {
            KernelError::Unsupported(format!(
                "no batch-invariant cuBLASLt algorithm for {in_f} -> {out_f}{}: {why}",
                if fp8 { " (FP8)" } else { "" }
            ))
        };
        let found = found.map_err(unsupported)?;
        let pick = found
            .iter()
            .find(|h| splitk(&h.algo) <= 1)
            .ok_or_else(|| unsupported(format!("{} candidates, all split along k", found.len())))?;
        cache.insert((in_f, out_f, fp8), pick.algo);
        Ok(pick.algo)
    }

    fn plan(&self, tokens: usize, in_f: usize, out_f: usize, fp8: bool) -> Result<Plan> {
        let (a, b, c) = layouts(tokens, in_f, out_f, fp8)?;
        let desc = self.matmul_desc(fp8)?;
        let pref = result::create_matmul_pref()?;
        let ws = WORKSPACE_BYTES;
        // SAFETY: attribute buffers are live locals of the documented types and sizes.
        let heur = unsafe {
            if let Some(cache) = &self.invariant {
                let _ = result::destroy_matmul_pref(pref);
                let algo = self.invariant_algo(desc, in_f, out_f, fp8, cache);
                return match algo.and_then(|algo| self.check(desc, a, b, c, algo)) {
                    Ok(algo) => Ok(Plan {
                        desc,
                        a,
                        b,
                        c,
                        algo,
                    }),
                    Err(e) => {
                        drop(Plan {
                            desc,
                            a,
                            b,
                            c,
                            algo: NO_ALGO,
                        });
                        Err(e)
                    }
                };
            }
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
                    algo: NO_ALGO,
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

    /// `algo` if cuBLASLt runs it for these layouts.
    fn check(
        &self,
        desc: sys::cublasLtMatmulDesc_t,
        a: sys::cublasLtMatrixLayout_t,
        b: sys::cublasLtMatrixLayout_t,
        c: sys::cublasLtMatrixLayout_t,
        algo: sys::cublasLtMatmulAlgo_t,
    ) -> Result<sys::cublasLtMatmulAlgo_t> {
        let mut out = heuristic_result(algo);
        // SAFETY: live handles made by this Gemm; `out` is a live local.
        let status =
            unsafe { sys::cublasLtMatmulAlgoCheck(self.handle, desc, a, b, c, c, &algo, &mut out) };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
            || out.workspaceSize > WORKSPACE_BYTES
        {
            return Err(KernelError::Unsupported(format!(
                "the batch-invariant cuBLASLt algorithm does not run this shape: {status:?}, {} bytes of workspace",
                out.workspaceSize
            )));
        }
        Ok(algo)
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

/// Column-major view: C (out x tokens) = op(A) B with A = W stored (in x out), op = T.
fn layouts(
    tokens: usize,
    in_f: usize,
    out_f: usize,
    fp8: bool,
) -> Result<(
    sys::cublasLtMatrixLayout_t,
    sys::cublasLtMatrixLayout_t,
    sys::cublasLtMatrixLayout_t,
)> {
    let bf = sys::cudaDataType_t::CUDA_R_16BF;
    let ab = if fp8 {
        sys::cudaDataType_t::CUDA_R_8F_E4M3
    } else {
        bf
    };
    let a = result::create_matrix_layout(ab, in_f as u64, out_f as u64, in_f as i64)?;
    let b = result::create_matrix_layout(ab, in_f as u64, tokens as u64, in_f as i64)?;
    let c = result::create_matrix_layout(bf, out_f as u64, tokens as u64, out_f as i64)?;
    Ok((a, b, c))
}

/// The split-k factor an algorithm's configuration holds (1: none; `u32::MAX` where unreadable).
fn splitk(algo: &sys::cublasLtMatmulAlgo_t) -> u32 {
    algo_attr(
        algo,
        sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
    )
}

/// An algorithm's configuration, as cuBLASLt describes it (for benchmarks).
#[derive(Clone, Copy, Debug)]
pub struct AlgoInfo {
    pub id: u32,
    pub tile: u32,
    pub stages: u32,
    pub splitk: u32,
    pub cluster: u32,
    pub waves: f32,
}

impl AlgoInfo {
    fn of(h: &sys::cublasLtMatmulHeuristicResult_t) -> Self {
        use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
        AlgoInfo {
            id: algo_attr(&h.algo, A::CUBLASLT_ALGO_CONFIG_ID),
            tile: algo_attr(&h.algo, A::CUBLASLT_ALGO_CONFIG_TILE_ID),
            stages: algo_attr(&h.algo, A::CUBLASLT_ALGO_CONFIG_STAGES_ID),
            splitk: splitk(&h.algo),
            cluster: algo_attr(&h.algo, A::CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
            waves: h.wavesCount,
        }
    }
}

/// A 32-bit configuration attribute of an algorithm (`u32::MAX` where unreadable).
fn algo_attr(
    algo: &sys::cublasLtMatmulAlgo_t,
    attr: sys::cublasLtMatmulAlgoConfigAttributes_t,
) -> u32 {
    let mut v: u32 = 0;
    let mut written = 0usize;
    // SAFETY: `v` is a live 32-bit local, the size of these attributes.
    let status = unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            attr,
            (&mut v) as *mut u32 as *mut c_void,
            std::mem::size_of::<u32>(),
            &mut written,
        )
    };
    if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        v
    } else {
        u32::MAX
    }
}

/// A heuristic result holding `algo`, for cuBLASLt to fill in.
fn heuristic_result(algo: sys::cublasLtMatmulAlgo_t) -> sys::cublasLtMatmulHeuristicResult_t {
    sys::cublasLtMatmulHeuristicResult_t {
        algo,
        workspaceSize: 0,
        state: sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS,
        wavesCount: 0.0,
        reserved: [0; 4],
    }
}
