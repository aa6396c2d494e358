//! O(1)-memory decode of one sequence (issue 5): the plan (prompt length tp; window, sinks and
//! landmarks; Nyström skeleton or StreamingLLM drop; or the teacher-forced matrix-form check),
//! the bookkeeping while the prompt streams (each planned layer's query segment sums), the seal
//! that turns a planned layer's KV cache into its [`O1Layer`], and the hook the attention block
//! takes. The per-head operator itself is `o1::nystrom`; callers reach all of this through
//! `Model::new_state_o1` and the sequence's ordinary forward / checkpoint / rollback.
//!
//! Planned layers are the global softmax-attention layers (gated attention included). A sliding
//! layer (Gemma 3) computes exactly what it did, but its cache is bounded too: at the seal it
//! becomes a StreamingLLM state with no sinks and its own window (keys j > t − W, exactly the
//! sliding window), so it stops keeping keys it can no longer see. GatedDeltaNet, KDA and
//! short-conv layers are already O(1); MLA (Kimi) keeps its exact cache.

mod basic;
pub mod evict;
pub mod farfield;
pub mod nystrom;

pub use self::basic::{AttnO1, O1Stats, Serve};
use self::evict::{RecentQueries, Slots};
use self::nystrom::{Far, Guard, NystromError, O1Layer, O1Settings, QuerySegments};

/// How a sequence serves its planned attention layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct O1Plan {
    /// Prompt length: positions < tp are exact attention; when the sequence reaches tp positions
    /// each planned layer seals and later positions take the streaming step.
    pub tp: usize,
    pub settings: O1Settings,
    /// Nyström skeleton, or StreamingLLM's sinks + window with the middle dropped.
    pub far: Far,
    /// `Some(guard)`: the checking path. Nothing is sealed; every planned layer keeps its cache
    /// and all its queries, and computes each chunk's output with `nystrom::matrix_form` (f64,
    /// all T×T weights) over every position so far with the same tp. Costs O(T²·(m + d)) per
    /// head and call: run a whole window in one forward call.
    pub check: Option<Guard>,
    /// Split the planned layers' windows by the model's calibrated curves ([`O1Split`]): the
    /// same total of positions as `settings.window` on every planned layer, more where a layer
    /// loses more of its attention output to eviction. No effect on a model without curves.
    pub split: bool,
}

impl O1Plan {
    /// The same plan for a prompt of `tp` tokens.
    pub fn with_prompt(self, tp: usize) -> O1Plan {
        O1Plan { tp, ..self }
    }

    /// The prompt length.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// Whether this is the checking path (matrix form, nothing sealed).
    pub fn checks(&self) -> bool {
        self.check.is_some()
    }

    /// The settings' own checks (each names its CLI flag). The guard needs none: the streaming
    /// form always applies the aggregate guard, `check` chooses the matrix form's.
    pub fn validate(&self) -> Result<(), NystromError> {
        self.settings.validate()
    }

    /// The planned layers' windows (layer, window) this plan takes from a model's curves: Some
    /// when it splits (`split`, a policy with a window of its own: not the skeleton, not the
    /// check mode) and the model carries curves.
    pub fn split_windows(&self, split: Option<&O1Split>) -> Option<Vec<(usize, usize)>> {
        split
            .filter(|_| self.split && self.far != Far::Skeleton && self.check.is_none())
            .map(|sp| sp.windows(self.settings.window))
    }
}

/// Per planned layer, how much of its attention output a cache of sinks + w positions loses:
/// `curves[i][j]` is layer `layers[i]`'s relative squared error at w = step·(j + 1) (Σ|o_w − o|² /
/// Σ|o|² over calibration queries; `cortiq polish` measures it on its training texts and the
/// .cmf carries it). From it [`O1Split::windows`] gives each layer its share of a fixed total.
#[derive(Clone, Debug, PartialEq)]
pub struct O1Split {
    pub step: usize,
    pub layers: Vec<usize>,
    pub curves: Vec<Vec<f32>>,
}

/// No split window below this (the recent positions every layer needs; and the score rule's
/// protected ones).
pub const SPLIT_MIN: usize = 16;

impl O1Split {
    /// The error of layer index `i` at window w (the curve's points are w = step·(j + 1); below
    /// the first, the first; past the last, the last: the curve is flat there).
    fn err(&self, i: usize, w: usize) -> f64 {
        let c = &self.curves[i];
        let j = (w / self.step).clamp(1, c.len()) - 1;
        c[j] as f64
    }

    /// Windows for `layers` (those the split covers) that sum to `window` × their count: each
    /// starts at min(window, SPLIT_MIN) and the rest goes `step` positions at a time to the layer
    /// whose error falls most for it (ties to the lower layer); what is left under one step
    /// goes to the first layer. Deterministic in the curves alone.
    pub fn windows(&self, window: usize) -> Vec<(usize, usize)> {
        let n = self.layers.len();
        let floor = window.min(SPLIT_MIN);
        let mut w = vec![floor; n];
        let mut left = (window - floor) * n;
        let step = self.step.max(1);
        while left >= step {
            let gain = |i: usize| self.err(i, w[i]) - self.err(i, w[i] + step);
            let best = (0..n).fold(0, |b, i| if gain(i) > gain(b) { i } else { b });
            w[best] += step;
            left -= step;
        }
        if n > 0 {
            w[0] += left;
        }
        self.layers.iter().copied().zip(w).collect()
    }

    /// The split's own checks against a model of `n_layers`: a curve per layer, each with a
    /// point, finite errors, every layer in range.
    pub fn validate(&self, n_layers: usize) -> Result<(), String> {
        if let Some(&il) = self.layers.iter().find(|&&il| il >= n_layers) {
            return Err(format!("o(1) split: layer {il} of {n_layers}"));
        }
        if self.step == 0 || self.layers.len() != self.curves.len() {
            return Err(format!(
                "o(1) split: step {} with {} layers and {} curves",
                self.step,
                self.layers.len(),
                self.curves.len()
            ));
        }
        match self.curves.iter().position(|c| c.is_empty() || c.iter().any(|x| !x.is_finite())) {
            Some(i) => Err(format!("o(1) split: layer {}'s curve is empty or not finite", self.layers[i])),
            None => Ok(()),
        }
    }
}

/// Attention geometry the seal needs (the model's, fixed per sequence).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geom {
    pub scale: f32,
    pub n_heads: usize,
    pub n_kv: usize,
    pub head_dim: usize,
}

/// One sequence's O(1) bookkeeping (lives in `SeqState`).
#[derive(Clone, Debug)]
pub struct O1Run {
    pub plan: O1Plan,
    /// Per layer: how the plan serves it.
    pub(crate) serve: Vec<Serve>,
    /// Per planned layer until its seal (skeleton plans): the prompt's query segment sums.
    segs: Vec<Option<QuerySegments>>,
    /// Per planned layer until its seal (score plans whose seal is voted): the prompt's last
    /// queries.
    recent: Vec<Option<RecentQueries>>,
    /// Check mode, per planned layer: every position's queries [len, n_heads, head_dim].
    q_hist: Vec<Vec<f32>>,
    geom: Geom,
    /// Per layer: the learned far field's feature maps ([`Far::Linear`] plans).
    far_weights: Vec<Option<std::sync::Arc<crate::o1::farfield::FarWeights>>>,
    /// Per layer: its window when the plan splits them (`O1Plan::split` and a model with
    /// curves), else None (the plan's window).
    windows: Vec<Option<usize>>,
    /// Per layer: whether a score rule with `model_layers` keeps sink+window here (a model
    /// that lists its score layers and not this one).
    window_only: Vec<bool>,
    pub stats: O1Stats,
}

impl O1Run {
    /// `far_weights`: per layer, the model's trained far field (needed by every planned layer of
    /// a [`Far::Linear`] plan; see `Model::new_state_o1`).
    pub(crate) fn new(
        plan: O1Plan,
        serve: Vec<Serve>,
        geom: Geom,
        far_weights: Vec<Option<std::sync::Arc<crate::o1::farfield::FarWeights>>>,
        split: Option<&O1Split>,
        score_layers: Option<&[usize]>,
    ) -> O1Run {
        let n = serve.len();
        let window_only = (0..n).map(|il| score_layers.is_some_and(|l| !l.contains(&il))).collect();
        let mut windows = vec![None; n];
        for (il, w) in plan.split_windows(split).unwrap_or_default() {
            if serve.get(il) == Some(&Serve::Planned) {
                windows[il] = Some(w);
            }
        }
        let mut run = O1Run {
            windows,
            window_only,
            plan,
            serve,
            segs: vec![None; n],
            recent: vec![None; n],
            q_hist: vec![Vec::new(); n],
            geom,
            far_weights,
            stats: O1Stats::default(),
        };
        run.restart_segments();
        run
    }

    fn restart_segments(&mut self) {
        let p = &self.plan;
        let seal_skeleton = p.check.is_none() && p.far == Far::Skeleton && p.settings.seals_skeleton(p.tp);
        let m = p.settings.m_eff(p.tp);
        for (s, &how) in self.segs.iter_mut().zip(&self.serve) {
            *s = (seal_skeleton && how == Serve::Planned)
                .then(|| QuerySegments::new(p.tp, m, self.geom.n_heads, self.geom.head_dim));
        }
        let obs = match p.far {
            Far::Score(rule) | Far::Linear(Some(rule)) if p.check.is_none() => rule.obs,
            _ => 0,
        };
        for (r, &how) in self.recent.iter_mut().zip(&self.serve) {
            *r = (obs > 0 && how == Serve::Planned).then(|| RecentQueries::new(p.tp, obs, self.geom.n_heads, self.geom.head_dim));
        }
    }

    /// Whether the prompt phase is exact attention and nothing else: no per-landmark query sums
    /// (a skeleton plan's depend on its own tp) and no check mode. Such a sequence's state
    /// before the seal is a plain sequence's, so the prompt cache can serve it.
    pub fn plain_prompt(&self) -> bool {
        self.plan.check.is_none() && self.segs.iter().all(Option::is_none) && self.recent.iter().all(Option::is_none)
    }

    /// Whether positions < tp are still to come (the streaming plan has not sealed yet).
    pub fn pending(&self, len: usize) -> bool {
        self.plan.check.is_none() && len < self.plan.tp
    }

    /// Where a chunk of n positions from `len` must be cut so that the seal falls between two
    /// forward calls: Some(tp − len) when len < tp < len + n.
    pub(crate) fn split(&self, len: usize, n: usize) -> Option<usize> {
        (self.plan.check.is_none() && len < self.plan.tp && self.plan.tp < len + n).then(|| self.plan.tp - len)
    }

    /// The hook for layer `il`.
    pub(crate) fn hook(&mut self, il: usize) -> AttnO1<'_> {
        if self.serve[il] != Serve::Planned {
            return AttnO1::Off;
        }
        if self.plan.check.is_some() {
            return AttnO1::Matrix { plan: self.plan, q_hist: &mut self.q_hist[il], stats: &mut self.stats };
        }
        match (&mut self.segs[il], &mut self.recent[il]) {
            (Some(s), _) => AttnO1::Segments(s),
            (None, Some(r)) => AttnO1::Recent(r),
            (None, None) => AttnO1::Stats(&mut self.stats),
        }
    }

    /// Whether layer `il` seals after a chunk that ends at position `end`.
    pub(crate) fn seals_after(&self, il: usize, end: usize) -> bool {
        self.seals(il) && self.plan.check.is_none() && end == self.plan.tp
    }

    /// Whether layer `il` is sealed by the streaming plan (planned or sliding).
    pub(crate) fn seals(&self, il: usize) -> bool {
        self.serve[il] != Serve::Untouched
    }

    /// Layer `il`'s sealed state from its KV cache's rows `k`, `v` (the tp prompt positions, as
    /// f32), and whether the layer slides; `state::seal_layer` puts it in place of the cache.
    pub(crate) fn sealed(&mut self, il: usize, k: &[f32], v: &[f32]) -> Result<(O1Layer, bool), NystromError> {
        let g = self.geom;
        let (settings, far) = match self.serve[il] {
            // Landmarks are unused when far keys are dropped.
            Serve::Sliding(w) => (O1Settings { window: w, sinks: 0, landmarks: 4, ..self.plan.settings }, Far::Drop),
            _ => (O1Settings { window: self.window(il), ..self.plan.settings }, self.plan.far),
        };
        // A model that chose its rule per layer: the layers it did not list keep sink+window.
        let far = match far {
            Far::Score(r) if r.model_layers && self.window_only[il] => Far::Drop,
            Far::Linear(Some(r)) if r.model_layers && self.window_only[il] => Far::Linear(None),
            f => f,
        };
        // A learned far field sits beside the plan's eviction rule (sink+window or score). A
        // planned layer without feature maps (the polish found none that helped it) keeps the
        // rule alone and spends the far state's bytes on its window: every planned layer holds
        // the same budget.
        let (far, far_weights, settings) = match far {
            Far::Linear(rule) => {
                let own = rule.map_or(Far::Drop, Far::Score);
                match self.far_weights.get(il).cloned().flatten() {
                    Some(fw) => (own, Some(fw), settings),
                    None => {
                        let per_pos = 2 * g.n_kv * g.head_dim * 4;
                        let far_bytes = self.far_weights.iter().flatten().map(|w| w.state_bytes()).max().unwrap_or(0);
                        (own, None, O1Settings { window: settings.window + far_bytes / per_pos.max(1), ..settings })
                    }
                }
            }
            f => (f, None, settings),
        };
        let sealed = match (far, &self.recent[il]) {
            (Far::Score(rule), Some(recent)) => {
                let slots =
                    Slots::seal_voted(k, v, recent, g.n_heads, g.n_kv, settings.sinks, settings.window, rule, g.scale as f64);
                O1Layer::scored(&settings, g.scale, g.n_heads, g.n_kv, g.head_dim, k.len() / (g.n_kv * g.head_dim), slots)
            }
            _ => O1Layer::seal(&settings, far, g.scale, g.n_heads, g.n_kv, g.head_dim, self.segs[il].as_ref(), k, v)?,
        };
        let sealed = match far_weights {
            Some(fw) => sealed.with_far(fw, k, v),
            None => sealed,
        };
        self.recent[il] = None;
        self.segs[il] = None;
        Ok((sealed, matches!(self.serve[il], Serve::Sliding(_))))
    }

    /// Back to an empty sequence (the layers were cleared, sealed ones back to empty KV
    /// caches): segments and statistics restart. True when the plan seals at once (tp = 0:
    /// `state::seal_all` then).
    pub(crate) fn reset(&mut self) -> bool {
        self.q_hist.iter_mut().for_each(Vec::clear);
        self.stats = O1Stats::default();
        self.restart_segments();
        self.plan.check.is_none() && self.plan.tp == 0
    }

    /// A copy for a checkpoint, without the check mode's query history (`restore` truncates the
    /// live one instead).
    pub(crate) fn snapshot(&self) -> O1Run {
        O1Run {
            plan: self.plan,
            serve: self.serve.clone(),
            segs: self.segs.clone(),
            recent: self.recent.clone(),
            q_hist: vec![Vec::new(); self.serve.len()],
            geom: self.geom,
            far_weights: self.far_weights.clone(),
            windows: self.windows.clone(),
            window_only: self.window_only.clone(),
            stats: self.stats,
        }
    }

    /// Back to a snapshot taken at length `len`.
    pub(crate) fn restore(&mut self, snap: O1Run, len: usize) {
        let mut q_hist = std::mem::take(&mut self.q_hist);
        let row = self.geom.n_heads * self.geom.head_dim;
        q_hist.iter_mut().for_each(|q| q.truncate(len * row));
        *self = snap;
        self.q_hist = q_hist;
    }

    /// A planned layer's window: its split share, or the plan's.
    pub fn window(&self, il: usize) -> usize {
        self.windows.get(il).copied().flatten().unwrap_or(self.plan.settings.window)
    }

    /// Bytes of the prompt-phase bookkeeping (segment sums; the check mode's query history is
    /// checking scaffolding, not sequence state, and is not counted).
    /// Whether the plan is the checking path (matrix form, nothing sealed).
    pub fn checks(&self) -> bool {
        self.plan.check.is_some()
    }

    /// What the guard did so far.
    pub fn stats(&self) -> O1Stats {
        self.stats
    }

    /// Back to the statistics of an earlier point (a verify's rejected positions undone).
    pub(crate) fn set_stats(&mut self, stats: O1Stats) {
        self.stats = stats;
    }

    pub fn bytes(&self) -> usize {
        self.segs.iter().flatten().map(|s| s.bytes()).sum::<usize>()
            + self.recent.iter().flatten().map(|r| r.bytes()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(curves: Vec<Vec<f32>>, step: usize) -> O1Split {
        O1Split { step, layers: (0..curves.len()).map(|i| 2 * i + 1).collect(), curves }
    }

    /// The windows keep the total, never go below the floor, and follow the curves: a layer
    /// whose error falls steeply gets the positions, a flat one keeps its floor.
    #[test]
    fn windows_keep_the_total_and_follow_the_curves() {
        // Layer 1: error falls 1.0 per 8 positions up to 256; layer 3 flat; layer 5 falls 0.5.
        let steep: Vec<f32> = (1..=64).map(|j| (32.0 - j as f32).max(0.0)).collect();
        let flat = vec![0.25f32; 64];
        let half: Vec<f32> = (1..=64).map(|j| (16.0 - 0.5 * j as f32).max(0.0)).collect();
        let sp = split(vec![steep, flat, half], 8);
        sp.validate(6).unwrap();
        for window in [20usize, 64, 100, 128, 300] {
            let w = sp.windows(window);
            println!("window {window}: {w:?}");
            assert_eq!(w.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3, 5]);
            assert_eq!(w.iter().map(|x| x.1).sum::<usize>(), 3 * window, "window {window}: the total");
            assert!(w.iter().all(|x| x.1 >= window.min(SPLIT_MIN)), "window {window}: the floor");
            // The flat layer gains nothing from positions: it keeps its floor (plus nothing).
            assert_eq!(w[1].1, window.min(SPLIT_MIN), "window {window}: the flat layer");
            // The steeper layer first: it gains 1.0 per step, the other 0.5.
            assert!(w[0].1 >= w[2].1, "window {window}: steep {} vs half {}", w[0].1, w[2].1);
        }
        // Up to 256 the steep layer takes every step (both layers gain until then, it more).
        assert_eq!(sp.windows(64), vec![(1, 64 * 3 - 32), (3, 16), (5, 16)]);
    }

    #[test]
    fn bad_splits_are_refused() {
        assert!(split(vec![vec![0.5], vec![]], 8).validate(4).unwrap_err().contains("layer 3"));
        assert!(split(vec![vec![f32::NAN]], 8).validate(4).is_err());
        assert!(split(vec![vec![0.5]], 0).validate(4).is_err());
        assert!(split(vec![vec![0.5], vec![0.5]], 8).validate(3).unwrap_err().contains("layer 3 of 3"));
        let mut sp = split(vec![vec![0.5]], 8);
        sp.layers.push(7);
        assert!(sp.validate(8).is_err());
    }
}

/// What a polished .cmf records for O(1) serving (`cortiq polish`): its settings, and whether
/// it carries a learned far field (then it is served as sink+window with it).
#[derive(Clone, Copy, Debug)]
pub struct Served {
    pub settings: O1Settings,
    pub linear: bool,
    /// Its far field was fitted beside score eviction: served with it unless --kv-evict says.
    pub score: bool,
    /// With `score`: only on the layers the polish chose (`polish --far-rule auto`).
    pub score_layers: bool,
}

/// The O(1) settings a polished .cmf's header records (`Loaded::served_o1`).
pub fn served_o1(h: &cortiq_formats::cmf::O1Header) -> Served {
    Served {
        settings: O1Settings {
            window: h.window,
            sinks: h.sinks,
            landmarks: h.landmarks,
            ridge: h.ridge,
            state: nystrom::StatePrecision::default(),
        },
        linear: h.far_rank.is_some(),
        score: h.far_rank.is_some() && h.far_rule.as_deref() == Some("score"),
        score_layers: h.score_layers.is_some(),
    }
}
