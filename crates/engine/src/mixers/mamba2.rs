//! Mamba2, the state-space mixer of IBM Granite 4.0 H, Nemotron-H and Falcon-H1, as one block:
//! in_proj → (z | x B C | dt); the causal short convolution with SiLU over x B C; per head the
//! selective scan dt = clamp(softplus(dt + dt_bias)), S ← exp(dt·A)·S + dt·x ⊗ B,
//! y = S·C + D·x (B and C shared by the heads of a group, as transformers'
//! `repeat_interleave`); the gated RMSNorm y·silu(z) normalized per group of channels; out_proj.
//!
//! Written here (the product's core, STYLE principle 9): the scan is the recurrence itself
//! (`cortiq_kernels::ssm::scan_head`, an AVX2 kernel with its scalar twin), head by head over
//! the pool, each head's [head_dim, d_state] state staying in cache while it walks the
//! positions. A prompt and n single steps run the same code, so prefill equals the
//! recurrence bit for bit and a prefill's values do not depend on where it was cut
//! (`cut_grid` 1). The state is constant-size: the last `conv_kernel − 1` convolution inputs
//! and the SSM state, whatever the context length.

use cortiq_kernels::act::silu_fast;
use cortiq_kernels::conv::causal_conv1d_par;
use cortiq_kernels::ssm::{ScanInputs, scan_head};

use crate::error::{EngineError, Result};
pub use crate::geometry::{Mamba2Config, MambaNorm};
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes, rows_or_verifies};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

pub struct Mamba2Weights {
    /// [in_dim, d_model]: z | x B C | dt.
    pub in_proj: QTensor,
    /// [conv_dim, conv_kernel], depthwise taps.
    pub conv: Vec<f32>,
    /// [conv_dim] or empty.
    pub conv_bias: Vec<f32>,
    /// [n_heads]
    pub dt_bias: Vec<f32>,
    /// [n_heads]: A = −exp(A_log) (GGUF's ssm_a; HF's A_log is turned into it at load).
    pub a: Vec<f32>,
    /// [n_heads]: the skip D·x.
    pub d: Vec<f32>,
    /// [d_inner], the gated RMSNorm's gain.
    pub norm: Vec<f32>,
    /// [d_model, d_inner]
    pub out_proj: QTensor,
}

/// One sequence's Mamba2 state: the last `conv_kernel − 1` inputs of the convolution and every
/// head's SSM state. Constant size, whatever the context length.
#[derive(Clone, Debug, PartialEq)]
pub struct Mamba2State {
    /// [conv_kernel − 1, conv_dim], oldest first.
    pub conv: Vec<f32>,
    /// [n_heads, head_dim, d_state]
    pub ssm: Vec<f32>,
}

impl Mamba2State {
    pub fn new(cfg: &Mamba2Config) -> Mamba2State {
        Mamba2State {
            conv: vec![0.0; (cfg.conv_kernel - 1) * cfg.conv_dim()],
            ssm: vec![0.0; cfg.n_heads * cfg.head_dim * cfg.d_state],
        }
    }
}

impl MixerState for Mamba2State {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::codec::put_f32s(out, &self.conv);
        crate::codec::put_f32s(out, &self.ssm);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], _len: usize) -> std::result::Result<(), String> {
        self.conv = crate::codec::get_f32s(r, self.conv.len(), "Mamba2 conv state")?;
        self.ssm = crate::codec::get_f32s(r, self.ssm.len(), "Mamba2 SSM state")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { recurrent: (self.conv.len() + self.ssm.len()) * 4, ..StateBytes::default() }
    }
}

/// A Mamba2 layer: its geometry and weights.
pub struct Mamba2 {
    pub cfg: Mamba2Config,
    pub w: Mamba2Weights,
}

impl Mamba2 {
    /// Layer `il` by GGUF names (llama.cpp's mamba2 layout: `ssm_in`, `ssm_conv1d`, `ssm_dt`,
    /// `ssm_a`, `ssm_d`, `ssm_norm`, `ssm_out`).
    pub fn load(src: &dyn TensorSource, g: Mamba2Config, il: usize) -> Result<Mamba2> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let norm = match g.norm {
            MambaNorm::GateOnly => Vec::new(),
            _ => flat(src, &n("ssm_norm.weight"), g.d_inner())?,
        };
        let conv_bias = match g.conv_bias {
            true => flat(src, &n("ssm_conv1d.bias"), g.conv_dim())?,
            false => Vec::new(),
        };
        let w = Mamba2Weights {
            in_proj: src.require(&n("ssm_in.weight"), g.in_dim(), g.d_model)?,
            conv: src.require(&n("ssm_conv1d.weight"), g.conv_dim(), g.conv_kernel)?.to_f32(),
            conv_bias,
            dt_bias: flat(src, &n("ssm_dt.bias"), g.n_heads)?,
            a: flat(src, &n("ssm_a"), g.n_heads)?,
            d: flat(src, &n("ssm_d"), g.n_heads)?,
            norm,
            out_proj: src.require(&n("ssm_out.weight"), g.d_model, g.d_inner())?,
        };
        Ok(Mamba2 { cfg: g, w })
    }
}

/// A tensor of `len` values whatever its stored shape (llama.cpp stores A and D as [n_heads, 1]
/// and the norm as [n_groups, d_inner / n_groups]; HF as vectors).
fn flat(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = src.get(name)?.ok_or_else(|| EngineError::MissingTensor { file: src.file(), tensor: name.to_string() })?;
    if t.rows * t.cols != len {
        return Err(EngineError::ShapeMismatch {
            file: src.file(),
            tensor: name.to_string(),
            expected: vec![len],
            found: vec![t.rows, t.cols],
        });
    }
    Ok(t.to_f32())
}

impl Mixer for Mamba2 {
    fn name(&self) -> &'static str {
        "a Mamba2 layer"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        vec![&self.w.in_proj, &self.w.out_proj]
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        vec![&mut self.w.in_proj, &mut self.w.out_proj]
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(Mamba2State::new(&self.cfg))
    }
    fn forward(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        Ok(mamba2(&self.cfg, &self.w, h, n, seq.state.of()))
    }
    /// The projections over all rows at once (each row on the decode path,
    /// `QTensor::matvec_rows`); the convolution and the scan per sequence.
    fn forward_rows(&self, _env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let (cfg, kb) = (&self.cfg, rows.len());
        let p = self.w.in_proj.project(h, kb, true); // [kb, in_dim]
        let di = cfg.in_dim();
        let mut o = Vec::with_capacity(kb * cfg.d_inner()); // [kb, d_inner]
        for (i, seq) in rows.into_iter().enumerate() {
            o.extend(core(cfg, &self.w, &p[i * di..(i + 1) * di], 1, seq.state.of()));
        }
        Ok(self.w.out_proj.project(&o, kb, true)) // [kb, d_model]
    }
    /// Decode rows and verifies together: the projections over every row at once, then per
    /// sequence its row, or its verified positions one at a time journaled with their
    /// projected rows (what a rewind steps again).
    fn forward_rows_verifies(
        &self,
        _env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        verifies: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let total: usize = segs.iter().map(|(_, n)| n).sum();
        let p = self.w.in_proj.project(h, total, true); // [total, in_dim]
        let di = cfg.in_dim();
        let o = rows_or_verifies(
            segs,
            verifies,
            |r0, n| p[r0 * di..(r0 + n) * di].to_vec(),
            |part: &Vec<f32>, n, verify, st| match verify {
                true => steps(cfg, &self.w, part, n, st.of()),
                false => core(cfg, &self.w, part, 1, st.of()),
            },
        ); // [total, d_inner]
        Ok(self.w.out_proj.project(&o, total, true)) // [total, d_model]
    }
    /// The projection over all n rows at once (each on the decode path), then the
    /// convolution and the scan one position at a time; journaled as the state's snapshot and
    /// the projected rows.
    fn forward_steps(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, journal: &mut Journal) -> Result<Vec<f32>> {
        let p = self.w.in_proj.project(h, n, true); // [n, in_dim]
        journal.begin(seq.state, n);
        let o = steps(&self.cfg, &self.w, &p, n, seq.state.of());
        journal.record = Some(Box::new(p));
        Ok(self.w.out_proj.project(&o, n, true)) // [n, d_model]
    }
    fn rewind(&self, _env: &Env, seq: Seq<'_>, journal: &mut Journal, keep: usize) -> Result<()> {
        assert!(journal.restore(seq.state), "a Mamba2 state is recurrent: forward_steps snapshotted it");
        let p: &Vec<f32> = journal.record();
        steps(&self.cfg, &self.w, p, keep, seq.state.of());
        Ok(())
    }
}

/// The first `n` projected rows of `p` [.., in_dim], each as its own decode step on `state`
/// -> [n, d_inner].
fn steps(cfg: &Mamba2Config, w: &Mamba2Weights, p: &[f32], n: usize, state: &mut Mamba2State) -> Vec<f32> {
    let di = cfg.in_dim();
    let mut o = Vec::with_capacity(n * cfg.d_inner()); // [n, d_inner]
    for i in 0..n {
        o.extend(core(cfg, w, &p[i * di..(i + 1) * di], 1, state));
    }
    o
}

/// The mixer over `n` new positions. h: [n, d_model] normed input -> [n, d_model]; `state` is
/// advanced by the n positions.
pub fn mamba2(cfg: &Mamba2Config, w: &Mamba2Weights, h: &[f32], n: usize, state: &mut Mamba2State) -> Vec<f32> {
    let p = w.in_proj.project(h, n, false); // [n, in_dim]
    let o = core(cfg, w, &p, n, state);
    w.out_proj.project(&o, n, false) // [n, d_model]
}

fn softplus(x: f32) -> f32 {
    // PyTorch's softplus (beta 1, threshold 20): x above the threshold, log1p(e^x) below.
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Convolution, scan and gated norm over `n` positions of one sequence: p [n, in_dim] (the
/// projected rows) -> [n, d_inner] (before out_proj); `state` is advanced by the n positions.
fn core(cfg: &Mamba2Config, w: &Mamba2Weights, p: &[f32], n: usize, state: &mut Mamba2State) -> Vec<f32> {
    let (di, cd, nh, hd, ds) = (cfg.d_inner(), cfg.conv_dim(), cfg.n_heads, cfg.head_dim, cfg.d_state);
    let in_dim = cfg.in_dim();
    // x B C of every row, contiguous for the convolution.
    let mut xbc = Vec::with_capacity(n * cd); // [n, conv_dim]
    for t in 0..n {
        xbc.extend_from_slice(&p[t * in_dim + di..t * in_dim + di + cd]);
    }
    let mut conv_out = vec![0f32; n * cd]; // [n, conv_dim]
    let conv_span = profile::span(Op::Conv);
    causal_conv1d_par(pool(), &xbc, n, cd, &w.conv, cfg.conv_kernel, &w.conv_bias, &mut state.conv, true, &mut conv_out);
    drop(conv_span);

    let scan_span = profile::span(Op::Mixer);
    let per_group = nh / cfg.n_groups;
    let (b0, c0) = (di, di + cfg.n_groups * ds);
    let mut per_head = vec![0f32; nh * n * hd]; // [n_heads, n, head_dim]
    let mut work: Vec<(&mut [f32], &mut [f32])> = per_head.chunks_mut(n * hd).zip(state.ssm.chunks_mut(hd * ds)).collect();
    let conv_out = &conv_out;
    pool().for_rows_mut_dynamic(&mut work, 1, 1, |h, items| {
        let (y, s) = &mut items[0];
        let g = h / per_group;
        let (a, bias) = (w.a[h], w.dt_bias[h]);
        let dt: Vec<f32> = (0..n).map(|t| softplus(p[t * in_dim + di + cd + h] + bias).clamp(cfg.dt_min, cfg.dt_max)).collect();
        let decay: Vec<f32> = dt.iter().map(|&d| (d * a).exp()).collect();
        let inp = ScanInputs {
            rows: conv_out,
            stride: cd,
            x_at: h * hd,
            b_at: b0 + g * ds,
            c_at: c0 + g * ds,
            d_state: ds,
            dt: &dt,
            decay: &decay,
            d: w.d[h],
        };
        scan_head(&inp, s, y);
    });
    drop(work);

    // The gate and the RMSNorm per group of channels (`MambaNorm`): (y · silu(z)) normalized
    // times the gain, y normalized times the gain then · silu(z), or y · silu(z) alone.
    let mut o = vec![0f32; n * di]; // [n, d_inner]
    let gs = di / cfg.norm_groups;
    let per_head = &per_head;
    let norm = |row: &mut [f32]| {
        for (grp, gw) in row.chunks_mut(gs).zip(w.norm.chunks(gs)) {
            let ms: f32 = grp.iter().map(|v| v * v).sum::<f32>() / gs as f32;
            let inv = 1.0 / (ms + cfg.norm_eps).sqrt();
            grp.iter_mut().zip(gw).for_each(|(v, g)| *v = *v * inv * g);
        }
    };
    pool().for_rows_mut(&mut o, di, 8, |t0, rows| {
        let mut y = vec![0f32; di]; // [d_inner]
        for (j, orow) in rows.chunks_mut(di).enumerate() {
            let t = t0 + j;
            for h in 0..nh {
                y[h * hd..(h + 1) * hd].copy_from_slice(&per_head[(h * n + t) * hd..(h * n + t + 1) * hd]);
            }
            orow.copy_from_slice(&p[t * in_dim..t * in_dim + di]); // z
            silu_fast(orow);
            if cfg.norm == MambaNorm::NormThenGate {
                norm(&mut y);
            }
            orow.iter_mut().zip(&y).for_each(|(z, yv)| *z *= yv);
            if cfg.norm == MambaNorm::GateThenNorm {
                norm(orow);
            }
        }
    });
    drop(scan_span);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    use cortiq_testkit::XorShift as Rng;

    fn setup(rng: &mut Rng) -> (Mamba2Config, Mamba2Weights) {
        let cfg = Mamba2Config {
            d_model: 48,
            n_heads: 6,
            head_dim: 8,
            n_groups: 2,
            d_state: 20,
            conv_kernel: 4,
            conv_bias: true,
            norm_eps: 1e-5,
            norm_groups: 2,
            norm: crate::geometry::MambaNorm::GateThenNorm,
            dt_min: 0.0,
            dt_max: f32::INFINITY,
        };
        let d = cfg.d_model;
        let t =
            |name: &str, rows: usize, cols: usize, rng: &mut Rng| QTensor::from_f32(name, rows, cols, rng.vec(rows * cols, 0.3));
        let w = Mamba2Weights {
            in_proj: t("in", cfg.in_dim(), d, rng),
            conv: rng.vec(cfg.conv_dim() * cfg.conv_kernel, 0.5),
            conv_bias: rng.vec(cfg.conv_dim(), 0.1),
            dt_bias: rng.vec(cfg.n_heads, 1.0),
            a: rng.vec(cfg.n_heads, 1.0).iter().map(|x| -x.exp()).collect(),
            d: rng.vec(cfg.n_heads, 1.0),
            norm: rng.vec(cfg.d_inner(), 1.0).iter().map(|x| 1.0 + 0.5 * x).collect(),
            out_proj: t("out", d, cfg.d_inner(), rng),
        };
        (cfg, w)
    }

    /// The scan is the recurrence itself: a prompt in one call, in pieces and position by
    /// position give the same outputs and states (up to the projections' summation order,
    /// a chunk's GEMM vs one row's dot products), and the recurrence matches an f64
    /// reference of the textbook formula.
    #[test]
    fn prefill_pieces_steps_and_f64_agree() {
        let mut rng = Rng(0x3A3B_A200_0000_0001);
        let (cfg, w) = setup(&mut rng);
        let (n, d) = (70, cfg.d_model);
        let h = rng.vec(n * d, 1.0);
        let mut s_one = Mamba2State::new(&cfg);
        let y_one = mamba2(&cfg, &w, &h, n, &mut s_one);
        let mut s_steps = Mamba2State::new(&cfg);
        let mut y_steps = Vec::new();
        for t in 0..n {
            y_steps.extend(mamba2(&cfg, &w, &h[t * d..(t + 1) * d], 1, &mut s_steps));
        }
        let mut s_pieces = Mamba2State::new(&cfg);
        let mut y_pieces = Vec::new();
        for (t0, t1) in [(0, 13), (13, 50), (50, 70)] {
            y_pieces.extend(mamba2(&cfg, &w, &h[t0 * d..t1 * d], t1 - t0, &mut s_pieces));
        }
        let rel = |a: &[f32], b: &[f32]| cortiq_testkit::max_abs_diff(a, b).0 / cortiq_testkit::max_abs(a).max(1e-6);
        let errs = [rel(&y_one, &y_steps), rel(&y_one, &y_pieces), rel(&s_one.ssm, &s_steps.ssm), rel(&s_one.ssm, &s_pieces.ssm)];
        println!("mamba2: steps {:.2e} pieces {:.2e} (state {:.2e} / {:.2e})", errs[0], errs[1], errs[2], errs[3]);
        assert!(errs.iter().all(|&e| e <= 1e-5), "{errs:?}");

        // f64 reference of the core (from the f32 projections, so only the core is compared).
        let p = w.in_proj.project(&h, n, false);
        let got = core(&cfg, &w, &p, n, &mut Mamba2State::new(&cfg));
        let want = reference_core(&cfg, &w, &p, n);
        let e = got.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        let m = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
        println!("mamba2 core vs f64: {:.2e} (max |y| {m:.2})", e / m);
        assert!(e / m < 2e-5, "core vs f64: {}", e / m);
    }

    /// The textbook Mamba2 over n positions in f64 (no state carried in).
    fn reference_core(cfg: &Mamba2Config, w: &Mamba2Weights, p: &[f32], n: usize) -> Vec<f64> {
        let (di, cd, nh, hd, ds, k) = (cfg.d_inner(), cfg.conv_dim(), cfg.n_heads, cfg.head_dim, cfg.d_state, cfg.conv_kernel);
        let ind = cfg.in_dim();
        let silu = |v: f64| v / (1.0 + (-v).exp());
        let mut xbc = vec![0f64; n * cd];
        for t in 0..n {
            for ch in 0..cd {
                let mut acc = w.conv_bias[ch] as f64;
                for i in 0..k {
                    let src = t as isize - (k as isize - 1) + i as isize;
                    if src >= 0 {
                        acc += w.conv[ch * k + i] as f64 * p[src as usize * ind + di + ch] as f64;
                    }
                }
                xbc[t * cd + ch] = silu(acc);
            }
        }
        let mut s = vec![0f64; nh * hd * ds];
        let mut y = vec![0f64; n * di];
        for t in 0..n {
            for h in 0..nh {
                let g = h / (nh / cfg.n_groups);
                let raw = (p[t * ind + di + cd + h] + w.dt_bias[h]) as f64;
                let dt = if raw > 20.0 { raw } else { raw.exp().ln_1p() };
                let decay = (dt * w.a[h] as f64).exp();
                for pi in 0..hd {
                    let x = xbc[t * cd + h * hd + pi];
                    let mut acc = 0.0;
                    for si in 0..ds {
                        let b = xbc[t * cd + di + g * ds + si];
                        let c = xbc[t * cd + di + cfg.n_groups * ds + g * ds + si];
                        let sv = &mut s[(h * hd + pi) * ds + si];
                        *sv = *sv * decay + dt * x * b;
                        acc += *sv * c;
                    }
                    y[t * di + h * hd + pi] = acc + w.d[h] as f64 * x;
                }
            }
        }
        let gs = di / cfg.norm_groups;
        for t in 0..n {
            let row = &mut y[t * di..(t + 1) * di];
            for (i, v) in row.iter_mut().enumerate() {
                *v *= silu(p[t * ind + i] as f64);
            }
            for (gi, grp) in row.chunks_mut(gs).enumerate() {
                let ms = grp.iter().map(|v| v * v).sum::<f64>() / gs as f64;
                let inv = 1.0 / (ms + cfg.norm_eps as f64).sqrt();
                for (i, v) in grp.iter_mut().enumerate() {
                    *v *= inv * w.norm[gi * gs + i] as f64;
                }
            }
        }
        y
    }
}
