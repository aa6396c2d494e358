//! Per-head Nyström landmark attention for O(1)-memory decode: the sealed per-layer state
//! ([`O1Layer`]: sinks, a window ring, landmark tensors, the frozen ridge inverse and the
//! per-landmark far-field accumulators), its streaming step, and the teacher-forced matrix form
//! ([`matrix_form`], all T×T weights in f64) that the streaming step must reproduce and that a
//! trainer trains against. Also the StreamingLLM baseline (sinks + window, far keys dropped) in
//! both forms. No model knowledge: q, k, v arrive already projected, normed and rotated.
//!
//! # The operator (per query head h, kv head g = h / (n_heads / n_kv_heads))
//! The first `tp` positions are the prompt; they run ordinary exact causal attention.
//! * Seal (end of the prompt). m = clamp(tp/8, 4, landmarks) segments, segment i covering
//!   [i·tp/m, (i+1)·tp/m) (integer division). Landmark queries q̃_i = mean of the prompt's
//!   queries over segment i (per query head), landmark keys k̃_i = mean of its keys (per kv head).
//!   Au[i,l] = exp(q̃_i·k̃_l·scale) (rows: landmark queries, columns: landmark keys).
//!   Ridge inverse, f64, frozen after the seal:
//!   `M = (AuᵀAu + λI)⁻¹ Auᵀ,   λ = ridge · tr(AuᵀAu) / m`   (ridge default 1e-3)
//!   solved by Cholesky (AuᵀAu + λI is SPD for λ > 0). M[l,i] has rows over landmark keys l and
//!   columns over landmark queries i, so M ≈ Au⁻¹.
//! * A prompt with tp ≤ window + sinks + 8 seals no skeleton: every key stays exact forever
//!   (plain causal attention, the cache grows). This applies to [`Far::Skeleton`] only;
//!   [`Far::Drop`] (StreamingLLM) always keeps just sinks + window.
//! * Position t ≥ tp. Near keys (t − j < window, or j < sinks) get exp(q_t·k_j·scale − c).
//!   Far keys (every other j ≤ t) get the skeleton weight
//!   `a[t,j] = Σ_i w_i · e[i,j],   w = fu_t · M  (w_i = Σ_l fu_l M[l,i]),`
//!   `fu_l = exp(q_t·k̃_l·scale),   e[i,j] = exp(q̃_i·k_j·scale),`
//!   times e^{−c}: the Nyström estimate F·Au⁺·E of exp(q_t·k_j·scale). (The issue writes
//!   fu·Mᵀ; with M = (AuᵀAu+λI)⁻¹Auᵀ indexed as above the product that reproduces exact
//!   attention when the far keys are the landmark keys is fu·M, which is what is implemented and
//!   what `nystrom_is_exact_on_landmark_keys` pins.)
//!   Aggregate guard: if Σ_far a[t,j] < 0 the row's far field is dropped entirely, otherwise it
//!   is kept raw. The matrix form also offers a per-key clamp max(a[t,j], 0) for ablations.
//!   Output = Σ weight·v / max(Σ weight, 1e-30), every weight carrying the same e^{−c}; the floor
//!   applies to the scaled sum. c = max(max near score, log bound of the far field) (below), so
//!   the near diagonal term alone keeps the scaled sum far from the floor in practice.
//! * Positions are kept: keys are stored already rotated (RoPE applied at their own position) and
//!   are never re-rotated when they move into the sinks, the window or the accumulators. This is
//!   StreamingLLM as the "no position shift" variant.
//!
//! # Streaming form and exponent bookkeeping
//! As a key leaves the window it is folded into per-(query head, landmark) accumulators
//! D_i = Σ_j e[i,j] and N_i = Σ_j e[i,j]·v_j; the far field of a row is then Σ_i w_i·N_i over
//! Σ_i w_i·D_i. A step costs O((window + sinks)·d + m·d + m²) per head, independent of context;
//! the state is O((window + sinks)·d) per kv head plus O(m·d + m²) per query head.
//! Nothing overflows f32, whatever the score magnitudes:
//! * accumulators carry a running log-offset per (head, landmark): true D_i = e^{off_i}·D̂_i,
//!   true N_i = e^{off_i}·N̂_i; a fold with a larger exponent rescales D̂_i, N̂_i and raises off_i
//!   (online-softmax style), so every stored term is ≤ 1 in scale;
//! * M is stored scaled: M = e^{−γ}·M̂ with γ = max_{i,l} q̃_i·k̃_l·scale, i.e. M̂ is the ridge
//!   inverse of Âu = e^{−γ}Au (entries ≤ 1). The ridge commutes with this global scale exactly
//!   (λ scales with the trace), so M̂ is what the f64 solve returns, with no overflow even when
//!   AuᵀAu itself would overflow f64;
//! * fu is max-shifted: f̂u_l = exp(u_l − u_max);
//! * the step assembles far terms as ŵ_i·D̂_i·exp(u_max − γ + off_i − c) in f64, with
//!   c = max(max near score, u_max − γ + max_i off_i); the matrix form uses the same c with
//!   max_i off_i replaced by max over landmarks and far keys of q̃_i·k_j·scale (equal up to the
//!   f32 rounding of the stored offsets; c only matters through the 1e-30 floor).
//!
//! Precision. The far field is a cancelling sum (w has mixed signs, |w| up to ~1/√λ), so rounding
//! in the state is amplified: with single f32 for q̃, k̃, M̂ and the accumulators, this module's
//! random-head tests disagree with the f64 matrix form by up to 6.8e-5 (relative). With
//! [`StatePrecision::Pair`] the small landmark tensors (q̃, k̃, M̂) and the accumulators are
//! stored as f32 hi/lo pairs (value = hi + lo, ~48-bit mantissa; accumulator updates are then
//! effectively compensated sums): that is the checking mode, within ~1e-7. The default is single
//! f32 ([`StatePrecision::Single`]), half the skeleton's bytes: on real models its ppl moves by
//! less than the 1e-4 the streaming/matrix contract allows (measured in BENCHMARKS.md), and at
//! equal state bytes every byte the skeleton saves is window the baseline does not get.
//! The window, sinks and all per-context storage are single f32. Dot products of the step run in
//! f64 over the f32 operands.

// Index loops over several parallel arrays (landmark i, landmark key l, channel c) mirror the
// formulas in the header; iterator zips over four slices would hide them.
#![allow(clippy::needless_range_loop)]

use std::fmt;

/// Largest landmark count accepted (the m×m solve is done by hand in f64).
pub const MAX_LANDMARKS: usize = 256;
/// Default ridge factor: λ = ridge · tr(AuᵀAu) / m. Chosen on real models (lcet10, ctx 2048,
/// W 64, m 64, ppl with --o1): SmolLM2 1e-6 → 47.1 (fast numerics; 54.2 exact), 1e-3 → 40.8,
/// 1e-1 → 41.1; Qwen2.5 and Gemma 3 flat from 1e-4 to 1e-2. A tiny ridge lets M amplify the
/// landmarks' noise; the unit tests below use 1e-6, where the skeleton must be exact on the
/// landmark keys.
pub const DEFAULT_RIDGE: f64 = 1e-3;
/// Output denominator floor (applied to the e^{−c}-scaled sum).
const DEN_FLOOR: f64 = 1e-30;

/// Bad O(1) settings or bad shapes. Setting errors name the CLI flag.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NystromError {
    #[error(
        "the matrix-form check (--o1-check) covers the Nyström skeleton and sink+window, not score eviction or the learned far field"
    )]
    NoMatrixForm,
    #[error("--o1-far linear: this model carries no trained far field (make one with `cortiq polish --o1-far linear`)")]
    NoFarWeights,
    #[error("--o1-window: must be at least 1, got 0")]
    ZeroWindow,
    #[error("--o1-sinks: {sinks} exceeds --o1-window {window}")]
    SinksOverWindow { sinks: usize, window: usize },
    #[error("--o1-landmarks: {landmarks} is outside 4..={MAX_LANDMARKS}")]
    Landmarks { landmarks: usize },
    #[error("--o1-ridge: {ridge} must be finite and > 0")]
    Ridge { ridge: f64 },
    #[error("nystrom: {what}: expected {expected}, found {found}")]
    Shape { what: &'static str, expected: usize, found: usize },
    #[error("nystrom: query segments hold {seen} of the prompt's {tp} positions at the seal")]
    IncompleteSegments { seen: usize, tp: usize },
    #[error("nystrom: ridge system of query head {head} is not positive definite (ridge too small?)")]
    NotPositiveDefinite { head: usize },
}

/// O(1)-decode settings (CLI: --o1-window, --o1-sinks, --o1-landmarks, --o1-ridge).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct O1Settings {
    /// Exact window W: key j is near for query t when t − j < W.
    pub window: usize,
    /// Attention sinks: keys j < sinks are always near.
    pub sinks: usize,
    /// Landmark cap m (m_eff = clamp(tp/8, 4, m)).
    pub landmarks: usize,
    /// Ridge factor (see the module header).
    pub ridge: f64,
    /// Storage of the skeleton's landmark tensors and accumulators (CLI: --o1-state).
    pub state: StatePrecision,
}

/// How the skeleton (q̃, k̃, M̂) and the accumulators are stored. The window and sinks are f32
/// either way; the step's arithmetic is f64 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatePrecision {
    /// Single f32: half the skeleton's bytes. Off the f64 matrix form by up to ~1e-4 relative
    /// per output on random heads (the far field is a cancelling sum, see Precision above);
    /// measured on real models' ppl in BENCHMARKS.md.
    #[default]
    Single,
    /// f32 hi/lo pairs (~48-bit mantissa): within ~1e-7 of the matrix form (`--o1-check`).
    Pair,
}

impl StatePrecision {
    fn pair(self) -> bool {
        self == StatePrecision::Pair
    }
}

impl Default for O1Settings {
    fn default() -> Self {
        O1Settings { window: 512, sinks: 4, landmarks: 64, ridge: DEFAULT_RIDGE, state: StatePrecision::Single }
    }
}

impl O1Settings {
    pub fn validate(&self) -> Result<(), NystromError> {
        if self.window == 0 {
            return Err(NystromError::ZeroWindow);
        }
        if self.sinks > self.window {
            return Err(NystromError::SinksOverWindow { sinks: self.sinks, window: self.window });
        }
        if !(4..=MAX_LANDMARKS).contains(&self.landmarks) {
            return Err(NystromError::Landmarks { landmarks: self.landmarks });
        }
        if !(self.ridge.is_finite() && self.ridge > 0.0) {
            return Err(NystromError::Ridge { ridge: self.ridge });
        }
        Ok(())
    }

    /// Landmark count for a prompt of `tp` tokens: clamp(tp/8, 4, landmarks).
    pub fn m_eff(&self, tp: usize) -> usize {
        (tp / 8).clamp(4, self.landmarks.max(4))
    }

    /// Whether a prompt of `tp` tokens seals a skeleton (else every key stays exact).
    pub fn seals_skeleton(&self, tp: usize) -> bool {
        tp > self.window + self.sinks + 8
    }
}

/// What happens to keys that are neither sinks nor in the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Far {
    /// Nyström landmark skeleton.
    Skeleton,
    /// StreamingLLM: far keys are dropped.
    Drop,
    /// Layer-shared score eviction (`o1::evict`): the same bytes as `Drop`, the kept keys
    /// chosen by the layer's attention instead of by recency; the rest dropped.
    Score(super::evict::ScoreRule),
    /// A learned linear-attention state over the keys that left (`o1::farfield`; its
    /// feature maps come with the model, one set per planned layer), beside sink+window (None)
    /// or beside score eviction's slots (the evicted keys absorbed).
    Linear(Option<super::evict::ScoreRule>),
}

/// Guard against negative skeleton weights (matrix form; the streaming form is Aggregate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Drop the row's whole far field when Σ_far a[t,j] < 0.
    Aggregate,
    /// max(a[t,j], 0) per far key (ablation).
    PerKeyClamp,
}

/// Segment [lo, hi) of landmark i of m over a prompt of tp tokens.
fn segment(i: usize, tp: usize, m: usize) -> (usize, usize) {
    (i * tp / m, (i + 1) * tp / m)
}

/// Landmark index of prompt position p (< tp).
fn segment_of(p: usize, tp: usize, m: usize) -> usize {
    let mut i = (p * m / tp).min(m - 1);
    while segment(i, tp, m).1 <= p {
        i += 1;
    }
    while segment(i, tp, m).0 > p {
        i -= 1;
    }
    i
}

/// Sums the prompt's queries per landmark segment while the prompt streams through in chunks,
/// so the prompt's queries need not be kept until the seal.
#[derive(Debug, Clone)]
pub struct QuerySegments {
    tp: usize,
    m: usize,
    n_heads: usize,
    head_dim: usize,
    /// [m, n_heads, head_dim] f64 sums.
    sums: Vec<f64>,
    seen: usize,
}

impl QuerySegments {
    pub fn new(tp: usize, m_eff: usize, n_heads: usize, head_dim: usize) -> Self {
        QuerySegments { tp, m: m_eff, n_heads, head_dim, sums: vec![0.0; m_eff * n_heads * head_dim], seen: 0 }
    }

    /// Adds queries of positions pos0.. (q: [n, n_heads, head_dim]); positions ≥ tp are ignored.
    pub fn add(&mut self, pos0: usize, q: &[f32]) {
        let row = self.n_heads * self.head_dim;
        assert_eq!(q.len() % row, 0, "QuerySegments::add: q is not [n, n_heads, head_dim]");
        for (r, qr) in q.chunks_exact(row).enumerate() {
            let p = pos0 + r;
            if p >= self.tp {
                break;
            }
            let i = segment_of(p, self.tp, self.m);
            self.sums[i * row..(i + 1) * row].iter_mut().zip(qr).for_each(|(s, &x)| *s += x as f64);
            self.seen += 1;
        }
    }

    /// Bytes of the sums.
    pub fn bytes(&self) -> usize {
        self.sums.len() * 8
    }

    /// Landmark queries, [n_heads, m, head_dim] (head-major).
    fn means(&self) -> Vec<f64> {
        let (m, nh, hd) = (self.m, self.n_heads, self.head_dim);
        let mut out = vec![0.0; nh * m * hd];
        for i in 0..m {
            let (lo, hi) = segment(i, self.tp, m);
            let inv = 1.0 / (hi - lo) as f64;
            for h in 0..nh {
                let src = &self.sums[(i * nh + h) * hd..][..hd];
                out[(h * m + i) * hd..][..hd].iter_mut().zip(src).for_each(|(o, s)| *o = s * inv);
            }
        }
        out
    }
}

/// Segment means of x: [tp, n, hd] -> [n, m, hd] (head-major), f64.
fn segment_means<T: Copy + Into<f64>>(x: &[T], tp: usize, m: usize, n: usize, hd: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m * hd];
    for i in 0..m {
        let (lo, hi) = segment(i, tp, m);
        let inv = 1.0 / (hi - lo) as f64;
        for p in lo..hi {
            for g in 0..n {
                let src = &x[(p * n + g) * hd..][..hd];
                out[(g * m + i) * hd..][..hd].iter_mut().zip(src).for_each(|(o, &s)| *o += s.into());
            }
        }
        for g in 0..n {
            out[(g * m + i) * hd..][..hd].iter_mut().for_each(|o| *o *= inv);
        }
    }
    out
}

/// The scaled ridge inverse of one query head: returns (γ, M̂) with M = e^{−γ}·M̂,
/// M̂: [m (landmark keys l), m (landmark queries i)] row-major.
/// qt: [m, hd] landmark queries, kt: [m, hd] landmark keys.
fn ridge_inverse(
    qt: &[f64],
    kt: &[f64],
    m: usize,
    hd: usize,
    scale: f64,
    ridge: f64,
    head: usize,
) -> Result<(f32, Vec<f64>), NystromError> {
    let mut s = vec![0.0; m * m]; // [m_q, m_k]: q̃_i·k̃_l·scale
    for i in 0..m {
        for l in 0..m {
            s[i * m + l] = dot64(&qt[i * hd..][..hd], &kt[l * hd..][..hd]) * scale;
        }
    }
    // γ is rounded to f32 because the streaming state stores it; M = e^{−γ}M̂ holds for any γ.
    let gamma = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32;
    let a: Vec<f64> = s.iter().map(|x| (x - gamma as f64).exp()).collect(); // Âu [m_q, m_k]
    // G = ÂᵀÂ + λI, [m_k, m_k], as a sum of rank-1 row updates (contiguous rows).
    let mut g = vec![0.0; m * m];
    for i in 0..m {
        let ai = &a[i * m..][..m];
        for l in 0..m {
            let f = ai[l];
            g[l * m..][..m].iter_mut().zip(ai).for_each(|(x, &y)| *x += f * y);
        }
    }
    let trace: f64 = (0..m).map(|l| g[l * m + l]).sum();
    let lambda = ridge * trace / m as f64;
    (0..m).for_each(|l| g[l * m + l] += lambda);
    // Cholesky G = L Lᵀ (lower triangle, in place, row-oriented).
    for j in 0..m {
        let (done, rest) = g.split_at_mut(j * m);
        let rj = &mut rest[..m];
        for p in 0..j {
            let lp = &done[p * m..][..p + 1];
            let x = (rj[p] - dot64(&rj[..p], &lp[..p])) / lp[p];
            rj[p] = x;
        }
        let d = rj[j] - dot64(&rj[..j], &rj[..j]);
        if d.is_nan() || d <= 0.0 || d.is_infinite() {
            return Err(NystromError::NotPositiveDefinite { head });
        }
        rj[j] = d.sqrt();
    }
    // X = G⁻¹ Âᵀ, [m_k, m_i], all right-hand sides at once by row operations:
    // forward L Y = Âᵀ, then back Lᵀ X = Y.
    let mut x = vec![0.0; m * m];
    for l in 0..m {
        for i in 0..m {
            x[l * m + i] = a[i * m + l];
        }
    }
    for r in 0..m {
        let (done, rest) = x.split_at_mut(r * m);
        let xr = &mut rest[..m];
        for p in 0..r {
            let f = g[r * m + p];
            xr.iter_mut().zip(&done[p * m..][..m]).for_each(|(y, &z)| *y -= f * z);
        }
        let inv = 1.0 / g[r * m + r];
        xr.iter_mut().for_each(|y| *y *= inv);
    }
    for r in (0..m).rev() {
        let (head_rows, rest) = x.split_at_mut((r + 1) * m);
        let xr = &mut head_rows[r * m..];
        for p in r + 1..m {
            let f = g[p * m + r];
            xr.iter_mut().zip(&rest[(p - r - 1) * m..][..m]).for_each(|(y, &z)| *y -= f * z);
        }
        let inv = 1.0 / g[r * m + r];
        xr.iter_mut().for_each(|y| *y *= inv);
    }
    Ok((gamma, x))
}

#[inline]
fn dot64(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for u in 0..4 {
            acc[u] += x[u] * y[u];
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// f32 × f32 dot product accumulated in f64 (scores reach the hundreds; f32 accumulation would
/// put ~1e-5 relative error into their exponentials).
#[inline]
pub(crate) fn dot32(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x as f64 * y as f64).sum();
    for (x, y) in ca.zip(cb) {
        for u in 0..4 {
            acc[u] += x[u] as f64 * y[u] as f64;
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// f64 · f32 dot product in f64.
#[inline]
fn dot64_32(a: &[f64], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca.remainder().iter().zip(cb.remainder()).map(|(&x, &y)| x * y as f64).sum();
    for (x, y) in ca.zip(cb) {
        for u in 0..4 {
            acc[u] += x[u] * y[u] as f64;
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// (hi + lo) · b in f64, b f32 (lo empty: single f32).
#[inline]
fn dot_split(hi: &[f32], lo: &[f32], b: &[f32]) -> f64 {
    if lo.is_empty() { dot32(hi, b) } else { dot32(hi, b) + dot32(lo, b) }
}

/// The low half of a pair at i, 0 when the storage is single f32 (`lo` empty); a non-empty
/// `lo` always has the hi part's length.
#[inline]
fn lo_at(lo: &[f32], i: usize) -> f64 {
    if lo.is_empty() { 0.0 } else { lo[i] as f64 }
}

/// An f32 hi/lo pair array: value = hi + lo (~48-bit mantissa) for the small, cancellation-
/// sensitive parts of the state. Updates go through f64 and re-split, i.e. compensated sums.
#[derive(Debug, Clone, Default)]
struct Split {
    hi: Vec<f32>,
    lo: Vec<f32>,
}

impl Split {
    /// Pairs when `pair`, else single f32 (`lo` empty).
    fn from_f64(x: &[f64], pair: bool) -> Self {
        let hi: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let lo = if pair { x.iter().zip(&hi).map(|(&v, &h)| (v - h as f64) as f32).collect() } else { Vec::new() };
        Split { hi, lo }
    }
    #[inline]
    fn get(&self, i: usize) -> f64 {
        self.hi[i] as f64 + lo_at(&self.lo, i)
    }
    /// hi[start..start + len] and the matching lo (empty for single f32).
    #[inline]
    fn range(&self, start: usize, len: usize) -> (&[f32], &[f32]) {
        let lo = if self.lo.is_empty() { &[][..] } else { &self.lo[start..start + len] };
        (&self.hi[start..start + len], lo)
    }
    fn bytes(&self) -> usize {
        (self.hi.len() + self.lo.len()) * 4
    }
}

/// The landmark skeleton of one layer (all query heads).
#[derive(Debug, Clone)]
struct Skeleton {
    m: usize,
    hd: usize,
    /// [n_heads, m, hd] landmark queries.
    qt: Split,
    /// [n_kv, m, hd] landmark keys.
    kt: Split,
    /// [n_heads]: M = e^{−γ}·M̂.
    gamma: Vec<f32>,
    /// [n_heads, m (l), m (i)] scaled ridge inverse.
    mhat: Split,
    /// Whether the splits and the accumulators are hi/lo pairs ([`StatePrecision::Pair`]).
    pair: bool,
}

/// Length of one query head's accumulator block: off (m) and D̂, N̂ (m + m·hd), the latter
/// twice with pairs.
fn acc_len(m: usize, hd: usize, pair: bool) -> usize {
    m + (m + m * hd) * (1 + pair as usize)
}

/// Bytes a sealed skeleton of m landmarks holds beside its exact keys (single f32: landmark
/// queries [n_heads, m, hd] and keys [n_kv, m, hd], γ [n_heads], M̂ [n_heads, m, m] and the
/// accumulators, one block of `acc_len` per query head): what `--o1-budget` sizes the window by.
pub fn skeleton_bytes(n_heads: usize, n_kv: usize, hd: usize, m: usize) -> usize {
    4 * (n_heads * m * hd + n_kv * m * hd + n_heads + n_heads * m * m + n_heads * acc_len(m, hd, false))
}

/// A fresh accumulator block (nothing folded).
fn acc_init(block: &mut [f32], m: usize) {
    block[..m].fill(f32::NEG_INFINITY);
    block[m..].fill(0.0);
}

/// One query head's accumulators, split into their parts.
struct HeadAcc<'a> {
    off: &'a mut [f32],
    den_hi: &'a mut [f32],
    den_lo: &'a mut [f32],
    num_hi: &'a mut [f32],
    num_lo: &'a mut [f32],
}

impl<'a> HeadAcc<'a> {
    /// `block` of acc_len(m, hd, pair); with single f32 the lo parts are empty.
    fn new(block: &'a mut [f32], m: usize, hd: usize, pair: bool) -> Self {
        let (off, rest) = block.split_at_mut(m);
        let (den_hi, rest) = rest.split_at_mut(m);
        let (den_lo, rest) = rest.split_at_mut(if pair { m } else { 0 });
        let (num_hi, num_lo) = rest.split_at_mut(m * hd);
        HeadAcc { off, den_hi, den_lo, num_hi, num_lo }
    }

    #[inline]
    fn den(&self, i: usize) -> f64 {
        self.den_hi[i] as f64 + lo_at(self.den_lo, i)
    }

    /// Largest log-offset.
    fn off_max(&self) -> f64 {
        self.off.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64
    }

    /// Folds n keys/values (k, v: [n, n_kv, hd], kv head g) with landmark queries qt (hi, lo:
    /// [m, hd]) into these accumulators. The seal folds the whole far prompt at once (f64 sums,
    /// one rounding into the hi/lo state per accumulator); a step folds one key.
    #[allow(clippy::too_many_arguments)]
    fn fold(&mut self, qt_hi: &[f32], qt_lo: &[f32], g: usize, nkv: usize, hd: usize, k: &[f32], v: &[f32], scale: f64) {
        let m = self.off.len();
        let n = k.len() / (nkv * hd);
        if n == 0 {
            return;
        }
        let mut s = vec![0.0f64; n]; // [n] scores of one landmark query
        let mut qi = vec![0.0f64; hd]; // q̃_i as f64
        let mut acc = vec![0.0f64; hd]; // N_i being updated, f64
        let pair = !self.num_lo.is_empty();
        for i in 0..m {
            let qb = i * hd;
            qi.iter_mut().enumerate().for_each(|(c, x)| *x = qt_hi[qb + c] as f64 + lo_at(qt_lo, qb + c));
            let mut smax = f64::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate() {
                *sj = dot64_32(&qi, &k[(j * nkv + g) * hd..][..hd]) * scale;
                smax = smax.max(*sj);
            }
            let nb = i * hd;
            let nhi = &mut self.num_hi[nb..nb + hd];
            let nlo = if pair { &mut self.num_lo[nb..nb + hd] } else { &mut [][..] };
            let old = self.off[i];
            // Rescale to a raised offset (online-softmax style); all zeros while empty.
            let r = if smax > old as f64 {
                let new = smax as f32;
                let r = if old == f32::NEG_INFINITY { 0.0 } else { (old as f64 - new as f64).exp() };
                self.off[i] = new;
                r
            } else {
                1.0
            };
            let off = self.off[i] as f64;
            acc.iter_mut().enumerate().for_each(|(c, x)| *x = (nhi[c] as f64 + lo_at(nlo, c)) * r);
            let mut den = (self.den_hi[i] as f64 + lo_at(self.den_lo, i)) * r;
            for (j, &sj) in s.iter().enumerate() {
                let e = (sj - off).exp(); // ≲ 1
                den += e;
                acc.iter_mut().zip(&v[(j * nkv + g) * hd..][..hd]).for_each(|(x, &y)| *x += e * y as f64);
            }
            let dh = den as f32;
            self.den_hi[i] = dh;
            if pair {
                self.den_lo[i] = (den - dh as f64) as f32;
                for ((x, hi), lo) in acc.iter().zip(nhi.iter_mut()).zip(nlo.iter_mut()) {
                    *hi = *x as f32;
                    *lo = (*x - *hi as f64) as f32;
                }
            } else {
                nhi.iter_mut().zip(&acc).for_each(|(hi, &x)| *hi = x as f32);
            }
        }
    }

    /// Turns ŵ into per-landmark factors ŵ_i·e^{base + off_i − c}; if the far weight
    /// Σ_i factor_i·D̂_i is negative (aggregate guard) returns None, else adds Σ_i factor_i·N̂_i
    /// to out ([hd], f64) and returns the far weight.
    fn far_apply(&self, hd: usize, base: f64, c: f64, wv: &mut [f64], out: &mut [f64]) -> Option<f64> {
        let m = self.off.len();
        let mut far_den = 0.0;
        for i in 0..m {
            let off = self.off[i];
            wv[i] = if off == f32::NEG_INFINITY { 0.0 } else { wv[i] * (base + off as f64 - c).exp() };
            far_den += wv[i] * self.den(i);
        }
        if far_den < 0.0 {
            return None;
        }
        for i in 0..m {
            let f = wv[i];
            if f == 0.0 {
                continue;
            }
            let nb = i * hd;
            let nhi = &self.num_hi[nb..nb + hd];
            if self.num_lo.is_empty() {
                out.iter_mut().zip(nhi).for_each(|(x, &a)| *x += f * a as f64);
            } else {
                let nlo = &self.num_lo[nb..nb + hd];
                out.iter_mut().zip(nhi).zip(nlo).for_each(|((x, &a), &b)| *x += f * (a as f64 + b as f64));
            }
        }
        Some(far_den)
    }
}

impl Skeleton {
    /// Folds n keys/values (k, v: [n, n_kv, hd]) into the accumulators of query heads h0.. (acc:
    /// their blocks, [.., self.acc_len()]).
    #[allow(clippy::too_many_arguments)]
    fn fold(&self, acc: &mut [f32], h0: usize, group: usize, nkv: usize, k: &[f32], v: &[f32], scale: f64) {
        let (m, hd) = (self.m, self.hd);
        for (i, block) in acc.chunks_mut(self.acc_len()).enumerate() {
            let h = h0 + i;
            let (qh, ql) = self.qt.range(h * m * hd, m * hd);
            HeadAcc::new(block, m, hd, self.pair).fold(qh, ql, h / group, nkv, hd, k, v, scale);
        }
    }

    /// ŵ = f̂u·M̂ of query head h (kv head g) into fw[m..2m] (fw[..m]: f̂u); returns
    /// base = u_max − γ_h, or None while nothing has been folded (`off`: the head's offsets).
    #[allow(clippy::too_many_arguments)]
    fn far_weights(&self, h: usize, g: usize, qh: &[f32], hd: usize, scale: f64, off: &[f32], fw: &mut [f64]) -> Option<f64> {
        let m = self.m;
        if off.iter().all(|&o| o == f32::NEG_INFINITY) {
            return None;
        }
        let (fu, wv) = fw[..2 * m].split_at_mut(m);
        for l in 0..m {
            let (kh, kl) = self.kt.range((g * m + l) * hd, hd);
            fu[l] = dot_split(kh, kl, qh) * scale;
        }
        let umax = fu.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        fu.iter_mut().for_each(|x| *x = (*x - umax).exp());
        // Rows of M̂ run over l and are contiguous over i.
        wv.fill(0.0);
        let mb = h * m * m;
        for l in 0..m {
            let f = fu[l];
            let (mh, ml) = self.mhat.range(mb + l * m, m);
            if ml.is_empty() {
                wv.iter_mut().zip(mh).for_each(|(x, &a)| *x += f * a as f64);
            } else {
                wv.iter_mut().zip(mh).zip(ml).for_each(|((x, &a), &b)| *x += f * (a as f64 + b as f64));
            }
        }
        Some(umax - self.gamma[h] as f64)
    }

    fn bytes(&self) -> usize {
        self.qt.bytes() + self.kt.bytes() + self.gamma.len() * 4 + self.mhat.bytes()
    }

    /// One query head's accumulator block length.
    fn acc_len(&self) -> usize {
        acc_len(self.m, self.hd, self.pair)
    }
}

/// Where the exact keys live.
#[derive(Debug, Clone)]
enum Keys {
    /// Every key exact (short prompt with [`Far::Skeleton`]): [len, n_kv, hd], growing.
    All { k: Vec<f32>, v: Vec<f32> },
    /// Sinks [sinks, n_kv, hd] and the window ring [window, n_kv, hd] (position p at slot p % W).
    Window { sink_k: Vec<f32>, sink_v: Vec<f32>, ring_k: Vec<f32>, ring_v: Vec<f32> },
    /// [`Far::Score`]: sinks + window slots chosen by score.
    Scored(super::evict::Slots),
}

/// Sealed O(1) attention state of one layer (all heads). Clone is the checkpoint.
#[derive(Debug, Clone)]
pub struct O1Layer {
    settings: O1Settings,
    scale: f32,
    n_heads: usize,
    n_kv: usize,
    hd: usize,
    /// Positions seen (the next step's position).
    len: usize,
    keys: Keys,
    skeleton: Option<Skeleton>,
    /// [`Far::Linear`]: the learned far state (beside the window, never with a skeleton).
    linear: Option<super::farfield::FarState>,
    /// [n_heads, acc_len] (empty without a skeleton): per query head the accumulators a
    /// step updates, one contiguous block [off (m) | D̂ hi (m) | D̂ lo (m) | N̂ hi (m·hd) | N̂ lo
    /// (m·hd)] (off: log-offsets, −∞ while empty; no lo parts with single f32), so that a kv group's heads are one slice and
    /// the groups fold in parallel. Kept beside the skeleton, which is read-only after the seal.
    acc: Vec<f32>,
}

thread_local! {
    /// A step's per-group scratch, per pool thread: near scores [group, n_near] and
    /// [output rows [group, hd] | shifts c [group] | denominators [group] | f̂u, ŵ [2·m]], f64.
    static STEP_SCRATCH: std::cell::RefCell<(Vec<f64>, Vec<f64>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl O1Layer {
    /// Seals the state after a prompt of tp = k.len() / (n_kv·hd) tokens.
    /// k, v: [tp, n_kv_heads, head_dim] (k already rotated). `qseg` must hold all tp prompt
    /// queries when a skeleton is sealed (`far == Skeleton && settings.seals_skeleton(tp)`);
    /// it is ignored otherwise and may be None.
    #[allow(clippy::too_many_arguments)]
    pub fn seal(
        settings: &O1Settings,
        far: Far,
        scale: f32,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        qseg: Option<&QuerySegments>,
        k: &[f32],
        v: &[f32],
    ) -> Result<O1Layer, NystromError> {
        settings.validate()?;
        let (nkv, hd) = (n_kv_heads, head_dim);
        check_heads(n_heads, nkv)?;
        let row = nkv * hd;
        if row == 0 || !k.len().is_multiple_of(row) {
            return Err(NystromError::Shape {
                what: "seal: k length (multiple of n_kv_heads·head_dim)",
                expected: row,
                found: k.len(),
            });
        }
        if v.len() != k.len() {
            return Err(NystromError::Shape { what: "seal: v length", expected: k.len(), found: v.len() });
        }
        let tp = k.len() / row;
        let (w, sn) = (settings.window, settings.sinks);
        let mut layer = O1Layer {
            settings: *settings,
            scale,
            n_heads,
            n_kv: nkv,
            hd,
            len: tp,
            keys: Keys::All { k: Vec::new(), v: Vec::new() },
            skeleton: None,
            linear: None,
            acc: Vec::new(),
        };
        if far == Far::Skeleton && !settings.seals_skeleton(tp) {
            layer.keys = Keys::All { k: k.to_vec(), v: v.to_vec() };
            return Ok(layer);
        }
        if let Far::Score(rule) = far {
            layer.keys = Keys::Scored(super::evict::Slots::seal(k, v, row, sn, w, rule));
            return Ok(layer);
        }
        let mut sink_k = vec![0.0; sn * row];
        let mut sink_v = vec![0.0; sn * row];
        let mut ring_k = vec![0.0; w * row];
        let mut ring_v = vec![0.0; w * row];
        let ns = sn.min(tp);
        sink_k[..ns * row].copy_from_slice(&k[..ns * row]);
        sink_v[..ns * row].copy_from_slice(&v[..ns * row]);
        for p in sn.max(tp.saturating_sub(w))..tp {
            let slot = p % w;
            ring_k[slot * row..][..row].copy_from_slice(&k[p * row..][..row]);
            ring_v[slot * row..][..row].copy_from_slice(&v[p * row..][..row]);
        }
        layer.keys = Keys::Window { sink_k, sink_v, ring_k, ring_v };
        if let Far::Linear(Some(rule)) = far {
            layer.keys = Keys::Scored(super::evict::Slots::seal(k, v, row, sn, w, rule));
            return Ok(layer);
        }
        if far == Far::Drop || far == Far::Linear(None) {
            return Ok(layer);
        }
        // Skeleton.
        let m = settings.m_eff(tp);
        let qseg = qseg.ok_or(NystromError::IncompleteSegments { seen: 0, tp })?;
        if qseg.seen != tp || qseg.tp != tp {
            return Err(NystromError::IncompleteSegments { seen: qseg.seen, tp });
        }
        if qseg.m != m {
            return Err(NystromError::Shape {
                what: "seal: QuerySegments landmark count (settings.m_eff(tp))",
                expected: m,
                found: qseg.m,
            });
        }
        if qseg.n_heads != n_heads || qseg.head_dim != hd {
            return Err(NystromError::Shape {
                what: "seal: QuerySegments n_heads·head_dim",
                expected: n_heads * hd,
                found: qseg.n_heads * qseg.head_dim,
            });
        }
        let pair = settings.state.pair();
        let qt = Split::from_f64(&qseg.means(), pair); // [n_heads, m, hd]
        let kt = Split::from_f64(&segment_means(k, tp, m, nkv, hd), pair); // [n_kv, m, hd]
        // The solve uses the stored (hi + lo) values so the state is self-consistent.
        let qt64: Vec<f64> = (0..qt.hi.len()).map(|i| qt.get(i)).collect();
        let kt64: Vec<f64> = (0..kt.hi.len()).map(|i| kt.get(i)).collect();
        let group = n_heads / nkv;
        let mut gamma = Vec::with_capacity(n_heads);
        let mut mhat = Vec::with_capacity(n_heads * m * m);
        for h in 0..n_heads {
            let g = h / group;
            let (gm, x) = ridge_inverse(
                &qt64[h * m * hd..][..m * hd],
                &kt64[g * m * hd..][..m * hd],
                m,
                hd,
                scale as f64,
                settings.ridge,
                h,
            )?;
            gamma.push(gm);
            mhat.extend_from_slice(&x);
        }
        let al = acc_len(m, hd, pair);
        let mut acc = vec![0.0; n_heads * al];
        acc.chunks_mut(al).for_each(|b| acc_init(b, m));
        let sk = Skeleton { m, hd, qt, kt, gamma, mhat: Split::from_f64(&mhat, pair), pair };
        // Prompt keys already far for the first decode position t = tp: [sinks, tp − W).
        sk.fold(&mut acc, 0, group, nkv, &k[sn * row..(tp - w) * row], &v[sn * row..(tp - w) * row], scale as f64);
        layer.skeleton = Some(sk);
        layer.acc = acc;
        Ok(layer)
    }

    /// A score-eviction layer sealed after a prompt of `tp` positions with its kept `slots`
    /// (`Slots::seal_voted`).
    pub(crate) fn scored(
        settings: &O1Settings,
        scale: f32,
        n_heads: usize,
        n_kv: usize,
        hd: usize,
        tp: usize,
        slots: super::evict::Slots,
    ) -> O1Layer {
        O1Layer {
            settings: *settings,
            scale,
            n_heads,
            n_kv,
            hd,
            len: tp,
            keys: Keys::Scored(slots),
            skeleton: None,
            linear: None,
            acc: Vec::new(),
        }
    }

    /// A sink+window or score-eviction layer sealed after a prompt of tp positions (k, v its
    /// keys and values, as given to `seal`) takes the learned far field: the prompt keys it does
    /// not keep are absorbed now, and every key leaving later at its step.
    pub(crate) fn with_far(mut self, weights: std::sync::Arc<super::farfield::FarWeights>, k: &[f32], v: &[f32]) -> O1Layer {
        let row = self.n_kv * self.hd;
        let mut fs = super::farfield::FarState::new(weights);
        let (w, sn, tp) = (self.settings.window, self.settings.sinks, self.len);
        // The state stands at the first position after the prompt (the next query's).
        fs.advance(tp);
        match &self.keys {
            Keys::Window { .. } => {
                for p in sn..tp.saturating_sub(w) {
                    fs.absorb(&k[p * row..][..row], &v[p * row..][..row], p);
                }
            }
            Keys::Scored(slots) => {
                let mut kept = vec![false; tp];
                slots.positions().iter().for_each(|&p| kept[p as usize] = true);
                for p in (0..tp).filter(|&p| !kept[p]) {
                    fs.absorb(&k[p * row..][..row], &v[p * row..][..row], p);
                }
            }
            Keys::All { .. } => {}
        }
        self.linear = Some(fs);
        self
    }

    /// Positions held (prompt + decoded).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a landmark skeleton was sealed.
    pub fn has_skeleton(&self) -> bool {
        self.skeleton.is_some()
    }

    /// Bytes held by the state (constant per step unless every key is exact); the step's
    /// scratch is per pool thread, not per sequence.
    pub fn bytes(&self) -> usize {
        let keys = match &self.keys {
            Keys::All { k, v } => (k.len() + v.len()) * 4,
            Keys::Window { sink_k, sink_v, ring_k, ring_v } => (sink_k.len() + sink_v.len() + ring_k.len() + ring_v.len()) * 4,
            Keys::Scored(s) => s.bytes(),
        };
        keys + self.skeleton.as_ref().map_or(0, Skeleton::bytes)
            + self.linear.as_ref().map_or(0, super::farfield::FarState::bytes)
            + self.acc.len() * 4
            + size_of::<Self>()
    }

    /// One new position t = len(): appends k/v ([n_kv_heads, head_dim], k rotated), folds the key
    /// leaving the window, writes o: [n_heads, head_dim] from q: [n_heads, head_dim].
    /// Returns the number of heads whose far field the aggregate guard dropped at this position.
    pub fn step(&mut self, q: &[f32], k: &[f32], v: &[f32], o: &mut [f32]) -> usize {
        let (nh, nkv, hd) = (self.n_heads, self.n_kv, self.hd);
        let row = nkv * hd;
        assert!(q.len() == nh * hd && o.len() == nh * hd && k.len() == row && v.len() == row, "O1Layer::step: shapes");
        let t = self.len;
        if let Keys::Scored(slots) = &mut self.keys {
            slots.step(q, k, v, o, nh, nkv, self.scale as f64, self.linear.as_mut());
            self.len = t + 1;
            return 0;
        }
        let (w, sn) = (self.settings.window, self.settings.sinks);
        let group = nh / nkv;
        // The key leaving the window (position t − W) is copied out, then folded per kv group.
        let mut leaving: Option<(Vec<f32>, Vec<f32>)> = None;
        match &mut self.keys {
            Keys::All { k: ka, v: va } => {
                ka.extend_from_slice(k);
                va.extend_from_slice(v);
            }
            Keys::Window { sink_k, sink_v, ring_k, ring_v } => {
                if t < sn {
                    sink_k[t * row..][..row].copy_from_slice(k);
                    sink_v[t * row..][..row].copy_from_slice(v);
                } else {
                    let slot = t % w;
                    if t >= w + sn && (self.skeleton.is_some() || self.linear.is_some()) {
                        leaving = Some((ring_k[slot * row..][..row].to_vec(), ring_v[slot * row..][..row].to_vec()));
                    }
                    ring_k[slot * row..][..row].copy_from_slice(k);
                    ring_v[slot * row..][..row].copy_from_slice(v);
                }
            }
            Keys::Scored(_) => unreachable!("stepped above"),
        }
        self.len = t + 1;
        if let Some(fs) = &mut self.linear {
            fs.advance(t);
            if let Some((lk, lv)) = &leaving {
                fs.absorb(lk, lv, t - w);
            }
        }
        let n_near = match &self.keys {
            Keys::All { .. } => t + 1,
            Keys::Window { .. } => sn.min(t + 1) + (t + 1).saturating_sub(sn.max((t + 1).saturating_sub(w))),
            Keys::Scored(_) => unreachable!("stepped above"),
        };
        let m = self.skeleton.as_ref().map_or(0, |sk| sk.m);
        let cx = StepCtx {
            keys: &self.keys,
            sk: self.skeleton.as_ref(),
            far: self.linear.as_ref(),
            n_heads: nh,
            nkv,
            hd,
            window: w,
            sinks: sn,
            scale: self.scale as f64,
            t,
            n_near,
        };
        // One work item per kv head: it folds the leaving key into its query heads'
        // accumulators, then its query heads read every window key/value row once (the window
        // dominates the step: ~90% of it at W = 512, m = 64).
        let al = self.skeleton.as_ref().map_or(0, Skeleton::acc_len);
        let mut items: Vec<(&mut [f32], &mut [f32])> = if cx.sk.is_some() {
            o.chunks_mut(group * hd).zip(self.acc.chunks_mut(group * al)).collect()
        } else {
            o.chunks_mut(group * hd).map(|og| (og, Default::default())).collect()
        };
        let dropped = std::sync::atomic::AtomicUsize::new(0);
        crate::par::pool().for_rows_mut_dynamic(&mut items, 1, 1, |g, it| {
            let (og, accg) = &mut it[0];
            if let (Some(sk), Some((lk, lv))) = (cx.sk, &leaving) {
                sk.fold(accg, g * group, group, nkv, lk, lv, cx.scale);
            }
            STEP_SCRATCH.with(|sc| {
                let (scores, work) = &mut *sc.borrow_mut();
                scores.clear();
                scores.resize(group * n_near, 0.0); // [group, n_near]
                work.resize(group * (hd + 2) + 2 * m, 0.0);
                let d = cx.group(g, &q[g * group * hd..(g + 1) * group * hd], accg, scores, work, og);
                dropped.fetch_add(d, std::sync::atomic::Ordering::Relaxed);
            })
        });
        dropped.into_inner()
    }
}

/// What a step's per-group work items share.
struct StepCtx<'a> {
    keys: &'a Keys,
    sk: Option<&'a Skeleton>,
    far: Option<&'a super::farfield::FarState>,
    n_heads: usize,
    nkv: usize,
    hd: usize,
    window: usize,
    sinks: usize,
    scale: f64,
    /// The position being computed (already inserted) and its number of near keys.
    t: usize,
    n_near: usize,
}

impl StepCtx<'_> {
    /// The step's output for the query heads of kv head g: qg [group, hd] -> og [group, hd]
    /// (acc: their accumulator blocks); returns the heads whose far field the guard dropped.
    fn group(&self, g: usize, qg: &[f32], acc: &mut [f32], scores: &mut [f64], work: &mut [f64], og: &mut [f32]) -> usize {
        let (nkv, hd, n_near, t) = (self.nkv, self.hd, self.n_near, self.t);
        let row = nkv * hd;
        let (w, sn) = (self.window, self.sinks);
        let group = self.n_heads / nkv;
        let scale = self.scale;
        let m = self.sk.map_or(0, |sk| sk.m);
        let h0 = g * group;
        let mut dropped = 0;
        let mut idx = 0;
        for_each_near(self.keys, t, w, sn, row, |kr, _| {
            let kg = &kr[g * hd..][..hd];
            for hh in 0..group {
                scores[hh * n_near + idx] = dot32(&qg[hh * hd..][..hd], kg) * scale;
            }
            idx += 1;
        });
        let (out, rest) = work.split_at_mut(group * hd); // [group, hd] f64
        let (cs, rest) = rest.split_at_mut(group); // [group] shifts c
        let (dens, fw) = rest.split_at_mut(group); // [group] denominators; [2m] fu, ŵ
        out.fill(0.0);
        let mut blocks = acc.chunks_mut(self.sk.map_or(1, Skeleton::acc_len));
        for hh in 0..group {
            let h = h0 + hh;
            let mut c = scores[hh * n_near..][..n_near].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            dens[hh] = 0.0;
            if let Some(sk) = self.sk {
                let ha = HeadAcc::new(blocks.next().expect("one accumulator block per query head"), m, hd, sk.pair);
                if let Some(base) = sk.far_weights(h, g, &qg[hh * hd..][..hd], hd, scale, ha.off, fw) {
                    c = c.max(base + ha.off_max());
                    match ha.far_apply(hd, base, c, &mut fw[m..2 * m], &mut out[hh * hd..][..hd]) {
                        Some(d) => dens[hh] = d,
                        None => dropped += 1,
                    }
                }
            }
            if let Some(fs) = self.far {
                let mut eps = [0f64; super::farfield::MAX_RANK];
                let eps = &mut eps[..fs.weights.rank];
                c = c.max(fs.logits(h, g, &qg[hh * hd..][..hd], eps));
                dens[hh] = fs.apply(g, eps, c, &mut out[hh * hd..][..hd]);
            }
            cs[hh] = c;
        }
        let mut idx = 0;
        for_each_near(self.keys, t, w, sn, row, |_, vr| {
            let vg = &vr[g * hd..][..hd];
            for hh in 0..group {
                let e = (scores[hh * n_near + idx] - cs[hh]).exp();
                dens[hh] += e;
                out[hh * hd..][..hd].iter_mut().zip(vg).for_each(|(x, &y)| *x += e * y as f64);
            }
            idx += 1;
        });
        for hh in 0..group {
            let inv = 1.0 / dens[hh].max(DEN_FLOOR);
            og[hh * hd..][..hd].iter_mut().zip(&out[hh * hd..][..hd]).for_each(|(y, &x)| *y = (x * inv) as f32);
        }
        dropped
    }
}

fn check_heads(n_heads: usize, n_kv: usize) -> Result<(), NystromError> {
    if n_kv == 0 || n_heads == 0 || !n_heads.is_multiple_of(n_kv) {
        return Err(NystromError::Shape { what: "n_heads (a multiple of n_kv_heads)", expected: n_kv.max(1), found: n_heads });
    }
    Ok(())
}

/// Visits the near keys of position t (k, v rows [n_kv, hd]) after t was inserted.
fn for_each_near(keys: &Keys, t: usize, w: usize, sn: usize, row: usize, mut f: impl FnMut(&[f32], &[f32])) {
    match keys {
        Keys::All { k, v } => {
            for p in 0..=t {
                f(&k[p * row..][..row], &v[p * row..][..row]);
            }
        }
        Keys::Window { sink_k, sink_v, ring_k, ring_v } => {
            for p in 0..sn.min(t + 1) {
                f(&sink_k[p * row..][..row], &sink_v[p * row..][..row]);
            }
            for p in sn.max((t + 1).saturating_sub(w))..=t {
                let slot = p % w;
                f(&ring_k[slot * row..][..row], &ring_v[slot * row..][..row]);
            }
        }
        Keys::Scored(_) => unreachable!("a scored layer steps in `evict`"),
    }
}

/// Result of the teacher-forced matrix form.
#[derive(Debug, Clone)]
pub struct MatrixOut {
    /// [T, n_heads, head_dim]
    pub o: Vec<f64>,
    /// [T, n_heads]: rows whose far field the aggregate guard dropped.
    pub dropped: Vec<bool>,
}

/// Teacher-forced matrix form of one layer, f64: q [T, n_heads, hd], k/v [T, n_kv, hd] (k
/// rotated); rows t < tp are exact causal attention, rows t ≥ tp follow the module header with
/// every T×T weight formed explicitly. Cost O(T²·(m + d)) per head, the heads spread over the
/// engine's pool; meant for checking the streaming form and for training.
#[allow(clippy::too_many_arguments)]
pub fn matrix_form(
    settings: &O1Settings,
    far: Far,
    guard: Guard,
    scale: f64,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    tp: usize,
    q: &[f64],
    k: &[f64],
    v: &[f64],
) -> Result<MatrixOut, NystromError> {
    settings.validate()?;
    check_heads(n_heads, n_kv_heads)?;
    if matches!(far, Far::Score(_) | Far::Linear(_)) {
        return Err(NystromError::NoMatrixForm);
    }
    let (nh, nkv, hd) = (n_heads, n_kv_heads, head_dim);
    if hd == 0 || !q.len().is_multiple_of(nh * hd) {
        return Err(NystromError::Shape {
            what: "matrix_form: q length (multiple of n_heads·head_dim)",
            expected: nh * hd,
            found: q.len(),
        });
    }
    let t_len = q.len() / (nh * hd);
    if k.len() != t_len * nkv * hd || v.len() != k.len() {
        return Err(NystromError::Shape {
            what: "matrix_form: k/v length (T·n_kv_heads·head_dim)",
            expected: t_len * nkv * hd,
            found: k.len().max(v.len()),
        });
    }
    if tp > t_len {
        return Err(NystromError::Shape { what: "matrix_form: tp (≤ T)", expected: t_len, found: tp });
    }
    let skeleton = far == Far::Skeleton && settings.seals_skeleton(tp);
    let m = settings.m_eff(tp);
    let (qt, kt) = if skeleton {
        (segment_means(&q[..tp * nh * hd], tp, m, nh, hd), segment_means(&k[..tp * nkv * hd], tp, m, nkv, hd))
    } else {
        (Vec::new(), Vec::new())
    };
    // The ridge inverses first (the only fallible step), then the heads in parallel.
    let mut inv = Vec::new(); // per head (γ, M̂ [m, m])
    if skeleton {
        for h in 0..nh {
            let g = h / (nh / nkv);
            inv.push(ridge_inverse(&qt[h * m * hd..][..m * hd], &kt[g * m * hd..][..m * hd], m, hd, scale, settings.ridge, h)?);
        }
    }
    let hc = HeadForm {
        settings,
        guard,
        scale,
        nh,
        nkv,
        hd,
        t_len,
        tp,
        m,
        windowed: far == Far::Drop || skeleton,
        q,
        k,
        v,
        qt: &qt,
        kt: &kt,
    };
    let row = t_len * (hd + 1);
    let mut buf = vec![0.0; nh * row]; // per head: o [T, hd], then dropped [T] (1.0 = dropped)
    crate::par::pool().for_rows_mut_dynamic(&mut buf, row, 1, |h, out| hc.head(h, inv.get(h), out));
    let mut o = vec![0.0; t_len * nh * hd];
    let mut dropped = vec![false; t_len * nh];
    for h in 0..nh {
        let (oh, dh) = buf[h * row..(h + 1) * row].split_at(t_len * hd);
        for t in 0..t_len {
            o[(t * nh + h) * hd..][..hd].copy_from_slice(&oh[t * hd..][..hd]);
            dropped[t * nh + h] = dh[t] != 0.0;
        }
    }
    Ok(MatrixOut { o, dropped })
}

/// One layer's inputs to the matrix form, shared by its per-head work items.
struct HeadForm<'a> {
    settings: &'a O1Settings,
    guard: Guard,
    scale: f64,
    nh: usize,
    nkv: usize,
    hd: usize,
    t_len: usize,
    tp: usize,
    m: usize,
    /// Rows past the prompt see sinks + window exactly (false: a short prompt, all exact).
    windowed: bool,
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
    /// [n_heads, m, hd] landmark queries and [n_kv, m, hd] landmark keys (empty without a
    /// skeleton).
    qt: &'a [f64],
    kt: &'a [f64],
}

impl HeadForm<'_> {
    /// Query head h: out = [o [T, hd] | dropped [T]]. `inv` = (γ, M̂) when a skeleton is sealed.
    fn head(&self, h: usize, inv: Option<&(f32, Vec<f64>)>, out: &mut [f64]) {
        let (nh, nkv, hd, t_len, m, scale) = (self.nh, self.nkv, self.hd, self.t_len, self.m, self.scale);
        let (w, sn) = (self.settings.window, self.settings.sinks);
        let g = h / (nh / nkv);
        let kr = |j: usize| &self.k[(j * nkv + g) * hd..][..hd];
        let vr = |j: usize| &self.v[(j * nkv + g) * hd..][..hd];
        let (o, dropped) = out.split_at_mut(t_len * hd);
        // Skeleton: E'[i,j] = exp(q̃_i·k_j·scale − cm_j) [m, T] with cm_j = max_i q̃_i·k_j·scale,
        // so e[i,j] = E'[i,j]·e^{cm_j} and every stored factor is ≤ 1.
        let sk = inv.map(|(gm, mhat)| {
            let mut el = vec![0.0; m * t_len]; // [m, T]
            let mut cm = vec![f64::NEG_INFINITY; t_len]; // [T]
            for i in 0..m {
                let qi = &self.qt[(h * m + i) * hd..][..hd];
                for j in 0..t_len {
                    let x = dot64(qi, kr(j)) * scale;
                    el[i * t_len + j] = x;
                    cm[j] = cm[j].max(x);
                }
            }
            for i in 0..m {
                el[i * t_len..(i + 1) * t_len].iter_mut().zip(&cm).for_each(|(x, &c)| *x = (*x - c).exp());
            }
            (*gm as f64, mhat, el, cm)
        });
        let mut s = vec![0.0; t_len]; // near scores of one row
        let mut a = vec![0.0; t_len]; // scaled far weights of one row
        let mut fu = vec![0.0; m];
        let mut wv = vec![0.0; m];
        // max of cm over the far keys seen so far, [sinks, far_seen): the far range only grows.
        let (mut far_max, mut far_seen) = (f64::NEG_INFINITY, sn);
        for t in 0..t_len {
            let qh = &self.q[(t * nh + h) * hd..][..hd];
            let exact = t < self.tp || !self.windowed;
            // Near: [0, n1) (sinks, or every key of an exact row) and [n2, t]; far: [sn, far_end).
            let far_end = if exact { sn } else { sn.max((t + 1).saturating_sub(w)) };
            let n1 = if exact { t + 1 } else { sn.min(t + 1) };
            let n2 = if exact { t + 1 } else { far_end.min(t + 1) };
            let mut c = f64::NEG_INFINITY;
            for j in (0..n1).chain(n2..t + 1) {
                s[j] = dot64(qh, kr(j)) * scale;
                c = c.max(s[j]);
            }
            let mut far_on = false;
            if let (Some((gm, mhat, el, cm)), true) = (&sk, far_end > sn) {
                far_on = true;
                for l in 0..m {
                    fu[l] = dot64(qh, &self.kt[(g * m + l) * hd..][..hd]) * scale;
                }
                let umax = fu.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                fu.iter_mut().for_each(|x| *x = (*x - umax).exp());
                for i in 0..m {
                    wv[i] = (0..m).map(|l| fu[l] * mhat[l * m + i]).sum();
                }
                let base = umax - gm;
                while far_seen < far_end {
                    far_max = far_max.max(cm[far_seen]);
                    far_seen += 1;
                }
                c = c.max(base + far_max);
                // a[t,j]·e^{−c} = e^{base − c + cm_j} · Σ_i ŵ_i·E'[i,j]
                let af = &mut a[sn..far_end];
                af.fill(0.0);
                for i in 0..m {
                    let wi = wv[i];
                    af.iter_mut().zip(&el[i * t_len + sn..i * t_len + far_end]).for_each(|(x, &e)| *x += wi * e);
                }
                let mut total = 0.0;
                for (x, &cj) in af.iter_mut().zip(&cm[sn..far_end]) {
                    *x *= (base - c + cj).exp();
                    if self.guard == Guard::PerKeyClamp {
                        *x = x.max(0.0);
                    }
                    total += *x;
                }
                if self.guard == Guard::Aggregate && total < 0.0 {
                    far_on = false;
                    dropped[t] = 1.0;
                }
            }
            let out = &mut o[t * hd..][..hd];
            let mut den = 0.0;
            for j in (0..n1).chain(n2..t + 1) {
                let wj = (s[j] - c).exp();
                den += wj;
                out.iter_mut().zip(vr(j)).for_each(|(x, y)| *x += wj * y);
            }
            if far_on {
                for j in sn..far_end {
                    den += a[j];
                    out.iter_mut().zip(vr(j)).for_each(|(x, y)| *x += a[j] * y);
                }
            }
            let inv = 1.0 / f64::max(den, DEN_FLOOR);
            out.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

impl fmt::Display for Far {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Far::Skeleton => "nystrom",
            Far::Drop => "streamingllm",
            Far::Score(_) => "score eviction",
            Far::Linear(None) => "learned far field",
            Far::Linear(Some(_)) => "score eviction with the learned far field",
        })
    }
}

#[cfg(test)]
#[path = "nystrom_tests.rs"]
mod tests;
