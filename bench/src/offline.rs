//! `bench-offline-throughput --model PATH ...`: SGLang's bench_offline_throughput through the
//! real engine in process (`sgl_core::engine::launch`, every request submitted at once,
//! streams read to the end), on the GPU by default or on the CPU with `--device cpu`; see
//! [`offline_engine`] for the flags. Prints one JSON line and tables: output and total tok/s,
//! the radix cache hit rate from the engine's counters, wall time, and where the engine's
//! time went (its forward passes by kind, the time with none running, a timeline; see
//! [`print_passes`]). With `--backend-loop` (GPU only) the benchmark runs its own batching
//! loop on the backend instead (`gpu::offline`).

use std::path::Path;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;
use sgl_core::error::{EngineError, Result};
use sgl_core::scheduler::{PassKindStats, PassStats, TimelineRow};

use crate::args::{arg, arg_usize, random_tokens};

/// Timeline rows of this many seconds unless `--timeline-secs` says otherwise.
const TIMELINE_SECS: usize = 5;

/// Runs `bench-offline-throughput` through the engine.
pub fn run(args: &[String]) -> Result<()> {
    offline_engine(args).map(|_| ())
}

/// Bench flags of `offline` (through the engine) that take a value; every other flag goes to
/// the engine as a `serve` flag (`--disable-radix-cache`, `--max-running-requests`, ...).
const ENGINE_BENCH_FLAGS: &[&str] = &[
    "--model",
    "--dataset-name",
    "--num-prompts",
    "--random-input-len",
    "--random-output-len",
    "--random-range-ratio",
    "--gsp-num-groups",
    "--gsp-prompts-per-group",
    "--gsp-system-prompt-len",
    "--gsp-question-len",
    "--gsp-output-len",
    "--seed",
    "--warmup-requests",
    "--timeline-secs",
];

#[derive(clap::Parser)]
struct ServeFlags {
    #[command(flatten)]
    server: sgl_core::config::ServerArgs,
}

/// One benchmark request: prompt token ids and output length.
struct BenchReq {
    prompt: Vec<u32>,
    out_len: usize,
}

/// SGLang's `random` dataset on token ids: lengths uniform in
/// [max(1, len * range_ratio), len], ids uniform over the vocabulary.
fn dataset_random(
    rng: &mut rand::rngs::StdRng,
    n: usize,
    in_len: usize,
    out_len: usize,
    ratio: f64,
    vocab: usize,
) -> Vec<BenchReq> {
    let lo = |len: usize| ((len as f64 * ratio) as usize).clamp(1, len.max(1));
    (0..n)
        .map(|_| {
            let il = rng.random_range(lo(in_len)..=in_len.max(1));
            let ol = rng.random_range(lo(out_len)..=out_len.max(1));
            BenchReq {
                prompt: random_tokens(rng, il, vocab),
                out_len: ol,
            }
        })
        .collect()
}

/// SGLang's `generated-shared-prefix` dataset: `groups` random system prompts, each followed
/// by `per_group` random questions; fixed output length; requests shuffled.
fn dataset_gsp(
    rng: &mut rand::rngs::StdRng,
    groups: usize,
    per_group: usize,
    system_len: usize,
    question_len: usize,
    out_len: usize,
    vocab: usize,
) -> Vec<BenchReq> {
    let mut v = Vec::with_capacity(groups * per_group);
    for _ in 0..groups {
        let system = random_tokens(rng, system_len, vocab);
        for _ in 0..per_group {
            let mut prompt = system.clone();
            prompt.extend(random_tokens(rng, question_len, vocab));
            v.push(BenchReq { prompt, out_len });
        }
    }
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
    v
}

#[derive(Debug, Serialize)]
pub struct EngineOfflineReport {
    pub backend: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub radix_cache: bool,
    pub max_running_requests: usize,
    pub chunked_prefill_size: i64,
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub seconds: f64,
    pub request_throughput: f64,
    pub output_tok_s: f64,
    pub total_tok_s: f64,
    /// Cached prompt tokens / prompt tokens over the run, from the engine's counters.
    pub cache_hit_rate: f64,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub failed: usize,
    /// Where the engine's time went during the run (`None` if the scheduler did not answer).
    pub passes: Option<PassReport>,
}

/// The engine's forward passes over the measured run, with the timeline in rows of
/// `timeline_secs`.
#[derive(Debug, Serialize)]
pub struct PassReport {
    #[serde(flatten)]
    pub stats: PassStats,
    pub timeline_secs: f64,
    pub timeline: Vec<TimelineRow>,
}

/// What one request's stream delivered.
struct Outcome {
    tokens: usize,
    ttft: Option<f64>,
    error: Option<String>,
}

/// Submit every request at once and read all streams to the end.
fn run_requests(
    rt: &tokio::runtime::Runtime,
    engine: &sgl_core::engine::EngineHandle,
    reqs: &[BenchReq],
    tag: &str,
) -> Result<(Vec<Outcome>, f64)> {
    use sgl_core::request::{GenerateRequest, SamplingParams, StreamEvent};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let req = GenerateRequest {
            rid: format!("{tag}-{i}"),
            input_ids: r.prompt.clone(),
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: r.out_len,
                ignore_eos: true,
                ..SamplingParams::default()
            },
            detokenize: false,
            logprobs: None,
        };
        let mut stream = engine.submit(req)?;
        tasks.push(rt.spawn(async move {
            let mut o = Outcome {
                tokens: 0,
                ttft: None,
                error: None,
            };
            while let Some(ev) = stream.next().await {
                match ev {
                    StreamEvent::Tokens { ids, .. } => {
                        if o.ttft.is_none() && !ids.is_empty() {
                            o.ttft = Some(t0.elapsed().as_secs_f64());
                        }
                        o.tokens += ids.len();
                    }
                    StreamEvent::Error { message } => o.error = Some(message),
                    StreamEvent::Finished { .. } | StreamEvent::PromptLogprobs { .. } => {}
                }
            }
            o
        }));
    }
    let total = tasks.len();
    let done = Arc::new(AtomicUsize::new(0));
    let progress = {
        let done = done.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(20)).await;
                eprintln!(
                    "progress: {:.0}s, {} of {total} requests finished (counted in submission order)",
                    t0.elapsed().as_secs_f64(),
                    done.load(Ordering::Relaxed)
                );
            }
        })
    };
    let outcomes = rt.block_on(async {
        let mut v = Vec::with_capacity(tasks.len());
        for t in tasks {
            v.push(t.await.unwrap_or(Outcome {
                tokens: 0,
                ttft: None,
                error: Some("reader task failed".into()),
            }));
            done.fetch_add(1, Ordering::Relaxed);
        }
        v
    });
    progress.abort();
    Ok((outcomes, t0.elapsed().as_secs_f64()))
}

/// `offline` through the real engine, in process (SGLang's bench_offline_throughput flags):
///
/// - `--dataset-name random` (default): `--num-prompts N` (1000), `--random-input-len` (1024),
///   `--random-output-len` (1024), `--random-range-ratio` (0.0: lengths uniform in 1..=len).
/// - `--dataset-name generated-shared-prefix`: `--gsp-num-groups` (64),
///   `--gsp-prompts-per-group` (16), `--gsp-system-prompt-len` (2048), `--gsp-question-len`
///   (128), `--gsp-output-len` (256).
/// - `--seed S` (1), `--warmup-requests N` (16: short requests run first, then the radix cache
///   is flushed and the counters read as the baseline, and the pass statistics restart).
/// - `--timeline-secs N` (5): the width of the timeline's rows.
///
/// Any other flag is a `serve` flag (`--device cpu`, `--disable-radix-cache`,
/// `--max-running-requests`, `--chunked-prefill-size`, `--cuda-graph-max-bs`,
/// `--mem-fraction-static`, ...), the engine's defaults otherwise. The engine runs on
/// `--device cuda` unless the flags name another, with `--skip-tokenizer-init` (token ids in,
/// token ids out). Greedy, ignore_eos, like SGLang's benchmark.
pub fn offline_engine(args: &[String]) -> Result<EngineOfflineReport> {
    use clap::Parser;
    use std::sync::atomic::Ordering;
    let model = arg(args, "--model")
        .ok_or_else(|| EngineError::InvalidArgument("--model PATH is required".into()))?;
    let seed = arg_usize(args, "--seed", 1)? as u64;
    let timeline_secs = arg_usize(args, "--timeline-secs", TIMELINE_SECS)?.max(1) as f64;
    let mut serve: Vec<String> = vec![
        "bench".into(),
        "--model-path".into(),
        model.into(),
        "--skip-tokenizer-init".into(),
    ];
    if arg(args, "--device").is_none() {
        if !cfg!(feature = "cuda") {
            return Err(EngineError::InvalidArgument(
                "this sgl-bench was built without CUDA support: rebuild with `--features cuda`, \
                 or pass `--device cpu`"
                    .into(),
            ));
        }
        serve.extend(["--device".to_string(), "cuda".to_string()]);
    }
    let mut i = 0;
    while i < args.len() {
        if ENGINE_BENCH_FLAGS.contains(&args[i].as_str()) {
            i += 2;
        } else {
            serve.push(args[i].clone());
            i += 1;
        }
    }
    fn has(v: &[String], f: &str) -> bool {
        v.iter().any(|a| a == f)
    }
    if !has(&serve, "--random-seed") {
        serve.extend(["--random-seed".to_string(), seed.to_string()]);
    }
    let dataset = arg(args, "--dataset-name").unwrap_or("random").to_string();
    // The vocabulary from the model's header (a GGUF file or a Hugging Face folder's config),
    // without its weights.
    let v = sgl_core::model::load(Path::new(model))?.config.vocab_size;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let reqs = match dataset.as_str() {
        "random" => {
            let ratio: f64 = arg(args, "--random-range-ratio")
                .map(|r| r.parse())
                .transpose()
                .map_err(|_| {
                    EngineError::InvalidArgument("--random-range-ratio expects a number".into())
                })?
                .unwrap_or(0.0);
            dataset_random(
                &mut rng,
                arg_usize(args, "--num-prompts", 1000)?,
                arg_usize(args, "--random-input-len", 1024)?,
                arg_usize(args, "--random-output-len", 1024)?,
                ratio,
                v,
            )
        }
        "generated-shared-prefix" => dataset_gsp(
            &mut rng,
            arg_usize(args, "--gsp-num-groups", 64)?,
            arg_usize(args, "--gsp-prompts-per-group", 16)?,
            arg_usize(args, "--gsp-system-prompt-len", 2048)?,
            arg_usize(args, "--gsp-question-len", 128)?,
            arg_usize(args, "--gsp-output-len", 256)?,
            v,
        ),
        other => {
            return Err(EngineError::InvalidArgument(format!(
                "--dataset-name {other}: random or generated-shared-prefix"
            )));
        }
    };
    // Every prompt is submitted at once and waits its turn: no admission bound or queue
    // deadline unless the flags ask for one.
    if !has(&serve, "--max-queued-requests") {
        serve.extend([
            "--max-queued-requests".to_string(),
            (reqs.len() + 64).to_string(),
        ]);
    }
    if !has(&serve, "--queue-timeout-secs") {
        serve.extend(["--queue-timeout-secs".to_string(), "0".to_string()]);
    }
    let flags = ServeFlags::try_parse_from(&serve)
        .map_err(|e| EngineError::InvalidArgument(format!("engine flags: {e}")))?
        .server;
    let radix = !flags.disable_radix_cache;
    let engine = sgl_core::engine::launch(flags)?;
    let max_running = engine.info().max_running_requests;
    let chunk = engine.args().chunked_prefill_size.unwrap_or(-1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| EngineError::Internal(format!("tokio runtime: {e}")))?;

    let warm = arg_usize(args, "--warmup-requests", 16)?;
    if warm > 0 {
        let w = dataset_random(&mut rng, warm, 256, 32, 0.5, v);
        let (o, secs) = run_requests(&rt, &engine, &w, "warmup")?;
        if let Some(e) = o.iter().find_map(|o| o.error.clone()) {
            return Err(EngineError::Internal(format!(
                "warm-up request failed: {e}"
            )));
        }
        eprintln!("warm-up: {warm} requests in {secs:.1}s");
        if !rt.block_on(engine.flush_cache()) {
            eprintln!("warning: the radix cache could not be flushed after the warm-up");
        }
    }
    let stats = engine.stats();
    let prompt0 = stats.total_prompt_tokens.load(Ordering::Relaxed);
    let cached0 = stats.total_cached_tokens.load(Ordering::Relaxed);
    // The pass statistics of the run alone: the warm-up's and the engine's start are dropped.
    rt.block_on(engine.take_pass_stats());
    let (outcomes, secs) = run_requests(&rt, &engine, &reqs, "bench")?;
    let passes = rt.block_on(engine.pass_stats()).map(|stats| PassReport {
        timeline: stats.timeline(timeline_secs),
        timeline_secs,
        stats,
    });
    let prompt = stats.total_prompt_tokens.load(Ordering::Relaxed) - prompt0;
    let cached = stats.total_cached_tokens.load(Ordering::Relaxed) - cached0;
    let failed = outcomes.iter().filter(|o| o.error.is_some()).count();
    if let Some(e) = outcomes.iter().find_map(|o| o.error.as_ref()) {
        eprintln!("{failed} requests failed; first error: {e}");
    }
    let input_tokens: usize = reqs.iter().map(|r| r.prompt.len()).sum();
    let output_tokens: usize = outcomes.iter().map(|o| o.tokens).sum();
    let mut ttfts: Vec<f64> = outcomes.iter().filter_map(|o| o.ttft).collect();
    ttfts.sort_by(f64::total_cmp);
    let mean_ttft = ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64;
    let median_ttft = ttfts.get(ttfts.len() / 2).copied().unwrap_or(0.0);
    let r = EngineOfflineReport {
        backend: "engine".into(),
        dataset,
        num_prompts: reqs.len(),
        radix_cache: radix,
        max_running_requests: max_running,
        chunked_prefill_size: chunk,
        input_tokens,
        output_tokens,
        seconds: secs,
        request_throughput: reqs.len() as f64 / secs,
        output_tok_s: output_tokens as f64 / secs,
        total_tok_s: (input_tokens + output_tokens) as f64 / secs,
        cache_hit_rate: cached as f64 / (prompt as f64).max(1.0),
        mean_ttft_ms: mean_ttft * 1e3,
        median_ttft_ms: median_ttft * 1e3,
        failed,
        passes,
    };
    println!("{}", serde_json::to_string(&r).unwrap_or_default());
    println!(
        "| dataset | prompts | radix cache | input tok | output tok | s | req/s | output tok/s | total tok/s | cache hit | mean TTFT ms | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {:.1} | {:.2} | {:.0} | {:.0} | {:.1}% | {:.0} | {} |",
        r.dataset,
        r.num_prompts,
        if r.radix_cache { "on" } else { "off" },
        r.input_tokens,
        r.output_tokens,
        r.seconds,
        r.request_throughput,
        r.output_tok_s,
        r.total_tok_s,
        100.0 * r.cache_hit_rate,
        r.mean_ttft_ms,
        r.failed
    );
    match &r.passes {
        Some(p) => print_passes(p),
        None => eprintln!("warning: the engine did not report its pass statistics"),
    }
    Ok(r)
}

/// The pass statistics as tables: passes by kind, the window's time split, the timeline.
fn print_passes(p: &PassReport) {
    let s = &p.stats;
    let wall = s.wall_secs.max(1e-9);
    println!(
        "Forward passes over {:.1} s (a pass's time runs from the later of its launch and the \
         previous pass's completion to its own completion: under the overlap schedule, the time \
         between successive completions)",
        s.wall_secs
    );
    println!(
        "| pass kind | passes | overlapped | s | % of wall | decode seqs/pass | prefill tok | prefill tok/pass | sampled tok | mean ms | p50 ms | p90 ms | max ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, k) in [
        ("decode only", &s.decode),
        ("prefill only", &s.prefill),
        ("mixed", &s.mixed),
    ] {
        print_kind(name, k, wall);
    }
    let passes = s.passes();
    println!(
        "| all passes | {passes} | {} | {:.2} | {:.1}% | {:.1} | {} | {:.0} | {} | {:.2} | | | |",
        s.decode.overlapped + s.prefill.overlapped + s.mixed.overlapped,
        s.busy_secs,
        100.0 * s.busy_secs / wall,
        s.decode_seqs() as f64 / passes.max(1) as f64,
        s.prefill_tokens(),
        s.prefill_tokens() as f64 / passes.max(1) as f64,
        s.sampled_tokens(),
        1e3 * s.busy_secs / passes.max(1) as f64,
    );
    println!("| scheduler time | s | % of wall |");
    println!("|---|---|---|");
    for (name, secs) in [
        ("in passes", s.busy_secs),
        ("no pass running: host work between passes", s.gap_secs),
        ("no pass running: idle, no request", s.idle_secs),
        ("wall (the run's window)", s.wall_secs),
    ] {
        println!("| {name} | {secs:.2} | {:.1}% |", 100.0 * secs / wall);
    }
    println!(
        "| timeline s | passes | busy | running | queued | decode batch | prefill tok/s | output tok/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in &p.timeline {
        println!(
            "| {:.1}-{:.1} | {} | {:.0}% | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} |",
            row.start_secs,
            row.start_secs + row.secs,
            row.passes,
            100.0 * row.busy,
            row.mean_running,
            row.mean_queued,
            row.mean_decode_batch,
            row.prefill_tok_s,
            row.output_tok_s
        );
    }
}

fn print_kind(name: &str, k: &PassKindStats, wall: f64) {
    println!(
        "| {name} | {} | {} | {:.2} | {:.1}% | {:.1} | {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
        k.passes,
        k.overlapped,
        k.secs,
        100.0 * k.secs / wall,
        k.mean_decode_seqs,
        k.prefill_tokens,
        k.prefill_tokens as f64 / k.passes.max(1) as f64,
        k.sampled_tokens,
        k.mean_ms,
        k.p50_ms,
        k.p90_ms,
        k.max_ms
    );
}
