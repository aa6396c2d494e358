//! `cortiq convert --linear-core vmf_phase --window W --sinks S`: the fold of the window option
//! (`mixers::vmf_window`). A converted layer keeps its attention tensors as stored and softmax
//! over its S sinks and last W positions; the fold fits what stands for the keys that left:
//!
//! - **Targets**, per calibration row t ≥ S + W and query head, from the teacher's own roped
//!   q, k and v: the far keys' (S ≤ j ≤ t − W) softmax average o_far and log-mass
//!   ℓ_far = log Σ_far e^{s_tj}, the near keys' average o_near and log-mass ℓ_near. The exact
//!   output is o_near·σ(ℓ_near − ℓ_far) + o_far·(1 − σ(ℓ_near − ℓ_far)).
//! - **Slot logit**: b = x·wbᵀ + cb fitted to ℓ_far by ridge least squares (one solve, a
//!   right-hand side per head), so e^{b} stands for the far mass.
//! - **Core**: the plain fold's random-feature phases (one state per KV group), its output norm
//!   on, and per group the bandwidth σ and half-life H of a grid search that minimises the
//!   layer's relative error against the teacher with the fitted slot (each head's gain by
//!   least squares: the output is linear in it). Then per head the slot logit's offset from a
//!   few shifts or the slot dead (logit −10⁴: sink+window alone), whichever fits best — so the
//!   fold is never worse than sink+window on its rows. The conv at the identity, κ = ½, mass 0.
//!
//! Per layer it prints sink+window's relative error alone (the slot dead), the fold's, and the
//! slot fit's R². Hand-written for the reasons of `linearize`.

use cortiq_engine::mixers::Mixer;
use cortiq_engine::mixers::attention::AttentionWeights;
use cortiq_engine::mixers::vmf::{CoreWeights, VmfConfig};
use cortiq_engine::mixers::vmf_window::VmfWindow;
use cortiq_engine::qtensor::QTensor;
use cortiq_train::vmf::{CoreCheckpoints, CoreShape, core_forward, phase_forward};
use cortiq_train::vmf_window::shift_in;

use crate::linearize::{CONV, HALF_LIVES, Rng, SIGMAS, group_features, group_phases, put_phases};

/// A layer's sink+window attention alone (the slot dead, no core): the auto choice's stand-in.
pub(crate) fn sink_window_mixer(c: &VmfConfig, att: &AttentionWeights, rope: usize) -> Box<dyn Mixer> {
    let (d, nh, nk) = (c.d_model, c.n_heads, c.n_k_heads);
    // The smallest core (one phase, no conv, gate or bias): its output never reaches the
    // softmax, whose slot logit is −10⁴ (weight e^{−10⁴ − m} = 0).
    let cc = VmfConfig { nphase: 1, conv_kernel: 0, k_gate: false, phase_bias: false, ..*c };
    let core = CoreWeights::new(
        QTensor::from_f32("thq", nh, d, vec![0.0; nh * d]),
        Vec::new(),
        QTensor::from_f32("thk", nk, d, vec![0.0; nk * d]),
        Vec::new(),
        vec![0.0; nk * 2],
        Vec::new(),
        None,
        vec![0.0; nk],
        Vec::new(),
    );
    let slot = QTensor::from_f32("slot", nh, d, vec![0.0; nh * d]);
    Box::new(VmfWindow::new(cc, att.clone(), rope, core, slot, vec![DEAD; nh]))
}

/// One calibration window of a layer, as the teacher ran it: the normed input x [T, d], roped
/// q [T, n_heads·hd] and k [T, n_kv·hd], v [T, n_kv·hd] (biased), the attention's output before
/// W_o y [T, n_heads·hd]; borrowed from the recordings.
pub(crate) struct WinRec<'a> {
    pub x: &'a [f32],
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub y: &'a [f32],
}

/// Per row t ≥ S + W and head: the near and far averages and log-masses.
struct Split {
    /// [rows, n_heads, hd]
    o_near: Vec<f64>,
    o_far: Vec<f64>,
    /// [rows, n_heads]
    l_near: Vec<f64>,
    l_far: Vec<f64>,
}

fn split(c: &VmfConfig, r: &WinRec<'_>, t: usize, scale: f64) -> Split {
    let (nh, nk, hd, s, w) = (c.n_heads, c.n_k_heads, c.d_v, c.sinks, c.window);
    let g = nh / nk;
    let rows = t - (s + w);
    let mut out = Split {
        o_near: vec![0.0; rows * nh * hd],
        o_far: vec![0.0; rows * nh * hd],
        l_near: vec![0.0; rows * nh],
        l_far: vec![0.0; rows * nh],
    };
    let mut sc = vec![0f64; t];
    for (ri, tt) in (s + w..t).enumerate() {
        for h in 0..nh {
            let qh = &r.q[(tt * nh + h) * hd..][..hd];
            let off = (h / g) * hd;
            for (j, x) in sc.iter_mut().enumerate().take(tt + 1) {
                let kj = &r.k[j * nk * hd + off..][..hd];
                *x = qh.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale;
            }
            let far = |j: usize| j >= s && j + w <= tt;
            for (is_far, o, l) in [(false, &mut out.o_near, &mut out.l_near), (true, &mut out.o_far, &mut out.l_far)] {
                let m = (0..=tt).filter(|&j| far(j) == is_far).map(|j| sc[j]).fold(f64::NEG_INFINITY, f64::max);
                let orow = &mut o[(ri * nh + h) * hd..][..hd];
                let mut z = 0.0;
                for j in (0..=tt).filter(|&j| far(j) == is_far) {
                    let e = (sc[j] - m).exp();
                    z += e;
                    orow.iter_mut().zip(&r.v[j * nk * hd + off..][..hd]).for_each(|(a, &b)| *a += e * b as f64);
                }
                orow.iter_mut().for_each(|a| *a /= z);
                l[ri * nh + h] = m + z.ln();
            }
        }
    }
    out
}

/// Solves (A + λI)x = b for symmetric positive definite A [n, n] (Cholesky, f64), for each
/// right-hand side column of b [n, k].
fn ridge_solve(a: &mut [f64], n: usize, b: &mut [f64], k: usize, lambda: f64) {
    for i in 0..n {
        a[i * n + i] += lambda;
    }
    for j in 0..n {
        let mut dj = a[j * n + j];
        for p in 0..j {
            dj -= a[j * n + p] * a[j * n + p];
        }
        let dj = dj.max(1e-300).sqrt();
        a[j * n + j] = dj;
        for i in j + 1..n {
            let mut x = a[i * n + j];
            for p in 0..j {
                x -= a[i * n + p] * a[j * n + p];
            }
            a[i * n + j] = x / dj;
        }
    }
    for c in 0..k {
        for i in 0..n {
            let mut x = b[i * k + c];
            for p in 0..i {
                x -= a[i * n + p] * b[p * k + c];
            }
            b[i * k + c] = x / a[i * n + i];
        }
        for i in (0..n).rev() {
            let mut x = b[i * k + c];
            for p in i + 1..n {
                x -= a[p * n + i] * b[p * k + c];
            }
            b[i * k + c] = x / a[i * n + i];
        }
    }
}

/// The slot logit of a head the fold leaves to sink+window (weight e^{−10⁴ − m} = 0).
const DEAD: f32 = -1e4;

/// One head's fit (`fold_window`'s head_fit): gain, residual, and y·o, o·o at that gain.
struct HeadFit {
    gain: f64,
    err: f64,
    yo: f64,
    oo: f64,
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The slot logit of a windowed layer: ℓ_far ≈ w_h·x + c_h per head, by ridge least squares
/// on [x, 1] over every row past the window of every record. Returns (w [n_heads, d_model],
/// c [n_heads], its values on every record's rows [(T − s0)·n_heads], the fit's R²).
#[allow(clippy::type_complexity)]
fn fit_slot_logit(c: &VmfConfig, recs: &[WinRec<'_>], splits: &[Split], t: usize) -> (Vec<f32>, Vec<f32>, Vec<Vec<f64>>, f64) {
    let (d, nh, s0) = (c.d_model, c.n_heads, c.sinks + c.window);
    let n1 = d + 1;
    let (mut xtx, mut xtl) = (vec![0f64; n1 * n1], vec![0f64; n1 * nh]);
    for (r, sp) in recs.iter().zip(splits) {
        for ri in 0..t - s0 {
            let xr: Vec<f64> = r.x[(s0 + ri) * d..][..d].iter().map(|&v| v as f64).chain([1.0]).collect();
            for i in 0..n1 {
                for j in 0..=i {
                    xtx[i * n1 + j] += xr[i] * xr[j];
                }
                for h in 0..nh {
                    xtl[i * nh + h] += xr[i] * sp.l_far[ri * nh + h];
                }
            }
        }
    }
    for i in 0..n1 {
        for j in 0..i {
            xtx[j * n1 + i] = xtx[i * n1 + j];
        }
    }
    let lambda = 1e-3 * (0..d).map(|i| xtx[i * n1 + i]).sum::<f64>() / d as f64;
    ridge_solve(&mut xtx, n1, &mut xtl, nh, lambda);
    let (wb, cb): (Vec<f32>, Vec<f32>) = (
        (0..nh).flat_map(|h| (0..d).map(move |i| (h, i))).map(|(h, i)| xtl[i * nh + h] as f32).collect(),
        (0..nh).map(|h| xtl[d * nh + h] as f32).collect(),
    );
    // The slot logits on every row, their fit's R², sink+window's error.
    let bs: Vec<Vec<f64>> = recs
        .iter()
        .map(|r| {
            (0..(t - s0) * nh)
                .map(|k| {
                    let (ri, h) = (k / nh, k % nh);
                    let xr = &r.x[(s0 + ri) * d..][..d];
                    xr.iter().zip(&wb[h * d..][..d]).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() + cb[h] as f64
                })
                .collect()
        })
        .collect();
    let lf: Vec<f64> = splits.iter().flat_map(|sp| sp.l_far.iter().copied()).collect();
    let lmean = lf.iter().sum::<f64>() / lf.len() as f64;
    let ss_tot: f64 = lf.iter().map(|l| (l - lmean).powi(2)).sum();
    let ss_res: f64 = bs.iter().flatten().zip(&lf).map(|(b, l)| (b - l).powi(2)).sum();
    (wb, cb, bs, 1.0 - ss_res / ss_tot.max(1e-30))
}

/// What the fold of a windowed layer fitted (`fold_window`).
struct Folded {
    thq: Vec<f32>,
    thq_b: Vec<f32>,
    thk: Vec<f32>,
    thk_b: Vec<f32>,
    a_log: Vec<f32>,
    o_norm: Vec<f32>,
    wb: Vec<f32>,
    cb: Vec<f32>,
}

/// The layer's tensors (GGUF suffix, shape, f32 values) from the fitted parts; the conv an
/// identity (its last tap 1), the key gate and mass at zero.
fn window_tensors(c: &VmfConfig, f: Folded) -> Vec<(String, Vec<u64>, Vec<f32>)> {
    let (d, nh, nk, p) = (c.d_model, c.n_heads, c.n_k_heads, c.nphase);
    let mut conv = vec![0f32; d * CONV];
    (0..d).for_each(|i| conv[i * CONV + CONV - 1] = 1.0);
    let t2 = |n: &str, r: usize, c: usize, v: Vec<f32>| (n.to_string(), vec![r as u64, c as u64], v);
    let t1 = |n: &str, v: Vec<f32>| (n.to_string(), vec![v.len() as u64], v);
    vec![
        t2("vmf_thq.weight", nh * p, d, f.thq),
        t1("vmf_thq.bias", f.thq_b),
        t2("vmf_thk.weight", nk * p, d, f.thk),
        t1("vmf_thk.bias", f.thk_b),
        t1("vmf_a_log", f.a_log),
        t2("vmf_conv.weight", d, CONV, conv),
        t2("vmf_kgate.weight", nk, d, vec![0.0; nk * d]),
        t1("vmf_kgate.bias", vec![0.0; nk]),
        t1("vmf_mass", vec![0.0; nk]),
        t1("vmf_onorm.weight", f.o_norm),
        t2("vmf_slot.weight", nh, d, f.wb),
        t1("vmf_slot.bias", f.cb),
    ]
}

/// The fold of one windowed layer (module header): its tensors (GGUF suffix, shape, f32
/// values; the attention's stay in the file) and a one-line report.
#[allow(clippy::type_complexity)]
pub(crate) fn fold_window(
    c: &VmfConfig,
    att: &AttentionWeights,
    recs: &[WinRec<'_>],
    t: usize,
    scale: f64,
    seed: u64,
) -> (Vec<(String, Vec<u64>, Vec<f32>)>, String) {
    let (d, nh, nk, hd, p) = (c.d_model, c.n_heads, c.n_k_heads, c.d_v, c.nphase);
    let (g, f, s0) = (nh / nk, 2 * p, c.sinks + c.window);
    let splits: Vec<Split> = recs.iter().map(|r| split(c, r, t, scale)).collect();
    let (mut wb, mut cb, bs, r2) = fit_slot_logit(c, recs, &splits, t);
    let (mut yy, mut sw_err) = (0f64, 0f64);
    for (r, sp) in recs.iter().zip(&splits) {
        for k in 0..(t - s0) * nh * hd {
            let y = r.y[s0 * nh * hd + k] as f64;
            yy += y * y;
            sw_err += (y - sp.o_near[k]).powi(2);
        }
    }
    // The core: per KV group the grid search of σ and H.
    let wq = att.wq.to_f32();
    let wk = att.wk.to_f32();
    let bq = att.bq.clone().unwrap_or_else(|| vec![0.0; nh * hd]);
    let bk = att.bk.clone().unwrap_or_else(|| vec![0.0; nk * hd]);
    let mut rng = Rng(seed | 1);
    let inv4 = (hd as f64).powf(-0.25);
    let (mut thq, mut thq_b) = (vec![0f32; nh * p * d], vec![0f32; nh * p]);
    let (mut thk, mut thk_b) = (vec![0f32; nk * p * d], vec![0f32; nk * p]);
    let mut a_log = vec![0f32; nk * f];
    let mut o_norm = vec![0f32; nh * hd];
    let (mut err_all, mut chosen, mut dead) = (0f64, Vec::with_capacity(nk), 0);
    let (mut yo_all, mut oo_all) = (0f64, 0f64);
    let sh = CoreShape { n_heads: g, n_states: 1, f, dv: hd };
    for s in 0..nk {
        let (kp, qp) = group_features(&mut rng, (&wq, &bq), (&wk, &bk), s, g, p, d, hd);
        let per_window: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = recs
            .iter()
            .map(|r| {
                let (tq, tk) = group_phases(&kp, &qp, &r.x, t, p, d);
                let v: Vec<f32> = (0..t).flat_map(|i| r.v[(i * nk + s) * hd..][..hd].iter().copied()).collect();
                (tq, tk, shift_in(&v, t, hd, c.sinks, c.window))
            })
            .collect();
        // The core's normed outputs f̂ [T, g, hd] on every window for one (σ, H).
        let outputs = |sigma: f32, hl: f32| -> Vec<Vec<f32>> {
            let sc = (sigma as f64 * inv4) as f32;
            let a_row = vec![((std::f64::consts::LN_2 / hl as f64).ln()) as f32; f];
            per_window
                .iter()
                .map(|(tq, tk, vs)| {
                    let s_q: Vec<f32> = tq.iter().map(|&x| x * sc).collect();
                    let s_k: Vec<f32> = tk.iter().map(|&x| x * sc).collect();
                    let (mut phq, mut phk) = (vec![0f32; 2 * s_q.len()], vec![0f32; 2 * s_k.len()]);
                    phase_forward(&s_q, &[0f32], g, p, &mut phq);
                    phase_forward(&s_k, &[0f32], 1, p, &mut phk);
                    let phk = shift_in(&phk, t, f, c.sinks, c.window);
                    let kap = shift_in(&vec![0.5f32; t], t, 1, c.sinks, c.window);
                    let mut o = vec![0f32; t * g * hd];
                    core_forward(&sh, &phq, &phk, &kap, vs, &a_row, &mut o, &mut CoreCheckpoints::default());
                    cortiq_kernels::vmf::out_norm(&o, &vec![1.0; g * hd], hd)
                })
                .collect()
        };
        // Head j of the group with its slot logit moved by δ (None: the slot dead): the output
        // is A + gain·B with A = α·o_near, B = (1 − α)·f̂; the least-squares gain, the residual
        // and (y·o, o·o) at that gain.
        let head_fit = |fs: &[Vec<f32>], j: usize, delta: Option<f64>| -> HeadFit {
            let h = s * g + j;
            let [mut ya, mut yb, mut aa, mut ab, mut bb, mut yy] = [0f64; 6];
            for ((fo, r), (sp, b)) in fs.iter().zip(recs).zip(splits.iter().zip(&bs)) {
                for ri in 0..t - s0 {
                    let tt = s0 + ri;
                    let alpha = delta.map_or(1.0, |dl| sigmoid(sp.l_near[ri * nh + h] - b[ri * nh + h] - dl));
                    let fr = &fo[(tt * g + j) * hd..][..hd];
                    let yr = &r.y[(tt * nh + h) * hd..][..hd];
                    let on = &sp.o_near[(ri * nh + h) * hd..][..hd];
                    for e in 0..hd {
                        let (y, a, bv) = (yr[e] as f64, alpha * on[e], (1.0 - alpha) * fr[e] as f64);
                        ya += y * a;
                        yb += y * bv;
                        aa += a * a;
                        ab += a * bv;
                        bb += bv * bv;
                        yy += y * y;
                    }
                }
            }
            let gain = if bb > 0.0 { (yb - ab) / bb } else { 0.0 };
            let err = yy - 2.0 * ya + aa - if bb > 0.0 { (yb - ab) * (yb - ab) / bb } else { 0.0 };
            HeadFit { gain, err, yo: ya + gain * yb, oo: aa + 2.0 * gain * ab + gain * gain * bb }
        };
        let mut best: Option<(f64, f32, f32)> = None;
        for &sigma in &SIGMAS {
            for &hl in &HALF_LIVES {
                let fs = outputs(sigma, hl);
                let err: f64 = (0..g).map(|j| head_fit(&fs, j, Some(0.0)).err).sum();
                if best.is_none_or(|b| err < b.0) {
                    best = Some((err, sigma, hl));
                }
            }
        }
        let (_, sigma, hl) = best.expect("a grid point");
        chosen.push(format!("σ {sigma} H {hl}"));
        put_phases(&kp, &qp, sigma as f64 * inv4, s, g, p, d, (&mut thq, &mut thq_b), (&mut thk, &mut thk_b));
        a_log[s * f..(s + 1) * f].fill(((std::f64::consts::LN_2 / hl as f64).ln()) as f32);
        // Per head the slot logit's offset: the fitted mass can dilute a head that the window
        // already serves well; the best of a few shifts, or the slot dead (sink+window alone).
        let fs = outputs(sigma, hl);
        for j in 0..g {
            let h = s * g + j;
            let (mut pick, mut fit) = (Some(0.0), head_fit(&fs, j, Some(0.0)));
            for delta in [Some(1.0), Some(-1.0), Some(-2.0), Some(-4.0), Some(-8.0), None] {
                let r = head_fit(&fs, j, delta);
                if r.err < fit.err {
                    (pick, fit) = (delta, r);
                }
            }
            err_all += fit.err;
            (yo_all, oo_all) = (yo_all + fit.yo, oo_all + fit.oo);
            match pick {
                Some(dl) => {
                    cb[h] = (cb[h] as f64 + dl) as f32;
                    o_norm[h * hd..][..hd].fill(fit.gain as f32);
                }
                None => {
                    cb[h] = DEAD;
                    wb[h * d..][..d].fill(0.0);
                    o_norm[h * hd..][..hd].fill(1.0);
                    dead += 1;
                }
            }
        }
    }
    let yy = yy.max(1e-30);
    let report = format!(
        "rows past the window: sink+window alone relative error {:.3}, with the fold {:.3} (cosine {:.3}); slot logit R² {:.3}; \
         {dead} of {nh} heads' slots dead; per KV group {}",
        sw_err / yy,
        err_all / yy,
        yo_all / (yy * oo_all.max(1e-30)).sqrt(),
        r2,
        chosen.join(", ")
    );
    let tensors = window_tensors(c, Folded { thq, thq_b, thk, thk_b, a_log, o_norm, wb, cb });
    (tensors, report)
}
