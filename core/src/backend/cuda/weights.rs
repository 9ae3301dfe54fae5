//! Llama-family weights onto the GPU, in bf16. q/k/v are fused into one
//! `[q + k + v, hidden]` matrix and gate/up into one `[2 * intermediate, hidden]` matrix, so a
//! layer runs four GEMMs.
//!
//! With `--quantization fp8` those four matrices are quantized on the GPU as they arrive: each
//! output row becomes e4m3 values with one f32 scale (`max |row| / 448`), so a decode step
//! reads half the bytes. An FP8 checkpoint (`model::quant`) brings its e4m3 rows and scales,
//! uploaded as stored. Embedding, norms and the LM head stay bf16, as SGLang keeps them.
//!
//! Each layer also gets its KV-cache scales: the checkpoint's (`LlamaTensors::kv_scales`, the
//! same on every rank), else 1. Attention applies them to an FP8 KV cache only.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use half::{bf16, f16};
use sgl_kernels::{Dptr, Gemm, Kernels, KvScales, WeightRef, dptr};

use crate::backend::BackendError;
use crate::model::llama::{LlamaTensors, Part};
use crate::model::{DType, Quantization, Shard, Tensor};

/// The weight of one linear layer, `[out, in]`.
pub(crate) enum Linear {
    Bf16(CudaSlice<bf16>),
    /// e4m3 rows and one scale per row.
    Fp8 {
        w: CudaSlice<u8>,
        scale: CudaSlice<f32>,
    },
}

impl Linear {
    pub fn weight(&self, s: &CudaStream) -> WeightRef {
        match self {
            Linear::Bf16(w) => WeightRef::Bf16(dptr(w, s)),
            Linear::Fp8 { w, scale } => WeightRef::Fp8 {
                w: dptr(w, s),
                scale: dptr(scale, s),
            },
        }
    }
}

pub(crate) struct Layer {
    pub input_norm: CudaSlice<bf16>,
    pub qkv: Linear,
    pub o: Linear,
    pub post_norm: CudaSlice<bf16>,
    pub gate_up: Linear,
    pub down: Linear,
    /// The layer's FP8 KV-cache scales (1 where the checkpoint brings none).
    pub kv_scales: KvScales,
}

pub(crate) struct Weights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<Layer>,
    pub norm: CudaSlice<bf16>,
    /// This rank's rows of the LM head (all of them unless vocabulary-parallel); None when
    /// tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
    /// Vocabulary-parallel LM head (tensor parallelism, a vocabulary that splits evenly): each
    /// of `vocab_parts` ranks computes the logits of its `vocab / vocab_parts` tokens, rank
    /// `vocab_rank`'s starting at token `vocab_rank * vocab / vocab_parts`. 1 part otherwise.
    pub vocab_parts: usize,
    pub vocab_rank: usize,
    /// Where this rank's LM-head rows start in the embedding when the two are tied (elements).
    tied_offset: usize,
    pub bytes: usize,
}

impl Weights {
    /// This rank's rows of the LM head.
    pub fn lm_head_ptr(&self, s: &CudaStream) -> Dptr<bf16> {
        match &self.lm_head {
            Some(w) => dptr(w, s),
            None => dptr(&self.embed, s).add(self.tied_offset),
        }
    }

    /// Whether the layers' linear weights are FP8.
    pub fn fp8(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| matches!(l.qkv, Linear::Fp8 { .. }))
    }
}

/// Refuses FP8 weights where cuBLASLt cannot run their prefill GEMMs (FP8 needs sm_89 or
/// newer), before any request finds out.
pub(super) fn check_fp8_gemm(
    gemm: &Gemm,
    cfg: &crate::model::config::ModelConfig,
) -> Result<(), BackendError> {
    let h = cfg.hidden_size;
    gemm.supports_fp8(16, h, h).map_err(|e| {
        BackendError::Unsupported(format!(
            "--quantization fp8 needs FP8 GEMMs (cuBLASLt on an sm_89 or newer GPU): {e}"
        ))
    })
}

/// Bytes of one pinned staging buffer.
const CHUNK_BYTES: usize = 64 << 20;
/// Staging buffers: the host fills one while the copy engine drains the others.
const STAGING_BUFFERS: usize = 3;
/// Host threads that fill a staging buffer (reading the memory-mapped file in parallel is what
/// makes the page cache deliver more than one core's copy bandwidth).
const FILL_THREADS: usize = 8;

/// Uploads weights to the device through pinned staging memory: each tensor's bf16 values are
/// written into a page-locked buffer by several threads (copied out of the memory-mapped
/// checkpoint, or converted from f16/f32) and copied to the device asynchronously, so reading
/// the file overlaps the transfers and no intermediate vector is built.
/// `SGL_LOAD_PAGEABLE=1` takes the plain path instead (a vector per tensor, a synchronous copy
/// from pageable memory), for comparison.
struct Uploader {
    stream: Arc<CudaStream>,
    bufs: Vec<(PinnedHostSlice<u8>, usize, Option<CudaEvent>)>,
    next: usize,
    pageable: bool,
}

impl Uploader {
    fn new(stream: &Arc<CudaStream>) -> Result<Self, BackendError> {
        let pageable = std::env::var("SGL_LOAD_PAGEABLE").as_deref() == Ok("1");
        let mut bufs = Vec::new();
        if !pageable {
            let ctx = stream.context();
            for _ in 0..STAGING_BUFFERS {
                // SAFETY: a plain page-locked allocation, written by the host only after the
                // copy that last read it has finished (its event, see `fill_and_send`).
                let mut b = unsafe { ctx.alloc_pinned_with_flags::<u8>(CHUNK_BYTES, 0) }?;
                let addr = b.as_mut_ptr()? as usize;
                bufs.push((b, addr, None));
            }
        }
        Ok(Uploader {
            stream: stream.clone(),
            bufs,
            next: 0,
            pageable,
        })
    }

    /// One device allocation holding `parts` one after the other, as bf16.
    fn upload(&mut self, parts: &[Tensor<'_>]) -> Result<CudaSlice<bf16>, BackendError> {
        let n: usize = parts.iter().map(elements).sum();
        if self.pageable {
            let mut d = self.stream.alloc_zeros::<bf16>(n)?;
            let mut off = 0;
            for t in parts {
                let host = t.to_bf16()?;
                let mut view = d.slice_mut(off..off + host.len());
                self.stream.memcpy_htod(&host, &mut view)?;
                off += host.len();
            }
            return Ok(d);
        }
        for t in parts {
            if !matches!(t.dtype, DType::BF16 | DType::F16 | DType::F32) {
                return Err(crate::model::LoadError::Dtype {
                    name: t.name.clone(),
                    dtype: t.dtype.to_string(),
                }
                .into());
            }
        }
        // SAFETY: every element is written by the copies below before any kernel reads it.
        let d = unsafe { self.stream.alloc::<bf16>(n) }?;
        let base = dptr(&d, &self.stream).addr();
        let mut at = 0usize;
        for t in parts {
            let count = elements(t);
            let per_chunk = CHUNK_BYTES / 2;
            let mut first = 0;
            while first < count {
                let len = per_chunk.min(count - first);
                self.fill_and_send(t, first, len, base + 2 * (at + first) as u64)?;
                first += len;
            }
            at += count;
        }
        Ok(d)
    }

    /// Writes elements `first..first + len` of `t` as bf16 into the next staging buffer and
    /// queues its copy to `dst`.
    fn fill_and_send(
        &mut self,
        t: &Tensor<'_>,
        first: usize,
        len: usize,
        dst: u64,
    ) -> Result<(), BackendError> {
        self.stage(2 * len, dst, |out: &mut [u8], at: usize| {
            // SAFETY: staging buffers are page-aligned and `at` is even, so the bytes are
            // 2-aligned; bf16 has no invalid bit patterns.
            let out = unsafe {
                std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<bf16>(), out.len() / 2)
            };
            convert_into(t, first + at / 2, out);
        })
    }

    /// One device allocation holding the bytes of `parts` one after the other, as stored
    /// (the e4m3 weights of an FP8 checkpoint).
    fn upload_raw(&mut self, parts: &[Tensor<'_>]) -> Result<CudaSlice<u8>, BackendError> {
        let n: usize = parts.iter().map(|t| t.bytes.len()).sum();
        if self.pageable {
            let mut d = self.stream.alloc_zeros::<u8>(n)?;
            let mut off = 0;
            for t in parts {
                let mut view = d.slice_mut(off..off + t.bytes.len());
                self.stream.memcpy_htod(&t.bytes[..], &mut view)?;
                off += t.bytes.len();
            }
            return Ok(d);
        }
        // SAFETY: every byte is written by the copies below before any kernel reads it.
        let d = unsafe { self.stream.alloc::<u8>(n) }?;
        let base = dptr(&d, &self.stream).addr();
        let mut at = 0usize;
        for t in parts {
            for (i, chunk) in t.bytes.chunks(CHUNK_BYTES).enumerate() {
                let dst = base + (at + i * CHUNK_BYTES) as u64;
                self.stage(chunk.len(), dst, |out: &mut [u8], from: usize| {
                    out.copy_from_slice(&chunk[from..from + out.len()]);
                })?;
            }
            at += t.bytes.len();
        }
        Ok(d)
    }

    /// Fills `len` bytes of the next staging buffer with `fill(piece, offset)` on several
    /// threads (each gets a piece and its byte offset, a multiple of 2) and queues their copy
    /// to `dst`.
    fn stage(
        &mut self,
        len: usize,
        dst: u64,
        fill: impl Fn(&mut [u8], usize) + Sync,
    ) -> Result<(), BackendError> {
        let slot = self.next;
        self.next = (self.next + 1) % self.bufs.len();
        let (_, addr, event) = &mut self.bufs[slot];
        if let Some(e) = event.take() {
            e.synchronize()?;
        }
        // SAFETY: the buffer holds CHUNK_BYTES >= len bytes, and no queued copy reads it (its
        // last copy's event completed above).
        let out = unsafe { std::slice::from_raw_parts_mut(*addr as *mut u8, len) };
        let threads = FILL_THREADS.min(len.div_ceil(2 << 20)).max(1);
        let piece = len.div_ceil(threads).next_multiple_of(2);
        let fill = &fill;
        std::thread::scope(|scope| {
            for (i, dst) in out.chunks_mut(piece.max(2)).enumerate() {
                scope.spawn(move || fill(dst, i * piece));
            }
        });
        // SAFETY: `dst` lies inside the allocation sized for every part; the staged bytes stay
        // untouched until the event recorded after the copy completes.
        unsafe {
            cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                dst,
                *addr as *const std::ffi::c_void,
                len,
                self.stream.cu_stream(),
            )
        }
        .result()?;
        *event = Some(self.stream.record_event(None)?);
        Ok(())
    }

    /// Waits for the last copies, so the staging buffers can be freed.
    fn finish(self) -> Result<(), BackendError> {
        self.stream.synchronize()?;
        Ok(())
    }
}

fn elements(t: &Tensor<'_>) -> usize {
    t.shape.iter().product()
}

/// Elements `from..from + out.len()` of `t` (bf16, f16 or f32) as bf16.
fn convert_into(t: &Tensor<'_>, from: usize, out: &mut [bf16]) {
    let b = &t.bytes;
    match t.dtype {
        DType::BF16 => {
            let src = &b[2 * from..2 * (from + out.len())];
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]);
            }
        }
        DType::F16 => {
            let src = &b[2 * from..2 * (from + out.len())];
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = bf16::from_f32(f16::from_le_bytes([c[0], c[1]]).to_f32());
            }
        }
        DType::F32 => {
            let src = &b[4 * from..4 * (from + out.len())];
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
        }
        DType::F8E4M3 | DType::Ggml(_) => {}
    }
}

pub(super) fn load(
    src: &LlamaTensors<'_>,
    quant: Quantization,
    s: &Arc<CudaStream>,
    kernels: &Kernels,
) -> Result<Weights, BackendError> {
    let cfg = src.config();
    let mut uploader = Uploader::new(s)?;
    let bytes = std::cell::Cell::new(0usize);
    // Norms, embedding and LM head: bf16, converted from f16/f32 where stored so.
    let up = |u: &mut Uploader, parts: &[Tensor<'_>]| -> Result<CudaSlice<bf16>, BackendError> {
        bytes.set(bytes.get() + parts.iter().map(|p| elements(p) * 2).sum::<usize>());
        u.upload(parts)
    };
    // Linear layers: FP8 as an FP8 checkpoint stores them (e4m3 rows and their scales), or
    // bf16, or bf16 quantized to FP8 on the GPU right after their upload.
    let lin = |u: &mut Uploader, l: usize, names: &[Part]| -> Result<Linear, BackendError> {
        let parts = names
            .iter()
            .map(|&p| src.layer(l, p))
            .collect::<Result<Vec<_>, _>>()?;
        let stored_fp8 = parts.iter().filter(|t| t.dtype == DType::F8E4M3).count();
        let first = parts.first().map(|p| p.name.as_str()).unwrap_or("?");
        if stored_fp8 > 0 && stored_fp8 < parts.len() {
            return Err(BackendError::Unsupported(format!(
                "{first}: the checkpoint stores some of the matrices fused with it in FP8 and some not"
            )));
        }
        if stored_fp8 > 0 {
            let mut scales = Vec::new();
            for (&p, t) in names.iter().zip(&parts) {
                scales.extend(src.fp8_scales(l, p, t.matrix_dims()?.0)?);
            }
            let w = u.upload_raw(&parts)?;
            let scale = s.clone_htod(&scales)?;
            bytes.set(bytes.get() + w.len() + 4 * scales.len());
            return Ok(Linear::Fp8 { w, scale });
        }
        match quant {
            Quantization::AsStored => Ok(Linear::Bf16(up(u, &parts)?)),
            Quantization::Fp8 => {
                let k = parts
                    .first()
                    .map(|p| p.shape.last().copied().unwrap_or(0))
                    .unwrap_or(0);
                let n: usize = parts.iter().map(elements).sum();
                if k == 0 || !n.is_multiple_of(k) || !k.is_multiple_of(16) {
                    return Err(BackendError::Unsupported(format!(
                        "FP8 weights need rows of a multiple of 16 values ({first} has {k})"
                    )));
                }
                let rows = n / k;
                let staged = u.upload(&parts)?;
                // SAFETY: every element is written by the quantization below before any read.
                let w = unsafe { s.alloc::<u8>(n) }?;
                // SAFETY: as above.
                let scale = unsafe { s.alloc::<f32>(rows) }?;
                // SAFETY: staged: rows x k bf16; w: rows x k bytes; scale: rows (allocated
                // above on this stream).
                unsafe {
                    kernels.quantize_rows_fp8(
                        s,
                        dptr(&w, s),
                        dptr(&scale, s),
                        dptr(&staged, s),
                        rows,
                        k,
                    )
                }
                .map_err(BackendError::from)?;
                // `staged` is freed on the stream after the kernel that reads it
                drop(staged);
                bytes.set(bytes.get() + n + 4 * rows);
                Ok(Linear::Fp8 { w, scale })
            }
        }
    };
    let u = &mut uploader;
    let embed = up(u, &[src.embed()?])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    let mut kv_scales_from_checkpoint = false;
    for l in 0..cfg.num_layers {
        if src.has(l, Part::QBias) {
            return Err(BackendError::Unsupported(
                "q/k/v projection biases (Qwen2-style) are not supported by the CUDA backend yet"
                    .into(),
            ));
        }
        let part = |p: Part| src.layer(l, p);
        let qkv = lin(u, l, &[Part::Q, Part::K, Part::V])?;
        let o = lin(u, l, &[Part::O])?;
        let gate_up = lin(u, l, &[Part::Gate, Part::Up])?;
        let down = lin(u, l, &[Part::Down])?;
        let input_norm = up(u, &[part(Part::AttnNorm)?])?;
        let post_norm = up(u, &[part(Part::FfnNorm)?])?;
        let kv_scales = match src.kv_scales(l)? {
            Some(k) => {
                kv_scales_from_checkpoint = true;
                KvScales { k: k.k, v: k.v }
            }
            None => KvScales::ONE,
        };
        layers.push(Layer {
            input_norm,
            qkv,
            o,
            post_norm,
            gate_up,
            down,
            kv_scales,
        });
    }
    // every rank reads the same scales: rank 0 says which
    if kv_scales_from_checkpoint && src.tp().rank == 0 {
        let (k, v): (Vec<f32>, Vec<f32>) = layers
            .iter()
            .map(|l| (l.kv_scales.k, l.kv_scales.v))
            .unzip();
        let range = |x: &[f32]| {
            let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = x.iter().copied().fold(0.0f32, f32::max);
            format!("{lo:.3e}..{hi:.3e}")
        };
        tracing::info!(
            "KV-cache scales from the checkpoint: K {}, V {} (applied with an FP8 KV cache)",
            range(&k),
            range(&v)
        );
    }
    let norm = up(u, &[src.final_norm()?])?;
    // The LM head splits by vocabulary rows across the ranks when they divide it
    // (`SGL_DISABLE_VOCAB_PARALLEL=1`: every rank holds it whole, rank 0 computes every logit).
    let tp = src.tp();
    let vocab_parts = if tp.size > 1
        && cfg.vocab_size.is_multiple_of(tp.size)
        && std::env::var("SGL_DISABLE_VOCAB_PARALLEL").as_deref() != Ok("1")
    {
        tp.size
    } else {
        1
    };
    let vocab_rank = if vocab_parts > 1 { tp.rank } else { 0 };
    let lm_head = if src.has_lm_head() && !cfg.tie_word_embeddings {
        let shard = match vocab_parts {
            1 => Shard::Whole,
            parts => Shard::Rows {
                rank: vocab_rank,
                parts,
            },
        };
        Some(up(u, &[src.lm_head()?.shard(shard)?])?)
    } else {
        None
    };
    let tied_offset = vocab_rank * (cfg.vocab_size / vocab_parts) * cfg.hidden_size;
    uploader.finish()?;
    Ok(Weights {
        embed,
        layers,
        norm,
        lm_head,
        vocab_parts,
        vocab_rank,
        tied_offset,
        bytes: bytes.get(),
    })
}
