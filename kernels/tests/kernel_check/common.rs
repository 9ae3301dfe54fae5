//! Shared helpers of the kernel checks: a seeded generator, bf16 conversions, the relative error, the check context (device, kernels, results).

pub(crate) use std::sync::Arc;

pub(crate) use cudarc::driver::{CudaContext, CudaGraph, CudaSlice, CudaStream};
pub(crate) use half::bf16;
pub(crate) use sgl_kernels::{
    AttnShape, Dptr, Gemm, GemvEpilogue, GemvWorkspace, Kernels, KvDtype, LogitEdit,
    PREFILL_ENTRY_INTS, PrefillForm, PrefillPartials, PrefillSeq, WeightRef, dptr,
    prefill_paired_work, prefill_tiles, prefill_work,
};

pub(crate) type R<T> = Result<T, Box<dyn std::error::Error>>;

pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub(crate) fn sym(&mut self) -> f32 {
        2.0 * self.f() - 1.0
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(crate) fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            v.swap(i, self.below(i + 1));
        }
        v
    }
}

pub(crate) fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}
pub(crate) fn unbf(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
pub(crate) fn rbf(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// ‖a − b‖ / ‖b‖; NaN anywhere fails.
pub(crate) fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() {
            return f64::INFINITY;
        }
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

pub(crate) struct Ctx {
    pub(crate) s: Arc<CudaStream>,
    pub(crate) k: Kernels,
    pub(crate) gemm: Gemm,
    pub(crate) gemv_ws: GemvWorkspace,
    pub(crate) rng: Rng,
    pub(crate) results: Vec<(String, f64, f64, bool)>,
}

impl Ctx {
    pub(crate) fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> R<CudaSlice<T>> {
        Ok(self.s.clone_htod(v)?)
    }
    pub(crate) fn poisoned(&self, n: usize) -> R<CudaSlice<bf16>> {
        Ok(self.s.clone_htod(&vec![bf16::NAN; n])?)
    }
    pub(crate) fn down(&self, d: &CudaSlice<bf16>) -> R<Vec<f32>> {
        self.s.synchronize()?;
        Ok(unbf(&self.s.clone_dtoh(d)?))
    }
    pub(crate) fn p<T>(&self, d: &CudaSlice<T>) -> Dptr<T> {
        dptr(d, &self.s)
    }
    pub(crate) fn record(&mut self, name: &str, err: f64, tol: f64) {
        let ok = err <= tol;
        println!(
            "{} {name}: rel err {err:.2e} (tol {tol:.0e})",
            if ok { "PASS" } else { "FAIL" }
        );
        self.results.push((name.to_string(), err, tol, ok));
    }
}
