//! The composition root: open the model, build the tokenizer and the backend, size the KV
//! cache, start the scheduler thread, and hand back the [`EngineHandle`].

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{EngineHandle, EngineParts, GrammarAvailability, ModelInfo, SchedulerStats};
use crate::backend::{self, LoadOptions};
use crate::config::{DeviceKind, ServerArgs};
use crate::error::{EngineError, Result};
use crate::metrics::Metrics;
use crate::model::config::ModelConfig;
use crate::model::files::ModelFiles;
use crate::model::llama::TensorParallel;
use crate::model::{self, Model};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::tokenizer::Tokenizer;

const CPU_DEFAULT_MAX_RUNNING: usize = 128;

/// Without `--max-running-requests`: 128 on the CPU; on the GPU one running request per 512
/// tokens of the KV cache, at least 256 and at most 1024. A fixed 128 left most of an H100's
/// cache idle on many short requests: 1000 random prompts (in/out up to 1024 tokens, FP8
/// weights and KV cache) ran at 9,688 output tok/s with 256 running and 11,337 with 1024.
fn default_max_running(device: DeviceKind, kv_tokens: usize) -> usize {
    match device {
        DeviceKind::Cpu => CPU_DEFAULT_MAX_RUNNING,
        DeviceKind::Cuda => (kv_tokens / 512).clamp(256, 1024),
    }
}

fn load_tokenizer(args: &ServerArgs, model: &Model) -> Result<Option<Arc<Tokenizer>>> {
    if args.skip_tokenizer_init {
        return Ok(None);
    }
    let tok_err =
        |e: crate::tokenizer::TokenizerError| EngineError::Load(format!("tokenizer: {e}"));
    let mut tok = match (&args.tokenizer_path, &model.files, model.gguf()) {
        (Some(p), _, _) => Tokenizer::from_dir_or_file(p).map_err(tok_err)?,
        (None, _, Some(content)) => Tokenizer::from_gguf(content).map_err(tok_err)?,
        (None, ModelFiles::HfDir(dir), _) => Tokenizer::from_dir_or_file(dir).map_err(tok_err)?,
        (None, ModelFiles::Gguf(p), None) => {
            return Err(EngineError::Load(format!(
                "{}: GGUF header not loaded",
                p.display()
            )));
        }
    };
    if let Some(path) = &args.chat_template {
        let arg = path.to_string_lossy();
        let t = tok.load_chat_template(&arg).map_err(tok_err)?;
        tok.set_chat_template(t);
    }
    Ok(Some(Arc::new(tok)))
}

fn resolve_context_length(args: &ServerArgs, cfg: &ModelConfig) -> Result<usize> {
    match args.context_length {
        Some(c) if c > cfg.max_position_embeddings => Err(EngineError::InvalidArgument(format!(
            "--context-length {c} is longer than the model's {} positions",
            cfg.max_position_embeddings
        ))),
        Some(c) => Ok(c),
        None => Ok(cfg.max_position_embeddings),
    }
}

/// `serve --check`: what [`launch`] checks before it touches a device (flags, the model's
/// config and files, the tokenizer and chat template, the context length against the model,
/// and whether this build and machine can run the chosen device), with no weight read.
/// Returns one line describing what would be served.
pub fn check(mut args: ServerArgs) -> Result<String> {
    args.validate()?;
    args.resolve_device();
    let model = model::load(&args.model_path)?;
    checkpoint_quantization(&mut args, &model)?;
    let tokenizer = load_tokenizer(&args, &model)?;
    let cfg = &model.config;
    let context_length = resolve_context_length(&args, cfg)?;
    let device = args.device();
    check_device_flags(&args, cfg)?;
    if device == DeviceKind::Cuda {
        if !cfg!(feature = "cuda") {
            return Err(backend::BackendError::NotCompiled.into());
        }
        if let ModelFiles::Gguf(_) = model.files {
            return Err(EngineError::InvalidArgument(
                "--device cuda serves Hugging Face folders (safetensors); GGUF files run on --device cpu".into(),
            ));
        }
    }
    let weights = match (model.quant, &args.quantization) {
        (q, _) if q.is_fp8() && device == DeviceKind::Cpu => {
            format!("; weights: {q}, dequantized to f32 on the CPU")
        }
        (q, _) if q.is_fp8() => format!("; weights: {q}"),
        (_, Some(q)) => format!("; weights: {q}, quantized at load"),
        _ => String::new(),
    };
    Ok(format!(
        "{} ({} layers, hidden {}, {} attention / {} KV heads, vocab {}) on {}; context {context_length}{weights}; tokenizer: {}",
        cfg.architecture,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        device.name(),
        match &tokenizer {
            Some(t) => format!("{} tokens", t.vocab_size()),
            None => "skipped (--skip-tokenizer-init)".into(),
        }
    ))
}

/// An FP8 checkpoint is served as FP8 on the GPU (as if `--quantization fp8` were given, which
/// `/get_server_info` then reports) and dequantized to f32 on the CPU. Its KV-cache scales
/// (`kv_cache_scheme`) are applied by an FP8 KV cache (the GPU's weight loader reads them) and
/// unused by a bf16 one.
fn checkpoint_quantization(args: &mut ServerArgs, model: &model::Model) -> Result<()> {
    if !model.quant.is_fp8() {
        return Ok(());
    }
    if args.device() == DeviceKind::Cuda {
        args.quantization.get_or_insert_with(|| "fp8".to_string());
        tracing::info!(
            "the checkpoint's weights are {}: served as FP8",
            model.quant
        );
    } else {
        tracing::info!(
            "the checkpoint's weights are {}: dequantized to f32 for the CPU",
            model.quant
        );
    }
    Ok(())
}

/// `--tp-size` and `--quantization` against the device and the model's shapes.
fn check_device_flags(args: &ServerArgs, cfg: &ModelConfig) -> Result<()> {
    if args.quantization.is_some() && args.device() != DeviceKind::Cuda {
        return Err(EngineError::InvalidArgument(
            crate::config::FP8_ON_CPU.into(),
        ));
    }
    if args.kv_cache_dtype() != crate::backend::KvCacheDtype::Auto
        && args.device() != DeviceKind::Cuda
    {
        return Err(EngineError::InvalidArgument(
            crate::config::FP8_KV_ON_CPU.into(),
        ));
    }
    if args.tp_size == 1 {
        return Ok(());
    }
    if args.device() != DeviceKind::Cuda {
        return Err(EngineError::InvalidArgument(format!(
            "--tp-size {} splits the model across GPUs (--device cuda); the CPU backend runs one rank",
            args.tp_size
        )));
    }
    TensorParallel::check(args.tp_size, cfg).map_err(EngineError::InvalidArgument)
}

/// Load everything and start the scheduler thread.
pub fn launch(mut args: ServerArgs) -> Result<EngineHandle> {
    args.validate()?;
    args.resolve_device();
    let started = Instant::now();
    if let Some(n) = args.num_threads {
        sgl_kernels::cpu::set_num_threads(n);
    }
    tracing::info!("loading model from {}", args.model_path.display());
    let model = model::load(&args.model_path)?;
    checkpoint_quantization(&mut args, &model)?;
    let tokenizer = load_tokenizer(&args, &model)?;
    let cfg = model.config.clone();
    let context_length = resolve_context_length(&args, &cfg)?;
    check_device_flags(&args, &cfg)?;
    let opts = LoadOptions {
        quantization: args.weight_quantization(),
        kv_cache_dtype: args.kv_cache_dtype(),
        max_total_tokens: args.max_total_tokens,
        context_length,
        host_overlap: args.device() == DeviceKind::Cpu && args.enable_overlap_schedule,
        mem_fraction_static: args.mem_fraction_static,
        cuda_graph_max_bs: args.cuda_graph_max_bs,
        disable_cuda_graph: args.disable_cuda_graph,
        disable_custom_all_reduce: args.disable_custom_all_reduce,
        deterministic: args.enable_deterministic_inference,
        tensor_parallel: TensorParallel {
            rank: 0,
            size: args.tp_size,
        },
    };
    let backend = backend::load(args.device(), &model, &opts)?;
    // The weights are on the device now; unmap the checkpoint.
    drop(model);
    let max_total_tokens = backend.kv_capacity();
    if max_total_tokens < 2 {
        return Err(EngineError::InvalidArgument(
            "the KV cache has room for fewer than 2 tokens".into(),
        ));
    }
    let eos_token_ids = tokenizer
        .as_ref()
        .map(|t| t.eos_token_ids().to_vec())
        .unwrap_or_default();
    if let Some(t) = &tokenizer
        && t.vocab_size() > cfg.vocab_size
    {
        tracing::warn!(
            "tokenizer has {} tokens, the model {}",
            t.vocab_size(),
            cfg.vocab_size
        );
    }
    let grammar = grammar_backend(&args, tokenizer.as_deref(), backend.vocab_size());
    let max_running = args
        .max_running_requests
        .unwrap_or_else(|| default_max_running(args.device(), max_total_tokens));
    let model_name = args.model_name();
    let metrics = Arc::new(
        Metrics::new(&model_name).map_err(|e| EngineError::Internal(format!("metrics: {e}")))?,
    );
    let stats = Arc::new(SchedulerStats::default());
    let info = ModelInfo {
        model_path: args.model_path.display().to_string(),
        served_model_name: model_name,
        context_length,
        vocab_size: cfg.vocab_size,
        max_total_tokens,
        max_running_requests: max_running,
        eos_token_ids: eos_token_ids.clone(),
        architecture: cfg.architecture.clone(),
    };
    tracing::info!(
        "model ready in {:.1}s: {} ({} layers, hidden {}, vocab {}), {}; context {context_length}, KV cache {max_total_tokens} tokens",
        started.elapsed().as_secs_f64(),
        info.architecture,
        cfg.num_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        backend.describe()
    );
    let sched_cfg = SchedulerConfig {
        max_running_requests: max_running,
        chunked_prefill_size: args.chunked_prefill(),
        policy: args.schedule_policy,
        context_length,
        eos_token_ids,
        disable_radix_cache: args.disable_radix_cache,
        random_seed: args.random_seed.unwrap_or_else(rand::random),
        log_requests: args.log_requests,
        disable_overlap_schedule: args.disable_overlap_schedule,
        queue_timeout: (args.queue_timeout_secs > 0)
            .then(|| Duration::from_secs(args.queue_timeout_secs)),
        schedule_conservativeness: args.schedule_conservativeness,
    };
    let (tx, rx) = mpsc::channel();
    let scheduler = Scheduler::new(
        backend,
        rx,
        tokenizer.clone(),
        sched_cfg,
        metrics.clone(),
        stats.clone(),
    );
    // Alive before the first request can arrive, so /health is right from the start.
    stats
        .alive
        .store(true, std::sync::atomic::Ordering::Release);
    std::thread::Builder::new()
        .name("scheduler".into())
        .spawn(move || scheduler.run())
        .map_err(|e| EngineError::Internal(format!("cannot start the scheduler thread: {e}")))?;
    Ok(EngineHandle::from_parts(EngineParts {
        tx,
        info,
        tokenizer,
        grammar,
        args,
        metrics,
        stats,
    }))
}

/// The structured-output backend of `--grammar-backend`, built over the tokenizer's
/// vocabulary with masks as wide as the model's logits. Structured output is off (requests
/// that ask for it get a 400 with the reason) without a tokenizer, with `none`, or when the
/// vocabulary cannot be read; the server still serves everything else.
fn grammar_backend(
    args: &ServerArgs,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> GrammarAvailability {
    let Some(tokenizer) = tokenizer else {
        return GrammarAvailability::Off(
            "structured output (json_schema, regex, ebnf, response_format, tool_choice \"required\" or a named function) needs the tokenizer's vocabulary, but this server runs with --skip-tokenizer-init".into(),
        );
    };
    match crate::grammar::build_backend(&args.grammar_backend, tokenizer, vocab_size) {
        Ok(b) => GrammarAvailability::Ready(b),
        Err(e) => {
            if args.grammar_backend != "none" {
                tracing::warn!("structured output is off: {e}");
            }
            GrammarAvailability::Off(e.to_string())
        }
    }
}
