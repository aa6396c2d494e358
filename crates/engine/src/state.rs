//! Per-sequence state: one entry per layer (STYLE principle 9). Dense models have only KV
//! caches (f32, or f16 for half the memory and llama.cpp's cache format); hybrid mixers add
//! their own variants; a sequence with an O(1) plan (`o1`) turns its global attention caches
//! into sealed `O1` states at the end of the prompt. Callers use `len`, `checkpoint` and
//! `rollback`, never the layer internals.

use half::f16;

use crate::mixers::gdn::GdnState;
use crate::mixers::kda::KdaState;
use crate::mixers::mla::MlaState;
use crate::mixers::nystrom::O1Layer;
use crate::mixers::shortconv::ShortConvState;
use crate::o1::{O1Run, O1Stats, Serve};

/// One layer's state.
#[derive(Clone)]
pub enum LayerState {
    /// Keys and values of every position so far: each [len, n_kv_heads, head_dim].
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The same, stored as f16 (llama.cpp's default cache type): half the bytes. Values are
    /// rounded to nearest-even on append, as ggml's f32 -> f16 copy does.
    KvF16 { k: Vec<f16>, v: Vec<f16> },
    /// LFM2's short convolution: the last kernel − 1 gated inputs (constant size).
    ShortConv(ShortConvState),
    /// GatedDeltaNet: conv history and the recurrent matrix per value head (constant size).
    Gdn(GdnState),
    /// Kimi Delta Attention: conv history and the recurrent matrix per head (constant size).
    Kda(KdaState),
    /// Multi-head latent attention's expanded keys and values, `k_width` / `v_width` values per
    /// position.
    Mla { st: MlaState, k_width: usize, v_width: usize },
    /// A global attention layer sealed at the end of the prompt (`o1` plan): sinks, a window
    /// ring and the Nyström skeleton's accumulators, constant size (`mixers::nystrom`).
    O1(Box<O1Layer>),
}

impl LayerState {
    /// Whether the state can only go forward (no truncation to an earlier length: a
    /// checkpoint must snapshot it).
    pub fn is_recurrent(&self) -> bool {
        matches!(self, LayerState::ShortConv(_) | LayerState::Gdn(_) | LayerState::Kda(_) | LayerState::O1(_))
    }
}

/// A sequence's state bytes by kind (`SeqState::bytes_by_kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateBytes {
    /// KV caches (exact attention, sliding layers, MLA), by their values' length.
    pub kv: usize,
    /// Sealed O(1) attention layers, scratch included, and the plan's prompt bookkeeping.
    pub o1: usize,
    /// Recurrent mixers (GatedDeltaNet, KDA, short conv).
    pub recurrent: usize,
}

impl StateBytes {
    pub fn total(&self) -> usize {
        self.kv + self.o1 + self.recurrent
    }
}

#[derive(Clone)]
pub struct SeqState {
    pub layers: Vec<LayerState>,
    /// Positions already processed.
    pub len: usize,
    /// Maximum positions this sequence may hold.
    pub n_ctx: usize,
    kv_dim: usize,
    /// The O(1) decode plan and its bookkeeping (`Model::new_state_o1`).
    pub(crate) o1: Option<O1Run>,
}

/// A point to roll a sequence back to: the length, and a snapshot of every recurrent layer's
/// state (KV caches are truncated instead, so they cost nothing here). A checkpoint taken
/// before an O(1) plan's seal also snapshots the caches that the seal will replace, and the
/// plan's query segment sums, so a rollback across the seal restores them exactly.
#[derive(Clone)]
pub struct Checkpoint {
    len: usize,
    recurrent: Vec<Option<LayerState>>,
    o1: Option<O1Run>,
}

impl Checkpoint {
    /// A checkpoint at length `len` from per-layer snapshots (`Some` for every recurrent
    /// layer, taken when the sequence was `len` long).
    pub(crate) fn at(len: usize, recurrent: Vec<Option<LayerState>>) -> Checkpoint {
        Checkpoint { len, recurrent, o1: None }
    }
}

impl SeqState {
    /// A state with f32 KV caches.
    pub fn new(n_layers: usize, kv_dim: usize, n_ctx: usize) -> SeqState {
        SeqState::with_kv(n_layers, kv_dim, n_ctx, false)
    }

    /// A state whose KV caches hold f16 (`kv_f16`) or f32 values.
    pub fn with_kv(n_layers: usize, kv_dim: usize, n_ctx: usize, kv_f16: bool) -> SeqState {
        let layers = (0..n_layers)
            .map(|_| {
                if kv_f16 {
                    LayerState::KvF16 { k: Vec::new(), v: Vec::new() }
                } else {
                    LayerState::Kv { k: Vec::new(), v: Vec::new() }
                }
            })
            .collect();
        SeqState { layers, len: 0, n_ctx, kv_dim, o1: None }
    }

    /// A sequence with the given per-layer states (hybrid models: one per layer kind).
    pub fn from_layers(layers: Vec<LayerState>, kv_dim: usize, n_ctx: usize) -> SeqState {
        SeqState { layers, len: 0, n_ctx, kv_dim, o1: None }
    }

    /// The O(1) plan's bookkeeping, if the sequence has one.
    pub fn o1(&self) -> Option<&O1Run> {
        self.o1.as_ref()
    }

    /// What the O(1) guard did so far (None without a plan).
    pub fn o1_stats(&self) -> Option<O1Stats> {
        self.o1.as_ref().map(|r| r.stats)
    }

    pub fn checkpoint(&self) -> Checkpoint {
        // Before the seal, the caches the seal will replace are snapshotted too.
        let pending = self.o1.as_ref().filter(|r| r.pending(self.len));
        let recurrent = self
            .layers
            .iter()
            .enumerate()
            .map(|(il, l)| (l.is_recurrent() || pending.is_some_and(|r| r.seals(il))).then(|| l.clone()))
            .collect();
        Checkpoint { len: self.len, recurrent, o1: self.o1.as_ref().map(O1Run::snapshot) }
    }

    /// Forget every position after the checkpoint (KV caches truncated, recurrent states
    /// restored from the checkpoint's snapshots).
    pub fn rollback(&mut self, cp: Checkpoint) {
        assert!(cp.len <= self.len, "rollback to {} beyond current length {}", cp.len, self.len);
        self.len = cp.len;
        let n = cp.len * self.kv_dim;
        for (l, snap) in self.layers.iter_mut().zip(cp.recurrent) {
            if let Some(s) = snap {
                *l = s;
                continue;
            }
            match l {
                LayerState::Kv { k, v } => {
                    k.truncate(n);
                    v.truncate(n);
                }
                LayerState::KvF16 { k, v } => {
                    k.truncate(n);
                    v.truncate(n);
                }
                LayerState::Mla { st, k_width, v_width } => {
                    st.k.truncate(cp.len * *k_width);
                    st.v.truncate(cp.len * *v_width);
                }
                LayerState::ShortConv(_) | LayerState::Gdn(_) | LayerState::Kda(_) | LayerState::O1(_) => {
                    panic!("a checkpoint snapshots every recurrent layer");
                }
            }
        }
        if let (Some(run), Some(snap)) = (&mut self.o1, cp.o1) {
            run.restore(snap, cp.len);
        }
    }

    /// Whether `truncate` can go back to any earlier length (no recurrent layer, no O(1) plan).
    pub fn can_truncate(&self) -> bool {
        !self.layers.iter().any(LayerState::is_recurrent) && self.o1.is_none()
    }

    /// Room for `extra` more positions in every KV cache without reallocating (a cloned state
    /// holds exactly its length).
    pub fn reserve(&mut self, extra: usize) {
        let n = extra * self.kv_dim;
        for l in &mut self.layers {
            match l {
                LayerState::Kv { k, v } => {
                    k.reserve(n);
                    v.reserve(n);
                }
                LayerState::KvF16 { k, v } => {
                    k.reserve(n);
                    v.reserve(n);
                }
                LayerState::Mla { st, k_width, v_width } => {
                    st.k.reserve(extra * *k_width);
                    st.v.reserve(extra * *v_width);
                }
                _ => {}
            }
        }
    }

    /// Keep the first `len` positions (len ≤ self.len). Models with recurrent layers cannot
    /// truncate to an arbitrary length (use `checkpoint`/`rollback`, or start over): that
    /// panics, as a caller bug — check `can_truncate`. Truncating to 0 (`clear`) is always
    /// allowed.
    pub fn truncate(&mut self, len: usize) {
        assert!(self.can_truncate() || len == self.len, "truncate: recurrent layers cannot go back to {len} of {}", self.len);
        if len == self.len {
            return;
        }
        let recurrent = vec![None; self.layers.len()];
        self.rollback(Checkpoint { len, recurrent, o1: None });
    }

    /// Back to an empty sequence (recurrent states zeroed).
    pub fn clear(&mut self) {
        self.len = 0;
        for l in &mut self.layers {
            match l {
                LayerState::Kv { k, v } => {
                    k.clear();
                    v.clear();
                }
                LayerState::KvF16 { k, v } => {
                    k.clear();
                    v.clear();
                }
                LayerState::ShortConv(s) => s.conv.fill(0.0),
                LayerState::Gdn(s) => {
                    s.conv.fill(0.0);
                    s.s.fill(0.0);
                }
                LayerState::Kda(s) => {
                    s.conv.fill(0.0);
                    s.s.fill(0.0);
                }
                LayerState::Mla { st, .. } => {
                    st.k.clear();
                    st.v.clear();
                }
                // Planned layers go back to empty caches below.
                LayerState::O1(_) => {}
            }
        }
        if let Some(run) = &mut self.o1 {
            run.reset(&mut self.layers);
        }
    }

    /// Bytes held by the state (KV caches, recurrent states, O(1) states).
    pub fn bytes(&self) -> usize {
        self.bytes_by_kind().total()
    }

    /// Bytes held by the state, by kind. A sliding layer's bounded cache (sealed by an O(1)
    /// plan) counts as KV.
    pub fn bytes_by_kind(&self) -> StateBytes {
        let mut b = StateBytes { o1: self.o1.as_ref().map_or(0, O1Run::bytes), ..StateBytes::default() };
        for (il, l) in self.layers.iter().enumerate() {
            match l {
                LayerState::Kv { k, v } => b.kv += (k.len() + v.len()) * 4,
                LayerState::KvF16 { k, v } => b.kv += (k.len() + v.len()) * 2,
                LayerState::Mla { st, .. } => b.kv += (st.k.len() + st.v.len()) * 4,
                LayerState::ShortConv(s) => b.recurrent += s.conv.len() * 4,
                LayerState::Gdn(s) => b.recurrent += s.bytes(),
                LayerState::Kda(s) => b.recurrent += s.bytes(),
                LayerState::O1(o) if self.o1.as_ref().is_some_and(|r| matches!(r.serve[il], Serve::Sliding(_))) => {
                    b.kv += o.bytes()
                }
                LayerState::O1(o) => b.o1 += o.bytes(),
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fill every layer with `n` positions of kv_dim values each.
    fn fill(st: &mut SeqState, kv_dim: usize, n: usize) {
        for l in &mut st.layers {
            match l {
                LayerState::Kv { k, v } => {
                    k.resize(n * kv_dim, 1.0);
                    v.resize(n * kv_dim, 1.0);
                }
                LayerState::KvF16 { k, v } => {
                    k.resize(n * kv_dim, f16::ONE);
                    v.resize(n * kv_dim, f16::ONE);
                }
                _ => unreachable!("dense states only"),
            }
        }
        st.len = n;
    }

    #[test]
    fn f16_cache_holds_half_the_bytes_and_rolls_back() {
        let (layers, kv_dim, n) = (3, 8, 10);
        let mut a = SeqState::with_kv(layers, kv_dim, 64, false);
        let mut b = SeqState::with_kv(layers, kv_dim, 64, true);
        fill(&mut a, kv_dim, n);
        fill(&mut b, kv_dim, n);
        assert_eq!(a.bytes(), layers * 2 * n * kv_dim * 4);
        assert_eq!(b.bytes(), a.bytes() / 2, "f16 cache: {} bytes vs f32 {}", b.bytes(), a.bytes());
        b.truncate(4);
        assert_eq!(b.bytes(), layers * 2 * 4 * kv_dim * 2);
        b.clear();
        assert_eq!(b.bytes(), 0);
    }

    /// A hybrid sequence: rollback truncates the KV layer and restores the recurrent layers'
    /// snapshots bit for bit; truncate refuses to go back, clear zeroes.
    #[test]
    fn recurrent_layers_roll_back_from_snapshots() {
        use crate::mixers::gdn::{GdnConfig, OutGate};
        let cfg = GdnConfig {
            d_model: 8,
            n_k_heads: 1,
            n_v_heads: 2,
            d_k: 4,
            d_v: 4,
            conv_kernel: 4,
            norm_eps: 1e-6,
            out_gate: OutGate::Silu,
            v_tiled: false,
        };
        let kv_dim = 6;
        let layers = vec![
            LayerState::Kv { k: Vec::new(), v: Vec::new() },
            LayerState::Gdn(GdnState::new(&cfg)),
            LayerState::ShortConv(ShortConvState::new(8, 3)),
        ];
        let mut st = SeqState::from_layers(layers, kv_dim, 64);
        let advance = |st: &mut SeqState, x: f32| {
            for l in &mut st.layers {
                match l {
                    LayerState::Kv { k, v } => {
                        k.extend(std::iter::repeat_n(x, kv_dim));
                        v.extend(std::iter::repeat_n(x, kv_dim));
                    }
                    LayerState::Gdn(g) => g.s.iter_mut().for_each(|s| *s = *s * 0.5 + x),
                    LayerState::ShortConv(c) => c.conv.iter_mut().for_each(|s| *s += x),
                    _ => unreachable!(),
                }
            }
            st.len += 1;
        };
        advance(&mut st, 1.0);
        let cp = st.checkpoint();
        let before: Vec<Vec<f32>> = st
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, .. } => k.clone(),
                LayerState::Gdn(g) => g.s.clone(),
                LayerState::ShortConv(c) => c.conv.clone(),
                _ => unreachable!(),
            })
            .collect();
        advance(&mut st, 2.5);
        advance(&mut st, -1.0);
        assert!(!st.can_truncate());
        st.rollback(cp);
        assert_eq!(st.len, 1);
        let after: Vec<Vec<f32>> = st
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, .. } => k.clone(),
                LayerState::Gdn(g) => g.s.clone(),
                LayerState::ShortConv(c) => c.conv.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(before, after, "rollback must restore every layer exactly");
        st.clear();
        assert_eq!(st.len, 0);
        assert!(st.layers.iter().all(|l| match l {
            LayerState::Kv { k, .. } => k.is_empty(),
            LayerState::Gdn(g) => g.s.iter().all(|&x| x == 0.0),
            LayerState::ShortConv(c) => c.conv.iter().all(|&x| x == 0.0),
            _ => false,
        }));
    }
}
