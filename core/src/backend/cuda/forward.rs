//! The forward pass: scratch buffers, input upload, the layer loop, CUDA graphs for decode,
//! and getting logits or sampled tokens out.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::{CudaSlice, CudaStream, result as dres};
use half::bf16;
use sgl_kernels::{
    AttnShape, DecodeAttnPlan, Dptr, GemvEpilogue, KvDtype, PREFILL_ENTRY_INTS, PrefillForm,
    PrefillPartials, PrefillSeq, dptr,
};

use super::{CudaBackend, DECODE_SPLITS, DETERMINISTIC_DECODE_SPLITS, cuda_err, decode_form};
use crate::backend::SeqInput;
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;

// The norms between the GEMMs, with a pending all-reduce folded in under tensor parallelism.
mod add_norm;
// The FP8 path's helpers: quantized rows, fused norms, GEMMs left unscaled.
mod fp8;
// CUDA graphs for decode.
mod graphs;
// The final norm, the LM head, and the logits to the host or sampled.
mod head;
// A layer's GEMMs and GEMVs, and the all-reduce.
mod linear;
// Which form and work list a pass's attention takes.
mod attn_plan;
// Prefill's last layer on the rows that need logits only.
mod tail;

pub(super) use add_norm::{Area, NormTo, Pending};
pub(super) use graphs::Graphs;
use tail::{Tail, TailPlan};

/// Rows of logits computed per LM-head GEMM.
const LOGIT_ROWS: usize = 256;

/// Activation buffers for up to `tokens` tokens in one pass.
pub(super) struct Scratch {
    pub tokens: usize,
    x: CudaSlice<bf16>,
    normed: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    delta: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    sel_x: CudaSlice<bf16>,
    sel_d: CudaSlice<bf16>,
    sel_n: CudaSlice<bf16>,
    pub logits: CudaSlice<bf16>,
    /// Vocabulary-parallel LM head: this rank's columns of the logits, before they are
    /// placed in `logits` and summed across the ranks.
    logits_part: CudaSlice<bf16>,
    partial_o: CudaSlice<f32>,
    partial_ml: CudaSlice<f32>,
    /// Arrival counters of the one-launch decode attention (sequence x KV head; left at 0).
    attn_counters: CudaSlice<u32>,
    /// partial rows (batch x splits) the buffers hold, per head
    partial_rows: usize,
    meta: CudaSlice<i32>,
    sampled: CudaSlice<i32>,
    params: CudaSlice<f32>,
    /// FP8 weights: a GEMM's input rows quantized per token (e4m3) and their scales.
    xq: CudaSlice<u8>,
    xs: CudaSlice<f32>,
    /// FP8 GEMMs that add into their output: the product before it is scaled and added.
    fp8_d: CudaSlice<bf16>,
}

fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    s: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>> {
    s.alloc_zeros::<T>(n.max(1)).map_err(cuda_err)
}

impl Scratch {
    /// `fp8`: room for the FP8 GEMMs' quantized inputs too. `vocab_parts`: the ranks the LM
    /// head's vocabulary is split across (1: not split).
    pub fn new(
        s: &Arc<CudaStream>,
        cfg: &ModelConfig,
        tokens: usize,
        fp8: bool,
        vocab_parts: usize,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
        let i = cfg.intermediate_size;
        let widest_in = h.max(i).max(cfg.num_heads * cfg.head_dim);
        let fp8_rows = if fp8 { tokens } else { 0 };
        let partial_rows = tokens + 2 * DECODE_SPLITS * 64;
        Ok(Scratch {
            tokens,
            x: zeros(s, tokens * h)?,
            normed: zeros(s, tokens * h)?,
            qkv: zeros(s, tokens * qkv)?,
            attn: zeros(s, tokens * cfg.num_heads * cfg.head_dim)?,
            delta: zeros(s, tokens * h)?,
            gate_up: zeros(s, tokens * 2 * i)?,
            act: zeros(s, tokens * i)?,
            sel_x: zeros(s, LOGIT_ROWS * h)?,
            sel_d: zeros(s, LOGIT_ROWS * h)?,
            sel_n: zeros(s, LOGIT_ROWS * h)?,
            logits: zeros(s, LOGIT_ROWS.max(tokens.min(1024)) * cfg.vocab_size)?,
            logits_part: zeros(
                s,
                if vocab_parts > 1 {
                    LOGIT_ROWS.max(tokens.min(1024)) * (cfg.vocab_size / vocab_parts)
                } else {
                    0
                },
            )?,
            partial_o: zeros(s, partial_rows * cfg.num_heads * cfg.head_dim)?,
            partial_ml: zeros(s, partial_rows * cfg.num_heads * 2)?,
            attn_counters: zeros(s, tokens * cfg.num_kv_heads)?,
            partial_rows,
            meta: zeros(s, 8 * tokens + 4096)?,
            sampled: zeros(s, LOGIT_ROWS.max(tokens.min(1024)))?,
            params: zeros(s, 5 * LOGIT_ROWS.max(tokens.min(1024)))?,
            xq: zeros(s, fp8_rows * widest_in)?,
            xs: zeros(s, fp8_rows)?,
            fp8_d: zeros(s, fp8_rows * h)?,
        })
    }

    fn logit_rows(&self) -> usize {
        self.sampled.len()
    }
}

/// Debug dump of per-layer hidden states (`SGL_CUDA_DUMP_DIR=DIR`): prefill pass `p` writes
/// `DIR/p{p:03}_l{layer:02}.bin`, the residual stream after that layer (bf16, tokens x hidden,
/// row-major), the tensor transformers returns as `hidden_states[layer + 1]`.
pub(super) struct Dump {
    dir: PathBuf,
    pass: AtomicUsize,
}

impl Dump {
    pub fn from_env() -> Option<Self> {
        let dir = PathBuf::from(std::env::var_os("SGL_CUDA_DUMP_DIR")?);
        std::fs::create_dir_all(&dir).ok()?;
        Some(Dump {
            dir,
            pass: AtomicUsize::new(0),
        })
    }
}

fn dtoh_bf16(s: &CudaStream, src: Dptr<bf16>, n: usize) -> Result<Vec<bf16>> {
    let mut buf = vec![bf16::ZERO; n];
    // SAFETY: src holds at least n elements; buf holds exactly n.
    unsafe { dres::memcpy_dtoh_async(&mut buf, src.addr(), s.cu_stream()) }.map_err(cuda_err)?;
    s.synchronize().map_err(cuda_err)?;
    Ok(buf)
}

/// Device addresses of one pass's inputs.
#[derive(Clone, Copy)]
struct Inputs {
    tokens: usize,
    ids: Dptr<u32>,
    positions: Dptr<i32>,
    slots: Dptr<i32>,
    attn: AttnInputs,
    /// A prefill pass whose last layer runs on the rows that need logits only.
    tail: Option<Tail>,
}

#[derive(Clone, Copy)]
enum AttnInputs {
    Decode {
        batch: usize,
        plan: DecodeAttnPlan,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
    },
    Prefill {
        tiles: Dptr<i32>,
        n_tiles: usize,
        /// The list is for the paired-head form (`PrefillForm::Paired`).
        paired: bool,
        q_indptr: Dptr<i32>,
        kv_indptr: Dptr<i32>,
        kv_indices: Dptr<i32>,
        prefix_lens: Dptr<i32>,
        /// Every sequence is a fresh prompt over an FP8 pool: attention reads K and V from the
        /// qkv rows (bf16, kept there by `rope_kv_store_with`) through these indices, token
        /// row r at r x (group + 2), instead of from the pool (see [`CudaBackend::kv_rows`]).
        rows: Option<Dptr<i32>>,
    },
}

impl CudaBackend {
    fn shape(&self) -> AttnShape {
        AttnShape {
            n_heads: self.cfg.num_heads,
            n_kv_heads: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
            kv: self.opts.kv,
        }
    }

    /// Layer `layer`'s K and V pools, as bytes (elements of `--kv-cache-dtype`).
    fn kv_layer(&self, layer: usize) -> (Dptr<u8>, Dptr<u8>) {
        let per =
            (self.capacity + 1) * self.cfg.num_kv_heads * self.cfg.head_dim * self.opts.kv.bytes();
        let base = dptr(&self.kv, &self.stream).add(layer * 2 * per);
        (base, base.add(per))
    }

    fn grow_scratch(&mut self, tokens: usize) -> Result<()> {
        if tokens > self.scratch.tokens {
            // Graphs hold the old addresses: drop them before the buffers go.
            self.graphs.clear();
            self.stream.synchronize().map_err(cuda_err)?;
            let t = tokens.next_multiple_of(1024);
            self.scratch =
                Scratch::new(&self.stream, &self.cfg, t, self.w.fp8(), self.w.vocab_parts)?;
        }
        Ok(())
    }

    /// Run the batch; logits of the rows that need them end in `scratch.logits` (bf16).
    /// Returns the buffer rows holding each sequence's last `num_logits` tokens, in order.
    pub(super) fn run(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<usize>> {
        // Tensor parallelism: every worker rank runs the same batch (see `tp`).
        self.peers.run(batch)?;
        let tokens: usize = batch.iter().map(|s| s.tokens.len()).sum();
        let decode = batch
            .iter()
            .all(|q| decode_form(q, self.opts.deterministic));
        if decode && let Some(bs) = self.graphs.bucket(batch.len()) {
            let kv_total: usize = batch.iter().map(|s| s.kv_slots.len()).sum();
            if kv_total + (bs - batch.len()) <= self.graphs.index_cap {
                return self.run_graph(batch, bs);
            }
        }
        let partials = if decode && self.opts.deterministic {
            // the fixed split count's partial rows (see `decode_splits`)
            batch.len() * DETERMINISTIC_DECODE_SPLITS as usize
        } else {
            0
        };
        self.grow_scratch(tokens.max(partials))?;
        self.run_eager(batch, tokens, decode)
    }

    /// `decode`: every sequence of `batch` runs in the decode form (see `run`).
    fn run_eager(
        &mut self,
        batch: &[SeqInput<'_>],
        tokens: usize,
        decode: bool,
    ) -> Result<Vec<usize>> {
        let s = self.stream.clone();
        let mut ids = Vec::with_capacity(tokens);
        let mut pos = Vec::with_capacity(tokens);
        let mut slots = Vec::with_capacity(tokens);
        let mut q_indptr = vec![0i32];
        let mut kv_indptr = vec![0i32];
        let mut prefix = Vec::with_capacity(batch.len());
        let mut kv_indices = Vec::new();
        let mut last_rows = Vec::new();
        let mut max_len = 0;
        for q in batch {
            for (i, &t) in q.tokens.iter().enumerate() {
                ids.push(t as i32);
                pos.push((q.start_pos + i) as i32);
                slots.push(q.kv_slots[q.start_pos + i] as i32);
            }
            let len = q.tokens.len();
            let first = ids.len() - q.num_logits.min(len);
            last_rows.extend((first..ids.len()).map(|r| r as i32));
            q_indptr.push(ids.len() as i32);
            kv_indices.extend(q.kv_slots.iter().map(|&x| x as i32));
            kv_indptr.push(kv_indices.len() as i32);
            prefix.push(q.start_pos as i32);
            max_len = max_len.max(q.kv_slots.len());
        }
        let seqs: Vec<PrefillSeq> = batch
            .iter()
            .map(|q| PrefillSeq {
                q_len: q.tokens.len(),
                prefix: q.start_pos,
            })
            .collect();
        let rows = !decode && self.kv_rows(batch);
        let (tiles, paired) = if decode {
            (Vec::new(), false)
        } else {
            self.prefill_plan(&seqs, if rows { KvDtype::Bf16 } else { self.opts.kv })
        };
        // the rows' K and V as pool slots of the qkv buffer (see AttnInputs::Prefill)
        let row_slots: Vec<i32> = if rows {
            let per = (self.cfg.num_heads / self.cfg.num_kv_heads.max(1) + 2) as i32;
            (0..tokens as i32).map(|r| r * per).collect()
        } else {
            Vec::new()
        };
        let tail = (!decode && self.logit_rows_only(tokens, last_rows.len()))
            .then(|| TailPlan::new(batch, |s| self.prefill_work(s)));
        let none = Vec::new();
        let tp = tail.as_ref();
        // one upload: [ids | pos | slots | q_indptr | kv_indptr | prefix | tiles | rows |
        // indices | the tail's q_indptr | prefix | tiles | rows | row slots]
        let mut meta: Vec<i32> = Vec::new();
        let mut offs = [0usize; 14];
        for (k, part) in [
            &ids,
            &pos,
            &slots,
            &q_indptr,
            &kv_indptr,
            &prefix,
            &tiles,
            &last_rows,
            &kv_indices,
            tp.map_or(&none, |t| &t.q_indptr),
            tp.map_or(&none, |t| &t.prefix),
            tp.map_or(&none, |t| &t.tiles),
            tp.map_or(&none, |t| &t.ident),
            &row_slots,
        ]
        .iter()
        .enumerate()
        {
            offs[k] = meta.len();
            meta.extend_from_slice(part);
            meta.resize(meta.len().next_multiple_of(4), 0);
        }
        if meta.len() > self.scratch.meta.len() {
            self.scratch.meta = zeros(&s, meta.len().next_multiple_of(1 << 16))?;
        }
        let m = dptr(&self.scratch.meta, &s);
        self.upload(m, &meta)?;
        let at = |k: usize| m.add(offs[k]);
        let first_token: Vec<usize> = q_indptr.iter().map(|&t| t as usize).collect();
        self.apply_prev(at(0), &first_token)?;
        let attn = if decode {
            let plan = self.decode_splits(batch.len(), max_len)?;
            AttnInputs::Decode {
                batch: batch.len(),
                plan,
                kv_indptr: at(4),
                kv_indices: at(8),
            }
        } else {
            AttnInputs::Prefill {
                tiles: at(6),
                n_tiles: tiles.len() / PREFILL_ENTRY_INTS,
                paired,
                q_indptr: at(3),
                kv_indptr: at(4),
                kv_indices: at(8),
                prefix_lens: at(5),
                rows: rows.then(|| at(13)),
            }
        };
        // SAFETY: ids are token ids < vocab (validated), stored as i32 bit patterns.
        let ids_ptr = unsafe { Dptr::<u32>::from_raw(at(0).addr()) };
        let tail = tail.map(|t| Tail {
            rows: at(7),
            ident: at(12),
            n: last_rows.len(),
            attn: AttnInputs::Prefill {
                tiles: at(11),
                n_tiles: t.tiles.len() / PREFILL_ENTRY_INTS,
                paired: false,
                q_indptr: at(9),
                kv_indptr: at(4),
                kv_indices: at(8),
                prefix_lens: at(10),
                rows: rows.then(|| at(13)),
            },
        });
        let inputs = Inputs {
            tokens,
            ids: ids_ptr,
            positions: at(1),
            slots: at(2),
            attn,
            tail,
        };
        self.layers(&inputs)?;
        if !self.computes_logits() {
            return Ok(Vec::new());
        }
        // final norm + LM head on the rows that need logits, LOGIT_ROWS at a time
        let n = last_rows.len();
        if n > self.scratch.logit_rows() {
            return Err(EngineError::Internal(format!(
                "{n} sequences need logits in one pass; at most {} supported",
                self.scratch.logit_rows()
            )));
        }
        let h = self.cfg.hidden_size;
        let fused = self.fused_norm(tokens);
        // the rows that need logits: gathered already when the last layer ran on them alone
        let head_rows = tail.map_or(at(7), |t| t.ident);
        for c0 in (0..n).step_by(LOGIT_ROWS) {
            let c = (n - c0).min(LOGIT_ROWS);
            let rows = head_rows.add(c0);
            let sc = &self.scratch;
            // SAFETY: rows index tokens of this pass; selection buffers hold LOGIT_ROWS rows.
            unsafe {
                self.kernels
                    .gather_rows(&s, dptr(&sc.sel_x, &s), dptr(&sc.x, &s), rows, c, h)
                    .map_err(cuda_err)?;
                if !fused {
                    self.kernels
                        .gather_rows(&s, dptr(&sc.sel_d, &s), dptr(&sc.delta, &s), rows, c, h)
                        .map_err(cuda_err)?;
                }
            }
            self.head(
                dptr(&self.scratch.sel_x, &s),
                (!fused).then(|| dptr(&self.scratch.sel_d, &s)),
                dptr(&self.scratch.sel_n, &s),
                c,
                c0,
            )?;
        }
        if self.rank() != 0 {
            // Only rank 0 samples.
            return Ok(Vec::new());
        }
        Ok((0..n).collect())
    }

    /// Every layer; on return `scratch.x` + `scratch.delta` is the last hidden state.
    fn layers(&self, inp: &Inputs) -> Result<()> {
        let s = &self.stream;
        let c = &self.cfg;
        let sc = &self.scratch;
        let t = inp.tokens;
        let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let q_w = c.num_heads * hd;
        let qkv_w = (c.num_heads + 2 * c.num_kv_heads) * hd;
        let (x, normed, qkv, attn, delta, gate_up, act) = (
            dptr(&sc.x, s),
            dptr(&sc.normed, s),
            dptr(&sc.qkv, s),
            dptr(&sc.attn, s),
            dptr(&sc.delta, s),
            dptr(&sc.gate_up, s),
            dptr(&sc.act, s),
        );
        let k = &self.kernels;
        let shape = self.shape();
        // SAFETY: every buffer was sized for at least `t` tokens (Scratch, Graphs); inputs were
        // validated (slots inside the pool, ids inside the vocabulary).
        let fused = self.fused_norm(t);
        if let Some(comm) = &self.comm {
            // Rank 0's token ids (under the overlap schedule some exist only on its GPU).
            // SAFETY: the ids buffer holds t tokens on every rank.
            unsafe { comm.broadcast(inp.ids, t, 0, s) }
                .map_err(|e| EngineError::from(crate::backend::BackendError::Nccl(e)))?;
        }
        // What `delta` holds until the next norm adds it: FP8 scales to apply, an all-reduce.
        let mut pending = Pending::default();
        // rows of the last layer's output (fewer than `t` when it runs on the logit rows)
        let mut out_rows = t;
        unsafe {
            k.embedding(s, x, dptr(&self.w.embed, s), inp.ids, t, h, c.vocab_size)
                .map_err(cuda_err)?;
            for (l, lw) in self.w.layers.iter().enumerate() {
                // the last layer's down_proj product stays in `delta` (see `layers`' contract)
                let mlp_area = (l + 1 < self.w.layers.len()).then_some(Area::Mlp);
                let tail = inp.tail.filter(|_| l + 1 == self.w.layers.len());
                let f8 = self.fp8_layer(lw, t);
                // The weight scales of the FP8 qkv GEMM whose product sits in `qkv` unscaled.
                let mut qkv_scales: Option<Dptr<f32>> = None;
                if fused {
                    self.norm_linear(
                        x,
                        dptr(&lw.input_norm, s),
                        lw.qkv.weight(s),
                        qkv,
                        (normed, gate_up),
                        t,
                        h,
                        qkv_w,
                        GemvEpilogue::Store,
                    )?;
                } else if let Some(f) = &f8 {
                    let first = if l == 0 { None } else { Some(delta) };
                    let p = std::mem::take(&mut pending);
                    self.add_norm(x, first, p, dptr(&lw.input_norm, s), NormTo::Fp8, t, h)?;
                    // left unscaled: the RoPE kernel below applies the scales as it reads it
                    self.gemm_fp8_rows(f[0], qkv, t, h, qkv_w, false)?;
                    qkv_scales = Some(f[0].scale);
                } else {
                    let first = if l == 0 { None } else { Some(delta) };
                    let (p, to) = (std::mem::take(&mut pending), NormTo::Bf16(normed));
                    self.add_norm(x, first, p, dptr(&lw.input_norm, s), to, t, h)?;
                    self.linear(normed, lw.qkv.weight(s), qkv, t, h, qkv_w)?;
                }
                let (kc, vc) = self.kv_layer(l);
                // this layer's KV-cache scales (applied by the launches on an FP8 pool only)
                let shape = shape.with_scales(lw.kv_scales);
                if let (
                    true,
                    AttnInputs::Decode {
                        batch,
                        plan:
                            plan @ DecodeAttnPlan {
                                tensor_cores: false,
                                ..
                            },
                        kv_indptr,
                        kv_indices,
                    },
                ) = (self.fuse_attn, inp.attn)
                {
                    if let Some(ws) = qkv_scales.take() {
                        self.rescale_delta(qkv, ws, t, qkv_w)?;
                    }
                    // One launch: RoPE, the new token's K/V store, attention and the merge of
                    // the splits (the new slot is each sequence's last index).
                    k.decode_attn_rope(
                        s,
                        plan,
                        attn,
                        q_w,
                        qkv,
                        kc,
                        vc,
                        inp.positions,
                        dptr(&self.inv_freq, s),
                        kv_indptr,
                        kv_indices,
                        dptr(&sc.partial_o, s),
                        dptr(&sc.partial_ml, s),
                        dptr(&sc.attn_counters, s),
                        batch,
                        shape,
                    )
                    .map_err(cuda_err)?;
                } else {
                    let rows = match inp.attn {
                        AttnInputs::Prefill { rows, .. } => rows,
                        AttnInputs::Decode { .. } => None,
                    };
                    // the FP8 qkv product's scales applied as fp8_rescale would, q kept in
                    // `qkv` (scaled and rotated) for attention, and k and v too when attention
                    // reads them from the rows
                    let scales = match qkv_scales.take() {
                        Some(ws) => Some((self.fp8_rows(t, 0)?.1, ws)),
                        None => None,
                    };
                    k.rope_kv_store_with(
                        s,
                        qkv,
                        kc,
                        vc,
                        inp.positions,
                        inp.slots,
                        dptr(&self.inv_freq, s),
                        t,
                        shape,
                        scales,
                        rows.is_some(),
                    )
                    .map_err(cuda_err)?;
                    // the last layer on the logit rows: their queries and residual rows
                    // gathered (K and V of every row are in the pool now)
                    let (attn_in, q_src) = match &tail {
                        Some(tl) => {
                            self.gather_tail(tl, x, qkv, gate_up, normed, qkv_w, h)?;
                            (tl.attn, gate_up)
                        }
                        None => (inp.attn, qkv),
                    };
                    match attn_in {
                        AttnInputs::Decode {
                            batch,
                            plan,
                            kv_indptr,
                            kv_indices,
                        } => k
                            .decode_attn(
                                s,
                                plan,
                                attn,
                                q_w,
                                qkv,
                                qkv_w,
                                kc,
                                vc,
                                kv_indptr,
                                kv_indices,
                                dptr(&sc.partial_o, s),
                                dptr(&sc.partial_ml, s),
                                batch,
                                shape,
                            )
                            .map_err(cuda_err)?,
                        AttnInputs::Prefill {
                            tiles,
                            n_tiles,
                            paired,
                            q_indptr,
                            kv_indptr,
                            kv_indices,
                            prefix_lens,
                            rows,
                        } => {
                            // K and V from the pool, or from the qkv rows as a bf16 pool
                            let (kc, vc, kv_indices, shape) = match rows {
                                Some(r) => {
                                    let (kr, vr, bf) = Self::rows_as_pool(qkv, shape);
                                    (kr, vr, r, bf)
                                }
                                None => (kc, vc, kv_indices, shape),
                            };
                            k.prefill_attn(
                                s,
                                attn,
                                q_w,
                                q_src,
                                qkv_w,
                                kc,
                                vc,
                                tiles,
                                n_tiles,
                                q_indptr,
                                kv_indptr,
                                kv_indices,
                                prefix_lens,
                                if paired {
                                    PrefillForm::Paired
                                } else {
                                    PrefillForm::OneHead(PrefillPartials {
                                        o: dptr(&sc.partial_o, s),
                                        ml: dptr(&sc.partial_ml, s),
                                        counters: dptr(&sc.attn_counters, s),
                                    })
                                },
                                shape,
                            )
                            .map_err(cuda_err)?
                        }
                    }
                }
                let t = tail.map_or(t, |tl| tl.n);
                out_rows = t;
                if t == 0 {
                    // no row of this pass needs logits (a prompt chunk that is not the last)
                    break;
                }
                if fused {
                    self.row_parallel_add(attn, lw.o.weight(s), x, t, q_w, h)?;
                    self.norm_linear(
                        x,
                        dptr(&lw.post_norm, s),
                        lw.gate_up.weight(s),
                        act,
                        (normed, gate_up),
                        t,
                        h,
                        2 * inter,
                        GemvEpilogue::SwiGlu,
                    )?;
                    self.row_parallel_add(act, lw.down.weight(s), x, t, inter, h)?;
                } else if let Some(f) = &f8 {
                    // o_proj: attention's rows quantized, the product left unscaled in delta
                    // for the post-attention norm to scale (on one GPU)
                    let (xq, xs) = self.fp8_rows(t, q_w)?;
                    k.quantize_rows_fp8(s, xq, xs, attn, t, q_w)
                        .map_err(cuda_err)?;
                    let o = self.row_parallel_out(delta, t, h, Some(Area::Attn));
                    self.gemm_fp8_rows(f[1], o.at, t, q_w, h, false)?;
                    let p = self.row_parallel_pending(o, Some(f[1].scale), t, h)?;
                    self.add_norm(x, Some(delta), p, dptr(&lw.post_norm, s), NormTo::Fp8, t, h)?;
                    self.gemm_fp8_rows(f[2], gate_up, t, h, 2 * inter, false)?;
                    let (xq, xs) = self.fp8_rows(t, inter)?;
                    k.silu_mul_quant_fp8(s, xq, xs, gate_up, Some((xs, f[2].scale)), t, inter)
                        .map_err(cuda_err)?;
                    let o = self.row_parallel_out(delta, t, h, mlp_area);
                    self.gemm_fp8_rows(f[3], o.at, t, inter, h, false)?;
                    pending = self.row_parallel_pending(o, Some(f[3].scale), t, h)?;
                } else {
                    let o = self.row_parallel_out(delta, t, h, Some(Area::Attn));
                    self.linear(attn, lw.o.weight(s), o.at, t, q_w, h)?;
                    let p = self.row_parallel_pending(o, None, t, h)?;
                    let to = NormTo::Bf16(normed);
                    self.add_norm(x, Some(delta), p, dptr(&lw.post_norm, s), to, t, h)?;
                    self.gate_up_act(normed, lw.gate_up.weight(s), gate_up, act, t, h, inter)?;
                    let o = self.row_parallel_out(delta, t, h, mlp_area);
                    self.linear(act, lw.down.weight(s), o.at, t, inter, h)?;
                    pending = self.row_parallel_pending(o, None, t, h)?;
                }
                if let (Some(d), AttnInputs::Prefill { .. }) = (&self.dump, inp.attn) {
                    self.dump_layer(d, l, x, delta, t)?;
                }
            }
        }
        // (the last layer's product is in `delta`: nothing pulled is pending)
        if let Some(ws) = pending.scales {
            self.rescale_delta(delta, ws, out_rows, h)?;
        }
        if let (Some(d), AttnInputs::Prefill { .. }) = (&self.dump, inp.attn) {
            d.pass.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Write bf16(x + delta), the hidden state after `layer`, for `t` tokens (see [`Dump`]).
    fn dump_layer(
        &self,
        d: &Dump,
        layer: usize,
        x: Dptr<bf16>,
        delta: Dptr<bf16>,
        t: usize,
    ) -> Result<()> {
        let n = t * self.cfg.hidden_size;
        let xs = dtoh_bf16(&self.stream, x, n)?;
        let ds = dtoh_bf16(&self.stream, delta, n)?;
        let bytes: Vec<u8> = xs
            .iter()
            .zip(&ds)
            .flat_map(|(a, b)| bf16::from_f32(a.to_f32() + b.to_f32()).to_le_bytes())
            .collect();
        let pass = d.pass.load(Ordering::Relaxed);
        let path = d.dir.join(format!("p{pass:03}_l{layer:02}.bin"));
        std::fs::write(&path, bytes)
            .map_err(|e| EngineError::Internal(format!("{}: {e}", path.display())))
    }
}
