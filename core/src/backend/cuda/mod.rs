//! The CUDA backend: Llama-family models in bf16 on one GPU, through `sgl-kernels`.
//!
//! One forward pass: embedding gather, then per layer RMSNorm (fused with the residual add),
//! the fused qkv GEMM, RoPE fused with the K/V store into the paged pool, attention (decode
//! kernel when every sequence brings one token, tensor-core prefill kernel otherwise), o_proj,
//! RMSNorm+add, the fused gate/up GEMM, SiLU-and-mul, down GEMM; at the end the final norm and
//! the LM head only for rows whose logits are needed. GEMMs of up to 8 token rows (decode) run
//! the bandwidth-bound GEMV kernel, with SiLU-and-mul fused into the gate/up one; larger GEMMs
//! go through cuBLASLt.
//!
//! Decode batches of up to `cuda_graph_max_bs` sequences replay a CUDA graph captured per
//! padded batch size (inputs live at fixed device addresses; padding rows write a spare slot).

mod bench_ar_norm;
mod bench_comm;
mod forward;
mod mixed;
mod overlap;
mod tp;
mod weights;

use std::cell::Cell;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use sgl_kernels::{Gemm, GemvWorkspace, Kernels, KvDtype, MAX_DECODE_SPLITS};

use super::{
    Backend, BackendError, DeviceSampler, DeviceSampling, KvCacheDtype, LoadOptions, Overlap,
    SampleInput, SeqInput,
};
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
use crate::model::files::ModelFiles;
use crate::model::llama::TensorParallel;
use crate::model::{Model, Quantization};
use mixed::{decode_form, merge_groups, split_mixed};

pub use bench_comm::all_reduce_bench;

/// Start-up options of the CUDA backend (SGLang's flags of the same names).
#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub mem_fraction_static: f32,
    pub max_total_tokens: Option<usize>,
    /// Largest decode batch served by a CUDA graph.
    pub cuda_graph_max_bs: usize,
    pub disable_cuda_graph: bool,
    /// Tokens one forward pass may carry before scratch buffers grow.
    pub max_forward_tokens: usize,
    pub quantization: Quantization,
    /// The KV pool's element type (`--kv-cache-dtype`).
    pub kv: KvDtype,
    pub tensor_parallel: TensorParallel,
    /// Tensor parallelism: NCCL for every all-reduce, no one-shot kernel.
    pub disable_custom_all_reduce: bool,
    /// Batch-invariant results (`--enable-deterministic-inference`): one GEMM algorithm for
    /// every token count and no GEMV, a fixed decode attention split count, and the one-shot
    /// all-reduce (rank-ordered sums) for every message.
    pub deterministic: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            mem_fraction_static: 0.88,
            max_total_tokens: None,
            cuda_graph_max_bs: 160,
            disable_cuda_graph: false,
            max_forward_tokens: 8192,
            quantization: Quantization::AsStored,
            kv: KvDtype::Bf16,
            tensor_parallel: TensorParallel::default(),
            disable_custom_all_reduce: false,
            deterministic: false,
        }
    }
}

/// A failed CUDA call or kernel launch as the engine's error (its cause kept typed).
pub(crate) fn cuda_err(e: impl Into<BackendError>) -> EngineError {
    EngineError::from(e.into())
}

impl From<&LoadOptions> for CudaOptions {
    fn from(o: &LoadOptions) -> Self {
        CudaOptions {
            mem_fraction_static: o.mem_fraction_static,
            max_total_tokens: o.max_total_tokens,
            cuda_graph_max_bs: o.cuda_graph_max_bs,
            disable_cuda_graph: o.disable_cuda_graph,
            quantization: o.quantization,
            kv: match o.kv_cache_dtype {
                KvCacheDtype::Auto => KvDtype::Bf16,
                KvCacheDtype::Fp8E4m3 => KvDtype::Fp8E4m3,
                KvCacheDtype::Fp8E5m2 => KvDtype::Fp8E5m2,
            },
            tensor_parallel: o.tensor_parallel,
            disable_custom_all_reduce: o.disable_custom_all_reduce,
            deterministic: o.deterministic,
            ..CudaOptions::default()
        }
    }
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub(crate) kernels: Kernels,
    pub(crate) gemm: Gemm,
    /// Split-k partials of the decode GEMV.
    gemv_ws: GemvWorkspace,
    /// GEMMs of at most `GEMV_MAX_TOKENS` rows take the GEMV kernel (`SGL_DISABLE_GEMV=1`:
    /// cuBLASLt for every GEMM, for A/B comparisons).
    use_gemv: bool,
    /// Decode passes fold RMSNorm into the GEMVs (`SGL_DISABLE_GEMV_NORM=1`: separate norms).
    fuse_norm: bool,
    /// Decode passes run RoPE, the K/V store, attention and the split merge as one kernel
    /// (`SGL_DECODE_ATTN_FUSION=0`: three launches, rope_kv_store, attention and merge).
    fuse_attn: bool,
    /// Passes through the FP8 GEMMs (prefill, batches above the GEMV's) quantize activations
    /// inside RMSNorm and SiLU-mul and fold each GEMM's rescale into the kernel after it
    /// (`SGL_DISABLE_FP8_FUSION=1`: a quantization and a rescale pass around every GEMM).
    fuse_fp8: bool,
    /// At tp 2 o_proj and down_proj write their products into peer memory and the next norm's
    /// launch all-reduces them as it reads them, where the pull set takes the message
    /// (`forward/add_norm.rs`; `SGL_DISABLE_AR_NORM_FUSION=1`: an all-reduce launch, then the
    /// norm; also off while `SGL_CUDA_DUMP_DIR` asks for each layer's output). Read from the
    /// environment, so the same on every rank.
    ar_norm_fusion: bool,
    /// Decode batches of at least `DECODE_TC_MIN_BATCH` sequences that need no split take the
    /// tensor-core attention kernel (`SGL_DISABLE_DECODE_TC=1`: the FP32 kernel at every batch).
    /// Off under `--enable-deterministic-inference`, whose decode must not depend on the batch.
    decode_tc: bool,
    /// Prefill passes run their last layer past the K/V store on the rows that need logits
    /// only (`forward/tail.rs`; `SGL_DISABLE_LOGIT_ROWS_ONLY=1`: on every row; also off while
    /// `SGL_CUDA_DUMP_DIR` asks for each layer's output). Read from the environment, so the
    /// same on every rank.
    logit_rows_only: bool,
    /// Prefill attention may split the key ranges of a launch's longest query tiles
    /// (`forward/attn_plan.rs`, `prefill_work`; `SGL_DISABLE_PREFILL_SPLIT=1`: whole query
    /// tiles). Off under `--enable-deterministic-inference`. Read from the environment, so the
    /// same on every rank.
    prefill_split: bool,
    /// Prefill attention over an FP8 pool may take two query heads per block
    /// (`forward/attn_plan.rs`, `prefill_plan`; `SGL_DISABLE_PREFILL_PAIRS=1`: one head a
    /// block). The same bits either way; read from the environment, so the same on every rank.
    prefill_pairs: bool,
    /// Prefill attention of fresh prompts over an FP8 pool reads K and V from the qkv rows in
    /// bf16 (`forward/attn_plan.rs`, `kv_rows`; `SGL_DISABLE_PREFILL_KV_ROWS=1`: from the
    /// pool). Read from the environment, so the same on every rank.
    prefill_kv_rows: bool,
    cfg: ModelConfig,
    pub(crate) w: weights::Weights,
    /// [layer][k | v][slot][kv_heads * head_dim] elements of `opts.kv`, as bytes; slot
    /// `capacity` is the padding rows' spare.
    kv: CudaSlice<u8>,
    capacity: usize,
    inv_freq: CudaSlice<f32>,
    scratch: forward::Scratch,
    graphs: forward::Graphs,
    pub(crate) opts: CudaOptions,
    device_name: String,
    /// `SGL_CUDA_DUMP_DIR`: every prefill pass writes each layer's output hidden states there.
    dump: Option<forward::Dump>,
    /// Pinned memory that uploads go through, and the sampled tokens of launched passes.
    staging: overlap::Staging,
    outputs: overlap::PassOutputs,
    /// Input tokens the pass being launched takes from the previous one.
    pending_prev: Cell<Vec<(usize, u32)>>,
    /// The checkpoint's shapes; `cfg` holds this rank's share of them.
    model_cfg: ModelConfig,
    /// This rank's NCCL communicator (tensor parallelism; `None` on one GPU).
    comm: Option<sgl_kernels::nccl::Comm>,
    /// Rank 0's worker ranks (see `tp`).
    peers: tp::Peers,
    /// The one-shot all-reduce for small messages (tensor parallelism with peer access).
    custom_ar: Option<tp::CustomAllReduce>,
    /// Timing only (`bench-one-batch` at tp > 1): skip the layers' all-reduces, which leaves
    /// wrong numbers, to measure their share of a step.
    skip_all_reduce: bool,
}

/// A rank's device state before its KV pool is sized (see [`CudaBackend::load_rank`]).
struct Prepared {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    gemm: Gemm,
    gemv_ws: GemvWorkspace,
    use_gemv: bool,
    cfg: ModelConfig,
    w: weights::Weights,
    inv_freq: CudaSlice<f32>,
    scratch: forward::Scratch,
    device_name: String,
    max_bs: usize,
    per_slot: usize,
    /// KV slots this rank's memory holds.
    capacity: usize,
}

impl CudaBackend {
    /// Loads `model` onto GPU 0 and sizes the KV pool; with `--tp-size N`, onto GPUs 0..N
    /// with rank 0 returned (see `tp`).
    pub fn load(model: &Model, opts: &CudaOptions) -> Result<Self> {
        if opts.tensor_parallel.size > 1 {
            return tp::load_group(model, opts);
        }
        Self::load_rank(model, opts, 0, None)
    }

    /// Loads rank `rank`'s share onto GPU `rank`; in a group, agrees on the KV capacity with
    /// the other ranks and joins their NCCL communicator.
    fn load_rank(
        model: &Model,
        opts: &CudaOptions,
        rank: usize,
        group: Option<&tp::Join>,
    ) -> Result<Self> {
        let prepared = Self::prepare(model, opts, rank);
        let (p, capacity) = match group {
            None => {
                let p = prepared?;
                let c = p.capacity;
                (p, c)
            }
            Some(j) => {
                let mine = prepared
                    .as_ref()
                    .map(|p| p.capacity)
                    .map_err(|e| e.to_string());
                let agreed = j.agree(rank, mine);
                let p = prepared?;
                let c = agreed.map_err(|e| EngineError::from(BackendError::Rank(e)))?;
                (p, c)
            }
        };
        let cfg = p.cfg.clone();
        let stream = p.stream.clone();
        let ctx = p.ctx.clone();
        let rest = (|| -> Result<_> {
            // SAFETY: every slot is written (rope_kv_store) before attention reads it.
            let kv =
                unsafe { stream.alloc::<u8>((capacity + 1) * p.per_slot) }.map_err(cuda_err)?;
            if rank == 0 {
                tracing::info!(
                    "KV pool: {capacity} tokens ({:.1} GB{}, {})",
                    (capacity * p.per_slot) as f64 / 1e9,
                    if group.is_some() { " per GPU" } else { "" },
                    match opts.kv {
                        KvDtype::Bf16 => "bf16",
                        KvDtype::Fp8E4m3 => "fp8_e4m3",
                        KvDtype::Fp8E5m2 => "fp8_e5m2",
                    }
                );
            }
            let graphs = forward::Graphs::new(&stream, p.max_bs, capacity, &cfg)?;
            let staging = overlap::Staging::new(&ctx)?;
            let outputs = overlap::PassOutputs::new(&ctx, &stream, opts.max_forward_tokens.max(1))?;
            Ok((kv, graphs, staging, outputs))
        })();
        let (comm, custom_ar) = match group {
            None => (None, None),
            Some(j) => {
                let ready = rest.as_ref().map(|_| 0).map_err(|e| e.to_string());
                j.agree(rank, ready)
                    .map_err(|e| EngineError::from(BackendError::Rank(e)))?;
                let comm = sgl_kernels::nccl::Comm::init(&stream, j.id, rank, j.size)
                    .map_err(|e| EngineError::from(BackendError::Nccl(e)))?;
                let ar = tp::custom_all_reduce(
                    &ctx,
                    &stream,
                    j,
                    rank,
                    opts.disable_custom_all_reduce
                        || std::env::var("SGL_DISABLE_CUSTOM_ALL_REDUCE").as_deref() == Ok("1"),
                )?;
                // Two ranks' sums are the same bits in either order; more need the one-shot
                // kernel's fixed rank order for every message.
                if opts.deterministic && j.size > 2 && ar.is_none() {
                    return Err(EngineError::InvalidArgument(format!(
                        "--enable-deterministic-inference at --tp-size {} needs the one-shot all-reduce over peer memory (peer access between every pair of GPUs, no --disable-custom-all-reduce)",
                        j.size
                    )));
                }
                (Some(comm), ar)
            }
        };
        let (kv, graphs, staging, outputs) = rest?;
        Ok(CudaBackend {
            ctx,
            stream,
            kernels: p.kernels,
            gemm: p.gemm,
            gemv_ws: p.gemv_ws,
            use_gemv: p.use_gemv,
            fuse_norm: std::env::var("SGL_DISABLE_GEMV_NORM").as_deref() != Ok("1"),
            fuse_attn: std::env::var("SGL_DECODE_ATTN_FUSION").as_deref() != Ok("0"),
            fuse_fp8: std::env::var("SGL_DISABLE_FP8_FUSION").as_deref() != Ok("1"),
            ar_norm_fusion: std::env::var("SGL_DISABLE_AR_NORM_FUSION").as_deref() != Ok("1")
                && std::env::var_os("SGL_CUDA_DUMP_DIR").is_none(),
            decode_tc: std::env::var("SGL_DISABLE_DECODE_TC").as_deref() != Ok("1"),
            logit_rows_only: std::env::var("SGL_DISABLE_LOGIT_ROWS_ONLY").as_deref() != Ok("1")
                && std::env::var_os("SGL_CUDA_DUMP_DIR").is_none(),
            prefill_split: std::env::var("SGL_DISABLE_PREFILL_SPLIT").as_deref() != Ok("1"),
            prefill_pairs: std::env::var("SGL_DISABLE_PREFILL_PAIRS").as_deref() != Ok("1"),
            prefill_kv_rows: std::env::var("SGL_DISABLE_PREFILL_KV_ROWS").as_deref() != Ok("1"),
            cfg,
            w: p.w,
            kv,
            capacity,
            inv_freq: p.inv_freq,
            scratch: p.scratch,
            graphs,
            opts: opts.clone(),
            device_name: p.device_name,
            dump: if rank == 0 {
                forward::Dump::from_env()
            } else {
                None
            },
            staging,
            outputs,
            pending_prev: Cell::new(Vec::new()),
            model_cfg: model.config.clone(),
            comm,
            peers: tp::Peers::default(),
            custom_ar,
            skip_all_reduce: false,
        })
    }

    /// Weights, kernels and scratch of rank `rank` on GPU `rank`, and how many KV slots the
    /// rest of its memory share holds.
    fn prepare(model: &Model, opts: &CudaOptions, rank: usize) -> Result<Prepared> {
        let full = &model.config;
        if let ModelFiles::Gguf(_) = model.files {
            return Err(EngineError::from(BackendError::Unsupported(
                "--device cuda serves Hugging Face folders (safetensors); GGUF files run on --device cpu".into(),
            )));
        }
        if rank == 0 {
            tracing::info!(
                "RoPE theta {} scaling {:?}",
                full.rope_theta,
                full.rope_scaling
            );
        }
        if full.rope_interleaved {
            return Err(EngineError::from(BackendError::Unsupported(
                "the CUDA backend runs Hugging Face checkpoints (rotate-half RoPE)".into(),
            )));
        }
        let tp = TensorParallel {
            rank,
            size: opts.tensor_parallel.size.max(1),
        };
        if tp.size > 1 {
            TensorParallel::check(tp.size, full).map_err(EngineError::InvalidArgument)?;
        }
        let cfg = TensorParallel::local_config(tp.size, full);
        if !cfg.hidden_size.is_multiple_of(8) || !cfg.intermediate_size.is_multiple_of(8) {
            return Err(EngineError::from(BackendError::Unsupported(
                "hidden and intermediate sizes (per rank) must be multiples of 8".into(),
            )));
        }
        let ctx =
            CudaContext::new(rank).map_err(|e| EngineError::from(BackendError::NoDevice(e)))?;
        // SAFETY: one stream does all the work, so cudarc's cross-stream events are not needed
        // (and would get in the way of graph capture).
        unsafe { ctx.disable_event_tracking() };
        // A created stream: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let device_name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let t_kernels = std::time::Instant::now();
        let kernels = Kernels::load(&ctx).map_err(cuda_err)?;
        if rank == 0 {
            tracing::info!(
                "kernels ready in {:.1}s (NVRTC, or its PTX from the kernel cache, then the driver's JIT)",
                t_kernels.elapsed().as_secs_f64()
            );
        }
        let mut gemm = Gemm::new(stream.clone()).map_err(cuda_err)?;
        gemm.set_batch_invariant(opts.deterministic);
        // FP8 GEMMs with the tensor cores' own accumulation (timing comparisons).
        gemm.set_fp8_fast_accum(std::env::var("SGL_FP8_FAST_ACCUM").as_deref() == Ok("1"));
        let gemv_ws = kernels.gemv_workspace(&stream).map_err(cuda_err)?;
        // Deterministic: the GEMV's sums differ from the GEMM's, so every pass takes the GEMM.
        let use_gemv =
            !opts.deterministic && std::env::var("SGL_DISABLE_GEMV").as_deref() != Ok("1");
        let t0 = std::time::Instant::now();
        let tensors = model.llama(tp);
        let w = weights::load(&tensors, opts.quantization, &stream, &kernels)?;
        if w.fp8() {
            weights::check_fp8_gemm(&gemm, &cfg)?;
        }
        let secs = t0.elapsed().as_secs_f64();
        tracing::info!(
            "{}loaded {:.2} GB of weights onto {device_name} in {secs:.1}s ({:.1} GB/s)",
            if tp.size > 1 {
                format!("rank {rank}: ")
            } else {
                String::new()
            },
            w.bytes as f64 / 1e9,
            w.bytes as f64 / 1e9 / secs.max(1e-9)
        );
        let inv = cfg.rope_inv_freq();
        let inv_freq = stream.clone_htod(&inv).map_err(cuda_err)?;
        let max_bs = if opts.disable_cuda_graph {
            0
        } else {
            opts.cuda_graph_max_bs
        };
        let scratch = forward::Scratch::new(
            &stream,
            &cfg,
            opts.max_forward_tokens.max(max_bs).max(1),
            w.fp8(),
            w.vocab_parts,
        )?;

        // KV pool: what is left of mem_fraction_static of the card after weights and scratch.
        let (free, total) = ctx.mem_get_info().map_err(cuda_err)?;
        let used = total - free;
        let per_slot = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * opts.kv.bytes();
        let budget = (opts.mem_fraction_static as f64 * total as f64) as usize;
        let reserve = 256 << 20; // graphs, cuBLAS plans, merge buffers, NCCL buffers
        let mut capacity = budget.saturating_sub(used + reserve) / per_slot;
        if let Some(m) = opts.max_total_tokens {
            capacity = capacity.min(m);
        }
        if capacity < 16 {
            return Err(EngineError::from(BackendError::OutOfMemory(format!(
                "no room for the KV cache on GPU {rank}: {:.1} GB used of {:.1} GB with --mem-fraction-static {}",
                used as f64 / 1e9,
                total as f64 / 1e9,
                opts.mem_fraction_static
            ))));
        }
        Ok(Prepared {
            ctx,
            stream,
            kernels,
            gemm,
            gemv_ws,
            use_gemv,
            cfg,
            w,
            inv_freq,
            scratch,
            device_name,
            max_bs,
            per_slot,
            capacity,
        })
    }

    /// Whether decode-sized GEMMs take the GEMV kernel (the default unless
    /// `SGL_DISABLE_GEMV=1`). Drops the captured decode graphs when it changes.
    pub fn set_gemv(&mut self, on: bool) -> Result<()> {
        let (f, a, p) = (self.fuse_norm, self.fuse_attn, self.kernels.pdl());
        self.set_decode_form(on, f, a, p)
    }

    pub fn gemv_enabled(&self) -> bool {
        self.use_gemv
    }

    /// Whether decode passes fold RMSNorm into the GEMVs.
    pub fn norm_fusion(&self) -> bool {
        self.fuse_norm
    }

    /// Choose the decode form (for A/B benchmarks): the GEMV, the norm fusion inside it, the
    /// one-kernel decode attention, and programmatic dependent launch. Drops the captured graphs when anything changes.
    pub fn set_decode_form(
        &mut self,
        gemv: bool,
        fuse_norm: bool,
        fuse_attn: bool,
        pdl: bool,
    ) -> Result<()> {
        let gemv = gemv && !self.opts.deterministic;
        let now = (
            self.use_gemv,
            self.fuse_norm,
            self.fuse_attn,
            self.kernels.pdl(),
        );
        if (gemv, fuse_norm, fuse_attn, pdl) != now {
            // Every rank must capture the same graphs: the workers change form too.
            self.peers.decode_form(gemv, fuse_norm, fuse_attn, pdl)?;
            self.wait_stream()?;
            self.graphs.clear();
            self.use_gemv = gemv;
            self.fuse_norm = fuse_norm;
            self.fuse_attn = fuse_attn;
            self.kernels.set_pdl(pdl);
        }
        Ok(())
    }

    /// Timing only: run the layers without their all-reduces (wrong results) on every rank,
    /// to measure what the all-reduces cost (see `bench-one-batch`). Drops the decode graphs.
    pub fn set_skip_all_reduce(&mut self, on: bool) -> Result<()> {
        if on != self.skip_all_reduce {
            self.peers.skip_all_reduce(on)?;
            self.wait_stream()?;
            self.graphs.clear();
            self.skip_all_reduce = on;
        }
        Ok(())
    }

    /// Whether decode passes run attention as one fused kernel.
    pub fn attn_fusion(&self) -> bool {
        self.fuse_attn
    }

    pub fn weight_bytes(&self) -> usize {
        self.w.bytes
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The checkpoint's shapes (every rank's together).
    pub fn config(&self) -> &ModelConfig {
        &self.model_cfg
    }

    /// GPUs this backend runs on (`--tp-size`).
    pub fn tp_size(&self) -> usize {
        self.comm.as_ref().map_or(1, |c| c.size())
    }

    /// The start-up options this backend runs with.
    pub fn options(&self) -> &CudaOptions {
        &self.opts
    }

    /// The GEMM path (cuBLASLt) the layers use, for benchmarks of its rate.
    pub fn gemm_path(&self) -> &Gemm {
        &self.gemm
    }

    /// Whether kernels launch with programmatic dependent launch.
    pub fn pdl(&self) -> bool {
        self.kernels.pdl()
    }

    /// Whether a pass of `tokens` rows runs RMSNorm inside the decode GEMVs.
    pub fn norm_fused_for(&self, tokens: usize) -> bool {
        self.fused_norm(tokens)
    }

    /// Whether the layers' linear weights are FP8.
    pub fn fp8_weights(&self) -> bool {
        self.w.fp8()
    }

    /// Whether the LM head has weights of its own (not tied to the embedding).
    pub fn untied_lm_head(&self) -> bool {
        self.w.lm_head.is_some()
    }

    fn validate(&self, batch: &[SeqInput<'_>]) -> Result<()> {
        for (i, s) in batch.iter().enumerate() {
            if s.tokens.is_empty() {
                return Err(EngineError::Internal(format!(
                    "sequence {i} of the batch has no tokens"
                )));
            }
            if s.kv_slots.len() != s.start_pos + s.tokens.len() {
                return Err(EngineError::Internal(format!(
                    "sequence {i}: {} KV slots for {} positions",
                    s.kv_slots.len(),
                    s.start_pos + s.tokens.len()
                )));
            }
            if let Some(&bad) = s.kv_slots.iter().find(|&&x| x as usize >= self.capacity) {
                return Err(EngineError::Internal(format!(
                    "sequence {i}: KV slot {bad} outside the pool of {}",
                    self.capacity
                )));
            }
            if let Some(&bad) = s
                .tokens
                .iter()
                .find(|&&x| x as usize >= self.cfg.vocab_size)
            {
                return Err(EngineError::bad_request(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    self.cfg.vocab_size
                )));
            }
        }
        Ok(())
    }

    /// Run the batch and sample on the GPU with one temperature for every row (greedy when 0).
    /// Returns one token per sequence with `num_logits` > 0 (used by the benchmarks).
    pub fn forward_sample_all(
        &mut self,
        batch: &[SeqInput<'_>],
        temperature: f32,
    ) -> Result<Vec<u32>> {
        self.validate(batch)?;
        self.begin_sync();
        let rows = self.run(batch)?;
        let params: Vec<SampleInput> = (0..rows.len())
            .map(|i| SampleInput {
                temperature,
                top_p: 1.0,
                top_k: -1,
                min_p: 0.0,
                uniform: (i as f32 * 0.618).fract(),
            })
            .collect();
        self.sample_device(&rows, &params)
    }

    /// A synchronous pass reuses the staging memory (nothing launched is still in flight).
    fn begin_sync(&mut self) {
        if self.outputs_idle() {
            self.staging.flip();
        }
    }
}

impl Backend for CudaBackend {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Vec<f32>> {
        self.validate(batch)?;
        self.begin_sync();
        if let Some((decodes, prompts)) = split_mixed(batch, self.opts.deterministic) {
            let v = self.cfg.vocab_size;
            let mut outs = Vec::with_capacity(2);
            for idx in [&decodes, &prompts] {
                let sub: Vec<SeqInput<'_>> = idx.iter().map(|&i| batch[i]).collect();
                let rows = self.run(&sub)?;
                outs.push(self.logits_to_host(rows)?);
            }
            let rows_of = |i: usize| batch[i].num_logits.min(batch[i].tokens.len()) * v;
            return Ok(merge_groups(
                batch.len(),
                [(&decodes, &outs[0]), (&prompts, &outs[1])],
                rows_of,
            ));
        }
        let n = self.run(batch)?;
        self.logits_to_host(n)
    }

    fn device_sampler(&mut self) -> Option<&mut dyn DeviceSampler> {
        Some(self)
    }

    fn overlap(&mut self) -> Option<&mut dyn Overlap> {
        Some(self)
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn kv_capacity(&self) -> usize {
        self.capacity
    }

    fn describe(&self) -> String {
        format!(
            "cuda ({}{}), {}, {} KV slots, decode GEMV {}{}, fused decode attention {}, PDL {}, cuda graphs {}",
            self.device_name,
            match self.tp_size() {
                1 => String::new(),
                n => format!(" x{n}, tensor parallel"),
            },
            match (self.w.fp8(), self.opts.kv) {
                (false, KvDtype::Bf16) => "bf16",
                (true, KvDtype::Bf16) => "FP8 linear weights (e4m3), bf16 activations and KV cache",
                (false, _) => "bf16, FP8 KV cache",
                (true, _) => "FP8 linear weights (e4m3) and KV cache, bf16 activations",
            },
            self.capacity,
            if self.use_gemv { "on" } else { "off" },
            if self.use_gemv && self.fuse_norm {
                " (RMSNorm fused)"
            } else {
                ""
            },
            if self.fuse_attn { "on" } else { "off" },
            if self.kernels.pdl() { "on" } else { "off" },
            if self.opts.disable_cuda_graph {
                "off".to_string()
            } else {
                format!("up to batch {}", self.opts.cuda_graph_max_bs)
            }
        )
    }
}

impl DeviceSampler for CudaBackend {
    fn forward_sample(
        &mut self,
        batch: &[SeqInput<'_>],
        sampling: DeviceSampling<'_>,
    ) -> Result<Vec<u32>> {
        self.launch_pass(batch, sampling)?;
        self.collect_pass()
    }
}

impl Overlap for CudaBackend {
    fn launch_sample(
        &mut self,
        batch: &[SeqInput<'_>],
        sampling: DeviceSampling<'_>,
    ) -> Result<()> {
        self.launch_pass(batch, sampling)
    }

    fn collect(&mut self) -> Result<Vec<u32>> {
        self.collect_pass()
    }

    fn discard_launched(&mut self) {
        if let Err(e) = self.wait_stream() {
            tracing::error!("CUDA: {e}");
        }
        self.discard_passes();
    }
}

/// Upper bound on decode-attention splits, re-exported for buffer sizing.
pub(crate) const DECODE_SPLITS: usize = MAX_DECODE_SPLITS as usize;
/// Decode attention's splits per sequence under `--enable-deterministic-inference`, for every
/// batch: a sequence of `len` keys is split into parts of `len / 8` (at least one tile), so
/// a batch of one still spreads over 8 x its KV heads blocks.
pub(crate) const DETERMINISTIC_DECODE_SPLITS: u32 = 8;
