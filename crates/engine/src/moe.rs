//! Mixture-of-experts FFN (issue 4): a router picks top-k experts per token, each a gated FFN;
//! only the experts some token was routed to are computed, on exactly those tokens; an
//! optional shared expert runs on every token, optionally scaled by σ(shared_gate·x).
//!
//! Routing variants: softmax over all experts then top-k, renormalized when `norm_topk_prob`
//! (Qwen3-Next, Qwen3.5-MoE); sigmoid scores with a selection-only correction bias
//! (Kimi / DeepSeek style, the bias never weighs an output); `routed_scaling_factor` on the
//! routed sum.

use crate::blocks::{FfnWeights, ffn, ffn_rows};
use crate::config::ModelConfig;
pub use crate::geometry::{ExpertAct, MoeConfig, Scoring};
use crate::numerics::Numerics;
use crate::par::pool;
use crate::qtensor::QTensor;

pub struct MoeWeights {
    /// [n_experts, d_model]
    pub router: QTensor,
    /// [n_experts], added to the scores for selection only (sigmoid routing).
    pub select_bias: Option<Vec<f32>>,
    /// [n_experts], added to the router logits (gpt-oss).
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<FfnWeights>,
    /// Per expert, the biases of its gate, up and down projections (gpt-oss).
    pub expert_biases: Option<Vec<ExpertBias>>,
    pub shared: Option<FfnWeights>,
    /// [1, d_model]: σ(·) scales the shared expert's output per token.
    pub shared_gate: Option<QTensor>,
}

/// One expert's projection biases: gate, up [d_ff], down [d_model].
pub struct ExpertBias {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
}

impl MoeWeights {
    pub fn matrices(&self) -> Vec<&QTensor> {
        let mut v = vec![&self.router];
        for e in self.experts.iter().chain(&self.shared) {
            v.extend([&e.gate, &e.up, &e.down]);
        }
        v.extend(&self.shared_gate);
        v
    }

    /// The router, shared expert and its gate; then the routed experts' matrices (apart:
    /// `Model::set_numerics` leaves the experts memory-mapped); of each FFN what a forward
    /// reads (`FfnWeights::read`).
    pub fn matrices_mut_split(&mut self) -> (Vec<&mut QTensor>, Vec<&mut QTensor>) {
        let mut rest = vec![&mut self.router];
        if let Some(e) = &mut self.shared {
            rest.extend(e.read_mut());
        }
        rest.extend(&mut self.shared_gate);
        let experts = self.experts.iter_mut().flat_map(|e| e.read_mut()).collect();
        (rest, experts)
    }
}

/// The top-k (expert, weight) pairs of one token's router logits.
pub fn route(mc: &MoeConfig, logits: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let scores: Vec<f32> = match mc.scoring {
        Scoring::Softmax => {
            let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = logits.iter().map(|&l| (l - m).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        }
        Scoring::Sigmoid => logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect(),
    };
    // Selection by score (+ bias); ties to the lower index, as torch.topk on CPU.
    let key = |e: usize| scores[e] + bias.map_or(0.0, |b| b[e]);
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    idx.truncate(mc.top_k);
    let mut picked: Vec<(usize, f32)> = idx.iter().map(|&e| (e, scores[e])).collect();
    if mc.norm_topk {
        let s: f32 = picked.iter().map(|p| p.1).sum::<f32>() + mc.topk_eps;
        if s > 0.0 {
            picked.iter_mut().for_each(|p| p.1 /= s);
        }
    }
    picked
}

/// The MoE FFN over `n` tokens. h: [n, d_model] -> [n, d_model].
pub fn moe(cfg: &ModelConfig, mc: &MoeConfig, w: &MoeWeights, h: &[f32], n: usize, num: Numerics) -> Vec<f32> {
    moe_in(cfg, mc, w, h, n, num, false)
}

/// The MoE FFN over `k` independent decode rows (a serving step's decode rows and verify
/// positions): each row routed on its own, every expert any row chose multiplied once over the
/// rows that chose it (one read of each selected expert per step, not one per row), the shared
/// expert over all rows at once; row for row bit-identical to `moe(.., n = 1, ..)` (row-wise
/// products, experts added in the same order).
pub fn moe_rows(cfg: &ModelConfig, mc: &MoeConfig, w: &MoeWeights, h: &[f32], k: usize, num: Numerics) -> Vec<f32> {
    moe_in(cfg, mc, w, h, k, num, true)
}

/// `moe` (`rows` false: n positions of one sequence) or `moe_rows` (`rows` true).
fn moe_in(cfg: &ModelConfig, mc: &MoeConfig, w: &MoeWeights, h: &[f32], n: usize, num: Numerics, rows_apart: bool) -> Vec<f32> {
    let d = cfg.d_model;
    let ne = mc.n_experts;
    let mut logits = w.router.project(h, n, rows_apart); // [n, n_experts]
    if let Some(b) = &w.router_bias {
        crate::mixers::add_bias(&mut logits, b);
    }
    if n == 1 {
        let mut picks = route(mc, &logits, w.select_bias.as_deref());
        picks.sort_by_key(|p| p.0);
        return moe_one(cfg, mc, w, h, &picks, num);
    }
    // Each position's picks (positions over the pool: a prompt chunk's routing on one thread
    // left the other idle), then per expert the tokens routed to it and their weights.
    let mut picks: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n]; // [n][top_k]: (expert, weight)
    pool().for_rows_mut(&mut picks, 1, 16, |t0, ps| {
        for (i, p) in ps.iter_mut().enumerate() {
            let t = t0 + i;
            *p = route(mc, &logits[t * ne..(t + 1) * ne], w.select_bias.as_deref());
        }
    });
    let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ne];
    for (t, p) in picks.into_iter().enumerate() {
        for (e, wt) in p {
            by_expert[e].push((t, wt));
        }
    }
    // The experts some position picked, the busiest first (claimed in that order by the pool's
    // threads, each expert's products whole on one thread: nested pool calls run inline).
    let mut active: Vec<usize> = (0..ne).filter(|&e| !by_expert[e].is_empty()).collect();
    active.sort_by_key(|&e| std::cmp::Reverse(by_expert[e].len()));
    let outs: Vec<std::sync::Mutex<Vec<f32>>> = active.iter().map(|_| std::sync::Mutex::new(Vec::new())).collect();
    {
        let _s = crate::profile::span(crate::profile::Op::Experts);
        pool().for_ranges_dynamic(active.len(), 1, |a, b| {
            crate::profile::muted(|| {
                for i in a..b {
                    let out = expert_rows(cfg, mc, w, h, active[i], &by_expert[active[i]], n, num, rows_apart);
                    *outs[i].lock().unwrap_or_else(|p| p.into_inner()) = out;
                }
            })
        });
    }
    let mut out_of: Vec<Option<Vec<f32>>> = vec![None; ne];
    for (&e, o) in active.iter().zip(outs) {
        out_of[e] = Some(o.into_inner().unwrap_or_else(|p| p.into_inner()));
    }
    // Each position's experts added in index order (the order the serial loop added them in),
    // positions split over the pool.
    let mut picks_of: Vec<Vec<(usize, usize, f32)>> = vec![Vec::new(); n]; // per position: (expert, its row, weight)
    for (e, toks) in by_expert.iter().enumerate() {
        for (i, &(t, wt)) in toks.iter().enumerate() {
            picks_of[t].push((e, i, wt));
        }
    }
    let mut y = vec![0f32; n * d]; // [n, d_model]
    pool().for_rows_mut(&mut y, d, 16, |t0, ys| {
        for (j, yt) in ys.chunks_exact_mut(d).enumerate() {
            for &(e, i, wt) in &picks_of[t0 + j] {
                let s = wt * mc.routed_scale;
                let out = out_of[e].as_ref().expect("every picked expert ran");
                yt.iter_mut().zip(&out[i * d..(i + 1) * d]).for_each(|(a, b)| *a += s * b);
            }
        }
    });
    if let Some(sh) = &w.shared {
        let out = if rows_apart { ffn_rows(cfg, sh, h, n, num) } else { ffn(cfg, sh, h, n, num) }; // [n, d_model]
        let mut gate = vec![1f32; n]; // [n]
        if let Some(g) = &w.shared_gate {
            gate = g.project(h, n, rows_apart);
            gate.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp()));
        }
        for t in 0..n {
            y[t * d..(t + 1) * d].iter_mut().zip(&out[t * d..(t + 1) * d]).for_each(|(a, b)| *a += gate[t] * b);
        }
    }
    y
}

/// Expert `e` over the positions routed to it (`toks`: position, weight) of `moe_in`'s n.
/// -> [rows, d_model], its first `toks.len()` rows theirs.
#[allow(clippy::too_many_arguments)]
fn expert_rows(
    cfg: &ModelConfig,
    mc: &MoeConfig,
    w: &MoeWeights,
    h: &[f32],
    e: usize,
    toks: &[(usize, f32)],
    n: usize,
    num: Numerics,
    rows_apart: bool,
) -> Vec<f32> {
    let d = cfg.d_model;
    // In a call of several positions every expert takes the multi-row product, also when one
    // token picked it (its row duplicated, the copy's result dropped): one position's value
    // then does not depend on how many others share its expert, so a prompt's state is the
    // same however its prefill is split (the prompt-state cache relies on it, `prefix`).
    let m = toks.len();
    let rows = if n > 1 && !rows_apart { m.max(2) } else { m };
    let mut x = vec![0f32; rows * d]; // [rows, d_model]: the routed tokens' inputs
    for (i, &(t, _)) in toks.iter().enumerate() {
        x[i * d..(i + 1) * d].copy_from_slice(&h[t * d..(t + 1) * d]);
    }
    if rows > m {
        x.copy_within(0..d, d);
    }
    match (mc.act, &w.expert_biases) {
        (ExpertAct::ClampedSwiGlu { alpha, limit }, Some(b)) => {
            clamped_swiglu(cfg, &w.experts[e], &b[e], &x, rows, alpha, limit, rows_apart)
        }
        _ if rows_apart => ffn_rows(cfg, &w.experts[e], &x, rows, num),
        _ => ffn(cfg, &w.experts[e], &x, rows, num),
    }
}

/// One position (a decode step; `picks`: its experts in index order with their weights): every
/// picked expert's gate and up, the shared expert's and its gate in one pool dispatch on the
/// one quantized input, the activations, then every down projection in a second dispatch —
/// two weight streams per layer where one `ffn` per expert took two dispatches each (sixteen
/// for top-8). The values are the ones of the per-expert path: a row's product does not depend
/// on the dispatch it falls in, and the outputs are added in the same order (experts by index,
/// then the shared expert).
fn moe_one(cfg: &ModelConfig, mc: &MoeConfig, w: &MoeWeights, h: &[f32], picks: &[(usize, f32)], num: Numerics) -> Vec<f32> {
    let d = cfg.d_model;
    let ffns: Vec<&FfnWeights> = picks.iter().map(|&(e, _)| &w.experts[e]).chain(&w.shared).collect();
    let mut first: Vec<&QTensor> =
        ffns.iter().flat_map(|f| if f.gate_is_up { vec![&f.up] } else { vec![&f.gate, &f.up] }).collect();
    first.extend(&w.shared_gate);
    let mut gu = vec![0f32; first.iter().map(|t| t.rows).sum()]; // [gate | up] (or [up]) per FFN, then the shared gate
    QTensor::matmul_many(&first, h, 1, &mut gu);
    // act(gate) * up into each FFN's gate half (an ungated FFN's only half), where its down
    // projection reads it.
    let mut acts: Vec<&[f32]> = Vec::with_capacity(ffns.len());
    let mut rest = &mut gu[..];
    for (i, f) in ffns.iter().enumerate() {
        let ff = f.up.rows;
        if f.gate_is_up {
            let (u, tail) = std::mem::take(&mut rest).split_at_mut(ff);
            rest = tail;
            let mut g = u.to_vec();
            let _s = crate::profile::span(crate::profile::Op::Activation);
            crate::blocks::gated_span(cfg, num, &mut g, u);
            u.copy_from_slice(&g);
            acts.push(u);
            continue;
        }
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(2 * ff);
        rest = tail;
        let (g, u) = mine.split_at_mut(ff);
        match (mc.act, &w.expert_biases) {
            (ExpertAct::ClampedSwiGlu { alpha, limit }, Some(b)) if i < picks.len() => {
                clamped_act(g, u, &b[picks[i].0], alpha, limit)
            }
            _ => {
                let _s = crate::profile::span(crate::profile::Op::Activation);
                crate::blocks::gated_span(cfg, num, g, u)
            }
        }
        acts.push(g);
    }
    let shared_gate = rest.first().map(|&v| 1.0 / (1.0 + (-v).exp()));
    let downs: Vec<&QTensor> = ffns.iter().map(|f| &f.down).collect();
    let mut outs = vec![0f32; ffns.len() * d]; // [ffns, d_model]
    QTensor::matvec_each(&downs, &acts, &mut outs);
    let mut y = vec![0f32; d]; // [d_model]
    for (i, out) in outs.chunks_exact_mut(d).enumerate() {
        if i < picks.len() {
            if let (ExpertAct::ClampedSwiGlu { .. }, Some(b)) = (mc.act, &w.expert_biases) {
                crate::mixers::add_bias(out, &b[picks[i].0].down);
            }
            let s = picks[i].1 * mc.routed_scale;
            y.iter_mut().zip(&*out).for_each(|(a, b)| *a += s * b);
        } else {
            let g = shared_gate.unwrap_or(1.0);
            y.iter_mut().zip(&*out).for_each(|(a, b)| *a += g * b);
        }
    }
    y
}

/// gpt-oss's expert activation on one row, biases first: g ← min(g + b_g, limit),
/// u ← clamp(u + b_u, −limit, limit), g ← (u + 1)·g·σ(alpha·g). g, u: [d_ff]
fn clamped_act(g: &mut [f32], u: &mut [f32], b: &ExpertBias, alpha: f32, limit: f32) {
    crate::mixers::add_bias(g, &b.gate);
    crate::mixers::add_bias(u, &b.up);
    for (gv, &uv) in g.iter_mut().zip(&*u) {
        let gc = gv.min(limit);
        let uc = uv.clamp(-limit, limit);
        *gv = (uc + 1.0) * (gc / (1.0 + (-alpha * gc).exp()));
    }
}

/// gpt-oss's expert over `n` rows x [n, d_model]: g = gate·x + b_g, u = up·x + b_u,
/// g ← min(g, limit), u ← clamp(u, −limit, limit), h = (u + 1)·g·σ(alpha·g), out = down·h + b_d.
/// `rows_apart`: the rows are independent decode rows (row-wise products).
#[allow(clippy::too_many_arguments)]
fn clamped_swiglu(
    cfg: &ModelConfig,
    w: &FfnWeights,
    b: &ExpertBias,
    x: &[f32],
    n: usize,
    alpha: f32,
    limit: f32,
    rows_apart: bool,
) -> Vec<f32> {
    let (mut g, mut u) = (w.gate.project(x, n, rows_apart), w.up.project(x, n, rows_apart)); // [n, d_ff] each
    let ff = w.gate.rows;
    for (gr, ur) in g.chunks_exact_mut(ff).zip(u.chunks_exact_mut(ff)) {
        clamped_act(gr, ur, b, alpha, limit);
    }
    debug_assert_eq!(w.down.rows, cfg.d_model);
    let mut y = w.down.project(&g, n, rows_apart); // [n, d_model]
    crate::mixers::add_bias(&mut y, &b.down);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_picks_and_weighs() {
        let mc = MoeConfig {
            n_experts: 4,
            top_k: 2,
            scoring: Scoring::Softmax,
            norm_topk: true,
            topk_eps: 0.0,
            routed_scale: 1.0,
            d_ff_expert: 8,
            d_ff_shared: None,
            shared_gate: false,
            act: ExpertAct::Gated,
            ungated: false,
        };
        let r = route(&mc, &[0.1, 2.0, -1.0, 1.0], None);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        let (a, b) = ((2.0f32).exp(), (1.0f32).exp());
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6 && (r[1].1 - b / (a + b)).abs() < 1e-6, "{r:?}");
        // A selection bias changes which experts, not their weights.
        let mc = MoeConfig { scoring: Scoring::Sigmoid, norm_topk: false, ..mc };
        let r = route(&mc, &[0.1, 2.0, -1.0, 1.0], Some(&[0.0, 0.0, 5.0, 0.0]));
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [2, 1]);
        assert!((r[0].1 - 1.0 / (1.0 + 1.0f32.exp())).abs() < 1e-6, "{r:?}");
    }
}
