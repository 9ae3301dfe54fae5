//! The CUDA C++ source of every kernel, and its compilation by NVRTC.

use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use crate::{KernelError, Result};

/// All kernels as one translation unit (NVRTC gets no include path: the helpers come first).
pub const SOURCE: &str = concat!(
    include_str!("cu/common.cuh"),
    include_str!("cu/fp8.cu"),
    include_str!("cu/kv.cuh"),
    include_str!("cu/elementwise.cu"),
    include_str!("cu/decode_attn.cu"),
    include_str!("cu/prefill_attn.cu"),
    include_str!("cu/decode_attn_tc.cu"),
    include_str!("cu/sampling.cu"),
    include_str!("cu/gemv.cu"),
    include_str!("cu/allreduce.cu"),
);

/// Every `extern "C"` entry point in [`SOURCE`].
pub const KERNEL_NAMES: &[&str] = &[
    "embedding_gather_bf16",
    "add_rmsnorm_bf16",
    "rope_kv_store_bf16",
    "rope_kv_store_rescale_bf16",
    "silu_mul_bf16",
    "gather_rows_bf16",
    "copy_tokens_i32",
    "decode_attn_d64_g1",
    "decode_attn_d64_g2",
    "decode_attn_d64_g4",
    "decode_attn_d64_g8",
    "decode_attn_d128_g1",
    "decode_attn_d128_g2",
    "decode_attn_d128_g4",
    "decode_attn_d128_g8",
    "decode_attn_merged_d64_g1",
    "decode_attn_merged_d64_g2",
    "decode_attn_merged_d64_g4",
    "decode_attn_merged_d64_g8",
    "decode_attn_merged_d128_g1",
    "decode_attn_merged_d128_g2",
    "decode_attn_merged_d128_g4",
    "decode_attn_merged_d128_g8",
    "decode_attn_rope_d64_g1",
    "decode_attn_rope_d64_g2",
    "decode_attn_rope_d64_g4",
    "decode_attn_rope_d64_g8",
    "decode_attn_rope_d128_g1",
    "decode_attn_rope_d128_g2",
    "decode_attn_rope_d128_g4",
    "decode_attn_rope_d128_g8",
    "attn_merge_splits",
    "prefill_attn_d64",
    "prefill_attn_d128",
    "rope_kv_store_e4m3",
    "rope_kv_store_rescale_e4m3",
    "decode_attn_d64_g1_e4m3",
    "decode_attn_d64_g2_e4m3",
    "decode_attn_d64_g4_e4m3",
    "decode_attn_d64_g8_e4m3",
    "decode_attn_d128_g1_e4m3",
    "decode_attn_d128_g2_e4m3",
    "decode_attn_d128_g4_e4m3",
    "decode_attn_d128_g8_e4m3",
    "decode_attn_merged_d64_g1_e4m3",
    "decode_attn_merged_d64_g2_e4m3",
    "decode_attn_merged_d64_g4_e4m3",
    "decode_attn_merged_d64_g8_e4m3",
    "decode_attn_merged_d128_g1_e4m3",
    "decode_attn_merged_d128_g2_e4m3",
    "decode_attn_merged_d128_g4_e4m3",
    "decode_attn_merged_d128_g8_e4m3",
    "decode_attn_rope_d64_g1_e4m3",
    "decode_attn_rope_d64_g2_e4m3",
    "decode_attn_rope_d64_g4_e4m3",
    "decode_attn_rope_d64_g8_e4m3",
    "decode_attn_rope_d128_g1_e4m3",
    "decode_attn_rope_d128_g2_e4m3",
    "decode_attn_rope_d128_g4_e4m3",
    "decode_attn_rope_d128_g8_e4m3",
    "prefill_attn_d64_e4m3",
    "prefill_attn_d128_e4m3",
    "prefill_attn_d64_e4m3_h2",
    "prefill_attn_d128_e4m3_h2",
    "rope_kv_store_e5m2",
    "rope_kv_store_rescale_e5m2",
    "decode_attn_d64_g1_e5m2",
    "decode_attn_d64_g2_e5m2",
    "decode_attn_d64_g4_e5m2",
    "decode_attn_d64_g8_e5m2",
    "decode_attn_d128_g1_e5m2",
    "decode_attn_d128_g2_e5m2",
    "decode_attn_d128_g4_e5m2",
    "decode_attn_d128_g8_e5m2",
    "decode_attn_merged_d64_g1_e5m2",
    "decode_attn_merged_d64_g2_e5m2",
    "decode_attn_merged_d64_g4_e5m2",
    "decode_attn_merged_d64_g8_e5m2",
    "decode_attn_merged_d128_g1_e5m2",
    "decode_attn_merged_d128_g2_e5m2",
    "decode_attn_merged_d128_g4_e5m2",
    "decode_attn_merged_d128_g8_e5m2",
    "decode_attn_rope_d64_g1_e5m2",
    "decode_attn_rope_d64_g2_e5m2",
    "decode_attn_rope_d64_g4_e5m2",
    "decode_attn_rope_d64_g8_e5m2",
    "decode_attn_rope_d128_g1_e5m2",
    "decode_attn_rope_d128_g2_e5m2",
    "decode_attn_rope_d128_g4_e5m2",
    "decode_attn_rope_d128_g8_e5m2",
    "prefill_attn_d64_e5m2",
    "prefill_attn_d128_e5m2",
    "prefill_attn_d64_e5m2_h2",
    "prefill_attn_d128_e5m2_h2",
    "decode_attn_tc_d64_g1",
    "decode_attn_tc_d64_g2",
    "decode_attn_tc_d64_g4",
    "decode_attn_tc_d64_g8",
    "decode_attn_tc_d128_g1",
    "decode_attn_tc_d128_g2",
    "decode_attn_tc_d128_g4",
    "decode_attn_tc_d128_g8",
    "decode_attn_tc_d64_g1_e4m3",
    "decode_attn_tc_d64_g2_e4m3",
    "decode_attn_tc_d64_g4_e4m3",
    "decode_attn_tc_d64_g8_e4m3",
    "decode_attn_tc_d128_g1_e4m3",
    "decode_attn_tc_d128_g2_e4m3",
    "decode_attn_tc_d128_g4_e4m3",
    "decode_attn_tc_d128_g8_e4m3",
    "decode_attn_tc_d64_g1_e5m2",
    "decode_attn_tc_d64_g2_e5m2",
    "decode_attn_tc_d64_g4_e5m2",
    "decode_attn_tc_d64_g8_e5m2",
    "decode_attn_tc_d128_g1_e5m2",
    "decode_attn_tc_d128_g2_e5m2",
    "decode_attn_tc_d128_g4_e5m2",
    "decode_attn_tc_d128_g8_e5m2",
    "sample_bf16",
    "logit_edits_bf16",
    "gemv_bf16_r16",
    "gemv_bf16_r32",
    "gemv_rms_bf16_r16",
    "gemv_rms_bf16_r32",
    "gemv_fp8_r16",
    "gemv_fp8_r32",
    "gemv_rms_fp8_r16",
    "gemv_rms_fp8_r32",
    "quantize_rows_fp8",
    "dequantize_rows_fp8",
    "fp8_rescale_bf16",
    "add_rmsnorm_quant_fp8",
    "silu_mul_quant_fp8",
    "allreduce_oneshot_bf16",
    "allreduce_ll_bf16",
    "allreduce_pull_add_rmsnorm",
];

/// Whether libnvrtc can be loaded on this machine.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to open the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn nvrtc_version() -> (i32, i32) {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC writes two ints through valid pointers; the library was checked present.
    unsafe {
        cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor);
    }
    (major, minor)
}

/// Compile [`SOURCE`] to PTX for `arch` (e.g. `"compute_90"`). Needs libnvrtc, not a GPU.
pub fn compile_ptx(arch: &str) -> Result<String> {
    if !nvrtc_available() {
        return Err(KernelError::NvrtcMissing);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some("sgl_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            KernelError::Compile(log.to_string_lossy().into_owned())
        }
        other => KernelError::Compile(format!("{other:?}")),
    })?;
    Ok(ptx.to_src())
}

/// Compile for `arch`, reusing the PTX cached under `$SGL_KERNEL_CACHE` (default
/// `$XDG_CACHE_HOME/sgl-kernels` or `~/.cache/sgl-kernels`) when the source, the architecture
/// and the NVRTC version are unchanged. A cache that cannot be read or written is skipped.
pub(crate) fn cached_ptx(arch: &str) -> Result<String> {
    if !nvrtc_available() {
        return Err(KernelError::NvrtcMissing);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    SOURCE.hash(&mut h);
    arch.hash(&mut h);
    nvrtc_version().hash(&mut h);
    let key = format!("{:016x}.ptx", h.finish());
    let dir = cache_dir();
    if let Some(path) = dir.as_ref().map(|d| d.join(&key))
        && let Ok(ptx) = std::fs::read_to_string(&path)
    {
        return Ok(ptx);
    }
    let ptx = compile_ptx(arch)?;
    if let Some(d) = dir
        && std::fs::create_dir_all(&d).is_ok()
    {
        // A name of its own per writer: tensor-parallel ranks compile at once, one thread each.
        static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = d.join(format!("{key}.{}.{n}", std::process::id()));
        if std::fs::write(&tmp, &ptx).is_ok() {
            let _ = std::fs::rename(&tmp, d.join(&key));
        }
    }
    Ok(ptx)
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("SGL_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("sgl-kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("sgl-kernels"))
}
