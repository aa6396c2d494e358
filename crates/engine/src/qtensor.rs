//! QTensor: a 2-D weight in its stored type, memory-mapped or owned, and the ONLY place in the
//! engine that dispatches on a dtype. Model files call `matmul`, `row_f32` and `to_f32`, never
//! a per-type kernel.
//!
//! Three numeric modes, chosen per tensor (`set_act_quant`, `set_llamacpp_order`):
//! - exact f32 (the default, and always for f32/f16/bf16 weights): weights dequantized to f32,
//!   f32 products — what transformers computes on the dequantized checkpoint;
//! - llama.cpp's (`--q8-act`, quantized weights only): the activation row is quantized to 8 bits
//!   per block (Q8_0 / Q8_1 / Q8_K, ggml's vec_dot_type) and multiplied with integer dot
//!   products, bit-identical to ggml's vec_dot in decode. Prefill multiplies the dequantized
//!   weight tile by the dequantized 8-bit activations in f32: the same products up to f32
//!   summation order (~1e-7 relative), far below the activation rounding itself, at GEMM speed.
//!   Re-quantizing activations at every layer makes the result discontinuous: a 1e-7 change can
//!   flip a rounding, so two 8-bit runs that differ only in summation order (prefill vs decode
//!   here, or cortiq vs llama.cpp) differ by the 8-bit noise itself (~0.3 in a logit on
//!   Qwen2.5-0.5B). That is why exact f32 is the default: it is the reproducible reference.
//! - llama.cpp's kernel order (`set_llamacpp_order`, part of `Numerics::LlamaCpp`): as the
//!   previous mode, but every token of a prefill chunk is also multiplied with integer dot
//!   products, in the float order llama.cpp uses for its place in the micro-batch (repacked
//!   gemm/gemv, tiled k-quant matmul, or vec_dot; `llamacpp_order`). Slower prefill, llama.cpp's
//!   bits.
//!
//! In prefill a tile of weight rows is dequantized to f32 once and reused for every token of
//! the chunk (the f32 GEMM is ~90% of prefill time).

use std::cell::RefCell;
use std::sync::Arc;

use cortiq_kernels::dot::{dot, gemm_nt};
use cortiq_kernels::quant::{
    ActType, Order, QuantType, act_type, dequantize_act, dequantize_row, llamacpp_order, matvec_q, matvec_q_order,
    order_supported, quantize_act,
};
use rayon::prelude::*;

/// Bytes a QTensor points into: a memory map or an owned buffer.
pub type Backing = Arc<dyn AsRef<[u8]> + Send + Sync>;

#[derive(Clone)]
pub struct QTensor {
    pub name: String,
    pub dtype: QuantType,
    /// Outer dimension (output features for a weight, vocabulary for an embedding).
    pub rows: usize,
    /// Inner, contiguous dimension.
    pub cols: usize,
    backing: Backing,
    offset: usize,
    row_bytes: usize,
    /// Quantize activations as llama.cpp does (only meaningful for quantized dtypes; off by default).
    act_quant: bool,
    /// With `act_quant`: every token in llama.cpp's exact float order for its micro-batch
    /// (`llamacpp_order`), decode and prefill alike, instead of the f32 GEMM for prefill.
    ggml_order: bool,
    /// Whether llama.cpp would keep this matrix in its repacked layout (false for tensors it
    /// reads by row, the token embedding and a tied output).
    repackable: bool,
}

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QTensor({} {} [{}, {}])", self.name, self.dtype, self.rows, self.cols)
    }
}

/// Weight rows per work item: 32 rows of f32 stay in L2 while every token of a chunk streams by.
const TILE_ROWS: usize = 32;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl QTensor {
    /// A view of `rows × cols` elements of `dtype` at `offset` in `backing`. Returns `None` when
    /// the geometry does not fit the type's blocks or the bytes (callers turn that into an
    /// error naming the tensor).
    pub fn new(
        name: impl Into<String>,
        dtype: QuantType,
        rows: usize,
        cols: usize,
        backing: Backing,
        offset: usize,
    ) -> Option<QTensor> {
        let row_bytes = dtype.row_bytes(cols)?;
        let end = offset.checked_add(row_bytes.checked_mul(rows)?)?;
        if end > (*backing).as_ref().len() {
            return None;
        }
        Some(QTensor {
            name: name.into(),
            dtype,
            rows,
            cols,
            backing,
            offset,
            row_bytes,
            act_quant: false,
            ggml_order: false,
            repackable: true,
        })
    }

    /// An owned f32 tensor.
    pub fn from_f32(name: impl Into<String>, rows: usize, cols: usize, data: Vec<f32>) -> QTensor {
        assert_eq!(data.len(), rows * cols);
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        QTensor::new(name, QuantType::F32, rows, cols, Arc::new(bytes), 0).expect("sizes agree")
    }

    /// Choose llama.cpp's 8-bit activations (true) or exact f32 math (false, the default).
    pub fn set_act_quant(&mut self, on: bool) {
        self.act_quant = on;
    }

    /// llama.cpp numerics: 8-bit activations multiplied in the float order llama.cpp's CPU
    /// backend uses for each token of a batch (`on`), or the default prefill GEMM. `repackable`:
    /// whether llama.cpp would repack this matrix (false for the embedding and a tied output).
    pub fn set_llamacpp_order(&mut self, on: bool, repackable: bool) {
        self.ggml_order = on;
        self.repackable = repackable;
    }

    /// The float order llama.cpp uses for token `t` of a batch of `batch`.
    fn order(&self, batch: usize, t: usize) -> Order {
        if self.repackable {
            llamacpp_order(self.dtype, self.rows, batch, t)
        } else if batch >= 8 && order_supported(self.dtype, Order::Tiled) {
            Order::Tiled
        } else {
            Order::VecDot
        }
    }

    /// The activation format this tensor multiplies with, if activations are quantized.
    fn act(&self) -> Option<ActType> {
        if self.act_quant { act_type(self.dtype) } else { None }
    }

    fn rows_data(&self, r0: usize, n: usize) -> &[u8] {
        let start = self.offset + r0 * self.row_bytes;
        &(*self.backing).as_ref()[start..start + n * self.row_bytes]
    }

    fn row_data(&self, r: usize) -> &[u8] {
        let start = self.offset + r * self.row_bytes;
        &(*self.backing).as_ref()[start..start + self.row_bytes]
    }

    /// Dequantize row `r` into `out` (len = cols).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        dequantize_row(self.dtype, self.row_data(r), out);
    }

    /// The whole tensor as f32 (norm gains, biases, small tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, chunk) in out.chunks_mut(self.cols).enumerate() {
            self.row_f32(r, chunk);
        }
        out
    }

    /// `y[t, r] = Σ_k x[t, k] · W[r, k]` for a chunk of `n_t` tokens.
    /// x: [n_t, cols] -> y: [n_t, rows]
    pub fn matmul(&self, x: &[f32], n_t: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n_t * self.cols, "{}: input has {} values, expected {n_t}x{}", self.name, x.len(), self.cols);
        assert_eq!(y.len(), n_t * self.rows, "{}: output has {} values, expected {n_t}x{}", self.name, y.len(), self.rows);
        let act = self.act();
        if let (Some(act), true) = (act, self.ggml_order) {
            self.matmul_ggml(act, x, n_t, y);
            return;
        }
        if n_t == 1 {
            // Decode: y is already [rows] — write tiles straight into it.
            if let Some(act) = act {
                let mut xq = Vec::new();
                quantize_act(act, x, &mut xq);
                y.par_chunks_mut(TILE_ROWS).enumerate().for_each(|(ti, out)| {
                    let r0 = ti * TILE_ROWS;
                    matvec_q(self.dtype, self.rows_data(r0, out.len()), out.len(), self.cols, &xq, out);
                });
                return;
            }
            y.par_chunks_mut(TILE_ROWS).enumerate().for_each(|(ti, out)| self.tile_times(ti * TILE_ROWS, out.len(), x, 1, out));
            return;
        }
        // Prefill with quantized activations: round-trip them through the 8-bit format once.
        let xr;
        let x = match act {
            Some(act) => {
                xr = quantize_roundtrip(act, x, self.cols);
                &xr[..]
            }
            None => x,
        };
        // Prefill: compute yᵀ [rows, n_t] tile by tile (contiguous per tile), then transpose.
        let mut yt = vec![0f32; self.rows * n_t]; // [rows, n_t]
        yt.par_chunks_mut(TILE_ROWS * n_t)
            .enumerate()
            .for_each(|(ti, out)| self.tile_times(ti * TILE_ROWS, out.len() / n_t, x, n_t, out));
        for r in 0..self.rows {
            for t in 0..n_t {
                y[t * self.rows + r] = yt[r * n_t + t];
            }
        }
    }

    /// Every token's row quantized to 8 bits and multiplied in llama.cpp's order for its place
    /// in the batch (`n_t` is the micro-batch). x: [n_t, cols] -> y: [n_t, rows]
    fn matmul_ggml(&self, act: ActType, x: &[f32], n_t: usize, y: &mut [f32]) {
        let xq: Vec<Vec<u8>> = x
            .par_chunks(self.cols)
            .map(|xi| {
                let mut q = Vec::new();
                quantize_act(act, xi, &mut q);
                q
            })
            .collect();
        y.par_chunks_mut(self.rows).zip(xq.par_iter()).enumerate().for_each(|(t, (yt, q))| {
            let order = self.order(n_t, t);
            yt.par_chunks_mut(TILE_ROWS).enumerate().for_each(|(ti, out)| {
                let r0 = ti * TILE_ROWS;
                matvec_q_order(self.dtype, order, self.rows_data(r0, out.len()), out.len(), self.cols, q, out);
            });
        });
    }

    /// out[r_local, t] = W[r0 + r_local] · x[t] for `nr` rows.
    fn tile_times(&self, r0: usize, nr: usize, x: &[f32], n_t: usize, out: &mut [f32]) {
        TILE.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(TILE_ROWS * self.cols, 0.0);
            // Rows are whole blocks and contiguous, so the tile dequantizes in one call.
            dequantize_row(self.dtype, self.rows_data(r0, nr), &mut buf[..nr * self.cols]);
            if n_t == 1 {
                for (r, o) in out.iter_mut().enumerate() {
                    *o = dot(&buf[r * self.cols..(r + 1) * self.cols], x);
                }
                return;
            }
            // gemm_nt's "x" operand is the weight tile, its "w" operand the tokens, so the result
            // lands row-major as [nr, n_t].
            gemm_nt(&buf[..nr * self.cols], nr, x, n_t, self.cols, out, n_t);
        });
    }
}

/// Each `cols`-row of x quantized to `act` and back: x̃ = d·q exactly (the values ggml's integer
/// dot products multiply). x: [n_t, cols] -> [n_t, cols]
fn quantize_roundtrip(act: ActType, x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(cols).zip(x.par_chunks(cols)).for_each(|(o, xi)| {
        let mut q = Vec::new();
        quantize_act(act, xi, &mut q);
        let mut wide = vec![0f64; cols];
        dequantize_act(act, &q, &mut wide);
        for (a, b) in o.iter_mut().zip(&wide) {
            *a = *b as f32;
        }
    });
    out
}
