//! Typed launchers. Each mirrors its kernel's signature; the caller guarantees, as each
//! `# Safety` says, that every address covers the shape it passes.
//!
//! On sm_90 and newer every kernel is launched with programmatic dependent launch (PDL): the
//! launch attribute `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` lets a kernel start
//! while the one before it on the stream drains, and each kernel waits for its predecessors
//! (`griddepcontrol.wait`) before it touches memory they write or read; the GEMV streams its
//! first weights before that wait. A kernel lets the next one launch once each block's work is
//! done (see [`Kernels::set_pdl_early_trigger`]). `SGL_DISABLE_PDL=1` (read by
//! [`Kernels::load`]) or [`Kernels::set_pdl`] switches to plain launches. Both work under CUDA
//! graph capture.
#![allow(clippy::too_many_arguments)]

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, sys};
use half::bf16;

use crate::source::{KERNEL_NAMES, cached_ptx};
use crate::{Dptr, KernelError, Result};

// The launchers by family: the all-reduces, attention, the row and element kernels, FP8, the
// decode GEMV, sampling.
mod allreduce;
mod attention;
mod elementwise;
mod fp8;
mod gemv;
mod sampling;

pub use allreduce::NormOut;
pub use attention::{
    PREFILL_ENTRY_INTS, PREFILL_MAX_SPLITS, PrefillForm, PrefillPartials, PrefillSeq,
    prefill_paired_work, prefill_tiles, prefill_work,
};
pub use gemv::{
    GEMV_MAX_SPLITS, GEMV_MAX_TOKENS, GEMV_PREFETCH_STEPS, GemvEpilogue, GemvPlan, GemvWorkspace,
};

/// Most sequence splits of one decode attention launch (`DEC_MAX_SPLITS` in decode_attn.cu).
pub const MAX_DECODE_SPLITS: u32 = 32;
/// Fewest sequences a decode batch has for [`Kernels::decode_plan`] to pick the tensor-core
/// attention kernel.
pub const DECODE_TC_MIN_BATCH: usize = 16;

/// How a decode attention launch divides the work: `splits` parts along each sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeAttnPlan {
    pub splits: u32,
    /// [`Kernels::decode_attn`] on the tensor-core kernel (`decode_attn_tc_*`): one split
    /// only, no partials; for batches whose (sequence, KV head) pairs fill the GPU.
    pub tensor_cores: bool,
}

/// The weight of a GEMV or GEMM: bf16 rows, or FP8 (e4m3) rows with one f32 scale per row
/// (the row's values are `scale[row] * e4m3 value`, see [`Kernels::quantize_rows_fp8`]).
#[derive(Debug, Clone, Copy)]
pub enum WeightRef {
    Bf16(Dptr<bf16>),
    Fp8 { w: Dptr<u8>, scale: Dptr<f32> },
}

impl From<Dptr<bf16>> for WeightRef {
    fn from(w: Dptr<bf16>) -> Self {
        WeightRef::Bf16(w)
    }
}

impl WeightRef {
    fn addr(self) -> u64 {
        match self {
            WeightRef::Bf16(w) => w.addr(),
            WeightRef::Fp8 { w, .. } => w.addr(),
        }
    }
}

/// One in-place logit edit for [`Kernels::logit_edits`] (16 bytes, the kernel's `LogitEdit`):
/// `l = logits[row, token]`; if `rep != 1`, `l = l > 0 ? l / rep : l * rep`; then `l += add`
/// (`add` may be -inf); stored as bf16.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogitEdit {
    pub row: u32,
    pub token: u32,
    pub rep: f32,
    pub add: f32,
}

// SAFETY: a plain `#[repr(C)]` struct of four 4-byte scalars, laid out as the kernel's struct.
unsafe impl DeviceRepr for LogitEdit {}

const _: () = assert!(std::mem::size_of::<LogitEdit>() == 16);

/// Element type of the KV cache (`--kv-cache-dtype`): bf16 as computed, or one FP8 byte per
/// element (e4m3 saturating at +-448, e5m2 at +-57344; `kv.cuh`) holding the value divided by
/// its layer's scale ([`KvScales`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvDtype {
    #[default]
    Bf16,
    Fp8E4m3,
    Fp8E5m2,
}

impl KvDtype {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => 1,
        }
    }

    const fn index(self) -> usize {
        match self {
            KvDtype::Bf16 => 0,
            KvDtype::Fp8E4m3 => 1,
            KvDtype::Fp8E5m2 => 2,
        }
    }

    /// The suffix of the kernels for this pool type.
    const fn suffix(self) -> &'static str {
        match self {
            KvDtype::Bf16 => "",
            KvDtype::Fp8E4m3 => "_e4m3",
            KvDtype::Fp8E5m2 => "_e5m2",
        }
    }

    const ALL: [KvDtype; 3] = [KvDtype::Bf16, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2];
}

/// Attention geometry shared by the attention launchers, with the KV pool's element type: the
/// launchers take the pool as bytes (`Dptr<u8>`) holding `kv` elements, slot-major rows of
/// `n_kv_heads * head_dim`.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub kv: KvDtype,
}

impl AttnShape {
    /// This geometry with one layer's KV-cache scales.
    pub fn with_scales(self, scales: KvScales) -> LayerAttn {
        LayerAttn {
            shape: self,
            scales,
        }
    }
}

/// One layer's scales of an FP8 KV cache, as SGLang and vLLM apply them: the pool holds
/// `fp8(key * (1 / k))` and `fp8(value * (1 / v))`, and attention reads `stored * k` and
/// `stored * v` (the K scale folded into the softmax scale, the V scale applied to the output:
/// no work per key). Unused with a bf16 pool. [`KvScales::ONE`] where the checkpoint brings
/// none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    pub k: f32,
    pub v: f32,
}

impl KvScales {
    pub const ONE: KvScales = KvScales { k: 1.0, v: 1.0 };

    /// The scales a launch on a `kv` pool applies: none (1) on a bf16 pool.
    fn for_pool(self, kv: KvDtype) -> Result<KvScales> {
        if kv == KvDtype::Bf16 {
            return Ok(KvScales::ONE);
        }
        for (name, x) in [("k", self.k), ("v", self.v)] {
            if !(x.is_finite() && x > 0.0) {
                return Err(KernelError::Unsupported(format!(
                    "KV-cache {name} scale {x} (scales must be positive and finite)"
                )));
            }
        }
        Ok(self)
    }
}

impl Default for KvScales {
    fn default() -> Self {
        KvScales::ONE
    }
}

/// An attention or K/V store launch's geometry with its layer's KV-cache scales. A bare
/// [`AttnShape`] converts with [`KvScales::ONE`].
#[derive(Debug, Clone, Copy)]
pub struct LayerAttn {
    pub shape: AttnShape,
    pub scales: KvScales,
}

impl From<AttnShape> for LayerAttn {
    fn from(shape: AttnShape) -> Self {
        shape.with_scales(KvScales::ONE)
    }
}

impl LayerAttn {
    /// The geometry, the scales applied on its pool, and `log2(e) / sqrt(head_dim)` times the K
    /// scale: the softmax scale in the log2 domain over the keys as stored.
    fn resolve(self) -> Result<(AttnShape, KvScales, f32)> {
        let scales = self.scales.for_pool(self.shape.kv)?;
        let scale_log2 = std::f32::consts::LOG2_E / (self.shape.head_dim as f32).sqrt() * scales.k;
        Ok((self.shape, scales, scale_log2))
    }
}

type DecodeSet = [[[CudaFunction; 4]; 2]; 3];

pub struct Kernels {
    module: Arc<CudaModule>,
    embedding: CudaFunction,
    add_rmsnorm: CudaFunction,
    /// [KV pool type]
    rope_kv_store: [CudaFunction; 3],
    /// The same with an FP8 GEMM's scales applied to the qkv product first.
    rope_kv_store_rescale: [CudaFunction; 3],
    silu_mul: CudaFunction,
    gather_rows: CudaFunction,
    /// [KV pool type] x [head_dim 64, 128] x [group 1, 2, 4, 8]
    decode: DecodeSet,
    /// The same, merging the splits in the launch.
    decode_merged: DecodeSet,
    /// The same, with RoPE and the K/V store of a decode pass.
    decode_rope: DecodeSet,
    /// `decode_attn_tc_*`: one block per (sequence, KV head) on tensor cores
    decode_tc: DecodeSet,
    merge: CudaFunction,
    /// [KV pool type] x [head_dim 64, 128]
    prefill: [[CudaFunction; 2]; 3],
    /// Paired heads (`_h2`) for the FP8 pools: [e4m3, e5m2] x [head_dim 64, 128]
    prefill_h2: [[CudaFunction; 2]; 2],
    sample: CudaFunction,
    /// [16 rows per block, 32 rows per block]
    gemv: [CudaFunction; 2],
    /// The same with RMSNorm fused into the input.
    gemv_rms: [CudaFunction; 2],
    /// The same two pairs for FP8 weights.
    gemv_fp8: [CudaFunction; 2],
    gemv_rms_fp8: [CudaFunction; 2],
    quantize_fp8: CudaFunction,
    dequantize_fp8: CudaFunction,
    fp8_rescale: CudaFunction,
    add_rmsnorm_quant_fp8: CudaFunction,
    silu_mul_quant_fp8: CudaFunction,
    logit_edits: CudaFunction,
    copy_tokens: CudaFunction,
    allreduce: CudaFunction,
    allreduce_ll: CudaFunction,
    allreduce_pull: CudaFunction,
    num_sms: u32,
    /// Prefill attention blocks a multiprocessor holds at once (the fewest of the pool types).
    prefill_blocks_per_sm: u32,
    /// The same for the paired-head entries.
    prefill_h2_blocks_per_sm: u32,
    /// The device supports programmatic dependent launch (sm_90 and newer).
    pdl_supported: bool,
    /// Launches use programmatic dependent launch.
    pdl: bool,
    /// See [`Kernels::set_pdl_early_trigger`].
    pdl_early_trigger: bool,
    /// See [`Kernels::set_gemv_prefetch`].
    gemv_prefetch: u32,
}

/// Most ranks of a one-shot all-reduce group.
pub const AR_MAX_RANKS: usize = 8;
/// Blocks of a one-shot all-reduce launch for decode-sized messages (each owns a fixed share
/// of the elements).
pub const AR_BLOCKS: usize = 16;
/// Blocks of a one-shot all-reduce launch for prefill-sized messages (megabytes: enough
/// multiprocessors to fill the link).
pub const AR_LARGE_BLOCKS: usize = 128;

/// The device addresses of every rank's all-reduce receive buffer and flags (the kernel's
/// `ArPeers` argument), and how many ranks there are.
#[derive(Debug, Clone, Copy)]
pub struct ArPeers {
    table: ArTable,
    ranks: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ArTable {
    recv: [u64; AR_MAX_RANKS],
    flags: [u64; AR_MAX_RANKS],
}

// SAFETY: plain integers laid out as the kernel's struct (16 x unsigned long long).
unsafe impl DeviceRepr for ArTable {}

impl ArPeers {
    /// `recv[r]` and `flags[r]` are rank r's buffers (as device addresses valid on every
    /// rank's device: one process, unified addressing, peer access on).
    pub fn new(recv: &[u64], flags: &[u64]) -> Option<Self> {
        let ranks = recv.len();
        if ranks == 0 || ranks > AR_MAX_RANKS || flags.len() != ranks {
            return None;
        }
        let mut table = ArTable {
            recv: [0; AR_MAX_RANKS],
            flags: [0; AR_MAX_RANKS],
        };
        table.recv[..ranks].copy_from_slice(recv);
        table.flags[..ranks].copy_from_slice(flags);
        Some(ArPeers { table, ranks })
    }
}

/// A kernel argument as the driver takes it: the address of a value of the parameter's type.
fn arg<T: DeviceRepr>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

fn dim_index(head_dim: usize) -> Result<usize> {
    match head_dim {
        64 => Ok(0),
        128 => Ok(1),
        d => Err(KernelError::Unsupported(format!(
            "head_dim {d} (attention supports 64, 128)"
        ))),
    }
}

fn group_index(group: usize) -> Result<usize> {
    match group {
        1 => Ok(0),
        2 => Ok(1),
        4 => Ok(2),
        8 => Ok(3),
        g => Err(KernelError::Unsupported(format!(
            "GQA group {g} (supported: 1, 2, 4, 8)"
        ))),
    }
}

impl Kernels {
    /// Compile (or take from the cache) and load every kernel for `ctx`'s device.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        if major < 8 {
            return Err(KernelError::Unsupported(format!(
                "compute capability {major}.{minor}: the kernels need 8.0 or newer (bf16 tensor cores)"
            )));
        }
        let ptx = cached_ptx(&format!("compute_{major}{minor}"))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))?;
        let f = |name: &str| -> Result<CudaFunction> {
            debug_assert!(KERNEL_NAMES.contains(&name));
            Ok(module.load_function(name)?)
        };
        let decode_set = |prefix: &str| -> Result<DecodeSet> {
            let set = |d: usize, kv: &str| -> Result<[CudaFunction; 4]> {
                Ok([
                    f(&format!("{prefix}_d{d}_g1{kv}"))?,
                    f(&format!("{prefix}_d{d}_g2{kv}"))?,
                    f(&format!("{prefix}_d{d}_g4{kv}"))?,
                    f(&format!("{prefix}_d{d}_g8{kv}"))?,
                ])
            };
            let [a, b, c] = KvDtype::ALL.map(|k| k.suffix());
            Ok([
                [set(64, a)?, set(128, a)?],
                [set(64, b)?, set(128, b)?],
                [set(64, c)?, set(128, c)?],
            ])
        };
        let [pa, pb, pc] = KvDtype::ALL.map(|k| k.suffix());
        let prefill_pair = |kv: &str| -> Result<[CudaFunction; 2]> {
            Ok([
                f(&format!("prefill_attn_d64{kv}"))?,
                f(&format!("prefill_attn_d128{kv}"))?,
            ])
        };
        let num_sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let pdl_supported = major >= 9;
        let pdl = pdl_supported && std::env::var("SGL_DISABLE_PDL").as_deref() != Ok("1");
        let gemv_prefetch = std::env::var("SGL_GEMV_PREFETCH")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(GEMV_PREFETCH_STEPS);
        let mut k = Kernels {
            module: module.clone(),
            embedding: f("embedding_gather_bf16")?,
            add_rmsnorm: f("add_rmsnorm_bf16")?,
            // in KvDtype::ALL's order
            rope_kv_store: [
                f("rope_kv_store_bf16")?,
                f("rope_kv_store_e4m3")?,
                f("rope_kv_store_e5m2")?,
            ],
            rope_kv_store_rescale: [
                f("rope_kv_store_rescale_bf16")?,
                f("rope_kv_store_rescale_e4m3")?,
                f("rope_kv_store_rescale_e5m2")?,
            ],
            silu_mul: f("silu_mul_bf16")?,
            gather_rows: f("gather_rows_bf16")?,
            decode: decode_set("decode_attn")?,
            decode_merged: decode_set("decode_attn_merged")?,
            decode_rope: decode_set("decode_attn_rope")?,
            decode_tc: decode_set("decode_attn_tc")?,
            merge: f("attn_merge_splits")?,
            prefill: [prefill_pair(pa)?, prefill_pair(pb)?, prefill_pair(pc)?],
            prefill_h2: [
                prefill_pair(&format!("{pb}_h2"))?,
                prefill_pair(&format!("{pc}_h2"))?,
            ],
            sample: f("sample_bf16")?,
            gemv: [f("gemv_bf16_r16")?, f("gemv_bf16_r32")?],
            gemv_rms: [f("gemv_rms_bf16_r16")?, f("gemv_rms_bf16_r32")?],
            gemv_fp8: [f("gemv_fp8_r16")?, f("gemv_fp8_r32")?],
            gemv_rms_fp8: [f("gemv_rms_fp8_r16")?, f("gemv_rms_fp8_r32")?],
            quantize_fp8: f("quantize_rows_fp8")?,
            dequantize_fp8: f("dequantize_rows_fp8")?,
            fp8_rescale: f("fp8_rescale_bf16")?,
            add_rmsnorm_quant_fp8: f("add_rmsnorm_quant_fp8")?,
            silu_mul_quant_fp8: f("silu_mul_quant_fp8")?,
            logit_edits: f("logit_edits_bf16")?,
            copy_tokens: f("copy_tokens_i32")?,
            allreduce: f("allreduce_oneshot_bf16")?,
            allreduce_ll: f("allreduce_ll_bf16")?,
            allreduce_pull: f("allreduce_pull_add_rmsnorm")?,
            num_sms,
            prefill_blocks_per_sm: 1,
            prefill_h2_blocks_per_sm: 1,
            pdl_supported,
            pdl,
            pdl_early_trigger: false,
            gemv_prefetch,
        };
        // the fewest blocks of `threads` any of these entries keeps on a multiprocessor
        let fewest = |fs: &[CudaFunction], threads: u32| -> Result<u32> {
            fs.iter().try_fold(u32::MAX, |m, f| {
                let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?;
                Ok(m.min(per_sm.max(1)))
            })
        };
        k.prefill_blocks_per_sm = fewest(k.prefill.as_flattened(), 128)?;
        k.prefill_h2_blocks_per_sm = fewest(k.prefill_h2.as_flattened(), 256)?;
        if std::env::var("SGL_PDL_EARLY_TRIGGER").as_deref() == Ok("1") {
            k.set_pdl_early_trigger(true, &ctx.default_stream())?;
        }
        Ok(k)
    }

    pub fn num_sms(&self) -> u32 {
        self.num_sms
    }

    /// Prefill attention blocks the device runs at once: the `slots` of
    /// [`prefill_work`](crate::prefill_work).
    pub fn prefill_slots(&self) -> usize {
        self.num_sms as usize * self.prefill_blocks_per_sm as usize
    }

    /// The same for the paired-head form ([`PrefillForm::Paired`]), each block
    /// taking two heads.
    pub fn prefill_paired_slots(&self) -> usize {
        self.num_sms as usize * self.prefill_h2_blocks_per_sm as usize
    }

    /// Whether launches use programmatic dependent launch (on by default on sm_90 and newer,
    /// off with `SGL_DISABLE_PDL=1`).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Turn programmatic dependent launch on or off for later launches (and graph captures);
    /// stays off on devices older than sm_90.
    pub fn set_pdl(&mut self, on: bool) {
        self.pdl = on && self.pdl_supported;
    }

    /// Where kernels let the next kernel launch under PDL: by default once each block's work
    /// is done (a dependent launched earlier parks resident blocks that take slots from this
    /// kernel's own blocks or neighbours); `true` (or `SGL_PDL_EARLY_TRIGGER=1` at load) right
    /// after each kernel's wait, as early as allowed. Results do not depend on it. Writes a
    /// module variable through `s` and synchronizes it: call it with no kernel of this module
    /// in flight. The GEMV always lets its dependents launch after its weight stream.
    pub fn set_pdl_early_trigger(&mut self, on: bool, s: &Arc<CudaStream>) -> Result<()> {
        if !self.pdl_supported {
            // no trigger in the kernels before sm_90
            self.pdl_early_trigger = on;
            return Ok(());
        }
        let mut global = self.module.get_global("sgl_pdl_early_trigger", s)?;
        // SAFETY: the variable is one `int` (4 bytes, checked by transmute_mut's length).
        let mut flag = unsafe { global.transmute_mut::<i32>(1) }.ok_or_else(|| {
            KernelError::Unsupported("sgl_pdl_early_trigger is not an int".into())
        })?;
        s.memcpy_htod(&[i32::from(on)], &mut flag)?;
        s.synchronize()?;
        self.pdl_early_trigger = on;
        Ok(())
    }

    pub fn pdl_early_trigger(&self) -> bool {
        self.pdl_early_trigger
    }

    /// Weight steps (beyond the first, which goes to registers) each GEMV warp prefetches into
    /// L2 before it waits for the kernel before it: [`GEMV_PREFETCH_STEPS`] by default, or
    /// `SGL_GEMV_PREFETCH`. A warp's step is 4 KiB of weights; large values prefetch a warp's
    /// whole slice. Results do not depend on it.
    pub fn set_gemv_prefetch(&mut self, steps: u32) {
        self.gemv_prefetch = steps;
    }

    pub fn gemv_prefetch(&self) -> u32 {
        self.gemv_prefetch
    }

    /// Launch `f` on `s` with `grid` blocks of `block` threads. With PDL, through
    /// `cuLaunchKernelEx` with programmatic stream serialization allowed; else `cuLaunchKernel`.
    ///
    /// # Safety
    /// `args` holds one pointer per parameter of `f`, in order, each to a live value of that
    /// parameter's type; the kernel's memory accesses are the caller's to make valid.
    unsafe fn launch(
        &self,
        s: &CudaStream,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        s.context().bind_to_thread()?;
        if self.pdl {
            let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: s.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: config and attr are live locals describing one launch on a stream of
            // this context; the caller guarantees args.
            unsafe {
                sys::cuLaunchKernelEx(
                    &config,
                    f.cu_function(),
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()?;
        } else {
            // SAFETY: as above.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f.cu_function(),
                    grid,
                    (block, 1, 1),
                    0,
                    s.cu_stream(),
                    args,
                )
            }?;
        }
        Ok(())
    }
}
