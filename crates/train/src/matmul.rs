//! The linear layer `y = x·Wᵀ` (x [T, in], W [out, in], the storage order of HF and GGUF weights)
//! and its two gradients, plus the three matrix products behind them: plain loops for any
//! [`Float`] (the f64 gradient check) and an f32 path on the SIMD kernels of `cortiq-kernels`,
//! pooled over token tiles or weight rows (the trainer's hot spot: the FFN's three matmuls and
//! their six gradient products are most of a step's flops).
//!
//! Accumulation contract: param grads +=, activations =.

use cortiq_kernels::dot::{gemm_nn, gemm_nt};

use crate::float::{Float, axpy, dot};
use crate::par::pool;

#[track_caller]
fn check<F>(op: &str, a: &[F], a_len: usize, b: &[F], b_len: usize, c: &[F], c_len: usize) {
    assert!(
        a.len() == a_len && b.len() == b_len && c.len() == c_len,
        "{op}: operand lengths {}, {}, {} do not match the shapes (expected {a_len}, {b_len}, {c_len})",
        a.len(),
        b.len(),
        c.len()
    );
}

/// Linear forward. x: [T, d_in], w: [d_out, d_in] -> y: [T, d_out] (written).
pub fn linear_forward<F: Float>(x: &[F], w: &[F], y: &mut [F], t: usize, d_in: usize, d_out: usize) {
    check("linear_forward", x, t * d_in, w, d_out * d_in, y, t * d_out);
    F::gemm_xwt(x, w, y, t, d_out, d_in);
}

/// Linear backward. `dx`/`dw` are optional: a frozen weight needs no dW, the first op of a
/// graph no dx.
#[allow(clippy::too_many_arguments)]
pub fn linear_backward<F: Float>(
    dy: &[F],
    x: &[F],
    w: &[F],
    dx: Option<&mut [F]>,
    dw: Option<&mut [F]>,
    t: usize,
    d_in: usize,
    d_out: usize,
) {
    check("linear_backward", dy, t * d_out, x, t * d_in, w, d_out * d_in);
    // fwd: y[t,o] = Σ_i x[t,i]·W[o,i]  =>  dx[t,i] += Σ_o dy[t,o]·W[o,i]
    if let Some(dx) = dx {
        assert_eq!(dx.len(), t * d_in, "linear_backward: dx is not [T, d_in]");
        F::gemm_acc_dyw(dy, w, dx, t, d_out, d_in);
    }
    // fwd: y[t,o] = Σ_i x[t,i]·W[o,i]  =>  dW[o,i] += Σ_t dy[t,o]·x[t,i]
    if let Some(dw) = dw {
        assert_eq!(dw.len(), d_out * d_in, "linear_backward: dW is not [d_out, d_in]");
        F::gemm_acc_dytx(dy, x, dw, t, d_out, d_in);
    }
}

// ---- plain loops (any Float; the reference and the f64 path) ----

/// `y[t, o] = x[t]·w[o]`. x [n_t, k], w [n_o, k], y [n_t, n_o].
pub fn gemm_xwt_generic<F: Float>(x: &[F], w: &[F], y: &mut [F], n_t: usize, n_o: usize, k: usize) {
    for t in 0..n_t {
        let xr = &x[t * k..][..k];
        for o in 0..n_o {
            y[t * n_o + o] = dot(xr, &w[o * k..][..k]);
        }
    }
}

/// `dx[t] += Σ_o dy[t, o]·w[o]`. dy [n_t, n_o], w [n_o, k], dx [n_t, k].
pub fn gemm_acc_dyw_generic<F: Float>(dy: &[F], w: &[F], dx: &mut [F], n_t: usize, n_o: usize, k: usize) {
    for t in 0..n_t {
        let dxr = &mut dx[t * k..][..k];
        for o in 0..n_o {
            axpy(dy[t * n_o + o], &w[o * k..][..k], dxr);
        }
    }
}

/// `dw[o] += Σ_t dy[t, o]·x[t]`. dy [n_t, n_o], x [n_t, k], dw [n_o, k].
pub fn gemm_acc_dytx_generic<F: Float>(dy: &[F], x: &[F], dw: &mut [F], n_t: usize, n_o: usize, k: usize) {
    for o in 0..n_o {
        let dwr = &mut dw[o * k..][..k];
        for t in 0..n_t {
            axpy(dy[t * n_o + o], &x[t * k..][..k], dwr);
        }
    }
}

// ---- f32: SIMD kernels, pooled ----

/// Token tile of the f32 paths: 64 rows of x (64·k·4 bytes, ~150 KB at k = 576) stay in L2
/// while every weight row streams past once per tile.
const TILE: usize = 64;
/// Reduction block of `gemm_acc_dyw_f32` (weight rows per pass).
const OBLOCK: usize = 256;
/// Reduction block of `gemm_acc_dytx_f32` (tokens per pass).
const TBLOCK: usize = 256;

pub fn gemm_xwt_f32(x: &[f32], w: &[f32], y: &mut [f32], n_t: usize, n_o: usize, k: usize) {
    debug_assert_eq!(y.len(), n_t * n_o);
    if n_o == 0 {
        return;
    }
    pool().for_rows_mut(y, n_o, 4, |t0, ys| {
        let rows = ys.len() / n_o;
        for r0 in (0..rows).step_by(TILE) {
            let nr = (rows - r0).min(TILE);
            gemm_nt(&x[(t0 + r0) * k..][..nr * k], nr, w, n_o, k, &mut ys[r0 * n_o..][..nr * n_o], n_o);
        }
    });
}

pub fn gemm_acc_dyw_f32(dy: &[f32], w: &[f32], dx: &mut [f32], n_t: usize, n_o: usize, k: usize) {
    if k == 0 {
        return;
    }
    debug_assert_eq!(dx.len(), n_t * k);
    pool().for_rows_mut(dx, k, 4, |t0, dxs| {
        let rows = dxs.len() / k;
        let mut tmp = vec![0f32; rows.min(TILE) * k];
        let mut xb = vec![0f32; rows.min(TILE) * OBLOCK];
        for r0 in (0..rows).step_by(TILE) {
            let nr = (rows - r0).min(TILE);
            // The reduction (n_o, up to a 262k vocabulary in the LM head) in blocks of OBLOCK
            // weight rows: the kernel streams a 32-column strip of W per 4 tokens, which must
            // stay in cache (a whole-vocabulary strip is 6 MB; a block's is 32 KB).
            for o0 in (0..n_o).step_by(OBLOCK) {
                let nb = (n_o - o0).min(OBLOCK);
                for r in 0..nr {
                    xb[r * nb..][..nb].copy_from_slice(&dy[(t0 + r0 + r) * n_o + o0..][..nb]);
                }
                // tmp [nr, k] = dy[rows, o0..o0+nb] · w[o0..o0+nb, :]
                gemm_nn(&xb[..nr * nb], nr, &w[o0 * k..], k, nb, k, &mut tmp[..nr * k], k);
                dxs[r0 * k..][..nr * k].iter_mut().zip(&tmp[..nr * k]).for_each(|(a, b)| *a += b);
            }
        }
    });
}

pub fn gemm_acc_dytx_f32(dy: &[f32], x: &[f32], dw: &mut [f32], n_t: usize, n_o: usize, k: usize) {
    if k == 0 || n_o == 0 {
        return;
    }
    pool().for_rows_mut(dw, k, 4, |o0, dws| {
        let rows = dws.len() / k;
        let mut tmp = vec![0f32; rows.min(TILE) * k];
        // dyᵀ of this tile's weight rows over a block of tokens [nr, TBLOCK]: the left operand
        // must be contiguous along the reduced axis (tokens); gathered per thread, per block.
        let mut dyt = vec![0f32; rows.min(TILE) * TBLOCK];
        for r0 in (0..rows).step_by(TILE) {
            let nr = (rows - r0).min(TILE);
            for t0 in (0..n_t).step_by(TBLOCK) {
                let nb = (n_t - t0).min(TBLOCK);
                for (t, dyr) in dy[t0 * n_o..(t0 + nb) * n_o].chunks_exact(n_o).enumerate() {
                    for r in 0..nr {
                        dyt[r * nb + t] = dyr[o0 + r0 + r];
                    }
                }
                // tmp [nr, k] = dyᵀ[rows, t0..t0+nb] · x[t0..t0+nb, :]
                gemm_nn(&dyt[..nr * nb], nr, &x[t0 * k..], k, nb, k, &mut tmp[..nr * k], k);
                dws[r0 * k..][..nr * k].iter_mut().zip(&tmp[..nr * k]).for_each(|(a, b)| *a += b);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The pooled SIMD f32 products against the f64 loops, on shapes with ragged edges and
    /// (the last) several reduction blocks (OBLOCK, TBLOCK).
    #[test]
    fn f32_products_match_f64_loops() {
        for &(t, o, k) in &[(1, 1, 1), (5, 7, 3), (67, 33, 19), (130, 70, 80), (300, 270, 40)] {
            let (x, w, dy) = (rnd(t * k, 1), rnd(o * k, 2), rnd(t * o, 3));
            let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
            let (xd, wd, dyd) = (wide(&x), wide(&w), wide(&dy));
            let mut y = vec![0f32; t * o];
            let mut yd = vec![0f64; t * o];
            f32::gemm_xwt(&x, &w, &mut y, t, o, k);
            gemm_xwt_generic(&xd, &wd, &mut yd, t, o, k);
            // Accumulating products start from a non-zero buffer to test +=.
            let mut dx = vec![0.5f32; t * k];
            let mut dxd = vec![0.5f64; t * k];
            f32::gemm_acc_dyw(&dy, &w, &mut dx, t, o, k);
            gemm_acc_dyw_generic(&dyd, &wd, &mut dxd, t, o, k);
            let mut dw = vec![-0.25f32; o * k];
            let mut dwd = vec![-0.25f64; o * k];
            f32::gemm_acc_dytx(&dy, &x, &mut dw, t, o, k);
            gemm_acc_dytx_generic(&dyd, &xd, &mut dwd, t, o, k);
            for (name, a, b, red) in [("y", &y, &yd, k), ("dx", &dx, &dxd, o), ("dw", &dw, &dwd, t)] {
                // NaN-propagating (cortiq-testkit): a NaN output fails the bound.
                let wide: Vec<f64> = a.iter().map(|&p| p as f64).collect();
                let (d, i) = cortiq_testkit::max_abs_diff_f64(&wide, b);
                println!("matmul f32 {name} [{t}x{o}x{k}]: max |diff| vs f64 {d:.3e} at {i}");
                assert!(d <= 1e-6 * red as f64 + 1e-6, "{name} [{t}x{o}x{k}]: f32 differs from f64 by {d:.3e} at {i}");
            }
        }
    }
}
