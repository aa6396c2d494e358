//! Rotary position embedding over [T, n_heads, head_dim] rows, both pairings (NeoX: (i, i+rot/2);
//! interleaved: (2i, 2i+1)) and partial rotary (dims ≥ rot_dim pass through). A rotation is
//! orthogonal, so the backward is the inverse rotation (sin → −sin) of the incoming gradient.
//! Angles are computed in f64 and rounded once to F.
//!
//! Accumulation contract: param grads +=, activations =.

pub use cortiq_kernels::ops::RopeStyle;

use crate::float::Float;

/// cos/sin per position and pair: [T, rot_dim/2] each.
#[derive(Debug, Clone)]
pub struct RopeTable<F> {
    pub half: usize,
    pub cos: Vec<F>,
    pub sin: Vec<F>,
}

impl<F: Float> RopeTable<F> {
    /// Positions `pos` with inverse frequencies `inv_freq` (rot_dim/2 of them; scaled variants
    /// such as Llama 3's compute their own).
    pub fn from_inv_freq(pos: &[usize], inv_freq: &[f64]) -> Self {
        let half = inv_freq.len();
        let (mut cos, mut sin) = (Vec::with_capacity(pos.len() * half), Vec::with_capacity(pos.len() * half));
        for &p in pos {
            for &f in inv_freq {
                let a = p as f64 * f;
                cos.push(F::from_f64(a.cos()));
                sin.push(F::from_f64(a.sin()));
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Plain RoPE: positions 0..t, inv_freq_i = theta^(−2i/rot_dim).
    pub fn new(t: usize, rot_dim: usize, theta: f64) -> Self {
        let inv: Vec<f64> = (0..rot_dim / 2).map(|i| theta.powf(-((2 * i) as f64) / rot_dim as f64)).collect();
        let pos: Vec<usize> = (0..t).collect();
        Self::from_inv_freq(&pos, &inv)
    }
}

/// Pair index -> (first, second) channel.
#[inline]
fn pair(style: RopeStyle, half: usize, i: usize) -> (usize, usize) {
    match style {
        RopeStyle::NeoX => (i, i + half),
        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
    }
}

#[track_caller]
fn check<F>(op: &str, table: &RopeTable<F>, a: &[F], b: &[F], n_heads: usize, hd: usize) -> usize {
    let row = n_heads * hd;
    assert!(row > 0 && a.len() == b.len() && a.len().is_multiple_of(row), "{op}: tensors must be [T, {n_heads}, {hd}]");
    let t = a.len() / row;
    assert!(
        2 * table.half <= hd && table.cos.len() >= t * table.half,
        "{op}: table holds {} positions of {} pairs for T = {t}, head_dim {hd}",
        table.cos.len() / table.half.max(1),
        table.half
    );
    t
}

/// Forward: x [T, n_heads, hd] -> y (written).
/// fwd: (y0, y1) = (x0·cos − x1·sin, x0·sin + x1·cos)
pub fn rope_forward<F: Float>(style: RopeStyle, table: &RopeTable<F>, x: &[F], y: &mut [F], n_heads: usize, hd: usize) {
    let t_len = check("rope_forward", table, x, y, n_heads, hd);
    let half = table.half;
    y.copy_from_slice(x);
    for t in 0..t_len {
        let (c, s) = (&table.cos[t * half..][..half], &table.sin[t * half..][..half]);
        for h in 0..n_heads {
            let (xr, yr) = (&x[(t * n_heads + h) * hd..][..hd], &mut y[(t * n_heads + h) * hd..][..hd]);
            for i in 0..half {
                let (a, b) = pair(style, half, i);
                yr[a] = xr[a] * c[i] - xr[b] * s[i];
                yr[b] = xr[a] * s[i] + xr[b] * c[i];
            }
        }
    }
}

/// Backward: the transpose (= inverse) rotation.
/// fwd: (y0, y1) = (x0·c − x1·s, x0·s + x1·c)  =>  dx0 += dy0·c + dy1·s; dx1 += −dy0·s + dy1·c
/// (channels past rot_dim: dx += dy).
pub fn rope_backward<F: Float>(style: RopeStyle, table: &RopeTable<F>, dy: &[F], dx: &mut [F], n_heads: usize, hd: usize) {
    let t_len = check("rope_backward", table, dy, dx, n_heads, hd);
    let half = table.half;
    for t in 0..t_len {
        let (c, s) = (&table.cos[t * half..][..half], &table.sin[t * half..][..half]);
        for h in 0..n_heads {
            let (gr, dr) = (&dy[(t * n_heads + h) * hd..][..hd], &mut dx[(t * n_heads + h) * hd..][..hd]);
            for i in 0..half {
                let (a, b) = pair(style, half, i);
                dr[a] += gr[a] * c[i] + gr[b] * s[i];
                dr[b] += gr[b] * c[i] - gr[a] * s[i];
            }
            for j in 2 * half..hd {
                dr[j] += gr[j];
            }
        }
    }
}
