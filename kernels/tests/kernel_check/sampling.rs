//! Logit edits, token copies and the sampling kernel.

use super::*;

/// In-place logit edits against the CPU on random logits (Llama-3's vocabulary): repetition
/// penalties both ways, additive terms, -inf masks, no-op entries and entries outside the
/// buffer (skipped). Every logit, edited or not, must match bit for bit.
pub(crate) fn check_logit_edits(c: &mut Ctx) -> R<()> {
    let (rows, vocab) = (6usize, 128256usize);
    let logits = bf(&(0..rows * vocab)
        .map(|_| 8.0 * c.rng.sym())
        .collect::<Vec<_>>());
    let mut edits = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while edits.len() < 3000 {
        let (row, token) = (c.rng.below(rows) as u32, c.rng.below(vocab) as u32);
        if !seen.insert((row, token)) {
            continue;
        }
        let rep = match c.rng.below(4) {
            0 | 1 => 1.0,
            2 => 1.0 + c.rng.f(),
            _ => 0.5 + 0.5 * c.rng.f(),
        };
        let add = match c.rng.below(5) {
            0 | 1 => 0.0,
            2 => f32::NEG_INFINITY,
            _ => 2.0 * c.rng.sym(),
        };
        edits.push(LogitEdit {
            row,
            token,
            rep,
            add,
        });
    }
    // outside the buffer: skipped (a NaN would show if one were applied)
    for (row, token) in [(rows as u32, 0u32), (0, vocab as u32), (u32::MAX, u32::MAX)] {
        edits.push(LogitEdit {
            row,
            token,
            rep: 2.0,
            add: f32::NAN,
        });
    }
    let mut want = logits.clone();
    for e in &edits {
        if e.row as usize >= rows || e.token as usize >= vocab {
            continue;
        }
        let i = e.row as usize * vocab + e.token as usize;
        let mut l = want[i].to_f32();
        if e.rep != 1.0 {
            l = if l > 0.0 { l / e.rep } else { l * e.rep };
        }
        want[i] = bf16::from_f32(l + e.add);
    }
    let (dl, de) = (c.up(&logits)?, c.up(&edits)?);
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.logit_edits(&c.s, c.p(&dl), rows, vocab, c.p(&de), edits.len())?
    };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&dl)?;
    let differ = got
        .iter()
        .zip(&want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    c.record(
        &format!(
            "logit_edits ({} edits over {rows} x {vocab}; {differ} logits differ)",
            edits.len()
        ),
        differ as f64 / want.len() as f64,
        0.0,
    );
    Ok(())
}

/// Device-side token copy: scattered destinations (the rest keep their poison), repeated
/// sources.
pub(crate) fn check_copy_tokens(c: &mut Ctx) -> R<()> {
    let (n_dst, n_src, n) = (300usize, 77usize, 200usize);
    let src: Vec<i32> = (0..n_src).map(|_| c.rng.below(128256) as i32).collect();
    let dsts = c.rng.perm(n_dst);
    let mut pairs = Vec::new();
    let mut want = vec![-7i32; n_dst];
    for &d in &dsts[..n] {
        let sidx = c.rng.below(n_src);
        pairs.extend([d as i32, sidx as i32]);
        want[d] = src[sidx];
    }
    let (ds, dp) = (c.up(&src)?, c.up(&pairs)?);
    let dd = c.up(&vec![-7i32; n_dst])?;
    // SAFETY: shapes as allocated; pairs index inside dst and src.
    unsafe { c.k.copy_tokens(&c.s, c.p(&dd), c.p(&ds), c.p(&dp), n)? };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&dd)?;
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    c.record(
        &format!("copy_tokens_i32 ({n} of {n_dst} slots; {differ} differ)"),
        differ as f64 / n_dst as f64,
        0.0,
    );
    Ok(())
}

pub(crate) fn check_sampling(c: &mut Ctx) -> R<()> {
    let (rows, vocab) = (64, 32000);
    let logits: Vec<f32> = (0..rows * vocab).map(|_| rbf(c.rng.sym() * 8.0)).collect();
    let mut params = Vec::new();
    for r in 0..rows {
        let temp = if r % 4 == 0 { 0.0 } else { 0.5 + c.rng.f() };
        let top_p = if r % 3 == 0 {
            1.0
        } else {
            0.5 + 0.5 * c.rng.f()
        };
        let top_k = if r % 5 == 0 {
            0.0
        } else {
            (1 + c.rng.below(100)) as f32
        };
        let min_p = if r % 2 == 0 { 0.0 } else { 0.05 * c.rng.f() };
        params.extend([temp, top_p, top_k, min_p, c.rng.f()]);
    }
    let (dl, dp) = (c.up(&bf(&logits))?, c.up(&params)?);
    let out = c.s.clone_htod(&vec![-1i32; rows])?;
    // SAFETY: shapes as allocated.
    unsafe {
        c.k.sample(&c.s, c.p(&out), c.p(&dl), c.p(&dp), rows, vocab)?
    };
    c.s.synchronize()?;
    let got = c.s.clone_dtoh(&out)?;
    let (mut in_set, mut exact) = (0, 0);
    for r in 0..rows {
        let row = &logits[r * vocab..][..vocab];
        let p = &params[r * 5..][..5];
        let (temp, top_p, top_k, min_p, u) = (p[0], p[1], p[2] as usize, p[3], p[4]);
        let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let want_set: Vec<usize>;
        let want_tok: usize;
        if temp <= 0.0 {
            want_tok = row.iter().position(|&x| x == mx).unwrap_or(0);
            want_set = vec![want_tok];
        } else {
            let e: Vec<f64> = row
                .iter()
                .map(|&x| (((x - mx) / temp) as f64).exp())
                .collect();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| e[b].total_cmp(&e[a]));
            // tie-inclusive thresholds, like the kernel: every token tied with the cut stays
            let keep_k = if top_k > 0 && top_k < vocab {
                top_k
            } else {
                vocab
            };
            let t_k = e[order[keep_k - 1]];
            let mass_k: f64 = e.iter().filter(|&&x| x >= t_k).sum();
            let mut t_p = t_k;
            if top_p < 1.0 {
                let mut acc = 0.0;
                for &i in &order {
                    acc += e[i];
                    if acc >= top_p as f64 * mass_k {
                        t_p = e[i];
                        break;
                    }
                }
            }
            let tau = t_k.max(t_p).max(min_p as f64);
            let mut set: Vec<usize> = (0..vocab).filter(|&i| e[i] >= tau).collect();
            set.sort();
            let total: f64 = set.iter().map(|&i| e[i]).sum();
            let mut acc = 0.0;
            let mut tok = set[0];
            for &i in &set {
                acc += e[i];
                tok = i;
                if acc > u as f64 * total {
                    break;
                }
            }
            want_tok = tok;
            want_set = set;
        }
        let g = got[r] as usize;
        if want_set.binary_search(&g).is_ok() || (want_set.len() == 1 && want_set[0] == g) {
            in_set += 1;
        }
        if g == want_tok {
            exact += 1;
        }
    }
    let miss = 1.0 - in_set as f64 / rows as f64;
    c.record(
        "sample (kept-set membership, greedy/temp/top-k/top-p/min-p)",
        miss,
        0.02,
    );
    let miss_exact = 1.0 - exact as f64 / rows as f64;
    c.record("sample (same token as CPU inverse CDF)", miss_exact, 0.1);
    Ok(())
}
