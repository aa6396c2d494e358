//! RoPE recipes: the frequency scaling a model was trained with and one table's rotated dims and
//! inverse frequencies (`Rope::tables`). A leaf of the engine (no model, no dtype): the config,
//! the shared blocks and llama.cpp's table twin (`compat::rope_tables_ggml`) all read it, so it
//! sits below them (and below QTensor) and no import cycle runs through it.

use cortiq_kernels::ops::RopeStyle;
use std::rc::Rc;

/// RoPE frequency scaling as the model was trained with.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: f64,
    },
    /// YaRN: frequencies blended between interpolated (÷ factor) and extrapolated over a ramp
    /// of dims set by `beta_fast` / `beta_slow` rotations in `original_max_position` (its ends
    /// rounded outwards when `truncate`, as llama.cpp always does), and cos/sin × `attn_factor`.
    Yarn {
        factor: f64,
        original_max_position: f64,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        attn_factor: f64,
    },
}

impl RopeScaling {
    /// YaRN's attention factor transformers derives when the config gives none:
    /// 0.1·ln(factor) + 1 (or the ratio of two such with `mscale` / `mscale_all_dim`).
    pub fn yarn_attn_factor(factor: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>) -> f64 {
        let get = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
        match (mscale, mscale_all_dim) {
            (Some(m), Some(a)) if m != 0.0 && a != 0.0 => get(factor, m) / get(factor, a),
            _ => get(factor, 1.0),
        }
    }
}

/// One RoPE table's recipe: rotated dims and per-pair inverse frequencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Rotated dimensions (≤ head_dim, even).
    pub rot_dim: usize,
    /// rot_dim/2 inverse frequencies, f64 so long positions keep their precision.
    pub inv_freq: Vec<f64>,
    /// The frequency base and scaling `inv_freq` was built from (llama.cpp numerics recompute
    /// the angles from them the way ggml does).
    pub base: f64,
    pub scaling: RopeScaling,
    /// cos and sin are multiplied by this (YaRN's attention factor; 1 otherwise).
    pub attn_factor: f64,
    /// Llama 4's query temperature (Ministral 3): `(β, original context)`, the queries scaled
    /// after RoPE by `query_scale(pos)`; None leaves them as they are.
    pub q_temperature: Option<(f64, usize)>,
}

impl Rope {
    /// HF's default / linear / llama3 inverse frequencies (modeling_rope_utils).
    pub fn new(style: RopeStyle, rot_dim: usize, theta: f64, scaling: &RopeScaling) -> Rope {
        let half = rot_dim / 2;
        let mut inv: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf((2 * i) as f64 / rot_dim as f64)).collect();
        match *scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let low_wavelen = original_max_position / low_freq_factor;
                let high_wavelen = original_max_position / high_freq_factor;
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f64::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow, truncate, .. } => {
                // transformers' _compute_yarn_parameters: the correction dims of beta_fast and
                // beta_slow rotations, a linear ramp between them over the pair index.
                let dim = rot_dim as f64;
                let corr =
                    |rot: f64| dim * (original_max_position / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
                let (mut lo, mut hi) = (corr(beta_fast), corr(beta_slow));
                if truncate {
                    (lo, hi) = (lo.floor(), hi.ceil());
                }
                let (lo, mut hi) = (lo.max(0.0), hi.min(dim - 1.0));
                if lo == hi {
                    hi += 0.001;
                }
                for (i, f) in inv.iter_mut().enumerate() {
                    let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                    let extrapolate = 1.0 - ramp;
                    *f = (*f / factor) * (1.0 - extrapolate) + *f * extrapolate;
                }
            }
        }
        let attn_factor = match *scaling {
            RopeScaling::Yarn { attn_factor, .. } => attn_factor,
            _ => 1.0,
        };
        Rope { style, rot_dim, inv_freq: inv, base: theta, scaling: scaling.clone(), attn_factor, q_temperature: None }
    }

    /// The query temperature at `pos`: 1 + β·ln(1 + ⌊pos / orig⌋) (transformers'
    /// get_llama_4_attn_scale and llama.cpp's attn_temp input with offset 0 agree), 1 below
    /// the original context, so only long prompts see it; in f64, rounded once to f32.
    pub fn query_scale(&self, pos: usize) -> Option<f32> {
        self.q_temperature.map(|(beta, orig)| (1.0 + beta * ((pos / orig.max(1)) as f64 + 1.0).ln()) as f32)
    }

    /// cos and sin for `n` consecutive positions from `pos0`: each [n, rot_dim/2]. Shared:
    /// every layer of one forward asks for the same positions, so the last few tables (per
    /// thread, matched on the positions and the frequencies themselves) are handed out again
    /// instead of recomputed: a decode step's one position for every layer, a prefill chunk's
    /// hundreds (Gemma 3's local and global layers keep one each).
    pub fn tables(&self, pos0: usize, n: usize) -> Rc<(Vec<f32>, Vec<f32>)> {
        if n * self.inv_freq.len() > KEEP_MAX_VALUES {
            return Rc::new(self.compute(pos0, n));
        }
        KEPT.with_borrow_mut(|cache| {
            if let Some(e) = cache
                .iter()
                .find(|e| e.pos0 == pos0 && e.n == n && e.inv_freq == self.inv_freq && e.attn_factor == self.attn_factor)
            {
                return e.tab.clone();
            }
            let tab = Rc::new(self.compute(pos0, n));
            // Decode keeps many one-position tables (a batch of sequences), prefill a few long.
            let (same, kept) = if n == 1 { (true, ONE_POS_KEPT) } else { (false, MANY_POS_KEPT) };
            if cache.iter().filter(|e| (e.n == 1) == same).count() >= kept {
                let old = cache.iter().position(|e| (e.n == 1) == same).expect("counted above");
                cache.remove(old);
            }
            cache.push(Kept { inv_freq: self.inv_freq.clone(), attn_factor: self.attn_factor, pos0, n, tab: tab.clone() });
            tab
        })
    }

    fn compute(&self, pos0: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in pos0..pos0 + n {
            for &f in &self.inv_freq {
                let a = p as f64 * f;
                cos.push((a.cos() * self.attn_factor) as f32);
                sin.push((a.sin() * self.attn_factor) as f32);
            }
        }
        (cos, sin)
    }
}

/// A kept table, as `Rope::tables(pos0, n)` gave it.
struct Kept {
    inv_freq: Vec<f64>,
    attn_factor: f64,
    pos0: usize,
    n: usize,
    tab: Rc<(Vec<f32>, Vec<f32>)>,
}

/// One-position tables kept: a decode batch of 16 sequences over two RoPE configurations
/// (Gemma 3's local and global layers).
const ONE_POS_KEPT: usize = 32;
/// Multi-position tables kept (a prefill chunk over two configurations, with room), and the
/// largest kept (values per table: 512 positions of 256 rotated dims is 65536).
const MANY_POS_KEPT: usize = 4;
const KEEP_MAX_VALUES: usize = 1 << 18;

thread_local! {
    static KEPT: std::cell::RefCell<Vec<Kept>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept tables are the computed ones, per configuration: two RoPEs that differ only in
    /// base, asked alternately for the same positions (hits after the first round) and for
    /// more positions than are kept (evictions), always give their own table, for one position
    /// and for several.
    #[test]
    fn kept_tables_are_the_computed_ones_per_configuration() {
        let a = Rope::new(RopeStyle::NeoX, 64, 10_000.0, &RopeScaling::None);
        let b = Rope::new(RopeStyle::NeoX, 64, 1_000_000.0, &RopeScaling::None);
        for round in 0..3 {
            for p in (0..2 * ONE_POS_KEPT).chain([5, 5, 7]) {
                for r in [&a, &b] {
                    assert_eq!(*r.tables(p, 1), r.compute(p, 1), "round {round}, position {p}");
                    let n = 2 + p % (MANY_POS_KEPT + 3);
                    assert_eq!(*r.tables(p, n), r.compute(p, n), "round {round}, positions {p}..+{n}");
                }
            }
        }
        assert_ne!(a.tables(9, 1), b.tables(9, 1));
        assert_ne!(a.tables(9, 3), b.tables(9, 3));
        // Several positions at once are row for row the one-position tables.
        let t = a.tables(3, 4);
        for i in 0..4 {
            let t1 = a.tables(3 + i, 1);
            assert_eq!((&t.0[i * 32..(i + 1) * 32], &t.1[i * 32..(i + 1) * 32]), (&t1.0[..], &t1.1[..]));
        }
    }
}
