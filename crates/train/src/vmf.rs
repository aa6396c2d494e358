//! vmf_phase (issue 16) as training ops, each a (forward, backward) pair: the causal depthwise
//! conv on the mixer input, the phase features φ = [cos θs; sin θs] (s = 1/(1 + mass)), the
//! write gate κ = σ(z), the decayed linear core by backpropagation through time, and the whole
//! mixer assembled from them with the linear projections ([`vmf_mixer_forward`] /
//! [`vmf_mixer_backward`]): what `polish` trains when it heals a converted layer. The engine's
//! operator is `cortiq_engine::mixers::vmf` (same definition; its chunked prefill is only a
//! faster order of the same sums).
//!
//! Core, per state s with query heads h of its group (S: [F, dv] from zero):
//! ```text
//! S_t = λ ⊙ S_{t−1} + κ_t · φk_t ⊗ v_t        λ_f = exp(−exp(A_log_f))
//! o_t[h] = S_tᵀ φq_t[h]
//! ```
//! With the output norm (an option, on when its gains are given) each head's o_t[h] becomes
//! g_h ⊙ o_t[h] / rms(o_t[h]) before out_proj ([`out_norm_forward`]).
//!
//! The forward keeps S at every CHECKPOINT-th step; the backward replays each span from its
//! checkpoint and walks it in reverse (as `delta`).
//!
//! Accumulation contract: param grads +=, activations =.

use crate::float::{Float, dot, wide};
use crate::matmul::{linear_backward, linear_forward};
use crate::par::pool;

/// Steps between stored states.
pub const CHECKPOINT: usize = 64;

/// φq: [T, n_heads, F]; φk: [T, n_states, F]; κ: [T, n_states]; v: [T, n_states, dv];
/// A_log: [n_states, F]; o: [T, n_heads, dv]. Query head h reads state h / (n_heads / n_states).
#[derive(Debug, Clone, Copy)]
pub struct CoreShape {
    pub n_heads: usize,
    pub n_states: usize,
    /// Components per state (2·nphase).
    pub f: usize,
    pub dv: usize,
}

impl CoreShape {
    #[track_caller]
    fn check<F>(&self, op: &str, phq: &[F], phk: &[F], kappa: &[F], v: &[F], a_log: &[F]) -> usize {
        let (nh, ns, f, dv) = (self.n_heads, self.n_states, self.f, self.dv);
        assert!(nh > 0 && ns > 0 && nh.is_multiple_of(ns) && f > 0 && dv > 0, "{op}: {nh} heads over {ns} states");
        assert!(phq.len().is_multiple_of(nh * f), "{op}: φq must be [T, {nh}, {f}]");
        let t = phq.len() / (nh * f);
        assert!(
            phk.len() == t * ns * f && kappa.len() == t * ns && v.len() == t * ns * dv && a_log.len() == ns * f,
            "{op}: φk must be [{t}, {ns}, {f}], κ [{t}, {ns}], v [{t}, {ns}, {dv}], A_log [{ns}, {f}]"
        );
        t
    }
}

/// States saved by the forward: [n_states, ceil(T/CHECKPOINT), F, dv].
#[derive(Debug, Clone, Default)]
pub struct CoreCheckpoints<F> {
    pub states: Vec<F>,
}

/// λ = exp(−exp(a)).
fn decay<F: Float>(a: F) -> F {
    (-(a.exp())).exp()
}

/// S ← λ ⊙ S + κ·φk ⊗ v (in place).
#[inline]
fn write<F: Float>(s: &mut [F], lam: &[F], kappa: F, phk: &[F], v: &[F], dv: usize) {
    for (fi, row) in s.chunks_exact_mut(dv).enumerate() {
        let (l, c) = (lam[fi], kappa * phk[fi]);
        row.iter_mut().zip(v).for_each(|(x, &vv)| *x = l * *x + c * vv);
    }
}

/// Core forward: o (written) and the checkpoints (written).
#[allow(clippy::too_many_arguments)]
pub fn core_forward<F: Float>(
    sh: &CoreShape,
    phq: &[F],
    phk: &[F],
    kappa: &[F],
    v: &[F],
    a_log: &[F],
    o: &mut [F],
    ck: &mut CoreCheckpoints<F>,
) {
    let t_len = sh.check("vmf core_forward", phq, phk, kappa, v, a_log);
    let (nh, ns, f, dv) = (sh.n_heads, sh.n_states, sh.f, sh.dv);
    let g = nh / ns;
    assert_eq!(o.len(), t_len * nh * dv, "vmf core_forward: o must be [T, {nh}, {dv}]");
    let n_ck = t_len.div_ceil(CHECKPOINT);
    let row = t_len * g * dv + n_ck * f * dv; // per state: o [T, g, dv] | states [n_ck, F, dv]
    let mut buf = vec![F::ZERO; ns * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |s, out| {
        wide(|| {
            let (os, st) = out.split_at_mut(t_len * g * dv);
            let lam: Vec<F> = a_log[s * f..(s + 1) * f].iter().map(|&a| decay(a)).collect();
            let mut sm = vec![F::ZERO; f * dv]; // [F, dv]
            for t in 0..t_len {
                if t % CHECKPOINT == 0 {
                    st[t / CHECKPOINT * f * dv..][..f * dv].copy_from_slice(&sm);
                }
                let i = t * ns + s;
                write(&mut sm, &lam, kappa[i], &phk[i * f..][..f], &v[i * dv..][..dv], dv);
                for j in 0..g {
                    let q = &phq[(t * nh + s * g + j) * f..][..f];
                    let ot = &mut os[(t * g + j) * dv..][..dv];
                    ot.fill(F::ZERO);
                    for (fi, row) in sm.chunks_exact(dv).enumerate() {
                        let qf = q[fi];
                        ot.iter_mut().zip(row).for_each(|(a, &b)| *a += qf * b); // o = Sᵀφq
                    }
                }
            }
        })
    });
    ck.states.clear();
    ck.states.resize(ns * n_ck * f * dv, F::ZERO);
    for s in 0..ns {
        let (os, st) = buf[s * row..][..row].split_at(t_len * g * dv);
        for t in 0..t_len {
            o[(t * nh + s * g) * dv..][..g * dv].copy_from_slice(&os[t * g * dv..][..g * dv]);
        }
        ck.states[s * n_ck * f * dv..][..n_ck * f * dv].copy_from_slice(st);
    }
}

/// Gradients of one core backward call (all +=).
pub struct CoreGrads<'a, F> {
    pub dphq: &'a mut [F],
    pub dphk: &'a mut [F],
    pub dkappa: &'a mut [F],
    pub dv: &'a mut [F],
    pub da_log: &'a mut [F],
}

/// Backward through time (dS: the gradient w.r.t. S_t from later steps):
/// fwd: o[h] = S_tᵀφq[h]              =>  dφq[h] += S_t·do[h];  dS += φq[h]⊗do[h]
/// fwd: S_t = λ⊙S_{t−1} + κ φk⊗v     =>  dκ += Σ dS⊙(φk⊗v);  dφk += κ dS·v;  dv += κ dSᵀφk;
///                                        dλ += Σ_d dS⊙S_{t−1};  dS_{t−1} = λ⊙dS
/// fwd: λ = exp(−exp(a))             =>  da += dλ·λ·(−exp(a))
#[allow(clippy::too_many_arguments)]
pub fn core_backward<F: Float>(
    sh: &CoreShape,
    phq: &[F],
    phk: &[F],
    kappa: &[F],
    v: &[F],
    a_log: &[F],
    ck: &CoreCheckpoints<F>,
    d_o: &[F],
    grads: CoreGrads<'_, F>,
) {
    let t_len = sh.check("vmf core_backward", phq, phk, kappa, v, a_log);
    let (nh, ns, f, dv) = (sh.n_heads, sh.n_states, sh.f, sh.dv);
    let g = nh / ns;
    let n_ck = t_len.div_ceil(CHECKPOINT);
    assert_eq!(ck.states.len(), ns * n_ck * f * dv, "vmf core_backward: checkpoints are not from a forward of this shape");
    assert!(
        d_o.len() == t_len * nh * dv
            && grads.dphq.len() == phq.len()
            && grads.dphk.len() == phk.len()
            && grads.dkappa.len() == kappa.len()
            && grads.dv.len() == v.len()
            && grads.da_log.len() == a_log.len(),
        "vmf core_backward: gradient buffers must match their inputs"
    );
    // Per state: dφq [T, g, F] | dφk [T, F] | dκ [T] | dv [T, dv] | dA_log [F].
    let row = t_len * (g * f + f + 1 + dv) + f;
    let mut buf = vec![F::ZERO; ns * row];
    pool().for_rows_mut_dynamic(&mut buf, row, 1, |s, out| {
        wide(|| {
            let (bq, rest) = out.split_at_mut(t_len * g * f);
            let (bk, rest) = rest.split_at_mut(t_len * f);
            let (bkap, rest) = rest.split_at_mut(t_len);
            let (bv, ba) = rest.split_at_mut(t_len * dv);
            let al = &a_log[s * f..(s + 1) * f];
            let lam: Vec<F> = al.iter().map(|&a| decay(a)).collect();
            let mut dlam = vec![F::ZERO; f];
            let mut ds = vec![F::ZERO; f * dv]; // dS [F, dv]
            let mut prev = vec![F::ZERO; CHECKPOINT * f * dv]; // S_{t−1} of the span's steps
            let mut sm = vec![F::ZERO; f * dv];
            for c in (0..n_ck).rev() {
                let (t0, t1) = (c * CHECKPOINT, ((c + 1) * CHECKPOINT).min(t_len));
                sm.copy_from_slice(&ck.states[(s * n_ck + c) * f * dv..][..f * dv]);
                for t in t0..t1 {
                    prev[(t - t0) * f * dv..][..f * dv].copy_from_slice(&sm);
                    let i = t * ns + s;
                    write(&mut sm, &lam, kappa[i], &phk[i * f..][..f], &v[i * dv..][..dv], dv);
                }
                for t in (t0..t1).rev() {
                    let i = t * ns + s;
                    let (pk, vt) = (&phk[i * f..][..f], &v[i * dv..][..dv]);
                    let sp = &prev[(t - t0) * f * dv..][..f * dv];
                    // Rebuild S_t from S_{t−1}.
                    sm.copy_from_slice(sp);
                    write(&mut sm, &lam, kappa[i], pk, vt, dv);
                    // fwd: o[h] = S_tᵀφq[h]  =>  dφq[h] += S_t·do[h]; dS += φq[h]⊗do[h]
                    for j in 0..g {
                        let hi = t * nh + s * g + j;
                        let (q, dot_) = (&phq[hi * f..][..f], &d_o[hi * dv..][..dv]);
                        for fi in 0..f {
                            bq[(t * g + j) * f + fi] += dot(&sm[fi * dv..][..dv], dot_);
                            ds[fi * dv..][..dv].iter_mut().zip(dot_).for_each(|(a, &b)| *a += q[fi] * b);
                        }
                    }
                    // fwd: S_t = λ⊙S_{t−1} + κ φk⊗v
                    let kap = kappa[i];
                    for fi in 0..f {
                        let dsf = &ds[fi * dv..][..dv];
                        let u = dot(dsf, vt); // (dS·v)_f
                        bk[t * f + fi] += kap * u;
                        bkap[t] += pk[fi] * u;
                        let c = kap * pk[fi];
                        bv[t * dv..][..dv].iter_mut().zip(dsf).for_each(|(a, &b)| *a += c * b);
                        dlam[fi] += dot(dsf, &sp[fi * dv..][..dv]);
                    }
                    for (fi, row) in ds.chunks_exact_mut(dv).enumerate() {
                        let l = lam[fi];
                        row.iter_mut().for_each(|x| *x *= l); // dS_{t−1} = λ⊙dS
                    }
                }
            }
            // fwd: λ = exp(−exp(a))  =>  da += dλ·λ·(−exp(a))
            for fi in 0..f {
                ba[fi] += dlam[fi] * lam[fi] * (-(al[fi].exp()));
            }
        })
    });
    for s in 0..ns {
        let r = &buf[s * row..][..row];
        let (bq, rest) = r.split_at(t_len * g * f);
        let (bk, rest) = rest.split_at(t_len * f);
        let (bkap, rest) = rest.split_at(t_len);
        let (bv, ba) = rest.split_at(t_len * dv);
        for t in 0..t_len {
            let q0 = (t * nh + s * g) * f;
            grads.dphq[q0..q0 + g * f].iter_mut().zip(&bq[t * g * f..][..g * f]).for_each(|(a, &b)| *a += b);
            let i = t * ns + s;
            grads.dphk[i * f..][..f].iter_mut().zip(&bk[t * f..][..f]).for_each(|(a, &b)| *a += b);
            grads.dkappa[i] += bkap[t];
            grads.dv[i * dv..][..dv].iter_mut().zip(&bv[t * dv..][..dv]).for_each(|(a, &b)| *a += b);
        }
        grads.da_log[s * f..][..f].iter_mut().zip(ba).for_each(|(a, &b)| *a += b);
    }
}

/// Phase features: θ [T, H, P] -> φ [T, H, 2P] (written), φ = [cos θs; sin θs] with
/// s = 1/(1 + mass[h / group]) (`group`: heads per state; 1 for the states' own keys).
pub fn phase_forward<F: Float>(theta: &[F], mass: &[F], group: usize, p: usize, phi: &mut [F]) {
    let hp = mass.len() * group * p;
    assert!(
        theta.len().is_multiple_of(hp) && phi.len() == 2 * theta.len(),
        "phase_forward: θ must be [T, {}, {p}]",
        mass.len() * group
    );
    for (i, (th, ph)) in theta.chunks_exact(p).zip(phi.chunks_exact_mut(2 * p)).enumerate() {
        let h = (i % (hp / p)) / group;
        let sc = F::ONE / (F::ONE + mass[h]);
        let (c, sn) = ph.split_at_mut(p);
        for ((&x, c), sn) in th.iter().zip(c).zip(sn) {
            let (a, b) = (x * sc).sin_cos();
            *c = b;
            *sn = a;
        }
    }
}

/// fwd: φ = [cos θs; sin θs], s = 1/(1+m)  =>  let g = −sin·dc + cos·ds (d/d(θs)):
/// dθ += s·g;  dm += Σ g·θ·(−s²)
pub fn phase_backward<F: Float>(theta: &[F], mass: &[F], group: usize, p: usize, dphi: &[F], dtheta: &mut [F], dmass: &mut [F]) {
    let hp = mass.len() * group * p;
    assert!(
        theta.len().is_multiple_of(hp)
            && dphi.len() == 2 * theta.len()
            && dtheta.len() == theta.len()
            && dmass.len() == mass.len(),
        "phase_backward: buffers must match θ [T, {}, {p}]",
        mass.len() * group
    );
    for (i, (th, dph)) in theta.chunks_exact(p).zip(dphi.chunks_exact(2 * p)).enumerate() {
        let h = (i % (hp / p)) / group;
        let sc = F::ONE / (F::ONE + mass[h]);
        let (dc, dsn) = dph.split_at(p);
        let dth = &mut dtheta[i * p..(i + 1) * p];
        let mut dm = F::ZERO;
        for j in 0..p {
            let (sn, c) = (th[j] * sc).sin_cos();
            let g = c * dsn[j] - sn * dc[j];
            dth[j] += sc * g;
            dm += g * th[j];
        }
        dmass[h] += -(dm * sc * sc);
    }
}

/// Causal depthwise conv: x [T, d], taps [d, k] (the last tap the current token) -> y [T, d]
/// (written): y[t, c] = Σ_i taps[c, i]·x[t − (k−1) + i, c], zero before the first token.
pub fn conv_forward<F: Float>(x: &[F], taps: &[F], d: usize, k: usize, y: &mut [F]) {
    let t_len = x.len() / d;
    assert!(taps.len() == d * k && y.len() == x.len(), "conv_forward: taps must be [{d}, {k}], y [{t_len}, {d}]");
    for t in 0..t_len {
        for c in 0..d {
            let mut acc = F::ZERO;
            for i in 0..k {
                if let Some(src) = (t + i).checked_sub(k - 1) {
                    acc += taps[c * k + i] * x[src * d + c];
                }
            }
            y[t * d + c] = acc;
        }
    }
}

/// fwd: y[t,c] = Σ_i w[c,i]·x[t−(k−1)+i, c]  =>  dx[t−(k−1)+i, c] += w[c,i]·dy[t,c];
/// dw[c,i] += x[t−(k−1)+i, c]·dy[t,c]
pub fn conv_backward<F: Float>(dy: &[F], x: &[F], taps: &[F], d: usize, k: usize, dx: Option<&mut [F]>, dtaps: Option<&mut [F]>) {
    let t_len = x.len() / d;
    assert!(taps.len() == d * k && dy.len() == x.len(), "conv_backward: shapes");
    if let Some(dx) = dx {
        for t in 0..t_len {
            for i in 0..k {
                if let Some(src) = (t + i).checked_sub(k - 1) {
                    for c in 0..d {
                        dx[src * d + c] += taps[c * k + i] * dy[t * d + c];
                    }
                }
            }
        }
    }
    if let Some(dw) = dtaps {
        for t in 0..t_len {
            for i in 0..k {
                if let Some(src) = (t + i).checked_sub(k - 1) {
                    for c in 0..d {
                        dw[c * k + i] += x[src * d + c] * dy[t * d + c];
                    }
                }
            }
        }
    }
}

/// One layer's vmf_phase geometry and options (the engine's `VmfConfig`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VmfShape {
    pub d_model: usize,
    pub n_heads: usize,
    pub n_states: usize,
    pub nphase: usize,
    pub dv: usize,
    /// 0: no conv.
    pub conv_kernel: usize,
    pub k_gate: bool,
    pub phase_bias: bool,
}

impl VmfShape {
    pub fn core(&self) -> CoreShape {
        CoreShape { n_heads: self.n_heads, n_states: self.n_states, f: 2 * self.nphase, dv: self.dv }
    }
}

/// A vmf_phase layer's parameters (or their gradients, same layout). Options that are off
/// hold empty vectors.
#[derive(Debug, Clone, Default)]
pub struct VmfParams<F> {
    /// [n_heads·P, d]
    pub thq: Vec<F>,
    /// [n_heads·P] or empty.
    pub thq_b: Vec<F>,
    /// [n_states·P, d]
    pub thk: Vec<F>,
    /// [n_states·P] or empty.
    pub thk_b: Vec<F>,
    /// [n_states·dv, d]
    pub v: Vec<F>,
    /// [d, n_heads·dv]
    pub out: Vec<F>,
    /// [d] or empty (the output bias).
    pub out_b: Vec<F>,
    /// [n_states·2P]
    pub a_log: Vec<F>,
    /// [d, k] or empty.
    pub conv: Vec<F>,
    /// [n_states, d] and [n_states], or empty.
    pub kg_w: Vec<F>,
    pub kg_b: Vec<F>,
    /// [n_states]
    pub mass: Vec<F>,
    /// [n_heads·dv] or empty: the output norm's gains (the option is on by presence).
    pub o_norm: Vec<F>,
}

impl<F: Float> VmfParams<F> {
    /// Zero buffers of the shape of `self` (gradients).
    pub fn zeros_like(&self) -> VmfParams<F> {
        let z = |v: &Vec<F>| vec![F::ZERO; v.len()];
        VmfParams {
            thq: z(&self.thq),
            thq_b: z(&self.thq_b),
            thk: z(&self.thk),
            thk_b: z(&self.thk_b),
            v: z(&self.v),
            out: z(&self.out),
            out_b: z(&self.out_b),
            a_log: z(&self.a_log),
            conv: z(&self.conv),
            kg_w: z(&self.kg_w),
            kg_b: z(&self.kg_b),
            mass: z(&self.mass),
            o_norm: z(&self.o_norm),
        }
    }

    /// Every tensor, in a fixed order (the optimizer's and the gradcheck's view).
    pub fn tensors_mut(&mut self) -> [(&'static str, &mut Vec<F>); 13] {
        [
            ("thq", &mut self.thq),
            ("thq_b", &mut self.thq_b),
            ("thk", &mut self.thk),
            ("thk_b", &mut self.thk_b),
            ("v", &mut self.v),
            ("out", &mut self.out),
            ("out_b", &mut self.out_b),
            ("a_log", &mut self.a_log),
            ("conv", &mut self.conv),
            ("kg_w", &mut self.kg_w),
            ("kg_b", &mut self.kg_b),
            ("mass", &mut self.mass),
            ("o_norm", &mut self.o_norm),
        ]
    }
}

/// What the mixer's backward needs of its forward.
#[derive(Debug, Clone, Default)]
pub struct VmfActs<F> {
    /// [T, d] after the conv (the input itself without one: empty, read x).
    pub xc: Vec<F>,
    /// [T, n_heads·P], [T, n_states·P] (biases added)
    pub thq: Vec<F>,
    pub thk: Vec<F>,
    /// [T, n_heads, F], [T, n_states, F]
    pub phq: Vec<F>,
    pub phk: Vec<F>,
    /// [T, n_states]
    pub kappa: Vec<F>,
    /// [T, n_states·dv]
    pub v: Vec<F>,
    /// [T, n_heads·dv]: the core's output
    pub o: Vec<F>,
    /// With the output norm: [T, n_heads·dv] the normed output (out_proj's input) and
    /// [T, n_heads] 1/rms of each head's core output; empty without it.
    pub on: Vec<F>,
    pub inv_rms: Vec<F>,
    pub ck: CoreCheckpoints<F>,
}

pub(crate) fn add_bias<F: Float>(y: &mut [F], b: &[F]) {
    if !b.is_empty() {
        y.chunks_exact_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(y, &b)| *y += b));
    }
}

/// A gradient buffer, or None for a tensor not trained (left empty).
pub(crate) fn opt<F>(v: &mut [F]) -> Option<&mut [F]> {
    if v.is_empty() { None } else { Some(v) }
}

pub(crate) fn bias_grad<F: Float>(dy: &[F], db: &mut [F]) {
    if !db.is_empty() {
        let n = db.len();
        dy.chunks_exact(n).for_each(|r| db.iter_mut().zip(r).for_each(|(a, &b)| *a += b));
    }
}

/// The core's inputs that come from the mixer input x [T, d] (all but v): the conv (acts.xc,
/// empty without one), θq [T, n_heads·P] and θk [T, n_states·P] with their biases, the gate κ
/// [T, n_states] and the features φq, φk. Shared by the plain mixer and the windowed one
/// (`vmf_window`), which differ in where v comes from and what reads the core.
pub fn features_forward<F: Float>(sh: &VmfShape, w: &VmfParams<F>, x: &[F], acts: &mut VmfActs<F>) {
    let (d, p, nh, ns) = (sh.d_model, sh.nphase, sh.n_heads, sh.n_states);
    let t = x.len() / d;
    acts.xc.clear();
    if sh.conv_kernel > 0 {
        acts.xc.resize(t * d, F::ZERO);
        conv_forward(x, &w.conv, d, sh.conv_kernel, &mut acts.xc);
    }
    let xc: &[F] = if sh.conv_kernel > 0 { &acts.xc } else { x };
    let resize = |v: &mut Vec<F>, n: usize| {
        v.clear();
        v.resize(n, F::ZERO);
    };
    resize(&mut acts.thq, t * nh * p);
    linear_forward(xc, &w.thq, &mut acts.thq, t, d, nh * p);
    add_bias(&mut acts.thq, &w.thq_b);
    resize(&mut acts.thk, t * ns * p);
    linear_forward(xc, &w.thk, &mut acts.thk, t, d, ns * p);
    add_bias(&mut acts.thk, &w.thk_b);
    resize(&mut acts.kappa, t * ns);
    if sh.k_gate {
        linear_forward(xc, &w.kg_w, &mut acts.kappa, t, d, ns);
        add_bias(&mut acts.kappa, &w.kg_b);
        acts.kappa.iter_mut().for_each(|z| *z = F::ONE / (F::ONE + (-*z).exp()));
    } else {
        acts.kappa.fill(F::ONE);
    }
    resize(&mut acts.phq, 2 * t * nh * p); // [T, n_heads, F]
    phase_forward(&acts.thq, &w.mass, nh / ns, p, &mut acts.phq);
    resize(&mut acts.phk, 2 * t * ns * p); // [T, n_states, F]
    phase_forward(&acts.thk, &w.mass, 1, p, &mut acts.phk);
}

/// Backward of [`features_forward`] from ∂φq, ∂φk, ∂κ; `dxc` carries what the caller already
/// has for the conv's output (the plain mixer's v projection reads it too). dx +=, grads +=.
#[allow(clippy::too_many_arguments)]
pub fn features_backward<F: Float>(
    sh: &VmfShape,
    w: &VmfParams<F>,
    x: &[F],
    acts: &VmfActs<F>,
    dphq: &[F],
    dphk: &[F],
    dkap: &[F],
    mut dxc: Vec<F>,
    dx: Option<&mut [F]>,
    grads: &mut VmfParams<F>,
) {
    let (d, p, nh, ns) = (sh.d_model, sh.nphase, sh.n_heads, sh.n_states);
    let t = x.len() / d;
    // Phases (and the mass).
    let (mut dthq, mut dthk) = (vec![F::ZERO; acts.thq.len()], vec![F::ZERO; acts.thk.len()]);
    let mut dm = vec![F::ZERO; ns];
    phase_backward(&acts.thq, &w.mass, nh / ns, p, dphq, &mut dthq, &mut dm);
    phase_backward(&acts.thk, &w.mass, 1, p, dphk, &mut dthk, &mut dm);
    if !grads.mass.is_empty() {
        grads.mass.iter_mut().zip(&dm).for_each(|(a, &b)| *a += b);
    }
    // The gate: κ = σ(z)  =>  dz = dκ·κ(1−κ).
    let xc: &[F] = if sh.conv_kernel > 0 { &acts.xc } else { x };
    if sh.k_gate {
        let dz: Vec<F> = dkap.iter().zip(&acts.kappa).map(|(&g, &k)| g * k * (F::ONE - k)).collect();
        linear_backward(&dz, xc, &w.kg_w, Some(&mut dxc), opt(&mut grads.kg_w), t, d, ns);
        bias_grad(&dz, &mut grads.kg_b);
    }
    // Projections.
    linear_backward(&dthq, xc, &w.thq, Some(&mut dxc), opt(&mut grads.thq), t, d, nh * p);
    bias_grad(&dthq, &mut grads.thq_b);
    linear_backward(&dthk, xc, &w.thk, Some(&mut dxc), opt(&mut grads.thk), t, d, ns * p);
    bias_grad(&dthk, &mut grads.thk_b);
    // The conv.
    if sh.conv_kernel > 0 {
        conv_backward(&dxc, x, &w.conv, d, sh.conv_kernel, dx, opt(&mut grads.conv));
    } else if let Some(dx) = dx {
        dx.iter_mut().zip(&dxc).for_each(|(a, &b)| *a += b);
    }
}

/// The mixer: x [T, d] (the layer's normed input) -> y [T, d] (written), and its activations.
pub fn vmf_mixer_forward<F: Float>(sh: &VmfShape, w: &VmfParams<F>, x: &[F], y: &mut [F], acts: &mut VmfActs<F>) {
    let (d, nh, ns, dv) = (sh.d_model, sh.n_heads, sh.n_states, sh.dv);
    let t = x.len() / d;
    let resize = |v: &mut Vec<F>, n: usize| {
        v.clear();
        v.resize(n, F::ZERO);
    };
    features_forward(sh, w, x, acts);
    let xc: &[F] = if sh.conv_kernel > 0 { &acts.xc } else { x };
    resize(&mut acts.v, t * ns * dv);
    linear_forward(xc, &w.v, &mut acts.v, t, d, ns * dv);
    resize(&mut acts.o, t * nh * dv);
    core_forward(&sh.core(), &acts.phq, &acts.phk, &acts.kappa, &acts.v, &w.a_log, &mut acts.o, &mut acts.ck);
    if w.o_norm.is_empty() {
        acts.on.clear();
        acts.inv_rms.clear();
        linear_forward(&acts.o, &w.out, y, t, nh * dv, d);
    } else {
        resize(&mut acts.on, t * nh * dv);
        resize(&mut acts.inv_rms, t * nh);
        out_norm_forward(&acts.o, &w.o_norm, dv, &mut acts.on, &mut acts.inv_rms);
        linear_forward(&acts.on, &w.out, y, t, nh * dv, d);
    }
    add_bias(y, &w.out_b);
}

/// The output norm (a named option of the operator, off by default): each query head's core
/// output o_h [dv] becomes g_h ⊙ o_h / rms(o_h), rms = sqrt(mean(o_h²) + ε) with
/// ε = [`OUT_NORM_EPS`]. Without a normaliser the core's output is a decayed *sum*: its scale
/// grows with the number of tokens written (a long-memory component's output at position 1000
/// is larger than anything a 512-token window showed), where softmax's output is an average.
/// `o` [T·n_heads·dv] -> `on` (same layout), `inv_rms` [T·n_heads].
pub fn out_norm_forward<F: Float>(o: &[F], gain: &[F], dv: usize, on: &mut [F], inv_rms: &mut [F]) {
    let nh = gain.len() / dv;
    let inv_n = F::ONE / F::from_f64(dv as f64);
    for (i, ((oh, y), r)) in o.chunks_exact(dv).zip(on.chunks_exact_mut(dv)).zip(inv_rms.iter_mut()).enumerate() {
        let g = &gain[(i % nh) * dv..(i % nh + 1) * dv];
        let ms = oh.iter().fold(F::ZERO, |a, &x| a + x * x) * inv_n;
        *r = F::ONE / (ms + F::from_f64(OUT_NORM_EPS)).sqrt();
        y.iter_mut().zip(oh).zip(g).for_each(|((y, &x), &g)| *y = g * (x * *r));
    }
}

/// ε of the output norm's rms (the engine's, by definition of the operator).
pub use cortiq_kernels::vmf::OUT_NORM_EPS;

/// Backward of [`out_norm_forward`]: d_o = (g⊙d_on)·r − o·r³·mean(g⊙d_on⊙o) (written), d_gain +=
/// Σ d_on⊙o·r (when given).
pub fn out_norm_backward<F: Float>(
    o: &[F],
    gain: &[F],
    inv_rms: &[F],
    dv: usize,
    d_on: &[F],
    d_o: &mut [F],
    mut d_gain: Option<&mut [F]>,
) {
    let nh = gain.len() / dv;
    let inv_n = F::ONE / F::from_f64(dv as f64);
    for (i, ((oh, dy), dx)) in o.chunks_exact(dv).zip(d_on.chunks_exact(dv)).zip(d_o.chunks_exact_mut(dv)).enumerate() {
        let h = i % nh;
        let g = &gain[h * dv..(h + 1) * dv];
        let r = inv_rms[i];
        // fwd: y = g·x·r, r = (mean(x²) + ε)^(−1/2)  =>  dr/dx_j = −r³·x_j/n
        let dot = oh.iter().zip(dy).zip(g).fold(F::ZERO, |a, ((&x, &dy), &g)| a + g * dy * x);
        let c = dot * r * r * r * inv_n;
        for (((dx, &x), &dy), &g) in dx.iter_mut().zip(oh).zip(dy).zip(g) {
            *dx = g * dy * r - x * c;
        }
        if let Some(dg) = d_gain.as_deref_mut() {
            dg[h * dv..(h + 1) * dv].iter_mut().zip(oh).zip(dy).for_each(|((a, &x), &dy)| *a += dy * x * r);
        }
    }
}

/// Backward of the mixer: dx += (when given), grads += for every parameter (`grads` has the
/// layout of `w`; a tensor left empty there is not trained and gets nothing).
pub fn vmf_mixer_backward<F: Float>(
    sh: &VmfShape,
    w: &VmfParams<F>,
    x: &[F],
    acts: &VmfActs<F>,
    dy: &[F],
    dx: Option<&mut [F]>,
    grads: &mut VmfParams<F>,
) {
    let (d, nh, ns, dv) = (sh.d_model, sh.n_heads, sh.n_states, sh.dv);
    let t = x.len() / d;
    // fwd: y = o·outᵀ + b
    bias_grad(dy, &mut grads.out_b);
    let mut d_o = vec![F::ZERO; t * nh * dv];
    if w.o_norm.is_empty() {
        linear_backward(dy, &acts.o, &w.out, Some(&mut d_o), opt(&mut grads.out), t, nh * dv, d);
    } else {
        let mut d_on = vec![F::ZERO; t * nh * dv];
        linear_backward(dy, &acts.on, &w.out, Some(&mut d_on), opt(&mut grads.out), t, nh * dv, d);
        out_norm_backward(&acts.o, &w.o_norm, &acts.inv_rms, dv, &d_on, &mut d_o, opt(&mut grads.o_norm));
    }
    // The core.
    let (mut dphq, mut dphk) = (vec![F::ZERO; acts.phq.len()], vec![F::ZERO; acts.phk.len()]);
    let (mut dkap, mut dvv) = (vec![F::ZERO; acts.kappa.len()], vec![F::ZERO; acts.v.len()]);
    let mut da = vec![F::ZERO; w.a_log.len()];
    let cg = CoreGrads { dphq: &mut dphq, dphk: &mut dphk, dkappa: &mut dkap, dv: &mut dvv, da_log: &mut da };
    core_backward(&sh.core(), &acts.phq, &acts.phk, &acts.kappa, &acts.v, &w.a_log, &acts.ck, &d_o, cg);
    if !grads.a_log.is_empty() {
        grads.a_log.iter_mut().zip(&da).for_each(|(a, &b)| *a += b);
    }
    // fwd: v = xc·W_vᵀ (the rest of the core's inputs are features_forward's)
    let xc: &[F] = if sh.conv_kernel > 0 { &acts.xc } else { x };
    let mut dxc = vec![F::ZERO; t * d];
    linear_backward(&dvv, xc, &w.v, Some(&mut dxc), opt(&mut grads.v), t, d, ns * dv);
    features_backward(sh, w, x, acts, &dphq, &dphk, &dkap, dxc, dx, grads);
}

/// One window of stage 1 (attention transfer) for one converted layer: the teacher's normed
/// input x [T, d] at that layer and its attention block's output y [T, d] (after o_proj), both
/// from the original model (teacher-forced).
#[derive(Debug, Clone)]
pub struct TransferSeq<F> {
    pub x: Vec<F>,
    pub y: Vec<F>,
}

impl<F: Float> TransferSeq<F> {
    /// (Σ|ŷ − y|², Σ|y|²) of the output ŷ against this window's target, and dŷ of Σ|ŷ − y|².
    pub fn residual(&self, y_hat: &[F]) -> (f64, f64, Vec<F>) {
        let (mut e, mut n) = (0f64, 0f64);
        let mut dy = vec![F::ZERO; y_hat.len()];
        for ((d, &a), &b) in dy.iter_mut().zip(y_hat).zip(&self.y) {
            let r = a - b;
            e += r.to_f64() * r.to_f64();
            n += b.to_f64() * b.to_f64();
            *d = r + r; // fwd: e = Σ r²  =>  dŷ = 2r
        }
        (e, n, dy)
    }
}

/// A layer's parameters as stage 1 trains them (the optimizer's view).
pub trait LayerParams<F>: Clone {
    fn zeros_like(&self) -> Self;
    /// Every tensor by name (an empty one is not trained).
    fn tensors(&mut self) -> Vec<(&'static str, &mut Vec<F>)>;
}

impl<F: Float> LayerParams<F> for VmfParams<F> {
    fn zeros_like(&self) -> Self {
        VmfParams::zeros_like(self)
    }
    fn tensors(&mut self) -> Vec<(&'static str, &mut Vec<F>)> {
        self.tensors_mut().into_iter().collect()
    }
}

/// A mixer stage 1 fits to a teacher's attention output (`transfer_layer`).
pub trait TransferMixer<F: Float> {
    type Params: LayerParams<F>;
    /// (Σ|ŷ − y|², Σ|y|²) of the mixer on window `s`; with `grads`, the gradient of Σ|ŷ − y|²
    /// added into them.
    fn loss(&self, s: &TransferSeq<F>, p: &Self::Params, grads: Option<&mut Self::Params>) -> (f64, f64);
    /// The mixer's output ŷ [T, d] on window `s`.
    fn output(&self, s: &TransferSeq<F>, p: &Self::Params) -> Vec<F>;
    /// Whether tensor `name` starts as the teacher's own (trained at lr × `copied_mult`).
    fn copied(&self, name: &str) -> bool;
}

/// The plain vmf_phase mixer: its v and out are the teacher's v_proj and o_proj.
impl<F: Float> TransferMixer<F> for VmfShape {
    type Params = VmfParams<F>;
    fn loss(&self, s: &TransferSeq<F>, p: &VmfParams<F>, grads: Option<&mut VmfParams<F>>) -> (f64, f64) {
        let mut y = vec![F::ZERO; s.y.len()];
        let mut acts = VmfActs::default();
        vmf_mixer_forward(self, p, &s.x, &mut y, &mut acts);
        let (e, n, dy) = s.residual(&y);
        if let Some(g) = grads {
            vmf_mixer_backward(self, p, &s.x, &acts, &dy, None, g);
        }
        (e, n)
    }
    fn output(&self, s: &TransferSeq<F>, p: &VmfParams<F>) -> Vec<F> {
        let mut y = vec![F::ZERO; s.y.len()];
        vmf_mixer_forward(self, p, &s.x, &mut y, &mut VmfActs::default());
        y
    }
    fn copied(&self, name: &str) -> bool {
        name == "v" || name == "out"
    }
}

/// What `transfer_layer` reports per step: the training batch's relative error
/// (Σ|ŷ − y|² / Σ|y|²), and the held-out one where it was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransferStep {
    pub step: usize,
    pub rel: f64,
    pub held: Option<f64>,
}

/// Relative error Σ|ŷ − y|² / Σ|y|² over windows.
pub fn transfer_error<F: Float, M: TransferMixer<F>>(m: &M, p: &M::Params, data: &[TransferSeq<F>]) -> f64 {
    let (e, n) = data.iter().map(|s| m.loss(s, p, None)).fold((0.0, 0.0), |a, x| (a.0 + x.0, a.1 + x.1));
    e / n.max(1e-300)
}

/// Stage 1 for one layer: AdamW on the relative error (the teacher output's energy as the
/// normaliser: late, high-variance layers do not dominate), `batch` windows per step taken in
/// order and cycling, `steps` steps at `lr` (warmup steps/20, cosine to lr/20). The copied
/// teacher projections (`TransferMixer::copied`) take lr × `copied_mult` (they start right; the
/// new parameters do not). With `held` (windows never trained on, a period) the held-out error is
/// measured every period and at the end, and the parameters where it was lowest are returned.
#[allow(clippy::too_many_arguments)]
pub fn transfer_layer<F: Float, M: TransferMixer<F>>(
    m: &M,
    data: &[TransferSeq<F>],
    init: M::Params,
    steps: usize,
    batch: usize,
    lr: f64,
    copied_mult: f64,
    held: Option<(&[TransferSeq<F>], usize)>,
    mut report: impl FnMut(TransferStep),
) -> M::Params {
    assert!(!data.is_empty(), "transfer_layer: no training windows");
    let batch = batch.clamp(1, data.len());
    let opt = crate::optim::AdamW { lr, beta1: 0.9, beta2: 0.999, eps: 1e-12, weight_decay: 0.0 };
    let mut p = init;
    let mut st: Vec<crate::optim::AdamState<F>> =
        p.clone().tensors().iter().map(|(_, t)| crate::optim::AdamState::new(t.len())).collect();
    let mut best: Option<(f64, M::Params)> = None;
    let warm = (steps / 20).max(1) as u64;
    for step in 0..=steps {
        let measure = held.is_some_and(|(_, period)| step == steps || step % period.max(1) == 0);
        let mut held_err = None;
        if measure && let Some((h, _)) = held {
            let e = transfer_error(m, &p, h);
            held_err = Some(e);
            if best.as_ref().is_none_or(|b| e < b.0 || b.0.is_nan()) {
                best = Some((e, p.clone()));
            }
        }
        if step == steps {
            if let Some(e) = held_err {
                report(TransferStep { step, rel: f64::NAN, held: Some(e) });
            }
            break;
        }
        let mut g = p.zeros_like();
        let (mut e, mut n) = (0.0, 0.0);
        for i in 0..batch {
            let (a, b) = m.loss(&data[(step * batch + i) % data.len()], &p, Some(&mut g));
            e += a;
            n += b;
        }
        report(TransferStep { step, rel: e / n.max(1e-300), held: held_err });
        let lr_t = crate::optim::lr_schedule(step as u64, lr, lr / 20.0, warm, steps as u64);
        for (i, ((name, t), gt)) in p.tensors().into_iter().zip(g.tensors()).enumerate() {
            if t.is_empty() {
                continue;
            }
            let k = if m.copied(name) { copied_mult } else { 1.0 };
            opt.step(step as u64 + 1, lr_t * k, t, gt.1, 1.0 / n.max(1e-300), &mut st[i]);
        }
    }
    best.map_or(p, |b| b.1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::Rng;

    /// Stage 1 on a teacher that is itself a vmf_phase mixer: from a perturbed start the fit
    /// takes most of the held-out error away.
    #[test]
    fn transfer_recovers_a_vmf_teacher() {
        let sh =
            VmfShape { d_model: 8, n_heads: 4, n_states: 2, nphase: 4, dv: 3, conv_kernel: 3, k_gate: true, phase_bias: true };
        let (d, p, nh, ns, dv) = (8, 4, 4, 2, 3);
        let mut rng = Rng(31);
        let teacher = VmfParams {
            thq: rng.vec(nh * p * d, 0.5),
            thq_b: rng.vec(nh * p, 0.3),
            thk: rng.vec(ns * p * d, 0.5),
            thk_b: rng.vec(ns * p, 0.3),
            v: rng.vec(ns * dv * d, 0.5),
            out: rng.vec(d * nh * dv, 0.3),
            out_b: rng.vec(d, 0.2),
            a_log: (0..ns * 2 * p).map(|_| -2.0 + 2.0 * rng.uniform()).collect(),
            conv: (0..d * 3).map(|i| if i % 3 == 2 { 1.0 } else { 0.0 }).collect(),
            kg_w: vec![0.0; ns * d],
            kg_b: vec![0.0; ns],
            mass: vec![0.0; ns],
            o_norm: Vec::new(),
        };
        let mut seqs: Vec<TransferSeq<f64>> = (0..6)
            .map(|_| {
                let x = rng.vec(24 * d, 1.0);
                let mut y = vec![0.0; 24 * d];
                vmf_mixer_forward(&sh, &teacher, &x, &mut y, &mut VmfActs::default());
                TransferSeq { x, y }
            })
            .collect();
        let held = seqs.split_off(4);
        let mut start = teacher.clone();
        start.thq.iter_mut().chain(start.thk.iter_mut()).for_each(|w| *w += 0.1 * rng.normal());
        start.a_log.iter_mut().for_each(|a| *a += 0.5);
        let e0 = transfer_error(&sh, &start, &held);
        let fit = transfer_layer(&sh, &seqs, start, 300, 4, 2e-2, 0.1, Some((&held, 50)), |_| {});
        let e1 = transfer_error(&sh, &fit, &held);
        println!("transfer: held-out relative error {e0:.4} -> {e1:.4}");
        assert!(e1 < 0.2 * e0, "held-out {e0} -> {e1}");
    }
}
