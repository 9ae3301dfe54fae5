//! Small CPU operations of the forward pass: RMSNorm, RoPE, SiLU-and-mul (attention is in
//! `attention.rs`).

/// Rows whose sums of squares are accumulated side by side in [`rms_norm`].
const NORM_ROWS: usize = 8;

/// `out[r] = x[r] / rms(x[r]) * w` for each row of `dim` values. A batch's rows are spread
/// over the kernel pool, [`NORM_ROWS`] per task.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    if dim == 0 {
        return;
    }
    sgl_kernels::cpu::parallel_chunks_mut(out, dim * NORM_ROWS, |i, o| {
        let at = i * dim * NORM_ROWS;
        rms_norm_rows(&x[at..at + o.len()], w, eps, dim, o);
    });
}

/// `x += y`, then `out = rms_norm(x)` (the residual add before a layer's norm), in one pass
/// over each row, a batch's rows spread over the kernel pool. Results are those of
/// [`add_in_place`] followed by [`rms_norm`].
pub fn add_rms_norm(x: &mut [f32], y: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    assert!(
        x.len() == y.len() && x.len() == out.len(),
        "add_rms_norm: lengths differ"
    );
    if dim == 0 {
        return;
    }
    let xs = sgl_kernels::cpu::SharedMut::new(x);
    sgl_kernels::cpu::parallel_chunks_mut(out, dim * NORM_ROWS, |i, o| {
        let at = i * dim * NORM_ROWS;
        // SAFETY: chunk `i` of `x` is `at..at + o.len()` (`x` and `out` have the same length),
        // disjoint from every other task's.
        let xr = unsafe { xs.slice(at, o.len()) };
        add_in_place(xr, &y[at..at + o.len()]);
        rms_norm_rows(xr, w, eps, dim, o);
    });
}

/// [`rms_norm`] of at most [`NORM_ROWS`] rows on the calling thread.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    let rows = x.len() / dim;
    debug_assert!(rows <= NORM_ROWS);
    let mut ss = [0f32; NORM_ROWS];
    // Each row's sum is one chain of f32 additions in index order (the order every result of
    // this model code was checked with); a batch's rows run their chains side by side, so a
    // step no longer waits for one dependent addition per value and row.
    if rows == NORM_ROWS {
        for i in 0..dim {
            for (r, a) in ss.iter_mut().enumerate() {
                let v = x[r * dim + i];
                *a += v * v;
            }
        }
    } else {
        for (xr, s) in x.chunks_exact(dim).zip(&mut ss) {
            *s = xr.iter().map(|v| v * v).sum::<f32>();
        }
    }
    for ((xr, or), &sum) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)).zip(&ss) {
        let ss = sum / dim as f32;
        let scale = 1.0 / (ss + eps).sqrt();
        for ((o, &xv), &wv) in or.iter_mut().zip(xr).zip(w) {
            *o = xv * scale * wv;
        }
    }
}

pub fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bv) in row.iter_mut().zip(b) {
            *v += bv;
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Values per task when [`silu_mul`] is spread over the kernel pool (a batch's worth; one
/// token's row stays on the calling thread).
const SILU_CHUNK: usize = 4096;

/// `gate = silu(gate) * up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: lengths differ");
    sgl_kernels::cpu::parallel_chunks_mut(gate, SILU_CHUNK, |i, g| {
        silu_mul_serial(g, &up[i * SILU_CHUNK..i * SILU_CHUNK + g.len()]);
    });
}

/// [`silu_mul`] on the calling thread.
fn silu_mul_serial(gate: &mut [f32], up: &[f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if sgl_kernels::cpu::Isa::detect() != sgl_kernels::cpu::Isa::Scalar {
        // SAFETY: a SIMD ISA means AVX2, FMA and F16C were detected at run time.
        done = unsafe { silu_mul_avx2(gate, up) };
    }
    for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// [`silu_mul`] on whole groups of 8 with the vector exp; returns how many values it did.
///
/// # Safety
/// AVX2 and FMA available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len()) / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    let sign = _mm256_set1_ps(-0.0);
    for i in (0..n).step_by(8) {
        // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = super::attention::exp_ps(_mm256_xor_ps(g, sign));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, u));
        }
    }
    n
}

/// Precomputed cos/sin of RoPE angles for positions `0..max_positions`.
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    max_positions: usize,
}

impl RopeTable {
    pub fn new(inv_freq: &[f32], max_positions: usize) -> Self {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in inv_freq {
                let a = p as f64 * f as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeTable {
            half,
            cos,
            sin,
            max_positions,
        }
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates one head's `head_dim` values by position `p`. `interleaved`: pairs are
    /// (2i, 2i+1), the GGUF layout; else (i, i + head_dim/2), the HF layout.
    pub fn rotate(&self, head: &mut [f32], p: usize, interleaved: bool) {
        let half = self.half;
        let c = &self.cos[p * half..(p + 1) * half];
        let s = &self.sin[p * half..(p + 1) * half];
        if interleaved {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c[i] - b * s[i];
                head[2 * i + 1] = a * s[i] + b * c[i];
            }
        } else {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * c[i] - b * s[i];
                head[i + half] = a * s[i] + b * c[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let w = [1.0, 2.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &w, 0.0, 2, &mut out);
        let r = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / r).abs() < 1e-6);
        assert!((out[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn rope_layouts_agree_after_permutation() {
        // Interleaved layout of a head equals the half-split layout after permuting pairs.
        let inv = [1.0f32, 0.1];
        let table = RopeTable::new(&inv, 8);
        let half_split = [1.0f32, 2.0, 3.0, 4.0];
        let interleaved = [1.0f32, 3.0, 2.0, 4.0];
        let mut a = half_split;
        let mut b = interleaved;
        table.rotate(&mut a, 5, false);
        table.rotate(&mut b, 5, true);
        assert!((a[0] - b[0]).abs() < 1e-6 && (a[2] - b[1]).abs() < 1e-6);
        assert!((a[1] - b[2]).abs() < 1e-6 && (a[3] - b[3]).abs() < 1e-6);
    }

    #[test]
    fn silu_mul_matches_formula() {
        let gate: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.9).collect();
        let up: Vec<f32> = (0..37).map(|i| 1.0 + i as f32 * 0.1).collect();
        let mut got = gate.clone();
        silu_mul(&mut got, &up);
        for ((&g, &u), &r) in gate.iter().zip(&up).zip(&got) {
            let want = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
            assert!(
                (r as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{r} vs {want}"
            );
        }
        let mut big = vec![-200.0f32, 200.0, f32::MIN, 0.0, 1.0, -1.0, 90.0, -90.0];
        silu_mul(&mut big, &[1.0; 8]);
        assert!(big[0] == 0.0 || big[0].abs() < 1e-30, "{}", big[0]);
        assert_eq!(big[1], 200.0);
        assert!(big.iter().all(|v| v.is_finite()));
    }
}
