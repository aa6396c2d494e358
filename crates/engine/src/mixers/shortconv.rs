//! LFM2's gated short convolution: (B, C, x) = in_proj·h, y = out_proj(C ⊙ conv(B ⊙ x)), the
//! depthwise causal convolution carrying the last `kernel − 1` gated inputs (B ⊙ x) per channel
//! as its whole per-sequence state (constant size).

use cortiq_kernels::conv::causal_conv1d_par;

use crate::error::Result;
use crate::mixers::{Env, Journal, KvType, LayerState, Mixer, MixerState, Seq, StateBytes};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;
use crate::weights::TensorSource;

pub struct ShortConvWeights {
    /// [3·d_model, d_model]: B | C | x.
    pub in_proj: QTensor,
    /// [3·d_model] or empty (conv_bias).
    pub in_bias: Vec<f32>,
    /// [d_model, kernel], depthwise taps.
    pub conv: Vec<f32>,
    /// [d_model] or empty.
    pub conv_bias: Vec<f32>,
    /// [d_model, d_model]
    pub out_proj: QTensor,
    /// [d_model] or empty.
    pub out_bias: Vec<f32>,
}

/// The convolution's state: [kernel − 1, d_model], oldest first.
#[derive(Clone, Debug, PartialEq)]
pub struct ShortConvState {
    pub conv: Vec<f32>,
}

impl ShortConvState {
    pub fn new(d_model: usize, kernel: usize) -> ShortConvState {
        ShortConvState { conv: vec![0.0; (kernel - 1) * d_model] }
    }
}

impl MixerState for ShortConvState {
    fn is_recurrent(&self) -> bool {
        true
    }
    fn clear(&mut self) {
        self.conv.fill(0.0);
    }
    fn save(&self, out: &mut Vec<u8>) -> std::result::Result<(), String> {
        crate::codec::put_f32s(out, &self.conv);
        Ok(())
    }
    fn load(&mut self, r: &mut &[u8], _len: usize) -> std::result::Result<(), String> {
        self.conv = crate::codec::get_f32s(r, self.conv.len(), "short conv state")?;
        Ok(())
    }
    fn bytes(&self) -> StateBytes {
        StateBytes { recurrent: self.conv.len() * 4, ..StateBytes::default() }
    }
}

/// A short-convolution layer: its width, taps and weights.
pub struct ShortConv {
    pub d_model: usize,
    pub kernel: usize,
    pub w: ShortConvWeights,
}

impl ShortConv {
    /// Layer `il` by GGUF names (`bias`: the in/conv/out biases exist).
    pub fn load(src: &dyn TensorSource, d: usize, il: usize, kernel: usize, bias: bool) -> Result<ShortConv> {
        let n = |s: &str| format!("blk.{il}.{s}");
        let opt_vec = |s: &str, len: usize| -> Result<Vec<f32>> { if bias { src.vector(&n(s), len) } else { Ok(Vec::new()) } };
        let w = ShortConvWeights {
            in_proj: src.require(&n("shortconv.in_proj.weight"), 3 * d, d)?,
            in_bias: opt_vec("shortconv.in_proj.bias", 3 * d)?,
            conv: src.require(&n("shortconv.conv.weight"), d, kernel)?.to_f32(),
            conv_bias: opt_vec("shortconv.conv.bias", d)?,
            out_proj: src.require(&n("shortconv.out_proj.weight"), d, d)?,
            out_bias: opt_vec("shortconv.out_proj.bias", d)?,
        };
        Ok(ShortConv { d_model: d, kernel, w })
    }
}

impl Mixer for ShortConv {
    fn name(&self) -> &'static str {
        "a short convolution"
    }
    fn matrices(&self) -> Vec<&QTensor> {
        vec![&self.w.in_proj, &self.w.out_proj]
    }
    fn matrices_mut(&mut self) -> Vec<&mut QTensor> {
        vec![&mut self.w.in_proj, &mut self.w.out_proj]
    }
    fn new_state(&self, _kv: KvType) -> LayerState {
        LayerState::new(ShortConvState::new(self.d_model, self.kernel))
    }
    fn forward(&self, _env: &Env, h: &[f32], n: usize, seq: Seq<'_>, _trace: &mut dyn FnMut(&str, &[f32])) -> Result<Vec<f32>> {
        Ok(short_conv(&self.w, self.d_model, self.kernel, h, n, seq.state.of()))
    }
    /// Both projections over all rows at once (each row on the decode path,
    /// `QTensor::matvec_rows`); the conv ring per sequence.
    fn forward_rows(&self, _env: &Env, h: &[f32], rows: Vec<Seq<'_>>) -> Result<Vec<f32>> {
        let owner: Vec<usize> = (0..rows.len()).collect();
        let mut states: Vec<&mut ShortConvState> = rows.into_iter().map(|seq| seq.state.of()).collect();
        Ok(run(&self.w, self.d_model, self.kernel, h, &mut states, Some(&owner)))
    }
    /// Decode rows and verifies together (a step with no prompt chunk): both projections over
    /// every row at once, the conv ring stepped row by row (a verify's positions in order on
    /// its own ring), journaled as `forward_steps` journals them (the ring before, the input
    /// rows).
    fn forward_rows_verifies(
        &self,
        _env: &Env,
        h: &[f32],
        segs: Vec<(Seq<'_>, usize)>,
        verifies: Vec<Option<&mut Journal>>,
    ) -> Result<Vec<f32>> {
        let d = self.d_model;
        let (mut owner, mut states, mut r0) = (Vec::new(), Vec::new(), 0);
        for (i, ((seq, n), journal)) in segs.into_iter().zip(verifies).enumerate() {
            if let Some(j) = journal {
                j.begin(seq.state, n);
                j.record = Some(Box::new(h[r0 * d..(r0 + n) * d].to_vec()));
            }
            owner.extend(std::iter::repeat_n(i, n));
            states.push(seq.state.of::<ShortConvState>());
            r0 += n;
        }
        Ok(run(&self.w, d, self.kernel, h, &mut states, Some(&owner)))
    }
}

/// The mixer over `n` new tokens. h: [n, d_model] normed input -> [n, d_model].
pub fn short_conv(w: &ShortConvWeights, d: usize, kernel: usize, h: &[f32], n: usize, state: &mut ShortConvState) -> Vec<f32> {
    debug_assert_eq!(h.len(), n * d);
    run(w, d, kernel, h, &mut [state], None)
}

/// `owner` Some: h holds decode rows, row i the next position of `states[owner[i]]` (the decode
/// batch; a verify's positions are consecutive rows of one owner, in order); None: h holds
/// consecutive positions of the one sequence `states[0]`. Everything but the projections and
/// the conv is elementwise per row, so a batch row computes exactly its n = 1 step.
fn run(
    w: &ShortConvWeights,
    d: usize,
    kernel: usize,
    h: &[f32],
    states: &mut [&mut ShortConvState],
    owner: Option<&[usize]>,
) -> Vec<f32> {
    let n = h.len() / d;
    let rows = owner.is_some();
    let mut bcx = w.in_proj.project(h, n, rows); // [n, 3·d_model]
    if !w.in_bias.is_empty() {
        for row in bcx.chunks_mut(3 * d) {
            row.iter_mut().zip(&w.in_bias).for_each(|(v, b)| *v += b);
        }
    }
    let mixer_span = profile::span(Op::Mixer);
    let mut bx = vec![0f32; n * d]; // [n, d_model]: B ⊙ x
    for (o, row) in bx.chunks_mut(d).zip(bcx.chunks(3 * d)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = row[j] * row[2 * d + j];
        }
    }
    let mut conv = vec![0f32; n * d]; // [n, d_model]
    if let Some(owner) = owner {
        for (i, &o) in owner.iter().enumerate() {
            let r = i * d..(i + 1) * d;
            causal_conv1d_par(
                pool(),
                &bx[r.clone()],
                1,
                d,
                &w.conv,
                kernel,
                &w.conv_bias,
                &mut states[o].conv,
                false,
                &mut conv[r],
            );
        }
    } else {
        causal_conv1d_par(pool(), &bx, n, d, &w.conv, kernel, &w.conv_bias, &mut states[0].conv, false, &mut conv);
    }
    for (o, row) in conv.chunks_mut(d).zip(bcx.chunks(3 * d)) {
        o.iter_mut().zip(&row[d..2 * d]).for_each(|(v, c)| *v *= c);
    }
    drop(mixer_span);
    let mut y = w.out_proj.project(&conv, n, rows); // [n, d_model]
    if !w.out_bias.is_empty() {
        for row in y.chunks_mut(d) {
            row.iter_mut().zip(&w.out_bias).for_each(|(v, b)| *v += b);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill == pieces == token-by-token steps, and the first token against a hand
    /// computation (zero state: only the last tap sees it).
    #[test]
    fn prefill_pieces_and_steps_agree() {
        let mut s = 0x1F2E_3D4C_5B6A_7988u64;
        let mut f = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let (d, k, n) = (24, 3, 40);
        let mut v = |len: usize| (0..len).map(|_| f()).collect::<Vec<f32>>();
        let w = ShortConvWeights {
            in_proj: QTensor::from_f32("in", 3 * d, d, v(3 * d * d)),
            in_bias: v(3 * d),
            conv: v(d * k),
            conv_bias: v(d),
            out_proj: QTensor::from_f32("out", d, d, v(d * d)),
            out_bias: v(d),
        };
        let h = v(n * d);
        let mut s_one = ShortConvState::new(d, k);
        let y_one = short_conv(&w, d, k, &h, n, &mut s_one);
        // token 0 by hand
        let (mut bcx, mut y0) = (vec![0f32; 3 * d], vec![0f32; d]);
        w.in_proj.matmul(&h[..d], 1, &mut bcx);
        bcx.iter_mut().zip(&w.in_bias).for_each(|(a, b)| *a += b);
        let inner: Vec<f32> =
            (0..d).map(|j| (w.conv[j * k + k - 1] * bcx[j] * bcx[2 * d + j] + w.conv_bias[j]) * bcx[d + j]).collect();
        w.out_proj.matmul(&inner, 1, &mut y0);
        let y0: Vec<f32> = y0.iter().zip(&w.out_bias).map(|(a, b)| a + b).collect();
        // NaN-propagating measures (cortiq-testkit): a NaN output fails the bound.
        let (e0, _) = cortiq_testkit::max_abs_diff(&y0, &y_one[..d]);
        let mut s_steps = ShortConvState::new(d, k);
        let mut y_steps = Vec::new();
        for t in 0..n {
            y_steps.extend(short_conv(&w, d, k, &h[t * d..(t + 1) * d], 1, &mut s_steps));
        }
        let (e, _) = cortiq_testkit::max_abs_diff(&y_one, &y_steps);
        let (es, _) = cortiq_testkit::max_abs_diff(&s_one.conv, &s_steps.conv);
        println!("shortconv: token 0 by hand {e0:.2e}; steps vs prefill {e:.2e} (state {es:.2e})");
        assert!(e0 <= 1e-5 && e <= 1e-5 && es <= 1e-5, "shortconv: token 0 by hand {e0:e}, steps vs prefill {e:e}, state {es:e}");
    }
}
