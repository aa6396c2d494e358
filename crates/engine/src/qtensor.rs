//! QTensor: a 2-D weight in its stored type, memory-mapped or owned, and the ONLY place in the
//! engine that dispatches on a dtype. Model files call `matmul`, `matmul_many`, `row_f32` and
//! `to_f32`, never a per-type kernel.
//!
//! Three numeric modes, chosen per tensor by `set_numerics` (the model sets them all at once):
//! - `Numerics::Fast` (the CLI's default): quantized weights multiply activations quantized to
//!   8 bits per block (Q8_0 / Q8_1 / Q8_K, the format ggml pairs with each weight type) with
//!   integer dot products, in our own kernel order: the arithmetic class llama.cpp uses, at our
//!   speed. Decode is one fused pass per input (`matmul_many`: q/k/v or gate/up share one
//!   activation quantization and one pool dispatch; `matvec_rows_many` the same for the decode
//!   batch's rows); each thread streams one contiguous slab of weight rows. Q4_0, Q5_0, Q8_0,
//!   Q4_K, Q5_K and Q6_K matrices are kept in the 16-row interleaved layout of `quant::ileave`
//!   (`set_interleaved`, set by the model for every multiplied matrix): its kernel serves one
//!   decode row or a batch of them with the same per-row arithmetic. Prefill un-interleaves tiles of rows for
//!   the matmat kernel. Float weights use the exact path.
//! - `Numerics::Exact` (the library default): weights dequantized to f32, f32 products — what
//!   transformers computes on the dequantized checkpoint, the reproducible reference.
//!   Re-quantizing activations at every layer makes results discontinuous (a 1e-7 change can
//!   flip a rounding; ~0.3 in a logit on Qwen2.5-0.5B between two 8-bit runs that differ only
//!   in summation order), which is why the parity tests run exact.
//! - `Numerics::LlamaCpp`: as Fast, but every token in llama.cpp's float order for its place in
//!   the micro-batch (repacked gemm/gemv, tiled k-quant matmul, or vec_dot; `llamacpp_order`):
//!   llama.cpp's bits, slower prefill.
//!
//! Prefill without an integer matmat kernel dequantizes a tile of weight rows to f32 once and
//! reuses it for every token of the chunk (f32 GEMM, ~90% of prefill time).

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cortiq_kernels::dot::{dot, gemm_nt};
use cortiq_kernels::quant::{
    ActType, IL_ROWS, IleaveCols, MatmatActs, Order, QuantType, act_type, dequantize_act, dequantize_row, dequantize_rows,
    ileave, ileave_bytes, ileave_cols, ileave_group_bytes, ileave_rows, ileave_supported, llamacpp_order, matmat_q_prepared,
    matmat_q_prepared_tm, matmat_supported, matvec_fast, matvec_fast_multi, matvec_ileave_cols, matvec_q_order,
    matvec_q_order_tile, order_supported, quantize_act, quantize_act_to,
};

use cortiq_formats::{PageShare, WeightBytes};

use crate::numerics::Numerics;
use crate::par::pool;
use crate::profile::{self, Op};

/// Bytes a QTensor points into: a memory map or an owned buffer.
pub type Backing = Arc<dyn WeightBytes>;

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
    numerics: Numerics,
    /// Whether llama.cpp would keep this matrix in its repacked layout (false for tensors it
    /// reads by row, the token embedding and a tied output). Only `Numerics::LlamaCpp` uses it.
    repackable: bool,
    /// The bytes are in the 16-row interleaved layout of `quant::ileave` (rows padded to a
    /// multiple of 16) rather than GGUF's row-major one: owned (`set_interleaved`), or a .cmf's
    /// interleaved tensor in its file map (`new_interleaved`).
    il: bool,
}

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QTensor({} {} [{}, {}])", self.name, self.dtype, self.rows, self.cols)
    }
}

/// Weight rows per prefill work item: 32 rows of f32 stay in L2 while every token of a chunk
/// streams by.
const TILE_ROWS: usize = 32;
/// Weight rows per tile of the llama.cpp-order prefill (`matmul_ggml`): 16 rows of a 4096-wide
/// Q8_0 matrix are 70 KB, an L2-resident tile every token of the micro-batch passes over.
const GGML_TILE_ROWS: usize = 16;
/// Tokens per thread from which fast prefill splits tokens rather than weight rows.
const TOKEN_SPLIT_MIN: usize = 16;
/// Rows per decode grain: threads get contiguous slabs on multiples of this.
const MATVEC_GRAIN: usize = 16;

/// Positions up to which an interleaved matrix multiplies a prompt chunk with its decode kernel
/// (`matvec_rows`: 16 rows × 8 positions per pass, nothing un-interleaved) rather than the
/// matmat kernel on un-interleaved tiles; the bound `rowwise` applies, on every tier. Measured
/// on Qwen2.5-0.5B Q4_K_M, 2 threads, pp512 by chunk: 64 → 269-329 vs 122-155 tok/s, 128 → 375
/// vs 251, 256 → 387 vs 336, 512 → 272-324 vs 359-450.
///
/// It is `prefix::MAX_CALL`, the longest prefill call, and must stay so: the prompt cache's
/// contract (cached == cold, bit for bit) needs every call of 2..=MAX_CALL positions to take the
/// same product, and the decode kernels' values differ from the matmat kernel's. On the AVX2
/// tier the matmat kernel (`quant::matmat_avx2`) is the faster from ~128 positions on (prefill
/// by chunk size, 2 threads, Intel Xeon Emerald Rapids under `CORTIQ_SIMD=avx2`, 2026-12-06, at
/// 8c01361: Qwen2.5-0.5B 32 → 232 vs 147 tok/s, 64 → 236 vs 209, 128 → 231-239 vs 255-262, 256
/// → 227 vs 282; Gemma3-270M 256 → 688 vs 797), but a lower bound there (16, tried at 0d73fd2)
/// gave a 186 + 2 position prompt tail other values than one call of 188 (Qwen2.5-Coder-0.5B
/// logits up to 0.3 apart: tests/prefix.rs `real_models_cached_equals_cold`). Taking that
/// speed back needs a chunk kernel with the decode kernels' arithmetic.
pub(crate) const IL_MATMAT_MAX: usize = 256;

/// Rows per un-interleaved prefill tile of an interleaved tensor (a few hundred KiB of bytes).
const IL_TILE: usize = 256;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static IL_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Activation rows quantized once per input, per activation format (q/k/v or gate/up may be
/// stored in different types).
#[derive(Default)]
struct ActCache {
    entries: Vec<(ActType, Vec<u8>)>,
}

impl ActCache {
    fn get(&mut self, act: ActType, x: &[f32]) -> &[u8] {
        if let Some(i) = self.entries.iter().position(|(a, _)| *a == act) {
            return &self.entries[i].1;
        }
        let _s = profile::span(Op::QuantizeAct);
        let mut q = Vec::new();
        quantize_act(act, x, &mut q);
        self.entries.push((act, q));
        &self.entries.last().expect("just pushed").1
    }

    /// The input as `get` quantized it to `act` (called for that format before).
    fn quantized(&self, act: ActType) -> &[u8] {
        &self.entries.iter().find(|(k, _)| *k == act).expect("quantized before the dispatch").1
    }
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
        QTensor::view(name, dtype, rows, cols, backing, offset, false)
    }

    /// A view of `rows × cols` elements of `dtype` stored in the 16-row interleaved layout at
    /// `offset` in `backing` (a .cmf's `"layout": "il16"` tensor): the fast decode kernels read it
    /// in place; the other numerics un-interleave the rows they read, as they go. `None` when
    /// the type or width has no such layout or the bytes are short.
    pub fn new_interleaved(
        name: impl Into<String>,
        dtype: QuantType,
        rows: usize,
        cols: usize,
        backing: Backing,
        offset: usize,
    ) -> Option<QTensor> {
        QTensor::view(name, dtype, rows, cols, backing, offset, true)
    }

    /// `new` (row-major bytes) or `new_interleaved` (`il`): the bytes checked against the
    /// layout's size; exact numerics, as every new tensor (`set_numerics` picks the kernels).
    fn view(
        name: impl Into<String>,
        dtype: QuantType,
        rows: usize,
        cols: usize,
        backing: Backing,
        offset: usize,
        il: bool,
    ) -> Option<QTensor> {
        let row_bytes = dtype.row_bytes(cols)?;
        let size = if il {
            ileave_supported(dtype).then(|| ileave_bytes(dtype, rows, cols)).flatten()?
        } else {
            row_bytes.checked_mul(rows)?
        };
        if offset.checked_add(size)? > backing.bytes().len() {
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
            numerics: Numerics::Exact,
            repackable: true,
            il,
        })
    }

    /// An owned f32 tensor.
    pub fn from_f32(name: impl Into<String>, rows: usize, cols: usize, data: Vec<f32>) -> QTensor {
        assert_eq!(data.len(), rows * cols);
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        QTensor::new(name, QuantType::F32, rows, cols, Arc::new(bytes), 0).expect("sizes agree")
    }

    /// The arithmetic of this tensor's products (see the module header). `repackable`: whether
    /// llama.cpp would repack this matrix (false for the embedding and a tied output).
    pub fn set_numerics(&mut self, num: Numerics, repackable: bool) {
        self.numerics = num;
        self.repackable = repackable;
        // An interleaved copy goes back to the row-major bytes; a file's interleaved bytes stay
        // (the other numerics un-interleave the rows they read: no copy of a mixture's experts).
        if num != Numerics::Fast && !(self.il && self.backing.is_file_map()) {
            self.set_interleaved(false);
        }
    }

    /// Rows `r0..r0 + n` as a tensor of their own, sharing the bytes (one expert of a stacked
    /// `[experts × rows, cols]` GGUF tensor). `None` if the range is out of bounds.
    pub fn rows_view(&self, name: impl Into<String>, r0: usize, n: usize) -> Option<QTensor> {
        if r0.checked_add(n)? > self.rows {
            return None;
        }
        let whole_groups = r0.is_multiple_of(IL_ROWS) && (n.is_multiple_of(IL_ROWS) || r0 + n == self.rows);
        if self.il && whole_groups {
            // Whole groups of an interleaved tensor (one expert of a .cmf's stacked experts): a
            // view of the same bytes.
            let gb = ileave_group_bytes(self.dtype, self.cols).expect("an interleaved tensor's type has the layout");
            let at = self.offset + r0 / IL_ROWS * gb;
            let mut t = QTensor::new_interleaved(name, self.dtype, n, self.cols, Arc::clone(&self.backing), at)?;
            t.numerics = self.numerics;
            t.repackable = self.repackable;
            return Some(t);
        }
        if self.il {
            let bytes = self.rows_data(r0, n).into_owned();
            let mut t = QTensor::new(name, self.dtype, n, self.cols, Arc::new(bytes), 0)?;
            t.numerics = self.numerics;
            t.repackable = self.repackable;
            return Some(t);
        }
        let mut t = QTensor::new(name, self.dtype, n, self.cols, Arc::clone(&self.backing), self.offset + r0 * self.row_bytes)?;
        t.numerics = self.numerics;
        t.repackable = self.repackable;
        Some(t)
    }

    /// The listed rows, in that order, as a new owned tensor (load-time re-layout of fused
    /// projections: rows are independent in every type). `None` if a row is out of range.
    pub fn gather_rows(&self, name: impl Into<String>, rows: &[usize]) -> Option<QTensor> {
        let mut bytes = Vec::with_capacity(rows.len() * self.row_bytes);
        for &r in rows {
            if r >= self.rows {
                return None;
            }
            bytes.extend_from_slice(&self.rows_data(r, 1));
        }
        let mut t = QTensor::new(name, self.dtype, rows.len(), self.cols, Arc::new(bytes), 0)?;
        t.numerics = self.numerics;
        t.repackable = self.repackable;
        Some(t)
    }

    /// Tensors of one type and width stacked by rows into a new owned tensor (load-time joins
    /// of projections that share an input). `None` if types or widths differ.
    pub fn concat_rows(name: impl Into<String>, parts: &[&QTensor]) -> Option<QTensor> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.dtype != first.dtype || p.cols != first.cols) {
            return None;
        }
        let mut bytes = Vec::new();
        for p in parts {
            bytes.extend_from_slice(&p.bytes());
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let mut t = QTensor::new(name, first.dtype, rows, first.cols, Arc::new(bytes), 0)?;
        t.numerics = first.numerics;
        t.repackable = first.repackable;
        Some(t)
    }

    /// Size of the stored tensor in bytes.
    pub fn n_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Its bytes in the backing: row-major, or the interleaved groups.
    fn stored(&self) -> std::ops::Range<usize> {
        let n = if self.il {
            ileave_bytes(self.dtype, self.rows, self.cols).expect("an interleaved tensor's type has the layout")
        } else {
            self.rows * self.row_bytes
        };
        self.offset..self.offset + n
    }

    /// Whether products take the interleaved kernels (fast numerics on interleaved bytes).
    fn il_kernels(&self) -> bool {
        self.il && self.numerics == Numerics::Fast
    }

    /// Its first and last rows in GGUF's row-major bytes, with its type and shape: enough to
    /// tell two models' weights apart (a session file's model identity) without reading them.
    pub(crate) fn sample(&self) -> Vec<u8> {
        let mut out = format!("{:?} {}x{}", self.dtype, self.rows, self.cols).into_bytes();
        if self.rows > 0 {
            out.extend_from_slice(&self.rows_data(0, 1));
            out.extend_from_slice(&self.rows_data(self.rows - 1, 1));
        }
        out
    }

    /// The whole tensor in GGUF's row-major bytes (borrowed unless the tensor is interleaved).
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        self.rows_data(0, self.rows)
    }

    /// Keep the bytes in the 16-row interleaved layout (`quant::ileave`: the decode kernel that
    /// reads each weight once for every row of a batch at a fraction of the row-major kernel's
    /// instructions) or in GGUF's. Only `Numerics::Fast` reads the layout, and only Q4_0, Q5_0 and
    /// Q8_0 have it; for anything else this keeps (or restores) the row-major bytes. The
    /// interleaved bytes are a new owned buffer of the same size (plus padding to 16 rows).
    pub fn set_interleaved(&mut self, on: bool) {
        let on = on && self.numerics == Numerics::Fast && ileave_supported(self.dtype);
        if on == self.il {
            return;
        }
        let bytes = if on {
            ileave(self.dtype, &self.rows_data(0, self.rows), self.rows, self.cols)
        } else {
            self.rows_data(0, self.rows).into_owned()
        };
        // The old bytes are not read again here: a map gives their pages back.
        self.backing.release(self.stored());
        self.backing = Arc::new(bytes);
        self.offset = 0;
        self.il = on;
    }

    /// Copy the bytes of an interleaved tensor read from a file map (a .cmf's experts) into
    /// owned memory, huge pages asked for (`--no-mmap` on such a file); anything else is left
    /// as it is. The map's pages are given back.
    pub fn copy_interleaved_to_memory(&mut self) {
        if !self.il || !self.backing.is_file_map() {
            return;
        }
        let r = self.stored();
        let mut v = cortiq_kernels::quant::huge_zeroed(r.len());
        v.copy_from_slice(&self.backing.bytes()[r.clone()]);
        self.backing.release(r);
        self.backing = Arc::new(v);
        self.offset = 0;
    }

    /// Pin this tensor's bytes in memory where they are a file map (`WeightBytes::lock`);
    /// interleaved and other owned bytes are anonymous memory already.
    pub fn lock_resident(&self) -> std::io::Result<()> {
        self.backing.lock(self.stored())
    }

    /// How the page cache holds the file bytes of `tensors` (those still read from a map; the
    /// rest are skipped), from up to `max_windows` 2 MiB windows in all (`PageShare`); `None`
    /// when no tensor is mapped or no map can tell.
    pub fn page_share(tensors: &[&QTensor], max_windows: usize) -> Option<PageShare> {
        let maps = mapped_ranges(tensors);
        let per_map = max_windows.div_ceil(maps.len().max(1));
        maps.into_iter().filter_map(|(b, rs)| b.page_share(&rs, per_map)).reduce(|a, b| a + b)
    }

    /// Bytes of `tensors` read from file maps.
    pub fn mapped_bytes(tensors: &[&QTensor]) -> usize {
        mapped_ranges(tensors).iter().flat_map(|(_, rs)| rs.iter().map(|r| r.len())).sum()
    }

    /// Bytes of `tensors`' file maps not in the page cache (`WeightBytes::missing_bytes`).
    pub fn missing_bytes(tensors: &[&QTensor]) -> usize {
        mapped_ranges(tensors).into_iter().flat_map(|(b, rs)| rs.into_iter().map(move |r| b.missing_bytes(r))).sum()
    }

    /// Bring `tensors`' mapped bytes into memory (`WeightBytes::populate`), in pieces of at most
    /// `piece` bytes; `progress(bytes done, bytes in all)` after each.
    pub fn populate(tensors: &[&QTensor], piece: usize, progress: &dyn Fn(usize, usize)) -> std::io::Result<()> {
        let maps = mapped_ranges(tensors);
        let total: usize = maps.iter().flat_map(|(_, rs)| rs.iter().map(|r| r.len())).sum();
        let mut done = 0;
        for (b, rs) in maps {
            for r in rs {
                for (a, z) in chunks(r.len(), piece.max(1)) {
                    b.populate(r.start + a..r.start + z)?;
                    done += z - a;
                    progress(done, total);
                }
            }
        }
        Ok(())
    }

    /// Whether a mixture's expert of this type is interleaved like a dense matrix rather than
    /// left in the file's layout: on CPUs without AVX-512, whose row-major decode kernels for
    /// the interleavable types run their scalar twins (`quant_types_bench` under
    /// `CORTIQ_SIMD=avx2`, plain layout, n = 1: Q4_K 3.8 GFLOPS against 86 interleaved), and where
    /// prefill takes f32 tiles (Q8_0, IQ4_NL, IQ4_XS on AVX2: a chunk's few rows per expert would
    /// widen the whole matrix; interleaved, up to `IL_MATMAT_MAX` rows run the decode kernel).
    /// `set_interleaved` ignores it for types without the layout.
    pub fn expert_interleaved(&self) -> bool {
        f32_tiles_faster(self.dtype) || cortiq_kernels::simd::level() != cortiq_kernels::simd::Level::Avx512
    }

    /// Whether `o` is a view of the same bytes (a tied output head and embedding).
    pub fn shares_bytes(&self, o: &QTensor) -> bool {
        Arc::ptr_eq(&self.backing, &o.backing) && self.offset == o.offset && self.dtype == o.dtype
    }

    /// Whether the bytes are interleaved (`set_interleaved`).
    pub fn interleaved(&self) -> bool {
        self.il
    }

    /// Rows `r0..r0 + n` times `k` = `ys.len()` activation rows (Q8_0 / Q8_K, [k, row bytes])
    /// with the interleaved kernel: `ys[j][i]` = row r0 + i times activation row j. A range that
    /// cuts a group computes the whole group into a buffer and keeps its rows; each row's value
    /// is the same either way. `prep`: the activation columns, prepared once per dispatch by
    /// the caller (`ileave_cols` on these `acts` for this tensor's type and width).
    fn matvec_il(&self, r0: usize, n: usize, acts: &[u8], prep: &IleaveCols, ys: &mut [&mut [f32]]) {
        let gb = ileave_group_bytes(self.dtype, self.cols).expect("an interleaved tensor's type has the layout");
        let (g0, g1) = (r0 / IL_ROWS, (r0 + n).div_ceil(IL_ROWS));
        let packed = &self.backing.bytes()[self.offset + g0 * gb..self.offset + g1 * gb];
        let run = |ys: &mut [&mut [f32]]| matvec_ileave_cols(self.dtype, packed, self.cols, acts, prep, ys);
        if r0.is_multiple_of(IL_ROWS) && n.is_multiple_of(IL_ROWS) {
            run(ys);
        } else {
            let m = (g1 - g0) * IL_ROWS;
            let mut all = vec![0f32; ys.len() * m]; // [k, m]
            let mut pieces: Vec<&mut [f32]> = all.chunks_exact_mut(m).collect();
            run(&mut pieces);
            let at = r0 - g0 * IL_ROWS;
            for (y, a) in ys.iter_mut().zip(all.chunks_exact(m)) {
                y.copy_from_slice(&a[at..at + n]);
            }
        }
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
        match self.numerics {
            Numerics::Exact => None,
            Numerics::Fast | Numerics::LlamaCpp => act_type(self.dtype),
        }
    }

    /// Rows `r0..r0 + n` in GGUF's row-major bytes: borrowed, or un-interleaved into a new
    /// buffer for an interleaved tensor.
    fn rows_data(&self, r0: usize, n: usize) -> Cow<'_, [u8]> {
        if self.il {
            let mut out = vec![0u8; n * self.row_bytes];
            ileave_rows(self.dtype, &self.backing.bytes()[self.stored()], self.cols, r0, n, &mut out);
            return Cow::Owned(out);
        }
        let start = self.offset + r0 * self.row_bytes;
        Cow::Borrowed(&self.backing.bytes()[start..start + n * self.row_bytes])
    }

    /// `f(first row, its GGUF bytes)` over rows `r0..r0 + n` in pieces: one borrowed piece for a
    /// row-major tensor, tiles of `IL_TILE` rows un-interleaved into a per-thread buffer for an
    /// interleaved one (prefill never holds a whole un-interleaved copy).
    fn with_rows(&self, r0: usize, n: usize, mut f: impl FnMut(usize, &[u8])) {
        if !self.il {
            f(r0, &self.rows_data(r0, n));
            return;
        }
        IL_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            for (a, b) in chunks(n, IL_TILE) {
                buf.resize((b - a) * self.row_bytes, 0);
                ileave_rows(self.dtype, &self.backing.bytes()[self.stored()], self.cols, r0 + a, b - a, &mut buf[..]);
                f(r0 + a, &buf[..]);
            }
        });
    }

    /// Dequantize row `r` into `out` (len = cols).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        dequantize_row(self.dtype, &self.rows_data(r, 1), out);
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
        QTensor::matmul_many(&[self], x, n_t, y);
    }

    /// Two inputs through one weight stream (the speculative pair: a verified token and a
    /// drafted one): `y0 = W·x0`, `y1 = W·x1`, the weights read from memory once for both (the
    /// two-token matmat), where two `matmul` calls would stream them twice. x0, x1: [cols] ->
    /// y0, y1: [rows]
    pub fn matvec2(&self, x0: &[f32], x1: &[f32], y0: &mut [f32], y1: &mut [f32]) {
        let mut x = Vec::with_capacity(2 * self.cols); // [2, cols]
        x.extend_from_slice(x0);
        x.extend_from_slice(x1);
        let mut y = vec![0f32; 2 * self.rows]; // [2, rows]
        self.matmul(&x, 2, &mut y);
        y0.copy_from_slice(&y[..self.rows]);
        y1.copy_from_slice(&y[self.rows..]);
    }

    /// x [n, cols] -> [n, rows], newly allocated. `independent`: the n rows are decode rows of
    /// n different sequences (`matvec_rows`, each row as its own n = 1 step); else n positions
    /// of one sequence (`matmul`). The one switch every mixer's projections go through.
    pub fn project(&self, x: &[f32], n: usize, independent: bool) -> Vec<f32> {
        let mut y = vec![0f32; n * self.rows]; // [n, rows]
        if independent {
            self.matvec_rows(x, n, &mut y);
        } else {
            self.matmul(x, n, &mut y);
        }
        y
    }

    /// `k` decode rows (one per running sequence) through this matrix: `y[j] = W · x[j]`, each
    /// row bit-identical to `matmul(x[j], 1, ..)` — the decode path — whatever the other rows
    /// are, so a sequence's result does not depend on what is batched beside it. Under
    /// `Numerics::Fast` the weights stream once for all rows (`matvec_ileave` or
    /// `matvec_fast_multi`); the other numerics run the rows one by one. x: [k, cols] -> y: [k, rows]
    pub fn matvec_rows(&self, x: &[f32], k: usize, y: &mut [f32]) {
        QTensor::matvec_rows_many(&[self], x, k, y);
    }

    /// `matvec_rows` of several matrices on the same k rows (q|k|v, gate|up) in one pool
    /// dispatch over their concatenated rows, each input row quantized once per activation
    /// format: y [k, Σ rows_i], each row's matrices side by side. Every value is the one
    /// `matvec_rows` (and the decode path) gives: a weight row's result does not depend on the
    /// slab it falls in. x: [k, cols]
    pub fn matvec_rows_many(ws: &[&QTensor], x: &[f32], k: usize, y: &mut [f32]) {
        let (cols, _) = check_many(ws, x, k, y);
        QTensor::matvec_rows_many_strided(ws, x, cols, k, y);
    }

    /// `matvec_rows` of rows that lie `stride` values apart in x (row j at x[j·stride..][..cols]:
    /// the first half of each fused gate|up row, say), each row's value the same as from a
    /// contiguous copy. y: [k, rows]
    pub fn matvec_rows_strided(&self, x: &[f32], stride: usize, k: usize, y: &mut [f32]) {
        assert!(
            stride >= self.cols && (k == 0 || x.len() >= (k - 1) * stride + self.cols),
            "{}: strided input too short",
            self.name
        );
        assert_eq!(y.len(), k * self.rows, "{}: output has {} values, expected {k}x{}", self.name, y.len(), self.rows);
        QTensor::matvec_rows_many_strided(&[self], x, stride, k, y);
    }

    /// `matvec_rows_many` over rows `stride` values apart (shapes checked by the callers).
    fn matvec_rows_many_strided(ws: &[&QTensor], x: &[f32], stride: usize, k: usize, y: &mut [f32]) {
        let cols = ws.first().map_or(0, |w| w.cols);
        let total: usize = ws.iter().map(|w| w.rows).sum();
        if ws.is_empty() || k == 0 {
            return;
        }
        let row = |j: usize| &x[j * stride..j * stride + cols];
        let batched = k > 1 && ws.iter().all(|w| w.numerics == Numerics::Fast && w.act().is_some());
        if !batched {
            let mut yj = vec![0f32; total];
            for (j, out) in y.chunks_exact_mut(total).enumerate() {
                QTensor::matmul_many(ws, row(j), 1, &mut yj);
                out.copy_from_slice(&yj);
            }
            return;
        }
        count_pass(ws);
        // [k, act row bytes] per activation format, quantized once before the dispatch.
        let mut acts: Vec<(ActType, Vec<u8>)> = Vec::new();
        {
            let _s = profile::span(Op::QuantizeAct);
            for act in ws.iter().filter_map(|w| w.act()) {
                if acts.iter().any(|(a, _)| *a == act) {
                    continue;
                }
                let rb = act.row_bytes(cols).expect("activation format fits the weight's blocks");
                let mut all = vec![0u8; k * rb]; // [k, act row bytes]
                // Row by row, over the pool when the rows are long enough to pay for a dispatch
                // (the FFN's down input, not the model width) or there are enough of them (a
                // prompt chunk: jobs of at least QUANTIZE_SPLIT_COLS values); each row's bytes
                // are the same whoever quantizes it.
                let grain = if cols >= QUANTIZE_SPLIT_COLS {
                    1
                } else if k * cols >= QUANTIZE_SPLIT_MIN {
                    QUANTIZE_SPLIT_COLS.div_ceil(cols)
                } else {
                    k
                };
                pool().for_rows_mut(&mut all, rb, grain, |j0, rows| {
                    for (j, out) in rows.chunks_exact_mut(rb).enumerate() {
                        quantize_act_to(act, row(j0 + j), out);
                    }
                });
                acts.push((act, all));
            }
        }
        let preps = il_preps(ws, cols, |act| &acts.iter().find(|(t, _)| *t == act).expect("quantized above").1);
        let starts = row_starts(ws);
        let t0 = profile::enabled().then(std::time::Instant::now);
        let (acts, preps) = (&acts, &preps);
        // Each thread's slab of the concatenated rows (its tail shared out), written straight
        // into every sequence's row of y [k, total].
        pool().for_cols_mut_balanced(y, k, total, MATVEC_GRAIN, piece_rows(ws), |c0, outs| {
            let c1 = c0 + outs[0].len();
            for (w, &s) in ws.iter().zip(&starts) {
                // This thread's slab of the concatenated rows, intersected with matrix w.
                let (a, b) = (c0.max(s), c1.min(s + w.rows));
                if a >= b {
                    continue;
                }
                let mut o: Vec<&mut [f32]> = outs.iter_mut().map(|y| &mut y[a - c0..b - c0]).collect();
                let (r0, n) = (a - s, b - a);
                let act = w.act().expect("batched: every matrix quantizes its input");
                let q = &acts.iter().find(|(t, _)| *t == act).expect("quantized before the dispatch").1;
                if w.il_kernels() {
                    w.matvec_il(r0, n, q, prep_of(preps, w.dtype), &mut o);
                } else {
                    let mut yt = vec![0f32; n * k]; // [n, k]
                    matvec_fast_multi(w.dtype, &w.rows_data(r0, n), n, w.cols, q, k, &mut yt);
                    for (j, y) in o.iter_mut().enumerate() {
                        for (i, v) in y.iter_mut().enumerate() {
                            *v = yt[i * k + j];
                        }
                    }
                }
            }
        });
        profile_dispatch(ws, k, t0);
    }

    /// Several matrices on one input: `y[t] = [W_0 · x[t], W_1 · x[t], ...]` with the outputs
    /// of one token side by side (q|k|v, gate|up). x: [n_t, cols] -> y: [n_t, Σ rows_i].
    /// Decode (n_t == 1) quantizes x once per activation format and runs every matrix in one
    /// pool dispatch, each thread streaming a contiguous slab of the concatenated rows.
    pub fn matmul_many(ws: &[&QTensor], x: &[f32], n_t: usize, y: &mut [f32]) {
        let (_, total) = check_many(ws, x, n_t, y);
        if ws.is_empty() || n_t == 0 {
            return;
        }
        count_pass(ws);
        if n_t == 1 {
            matvec_many(ws, x, y);
            return;
        }
        if let [w] = ws {
            w.matmat(x, n_t, y);
            return;
        }
        let mut r0 = 0;
        for w in ws {
            let mut yi = vec![0f32; n_t * w.rows]; // [n_t, rows_i]
            w.matmat(x, n_t, &mut yi);
            for t in 0..n_t {
                y[t * total + r0..][..w.rows].copy_from_slice(&yi[t * w.rows..][..w.rows]);
            }
            r0 += w.rows;
        }
    }

    /// One token through several matrices, each on its own input, in one pool dispatch:
    /// `y = [W_0 · x_0, W_1 · x_1, ...]` (an MoE layer's routed experts' down projections, one
    /// weight stream for all of them instead of one dispatch each). Every value is the one
    /// `matmul(x_i, 1, ..)` gives. xs[i]: [cols_i] -> y: [Σ rows_i]
    pub fn matvec_each(ws: &[&QTensor], xs: &[&[f32]], y: &mut [f32]) {
        assert_eq!(ws.len(), xs.len(), "matvec_each: {} matrices, {} inputs", ws.len(), xs.len());
        for (w, x) in ws.iter().zip(xs) {
            assert_eq!(x.len(), w.cols, "{}: input has {} values, expected {}", w.name, x.len(), w.cols);
        }
        let total: usize = ws.iter().map(|w| w.rows).sum();
        assert_eq!(y.len(), total, "matvec_each: output has {} values, expected {total}", y.len());
        if ws.is_empty() {
            return;
        }
        count_pass(ws);
        matvec_inputs(ws, xs, y);
    }

    /// Whether `matmul` over n positions gives every row exactly what `matvec_rows` (the decode
    /// path, each row alone) gives: one position, or a chunk an interleaved matrix multiplies
    /// with its decode kernel (up to `IL_MATMAT_MAX`). Then the rows of several sequences'
    /// chunks may share one product (`Model::forward_batch`) without changing any value.
    pub fn rowwise(&self, n: usize) -> bool {
        n == 1
            || (self.il
                && n <= IL_MATMAT_MAX
                && self.numerics != Numerics::LlamaCpp
                && self.act().is_some()
                && matmat_supported(self.dtype))
    }

    /// Prefill product for n_t > 1. x: [n_t, cols] -> y: [n_t, rows]
    fn matmat(&self, x: &[f32], n_t: usize, y: &mut [f32]) {
        let _s = profile::matmul(self.dtype, n_t);
        let act = self.act();
        if let (Some(act), Numerics::LlamaCpp) = (act, self.numerics) {
            self.matmul_ggml(act, x, n_t, y);
            return;
        }
        if self.rowwise(n_t) {
            self.matvec_rows(x, n_t, y);
            return;
        }
        if let (Some(act), true) = (act, matmat_supported(self.dtype))
            && !f32_tiles_faster(self.dtype)
        {
            self.matmat_int8(act, x, n_t, y);
            return;
        }
        // Quantized activations: round-trip them through the 8-bit format once.
        let xr;
        let x = match act {
            Some(act) => {
                xr = quantize_roundtrip(act, x, self.cols);
                &xr[..]
            }
            None => x,
        };
        // Compute yᵀ [rows, n_t] tile by tile (contiguous per tile), then transpose.
        let mut yt = vec![0f32; self.rows * n_t]; // [rows, n_t]
        pool().for_rows_mut(&mut yt, n_t, TILE_ROWS, |r0, out| self.tile_times(r0, out.len() / n_t, x, n_t, out));
        transpose_into(&yt, self.rows, n_t, y);
    }

    /// Fast prefill: every token's row quantized to 8 bits once, then the integer matmat kernel
    /// over each thread's slab of weight rows (the weights stay in their stored blocks).
    /// x: [n_t, cols] -> y: [n_t, rows]
    fn matmat_int8(&self, act: ActType, x: &[f32], n_t: usize, y: &mut [f32]) {
        let cols = self.cols;
        let arb = act.row_bytes(cols).expect("activation format fits the weight's blocks");
        // (An interleaved matrix splits rows: each thread un-interleaves only its own rows, once.)
        if n_t >= TOKEN_SPLIT_MIN * pool().n_threads() && !self.il {
            // Tokens split over the pool: each thread quantizes its tokens and multiplies them
            // by the whole matrix, writing its own rows of y [n_t, rows] (no transpose, no
            // [rows, n_t] buffer). Every thread reads every weight tile, which prefill reuses
            // across hundreds of tokens anyway (and the tiles of one matrix fit in L3).
            pool().for_rows_mut(y, self.rows, TOKEN_SPLIT_MIN, |t0, ys| {
                let nt = ys.len() / self.rows;
                let mut xq = vec![0u8; nt * arb]; // [nt, arb]
                let mut q = Vec::with_capacity(arb);
                for (i, out) in xq.chunks_mut(arb).enumerate() {
                    quantize_act(act, &x[(t0 + i) * cols..(t0 + i + 1) * cols], &mut q);
                    out.copy_from_slice(&q);
                }
                let prep = MatmatActs::new(self.dtype, &xq, cols, nt);
                self.with_rows(0, self.rows, |r0, w| {
                    let nr = w.len() / self.row_bytes;
                    matmat_q_prepared_tm(self.dtype, w, nr, &prep, &mut ys[r0..], self.rows);
                });
            });
            return;
        }
        let mut xq = vec![0u8; n_t * arb]; // [n_t, arb]
        {
            let _s = profile::span(Op::QuantizeAct);
            pool().for_rows_mut(&mut xq, arb, 8, |t0, rows| {
                let mut q = Vec::with_capacity(arb);
                for (i, out) in rows.chunks_mut(arb).enumerate() {
                    quantize_act(act, &x[(t0 + i) * cols..(t0 + i + 1) * cols], &mut q);
                    out.copy_from_slice(&q);
                }
            });
        }
        let prep = MatmatActs::new(self.dtype, &xq, cols, n_t);
        let mut yt = vec![0f32; self.rows * n_t]; // [rows, n_t]
        pool().for_rows_mut(&mut yt, n_t, TILE_ROWS, |r0, out| {
            let nr = out.len() / n_t;
            self.with_rows(r0, nr, |r, w| {
                let n = w.len() / self.row_bytes;
                matmat_q_prepared(self.dtype, w, n, &prep, &mut out[(r - r0) * n_t..(r - r0 + n) * n_t]);
            });
        });
        transpose_into(&yt, self.rows, n_t, y);
    }

    /// Every token's row quantized to 8 bits and multiplied in llama.cpp's order for its place
    /// in the batch (`n_t` is the micro-batch). Each (weight row, token) dot product depends
    /// only on that row, that token's 8-bit row and the token's order, so the work is blocked by
    /// weight rows: a tile of `GGML_TILE_ROWS` rows stays in L1 while every token passes over
    /// it, and each weight is read from memory once per call instead of once per token (the
    /// per-token form streamed a 0.5B model's weights 512 times a chunk: `ppl --numerics
    /// llamacpp` was memory-bound). Same dot products, same bits.
    /// x: [n_t, cols] -> y: [n_t, rows]
    fn matmul_ggml(&self, act: ActType, x: &[f32], n_t: usize, y: &mut [f32]) {
        let cols = self.cols;
        let arb = act.row_bytes(cols).expect("activation format fits the weight's blocks");
        let mut xq = vec![0u8; n_t * arb]; // [n_t, arb]
        {
            let _s = profile::span(Op::QuantizeAct);
            pool().for_rows_mut(&mut xq, arb, 8, |t0, rows| {
                for (i, out) in rows.chunks_mut(arb).enumerate() {
                    quantize_act_to(act, &x[(t0 + i) * cols..(t0 + i + 1) * cols], out);
                }
            });
        }
        let orders: Vec<Order> = (0..n_t).map(|t| self.order(n_t, t)).collect();
        let mut yt = vec![0f32; self.rows * n_t]; // [rows, n_t]
        pool().for_rows_mut(&mut yt, n_t, GGML_TILE_ROWS, |r0, out| {
            let nr = out.len() / n_t;
            let mut col = [0f32; GGML_TILE_ROWS];
            for (a, b) in chunks(nr, GGML_TILE_ROWS) {
                let w = self.rows_data(r0 + a, b - a);
                let col = &mut col[..b - a];
                for (t, (&order, q)) in orders.iter().zip(xq.chunks_exact(arb)).enumerate() {
                    matvec_q_order_tile(self.dtype, order, &w, b - a, cols, q, col);
                    for (i, &v) in col.iter().enumerate() {
                        out[(a + i) * n_t + t] = v;
                    }
                }
            }
        });
        transpose_into(&yt, self.rows, n_t, y);
    }

    /// out[r_local, t] = W[r0 + r_local] · x[t] for `nr` rows, through an f32 tile.
    fn tile_times(&self, r0: usize, nr: usize, x: &[f32], n_t: usize, out: &mut [f32]) {
        if n_t == 1 && self.dtype == QuantType::F32 && !self.il {
            // An f32 matrix (a router, say) in one token's product: its rows where they lie,
            // without the copy into a tile (the same values, so the same dots).
            let data = self.rows_data(r0, nr);
            if let Some(w) = cortiq_kernels::dot::f32s_of_bytes(&data) {
                for (o, row) in out.iter_mut().zip(w.chunks_exact(self.cols)) {
                    *o = dot(row, x);
                }
                return;
            }
        }
        TILE.with(|buf| {
            let mut buf = buf.borrow_mut();
            for (c0, c1) in chunks(nr, TILE_ROWS) {
                let n = c1 - c0;
                buf.resize(TILE_ROWS * self.cols, 0.0);
                dequantize_rows(self.dtype, &self.rows_data(r0 + c0, n), self.cols, &mut buf[..n * self.cols]);
                let out = &mut out[c0 * n_t..c1 * n_t];
                if n_t == 1 {
                    for (r, o) in out.iter_mut().enumerate() {
                        *o = dot(&buf[r * self.cols..(r + 1) * self.cols], x);
                    }
                } else {
                    // gemm_nt's "x" operand is the weight tile, its "w" operand the tokens, so
                    // the result lands row-major as [n, n_t].
                    gemm_nt(&buf[..n * self.cols], n, x, n_t, self.cols, out, n_t);
                }
            }
        });
    }
}

/// Whether prefill's quantized products of `ty` run faster as f32 tiles (the weights widened 32
/// rows at a time, the activations rounded through their 8-bit format, then `gemm_nt`) than
/// through the integer matmat: Q8_0, IQ4_NL and IQ4_XS on CPUs with AVX2 and no AVX-512, whose
/// unsigned quants (0..255, table levels + 128 up to 241) do not fit `vpmaddubsw`
/// (`matmat_bench` 1536x1536x512, AMD EPYC Zen 4 under `CORTIQ_SIMD=avx2`, one thread: 12 G
/// MAC/s integer against 30 through the f32 tiles; IQ4_NL / IQ4_XS 9 / 12 against 19-27 on a
/// Xeon, `matmat_bench 640 2048 64 lut`; the other types, MXFP4 included, run 2-3x the f32
/// tiles there). The values are the same products of the same 8-bit activations, summed in
/// another order.
fn f32_tiles_faster(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q8_0 | QuantType::IQ4NL | QuantType::IQ4XS)
        && cortiq_kernels::simd::level() == cortiq_kernels::simd::Level::Avx2
}

/// y = ytᵀ: yt [rows, n_t] -> y [n_t, rows], tokens split over the pool, rows in blocks of 16
/// so both sides stay in cache.
fn transpose_into(yt: &[f32], rows: usize, n_t: usize, y: &mut [f32]) {
    pool().for_rows_mut(y, rows, 8, |t0, ys| {
        let nt = ys.len() / rows;
        for (r0, r1) in chunks(rows, 16) {
            for i in 0..nt {
                let t = t0 + i;
                for r in r0..r1 {
                    ys[i * rows + r] = yt[r * n_t + t];
                }
            }
        }
    });
}

/// `[start, end)` pieces of `0..n` of at most `step`.
fn chunks(n: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(step)).map(move |i| (i * step, ((i + 1) * step).min(n)))
}

/// One token through several matrices in one dispatch. x: [cols] -> y: [Σ rows_i]
fn matvec_many(ws: &[&QTensor], x: &[f32], y: &mut [f32]) {
    matvec_inputs(ws, &vec![x; ws.len()], y);
}

/// The file ranges `tensors` read from their maps (owned bytes, interleaved copies among them,
/// are skipped), per backing, in order, adjacent ranges merged.
fn mapped_ranges<'a>(tensors: &[&'a QTensor]) -> Vec<(&'a Backing, Vec<std::ops::Range<usize>>)> {
    let mut maps: Vec<(&Backing, Vec<std::ops::Range<usize>>)> = Vec::new();
    for t in tensors.iter().filter(|t| t.backing.is_file_map()) {
        let r = t.stored();
        match maps.iter_mut().find(|(b, _)| Arc::ptr_eq(b, &t.backing)) {
            Some((_, rs)) => rs.push(r),
            None => maps.push((&t.backing, vec![r])),
        }
    }
    for (_, rs) in &mut maps {
        rs.sort_by_key(|r| r.start);
        let mut merged: Vec<std::ops::Range<usize>> = Vec::new();
        for r in rs.drain(..) {
            match merged.last_mut() {
                Some(m) if m.end >= r.start => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        *rs = merged;
    }
    maps
}

/// One token through several matrices, matrix i on its own input xs[i], in one dispatch:
/// `matvec_many` where the inputs differ (an MoE layer's routed experts' down projections).
/// Each distinct input (the same slice given twice counts once) is quantized once per
/// activation format before the dispatch; every row's value is the one the matrix gives alone.
/// xs[i]: [cols_i] -> y: [Σ rows_i]
fn matvec_inputs(ws: &[&QTensor], xs: &[&[f32]], y: &mut [f32]) {
    // The distinct inputs, and which one each matrix reads.
    let mut inputs: Vec<&[f32]> = Vec::new();
    let which: Vec<usize> = xs
        .iter()
        .map(|x| match inputs.iter().position(|i| std::ptr::eq(*i, *x)) {
            Some(i) => i,
            None => {
                inputs.push(x);
                inputs.len() - 1
            }
        })
        .collect();
    // Quantize each input once per activation format, before the dispatch.
    let mut caches: Vec<ActCache> = inputs.iter().map(|_| ActCache::default()).collect();
    for (w, &i) in ws.iter().zip(&which) {
        if let Some(a) = w.act() {
            caches[i].get(a, inputs[i]);
        }
    }
    let quantized = |i: usize, act: ActType| caches[i].quantized(act);
    let preps: Vec<Vec<(QuantType, IleaveCols)>> = (0..inputs.len())
        .map(|i| {
            let mine: Vec<&QTensor> = ws.iter().zip(&which).filter(|(_, j)| **j == i).map(|(w, _)| *w).collect();
            il_preps(&mine, inputs[i].len(), |act| quantized(i, act))
        })
        .collect();
    let t0 = profile::enabled().then(std::time::Instant::now);
    let starts = row_starts(ws);
    let (preps, caches) = (&preps, &caches);
    // Each thread's slab of the concatenated rows, its tail shared out (every row's value is
    // the same whichever thread or piece computes it).
    pool().for_cols_mut_balanced(y, 1, y.len(), MATVEC_GRAIN, piece_rows(ws), |g0, outs| {
        let out = &mut *outs[0];
        let g1 = g0 + out.len();
        for ((w, &s), &i) in ws.iter().zip(&starts).zip(&which) {
            // This thread's slab of the concatenated rows, intersected with matrix w.
            let (a, b) = (g0.max(s), g1.min(s + w.rows));
            if a >= b {
                continue;
            }
            let o = &mut out[a - g0..b - g0];
            let (r0, n) = (a - s, b - a);
            match w.act() {
                Some(act) => {
                    let q = caches[i].quantized(act);
                    if w.il_kernels() {
                        w.matvec_il(r0, n, q, prep_of(&preps[i], w.dtype), &mut [o]);
                    } else if w.numerics == Numerics::Fast {
                        matvec_fast(w.dtype, &w.rows_data(r0, n), n, w.cols, q, o);
                    } else {
                        // llama.cpp's order for a one-token batch: its repacked gemv where it
                        // repacks the matrix (Q4_0 / Q4_K / Q2_K, rows a multiple of 8), else
                        // vec_dot. Each row's sum is independent of the slab it falls in.
                        matvec_q_order(w.dtype, w.order(1, 0), &w.rows_data(r0, n), n, w.cols, q, o);
                    }
                }
                None => w.tile_times(r0, n, inputs[i], 1, o),
            }
        }
    });
    profile_dispatch(ws, 1, t0);
}

/// The shared input and output width of `ws` (q|k|v, gate|up) on n rows, checked: (cols, Σ rows).
#[track_caller]
fn check_many(ws: &[&QTensor], x: &[f32], n: usize, y: &[f32]) -> (usize, usize) {
    let cols = ws.first().map_or(0, |w| w.cols);
    let total: usize = ws.iter().map(|w| w.rows).sum();
    for w in ws {
        assert_eq!(w.cols, cols, "{}: {} columns, the other matrices of this input have {cols}", w.name, w.cols);
    }
    let name = || ws.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join("+");
    assert_eq!(x.len(), n * cols, "{}: input has {} values, expected {n}x{cols}", name(), x.len());
    assert_eq!(y.len(), n * total, "{}: output has {} values, expected {n}x{total}", name(), y.len());
    (cols, total)
}

/// The interleaved kernels' activation columns for each interleaved weight type among `ws`,
/// prepared once per dispatch (not per thread and piece); `quantized(act)` is the input
/// quantized to `act`.
fn il_preps<'a>(ws: &[&QTensor], cols: usize, quantized: impl Fn(ActType) -> &'a [u8]) -> Vec<(QuantType, IleaveCols)> {
    let mut preps: Vec<(QuantType, IleaveCols)> = Vec::new();
    for w in ws.iter().filter(|w| w.il_kernels()) {
        if !preps.iter().any(|(t, _)| *t == w.dtype) {
            let act = w.act().expect("an interleaved tensor quantizes its input");
            preps.push((w.dtype, ileave_cols(w.dtype, cols, quantized(act))));
        }
    }
    preps
}

/// The prepared columns for interleaved weight type `ty` (`il_preps` made one for each).
fn prep_of(preps: &[(QuantType, IleaveCols)], ty: QuantType) -> &IleaveCols {
    &preps.iter().find(|(t, _)| *t == ty).expect("il_preps covers every interleaved type of the dispatch").1
}

/// Row width from which a batch's activation rows are quantized over the pool (one row per
/// item): at 896 values a row takes ~1 us, less than a dispatch saves; at 4864 ~4 us.
const QUANTIZE_SPLIT_COLS: usize = 2048;
/// Values in a batch from which its narrower rows are quantized over the pool too (a prompt
/// chunk of the model width: 256 × 1536 values took 0.25 ms on one thread, the other idle).
const QUANTIZE_SPLIT_MIN: usize = 16 * QUANTIZE_SPLIT_COLS;

/// Weight bytes of one piece of a balanced split (`Pool::for_cols_mut_balanced`), at least:
/// ~20 us of one core's stream, fine enough that the last pieces even out the threads' finish,
/// coarse enough that claiming them (one compare-and-swap each) costs nothing.
const PIECE_BYTES: usize = 256 << 10;
/// Weight bytes of one piece at most, reached where a dispatch is large enough to cut each
/// thread's slab into `SLAB_PIECES` pieces of more than `PIECE_BYTES`. Every piece starts a
/// new stream (the activation row unpacked again, a claim, the stream's first lines): a
/// mixture's dispatch of 16 expert matrices (~14 MB) in 256 KiB pieces decoded 5-7% slower than in
/// 1 MiB ones (2026-12-08, AMD EPYC Zen 4, the Qwen3-30B-A3B-geometry GGUF on the map, tg32
/// alternated: 14.45 / 15.61 / 16.50 tok/s at 256 KiB / 512 KiB / 1 MiB, 4 MiB no better),
/// while a dense model's matrices keep pieces of ~256 KiB (a shared core needs them, BENCHMARKS
/// "the decode batch's glue and its threads' balance").
const PIECE_BYTES_MAX: usize = 1 << 20;
/// Pieces per thread's slab that a large dispatch keeps at least.
const SLAB_PIECES: usize = 8;

/// Rows of `ws` (concatenated) per piece of a balanced split: `SLAB_PIECES` pieces a thread,
/// of `PIECE_BYTES..=PIECE_BYTES_MAX` bytes of the widest rows.
fn piece_rows(ws: &[&QTensor]) -> usize {
    let row_bytes = ws.iter().map(|w| w.row_bytes).max().unwrap_or(1).max(1);
    let total: usize = ws.iter().map(|w| w.rows * w.row_bytes).sum();
    let bytes = (total / (pool().n_threads() * SLAB_PIECES)).clamp(PIECE_BYTES, PIECE_BYTES_MAX);
    (bytes / row_bytes).max(MATVEC_GRAIN)
}

/// Where each matrix starts in the concatenated rows of a fused dispatch.
fn row_starts(ws: &[&QTensor]) -> Vec<usize> {
    ws.iter()
        .scan(0, |acc, w| {
            let s = *acc;
            *acc += w.rows;
            Some(s)
        })
        .collect()
}

/// Profile: a fused dispatch's wall time (since `t0`, set when profiling), shared among its
/// matrices by their byte counts.
fn profile_dispatch(ws: &[&QTensor], k: usize, t0: Option<std::time::Instant>) {
    if let Some(t0) = t0 {
        let ns = t0.elapsed().as_nanos() as f64;
        let bytes: f64 = ws.iter().map(|w| (w.rows * w.row_bytes) as f64).sum();
        for w in ws {
            profile::add_matmul(w.dtype, k, ns * (w.rows * w.row_bytes) as f64 / bytes);
        }
    }
}

/// Each `cols`-row of x quantized to `act` and back: x̃ = d·q exactly (the values the integer
/// dot products multiply). x: [n_t, cols] -> [n_t, cols]
fn quantize_roundtrip(act: ActType, x: &[f32], cols: usize) -> Vec<f32> {
    let _s = profile::span(Op::QuantizeAct);
    let mut out = vec![0f32; x.len()];
    pool().for_rows_mut(&mut out, cols, 1, |t0, o| {
        let (mut q, mut wide) = (Vec::new(), vec![0f64; cols]);
        for (i, orow) in o.chunks_mut(cols).enumerate() {
            let t = t0 + i;
            quantize_act(act, &x[t * cols..(t + 1) * cols], &mut q);
            dequantize_act(act, &q, &mut wide);
            for (a, b) in orow.iter_mut().zip(&wide) {
                *a = *b as f32;
            }
        }
    });
    out
}

/// Products started over a weight matrix, each a pass over its bytes (a matrix in a fused
/// q|k|v or gate|up call counts once; a decode row run alone counts once per row): what a
/// serving step costs in weight reads. One relaxed add per matrix call.
static WEIGHT_PASSES: AtomicU64 = AtomicU64::new(0);

/// The bytes of those passes: each matrix's stored size once per product call (a decode
/// step's count over the model's `decode_weight_bytes` says whether it reads only what it
/// must: the routed experts, each once).
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

fn count_pass(ws: &[&QTensor]) {
    WEIGHT_PASSES.fetch_add(ws.len() as u64, Ordering::Relaxed);
    WEIGHT_BYTES.fetch_add(ws.iter().map(|w| w.n_bytes() as u64).sum(), Ordering::Relaxed);
}

/// `WEIGHT_PASSES` so far (process-wide; take a difference around the work measured).
pub fn weight_passes() -> u64 {
    WEIGHT_PASSES.load(Ordering::Relaxed)
}

/// `WEIGHT_BYTES` so far (process-wide, like `weight_passes`).
pub fn weight_bytes() -> u64 {
    WEIGHT_BYTES.load(Ordering::Relaxed)
}
