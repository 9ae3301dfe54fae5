//! The CPU backend: the Llama forward pass over our own quantized kernels, with the KV cache
//! held as f16, per layer and KV head one row per slot (see `attention`).

mod attention;
mod ops;
pub mod weights;

use std::time::Instant;

use crate::backend::{Backend, BackendError, LoadOptions, SeqInput};
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
pub use weights::LlamaWeights;

use half::f16;
use sgl_kernels::cpu::{
    self as kernels, SharedMut, matmul, matmul_multi, matmul_multi_with, num_threads, parallel_for,
};

/// Bytes of KV cache the CPU backend takes when `--max-total-tokens` is not given.
pub const CPU_KV_BUDGET_BYTES: usize = 2 << 30;

pub struct CpuBackend {
    cfg: ModelConfig,
    weights: LlamaWeights,
    /// Per layer: keys, then values, as f16, `kv_heads × capacity × head_dim` (head-major, see
    /// `attention::cache_row`).
    k_cache: Vec<KvBuffer>,
    v_cache: Vec<KvBuffer>,
    capacity: usize,
    rope: ops::RopeTable,
    /// Working buffers of the forward pass: one per part of a split batch (see
    /// [`split_parts`]), the first for an unsplit one.
    parts: Vec<Scratch>,
    /// A logits buffer handed back by the caller ([`Backend::recycle_logits`]).
    spare_logits: Vec<f32>,
    /// Whether batched decodes may run split over the threads (see [`split_parts`]).
    split_decode: bool,
}

/// Working buffers of one forward pass over a batch or one part of it (see [`Scratch::prepare`]),
/// kept from step to step.
#[derive(Default)]
struct Scratch {
    positions: Vec<usize>,
    slots: Vec<usize>,
    x: Vec<f32>,
    hbuf: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl Scratch {
    /// Positions and cache slots of `batch`'s new tokens, and every buffer sized for them
    /// (values left by an earlier step are not cleared: each is written before it is read).
    fn prepare(&mut self, cfg: &ModelConfig, batch: &[SeqInput<'_>]) {
        self.positions.clear();
        self.slots.clear();
        for s in batch {
            for i in 0..s.tokens.len() {
                self.positions.push(s.start_pos + i);
                self.slots.push(s.kv_slots[s.start_pos + i] as usize);
            }
        }
        let t = self.positions.len();
        let (h, ffn) = (cfg.hidden_size, cfg.intermediate_size);
        let (qd, kvd) = (
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        );
        for (buf, n) in [
            (&mut self.x, t * h),
            (&mut self.hbuf, t * h),
            (&mut self.q, t * qd),
            (&mut self.k, t * kvd),
            (&mut self.v, t * kvd),
            (&mut self.attn, t * qd),
            (&mut self.o, t * h),
            (&mut self.gate, t * ffn),
            (&mut self.up, t * ffn),
        ] {
            buf.resize(n, 0.0);
        }
    }
}

/// Largest logits buffer (values) kept for the next pass: 64 rows of a 64K vocabulary.
const SPARE_LOGITS_MAX: usize = 64 << 16;

/// Token rows per task of the RoPE on queries in [`rope_and_store`].
const ROPE_ROWS: usize = 8;

/// RoPE on the queries (in place) and keys of a batch, and the rotated keys and the values
/// stored as f16 into one layer's cache rows at `slots`. Spread over the kernel pool from a few
/// tokens on: tasks are chunks of query rows and, per KV head, the keys or the values (each
/// writing only its own head's rows of one cache, so tasks never write the same memory).
/// `kc` and `vc` may be shared with other callers running at the same time, as long as their
/// `slots` are not these.
#[allow(clippy::too_many_arguments)]
fn rope_and_store(
    cfg: &ModelConfig,
    rope: &ops::RopeTable,
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    positions: &[usize],
    slots: &[usize],
    capacity: usize,
    kc: &SharedMut<'_, f16>,
    vc: &SharedMut<'_, f16>,
) {
    let hd = cfg.head_dim;
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let tokens = positions.len();
    let q_tasks = tokens.div_ceil(ROPE_ROWS);
    let qs = SharedMut::new(q);
    let task = |i: usize| {
        if i < q_tasks {
            let rows = i * ROPE_ROWS..((i + 1) * ROPE_ROWS).min(tokens);
            // SAFETY: query rows `rows` belong to this task alone.
            let qr = unsafe { qs.slice(rows.start * qd, rows.len() * qd) };
            for (row, &p) in qr.chunks_exact_mut(qd).zip(&positions[rows]) {
                for head in row.chunks_exact_mut(hd) {
                    rope.rotate(head, p, cfg.rope_interleaved);
                }
            }
            return;
        }
        let (kvh, keys) = ((i - q_tasks) / 2, (i - q_tasks).is_multiple_of(2));
        let mut rotated = vec![0f32; hd];
        for (t, (&slot, &p)) in slots.iter().zip(positions).enumerate() {
            let src = t * kvd + kvh * hd..t * kvd + (kvh + 1) * hd;
            let at = attention::cache_row(kvh, slot, capacity, hd);
            let (cache, row) = if keys {
                rotated.copy_from_slice(&k[src]);
                rope.rotate(&mut rotated, p, cfg.rope_interleaved);
                (kc, &rotated[..])
            } else {
                (vc, &v[src])
            };
            // SAFETY: rows of KV head `kvh` of one cache at these slots are written by this task
            // alone (other callers sharing the cache write other slots).
            let dst = unsafe { cache.slice(at, hd) };
            attention::f32_to_f16(row, dst);
        }
    };
    let n_tasks = q_tasks + 2 * cfg.num_kv_heads;
    if tokens < ROPE_ROWS {
        (0..n_tasks).for_each(task);
    } else {
        kernels::parallel_for(n_tasks, task);
    }
}

impl CpuBackend {
    /// `kv_capacity` token slots; `max_positions` bounds the RoPE table.
    /// Reads `model`'s weights into the kernels' formats and allocates the KV cache:
    /// `--max-total-tokens` slots, or as many as [`CPU_KV_BUDGET_BYTES`] holds.
    pub fn load(model: &crate::model::Model, opts: &LoadOptions) -> Result<Self, BackendError> {
        let cfg = &model.config;
        // K and V, f16 each.
        let per_token = 2 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim;
        let capacity = match opts.max_total_tokens {
            Some(n) => n,
            None => (CPU_KV_BUDGET_BYTES / per_token.max(1)).clamp(2048, 131_072),
        };
        let tensors = model.llama(opts.tensor_parallel);
        let progress = |done: usize, total: usize| {
            if done == total || done.is_multiple_of(8) {
                tracing::info!("loading weights: layer {done}/{total}");
            }
        };
        let weights = LlamaWeights::load(&tensors, opts.quantization, progress)?;
        CpuBackend::new(cfg.clone(), weights, capacity, opts.context_length + 1)
    }

    /// [`CpuBackend::load`] with `kv_capacity` KV slots and room for sequences of
    /// `max_positions` tokens (benchmarks and tests).
    pub fn with_capacity(
        model: &crate::model::Model,
        kv_capacity: usize,
        max_positions: usize,
    ) -> Result<Self, BackendError> {
        let tensors = model.llama(Default::default());
        let weights = LlamaWeights::load(&tensors, Default::default(), |_, _| {})?;
        CpuBackend::new(model.config.clone(), weights, kv_capacity, max_positions)
    }

    pub fn new(
        cfg: ModelConfig,
        weights: LlamaWeights,
        kv_capacity: usize,
        max_positions: usize,
    ) -> Result<Self, BackendError> {
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let per_layer = kv_capacity
            .checked_mul(kv_dim)
            .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        let bytes = per_layer as u128 * 2 * 2 * cfg.num_layers as u128;
        tracing::info!(
            "KV cache: {kv_capacity} tokens, {:.1} MiB ({} layers, {} KV heads × {})",
            bytes as f64 / (1024.0 * 1024.0),
            cfg.num_layers,
            cfg.num_kv_heads,
            cfg.head_dim
        );
        let mut k_cache: Vec<KvBuffer> = (0..cfg.num_layers)
            .map(|_| KvBuffer::new(per_layer))
            .collect::<Result<_, _>>()?;
        let mut v_cache: Vec<KvBuffer> = (0..cfg.num_layers)
            .map(|_| KvBuffer::new(per_layer))
            .collect::<Result<_, _>>()?;
        // Slots are handed out lowest first: touch the first ones' rows now.
        let per_token = 2 * 2 * kv_dim * cfg.num_layers;
        let slots = kv_capacity.min(KV_PREFAULT_BYTES / per_token.max(1));
        let started = Instant::now();
        for cache in [&mut k_cache, &mut v_cache] {
            kernels::parallel_chunks_mut(cache, 1, |_, layer| {
                for buf in layer {
                    buf.touch_slots(slots, cfg.num_kv_heads, kv_capacity, cfg.head_dim);
                }
            });
        }
        tracing::debug!(
            "KV cache: rows of the first {slots} slots touched in {:.2}s",
            started.elapsed().as_secs_f64()
        );
        let rope = ops::RopeTable::new(&cfg.rope_inv_freq(), max_positions);
        Ok(CpuBackend {
            cfg,
            weights,
            k_cache,
            v_cache,
            capacity: kv_capacity,
            rope,
            parts: Vec::new(),
            split_decode: std::env::var("SGL_CPU_SPLIT_DECODE").map_or(true, |v| v != "0"),
            spare_logits: Vec::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn check_batch(&self, batch: &[SeqInput<'_>]) -> Result<()> {
        for s in batch {
            let end = s.start_pos + s.tokens.len();
            if s.kv_slots.len() != end {
                return Err(EngineError::Internal(format!(
                    "sequence has {} KV slots for {end} positions",
                    s.kv_slots.len()
                )));
            }
            if end > self.rope.max_positions() {
                return Err(EngineError::Internal(format!(
                    "position {end} beyond the RoPE table ({})",
                    self.rope.max_positions()
                )));
            }
            if let Some(&bad) = s.kv_slots.iter().find(|&&x| x as usize >= self.capacity) {
                return Err(EngineError::Internal(format!("KV slot {bad} out of range")));
            }
            if let Some(&bad) = s
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(EngineError::Internal(format!(
                    "token id {bad} out of vocabulary"
                )));
            }
        }
        Ok(())
    }
}

/// KV cache bytes touched when the backend is made. A page's first write costs a page fault
/// (in a virtual machine often a host-side fault too: ~10 µs per 4 KiB page has been seen),
/// and the forward stores new keys and values on one thread: a fresh server's first requests
/// would otherwise pay about five faults per new token per step (a batch-16 decode step of
/// SmolLM2-135M: ~1.2 ms of ~16). Bounded so that start-up stays short and resident memory
/// follows use for large pools.
const KV_PREFAULT_BYTES: usize = 512 << 20;

/// One layer's keys or values: zeroed f16 values on huge pages where the OS provides them
/// (see [`kernels::HugeBytes`]); attention reads a few hundred bytes from each of thousands of
/// slots per layer and step.
struct KvBuffer {
    bytes: kernels::HugeBytes,
    len: usize,
}

impl KvBuffer {
    /// `len` zeroed f16 values.
    fn new(len: usize) -> Result<KvBuffer, BackendError> {
        let size = len
            .checked_mul(std::mem::size_of::<f16>())
            .ok_or_else(|| BackendError::OutOfMemory("KV cache size overflows".into()))?;
        let bytes = kernels::HugeBytes::zeroed(size);
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f16>()) {
            return Err(BackendError::OutOfMemory(
                "KV cache buffer is misaligned".into(),
            ));
        }
        Ok(KvBuffer { bytes, len })
    }

    /// Writes (zeros, which the buffer already holds) into every page holding the rows of
    /// slots `0..slots` of each KV head, so that their page faults happen now.
    fn touch_slots(&mut self, slots: usize, kv_heads: usize, capacity: usize, head_dim: usize) {
        const PAGE_VALUES: usize = 4096 / std::mem::size_of::<f16>();
        let data = self.as_mut_slice();
        for h in 0..kv_heads {
            let start = attention::cache_row(h, 0, capacity, head_dim);
            let end = (start + slots * head_dim).min(data.len());
            for i in (start..end).step_by(PAGE_VALUES) {
                data[i] = f16::ZERO;
            }
        }
    }

    fn as_slice(&self) -> &[f16] {
        // SAFETY: the buffer holds `len` f16 (2 bytes each) and is aligned for f16 (checked in
        // `new`); any bit pattern is a valid f16; it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.bytes.as_ptr() as *const f16, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [f16] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only live view.
        unsafe { std::slice::from_raw_parts_mut(self.bytes.as_mut_ptr() as *mut f16, self.len) }
    }
}

/// The model's weights and tables a forward pass reads (the backend less its caches).
struct Model<'a> {
    cfg: &'a ModelConfig,
    weights: &'a LlamaWeights,
    rope: &'a ops::RopeTable,
    capacity: usize,
}

impl Model<'_> {
    /// Embeddings of `sc`'s tokens (prepared for `batch`) into `x`, and the first layer's
    /// attention norm into `hbuf`.
    fn embed(&self, batch: &[SeqInput<'_>], sc: &mut Scratch) {
        sc.prepare(self.cfg, batch);
        let h = self.cfg.hidden_size;
        let tokens = batch.iter().flat_map(|s| s.tokens.iter());
        for (xr, &t) in sc.x.chunks_exact_mut(h).zip(tokens) {
            self.weights.embed.dequantize_row(t as usize, xr);
        }
        if let Some(first) = self.weights.layers.first() {
            ops::rms_norm(
                &sc.x,
                &first.attn_norm,
                self.cfg.rms_norm_eps,
                h,
                &mut sc.hbuf,
            );
        }
    }

    /// Layer `l`'s query, key and value rows of the normed `hbuf`.
    fn qkv(&self, l: usize, sc: &mut Scratch) {
        let lw = &self.weights.layers[l];
        let t = sc.positions.len();
        matmul_multi(
            &[&lw.wq, &lw.wk, &lw.wv],
            &sc.hbuf,
            t,
            &mut [&mut sc.q, &mut sc.k, &mut sc.v],
        );
        if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
            ops::add_bias(&mut sc.q, bq);
            ops::add_bias(&mut sc.k, bk);
            ops::add_bias(&mut sc.v, bv);
        }
    }

    /// RoPE on the queries and keys, and the keys and values stored into one layer's cache.
    fn store(&self, sc: &mut Scratch, kc: &SharedMut<'_, f16>, vc: &SharedMut<'_, f16>) {
        rope_and_store(
            self.cfg,
            self.rope,
            &mut sc.q,
            &sc.k,
            &sc.v,
            &sc.positions,
            &sc.slots,
            self.capacity,
            kc,
            vc,
        );
    }

    /// The rest of layer `l` once its keys and values are stored: attention over `caches`
    /// (on `attn_threads` threads' worth of tasks), the output projection and residual, the
    /// MLP and residual, and the next layer's attention norm into `hbuf`. During the
    /// compute-bound gate and up products of a batch, `next_keys` (the next layer's key
    /// cache) has the rows `runs` lists pulled toward the caches.
    #[allow(clippy::too_many_arguments)]
    fn finish_layer(
        &self,
        l: usize,
        batch: &[SeqInput<'_>],
        sc: &mut Scratch,
        caches: (&[f16], &[f16]),
        attn_threads: usize,
        next_keys: Option<attention::CacheAddress>,
        runs: &attention::KvRuns,
    ) {
        let cfg = self.cfg;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let lw = &self.weights.layers[l];
        let t = sc.positions.len();
        attention::attention(
            &sc.q,
            caches.0,
            caches.1,
            batch,
            cfg.num_heads,
            cfg.num_kv_heads,
            hd,
            &mut sc.attn,
            attn_threads,
        );
        matmul(&lw.wo, &sc.attn, t, &mut sc.o);
        ops::add_rms_norm(
            &mut sc.x,
            &sc.o,
            &lw.ffn_norm,
            cfg.rms_norm_eps,
            h,
            &mut sc.hbuf,
        );
        let prefetch = next_keys
            .filter(|_| t > 1)
            .map(|k| move |i: usize, of: usize| runs.prefetch_keys(k, cfg.num_kv_heads, hd, i, of));
        matmul_multi_with(
            &[&lw.w_gate, &lw.w_up],
            &sc.hbuf,
            t,
            &mut [&mut sc.gate, &mut sc.up],
            prefetch
                .as_ref()
                .map(|f| f as &(dyn Fn(usize, usize) + Sync)),
        );
        ops::silu_mul(&mut sc.gate, &sc.up);
        matmul(&lw.w_down, &sc.gate, t, &mut sc.o);
        match self.weights.layers.get(l + 1) {
            Some(next) => ops::add_rms_norm(
                &mut sc.x,
                &sc.o,
                &next.attn_norm,
                cfg.rms_norm_eps,
                h,
                &mut sc.hbuf,
            ),
            None => ops::add_in_place(&mut sc.x, &sc.o),
        }
    }

    /// Rows of logits `batch` asks for ([`logit_rows`]): the final norm of those tokens'
    /// hidden states and the LM head, into `out` (rows × vocabulary).
    fn logits(&self, batch: &[SeqInput<'_>], x: &[f32], out: &mut [f32]) {
        let h = self.cfg.hidden_size;
        let rows = logit_rows(batch);
        let n = rows.len();
        let mut last = vec![0f32; n * h];
        for (j, &r) in rows.iter().enumerate() {
            last[j * h..(j + 1) * h].copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut normed = vec![0f32; n * h];
        ops::rms_norm(
            &last,
            &self.weights.norm,
            self.cfg.rms_norm_eps,
            h,
            &mut normed,
        );
        if n > 0 {
            matmul(self.weights.lm_head(), &normed, n, out);
        }
    }
}

/// Token rows (in batch order) whose logits `batch` asks for: the last `num_logits` of each
/// sequence.
fn logit_rows(batch: &[SeqInput<'_>]) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut off = 0;
    for s in batch {
        let len = s.tokens.len();
        rows.extend(off + len - s.num_logits.min(len)..off + len);
        off += len;
    }
    rows
}

/// How many rows [`logit_rows`] gives.
fn logit_count(batch: &[SeqInput<'_>]) -> usize {
    batch.iter().map(|s| s.num_logits.min(s.tokens.len())).sum()
}

/// Sequences per part below which a decode batch is not split (see [`split_parts`]).
const MIN_PART_SEQS: usize = 4;

/// How a batch of single-token decodes is split over the kernel threads: boundaries of
/// consecutive runs of sequences, one run per thread, or `None` to run the batch as one.
///
/// A batched decode step is a few hundred short products, norms and attentions, each spread
/// over the pool and each ending in a wait for the slowest thread: on a few cores those waits
/// and the uneven ends of jobs cost more than a tenth of the step. Split into one part per
/// thread, each thread runs the whole forward of its own sequences with one wait per layer
/// (see [`CpuBackend::forward_split`]). Each thread then reads all the weights, but the
/// threads walk the layers in step, so one's reads mostly find what the other's brought into
/// the shared last-level cache; the products stay batched per thread (a tile of activation
/// rows per weight load), so only batches of several sequences per thread are split. Measured
/// on 2 cores with SmolLM2-135M at context 192: batch 16 11.5-12.0 ms per step split against
/// 12.8-12.9 ms unsplit; batch 8 6.7-7.0 against 7.1-7.4 ms.
fn split_parts(batch: &[SeqInput<'_>], threads: usize) -> Option<Vec<usize>> {
    if batch.iter().any(|s| s.tokens.len() != 1) {
        return None;
    }
    // Every thread gets a part (a part per thread of a few threads leaves the rest idle).
    let parts = threads;
    if parts < 2 || batch.len() < MIN_PART_SEQS * parts {
        return None;
    }
    // Parts write their tokens' rows of one cache at the same time: their new slots must be
    // distinct (the scheduler's always are; anything else runs unsplit).
    let mut new_slots: Vec<u32> = batch.iter().map(|s| s.kv_slots[s.start_pos]).collect();
    new_slots.sort_unstable();
    if new_slots.windows(2).any(|w| w[0] == w[1]) {
        return None;
    }
    Some((0..=parts).map(|p| p * batch.len() / parts).collect())
}

impl CpuBackend {
    /// Whether batched decodes may run split over the kernel threads, one part of the batch
    /// per thread (the default; `SGL_CPU_SPLIT_DECODE=0` starts with it off). Results are
    /// the same either way, bit for bit.
    pub fn set_split_decode(&mut self, on: bool) {
        self.split_decode = on;
    }

    /// How many parts `batch` runs in: one per kernel thread for a split batched decode,
    /// otherwise 1.
    pub fn forward_parts(&self, batch: &[SeqInput<'_>]) -> usize {
        self.split_bounds(batch).map_or(1, |b| b.len() - 1)
    }

    fn split_bounds(&self, batch: &[SeqInput<'_>]) -> Option<Vec<usize>> {
        self.split_decode
            .then(|| split_parts(batch, num_threads()))
            .flatten()
    }

    /// The model, the KV caches and the working buffers, borrowed apart.
    fn split_borrow(
        &mut self,
    ) -> (
        Model<'_>,
        &mut [KvBuffer],
        &mut [KvBuffer],
        &mut Vec<Scratch>,
    ) {
        let model = Model {
            cfg: &self.cfg,
            weights: &self.weights,
            rope: &self.rope,
            capacity: self.capacity,
        };
        (model, &mut self.k_cache, &mut self.v_cache, &mut self.parts)
    }

    /// The forward pass with each kernel spread over the pool.
    fn forward_pooled(&mut self, batch: &[SeqInput<'_>], logits: &mut [f32]) {
        let (model, k_cache, v_cache, parts) = self.split_borrow();
        if parts.is_empty() {
            parts.push(Scratch::default());
        }
        let sc = &mut parts[0];
        model.embed(batch, sc);
        let runs = attention::KvRuns::new(batch);
        for l in 0..k_cache.len() {
            model.qkv(l, sc);
            model.store(
                sc,
                &SharedMut::new(k_cache[l].as_mut_slice()),
                &SharedMut::new(v_cache[l].as_mut_slice()),
            );
            let next_keys = k_cache
                .get(l + 1)
                .map(|k| attention::CacheAddress::of(k.as_slice()));
            let caches = (k_cache[l].as_slice(), v_cache[l].as_slice());
            model.finish_layer(l, batch, sc, caches, num_threads(), next_keys, &runs);
        }
        model.logits(batch, &sc.x, logits);
    }

    /// The forward pass of a batch split into parts (`bounds`, see [`split_parts`]), each
    /// part's forward on one thread, in one pool job per layer: job `l` finishes layer `l - 1`
    /// (whose caches no one writes any more) and runs layer `l` up to its cache stores (each
    /// part writing only its own sequences' new slots), so a part never reads a cache while
    /// another part writes it.
    fn forward_split(&mut self, batch: &[SeqInput<'_>], bounds: &[usize], logits: &mut [f32]) {
        let n_parts = bounds.len() - 1;
        let part = |p: usize| &batch[bounds[p]..bounds[p + 1]];
        let vocab = self.cfg.vocab_size;
        // Part `p`'s logits rows: `rows_before[p]..rows_before[p + 1]`.
        let mut rows_before = vec![0];
        for p in 0..n_parts {
            rows_before.push(rows_before[p] + logit_count(part(p)));
        }
        let runs: Vec<attention::KvRuns> = (0..n_parts)
            .map(|p| attention::KvRuns::new(part(p)))
            .collect();
        let (model, k_cache, v_cache, parts) = self.split_borrow();
        if parts.len() < n_parts {
            parts.resize_with(n_parts, Scratch::default);
        }
        let scratch = SharedMut::new(&mut parts[..n_parts]);
        let out = SharedMut::new(logits);
        let layers = k_cache.len();
        for l in 0..=layers {
            let (k_done, k_rest) = k_cache.split_at_mut(l);
            let (v_done, v_rest) = v_cache.split_at_mut(l);
            let done = l
                .checked_sub(1)
                .map(|d| (k_done[d].as_slice(), v_done[d].as_slice()));
            let store = k_rest.first_mut().zip(v_rest.first_mut()).map(|(k, v)| {
                (
                    SharedMut::new(k.as_mut_slice()),
                    SharedMut::new(v.as_mut_slice()),
                )
            });
            let next_keys = store
                .as_ref()
                .map(|(k, _)| attention::CacheAddress::of_shared(k));
            parallel_for(n_parts, |p| {
                // SAFETY: task `p` of this job alone takes part `p`.
                let sc = &mut unsafe { scratch.slice(p, 1) }[0];
                match done {
                    Some(caches) => {
                        model.finish_layer(l - 1, part(p), sc, caches, 1, next_keys, &runs[p])
                    }
                    None => model.embed(part(p), sc),
                }
                match &store {
                    Some((kc, vc)) => {
                        model.qkv(l, sc);
                        // The parts' new slots are distinct (`split_parts`): their stores
                        // write disjoint rows.
                        model.store(sc, kc, vc);
                    }
                    None => {
                        let n = rows_before[p + 1] - rows_before[p];
                        // SAFETY: part `p`'s logits rows are its own.
                        let o = unsafe { out.slice(rows_before[p] * vocab, n * vocab) };
                        model.logits(part(p), &sc.x, o);
                    }
                }
            });
        }
    }
}

impl Backend for CpuBackend {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.check_batch(batch)?;
        let started = Instant::now();
        let t_total: usize = batch.iter().map(|s| s.tokens.len()).sum();
        if t_total == 0 {
            return Ok(Vec::new());
        }
        let n = logit_count(batch);
        // Every value is written by the product, so a recycled buffer is not cleared.
        let mut logits = std::mem::take(&mut self.spare_logits);
        logits.resize(n * self.cfg.vocab_size, 0.0);
        match self.split_bounds(batch) {
            Some(bounds) => self.forward_split(batch, &bounds, &mut logits),
            None => self.forward_pooled(batch, &mut logits),
        }
        tracing::trace!(
            "forward: {} seqs, {t_total} tokens in {:.2} ms",
            batch.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(logits)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn recycle_logits(&mut self, logits: Vec<f32>) {
        // Batched decode steps; a long prompt's logprob rows are not worth keeping.
        if logits.capacity() <= SPARE_LOGITS_MAX {
            self.spare_logits = logits;
        }
    }

    fn kv_capacity(&self) -> usize {
        self.capacity
    }

    fn describe(&self) -> String {
        format!(
            "cpu ({} threads, {:.1} MiB of weights)",
            kernels::num_threads(),
            self.weights.size_bytes() as f64 / (1024.0 * 1024.0)
        )
    }
}
