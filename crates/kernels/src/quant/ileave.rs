//! Row-interleaved layout of Q4_0, Q5_0 and Q8_0 weights for decode (`Numerics::Fast`), and its
//! matvec for 1..k activation rows: the serving core's decode batch and the single-sequence
//! decode step run the same kernel.
//!
//! Why a layout of our own: in the row-major GGUF layout a 32-element block of one row fills
//! half of a 512-bit register, so each block of each activation row costs a `vpdpbusd`, a
//! convert, a multiply and an FMA for 32 products, and the block's float step must then be
//! reduced across lanes. With 16 rows interleaved, lane r of a register holds 4 consecutive
//! quants of row r: one `vpdpbusd` against 4 activation bytes broadcast does 64 products of 16
//! rows, the 16 lanes are the 16 rows' exact block sums (no lane reduction at all) and one
//! convert, multiply and FMA per block serve 16 rows. Decode of these types was compute-bound
//! (about half the bandwidth roofline with 2 threads, and a 4-row batch cost 1.8x one row);
//! here the weight unpack is shared by all columns and each extra column costs 11 instructions
//! per 16 × 32 weights.
//!
//! Layout: rows in groups of `IL_ROWS` = 16 (the last group padded with zero rows), groups back
//! to back, within a group the blocks b = 0..cols/32 back to back, each block-group holding the
//! 16 rows' block b (the same bytes as 16 GGUF blocks):
//! - 16 f16 scales (32 bytes, row order);
//! - Q5_0 only: 8 × u64 high-bit masks, mask m bit 4r + i = the 5th bit of element 4m + i of
//!   row r (64 bytes);
//! - Q4_0 / Q5_0: 4 × 64 bytes of nibbles, chunk c bytes 4r..4r+4 = row r's `qs[4c..4c+4]`
//!   (low nibbles: elements 4c.., high nibbles: elements 16 + 4c..);
//! - Q8_0: 8 × 64 bytes, chunk c bytes 4r..4r+4 = row r's quants 4c..4c+4 stored unsigned
//!   (q + 128).
//!
//! Arithmetic (both twins, bit for bit): per row r and block b the exact integer sum
//! `i = Σ u·a - off·Σ a` (u the unsigned quant 0..15 / 0..31 / 0..255, off 8 / 16 / 128),
//! then `acc_r = fma(f32(i), d_w · d_a, acc_r)` block after block; y_r = acc_r. Each column
//! (activation row) is computed by the same instructions whatever the other columns are, so
//! every column is bit-identical to the kernel run on that row alone.

use super::QuantType;
use super::blocks::f16_le;

/// Rows per interleaved group.
pub const IL_ROWS: usize = 16;

/// The most columns one pass over a group takes (its results' buffer and the kernels' column
/// arrays): the AVX2 Q8_0 kernel's `Q8_PASS`.
const PASS_COLS: usize = 16;

/// Columns per pass of the AVX-512 kernels (one accumulator register per column) and of the
/// AVX2 Q4_0 / Q5_0 ones over few columns (two: the group's two 8-row halves; their
/// many-column passes take `PRE_PASS`; the k-quant kernels take 4).
const WIDE: usize = 8;

/// One pass's results: `out[j][r]` = row r of the group times the pass's column j.
pub(super) type PassOut = [[f32; IL_ROWS]; PASS_COLS];

/// The bytes a kernel prefetches while it works on one group: `fetch(off, len)` asks for the
/// lines of `w[at + off + prefetch_distance()..][..len]` that exist. A kernel calls it once per block
/// (or sub-block) with that piece's offset inside the group, so the prefetches trickle out at
/// the rate the kernel consumes bytes. One burst per group (10-60 KiB of prefetches at the top
/// of each group) filled the miss queues and stalled the kernel's own loads: the streamed
/// kernel then cost its compute plus its memory time instead of the larger of the two
/// (`examples/multivec_bench 65536 896 q5_0`, one thread: k = 1 2.9-3.1 ms → 1.3-1.9, k = 4
/// 4.4 → 2.3-3.0).
#[derive(Clone, Copy)]
pub(super) struct Ahead<'a> {
    w: &'a [u8],
    at: usize,
}

impl Ahead<'_> {
    #[inline(always)]
    pub(super) fn fetch(self, off: usize, len: usize) {
        super::vecdot_avx512::prefetch_ahead(self.w, self.at + off, len);
    }
}

/// The pass structure every interleaved SIMD kernel shares: the columns `cs` (activation rows
/// of `ab` bytes in `acts`) in passes of at most `pass` (<= P) columns over the groups of
/// `packed` (`gb` bytes a group); `one(group, ahead, j0, kk, a, c, out)` computes one group for
/// the columns j0..j0 + kk (`a`, `c`: the pass's rows and prepared columns, `pass_cols`) into
/// `out`, which lands in `ys[j0 + j][16 g..16 g + 16]` (`groups`). With k <= pass that is one
/// pass over every group (the per-group set-up paid once per matrix); with more columns the
/// passes go group by group within blocks of `COL_BLOCK` columns, so that a group's bytes (or
/// its decoded form) stay in cache for its later passes and a block's activations stay in L2
/// for the next group. A block's columns are split into as few passes as `pass` allows, of
/// sizes differing by at most one (9 columns: 5 + 4, not 8 + 1: a pass costs its group's
/// unpack and float steps whatever its width), and each pass's column arrays are built once
/// per block, not once per group. The first pass over a group in a block (`first_pass`)
/// prefetches and decodes.
#[allow(clippy::type_complexity)]
pub(super) fn passes<'a, C, const P: usize>(
    (packed, gb, pass): (&[u8], usize, usize),
    (acts, ab, cs): (&'a [u8], usize, &'a [C]),
    ys: &mut [&mut [f32]],
    mut one: impl FnMut(&[u8], Ahead, usize, usize, &[&'a [u8]; P], &[&'a C; P], &mut PassOut),
) {
    let (k, n_groups) = (cs.len(), packed.len() / gb);
    let mut out = [[0f32; IL_ROWS]; PASS_COLS];
    if k <= pass {
        let (a, c) = pass_cols::<C, P>(acts, ab, cs, 0, k);
        groups(packed, gb, (0, n_groups), 0, k, ys, &mut out, |grp, pf, out| one(grp, pf, 0, k, &a, &c, out));
        return;
    }
    debug_assert!(pass <= P);
    for jb in (0..k).step_by(COL_BLOCK) {
        let n = (jb + COL_BLOCK).min(k) - jb;
        let np = n.div_ceil(pass);
        let mut js = Vec::with_capacity(np);
        let mut j0 = jb;
        for p in 0..np {
            let kk = n / np + usize::from(p < n % np);
            js.push((j0, kk, pass_cols::<C, P>(acts, ab, cs, j0, kk)));
            j0 += kk;
        }
        for g in 0..n_groups {
            for &(j0, kk, (ref a, ref c)) in &js {
                groups(packed, gb, (g, g + 1), j0, kk, ys, &mut out, |grp, pf, out| one(grp, pf, j0, kk, a, c, out));
            }
        }
    }
}

/// Columns per block of `passes` (a multiple of every kernel's pass).
const COL_BLOCK: usize = 64;

/// Whether the pass starting at column j0 is the first over its group in its column block.
#[inline]
pub(super) fn first_pass(j0: usize) -> bool {
    j0.is_multiple_of(COL_BLOCK)
}

/// One pass's activation rows and prepared columns: slot j holds column j0 + j for j < kk; the
/// spare slots repeat the last column (their results are computed and dropped), so a kernel
/// with a fixed column count reads valid rows.
pub(super) fn pass_cols<'a, C, const P: usize>(
    acts: &'a [u8],
    ab: usize,
    cs: &'a [C],
    j0: usize,
    kk: usize,
) -> ([&'a [u8]; P], [&'a C; P]) {
    (std::array::from_fn(|j| &acts[(j0 + j.min(kk - 1)) * ab..][..ab]), std::array::from_fn(|j| &cs[j0 + j.min(kk - 1)]))
}

/// Group g of `packed` (`gb` bytes a group) through `one(group, ahead, out)` for g in g0..g1,
/// each result landing in `ys[j0 + j][16 g..16 g + 16]` for j < kk.
#[inline]
#[allow(clippy::too_many_arguments)]
fn groups(
    packed: &[u8],
    gb: usize,
    (g0, g1): (usize, usize),
    j0: usize,
    kk: usize,
    ys: &mut [&mut [f32]],
    out: &mut PassOut,
    mut one: impl FnMut(&[u8], Ahead, &mut PassOut),
) {
    // One result buffer for every group and pass (`passes` owns it): each kernel call writes
    // out[j] whole for the j < kk it computes, the only rows read back (a fresh zeroed buffer
    // per group was a memset call per 16 rows, ~1% of a decode step, 2% of a prefill).
    for g in g0..g1 {
        let ahead = if first_pass(j0) { Ahead { w: packed, at: g * gb } } else { Ahead { w: &[], at: 0 } };
        one(&packed[g * gb..(g + 1) * gb], ahead, out);
        for (j, o) in out.iter().enumerate().take(kk) {
            ys[j0 + j][g * IL_ROWS..(g + 1) * IL_ROWS].copy_from_slice(o);
        }
    }
}

/// Whether `ty` has an interleaved layout (Q4_0, Q5_0, Q8_0 here; Q4_K, Q5_K, Q6_K in `ileave_k`).
pub fn ileave_supported(ty: QuantType) -> bool {
    geo(ty).is_some() || matches!(ty, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K)
}

/// Bytes of one interleaved group of 16 rows of `cols` elements (16 × the row bytes, and for
/// Q4_K its unpacked scales on top), or `None` for an unsupported type or width.
pub fn ileave_group_bytes(ty: QuantType, cols: usize) -> Option<usize> {
    if ty == QuantType::Q4K {
        return cols.is_multiple_of(256).then(|| cols / 256 * super::ileave_k::GBB);
    }
    if ty == QuantType::Q6K {
        return cols.is_multiple_of(256).then(|| cols / 256 * super::ileave_k::Q6_GBB);
    }
    if ty == QuantType::Q5K {
        return cols.is_multiple_of(256).then(|| cols / 256 * super::ileave_k::Q5_GBB);
    }
    geo(ty)?;
    IL_ROWS.checked_mul(ty.row_bytes(cols)?)
}

/// Bytes of one activation row of `cols` elements for `ty`'s kernel (Q8_0, Q8_K for Q4_K).
fn act_row_bytes(ty: QuantType, cols: usize) -> usize {
    if matches!(ty, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K) { cols / 256 * 292 } else { cols / 32 * 34 }
}

/// (block bytes, quant offset) of the interleaved types.
fn geo(ty: QuantType) -> Option<(usize, i32)> {
    match ty {
        QuantType::Q4_0 => Some((18, 8)),
        QuantType::Q5_0 => Some((22, 16)),
        QuantType::Q8_0 => Some((34, 128)),
        _ => None,
    }
}

/// Bytes of the interleaved form of `rows × cols` elements of `ty` (rows padded to a whole
/// number of groups), or `None` for an unsupported type or a width that is not whole blocks.
pub fn ileave_bytes(ty: QuantType, rows: usize, cols: usize) -> Option<usize> {
    rows.div_ceil(IL_ROWS).checked_mul(ileave_group_bytes(ty, cols)?)
}

/// The interleaved form of `rows` row-major rows of `ty` (`w`: rows × row bytes), padded with
/// zero rows to a multiple of `IL_ROWS`. Groups are packed in parallel (load time).
#[track_caller]
pub fn ileave(ty: QuantType, w: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    use rayon::prelude::*;
    let gbytes = ileave_group_bytes(ty, cols).unwrap_or_else(|| panic!("ileave({ty}): no interleaved layout for {cols} columns"));
    let rb = ty.row_bytes(cols).expect("whole blocks");
    assert_eq!(w.len(), rows * rb, "ileave({ty}): {rows}x{cols} needs {} bytes, got {}", rows * rb, w.len());
    let groups = rows.div_ceil(IL_ROWS);
    if matches!(ty, QuantType::Q4K | QuantType::Q5K) {
        let mut out = huge_zeroed(groups * gbytes);
        super::ileave_k::ileave(ty == QuantType::Q5K, w, rows, cols, &mut out);
        return out;
    }
    if ty == QuantType::Q6K {
        let mut out = huge_zeroed(groups * gbytes);
        super::ileave_k::q6_ileave(w, rows, cols, &mut out);
        return out;
    }
    let (bb, _) = geo(ty).expect("checked");
    let mut out = huge_zeroed(groups * IL_ROWS * rb);
    let zero = vec![0u8; rb];
    out.par_chunks_mut((IL_ROWS * rb).max(1)).enumerate().for_each(|(g, dst)| {
        let src: [&[u8]; IL_ROWS] = std::array::from_fn(|r| {
            let row = g * IL_ROWS + r;
            if row < rows { &w[row * rb..(row + 1) * rb] } else { &zero[..] }
        });
        for (b, d) in dst.chunks_exact_mut(IL_ROWS * bb).enumerate() {
            pack_block(ty, &src, b * bb, d);
        }
    });
    out
}

/// `n` zero bytes, asking the kernel for transparent huge pages first (`MADV_HUGEPAGE`, before
/// any page is touched): decode streams these bytes every token, and with 4 KiB pages the
/// hardware prefetchers stop at every page boundary and every page costs a TLB entry. Best
/// effort: a refused advice changes speed, never contents.
pub fn huge_zeroed(n: usize) -> Vec<u8> {
    let mut v = Vec::<u8>::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let p = v.as_mut_ptr() as usize;
        let (start, end) = (p.div_ceil(PAGE) * PAGE, (p + n) / PAGE * PAGE);
        if start < end {
            // SAFETY: [start, end) lies inside the allocation `v` owns (capacity n) and is page
            // aligned; MADV_HUGEPAGE only changes how the kernel backs the pages, never their
            // contents, and none of them has been written yet.
            let _ = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    v.resize(n, 0);
    v
}

/// One block-group: block b (at byte `at`) of the 16 rows `src` (GGUF bytes) into `dst`
/// (16 × block bytes). Quants move 4 bytes at a time (register c, lane r).
fn pack_block(ty: QuantType, src: &[&[u8]; IL_ROWS], at: usize, dst: &mut [u8]) {
    let (scales, body) = dst.split_at_mut(32);
    for (r, row) in src.iter().enumerate() {
        scales[2 * r..2 * r + 2].copy_from_slice(&row[at..at + 2]);
    }
    let (q0, nq, xor, body) = match ty {
        QuantType::Q8_0 => (2, 8, 0x80, body),
        QuantType::Q4_0 => (2, 4, 0, body),
        _ => {
            let (hb, nib) = body.split_at_mut(64);
            let mut masks = [0u64; 8];
            for (r, row) in src.iter().enumerate() {
                let qh = u32::from_le_bytes(row[at + 2..at + 6].try_into().expect("4 bytes")) as u64;
                for (m, mask) in masks.iter_mut().enumerate() {
                    *mask |= ((qh >> (4 * m)) & 0xF) << (4 * r);
                }
            }
            for (d, m) in hb.chunks_exact_mut(8).zip(masks) {
                d.copy_from_slice(&m.to_le_bytes());
            }
            (6, 4, 0, nib)
        }
    };
    for c in 0..nq {
        for (r, row) in src.iter().enumerate() {
            let q = &row[at + q0 + 4 * c..at + q0 + 4 * c + 4];
            for (d, &v) in body[64 * c + 4 * r..64 * c + 4 * r + 4].iter_mut().zip(q) {
                *d = v ^ xor;
            }
        }
    }
}

/// Rows `r0..r0 + n` of an interleaved tensor back in GGUF's row-major bytes (`out`: n × row
/// bytes): the inverse of `ileave` (prefill tiles, embedding rows, file export).
#[track_caller]
pub fn ileave_rows(ty: QuantType, packed: &[u8], cols: usize, r0: usize, n: usize, out: &mut [u8]) {
    let gbytes =
        ileave_group_bytes(ty, cols).unwrap_or_else(|| panic!("ileave_rows({ty}): no interleaved layout for {cols} columns"));
    let rb = ty.row_bytes(cols).expect("whole blocks");
    assert!((r0 + n).div_ceil(IL_ROWS) * gbytes <= packed.len(), "ileave_rows({ty}): rows {r0}..{} out of range", r0 + n);
    assert_eq!(out.len(), n * rb, "ileave_rows({ty}): {n} rows need {} bytes, got {}", n * rb, out.len());
    if matches!(ty, QuantType::Q4K | QuantType::Q5K) {
        let h5 = ty == QuantType::Q5K;
        let gbb = gbytes / (cols / 256);
        for (i, row) in out.chunks_exact_mut(rb).enumerate() {
            let (g, r) = ((r0 + i) / IL_ROWS, (r0 + i) % IL_ROWS);
            for (b, blk) in row.chunks_exact_mut(ty.type_size()).enumerate() {
                super::ileave_k::unpack_block(h5, &packed[g * gbytes + b * gbb..][..gbb], r, blk);
            }
        }
        return;
    }
    if ty == QuantType::Q6K {
        let gbb = super::ileave_k::Q6_GBB;
        for (i, row) in out.chunks_exact_mut(rb).enumerate() {
            let (g, r) = ((r0 + i) / IL_ROWS, (r0 + i) % IL_ROWS);
            for (b, blk) in row.chunks_exact_mut(210).enumerate() {
                super::ileave_k::q6_unpack_block(&packed[g * gbytes + b * gbb..][..gbb], r, blk);
            }
        }
        return;
    }
    let (bb, _) = geo(ty).expect("checked");
    let nb = cols / 32;
    for (i, row) in out.chunks_exact_mut(rb).enumerate() {
        let (g, r) = ((r0 + i) / IL_ROWS, (r0 + i) % IL_ROWS);
        for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
            let src = &packed[(g * nb + b) * IL_ROWS * bb..][..IL_ROWS * bb];
            unpack_block(ty, src, r, blk);
        }
    }
}

/// Row r's GGUF block out of one block-group.
fn unpack_block(ty: QuantType, src: &[u8], r: usize, blk: &mut [u8]) {
    blk[..2].copy_from_slice(&src[2 * r..2 * r + 2]);
    let body = &src[32..];
    let (q0, nq, xor, body) = match ty {
        QuantType::Q8_0 => (2, 8, 0x80, body),
        QuantType::Q4_0 => (2, 4, 0, body),
        _ => {
            let mut qh = 0u32;
            for m in 0..8 {
                let mask = u64::from_le_bytes(body[8 * m..8 * m + 8].try_into().expect("8 bytes"));
                qh |= (((mask >> (4 * r)) & 0xF) as u32) << (4 * m);
            }
            blk[2..6].copy_from_slice(&qh.to_le_bytes());
            (6, 4, 0, &body[64..])
        }
    };
    for c in 0..nq {
        for (d, &v) in blk[q0 + 4 * c..q0 + 4 * c + 4].iter_mut().zip(&body[64 * c + 4 * r..64 * c + 4 * r + 4]) {
            *d = v ^ xor;
        }
    }
}

/// Unsigned quant of element e of row r in a block-group (offset not applied).
fn quant(ty: QuantType, src: &[u8], r: usize, e: usize) -> i32 {
    let body = &src[32..];
    match ty {
        QuantType::Q8_0 => body[(e / 4) * 64 + 4 * r + e % 4] as i32,
        _ => {
            let nib = if ty == QuantType::Q5_0 { &body[64..] } else { body };
            let j = e % 16;
            let byte = nib[(j / 4) * 64 + 4 * r + j % 4];
            let mut u = if e < 16 { byte & 0x0F } else { byte >> 4 } as i32;
            if ty == QuantType::Q5_0 {
                let m = u64::from_le_bytes(body[8 * (e / 4)..8 * (e / 4) + 8].try_into().expect("8 bytes"));
                u |= (((m >> (4 * r + e % 4)) & 1) as i32) << 4;
            }
            u
        }
    }
}

/// The activation side of one column: per block the f32 scale and the offset term `-off·Σ a`
/// (empty where the kernel that reads it has no offset: `ileave_cols`).
#[derive(Default)]
struct Col {
    d: Vec<f32>,
    bias: Vec<i32>,
}

impl Col {
    fn fill(&mut self, act: &[u8], nb: usize, off: Option<i32>) {
        self.d.clear();
        self.bias.clear();
        for blk in act.chunks_exact(34).take(nb) {
            self.d.push(f16_le([blk[0], blk[1]]));
            if let Some(off) = off {
                self.bias.push(-off * blk[2..34].iter().map(|&v| v as i8 as i32).sum::<i32>());
            }
        }
    }
}

#[track_caller]
fn check(func: &str, ty: QuantType, packed: &[u8], cols: usize, acts: &[u8], ys: &[&mut [f32]]) -> (usize, i32) {
    let gb = ileave_group_bytes(ty, cols).unwrap_or_else(|| panic!("{func}({ty}): no interleaved layout for {cols} columns"));
    let off = geo(ty).map_or(0, |g| g.1);
    let (ab, k) = (act_row_bytes(ty, cols), ys.len());
    let n = packed.len() / gb.max(1) * IL_ROWS;
    assert!(
        gb > 0 && packed.len().is_multiple_of(gb) && acts.len() == k * ab && ys.iter().all(|y| y.len() == n),
        "{func}({ty}): {cols} columns times {k} activation rows: weights {} bytes (groups of {gb}), activations {} (expected {}), outputs of {:?} values (expected {n} each)",
        packed.len(),
        acts.len(),
        k * ab,
        ys.iter().map(|y| y.len()).collect::<Vec<_>>(),
    );
    (packed.len() / gb, off)
}

/// `ys[j][r] = W[r] · x̃_j` over whole interleaved groups (`packed`: g groups; each `ys[j]`:
/// 16 g values, the k outputs may be pieces of one [k, ld] matrix) for k = `ys.len()`
/// activation rows quantized by `quantize_act(act_type(ty), ..)` (`acts`: [k, row bytes]: Q8_0,
/// Q8_K for the k-quants); single-threaded (the engine splits groups). AVX-512 VNNI when
/// available, else the scalar twin, bit for bit the same.
#[track_caller]
pub fn matvec_ileave(ty: QuantType, packed: &[u8], cols: usize, acts: &[u8], ys: &mut [&mut [f32]]) {
    check("matvec_ileave", ty, packed, cols, acts, ys);
    matvec_ileave_cols(ty, packed, cols, acts, &ileave_cols(ty, cols, acts), ys);
}

/// The activation side of `matvec_ileave` for one weight type and k activation rows, prepared
/// once: per block the activation's f32 scale and the offset or sub-block sums the kernel adds.
/// `matvec_ileave` prepares it on every call; a caller that cuts one product into
/// many calls (the pieces of a balanced split) prepares it once with `ileave_cols` and passes
/// it to `matvec_ileave_cols`.
pub struct IleaveCols {
    ty: QuantType,
    cols: usize,
    acts_len: usize,
    of: ColsOf,
}

enum ColsOf {
    Legacy(Vec<Col>),
    K(Vec<super::ileave_k::Col>),
    Q6(Vec<super::ileave_k::Col6>),
}

/// The prepared columns of `acts` ([k, row bytes] as `matvec_ileave` takes them) for weights of
/// type `ty` and `cols` columns.
#[track_caller]
pub fn ileave_cols(ty: QuantType, cols: usize, acts: &[u8]) -> IleaveCols {
    assert!(ileave_group_bytes(ty, cols).is_some(), "ileave_cols({ty}): no interleaved layout for {cols} columns");
    let ab = act_row_bytes(ty, cols);
    assert!(acts.len().is_multiple_of(ab), "ileave_cols({ty}): {} activation bytes, not whole rows of {ab}", acts.len());
    let rows = acts.chunks_exact(ab);
    let of = match ty {
        QuantType::Q4K | QuantType::Q5K => ColsOf::K(
            rows.map(|a| {
                let mut c = super::ileave_k::Col::default();
                c.fill(a, cols / 256);
                c
            })
            .collect(),
        ),
        QuantType::Q6K => ColsOf::Q6(
            rows.map(|a| {
                let mut c = super::ileave_k::Col6::default();
                c.fill(a, cols / 256);
                c
            })
            .collect(),
        ),
        _ => {
            // The AVX2 Q8_0 kernel multiplies signed quants: no offset term (the prepared
            // columns of a prompt chunk are built on one thread before the dispatch).
            let off = if ty == QuantType::Q8_0 && crate::simd::level() == crate::simd::Level::Avx2 {
                None
            } else {
                Some(geo(ty).expect("checked").1)
            };
            ColsOf::Legacy(
                rows.map(|a| {
                    let mut c = Col::default();
                    c.fill(a, cols / 32, off);
                    c
                })
                .collect(),
            )
        }
    };
    IleaveCols { ty, cols, acts_len: acts.len(), of }
}

/// `matvec_ileave` with the columns prepared by `ileave_cols(ty, cols, acts)` on these very
/// `acts` (type, width and row count are checked; the contents are the caller's promise).
/// The same kernel and the same values, bit for bit.
#[track_caller]
pub fn matvec_ileave_cols(ty: QuantType, packed: &[u8], cols: usize, acts: &[u8], prep: &IleaveCols, ys: &mut [&mut [f32]]) {
    let (groups, _) = check("matvec_ileave_cols", ty, packed, cols, acts, ys);
    assert!(
        prep.ty == ty && prep.cols == cols && prep.acts_len == acts.len(),
        "matvec_ileave_cols({ty}): columns prepared for {} x {} columns over {} bytes",
        prep.ty,
        prep.cols,
        prep.acts_len
    );
    if groups == 0 || ys.is_empty() {
        return;
    }
    match &prep.of {
        ColsOf::K(cs) => super::ileave_k::matvec_with(ty == QuantType::Q5K, packed, cols, acts, cs, ys),
        ColsOf::Q6(cs) => super::ileave_k::q6_matvec_with(packed, cols, acts, cs, ys),
        ColsOf::Legacy(cs) => {
            if !avx512::matvec(ty, packed, cols / 32, acts, cs, ys) && !avx2::matvec(ty, packed, cols / 32, acts, cs, ys) {
                matvec_ileave_scalar(ty, packed, cols, acts, ys);
            }
        }
    }
}

/// The scalar twin of `matvec_ileave`: the same integer sums and the same FMA chain per row.
#[track_caller]
pub fn matvec_ileave_scalar(ty: QuantType, packed: &[u8], cols: usize, acts: &[u8], ys: &mut [&mut [f32]]) {
    let (groups, off) = check("matvec_ileave_scalar", ty, packed, cols, acts, ys);
    if matches!(ty, QuantType::Q4K | QuantType::Q5K) {
        super::ileave_k::matvec_scalar(ty == QuantType::Q5K, packed, cols, acts, ys);
        return;
    }
    if ty == QuantType::Q6K {
        super::ileave_k::q6_matvec_scalar(packed, cols, acts, ys);
        return;
    }
    let (bb, _) = geo(ty).expect("checked");
    let nb = cols / 32;
    let mut col = Col::default();
    for (j, a) in acts.chunks_exact(34 * nb).enumerate() {
        col.fill(a, nb, Some(off));
        for g in 0..groups {
            let mut acc = [0f32; IL_ROWS];
            for b in 0..nb {
                let src = &packed[(g * nb + b) * IL_ROWS * bb..][..IL_ROWS * bb];
                let q = &a[b * 34 + 2..b * 34 + 34];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let mut i = col.bias[b];
                    for (e, &qa) in q.iter().enumerate() {
                        i += quant(ty, src, r, e) * qa as i8 as i32;
                    }
                    let dw = f16_le([src[2 * r], src[2 * r + 1]]);
                    *acc = (i as f32).mul_add(dw * col.d[b], *acc);
                }
            }
            ys[j][g * IL_ROWS..(g + 1) * IL_ROWS].copy_from_slice(&acc);
        }
    }
}

mod avx512 {
    use super::super::QuantType;
    use super::{Col, IL_ROWS, PASS_COLS};

    /// The SIMD kernel over `groups` groups; `false` (nothing written) without the CPU features.
    pub(super) fn matvec(ty: QuantType, packed: &[u8], nb: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if !super::super::vecdot_avx512::available() {
                return false;
            }
            let bb = super::geo(ty).expect("checked").0;
            let gb = nb * IL_ROWS * bb;
            let ab = 34 * nb;
            macro_rules! go {
                ($T:literal) => {
                    super::passes(
                        (packed, gb, super::WIDE),
                        (acts, ab, cs),
                        ys,
                        |grp, pf, _, kk, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS], out| {
                            // SAFETY: available() confirmed avx512f/bw/vl/vnni, avx2, fma and f16c.
                            unsafe {
                                match kk {
                                    1 => imp::group::<$T, 1>(grp, pf, nb, a, c, out),
                                    2 => imp::group::<$T, 2>(grp, pf, nb, a, c, out),
                                    3 => imp::group::<$T, 3>(grp, pf, nb, a, c, out),
                                    4 => imp::group::<$T, 4>(grp, pf, nb, a, c, out),
                                    5 => imp::group::<$T, 5>(grp, pf, nb, a, c, out),
                                    6 => imp::group::<$T, 6>(grp, pf, nb, a, c, out),
                                    7 => imp::group::<$T, 7>(grp, pf, nb, a, c, out),
                                    _ => imp::group::<$T, 8>(grp, pf, nb, a, c, out),
                                }
                            }
                        },
                    )
                };
            }
            match ty {
                QuantType::Q8_0 => go!(0),
                QuantType::Q4_0 => go!(1),
                _ => go!(2),
            }
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (ty, packed, nb, acts, cs, ys);
            false
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod imp {
        use super::super::{Ahead, Col, IL_ROWS, PASS_COLS};
        use std::arch::x86_64::*;

        /// The 8 registers of unsigned quants of one block-group (T: 0 Q8_0, 1 Q4_0, 2 Q5_0):
        /// register c, lane r = row r's elements 4c..4c+4.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        fn quants<const T: u8>(body: &[u8]) -> [__m512i; 8] {
            let mut u = [_mm512_setzero_si512(); 8];
            if T == 0 {
                assert!(body.len() >= 512);
                for (c, u) in u.iter_mut().enumerate() {
                    // SAFETY: body has >= 512 bytes (asserted): the 64-byte load at 64c is in bounds.
                    *u = unsafe { _mm512_loadu_si512(body.as_ptr().add(64 * c).cast()) };
                }
                return u;
            }
            let (hb, nib) = if T == 2 { body.split_at(64) } else { (&body[..0], body) };
            assert!(nib.len() >= 256);
            let m4 = _mm512_set1_epi8(0x0F);
            // Q5_0's fifth bit, 16 where set: one zero-masked move per register, merged with the
            // nibble mask in one ternary op below ((v & 0x0F) | hi; imm 0xEA = A & B | C). An
            // add under the mask would compile to an or plus a blend: two ops, not one.
            let sixteen = _mm512_set1_epi8(16);
            let hi = |c: usize| {
                if T == 2 {
                    let m = u64::from_le_bytes(hb[8 * c..8 * c + 8].try_into().expect("8 bytes"));
                    _mm512_maskz_mov_epi8(m, sixteen)
                } else {
                    _mm512_setzero_si512()
                }
            };
            for c in 0..4 {
                // SAFETY: nib has >= 256 bytes (asserted): the 64-byte load at 64c is in bounds.
                let v = unsafe { _mm512_loadu_si512(nib.as_ptr().add(64 * c).cast()) };
                if T == 2 {
                    u[c] = _mm512_ternarylogic_epi32::<0xEA>(v, m4, hi(c));
                    u[c + 4] = _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(v), m4, hi(c + 4));
                } else {
                    u[c] = _mm512_and_si512(v, m4);
                    u[c + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                }
            }
            u
        }

        /// One group of 16 rows times K columns (`a[j]`: column j's Q8_0 row, `c[j]` its
        /// scales and offset terms); `out[j][r]` = row r · column j.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(super) fn group<const T: u8, const K: usize>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut [[f32; IL_ROWS]; PASS_COLS],
        ) {
            let bb = [34, 18, 22][T as usize];
            let gbb = IL_ROWS * bb;
            assert!(grp.len() == nb * gbb, "group: {nb} block-groups");
            for j in 0..K {
                assert!(a[j].len() >= 34 * nb && c[j].d.len() >= nb && c[j].bias.len() >= nb, "activation shorter than the row");
            }
            let mut acc = [_mm512_setzero_ps(); K];
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            let dp: [*const f32; K] = std::array::from_fn(|j| c[j].d.as_ptr());
            let bp: [*const i32; K] = std::array::from_fn(|j| c[j].bias.as_ptr());
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                pf.fetch(b * gbb, gbb);
                // SAFETY: src has gbb >= 32 bytes: the 32-byte load of the 16 f16 scales is in bounds.
                let dw = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(src.as_ptr().cast()) });
                let u = quants::<T>(&src[32..]);
                for j in 0..K {
                    // SAFETY: a[j] has >= 34 nb bytes and c[j].d, c[j].bias >= nb entries
                    // (asserted above) and b < nb: the 4-byte reads at 34b + 2 + 4i (i < 8) and
                    // the entries at b are in bounds; unaligned reads.
                    let (q, bias, da) = unsafe { (ap[j].add(34 * b + 2), *bp[j].add(b), *dp[j].add(b)) };
                    // SAFETY: as above, q + 4i..q + 4i + 4 lies inside block b's 32 quants.
                    let bc = |i: usize| _mm512_set1_epi32(unsafe { q.add(4 * i).cast::<i32>().read_unaligned() });
                    // two chains of four (integer sums: any association is exact)
                    let mut p0 = _mm512_set1_epi32(bias);
                    let mut p1 = _mm512_setzero_si512();
                    for i in 0..4 {
                        p0 = _mm512_dpbusd_epi32(p0, u[2 * i], bc(2 * i));
                        p1 = _mm512_dpbusd_epi32(p1, u[2 * i + 1], bc(2 * i + 1));
                    }
                    let s = _mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1));
                    acc[j] = _mm512_fmadd_ps(s, _mm512_mul_ps(dw, _mm512_set1_ps(da)), acc[j]);
                }
            }
            for j in 0..K {
                // SAFETY: out[j] is 16 writable f32; storeu has no alignment requirement.
                unsafe { _mm512_storeu_ps(out[j].as_mut_ptr(), acc[j]) };
            }
        }
    }
}

/// The AVX2 kernel (no AVX-512: Zen 1-3, Intel client cores): the 16 rows of a group as two
/// 8-lane halves, `vpmaddubsw` + `vpmaddwd` for the products of 4 quants (exact: Q4_0/Q5_0's
/// unsigned quants stay under the i16 saturation; Q8_0 takes the signed form, |w| and a·sign(w),
/// whose Σ w·a equals Σ u·a − 128·Σ a, the offset term the others add), then the same
/// convert, multiply and FMA per lane as the scalar twin: the same bits.
#[cfg(target_arch = "x86_64")]
pub(super) use avx2::imp::{bits16 as avx2_bits16, store as avx2_store};

mod avx2 {
    use super::super::QuantType;
    use super::{Col, IL_ROWS, PASS_COLS};

    /// The SIMD kernel over every group; `false` (nothing written) without AVX2/FMA/F16C.
    /// Columns per pass of a many-column product (the decoded group's passes).
    const PRE_PASS: usize = 4;

    pub(super) fn matvec(ty: QuantType, packed: &[u8], nb: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::level() != crate::simd::Level::Avx2 {
                return false;
            }
            let bb = super::geo(ty).expect("checked").0;
            let gb = nb * IL_ROWS * bb;
            let ab = 34 * nb;
            if ty == QuantType::Q8_0 {
                q8(packed, gb, nb, acts, cs, ys);
                return true;
            }
            // More columns than one pass (a prompt chunk): each group is decoded once, at its
            // first pass, into this thread's scratch, and every pass reads it from there (the
            // passes over a group run back to back on one thread: `passes`).
            let many = cs.len() > super::WIDE;
            let pass = if many { PRE_PASS } else { super::WIDE };
            macro_rules! go {
                ($T:literal) => {
                    super::passes(
                        (packed, gb, pass),
                        (acts, ab, cs),
                        ys,
                        |grp, pf, j0, kk, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS], out| {
                            // SAFETY: level() returned Avx2 after detecting avx2, fma and f16c.
                            unsafe {
                                if many {
                                    imp::PRE.with_borrow_mut(|pre| {
                                        if super::first_pass(j0) {
                                            imp::decode_group::<$T>(grp, pf, nb, pre);
                                        }
                                        match kk {
                                            1 => imp::group_pre::<$T, 1>(pre, nb, a, c, out),
                                            2 => imp::group_pre::<$T, 2>(pre, nb, a, c, out),
                                            3 => imp::group_pre::<$T, 3>(pre, nb, a, c, out),
                                            _ => imp::group_pre::<$T, 4>(pre, nb, a, c, out), // kk <= PRE_PASS
                                        }
                                    })
                                } else {
                                    match kk {
                                        1 => imp::group::<$T, 1>(grp, pf, nb, a, c, out),
                                        2 => imp::group::<$T, 2>(grp, pf, nb, a, c, out),
                                        3 => imp::group::<$T, 3>(grp, pf, nb, a, c, out),
                                        4 => imp::group::<$T, 4>(grp, pf, nb, a, c, out),
                                        5 => imp::group::<$T, 5>(grp, pf, nb, a, c, out),
                                        6 => imp::group::<$T, 6>(grp, pf, nb, a, c, out),
                                        7 => imp::group::<$T, 7>(grp, pf, nb, a, c, out),
                                        _ => imp::group::<$T, 8>(grp, pf, nb, a, c, out),
                                    }
                                }
                            }
                        },
                    )
                };
            }
            match ty {
                QuantType::Q4_0 => go!(1),
                _ => go!(2),
            }
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (ty, packed, nb, acts, cs, ys);
            false
        }
    }

    /// Q8_0 columns per pass. Q8_0 has no decoded form worth keeping (its unpack is a sign
    /// flip), so every pass reads the group's bytes (from cache after the first) and a wider
    /// pass pays that unpack and the pass's set-up for more columns: pp128 under
    /// `CORTIQ_SIMD=avx2` (Intel Xeon, 2 threads, 2026-12-06) Qwen3-30B-A3B 4-layer Q8_0
    /// 301-309 → 324-335 tok/s against 8, Granite-4.0-H-Tiny 4-layer 507-545 → 589-596. Its
    /// 16 × 2 accumulators do not fit the 16 registers: they live on the stack, one load and
    /// one store per column and block-half against the 35 vector instructions of its
    /// products. Wider passes (20, 24, 32) measured slower.
    const Q8_PASS: usize = super::PASS_COLS;

    /// `matvec` for Q8_0 on an AVX2 CPU level.
    #[cfg(target_arch = "x86_64")]
    fn q8(packed: &[u8], gb: usize, nb: usize, acts: &[u8], cs: &[Col], ys: &mut [&mut [f32]]) {
        assert!(crate::simd::level() == crate::simd::Level::Avx2, "the AVX2 Q8_0 kernel on another CPU level");
        super::passes(
            (packed, gb, Q8_PASS),
            (acts, 34 * nb, cs),
            ys,
            |grp, pf, _, kk, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS], out| {
                // SAFETY: level() returned Avx2 (asserted above) after detecting avx2, fma and f16c.
                unsafe {
                    match kk {
                        1 => imp::group::<0, 1>(grp, pf, nb, a, c, out),
                        2 => imp::group::<0, 2>(grp, pf, nb, a, c, out),
                        3 => imp::group::<0, 3>(grp, pf, nb, a, c, out),
                        4 => imp::group::<0, 4>(grp, pf, nb, a, c, out),
                        5 => imp::group::<0, 5>(grp, pf, nb, a, c, out),
                        6 => imp::group::<0, 6>(grp, pf, nb, a, c, out),
                        7 => imp::group::<0, 7>(grp, pf, nb, a, c, out),
                        8 => imp::group::<0, 8>(grp, pf, nb, a, c, out),
                        9 => imp::group::<0, 9>(grp, pf, nb, a, c, out),
                        10 => imp::group::<0, 10>(grp, pf, nb, a, c, out),
                        11 => imp::group::<0, 11>(grp, pf, nb, a, c, out),
                        12 => imp::group::<0, 12>(grp, pf, nb, a, c, out),
                        13 => imp::group::<0, 13>(grp, pf, nb, a, c, out),
                        14 => imp::group::<0, 14>(grp, pf, nb, a, c, out),
                        15 => imp::group::<0, 15>(grp, pf, nb, a, c, out),
                        _ => imp::group::<0, 16>(grp, pf, nb, a, c, out),
                    }
                }
            },
        );
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod imp {
        use super::super::{Ahead, Col, IL_ROWS, PASS_COLS};
        use std::arch::x86_64::*;

        /// Q5_0's fifth bits of one register half as bytes of 16: byte j <- bit j of `m`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in crate::quant) fn bits16(m: u32) -> __m256i {
            let v = _mm256_set1_epi32(m as i32);
            let idx =
                _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let sel = _mm256_and_si256(_mm256_shuffle_epi8(v, idx), bit);
            _mm256_and_si256(_mm256_cmpeq_epi8(sel, bit), _mm256_set1_epi8(16))
        }

        /// Half h (rows 8h..8h + 8) of the 8 quant registers of a block-group (T: 0 Q8_0 in
        /// signed form, 1 Q4_0, 2 Q5_0): register c, lane r = row 8h + r's elements 4c..4c+4.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn quants<const T: u8>(body: &[u8], h: usize) -> [__m256i; 8] {
            let mut u = [_mm256_setzero_si256(); 8];
            if T == 0 {
                assert!(body.len() >= 512);
                for (c, u) in u.iter_mut().enumerate() {
                    // SAFETY: 64c + 32h + 32 <= 512 <= body.len() (asserted).
                    let v = unsafe { _mm256_loadu_si256(body.as_ptr().add(64 * c + 32 * h).cast()) };
                    *u = _mm256_xor_si256(v, _mm256_set1_epi8(-128));
                }
                return u;
            }
            let (hb, nib) = if T == 2 { body.split_at(64) } else { (&body[..0], body) };
            assert!(nib.len() >= 256);
            let m4 = _mm256_set1_epi8(0x0F);
            for c in 0..4 {
                // SAFETY: 64c + 32h + 32 <= 256 <= nib.len() (asserted).
                let v = unsafe { _mm256_loadu_si256(nib.as_ptr().add(64 * c + 32 * h).cast()) };
                u[c] = _mm256_and_si256(v, m4);
                u[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            }
            if T == 2 {
                for (c, u) in u.iter_mut().enumerate() {
                    let m = u64::from_le_bytes(hb[8 * c..8 * c + 8].try_into().expect("8 bytes"));
                    *u = _mm256_or_si256(*u, bits16((m >> (32 * h)) as u32));
                }
            }
            u
        }

        /// Activation bytes 4i..4i + 4 in every 32-bit lane (no closures in these kernels:
        /// they would not inherit the target features).
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn bcast4(q: &[u8], i: usize) -> __m256i {
            _mm256_set1_epi32(i32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]))
        }

        /// `super::super::avx512::imp::group` in two 8-row halves.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn group<const T: u8, const K: usize>(
            grp: &[u8],
            pf: Ahead,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut [[f32; IL_ROWS]; PASS_COLS],
        ) {
            let gbb = IL_ROWS * [34, 18, 22][T as usize];
            assert!(grp.len() == nb * gbb, "group: {nb} block-groups");
            check_cols::<T, K>(nb, a, c);
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                pf.fetch(b * gbb, gbb);
                for h in 0..2 {
                    let (u, dw) = half::<T>(src, h);
                    cols::<T, K>(&u, dw, b, h, a, c, &mut acc);
                }
            }
            store::<K>(&acc, out);
        }

        /// A group decoded once for all the passes of a many-column product: per block and
        /// half, the 8 quant registers and the 8 rows' f32 scales.
        #[derive(Default)]
        pub(in crate::quant) struct Pre {
            u: Vec<[__m256i; 8]>,
            dw: Vec<__m256>,
        }

        thread_local! {
            pub(super) static PRE: std::cell::RefCell<Pre> = std::cell::RefCell::new(Pre::default());
        }

        /// Decode every block of a group into `pre` (what `group` decodes per pass).
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn decode_group<const T: u8>(grp: &[u8], pf: Ahead, nb: usize, pre: &mut Pre) {
            let gbb = IL_ROWS * [34, 18, 22][T as usize];
            assert!(grp.len() == nb * gbb, "decode_group: {nb} block-groups");
            pre.u.clear();
            pre.dw.clear();
            for b in 0..nb {
                let src = &grp[b * gbb..(b + 1) * gbb];
                pf.fetch(b * gbb, gbb);
                for h in 0..2 {
                    let (u, dw) = half::<T>(src, h);
                    pre.u.push(u);
                    pre.dw.push(dw);
                }
            }
        }

        /// `group` on a group `decode_group` put in `pre`. Q4_0 / Q5_0 weight-stationary: each
        /// decoded register is loaded once for the pass's columns, read by pointer (the
        /// per-column slices' bounds checks and calls cost as much as the products); the same
        /// exact integer sums and float steps per lane as `group`, so the same bits. Q8_0 does
        /// not come here (`q8`).
        // index loops over columns and steps: the form LLVM unrolls (see ileave_k's `dots`)
        #[allow(clippy::needless_range_loop)]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn group_pre<const T: u8, const K: usize>(
            pre: &Pre,
            nb: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            out: &mut [[f32; IL_ROWS]; PASS_COLS],
        ) {
            assert!(T != 0, "Q8_0 has no decoded form: its passes run `group`");
            assert!(pre.u.len() == 2 * nb && pre.dw.len() == 2 * nb, "group_pre: {nb} blocks decoded");
            check_cols::<T, K>(nb, a, c);
            let mut acc = [[_mm256_setzero_ps(); 2]; K];
            let ones = _mm256_set1_epi16(1);
            let ap: [*const u8; K] = std::array::from_fn(|j| a[j].as_ptr());
            for b in 0..nb {
                let (bias, da): ([&i32; K], [&f32; K]) =
                    (std::array::from_fn(|j| &c[j].bias[b]), std::array::from_fn(|j| &c[j].d[b]));
                for h in 0..2 {
                    let u = &pre.u[2 * b + h];
                    let mut s = [_mm256_setzero_si256(); K];
                    for j in 0..K {
                        s[j] = _mm256_set1_epi32(*bias[j]);
                    }
                    // 4- and 5-bit quants: four product pairs add up in i16 (`cols`)
                    for i0 in [0, 4] {
                        let mut p = [_mm256_setzero_si256(); K];
                        for i in i0..i0 + 4 {
                            let w = u[i];
                            for j in 0..K {
                                // SAFETY: a[j] has >= 34 nb bytes (check_cols) and b < nb: the
                                // 4 bytes at 34 b + 2 + 4i (i < 8) are block b's quants.
                                let x = unsafe { ap[j].add(34 * b + 2 + 4 * i).cast::<i32>().read_unaligned() };
                                let m = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x));
                                p[j] = if i == i0 { m } else { _mm256_add_epi16(p[j], m) };
                            }
                        }
                        for j in 0..K {
                            s[j] = _mm256_add_epi32(s[j], _mm256_madd_epi16(p[j], ones));
                        }
                    }
                    let dw = pre.dw[2 * b + h];
                    for j in 0..K {
                        acc[j][h] =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j]), _mm256_mul_ps(dw, _mm256_set1_ps(*da[j])), acc[j][h]);
                    }
                }
            }
            store::<K>(&acc, out);
        }

        /// The activation rows and prepared columns cover `nb` blocks (Q8_0's columns carry
        /// no offset terms: `ileave_cols`).
        #[inline]
        fn check_cols<const T: u8, const K: usize>(nb: usize, a: &[&[u8]; PASS_COLS], c: &[&Col; PASS_COLS]) {
            for j in 0..K {
                assert!(
                    a[j].len() >= 34 * nb && c[j].d.len() >= nb && (T == 0 || c[j].bias.len() >= nb),
                    "activation shorter than the row"
                );
            }
        }

        /// Half h of one block of a group: its quant registers and its 8 rows' scales.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn half<const T: u8>(src: &[u8], h: usize) -> ([__m256i; 8], __m256) {
            assert!(src.len() >= 32, "a block-group holds 16 scales");
            // SAFETY: src has >= 32 bytes (asserted): the 16-byte load at 16h is in bounds.
            let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(src.as_ptr().add(16 * h).cast()) });
            (quants::<T>(&src[32..], h), dw)
        }

        /// Half h of block b times the K columns, into `acc[j][h]`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        fn cols<const T: u8, const K: usize>(
            u: &[__m256i; 8],
            dw: __m256,
            b: usize,
            h: usize,
            a: &[&[u8]; PASS_COLS],
            c: &[&Col; PASS_COLS],
            acc: &mut [[__m256; 2]; K],
        ) {
            let ones = _mm256_set1_epi16(1);
            // Q8_0's |w|, once for every column (the sign moves onto the activations)
            let au = if T == 0 { u.map(|ui| _mm256_sign_epi8(ui, ui)) } else { *u };
            for j in 0..K {
                let q = &a[j][34 * b + 2..34 * b + 34];
                let mut sum = _mm256_set1_epi32(if T == 0 { 0 } else { c[j].bias[b] });
                if T == 0 {
                    for (i, (&ui, &ai)) in u.iter().zip(&au).enumerate() {
                        let p = _mm256_maddubs_epi16(ai, _mm256_sign_epi8(bcast4(q, i), ui));
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
                    }
                } else {
                    // 4- and 5-bit quants: a product pair is at most 2·31·127 = 7874, so
                    // four of them add up in i16 (31,496) before one widening.
                    for i4 in [0, 4] {
                        let p0 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(u[i4], bcast4(q, i4)),
                            _mm256_maddubs_epi16(u[i4 + 1], bcast4(q, i4 + 1)),
                        );
                        let p1 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(u[i4 + 2], bcast4(q, i4 + 2)),
                            _mm256_maddubs_epi16(u[i4 + 3], bcast4(q, i4 + 3)),
                        );
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_add_epi16(p0, p1), ones));
                    }
                }
                let s = _mm256_cvtepi32_ps(sum);
                acc[j][h] = _mm256_fmadd_ps(s, _mm256_mul_ps(dw, _mm256_set1_ps(c[j].d[b])), acc[j][h]);
            }
        }

        /// The K columns' accumulators (two 8-row halves each) into `out[j]` (also the
        /// k-quant kernels').
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(in crate::quant) fn store<const K: usize>(acc: &[[__m256; 2]; K], out: &mut [[f32; IL_ROWS]; PASS_COLS]) {
            for (o, a) in out.iter_mut().zip(acc) {
                for (h, &v) in a.iter().enumerate() {
                    // SAFETY: o holds 16 f32; 8h + 8 <= 16.
                    unsafe { _mm256_storeu_ps(o.as_mut_ptr().add(8 * h), v) };
                }
            }
        }
    }
}
