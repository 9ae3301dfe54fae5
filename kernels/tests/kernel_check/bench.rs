//! Benchmarks (`bench-decode`, `bench-gemm-fp8`, `bench-prefill-attn`; the GEMV's are in `bench_gemv`) and the timing helpers every benchmark uses: one decode step in a CUDA graph, cuBLASLt's FP8 GEMM algorithms, prefill attention.

use super::*;

/// Median time in µs of `f` over `iters` launches after a warm-up (CUDA events on `s`).
pub(crate) fn time_on(s: &CudaStream, iters: usize, mut f: impl FnMut(usize) -> R<()>) -> R<f64> {
    use cudarc::driver::sys::CUevent_flags;
    for i in 0..3 {
        f(i)?;
    }
    let ctx = s.context();
    let mut per = Vec::new();
    for rep in 0..5 {
        let e0 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let e1 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e0.record(s)?;
        for i in 0..iters {
            f(rep * iters + i)?;
        }
        e1.record(s)?;
        per.push(e0.elapsed_ms(&e1)? as f64 * 1e3 / iters as f64);
    }
    per.sort_by(f64::total_cmp);
    Ok(per[per.len() / 2])
}

/// Median time in µs of `f` over `iters` launches on the check stream.
pub(crate) fn time_us(c: &Ctx, iters: usize, f: impl FnMut(usize) -> R<()>) -> R<f64> {
    time_on(&c.s, iters, f)
}

/// Device-to-device copy bandwidth (read + write) in bytes per second, over 1 GiB.
pub(crate) fn copy_bandwidth(c: &Ctx) -> R<f64> {
    let s = c.s.clone();
    let n_copy = 1usize << 30;
    let (src, dst) = (s.alloc_zeros::<u8>(n_copy)?, s.alloc_zeros::<u8>(n_copy)?);
    let (sa, da) = (dptr(&src, &s).addr(), dptr(&dst, &s).addr());
    let copy_us = time_us(c, 5, |_| {
        // SAFETY: both buffers hold n_copy bytes.
        unsafe { cudarc::driver::result::memcpy_dtod_async(da, sa, n_copy, s.cu_stream())? };
        Ok(())
    });
    drop((src, dst));
    let copy_bw = 2.0 * n_copy as f64 / (copy_us? * 1e-6);
    println!(
        "device copy bandwidth (read + write): {:.0} GB/s",
        copy_bw / 1e9
    );
    Ok(copy_bw)
}

/// One batch-1 decode step of Llama-3.1-8B (32 layers, 128256-token head, 256 cached keys)
/// captured in a CUDA graph: fused or separate norms, PDL on or off (trigger at the end of each
/// block's work, or right after the wait), a sweep of the GEMV's L2 prefetch depth before its
/// wait, the three attention forms, and ablations (the same graph without attention, without
/// the LM head, without norms, attention alone) that show each kernel family's marginal cost in
/// the graph. Prints ms per step, launches, and the copy-bandwidth floor of the weight bytes
/// the variant streams over its step time.
pub(crate) fn bench_decode(c: &mut Ctx) -> R<()> {
    let copy_bw = copy_bandwidth(c)?;
    let s = c.s.context().new_stream()?;
    let t0 = std::time::Instant::now();
    let m = DecodeModel::new(&c.k, &s, &mut c.rng, 32, 128256, 256)?;
    s.synchronize()?;
    let bytes = m.weight_bytes() as f64;
    let lm_bytes = 2.0 * m.lm_head.len() as f64;
    let floor_ms = bytes / copy_bw * 1e3;
    println!(
        "decode model ready in {:.1}s: {:.2} GB of weights, copy-rate floor {floor_ms:.3} ms/step, attention {} splits",
        t0.elapsed().as_secs_f64(),
        bytes / 1e9,
        m.plan.splits
    );
    let (pdl_default, pf_default) = (c.k.pdl(), c.k.gemv_prefetch());
    let early_default = c.k.pdl_early_trigger();
    println!(
        "\n| step | norms | attention | PDL | GEMV L2 prefetch steps | launches | ms / step | of floor |\n|---|---|---|---|---|---|---|---|"
    );
    use AttnForm::*;
    let full = Variant::FULL;
    let no_attn = full.with_attn(Skip);
    let attn_only = Variant {
        gemvs: false,
        lm_head: false,
        ..full
    };
    // (name, variant, PDL, early trigger, prefetch steps)
    let mut configs = vec![
        ("full", full, true, false, pf_default),
        ("full", full, true, true, pf_default),
        ("full", full, false, false, pf_default),
    ];
    for pf in [0, 2, 4, u32::MAX] {
        configs.push(("full", full, true, false, pf));
    }
    for attn in [Merged, Rope] {
        configs.push(("full", full.with_attn(attn), true, false, pf_default));
        configs.push(("full", full.with_attn(attn), true, true, pf_default));
        configs.push(("full", full.with_attn(attn), false, false, pf_default));
    }
    configs.extend([
        ("full", full.separate_norms(), true, false, pf_default),
        ("full", full.separate_norms(), false, false, pf_default),
        (
            "no attention (GEMVs only)",
            no_attn,
            true,
            false,
            pf_default,
        ),
        ("no attention (GEMVs only)", no_attn, true, true, pf_default),
        (
            "no attention (GEMVs only)",
            no_attn,
            false,
            false,
            pf_default,
        ),
        (
            "GEMVs only, norms left out",
            no_attn.separate_norms().without_norms(),
            true,
            false,
            pf_default,
        ),
        (
            "no LM head",
            full.without_lm_head(),
            true,
            false,
            pf_default,
        ),
        (
            "no LM head",
            full.with_attn(Rope).without_lm_head(),
            true,
            false,
            pf_default,
        ),
        (
            "LM head only",
            no_attn.without_layer_gemvs(),
            true,
            false,
            pf_default,
        ),
        ("attention only", attn_only, true, false, pf_default),
        ("attention only", attn_only, false, false, pf_default),
        (
            "attention only",
            attn_only.with_attn(Merged),
            true,
            false,
            pf_default,
        ),
        (
            "attention only",
            attn_only.with_attn(Rope),
            true,
            false,
            pf_default,
        ),
        (
            "attention only",
            attn_only.with_attn(Rope),
            false,
            false,
            pf_default,
        ),
    ]);
    for (name, v, pdl, early, pf) in configs {
        c.k.set_pdl(pdl);
        c.k.set_pdl_early_trigger(early, &s)?;
        c.k.set_gemv_prefetch(pf);
        if pdl && !c.k.pdl() {
            println!("(PDL needs sm_90: skipped)");
            continue;
        }
        let (g, launches) = m.capture(&c.k, &s, v)?;
        let us = time_on(&s, 20, |_| Ok(g.launch()?))?;
        let var_bytes = if v.gemvs {
            bytes - if v.lm_head { 0.0 } else { lm_bytes }
        } else if v.lm_head {
            lm_bytes
        } else {
            0.0
        };
        let of_floor = if var_bytes > 0.0 {
            format!("{:.1}%", 100.0 * var_bytes / copy_bw / (us * 1e-6))
        } else {
            "-".to_string()
        };
        println!(
            "| {name} | {} | {:?} | {} | {} | {launches} | {:.3} | {of_floor} |",
            if v.fused {
                "fused"
            } else if v.norms {
                "add_rmsnorm"
            } else {
                "none"
            },
            v.attn,
            match (pdl, early) {
                (false, _) => "off",
                (true, false) => "on, end trigger",
                (true, true) => "on, early trigger",
            },
            if pf == u32::MAX {
                "all".to_string()
            } else {
                pf.to_string()
            },
            us / 1e3,
        );
    }
    c.k.set_pdl(pdl_default);
    c.k.set_pdl_early_trigger(early_default, &s)?;
    c.k.set_gemv_prefetch(pf_default);
    Ok(())
}

/// The FP8 GEMMs of a Llama-3.1-8B layer at prefill sizes: for each shape, every algorithm
/// cuBLASLt's heuristic offers (up to 16), with and without fast accumulation: µs and TFLOP/s
/// of the heuristic's first choice (what the engine runs) and of the fastest; and the sum over
/// one layer's four GEMMs, against the 8192³ rate the prefill floor takes.
pub(crate) fn bench_gemm_fp8(c: &mut Ctx) -> R<()> {
    let s = c.s.clone();
    let shapes = [
        ("qkv", 4096usize, 6144usize),
        ("o", 4096, 4096),
        ("gate_up", 4096, 28672),
        ("down", 14336, 4096),
    ];
    let max_in = 14336;
    let max_out = 28672;
    let max_t = 8192;
    let bytes: Vec<u8> = (0..max_t * max_in)
        .map(|i| (c.rng.next() as u8 & 0x7e) | ((i & 1) << 7) as u8)
        .collect();
    let x = c.up(&bytes)?;
    let w = c.up(&bytes[..max_out * 4096])?;
    let w_down = c.up(&bytes[..4096 * max_in])?;
    let d = s.alloc_zeros::<bf16>(max_t * max_out)?;
    println!(
        "| tokens | GEMM | accumulation | first choice µs | TFLOP/s | fastest µs | TFLOP/s | fastest is (heuristic rank, tile, stages, split-k, cluster) | candidates |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for fast in [false, true] {
        c.gemm.set_fp8_fast_accum(fast);
        for (t, n_iter) in [(8192usize, 5usize), (1024, 20), (256, 50)] {
            let (mut sum_first, mut sum_best, mut flops) = (0.0, 0.0, 0.0);
            for (name, i, o) in shapes {
                let wq = if i == max_in { &w_down } else { &w };
                // SAFETY: x holds t x i bytes, wq o x i, d t x o values.
                let r = unsafe {
                    c.gemm
                        .time_fp8_algos(c.p(&x), c.p(wq), c.p(&d), t, i, o, 16, n_iter)?
                };
                let Some(first) = r.first() else {
                    println!("| {t} | {name} | - | no algorithm | | | | | 0 |");
                    continue;
                };
                let (rank, best) = r
                    .iter()
                    .enumerate()
                    .min_by(|a, b| a.1.1.total_cmp(&b.1.1))
                    .map(|(k, v)| (k, *v))
                    .unwrap_or((0, *first));
                let f = 2.0 * (t * i * o) as f64;
                let tf = |us: f64| f / (us * 1e-6) / 1e12;
                sum_first += first.1;
                sum_best += best.1;
                flops += f;
                let a = best.0;
                println!(
                    "| {t} | {name} {i}->{o} | {} | {:.1} | {:.0} | {:.1} | {:.0} | #{rank}: tile {}, stages {}, split-k {}, cluster {} | {} |",
                    if fast { "fast" } else { "f32 promotion" },
                    first.1,
                    tf(first.1),
                    best.1,
                    tf(best.1),
                    a.tile,
                    a.stages,
                    a.splitk,
                    a.cluster,
                    r.len()
                );
            }
            println!(
                "| {t} | one layer | {} | {:.1} | {:.0} | {:.1} | {:.0} | | |",
                if fast { "fast" } else { "f32 promotion" },
                sum_first,
                flops / (sum_first * 1e-6) / 1e12,
                sum_best,
                flops / (sum_best * 1e-6) / 1e12,
            );
        }
    }
    c.gemm.set_fp8_fast_accum(false);
    Ok(())
}

/// Median time in µs of single launches of `f` (a CUDA event pair around each of `n` launches,
/// after 3 warm-up launches).
pub(crate) fn time_each(s: &CudaStream, n: usize, mut f: impl FnMut() -> R<()>) -> R<f64> {
    use cudarc::driver::sys::CUevent_flags;
    for _ in 0..3 {
        f()?;
    }
    let ctx = s.context();
    let mut per = Vec::with_capacity(n);
    for _ in 0..n {
        let e0 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let e1 = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e0.record(s)?;
        f()?;
        e1.record(s)?;
        per.push(e0.elapsed_ms(&e1)? as f64 * 1e3);
    }
    per.sort_by(f64::total_cmp);
    Ok(per[per.len() / 2])
}

/// Causal prefill attention at Llama-3.1-8B's attention shape (32 query heads over 8 KV heads,
/// head_dim 128): one prompt of 1024, 4096 and 8192 tokens with nothing cached, a 1024-token
/// prompt at tp 2's 16/4 heads, and a prompt's last row alone after 1023 cached positions (the
/// last layer's rows that need logits); keys in consecutive pool slots, bf16 and FP8 e4m3
/// pools. Each with whole query tiles and with the work list the engine plans for this device
/// (`prefill_work`: the longest tiles' key ranges split); FP8 pools also with two heads a
/// block (`PrefillForm::Paired`, on the list planned for it without splits, as the engine
/// takes it where that list needs none). Median of 25 launches each; causal TFLOP/s (of the
/// work list) counts 4 · keys · head_dim · heads per query row.
pub(crate) fn bench_prefill_attn(c: &mut Ctx) -> R<()> {
    let hd = 128usize;
    println!(
        "\n{} blocks at once (prefill_slots), {} paired\n\n| queries | after | heads | pool | µs, whole query tiles | µs, work list | causal TFLOP/s | µs, two heads a block (planned list splits?) |\n|---|---|---|---|---|---|---|---|",
        c.k.prefill_slots(),
        c.k.prefill_paired_slots()
    );
    // (new queries, cached prefix, query heads): Llama-3.1-8B prompts at tp 1, a prompt at
    // tp 2 (16 heads a rank), a prompt's last row alone after the rest (the last layer's tail)
    let cases = [
        (1024usize, 0usize, 32usize),
        (4096, 0, 32),
        (8192, 0, 32),
        (1024, 0, 16),
        (1, 1023, 32),
    ];
    for (nq, prefix, nh) in cases {
        let nkv = nh / 4;
        let n = prefix + nq;
        let q_stride = (nh + 2 * nkv) * hd;
        let flops: f64 = (0..nq)
            .map(|r| 4.0 * (prefix + r + 1) as f64 * (hd * nh) as f64)
            .sum();
        let qkv = bf(&(0..nq * q_stride).map(|_| c.rng.sym()).collect::<Vec<_>>());
        let dq = c.up(&qkv)?;
        let out = c.s.alloc_zeros::<bf16>(nq * nh * hd)?;
        let (q_indptr, kv_indptr, pre) = ([0, nq as i32], [0, n as i32], [prefix as i32]);
        let idx: Vec<i32> = (0..n as i32).collect();
        let (dqi, dki, dix, dp) = (
            c.up(&q_indptr)?,
            c.up(&kv_indptr)?,
            c.up(&idx)?,
            c.up(&pre)?,
        );
        for kv in [KvDtype::Bf16, KvDtype::Fp8E4m3] {
            let (_, _, dk, dv) = random_cache(c, n, nkv, hd, kv, sgl_kernels::KvScales::ONE)?;
            let shape = AttnShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                kv,
            };
            // whole tiles and the engine's list, one head a block; over an FP8 pool also two
            // heads a block on the planner's list for that form with one slot (never split)
            let seqs = [PrefillSeq { q_len: nq, prefix }];
            let mut lists: Vec<(Vec<i32>, bool)> = [None, Some(c.k.prefill_slots())]
                .map(|s| (work_list(&[(prefix, nq)], nh, s), false))
                .into();
            let pairs = Kernels::prefill_pairs(kv, nh, nkv);
            if pairs {
                lists.push((prefill_work(&seqs, nh / 2, 1, usize::MAX), true));
            }
            let parts = PfParts::for_list(c, &lists[1].0, nh, hd)?;
            let mut us = Vec::new();
            for (tiles, paired) in &lists {
                let form = if *paired {
                    PrefillForm::Paired
                } else {
                    PrefillForm::OneHead(parts.get(c))
                };
                let dt = c.up(tiles)?;
                let s = c.s.clone();
                us.push(time_each(&s, 25, || {
                    // SAFETY: shapes as allocated; the work list is this batch's (unsplit
                    // for the paired form).
                    unsafe {
                        c.k.prefill_attn(
                            &c.s,
                            c.p(&out),
                            nh * hd,
                            c.p(&dq),
                            q_stride,
                            c.p(&dk),
                            c.p(&dv),
                            c.p(&dt),
                            tiles.len() / PREFILL_ENTRY_INTS,
                            c.p(&dqi),
                            c.p(&dki),
                            c.p(&dix),
                            c.p(&dp),
                            form,
                            shape,
                        )?
                    };
                    Ok(())
                })?);
            }
            let paired = match us.get(2) {
                None => "-".to_string(),
                Some(t) => {
                    let slots = c.k.prefill_paired_slots();
                    let taken = prefill_paired_work(&seqs, kv, nh, nkv, slots).is_some();
                    let why = if taken {
                        "no split: taken"
                    } else {
                        "would split: not taken"
                    };
                    format!("{t:.1} ({why})")
                }
            };
            println!(
                "| {nq} | {prefix} | {nh}/{nkv} | {} | {:.1} | {:.1} | {:.0} | {paired} |",
                kv_name(kv),
                us[0],
                us[1],
                flops / (us[1] * 1e-6) / 1e12
            );
        }
    }
    Ok(())
}

/// The FP8 prefill's row kernels at Llama-3.1-8B shapes (hidden 4096, intermediate 14336, 32
/// q / 8 kv heads of 128): silu_mul_quant_fp8 and add_rmsnorm_quant_fp8 (each with the scales
/// of the GEMM before it) at 1024 and 8192 tokens, quantize_rows_fp8 of attention's output, and
/// the qkv product's rescale with RoPE and the K/V store, separate and folded, at 1024 tokens.
/// Median of 25 single launches (CUDA events), inputs cycled through enough copies that none
/// is still in L2; GB/s counts each kernel's compulsory reads and writes, against the device's
/// copy bandwidth.
pub(crate) fn bench_fp8_rows(c: &mut Ctx) -> R<()> {
    let s = c.s.clone();
    let copy_bw = copy_bandwidth(c)?;
    let (h, inter, nh, nkv, hd) = (4096usize, 14336usize, 32usize, 8usize, 128usize);
    let n = 25;
    // copies of an input of `bytes` so that the launch after one reads another, out of L2
    let copies_for = |bytes: usize| (192usize << 20).div_ceil(bytes).max(2);
    println!("\n| kernel | shape | µs | MB moved | GB/s | of copy |\n|---|---|---|---|---|---|");
    let line = |name: &str, shape: String, us: f64, bytes: usize| {
        let bw = bytes as f64 / (us * 1e-6);
        println!(
            "| {name} | {shape} | {us:.1} | {:.1} | {:.0} | {:.1}% |",
            bytes as f64 / 1e6,
            bw / 1e9,
            100.0 * bw / copy_bw
        );
    };
    let pattern = |len: usize, scale: f32| -> Vec<bf16> {
        bf(&(0..len)
            .map(|i| ((i % 251) as f32 - 125.0) / 125.0 * scale)
            .collect::<Vec<_>>())
    };

    for t in [1024usize, 8192] {
        let gu_host = pattern(t * 2 * inter, 2000.0);
        let copies = copies_for(gu_host.len() * 2);
        let gus: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&gu_host))
            .collect::<Result<_, _>>()?;
        drop(gu_host);
        let xs = c.up(&vec![1e-2f32; t])?;
        let ws = c.up(&vec![1e-1f32; 2 * inter])?;
        let q = s.alloc_zeros::<u8>(t * inter)?;
        let qs = s.alloc_zeros::<f32>(t)?;
        let mut i = 0usize;
        let us = time_each(&s, n, || {
            i += 1;
            // SAFETY: shapes as allocated.
            unsafe {
                c.k.silu_mul_quant_fp8(
                    &s,
                    dptr(&q, &s),
                    dptr(&qs, &s),
                    dptr(&gus[i % copies], &s),
                    Some((dptr(&xs, &s), dptr(&ws, &s))),
                    t,
                    inter,
                )?
            };
            Ok(())
        })?;
        line(
            "silu_mul_quant_fp8 (scaled input)",
            format!("{t} x {inter}"),
            us,
            t * 2 * inter * 2 + t * inter + t * 8,
        );
    }

    for t in [1024usize, 8192] {
        let res_host = pattern(t * h, 2.0);
        let d_host = pattern(t * h, 3000.0);
        let copies = copies_for(res_host.len() * 4);
        let res: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&res_host))
            .collect::<Result<_, _>>()?;
        let dl: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&d_host))
            .collect::<Result<_, _>>()?;
        let g = c.up(&bf(&vec![1.0f32; h]))?;
        let xs = c.up(&vec![1e-2f32; t])?;
        let ws = c.up(&vec![3e-2f32; h])?;
        let q = s.alloc_zeros::<u8>(t * h)?;
        let qs = s.alloc_zeros::<f32>(t)?;
        let mut i = 0usize;
        let us = time_each(&s, n, || {
            i += 1;
            let j = i % copies;
            // SAFETY: shapes as allocated.
            unsafe {
                c.k.add_rmsnorm_quant_fp8(
                    &s,
                    dptr(&q, &s),
                    dptr(&qs, &s),
                    dptr(&res[j], &s),
                    Some(dptr(&dl[j], &s)),
                    Some((dptr(&xs, &s), dptr(&ws, &s))),
                    dptr(&g, &s),
                    t,
                    h,
                    1e-5,
                )?
            };
            Ok(())
        })?;
        line(
            "add_rmsnorm_quant_fp8 (scaled delta)",
            format!("{t} x {h}"),
            us,
            t * h * (2 + 2 + 2 + 1) + t * 8,
        );
    }

    {
        let t = 1024usize;
        let x_host = pattern(t * h, 3.0);
        let copies = copies_for(x_host.len() * 2);
        let xs: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&x_host))
            .collect::<Result<_, _>>()?;
        let q = s.alloc_zeros::<u8>(t * h)?;
        let qs = s.alloc_zeros::<f32>(t)?;
        let mut i = 0usize;
        let us = time_each(&s, n, || {
            i += 1;
            // SAFETY: shapes as allocated.
            unsafe {
                c.k.quantize_rows_fp8(
                    &s,
                    dptr(&q, &s),
                    dptr(&qs, &s),
                    dptr(&xs[i % copies], &s),
                    t,
                    h,
                )?
            };
            Ok(())
        })?;
        line(
            "quantize_rows_fp8",
            format!("{t} x {h}"),
            us,
            t * h * 3 + t * 4,
        );
    }

    {
        let t = 1024usize;
        let w = (nh + 2 * nkv) * hd;
        let (q_w, kv_w) = (nh * hd, nkv * hd);
        // scales of 1: the separate rescale in place leaves the values as they are
        let qkv_host = pattern(t * w, 3.0);
        let copies = copies_for(qkv_host.len() * 2);
        let qkvs: Vec<CudaSlice<bf16>> = (0..copies)
            .map(|_| s.clone_htod(&qkv_host))
            .collect::<Result<_, _>>()?;
        let xs = c.up(&vec![1.0f32; t])?;
        let ws = c.up(&vec![1.0f32; w])?;
        let pos: Vec<i32> = (0..t as i32).collect();
        let (dp, dsl) = (c.up(&pos)?, c.up(&pos)?);
        let inv = c.up(&llama3_inv_freq(hd))?;
        let kc = s.alloc_zeros::<u8>(t * kv_w * 2)?;
        let vc = s.alloc_zeros::<u8>(t * kv_w * 2)?;
        let shape = AttnShape {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            kv: KvDtype::Bf16,
        };
        let rope_bytes = t * w * 2 + t * q_w * 2 + t * 2 * kv_w * 2;
        let rescale_bytes = t * w * 2 * 2;
        let mut i = 0usize;
        let mut run = |rescale: bool, rope: bool, folded: bool| {
            time_each(&s, n, || {
                i += 1;
                let qkv = dptr(&qkvs[i % copies], &s);
                let (kp, vp) = (dptr(&kc, &s), dptr(&vc, &s));
                let (pp, sp, ip) = (dptr(&dp, &s), dptr(&dsl, &s), dptr(&inv, &s));
                // SAFETY: shapes as allocated; slots < t.
                unsafe {
                    if rescale {
                        let (x, wp) = (dptr(&xs, &s), dptr(&ws, &s));
                        c.k.fp8_rescale(&s, qkv, qkv, x, wp, t, w, false)?;
                    }
                    if rope {
                        c.k.rope_kv_store(&s, qkv, kp, vp, pp, sp, ip, t, shape)?;
                    }
                    if folded {
                        let (x, wp) = (dptr(&xs, &s), dptr(&ws, &s));
                        c.k.rope_kv_store_rescale(&s, qkv, kp, vp, pp, sp, ip, t, shape, x, wp)?;
                    }
                }
                Ok(())
            })
        };
        let us = run(true, false, false)?;
        line(
            "fp8_rescale_bf16 (qkv)",
            format!("{t} x {w}"),
            us,
            rescale_bytes,
        );
        let us = run(false, true, false)?;
        line("rope_kv_store_bf16", format!("{t} tokens"), us, rope_bytes);
        let us = run(true, true, false)?;
        line(
            "fp8_rescale_bf16 + rope_kv_store_bf16",
            format!("{t} tokens"),
            us,
            rescale_bytes + rope_bytes,
        );
        let us = run(false, false, true)?;
        line(
            "rope_kv_store_rescale_bf16 (folded)",
            format!("{t} tokens"),
            us,
            rope_bytes,
        );
    }
    Ok(())
}
