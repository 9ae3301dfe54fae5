//! GPU kernel checks: every kernel against a CPU reference on fresh random inputs (seeded from
//! the clock, printed), with outputs poisoned (NaN) before each launch. A `cargo test` target
//! (`cargo test --release -p sgl-kernels --test kernel_check`): without a CUDA driver or a GPU
//! it says why and passes, unless `SGL_REQUIRE_GPU=1`, which makes that a failure (as the NVRTC
//! test does with `SGL_REQUIRE_NVRTC`). Exit code 1 on any failed check.
//!
//! The GPU machine has no cargo: `cargo test --no-run` builds this binary, which the GPU
//! scripts carry as `.dev/gpu/kernel-check` (scripts/gpu/README.md). Run with no argument it
//! prints one line per check and a summary table; `kernel-check fp8` runs the FP8 checks
//! alone, `kernel-check kv` the FP8 KV-pool checks; `kernel-check bench-gemv` (decode GEMV vs
//! cuBLASLt vs copy bandwidth on Llama-3.1-8B shapes), `bench-gemv-fp8` (the FP8-weight GEMV)
//! and `bench-decode` (one batch-1 Llama-3.1-8B decode step in a CUDA graph, PDL on and off,
//! fused and separate norms, against the copy-bandwidth floor of its weights) and
//! `bench-prefill-attn` (causal prefill attention at Llama-3.1-8B's shape, 1024 to 8192 tokens,
//! tp 2's heads and a last row alone, bf16 and FP8 pools, whole query tiles against the split
//! work list) time instead; `kernel-check prefill` runs the prefill attention
//! checks alone.
//! `kernel-check bench-fp8-rows` times the FP8 prefill's row kernels (the fused SiLU-mul and
//! RMSNorm quantizations, the activation quantization, the qkv rescale with RoPE, separate and
//! folded) against the copy bandwidth.
//! Launches use PDL unless `SGL_DISABLE_PDL=1`; the PDL check and bench-decode switch it
//! themselves.

mod attention;
mod bench;
mod bench_gemv;
mod common;
mod decode_step;
mod fp8;
mod fp8_fused;
mod gemm;
mod layers;
mod prefill;
mod sampling;

use attention::*;
use bench::*;
use bench_gemv::*;
use common::*;
use decode_step::*;
use fp8::*;
use fp8_fused::*;
use gemm::*;
use layers::*;
use prefill::*;
use sampling::*;

/// The modes an argument selects (none: every check).
const MODES: &[&str] = &[
    "fp8",
    "kv",
    "prefill",
    "bench-gemv",
    "bench-gemv-fp8",
    "bench-gemm-fp8",
    "bench-decode",
    "bench-fp8-rows",
    "bench-prefill-attn",
];

/// libtest options that `cargo test -- ...` may hand on with a value of their own.
const TEST_OPTIONS_WITH_VALUE: &[&str] = &[
    "--test-threads",
    "--skip",
    "--format",
    "--color",
    "--logfile",
    "-Z",
];

/// The mode the command line asks for: `Ok(None)` for every check, `Err(arg)` for a word that
/// is none of [`MODES`] (a `cargo test` name filter meant for another test).
fn mode() -> Result<Option<String>, String> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a.starts_with('-') {
            if TEST_OPTIONS_WITH_VALUE.contains(&a.as_str()) {
                args.next();
            }
            continue;
        }
        return if MODES.contains(&a.as_str()) {
            Ok(Some(a))
        } else {
            Err(a)
        };
    }
    Ok(None)
}

/// Why the checks cannot run here (no driver library, no GPU), or `None`.
fn no_gpu() -> Option<String> {
    // SAFETY: only tries to open the driver library by its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("no CUDA driver library (libcuda) on this machine".into());
    }
    match std::panic::catch_unwind(CudaContext::device_count) {
        Ok(Ok(0)) => Some("the CUDA driver sees no GPU".into()),
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(format!("the CUDA driver cannot count GPUs: {e}")),
        Err(_) => Some("the CUDA driver library could not be loaded".into()),
    }
}

fn main() -> R<()> {
    let mode = match mode() {
        Ok(m) => m,
        Err(filter) => {
            println!(
                "kernel_check: `{filter}` names no kernel-check mode ({}); nothing run",
                MODES.join(", ")
            );
            return Ok(());
        }
    };
    if let Some(why) = no_gpu() {
        if std::env::var("SGL_REQUIRE_GPU").as_deref() == Ok("1") {
            return Err(format!("SGL_REQUIRE_GPU=1 but {why}").into());
        }
        println!("kernel_check: {why}: the GPU kernel checks were NOT run");
        return Ok(());
    }
    run(mode.as_deref())
}

/// Runs the checks (or the benchmark) `mode` selects; exits with status 1 when a check fails.
fn run(mode: Option<&str>) -> R<()> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    println!("kernel-check seed {seed}");
    let ctx = CudaContext::new(0)?;
    // SAFETY: each stream's buffers are used on that stream only (the decode-step check and
    // bench make their own), so no cross-stream events are needed.
    unsafe { ctx.disable_event_tracking() };
    // a stream of its own, as the engine uses (not the legacy default stream)
    let s = ctx.new_stream()?;
    let t0 = std::time::Instant::now();
    let k = Kernels::load(&ctx)?;
    println!(
        "kernels compiled and loaded in {:.2}s on {}",
        t0.elapsed().as_secs_f64(),
        ctx.name()?
    );
    let gemm = Gemm::new(s.clone())?;
    let gemv_ws = k.gemv_workspace(&s)?;
    let mut c = Ctx {
        s,
        k,
        gemm,
        gemv_ws,
        rng: Rng(seed),
        results: Vec::new(),
    };
    if mode == Some("bench-gemv-fp8") {
        return bench_gemv_fp8(&mut c);
    }
    if mode == Some("bench-gemm-fp8") {
        return bench_gemm_fp8(&mut c);
    }
    if mode == Some("bench-decode") {
        return bench_decode(&mut c);
    }
    if mode == Some("bench-fp8-rows") {
        return bench_fp8_rows(&mut c);
    }
    if mode == Some("bench-prefill-attn") {
        return bench_prefill_attn(&mut c);
    }
    if mode == Some("prefill") {
        check_prefill_all(&mut c)?;
        return summary(&c);
    }
    let only_fp8 = mode == Some("fp8");
    let only_kv = mode == Some("kv");
    // FP8 KV pools: the store, the decode forms and prefill attention on e4m3 and e5m2 bytes
    // (`kv`: these alone)
    if !only_fp8 {
        for kv in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            check_attention(
                &mut c,
                kv,
                &[(128, 32, 8), (64, 16, 2)],
                &[(128, 32, 8), (128, 64, 8), (64, 16, 4)],
                &[&[300], &[2, 17, 33, 300, 1029, 2500, 64, 129]],
            )?;
        }
    }
    let only_fp8 = only_fp8 || only_kv;
    if !only_fp8 {
        check_embedding(&mut c)?;
        check_rmsnorm(&mut c)?;
        check_silu(&mut c)?;
        check_attention(
            &mut c,
            KvDtype::Bf16,
            &[(128, 32, 8), (128, 8, 8), (64, 16, 2), (128, 16, 8)],
            &[
                (128, 32, 8),
                (128, 8, 8),
                (128, 16, 8),
                (128, 16, 2),
                (64, 8, 8),
                (64, 16, 8),
                (64, 16, 4),
                (64, 32, 4),
            ],
            &[
                &[300],
                &[1, 130, 257],
                &[2, 17, 33, 300, 1029, 2500, 64, 129],
            ],
        )?;
        if mode == Some("bench-gemv") {
            return bench_gemv(&mut c);
        }
        check_gemm(&mut c)?;
        check_gemv(&mut c)?;
        check_gemv_rmsnorm(&mut c)?;
    }
    if !only_kv {
        check_fp8(&mut c)?;
        check_fp8_fused(&mut c)?;
    }
    if !only_fp8 {
        check_logit_edits(&mut c)?;
        check_copy_tokens(&mut c)?;
        check_pdl_decode(&mut c)?;
        check_sampling(&mut c)?;
    }
    summary(&c)
}

/// Prints the table of results; exits with status 1 when a check failed.
fn summary(c: &Ctx) -> R<()> {
    println!("\n| kernel check | rel err | tol | result |\n|---|---|---|---|");
    for (n, e, t, ok) in &c.results {
        println!(
            "| {n} | {e:.2e} | {t:.0e} | {} |",
            if *ok { "pass" } else { "FAIL" }
        );
    }
    let failed = c.results.iter().filter(|r| !r.3).count();
    println!("{} checks, {failed} failed", c.results.len());
    if failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}
