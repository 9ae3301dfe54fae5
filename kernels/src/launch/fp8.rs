//! The FP8 launchers (`cu/fp8.cu`): per-row e4m3 quantization (weights at load, activations
//! of the FP8 GEMMs) and its inverse, the rescale of an FP8 GEMM's unscaled product, and the
//! RMSNorm and SiLU-mul that write their output quantized.

use cudarc::driver::{CudaFunction, CudaStream};
use half::bf16;

use super::{Kernels, arg};
use crate::{Dptr, KernelError, Result};

impl Kernels {
    /// Quantizes each of `rows` rows of `k` bf16 values to FP8 (e4m3) with one scale per row:
    /// `scale[r] = max |x[r]| / 448` (1 for a row of zeros), `q[r, i] = e4m3(x[r, i] /
    /// scale[r])`, rounded to nearest even and saturated. For weights at load and for the
    /// per-token activations of [`crate::Gemm::linear_fp8`].
    ///
    /// # Safety
    /// x: rows x k; q: rows x k bytes; scale: rows.
    pub unsafe fn quantize_rows_fp8(
        &self,
        s: &CudaStream,
        q: Dptr<u8>,
        scale: Dptr<f32>,
        x: Dptr<bf16>,
        rows: usize,
        k: usize,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        if rows > u32::MAX as usize || k > i32::MAX as usize {
            return Err(KernelError::Unsupported(format!(
                "FP8 quantization of {rows} x {k}"
            )));
        }
        let (xa, qa, sa, ki, ri) = (x.addr(), q.addr(), scale.addr(), k as i32, rows as u32);
        let mut a = [arg(&xa), arg(&qa), arg(&sa), arg(&ki), arg(&ri)];
        // rows of 8-value vectors: QUANT_VEC (fp8.cu) of them per thread, held in registers
        let threads = if k.is_multiple_of(8) {
            (k / 8).div_ceil(4).clamp(32, 1024).next_multiple_of(32) as u32
        } else {
            256
        };
        let grid = (self.row_grid(s, &self.quantize_fp8, threads, rows)?, 1, 1);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.quantize_fp8, grid, threads, &mut a) }
    }

    /// `y[t, o] = bf16(d[t, o] * xs[t] * ws[o])` (+ `y[t, o]` when `accumulate`): the
    /// per-token and per-channel scales of an FP8 GEMM whose product `d` cuBLASLt computed
    /// unscaled ([`crate::Gemm::linear_fp8`]). `d` may be `y`. Needs n % 8 == 0 and 16-byte
    /// aligned rows.
    ///
    /// # Safety
    /// y, d: tokens x n; xs: tokens; ws: n.
    pub unsafe fn fp8_rescale(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        d: Dptr<bf16>,
        xs: Dptr<f32>,
        ws: Dptr<f32>,
        tokens: usize,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        if !n.is_multiple_of(8)
            || n > i32::MAX as usize
            || tokens > 65535
            || !y.addr().is_multiple_of(16)
            || !d.addr().is_multiple_of(16)
            || !ws.addr().is_multiple_of(16)
        {
            return Err(KernelError::Unsupported(format!(
                "FP8 rescale of {tokens} x {n} at y {y:?}, d {d:?}, ws {ws:?}"
            )));
        }
        let (ya, da, xa, wa) = (y.addr(), d.addr(), xs.addr(), ws.addr());
        let (ni, acc) = (n as i32, i32::from(accumulate));
        let mut a = [arg(&ya), arg(&da), arg(&xa), arg(&wa), arg(&ni), arg(&acc)];
        let grid = (n.div_ceil(2048) as u32, tokens as u32, 1);
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.fp8_rescale, grid, 256, &mut a) }
    }

    /// [`Kernels::add_rmsnorm`] then [`Kernels::quantize_rows_fp8`] of its output in one
    /// kernel, with the same values: `residual += delta` (bf16), then the normalised rows go to
    /// `q` (e4m3) and `qscale` (one per row) instead of a bf16 buffer. With `delta_scales =
    /// Some((xs, ws))`, `delta` is an FP8 GEMM's unscaled product and
    /// [`Kernels::fp8_rescale`]'s arithmetic is applied to it first; `xs` may be `qscale`.
    ///
    /// # Safety
    /// q: n_tokens x hidden bytes; qscale, xs: n_tokens; residual, delta: n_tokens x hidden;
    /// ws, weight: hidden.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn add_rmsnorm_quant_fp8(
        &self,
        s: &CudaStream,
        q: Dptr<u8>,
        qscale: Dptr<f32>,
        residual: Dptr<bf16>,
        delta: Option<Dptr<bf16>>,
        delta_scales: Option<(Dptr<f32>, Dptr<f32>)>,
        weight: Dptr<bf16>,
        n_tokens: usize,
        hidden: usize,
        eps: f32,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (xs, ws) = delta_scales.unwrap_or((Dptr::null(), Dptr::null()));
        if !hidden.is_multiple_of(8)
            || n_tokens > u32::MAX as usize
            || hidden > i32::MAX as usize
            || !ws.addr().is_multiple_of(16)
            || (delta_scales.is_some() && delta.is_none())
        {
            return Err(KernelError::Unsupported(format!(
                "fused RMSNorm and FP8 quantization of {n_tokens} x {hidden} (scales at {ws:?})"
            )));
        }
        let (qa, sa, r, d, xa, wa, g) = (
            q.addr(),
            qscale.addr(),
            residual.addr(),
            delta.unwrap_or(Dptr::null()).addr(),
            xs.addr(),
            ws.addr(),
            weight.addr(),
        );
        let (h, rows) = (hidden as i32, n_tokens as u32);
        let mut a = [
            arg(&qa),
            arg(&sa),
            arg(&r),
            arg(&d),
            arg(&xa),
            arg(&wa),
            arg(&g),
            arg(&h),
            arg(&eps),
            arg(&rows),
        ];
        // the block size of add_rmsnorm, so the sum of squares adds in the same order
        let threads = (hidden / 8).clamp(32, 1024).next_multiple_of(32) as u32;
        let grid = (
            self.row_grid(s, &self.add_rmsnorm_quant_fp8, threads, n_tokens)?,
            1,
            1,
        );
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.add_rmsnorm_quant_fp8, grid, threads, &mut a) }
    }

    /// [`Kernels::silu_mul`] then [`Kernels::quantize_rows_fp8`] of its output in one kernel,
    /// with the same values: rows `[gate | up]` of `gate_up` become `inter` e4m3 bytes in `q`
    /// and one scale in `qscale`. With `gate_up_scales = Some((xs, ws))`, `gate_up` is an FP8
    /// GEMM's unscaled product (ws: 2 inter) and [`Kernels::fp8_rescale`]'s arithmetic is
    /// applied to it first; `xs` may be `qscale`.
    ///
    /// # Safety
    /// q: n_tokens x inter bytes; qscale, xs: n_tokens; gate_up: n_tokens x 2 inter; ws: 2 inter.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn silu_mul_quant_fp8(
        &self,
        s: &CudaStream,
        q: Dptr<u8>,
        qscale: Dptr<f32>,
        gate_up: Dptr<bf16>,
        gate_up_scales: Option<(Dptr<f32>, Dptr<f32>)>,
        n_tokens: usize,
        inter: usize,
    ) -> Result<()> {
        if n_tokens == 0 {
            return Ok(());
        }
        let (xs, ws) = gate_up_scales.unwrap_or((Dptr::null(), Dptr::null()));
        if !inter.is_multiple_of(8)
            || n_tokens > u32::MAX as usize
            || inter > (i32::MAX / 2) as usize
            || !ws.addr().is_multiple_of(16)
        {
            return Err(KernelError::Unsupported(format!(
                "fused SiLU-mul and FP8 quantization of {n_tokens} x {inter} (scales at {ws:?})"
            )));
        }
        let (qa, sa, g, xa, wa, i) = (
            q.addr(),
            qscale.addr(),
            gate_up.addr(),
            xs.addr(),
            ws.addr(),
            inter as i32,
        );
        let rows = n_tokens as u32;
        let mut a = [
            arg(&qa),
            arg(&sa),
            arg(&g),
            arg(&xa),
            arg(&wa),
            arg(&i),
            arg(&rows),
        ];
        // SILU_Q_VEC (2) vectors of 8 per thread, at most SILU_Q_THREADS (1024) threads (fp8.cu)
        let threads = (inter / 8).div_ceil(2).clamp(32, 1024).next_multiple_of(32) as u32;
        let grid = (
            self.row_grid(s, &self.silu_mul_quant_fp8, threads, n_tokens)?,
            1,
            1,
        );
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.silu_mul_quant_fp8, grid, threads, &mut a) }
    }

    /// Blocks for a row kernel whose blocks take rows `blockIdx.x`, `+ gridDim.x`, ...: as
    /// many as are resident at once (every multiprocessor full, no second wave that would
    /// leave some idle at the end), at most one per row.
    fn row_grid(&self, s: &CudaStream, f: &CudaFunction, threads: u32, rows: usize) -> Result<u32> {
        s.context().bind_to_thread()?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)?
            .max(1);
        let resident = self.num_sms().saturating_mul(per_sm).max(1);
        Ok(resident.min(u32::try_from(rows).unwrap_or(u32::MAX)))
    }

    /// The inverse of [`Kernels::quantize_rows_fp8`]: `y[r, i] = bf16(scale[r] * q[r, i])`.
    ///
    /// # Safety
    /// q: rows x k bytes; scale: rows; y: rows x k.
    pub unsafe fn dequantize_rows_fp8(
        &self,
        s: &CudaStream,
        y: Dptr<bf16>,
        q: Dptr<u8>,
        scale: Dptr<f32>,
        rows: usize,
        k: usize,
    ) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        if rows > u32::MAX as usize || k > i32::MAX as usize {
            return Err(KernelError::Unsupported(format!(
                "FP8 dequantization of {rows} x {k}"
            )));
        }
        let (qa, sa, ya, ki) = (q.addr(), scale.addr(), y.addr(), k as i32);
        let mut a = [arg(&qa), arg(&sa), arg(&ya), arg(&ki)];
        // SAFETY: argument types match the kernel; the caller guarantees the extents.
        unsafe { self.launch(s, &self.dequantize_fp8, (rows as u32, 1, 1), 256, &mut a) }
    }
}
