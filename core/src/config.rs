//! Server arguments: SGLang's `launch_server` flags, parsed once and validated once.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::error::EngineError;

/// Waiting-queue ordering, SGLang's `--schedule-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SchedulePolicy {
    /// Longest cached prefix first.
    Lpm,
    /// First come, first served.
    Fcfs,
    /// A fresh random order each time the queue is ordered (seeded by `--random-seed`).
    Random,
    /// Longest output first: the largest `max_new_tokens` first, ties in arrival order.
    Lof,
    /// Requests grouped by their cached prefix in the radix tree, walked depth first with the
    /// subtree holding the most waiting requests first.
    #[value(name = "dfs-weight")]
    DfsWeight,
}

/// Which device runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    /// The `--device` value.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warning,
    Info,
    Debug,
}

impl LogLevel {
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warning => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }
}

/// `sgl-engine serve` flags. Names follow SGLang's `launch_server`.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Model to serve: a GGUF file, a Hugging Face folder (config.json, *.safetensors,
    /// tokenizer.json), or a Hugging Face Hub id: `org/name`, or `org/name/file.gguf` for one
    /// GGUF file of a repository (fetched into the Hub cache first; see `--revision`).
    #[arg(long)]
    pub model_path: PathBuf,
    /// Branch, tag or commit of a Hub model (default: main).
    #[arg(long, env = "HF_REVISION")]
    pub revision: Option<String>,
    /// Tokenizer file or folder (defaults to the model's own).
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Model name reported by the API (defaults to the model file or folder name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Maximum tokens per request (prompt + output); defaults to the model's own limit.
    #[arg(long)]
    pub context_length: Option<usize>,
    /// A Jinja chat template file that replaces the model's own.
    #[arg(long)]
    pub chat_template: Option<PathBuf>,
    /// Require `Authorization: Bearer <key>` on every route except /health.
    #[arg(long, env = "SGLANG_API_KEY")]
    pub api_key: Option<String>,
    /// Most requests decoding at once.
    #[arg(long)]
    pub max_running_requests: Option<usize>,
    /// Size of the KV cache in tokens.
    #[arg(long)]
    pub max_total_tokens: Option<usize>,
    /// Most prompt tokens prefilled in one step (-1 disables chunking); default 512 on the
    /// CPU, 8192 on the GPU (set when the device is resolved).
    #[arg(long, allow_negative_numbers = true)]
    pub chunked_prefill_size: Option<i64>,
    #[arg(long, value_enum, default_value = "lpm")]
    pub schedule_policy: SchedulePolicy,
    /// How much room admission keeps for the running requests' future output: it scales the
    /// estimated share of `max_new_tokens` they will use (0.7 at first, falling to 0.1 as
    /// decoding goes on, SGLang's defaults); larger retracts fewer requests on a full KV cache,
    /// smaller admits more at once; 0 admits whatever prompt fits now.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub schedule_conservativeness: f64,
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long)]
    pub enable_metrics: bool,
    /// Report cached prompt tokens in OpenAI `usage.prompt_tokens_details`.
    #[arg(long)]
    pub enable_cache_report: bool,
    #[arg(long)]
    pub random_seed: Option<u64>,
    #[arg(long, value_enum, default_value = "info")]
    pub log_level: LogLevel,
    /// Log every request's input and output.
    #[arg(long)]
    pub log_requests: bool,
    /// Take and return token ids only (no tokenizer is loaded).
    #[arg(long)]
    pub skip_tokenizer_init: bool,
    /// Device to run on. Without it: the GPU when this build has CUDA and a GPU is visible,
    /// else the CPU (see [`ServerArgs::resolve_device`]).
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// CPU threads for the model (default: all cores).
    #[arg(long)]
    pub num_threads: Option<usize>,
    /// Most requests waiting to start before new ones get 429. Without it the bound follows
    /// the KV cache: waiting prompts may hold up to twice its tokens, and at most
    /// 4 × --max-running-requests requests (64 at least) wait.
    #[arg(long)]
    pub max_queued_requests: Option<usize>,
    /// A request that has not started after waiting this long gets 503 with `Retry-After`
    /// (0: no limit).
    #[arg(long, default_value_t = 60)]
    pub queue_timeout_secs: u64,
    /// Fraction of free GPU memory for weights and KV cache (CUDA).
    #[arg(long, default_value_t = 0.88)]
    pub mem_fraction_static: f32,
    /// Tensor parallel size (GPUs per engine: 1, 2, 4 or 8 of one node; CUDA only).
    #[arg(long, default_value_t = 1)]
    pub tp_size: usize,
    /// Tensor parallelism: every all-reduce through NCCL (no one-shot kernel over peer memory
    /// for the small decode messages).
    #[arg(long)]
    pub disable_custom_all_reduce: bool,
    /// Greedy output independent of the batch (SGLang's flag). The CPU is batch-invariant
    /// always; on the GPU this takes one cuBLASLt algorithm for every batch size (no split-k,
    /// no GEMV), a fixed split count in decode attention and, under tensor parallelism, the
    /// rank-ordered one-shot all-reduce for every message, and a prompt's last token in the
    /// prefill kernel also when the rest of the prompt is cached, at a cost in speed.
    #[arg(long)]
    pub enable_deterministic_inference: bool,
    /// Address of rank 0 for multi-node tensor parallelism (not supported yet: refused).
    #[arg(long)]
    pub dist_init_addr: Option<String>,
    /// Nodes of a multi-node tensor-parallel engine (only 1 is supported).
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This node's index in a multi-node engine (only 0 is supported).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Data parallel size (engine replicas; run several engines behind the router).
    #[arg(long, default_value_t = 1)]
    pub dp_size: usize,
    /// Weight quantization: `fp8` quantizes the linear layers of a bf16/f16/f32 checkpoint to
    /// FP8 (e4m3, one scale per output channel) at load, on the GPU. GGUF files carry their own.
    #[arg(long)]
    pub quantization: Option<String>,
    /// KV cache data type: auto (the backend's own: bf16 on the GPU, f32 on the CPU), or
    /// fp8_e4m3 / fp8_e5m2 (one byte per element, no scale; --device cuda): twice the tokens in
    /// the same memory.
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Structured-output backend.
    #[arg(long, default_value = "llguidance")]
    pub grammar_backend: String,
    /// Format of tool calls in the model's output, for OpenAI `tools` and /function_call:
    /// llama3, mistral or qwen25 (as SGLang names them). Without it, tool calls stay text.
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<crate::tool_parser::ToolParserKind>,
    /// Largest decode batch captured in a CUDA graph.
    #[arg(long, default_value_t = 160)]
    pub cuda_graph_max_bs: usize,
    #[arg(long)]
    pub disable_cuda_graph: bool,
    /// Process each step's tokens before launching the next step. By default a backend whose
    /// passes run asynchronously (CUDA) launches step N+1 before processing step N's tokens.
    #[arg(long, conflicts_with = "enable_overlap_schedule")]
    pub disable_overlap_schedule: bool,
    /// Use the overlap schedule on the CPU backend too. Its passes are synchronous, so this
    /// gains nothing there; it exercises the same scheduling as on a GPU.
    #[arg(long)]
    pub enable_overlap_schedule: bool,
    /// Validate the flags, the model's config, tokenizer and chat template without loading
    /// weights, print what would be served, and exit (0 when it would start).
    #[arg(long)]
    pub check: bool,
}

/// `--chunked-prefill-size` when not given: 512 tokens on the CPU (a step stays short next to
/// running decodes), 8192 on the GPU, as SGLang uses on large GPUs (a 512-token chunk leaves
/// an H100's GEMMs short of work and takes a thousand-token prompt two steps).
pub fn default_chunked_prefill(device: DeviceKind) -> i64 {
    match device {
        DeviceKind::Cpu => 512,
        DeviceKind::Cuda => 8192,
    }
}

/// Why `--quantization fp8` is refused on the CPU.
pub const FP8_KV_ON_CPU: &str = "--kv-cache-dtype fp8_e4m3 and fp8_e5m2 run on the GPU (--device cuda); the CPU backend keeps its KV cache in f32 (--kv-cache-dtype auto)";
pub const FP8_ON_CPU: &str = "--quantization fp8 runs on the GPU (--device cuda); the CPU backend serves the checkpoint's own format (bf16, f16, f32) or a GGUF file's quantization";

impl ServerArgs {
    /// Checks that do not need the model; model-dependent limits are checked at load.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::InvalidArgument(m));
        if !self.model_path.exists()
            && crate::model::hub::RepoRef::from_model_path(&self.model_path).is_none()
        {
            return bad(format!(
                "--model-path {} does not exist (a GGUF file, a Hugging Face model folder, or a Hub id org/name)",
                self.model_path.display()
            ));
        }
        if let Some(r) = &self.revision
            && (r.is_empty() || r.split('/').any(|p| p.is_empty() || p == "." || p == ".."))
        {
            return bad(format!(
                "--revision {r:?} is not a branch, tag or commit name"
            ));
        }
        if let Some(p) = &self.chat_template
            && !p.is_file()
        {
            return bad(format!(
                "--chat-template {} is not a readable file",
                p.display()
            ));
        }
        if self.max_running_requests == Some(0) {
            return bad("--max-running-requests must be at least 1".into());
        }
        if let Some(n) = self.max_total_tokens
            && n < 16
        {
            return bad(format!("--max-total-tokens {n} is too small (at least 16)"));
        }
        if self.chunked_prefill_size.is_some_and(|n| n == 0 || n < -1) {
            return bad(
                "--chunked-prefill-size must be positive, or -1 to disable chunking".into(),
            );
        }
        if self.context_length == Some(0) {
            return bad("--context-length must be positive".into());
        }
        if !self.schedule_conservativeness.is_finite() || self.schedule_conservativeness < 0.0 {
            return bad(format!(
                "--schedule-conservativeness must be a number >= 0, not {}",
                self.schedule_conservativeness
            ));
        }
        if !(0.0..=1.0).contains(&self.mem_fraction_static) || self.mem_fraction_static == 0.0 {
            return bad("--mem-fraction-static must be in (0, 1]".into());
        }
        if self.tp_size == 0 || !self.tp_size.is_power_of_two() || self.tp_size > 8 {
            return bad(format!(
                "--tp-size {} is not supported: expected 1, 2, 4 or 8 (GPUs of one node)",
                self.tp_size
            ));
        }
        if self.tp_size > 1 && self.device == Some(DeviceKind::Cpu) {
            return bad(format!(
                "--tp-size {} splits the model across GPUs (--device cuda); the CPU backend runs one rank",
                self.tp_size
            ));
        }
        if self.nnodes != 1 || self.node_rank != 0 || self.dist_init_addr.is_some() {
            return bad(format!(
                "multi-node tensor parallelism (--nnodes {}, --node-rank {}, --dist-init-addr) is not supported yet: one engine spans the GPUs of one node (--tp-size up to 8); run more engines behind sgl-router to use more nodes",
                self.nnodes, self.node_rank
            ));
        }
        if self.num_threads == Some(0) {
            return bad("--num-threads must be at least 1".into());
        }
        match self.grammar_backend.as_str() {
            "llguidance" | "outlines" | "xgrammar" | "none" => {}
            other => {
                return bad(format!(
                    "--grammar-backend {other} is unknown (llguidance, outlines, xgrammar, none)"
                ));
            }
        }
        match self.kv_cache_dtype.as_str() {
            "auto" | "bf16" | "fp16" | "fp32" | "fp8_e4m3" | "fp8_e5m2" => {}
            other => {
                return bad(format!(
                    "--kv-cache-dtype {other} is not supported (auto, fp8_e4m3, fp8_e5m2)"
                ));
            }
        }
        if self.kv_cache_dtype() != crate::backend::KvCacheDtype::Auto
            && self.device == Some(DeviceKind::Cpu)
        {
            return bad(FP8_KV_ON_CPU.into());
        }
        match self.quantization.as_deref() {
            None | Some("fp8") => {}
            Some(q) => {
                return bad(format!(
                    "--quantization {q} is not supported: fp8 (weights quantized at load, --device cuda); serve a GGUF file for other quantized weights"
                ));
            }
        }
        if self.quantization.is_some() && self.device == Some(DeviceKind::Cpu) {
            return bad(FP8_ON_CPU.into());
        }
        Ok(())
    }

    /// The KV cache's element type `--kv-cache-dtype` asks for (bf16, fp16 and fp32 name the
    /// backend's own, as auto does).
    pub fn kv_cache_dtype(&self) -> crate::backend::KvCacheDtype {
        match self.kv_cache_dtype.as_str() {
            "fp8_e4m3" => crate::backend::KvCacheDtype::Fp8E4m3,
            "fp8_e5m2" => crate::backend::KvCacheDtype::Fp8E5m2,
            _ => crate::backend::KvCacheDtype::Auto,
        }
    }

    /// The form `--quantization` asks the backend to store weights in.
    pub fn weight_quantization(&self) -> crate::model::Quantization {
        match self.quantization.as_deref() {
            Some("fp8") => crate::model::Quantization::Fp8,
            _ => crate::model::Quantization::AsStored,
        }
    }

    /// The device this server runs on: `--device`, or what [`ServerArgs::resolve_device`]
    /// found. The CPU until resolved.
    pub fn device(&self) -> DeviceKind {
        self.device.unwrap_or(DeviceKind::Cpu)
    }

    /// Without `--device`: the GPU when this build has CUDA and the driver sees a GPU, else
    /// the CPU, with a log line saying which and why (as SGLang picks its default device).
    pub fn resolve_device(&mut self) {
        if self.device.is_none() {
            let (device, why) = crate::backend::detect_device();
            tracing::info!("device: {} ({why}; --device overrides)", device.name());
            self.device = Some(device);
        }
        // Defaults that depend on the device, written out so /get_server_info shows them.
        self.chunked_prefill_size
            .get_or_insert(default_chunked_prefill(self.device()));
    }

    /// Name reported by /v1/models and in metrics labels.
    pub fn model_name(&self) -> String {
        if let Some(n) = &self.served_model_name {
            return n.clone();
        }
        self.model_path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "default".into())
    }

    pub fn chunked_prefill(&self) -> Option<usize> {
        let n = self
            .chunked_prefill_size
            .unwrap_or(default_chunked_prefill(self.device()));
        (n > 0).then_some(n as usize)
    }
}
