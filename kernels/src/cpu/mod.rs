//! CPU numeric kernels: products of weight matrices (GGUF block formats Q4_0, Q4_1, Q8_0 and
//! row-major F32, F16, BF16) with f32 activations, and the thread pool they run on.
//!
//! How a quantized product works: each activation row is quantized once per call to 8-bit
//! blocks of 32 values with one f32 scale (like ggml's Q8_0/Q8_1 activation blocks), then each
//! output is a sum over blocks of `scale_w * scale_x * (integer dot of the 32 pairs)` plus, for
//! Q4_1, `min_w * scale_x * sum(x quants)`. The integer dots run on SIMD units picked at run
//! time ([`Isa`]): AVX-512 VNNI (512-bit), AVX2 + FMA, or portable scalar code (other architectures and old
//! x86 CPUs). All paths quantize activations identically, so they differ only in the order of
//! f32 additions.
//!
//! Accuracy: the only error beyond f32 rounding comes from the activation quantization; each
//! activation moves by at most half a quantization step (`amax(block) / 254`), so an output moves
//! by at most `sum_blocks amax_x(block) / 254 * sum |w| over the block` (what the tests check).
//!
//! Layout: block-format weights are repacked when loaded so 16 rows are interleaved 4 bytes at
//! a time (`packed.rs`): one 512-bit byte-dot instruction then serves 16 rows (a 256-bit one 8),
//! and the per-block f32 work is done once per 16 (8) rows. [`Weight::dequantize_row`] reads
//! the packed form.
//!
//! Work is split over groups of output rows across the pool ([`set_num_threads`],
//! [`parallel_for`]). For several activation rows (prefill, batched decode) each 16-row group is
//! run against tiles of up to 8 activation rows (4 per pass on AVX2) while its weights sit in
//! L1: each weight block is loaded and unpacked once per tile, and the tile's integer sums stay
//! in registers. Chunks of groups are sized to stay in L2 across passes of 64 activation rows:
//! weights are read from memory once per call whatever `n` is.
//!
//! `SGL_CPU_ISA=scalar|avx2|avx512` caps the instruction set (debugging, comparisons).

mod buffer;
mod dispatch;
mod packed;
mod pool;
mod quant;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_quant;

#[cfg(test)]
mod tests;

pub use buffer::HugeBytes;
pub use dispatch::Isa;
pub use pool::SharedMut;
pub use pool::{num_threads, parallel_chunks_mut, parallel_for, set_num_threads};

/// Storage format of a weight matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
    /// Blocks of 32: f16 scale `d`, 32 × i8; value = d * q.
    Q8_0,
    /// Blocks of 32: f16 scale `d`, 16 bytes of nibbles; value = d * (q - 8).
    Q4_0,
    /// Blocks of 32: f16 scale `d`, f16 min `m`, 16 bytes of nibbles; value = d * q + m.
    Q4_1,
}

/// Elements per quantized block.
pub const BLOCK: usize = 32;

impl WeightFormat {
    /// Elements per storage unit: 32 for block formats, 1 for float formats.
    pub fn block_elems(self) -> usize {
        match self {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => 1,
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => BLOCK,
        }
    }

    /// Bytes per storage unit (one element or one block).
    pub fn block_bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 | WeightFormat::BF16 => 2,
            WeightFormat::Q8_0 => 34,
            WeightFormat::Q4_0 => 18,
            WeightFormat::Q4_1 => 20,
        }
    }

    /// Whether this is a block-quantized format.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of one row of `cols` elements (`cols` must be a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_elems() * self.block_bytes()
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            WeightFormat::F32 => "F32",
            WeightFormat::F16 => "F16",
            WeightFormat::BF16 => "BF16",
            WeightFormat::Q8_0 => "Q8_0",
            WeightFormat::Q4_0 => "Q4_0",
            WeightFormat::Q4_1 => "Q4_1",
        };
        f.write_str(name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("{format} weight of {rows}x{cols} needs {expected} bytes, got {got}")]
    SizeMismatch {
        format: WeightFormat,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("{format} weight has {cols} columns, not a multiple of the block size {block}")]
    ColsNotBlockAligned {
        format: WeightFormat,
        cols: usize,
        block: usize,
    },
    #[error("weight of {rows}x{cols} is too large")]
    TooLarge { rows: usize, cols: usize },
}

/// A weight matrix: `rows` output features, each a row of `cols` input features. Float formats
/// keep the GGUF row-major bytes; block formats are repacked at construction into groups of 16
/// interleaved rows (see `packed.rs`), which the SIMD kernels read 16 (or 8) rows at a time.
#[derive(Clone)]
pub struct Weight {
    rows: usize,
    cols: usize,
    format: WeightFormat,
    /// Float formats: bytes per row. Block formats: bytes per packed group of 16 rows.
    stride: usize,
    bytes: HugeBytes,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weight")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl Weight {
    /// Bytes in GGUF/ggml layout (row-major, rows × cols elements). Errors on a length that does
    /// not match, or `cols` not a multiple of 32 for block formats.
    pub fn from_raw(
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
    ) -> Result<Weight, KernelError> {
        let block = format.block_elems();
        if !cols.is_multiple_of(block) {
            return Err(KernelError::ColsNotBlockAligned {
                format,
                cols,
                block,
            });
        }
        let row_bytes = (cols / block)
            .checked_mul(format.block_bytes())
            .ok_or(KernelError::TooLarge { rows, cols })?;
        let expected = row_bytes
            .checked_mul(rows)
            .ok_or(KernelError::TooLarge { rows, cols })?;
        if bytes.len() != expected {
            return Err(KernelError::SizeMismatch {
                format,
                rows,
                cols,
                expected,
                got: bytes.len(),
            });
        }
        if format.is_quantized() {
            let nb = cols / BLOCK;
            let bytes = packed::pack(format, rows, nb, &bytes);
            let stride = nb * packed::block_group_bytes(format);
            return Ok(Weight {
                rows,
                cols,
                format,
                stride,
                bytes,
            });
        }
        Ok(Weight {
            rows,
            cols,
            format,
            stride: row_bytes,
            bytes: HugeBytes::copy_of(&bytes),
        })
    }

    /// An F32 weight from row-major values.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Result<Weight, KernelError> {
        let expected = rows
            .checked_mul(cols)
            .ok_or(KernelError::TooLarge { rows, cols })?;
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                format: WeightFormat::F32,
                rows,
                cols,
                expected: expected.saturating_mul(4),
                got: data.len().saturating_mul(4),
            });
        }
        let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Weight::from_raw(WeightFormat::F32, rows, cols, bytes)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes of weight data held (what one full product reads).
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Float formats: the bytes of row `row`.
    pub(crate) fn row_data(&self, row: usize) -> &[u8] {
        debug_assert!(!self.format.is_quantized());
        &self.bytes[row * self.stride..(row + 1) * self.stride]
    }

    /// Block formats: the packed bytes of row group `g` (rows `16g..16g + 16`).
    pub(crate) fn group_data(&self, g: usize) -> &[u8] {
        debug_assert!(self.format.is_quantized());
        &self.bytes[g * self.stride..(g + 1) * self.stride]
    }

    /// Dequantize one row to f32 (used for embedding lookup).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.rows,
            "dequantize_row: row {row} of {}",
            self.rows
        );
        assert_eq!(
            out.len(),
            self.cols,
            "dequantize_row: output length must equal cols"
        );
        if self.format.is_quantized() {
            let group = self.group_data(row / packed::GROUP);
            packed::dequantize_row(self.format, group, row % packed::GROUP, out);
        } else {
            scalar::dequantize_float_row(self.format, self.row_data(row), out);
        }
    }
}

/// `out[i*rows + r] = sum_c x[i*cols + c] * W[r, c]` for `i in 0..n`. Multi-threaded.
pub fn matmul(w: &Weight, x: &[f32], n: usize, out: &mut [f32]) {
    dispatch::matmul_with(Isa::detect(), w, x, n, out);
}

/// Several products with the same input: `outs[k] = x · ws[k]ᵀ` as [`matmul`] would compute
/// them (bit-identical results), but quantizing `x` once and running one pool job for all
/// weights (e.g. q, k, v, or gate and up). All weights must have the same `cols`.
pub fn matmul_multi(ws: &[&Weight], x: &[f32], n: usize, outs: &mut [&mut [f32]]) {
    matmul_multi_with(ws, x, n, outs, None);
}

/// [`matmul_multi`], calling `side(i, of)` once for each `i in 0..of` from the job's tasks,
/// between row groups (when the weights are block-quantized; otherwise never), where `of` is
/// the number of row groups of all weights. For memory prefetches of what comes next: a
/// batched product is compute-bound and leaves most of the memory bandwidth idle.
pub fn matmul_multi_with(
    ws: &[&Weight],
    x: &[f32],
    n: usize,
    outs: &mut [&mut [f32]],
    side: Option<&(dyn Fn(usize, usize) + Sync)>,
) {
    assert_eq!(ws.len(), outs.len(), "matmul_multi: one output per weight");
    let Some(first) = ws.first() else {
        return;
    };
    let cols = first.cols();
    assert!(
        ws.iter().all(|w| w.cols() == cols),
        "matmul_multi: weights must have the same number of columns"
    );
    let isa = Isa::detect();
    let fused = cols > 0 && n > 0 && ws.iter().all(|w| w.format().is_quantized());
    if !fused {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            dispatch::matmul_with(isa, w, x, n, out);
        }
        return;
    }
    assert_eq!(
        x.len(),
        n * cols,
        "matmul_multi: x must hold n x cols values"
    );
    for (w, out) in ws.iter().zip(outs.iter()) {
        assert_eq!(
            out.len(),
            n * w.rows(),
            "matmul_multi: out must hold n x rows values"
        );
    }
    dispatch::matmul_packed_multi(isa, ws, x, n, outs, side);
}

/// [`matmul`] on a chosen instruction set (one of [`Isa::all_supported`]; panics otherwise), for
/// tests and benchmarks.
pub fn matmul_with_isa(isa: Isa, w: &Weight, x: &[f32], n: usize, out: &mut [f32]) {
    dispatch::matmul_with(isa, w, x, n, out);
}
