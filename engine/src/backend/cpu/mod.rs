//! The CPU backend: the Llama forward pass over our own quantized kernels, with the KV cache
//! held as f16, per layer and KV head one row per slot (see `attention`).

mod attention;
pub mod kernels;
mod ops;

use std::time::Instant;

use crate::backend::{Backend, SeqInput};
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
use crate::model::llama::LlamaWeights;

use half::f16;
use kernels::{matmul, matmul_multi, matmul_multi_with};

pub struct CpuBackend {
    cfg: ModelConfig,
    weights: LlamaWeights,
    /// Per layer: keys, then values, as f16, `kv_heads × capacity × head_dim` (head-major, see
    /// `attention::cache_row`).
    k_cache: Vec<KvBuffer>,
    v_cache: Vec<KvBuffer>,
    capacity: usize,
    rope: ops::RopeTable,
    /// The forward pass's working buffers, kept from step to step.
    scratch: Scratch,
    /// A logits buffer handed back by the caller ([`Backend::recycle_logits`]).
    spare_logits: Vec<f32>,
}

/// Working buffers of one forward pass (see [`sized`]).
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

/// The first `n` values of `buf`, grown if needed; values left by an earlier step are not
/// cleared.
fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// Largest logits buffer (values) kept for the next pass: 64 rows of a 64K vocabulary.
const SPARE_LOGITS_MAX: usize = 64 << 16;

/// Token rows per task of the RoPE on queries in [`rope_and_store`].
const ROPE_ROWS: usize = 8;

/// RoPE on the queries (in place) and keys of a batch, and the rotated keys and the values
/// stored as f16 into one layer's cache rows at `slots`. Spread over the kernel pool from a few
/// tokens on: tasks are chunks of query rows and, per KV head, the keys or the values (each
/// writing only its own head's rows of one cache, so tasks never write the same memory).
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
    kc: &mut [f16],
    vc: &mut [f16],
) {
    let hd = cfg.head_dim;
    let (qd, kvd) = (cfg.num_heads * hd, cfg.num_kv_heads * hd);
    let tokens = positions.len();
    let q_tasks = tokens.div_ceil(ROPE_ROWS);
    let (qs, ks, vs) = (
        kernels::SharedMut::new(q),
        kernels::SharedMut::new(kc),
        kernels::SharedMut::new(vc),
    );
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
                (&ks, &rotated[..])
            } else {
                (&vs, &v[src])
            };
            // SAFETY: rows of KV head `kvh` of one cache are written by this task alone.
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
    pub fn new(
        cfg: ModelConfig,
        weights: LlamaWeights,
        kv_capacity: usize,
        max_positions: usize,
    ) -> Result<Self> {
        let kv_dim = cfg.num_kv_heads * cfg.head_dim;
        let per_layer = kv_capacity
            .checked_mul(kv_dim)
            .ok_or_else(|| EngineError::Load("KV cache size overflows".into()))?;
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
            .collect::<Result<_>>()?;
        let mut v_cache: Vec<KvBuffer> = (0..cfg.num_layers)
            .map(|_| KvBuffer::new(per_layer))
            .collect::<Result<_>>()?;
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
            scratch: Scratch::default(),
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
    fn new(len: usize) -> Result<KvBuffer> {
        let size = len
            .checked_mul(std::mem::size_of::<f16>())
            .ok_or_else(|| EngineError::Load("KV cache size overflows".into()))?;
        let bytes = kernels::HugeBytes::zeroed(size);
        if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f16>()) {
            return Err(EngineError::Load("KV cache buffer is misaligned".into()));
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

impl Backend for CpuBackend {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.check_batch(batch)?;
        let started = Instant::now();
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        let hd = cfg.head_dim;
        let qd = cfg.num_heads * hd;
        let kvd = cfg.num_kv_heads * hd;
        let ffn = cfg.intermediate_size;
        let t_total: usize = batch.iter().map(|s| s.tokens.len()).sum();
        if t_total == 0 {
            return Ok(Vec::new());
        }

        // Flattened per-token bookkeeping, in buffers kept from step to step (every value
        // is written before it is read, so they are not cleared).
        let mut sc = std::mem::take(&mut self.scratch);
        sc.positions.clear();
        sc.slots.clear();
        for s in batch {
            for i in 0..s.tokens.len() {
                sc.positions.push(s.start_pos + i);
                sc.slots.push(s.kv_slots[s.start_pos + i] as usize);
            }
        }
        let Scratch {
            positions,
            slots,
            x,
            hbuf,
            q,
            k,
            v,
            attn,
            o,
            gate,
            up,
        } = &mut sc;
        let (positions, slots) = (&positions[..], &slots[..]);
        let x = sized(x, t_total * h);
        let hbuf = sized(hbuf, t_total * h);
        let q = sized(q, t_total * qd);
        let k = sized(k, t_total * kvd);
        let v = sized(v, t_total * kvd);
        let attn = sized(attn, t_total * qd);
        let o = sized(o, t_total * h);
        let gate = sized(gate, t_total * ffn);
        let up = sized(up, t_total * ffn);

        let kv_runs = attention::KvRuns::new(batch);
        let tokens = batch.iter().flat_map(|s| s.tokens.iter());
        for (xr, &t) in x.chunks_exact_mut(h).zip(tokens) {
            self.weights.embed.dequantize_row(t as usize, xr);
        }
        let layers = &self.weights.layers;
        if let Some(first) = layers.first() {
            ops::rms_norm(x, &first.attn_norm, cfg.rms_norm_eps, h, hbuf);
        }
        for (l, lw) in layers.iter().enumerate() {
            // `hbuf` holds this layer's attention norm of `x`.
            matmul_multi(&[&lw.wq, &lw.wk, &lw.wv], hbuf, t_total, &mut [q, k, v]);
            if let (Some(bq), Some(bk), Some(bv)) = (&lw.bq, &lw.bk, &lw.bv) {
                ops::add_bias(q, bq);
                ops::add_bias(k, bk);
                ops::add_bias(v, bv);
            }
            rope_and_store(
                cfg,
                &self.rope,
                q,
                k,
                v,
                positions,
                slots,
                self.capacity,
                self.k_cache[l].as_mut_slice(),
                self.v_cache[l].as_mut_slice(),
            );
            attention::attention(
                q,
                self.k_cache[l].as_slice(),
                self.v_cache[l].as_slice(),
                batch,
                cfg.num_heads,
                cfg.num_kv_heads,
                hd,
                attn,
            );
            matmul(&lw.wo, attn, t_total, o);
            ops::add_rms_norm(x, o, &lw.ffn_norm, cfg.rms_norm_eps, h, hbuf);
            // A batch's gate and up products are compute-bound: meanwhile, pull the next
            // layer's cached key rows (which its attention reads) toward the caches.
            let next_keys = (l + 1 < self.k_cache.len() && t_total > 1).then(|| {
                let k = self.k_cache[l + 1].as_slice();
                let runs = &kv_runs;
                move |i: usize, of: usize| runs.prefetch_keys(k, cfg.num_kv_heads, hd, i, of)
            });
            matmul_multi_with(
                &[&lw.w_gate, &lw.w_up],
                hbuf,
                t_total,
                &mut [&mut *gate, &mut *up],
                next_keys
                    .as_ref()
                    .map(|f| f as &(dyn Fn(usize, usize) + Sync)),
            );
            ops::silu_mul(gate, up);
            matmul(&lw.w_down, gate, t_total, o);
            match layers.get(l + 1) {
                Some(next) => ops::add_rms_norm(x, o, &next.attn_norm, cfg.rms_norm_eps, h, hbuf),
                None => ops::add_in_place(x, o),
            }
        }

        // Final norm and logits for the last `num_logits` tokens of each sequence.
        let mut rows = Vec::new();
        let mut off = 0;
        for s in batch {
            let len = s.tokens.len();
            rows.extend(off + len - s.num_logits.min(len)..off + len);
            off += len;
        }
        let n = rows.len();
        let mut last = vec![0f32; n * h];
        for (j, &r) in rows.iter().enumerate() {
            last[j * h..(j + 1) * h].copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        self.scratch = sc;
        let mut normed = vec![0f32; n * h];
        ops::rms_norm(&last, &self.weights.norm, cfg.rms_norm_eps, h, &mut normed);
        let vocab = cfg.vocab_size;
        // Every value is written by the product, so a recycled buffer is not cleared.
        let mut logits = std::mem::take(&mut self.spare_logits);
        logits.resize(n * vocab, 0.0);
        if n > 0 {
            matmul(self.weights.lm_head(), &normed, n, &mut logits);
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
