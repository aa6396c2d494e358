//! Per-sequence state (STYLE principle 9): one `LayerState` per layer, each its mixer's own
//! state type behind `mixers::MixerState` (KV caches f32, f16 or 8-bit, recurrent states, sealed O(1)
//! attention), and the sequence-level operations built from those per-layer ones: checkpoint,
//! rollback, truncate, clear, reserve, bytes. A sequence with an O(1) plan (`o1`) turns its
//! global attention caches into sealed states at the end of the prompt. Callers use `len`,
//! `checkpoint` and `rollback`, never the layer internals; nothing here matches on a mixer.

use crate::mixers::attention::{Cache, KvState};
pub use crate::mixers::{KvType, LayerState, StateBytes};
use crate::o1::nystrom::NystromError;
use crate::o1::{O1Run, O1Stats};

#[derive(Clone)]
pub struct SeqState {
    pub layers: Vec<LayerState>,
    /// Positions already processed.
    pub len: usize,
    /// Maximum positions this sequence may hold.
    pub n_ctx: usize,
    /// The O(1) decode plan and its bookkeeping (`Model::new_state_o1`).
    pub(crate) o1: Option<O1Run>,
    /// Where a prefill call may start without changing the values (`Model::cut_grid`).
    pub(crate) grid: usize,
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
    /// Append to a session file: its length, then per layer whether it holds a snapshot and
    /// the snapshot (`session`).
    pub(crate) fn save(&self, out: &mut Vec<u8>) -> Result<(), String> {
        if self.o1.is_some() {
            return Err("a checkpoint of a constant-memory (O(1)) sequence is not saved".into());
        }
        crate::codec::put_u64(out, self.len as u64);
        for snap in &self.recurrent {
            out.push(u8::from(snap.is_some()));
            if let Some(l) = snap {
                l.0.save(out)?;
            }
        }
        Ok(())
    }

    /// Read what `save` wrote, for a sequence whose fresh layers are `like`'s.
    pub(crate) fn load(r: &mut &[u8], like: &SeqState) -> Result<Checkpoint, String> {
        let len = crate::codec::get_u64(r)? as usize;
        let mut recurrent = Vec::with_capacity(like.layers.len());
        for (il, l) in like.layers.iter().enumerate() {
            let snap = match crate::codec::get_u8(r)? {
                0 if !l.is_recurrent() => None,
                1 if l.is_recurrent() => {
                    let mut s = l.clone();
                    s.0.clear();
                    s.0.load(r, len).map_err(|e| format!("checkpoint at {len}, layer {il}: {e}"))?;
                    Some(s)
                }
                _ => {
                    return Err(format!(
                        "checkpoint at {len}, layer {il}: a snapshot where the layer keeps none, or none where it must"
                    ));
                }
            };
            recurrent.push(snap);
        }
        Ok(Checkpoint { len, recurrent, o1: None })
    }

    /// The length the checkpoint goes back to.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it goes back to the empty sequence.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes its snapshots hold (the O(1) plan's bookkeeping included).
    pub fn bytes(&self) -> usize {
        let layers: usize = self.recurrent.iter().flatten().map(|l| l.bytes().total()).sum();
        layers + self.o1.as_ref().map_or(0, O1Run::bytes)
    }
}

impl SeqState {
    /// A state with f32 KV caches.
    pub fn new(n_layers: usize, kv_dim: usize, n_ctx: usize) -> SeqState {
        SeqState::with_kv(n_layers, kv_dim, n_ctx, KvType::F32)
    }

    /// A state whose KV caches hold `kind` values.
    pub fn with_kv(n_layers: usize, kv_dim: usize, n_ctx: usize, kind: KvType) -> SeqState {
        let layers = (0..n_layers).map(|_| LayerState::new(KvState::new(kv_dim, kind))).collect();
        SeqState::from_layers(layers, n_ctx)
    }

    /// A sequence with the given per-layer states (hybrid models: one per layer kind).
    pub fn from_layers(layers: Vec<LayerState>, n_ctx: usize) -> SeqState {
        SeqState { layers, len: 0, n_ctx, o1: None, grid: 1 }
    }

    /// Where its prefill calls start (`Model::cut_grid`): the prompt cache restores it there.
    pub fn grid(&self) -> usize {
        self.grid
    }

    /// The O(1) plan's bookkeeping, if the sequence has one.
    pub fn o1(&self) -> Option<&O1Run> {
        self.o1.as_ref()
    }

    /// What the O(1) guard did so far (None without a plan).
    pub fn o1_stats(&self) -> Option<O1Stats> {
        self.o1.as_ref().map(O1Run::stats)
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

    /// A checkpoint as the plain sequence would take it: recurrent layers only, without the O(1)
    /// plan's part (the prompt cache's checkpoints, shared between plain sequences and O(1)
    /// ones before their seal, whose caches are the same).
    pub fn plain_checkpoint(&self) -> Checkpoint {
        let recurrent = self.layers.iter().map(|l| l.is_recurrent().then(|| l.clone())).collect();
        Checkpoint { len: self.len, recurrent, o1: None }
    }

    /// Whether the prompt cache can serve this sequence: no O(1) plan, or one whose prompt
    /// phase is exact attention alone (StreamingLLM's sinks + window: `O1Run::plain_prompt`),
    /// before its seal.
    pub fn cacheable(&self) -> bool {
        self.o1.as_ref().is_none_or(|r| r.plain_prompt() && r.pending(self.len))
    }

    /// Forget every position after the checkpoint (KV caches truncated, recurrent states
    /// restored from the checkpoint's snapshots).
    pub fn rollback(&mut self, cp: Checkpoint) {
        self.rollback_with(cp.len, cp.recurrent, cp.o1, |l, s| *l = s);
    }

    /// Become a copy of `src` (its layers, length, plan and grid; `n_ctx` kept), in this
    /// state's own buffers where a layer is of the same type: the prompt cache restores a
    /// serving slot this way, so the slot's buffers are reused rather than freed and grown
    /// again on every request.
    pub fn copy_from(&mut self, src: &SeqState) {
        if self.layers.len() == src.layers.len() {
            self.layers.iter_mut().zip(&src.layers).for_each(|(l, s)| l.copy_from(s));
        } else {
            self.layers = src.layers.clone();
        }
        (self.len, self.o1, self.grid) = (src.len, src.o1.clone(), src.grid);
    }

    /// `rollback` to a checkpoint kept elsewhere (the prompt cache's): its snapshots are copied
    /// into this state's buffers.
    pub fn rollback_to(&mut self, cp: &Checkpoint) {
        self.rollback_with(cp.len, cp.recurrent.iter().map(Option::as_ref), cp.o1.clone(), |l, s| l.copy_from(s));
    }

    /// `rollback`'s body: each snapshot put in place by `put` (moved or copied), every other
    /// layer truncated.
    fn rollback_with<T>(
        &mut self,
        len: usize,
        snaps: impl IntoIterator<Item = Option<T>>,
        o1: Option<O1Run>,
        put: impl Fn(&mut LayerState, T),
    ) {
        assert!(len <= self.len, "rollback to {len} beyond current length {}", self.len);
        self.len = len;
        for (l, snap) in self.layers.iter_mut().zip(snaps) {
            match snap {
                Some(s) => put(l, s),
                None => {
                    assert!(!l.is_recurrent(), "a checkpoint snapshots every recurrent layer");
                    l.0.truncate(len);
                }
            }
        }
        if let (Some(run), Some(snap)) = (&mut self.o1, o1) {
            run.restore(snap, len);
        }
    }

    /// Whether `truncate` can go back to any earlier length (no recurrent layer, no O(1) plan).
    pub fn can_truncate(&self) -> bool {
        !self.layers.iter().any(LayerState::is_recurrent) && self.o1.is_none()
    }

    /// Room for `extra` more positions in every KV cache without reallocating (a cloned state
    /// holds exactly its length).
    pub fn reserve(&mut self, extra: usize) {
        self.layers.iter_mut().for_each(|l| l.0.reserve(extra));
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
        self.layers.iter_mut().for_each(|l| l.0.clear());
        if let Some(run) = &mut self.o1 {
            if run.reset() {
                seal_all(run, &mut self.layers)
                    .expect("settings were validated when the plan was made; an empty prompt seals no skeleton");
            }
        }
    }

    /// Append to a session file: the length, then every layer's state (`session`).
    pub(crate) fn save(&self, out: &mut Vec<u8>) -> Result<(), String> {
        if self.o1.is_some() {
            return Err("a constant-memory (O(1)) sequence is not saved".into());
        }
        crate::codec::put_u64(out, self.len as u64);
        self.layers.iter().try_for_each(|l| l.0.save(out))
    }

    /// Become what `save` wrote; `self` is a fresh state of the model (its layers' formats).
    pub(crate) fn load(&mut self, r: &mut &[u8]) -> Result<(), String> {
        let len = crate::codec::get_u64(r)? as usize;
        if len > self.n_ctx {
            return Err(format!("{len} positions do not fit the context of {}", self.n_ctx));
        }
        for (il, l) in self.layers.iter_mut().enumerate() {
            l.0.load(r, len).map_err(|e| format!("layer {il}: {e}"))?;
        }
        self.len = len;
        Ok(())
    }

    /// Bytes held by the state (KV caches, recurrent states, O(1) states).
    pub fn bytes(&self) -> usize {
        self.bytes_by_kind().total()
    }

    /// Bytes held by the state, by kind. A sliding layer's bounded cache (sealed by an O(1)
    /// plan) counts as KV.
    pub fn bytes_by_kind(&self) -> StateBytes {
        let plan = StateBytes { o1: self.o1.as_ref().map_or(0, O1Run::bytes), ..StateBytes::default() };
        self.layers.iter().map(LayerState::bytes).fold(plan, |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::mixers::attention::Cache;
    use crate::mixers::gdn::GdnState;
    use crate::mixers::shortconv::ShortConvState;

    /// Fill every layer with `n` positions of kv_dim values each.
    fn fill(st: &mut SeqState, kv_dim: usize, n: usize) {
        for l in &mut st.layers {
            match &mut l.of::<KvState>().cache {
                Cache::Kv { k, v } => {
                    k.resize(n * kv_dim, 1.0);
                    v.resize(n * kv_dim, 1.0);
                }
                Cache::KvF16 { k, v } => {
                    k.resize(n * kv_dim, f16::ONE);
                    v.resize(n * kv_dim, f16::ONE);
                }
                Cache::KvQ8 { .. } | Cache::O1(_) => unreachable!("f32 and f16 dense states only"),
            }
        }
        st.len = n;
    }

    #[test]
    fn f16_cache_holds_half_the_bytes_and_rolls_back() {
        let (layers, kv_dim, n) = (3, 8, 10);
        let mut a = SeqState::with_kv(layers, kv_dim, 64, KvType::F32);
        let mut b = SeqState::with_kv(layers, kv_dim, 64, KvType::F16);
        fill(&mut a, kv_dim, n);
        fill(&mut b, kv_dim, n);
        assert_eq!(a.bytes(), layers * 2 * n * kv_dim * 4);
        assert_eq!(b.bytes(), a.bytes() / 2, "f16 cache: {} bytes vs f32 {}", b.bytes(), a.bytes());
        b.truncate(4);
        assert_eq!(b.bytes(), layers * 2 * 4 * kv_dim * 2);
        b.clear();
        assert_eq!(b.bytes(), 0);
    }

    /// One layer's values to compare: the K cache, or the recurrent matrix / conv history.
    fn values(l: &LayerState) -> Vec<f32> {
        if let Some(kv) = l.get::<KvState>() {
            let Cache::Kv { k, .. } = &kv.cache else { unreachable!("f32 cache") };
            k.clone()
        } else if let Some(g) = l.get::<GdnState>() {
            g.s.clone()
        } else {
            l.get::<ShortConvState>().expect("test layers").conv.clone()
        }
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
            LayerState::new(KvState::new(kv_dim, KvType::F32)),
            LayerState::new(GdnState::new(&cfg)),
            LayerState::new(ShortConvState::new(8, 3)),
        ];
        let mut st = SeqState::from_layers(layers, 64);
        let advance = |st: &mut SeqState, x: f32| {
            for l in &mut st.layers {
                if let Some(kv) = l.get_mut::<KvState>() {
                    let Cache::Kv { k, v } = &mut kv.cache else { unreachable!("f32 cache") };
                    k.extend(std::iter::repeat_n(x, kv_dim));
                    v.extend(std::iter::repeat_n(x, kv_dim));
                } else if let Some(g) = l.get_mut::<GdnState>() {
                    g.s.iter_mut().for_each(|s| *s = *s * 0.5 + x);
                } else {
                    l.of::<ShortConvState>().conv.iter_mut().for_each(|s| *s += x);
                }
            }
            st.len += 1;
        };
        advance(&mut st, 1.0);
        let cp = st.checkpoint();
        let before: Vec<Vec<f32>> = st.layers.iter().map(values).collect();
        advance(&mut st, 2.5);
        advance(&mut st, -1.0);
        assert!(!st.can_truncate());
        st.rollback(cp);
        assert_eq!(st.len, 1);
        let after: Vec<Vec<f32>> = st.layers.iter().map(values).collect();
        assert_eq!(before, after, "rollback must restore every layer exactly");
        st.clear();
        assert_eq!(st.len, 0);
        assert!(values(&st.layers[0]).is_empty());
        assert!(st.layers[1..].iter().all(|l| values(l).iter().all(|&x| x == 0.0)));
        assert_eq!(st.bytes_by_kind().kv, 0);
    }
}

/// Seal layer `il` by the plan `run`: its KV cache (the prompt positions) becomes the sealed
/// O(1) state (`O1Run::sealed`); a layer already sealed stays as it is.
#[cfg_attr(not(feature = "o1"), allow(unreachable_code))]
pub(crate) fn seal_layer(run: &mut O1Run, il: usize, ls: &mut LayerState) -> Result<(), NystromError> {
    let kv = ls.of::<KvState>();
    let widened;
    let (k, v) = match &kv.cache {
        Cache::Kv { k, v } => (&k[..], &v[..]),
        c @ (Cache::KvF16 { .. } | Cache::KvQ8 { .. }) => {
            let (k, v) = c.f32_from(0, 1);
            widened = (k.into_owned(), v.into_owned());
            (&widened.0[..], &widened.1[..])
        }
        Cache::O1(_) => return Ok(()),
    };
    let (sealed, sliding) = run.sealed(il, k, v)?;
    kv.seal(sealed, sliding);
    Ok(())
}

/// Seal every layer the plan seals, now (a plan with tp = 0 seals before the first position).
pub(crate) fn seal_all(run: &mut O1Run, layers: &mut [LayerState]) -> Result<(), NystromError> {
    for (il, ls) in layers.iter_mut().enumerate() {
        if run.seals(il) {
            seal_layer(run, il, ls)?;
        }
    }
    Ok(())
}
