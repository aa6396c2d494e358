//! Shared blocks of the dense transformer outside the mixers: norms over rows and the gated FFN.
//! Architecture files compose these; none of them matches on a dtype (QTensor does).

use cortiq_kernels::act::{GatedAct, gated_act_fast};
use cortiq_kernels::ops::{gated_act, rmsnorm, rmsnorm_inplace};

use crate::compat::{Numerics, geglu_ggml, rmsnorm_ggml, rmsnorm_ggml_segments, swiglu_ggml};
use crate::config::{Activation, ModelConfig};
use crate::par::pool;
use crate::profile::{self, Op};
use crate::qtensor::QTensor;

/// Rows per norm work item: a decode step's single row runs inline, a prefill chunk's rows are
/// split over the pool.
const NORM_GRAIN: usize = 16;

/// RMSNorm every row of x: [n, d] -> out [n, d].
pub fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    rmsnorm_rows_in(Numerics::Exact, x, w, eps, out);
}

/// In-place RMSNorm of every `w.len()`-sized segment (per-head norms and post-norms).
pub fn rmsnorm_segments(x: &mut [f32], w: &[f32], eps: f32) {
    rmsnorm_segments_in(Numerics::Exact, x, w, eps);
}

/// `rmsnorm_rows` in the given numerics. x: [n, d] -> out [n, d]
pub fn rmsnorm_rows_in(num: Numerics, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let _s = profile::span(Op::Norm);
    let d = w.len();
    pool().for_rows_mut(out, d, NORM_GRAIN, |r0, o| {
        for (i, orow) in o.chunks_mut(d).enumerate() {
            let xi = &x[(r0 + i) * d..(r0 + i + 1) * d];
            match num {
                Numerics::Exact | Numerics::Fast => rmsnorm(xi, w, eps, orow),
                Numerics::LlamaCpp => rmsnorm_ggml(xi, w, eps, orow),
            }
        }
    });
}

/// `rmsnorm_segments` in the given numerics.
pub fn rmsnorm_segments_in(num: Numerics, x: &mut [f32], w: &[f32], eps: f32) {
    let _s = profile::span(Op::Norm);
    pool().for_rows_mut(x, w.len(), NORM_GRAIN, |_, segs| {
        for seg in segs.chunks_mut(w.len()) {
            match num {
                Numerics::Exact | Numerics::Fast => rmsnorm_inplace(seg, w, eps),
                Numerics::LlamaCpp => rmsnorm_ggml_segments(seg, w, eps),
            }
        }
    });
}

pub struct FfnWeights {
    pub gate: QTensor,
    pub up: QTensor,
    pub down: QTensor,
    /// The gate is the up projection itself (a view of its rows: Nemotron-H's ungated relu²
    /// FFN, relu(u)·u): the products compute up once and the gate's half is its copy.
    pub gate_is_up: bool,
}

impl FfnWeights {
    /// The matrices a forward reads: gate (unless it is up), up, down.
    pub fn read(&self) -> Vec<&QTensor> {
        if self.gate_is_up { vec![&self.up, &self.down] } else { vec![&self.gate, &self.up, &self.down] }
    }

    /// `read`, mutable (what `Model::set_numerics` lays out: an ungated FFN's gate view is
    /// never read, so it gets no copy of its own).
    pub fn read_mut(&mut self) -> Vec<&mut QTensor> {
        if self.gate_is_up { vec![&mut self.up, &mut self.down] } else { vec![&mut self.gate, &mut self.up, &mut self.down] }
    }
}

/// Gated FFN: down(act(gate·h) ⊙ up·h). h: [n, d_model] -> [n, d_model].
pub fn ffn(cfg: &ModelConfig, w: &FfnWeights, h: &[f32], n: usize, num: Numerics) -> Vec<f32> {
    if n == 1 || w.read().iter().all(|m| m.rowwise(n)) {
        // Decode, or a chunk every matrix multiplies with its decode kernel: gate and up
        // share one input quantization and one dispatch (`ffn_rows` is exactly that path, and
        // its rows' values are the chunk's).
        return ffn_rows(cfg, w, h, n, num);
    }
    let ff = w.gate.rows; // the layer's width (an expert's or a shared expert's in MoE layers)
    let mut u = vec![0f32; n * ff]; // [n, d_ff]
    w.up.matmul(h, n, &mut u);
    let mut g = if w.gate_is_up {
        u.clone()
    } else {
        let mut g = vec![0f32; n * ff]; // [n, d_ff]
        w.gate.matmul(h, n, &mut g);
        g
    };
    gated_rows(cfg, num, &mut g, &u, ff);
    let mut y = vec![0f32; n * cfg.d_model]; // [n, d_model]
    w.down.matmul(&g, n, &mut y);
    y
}

/// g = act(g) * u row by row (each row on its own, whatever n is). g, u: [n, d_ff]
fn gated_rows(cfg: &ModelConfig, num: Numerics, g: &mut [f32], u: &[f32], ff: usize) {
    let _s = profile::span(Op::Activation);
    pool().for_rows_mut(g, ff, NORM_GRAIN, |r0, gs| {
        for (i, gi) in gs.chunks_mut(ff).enumerate() {
            gated_span(cfg, num, gi, &u[(r0 + i) * ff..(r0 + i + 1) * ff]);
        }
    });
}

/// One row of `gated_rows`: g = act(g) * u. g, u: [d_ff]
pub(crate) fn gated_span(cfg: &ModelConfig, num: Numerics, g: &mut [f32], u: &[f32]) {
    match (num, cfg.act) {
        (Numerics::Exact, _) => gated_act(g, u, cfg.act.f()),
        // relu(g)·u, g = u: relu(u)² with the one product ggml's sqr(relu(u)) takes.
        (_, Activation::Relu2) => g.iter_mut().zip(u).for_each(|(gv, &uv)| *gv = gv.max(0.0) * uv),
        (Numerics::Fast, Activation::Silu) => gated_act_fast(GatedAct::Silu, g, u),
        (Numerics::Fast, Activation::GeluTanh) => gated_act_fast(GatedAct::GeluTanh, g, u),
        (Numerics::LlamaCpp, Activation::Silu) => swiglu_ggml(g, u),
        (Numerics::LlamaCpp, Activation::GeluTanh) => geglu_ggml(g, u),
    }
}

/// `ffn` over n independent decode rows (one per sequence of a decode batch, or a prompt
/// chunk whose matrices all multiply with their decode kernel: `ffn`): every row gives exactly
/// what `ffn(.., row, 1, ..)` gives alone — the decode path — with each matrix read once for
/// all rows where `QTensor::matvec_rows` can. h: [n, d_model] -> [n, d_model]
pub fn ffn_rows(cfg: &ModelConfig, w: &FfnWeights, h: &[f32], n: usize, num: Numerics) -> Vec<f32> {
    let ff = w.gate.rows;
    // [n, gate | up] in this thread's scratch: the product overwrites every value, so the
    // buffer is neither freed nor zeroed between layers (a fresh one was a 150 KB memset per
    // layer at 4 rows, ~1% of a decode step).
    let mut scratch = FFN_SCRATCH.take();
    if scratch.len() < n * 2 * ff {
        scratch.resize(n * 2 * ff, 0.0);
    }
    let gu = &mut scratch[..n * 2 * ff];
    if w.gate_is_up {
        // up alone, then each row's values into both halves
        let mut u = vec![0f32; n * ff]; // [n, d_ff]
        QTensor::matvec_rows_many(&[&w.up], h, n, &mut u);
        for (row, ur) in gu.chunks_exact_mut(2 * ff).zip(u.chunks_exact(ff)) {
            row[..ff].copy_from_slice(ur);
            row[ff..].copy_from_slice(ur);
        }
    } else {
        QTensor::matvec_rows_many(&[&w.gate, &w.up], h, n, gu);
    }
    // act(gate) * up in place over each fused row's gate half, split as `gated_rows` splits
    // rows; the down projection then reads those halves where they are.
    {
        let _s = profile::span(Op::Activation);
        // One row per work item: a decode batch's few rows are each a whole FFN width.
        pool().for_rows_mut(gu, 2 * ff, 1, |_, rows| {
            for r in rows.chunks_mut(2 * ff) {
                let (g, u) = r.split_at_mut(ff);
                gated_span(cfg, num, g, u);
            }
        });
    }
    let mut y = vec![0f32; n * cfg.d_model]; // [n, d_model]
    w.down.matvec_rows_strided(gu, 2 * ff, n, &mut y);
    FFN_SCRATCH.set(scratch);
    y
}

thread_local! {
    /// `ffn_rows`' fused [n, gate | up] rows, kept between calls.
    static FFN_SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}
