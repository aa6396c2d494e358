//! Depthwise causal 1-D convolution over time with a carried state: GatedDeltaNet's and KDA's
//! short convolution on q/k/v (kernel 4, then SiLU) and LFM2's gated short convolution (no
//! activation). The state holds the last `kernel − 1` inputs per channel, so prefill in pieces
//! and decode one token at a time give the same outputs as one pass.
//!
//! `out[t, c] = Σ_{i<K} w[c, i] · x[t − (K−1) + i, c]` (+ bias[c]), where inputs before the
//! first token of this call come from the state (oldest first) — the layout of a PyTorch
//! `Conv1d(groups = C, padding = K − 1)` weight [C, 1, K] truncated to the causal part.

/// The convolution over `t` tokens of `c` channels. x: [t, c]; w: [c, kernel]; bias: [c] or
/// empty; state: [kernel − 1, c] (oldest first, read and advanced); out: [t, c]. `silu` applies
/// x·σ(x) to each output (`act::silu_fast`: the vector exp).
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d(
    x: &[f32],
    t: usize,
    c: usize,
    w: &[f32],
    kernel: usize,
    bias: &[f32],
    state: &mut [f32],
    silu: bool,
    out: &mut [f32],
) {
    check(x, t, c, w, kernel, bias, state, out);
    let wt = taps_by_row(w, c, kernel);
    conv_rows(x, c, &wt, kernel, bias, state, silu, 0, out);
    advance_state(x, t, c, state);
}

/// `causal_conv1d` with the tokens split over the pool: every output row is computed exactly
/// as the serial function does (same taps, same order), so the two agree bit for bit. The
/// prefill convolution of a 0.8B GatedDeltaNet layer is 512 × 6144 channels — ~5% of a
/// prefill when it ran on one thread.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d_par(
    pool: &crate::pool::Pool,
    x: &[f32],
    t: usize,
    c: usize,
    w: &[f32],
    kernel: usize,
    bias: &[f32],
    state: &mut [f32],
    silu: bool,
    out: &mut [f32],
) {
    check(x, t, c, w, kernel, bias, state, out);
    if t <= DIRECT_MAX_TOKENS {
        // Decode: transposing the taps would cost more than the convolution itself.
        conv_rows_direct(pool, x, c, w, kernel, bias, state, silu, out);
    } else {
        let wt = taps_by_row(w, c, kernel);
        let st: &[f32] = state;
        pool.for_rows_mut(out, c, 16, |s0, o| conv_rows(x, c, &wt, kernel, bias, st, silu, s0, o));
    }
    advance_state(x, t, c, state);
}

#[allow(clippy::too_many_arguments)]
fn check(x: &[f32], t: usize, c: usize, w: &[f32], kernel: usize, bias: &[f32], state: &[f32], out: &[f32]) {
    assert!(kernel >= 1, "causal_conv1d: kernel must be at least 1");
    let hist = kernel - 1;
    assert!(
        x.len() == t * c
            && w.len() == c * kernel
            && (bias.is_empty() || bias.len() == c)
            && state.len() == hist * c
            && out.len() == t * c,
        "causal_conv1d: {t} tokens x {c} channels, kernel {kernel}: x {}, w {}, bias {}, state {}, out {} values",
        x.len(),
        w.len(),
        bias.len(),
        state.len(),
        out.len()
    );
}

/// Taps transposed to [kernel, c] so the inner loop runs over contiguous channels.
fn taps_by_row(w: &[f32], c: usize, kernel: usize) -> Vec<f32> {
    let mut wt = vec![0f32; kernel * c]; // [kernel, c]
    for ch in 0..c {
        for i in 0..kernel {
            wt[i * c + ch] = w[ch * kernel + i];
        }
    }
    wt
}

/// Output rows s0.. (as many as `out` holds) of the convolution. The inputs, oldest first,
/// are the state's rows then x's: row r of that sequence is state[r] for r < hist, else
/// x[r − hist] (read in place, no concatenated copy).
#[allow(clippy::too_many_arguments)]
fn conv_rows(
    x: &[f32],
    c: usize,
    wt: &[f32],
    kernel: usize,
    bias: &[f32],
    state: &[f32],
    silu: bool,
    s0: usize,
    out: &mut [f32],
) {
    let hist = kernel - 1;
    let input = |r: usize| if r < hist { &state[r * c..(r + 1) * c] } else { &x[(r - hist) * c..(r - hist + 1) * c] };
    for (j, o) in out.chunks_mut(c).enumerate() {
        let s = s0 + j;
        if bias.is_empty() {
            o.fill(0.0);
        } else {
            o.copy_from_slice(bias);
        }
        // Same order as the definition: taps i = 0..kernel, each a contiguous axpy.
        for i in 0..kernel {
            for ((ov, &xv), &wv) in o.iter_mut().zip(input(s + i)).zip(&wt[i * c..(i + 1) * c]) {
                *ov += wv * xv;
            }
        }
        if silu {
            crate::act::silu_fast(o);
        }
    }
}

/// Calls with at most this many tokens read the taps in their stored [c, kernel] layout.
const DIRECT_MAX_TOKENS: usize = 2;

/// `conv_rows` from row 0 without the transposed taps: per output row, per tap, one pass over
/// the channels; every output is the same chain (bias or 0, then taps 0..kernel in order), so
/// the bits equal `conv_rows`'. Decode has one row: the channels are split over the pool.
#[allow(clippy::too_many_arguments)]
fn conv_rows_direct(
    pool: &crate::pool::Pool,
    x: &[f32],
    c: usize,
    w: &[f32],
    kernel: usize,
    bias: &[f32],
    state: &[f32],
    silu: bool,
    out: &mut [f32],
) {
    let hist = kernel - 1;
    let input = |r: usize| if r < hist { &state[r * c..(r + 1) * c] } else { &x[(r - hist) * c..(r - hist + 1) * c] };
    for (s, o) in out.chunks_mut(c).enumerate() {
        // Channel ranges of this row: ch0.. (as many as `part` holds).
        let run = |ch0: usize, part: &mut [f32]| {
            let n = part.len();
            if bias.is_empty() {
                part.fill(0.0);
            } else {
                part.copy_from_slice(&bias[ch0..ch0 + n]);
            }
            for i in 0..kernel {
                let src = &input(s + i)[ch0..ch0 + n];
                for (j, (ov, &xv)) in part.iter_mut().zip(src).enumerate() {
                    *ov += w[(ch0 + j) * kernel + i] * xv;
                }
            }
            if silu {
                crate::act::silu_fast(part);
            }
        };
        pool.for_rows_mut(o, 1, 1024, run);
    }
}

/// The new state: the last `hist` inputs of (old state, x).
fn advance_state(x: &[f32], t: usize, c: usize, state: &mut [f32]) {
    let hist = state.len() / c.max(1);
    if t >= hist {
        state.copy_from_slice(&x[(t - hist) * c..]);
    } else {
        state.copy_within(t * c.., 0);
        state[(hist - t) * c..].copy_from_slice(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One pass equals the same tokens in pieces of 1, 2 and 5 (state carried), and a hand
    /// computation of the first outputs from a zero state.
    #[test]
    fn pieces_equal_one_pass() {
        let (t, c, k) = (11, 3, 4);
        let x: Vec<f32> = (0..t * c).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
        let w: Vec<f32> = (0..c * k).map(|i| ((i * 13 % 7) as f32 - 3.0) / 4.0).collect();
        let bias = [0.1, -0.2, 0.3];
        for silu in [false, true] {
            let mut s_all = vec![0f32; (k - 1) * c];
            let mut o_all = vec![0f32; t * c];
            causal_conv1d(&x, t, c, &w, k, &bias, &mut s_all, silu, &mut o_all);
            if !silu {
                // token 0 sees only x[0] at the last tap; token 1 sees x[0], x[1] at the last two
                assert!((o_all[0] - (bias[0] + w[3] * x[0])).abs() < 1e-6);
                assert!((o_all[c + 1] - (bias[1] + w[4 + 2] * x[1] + w[4 + 3] * x[c + 1])).abs() < 1e-6);
            }
            for piece in [1, 2, 5] {
                let mut s = vec![0f32; (k - 1) * c];
                let mut o = vec![0f32; t * c];
                let mut t0 = 0;
                while t0 < t {
                    let n = piece.min(t - t0);
                    causal_conv1d(&x[t0 * c..(t0 + n) * c], n, c, &w, k, &bias, &mut s, silu, &mut o[t0 * c..(t0 + n) * c]);
                    t0 += n;
                }
                assert_eq!(o, o_all, "silu {silu}: pieces of {piece} differ from one pass");
                assert_eq!(s, s_all, "silu {silu}: state after pieces of {piece} differs");
            }
            // The pooled version, in one pass and in pieces, equals the serial one bit for bit.
            let pool = crate::pool::Pool::new(3).unwrap();
            for piece in [1, 2, 5, t] {
                let mut s = vec![0f32; (k - 1) * c];
                let mut o = vec![0f32; t * c];
                let mut t0 = 0;
                while t0 < t {
                    let n = piece.min(t - t0);
                    causal_conv1d_par(
                        &pool,
                        &x[t0 * c..(t0 + n) * c],
                        n,
                        c,
                        &w,
                        k,
                        &bias,
                        &mut s,
                        silu,
                        &mut o[t0 * c..(t0 + n) * c],
                    );
                    t0 += n;
                }
                assert_eq!(o, o_all, "silu {silu}: pooled, pieces of {piece} differ from the serial pass");
                assert_eq!(s, s_all, "silu {silu}: pooled, state after pieces of {piece} differs");
            }
        }
    }
}
