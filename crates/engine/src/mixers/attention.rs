//! Softmax attention as a mixer, in all its variants: exact or sliding-window, an f32 or f16
//! KV cache, and the sealed O(1) state an `o1` plan turns a cache into at the end of the prompt
//! (`mixers::nystrom`'s operator). Owns the layer's per-sequence state (`KvState`) and its
//! operations (truncate, reserve, clear, bytes). The attention arithmetic itself is the shared
//! block in `blocks.rs` (projections, QK-norm, RoPE, the softmax kernels, the O(1) hook).

use half::f16;

use crate::mixers::MixerState;
use crate::mixers::nystrom::O1Layer;
use crate::state::StateBytes;

/// What an attention layer keeps of a sequence.
#[derive(Clone)]
pub enum Cache {
    /// Keys and values of every position so far: each [len, n_kv_heads, head_dim].
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The same, stored as f16 (llama.cpp's default cache type): half the bytes. Values are
    /// rounded to nearest-even on append, as ggml's f32 -> f16 copy does.
    KvF16 { k: Vec<f16>, v: Vec<f16> },
    /// Sealed at the end of the prompt by an O(1) plan: sinks, a window ring and the Nyström
    /// skeleton's accumulators, constant size.
    O1(Box<O1Layer>),
}

/// An attention layer's per-sequence state: the cache, its row width and format (what `clear`
/// returns to), and whether a seal made it a sliding layer's bounded cache.
#[derive(Clone)]
pub struct KvState {
    pub cache: Cache,
    /// Values per position in `k` and in `v` (n_kv_heads · head_dim).
    row: usize,
    f16: bool,
    /// Sealed as a sliding layer's window (counts as KV in `bytes`, not as O(1) state).
    sliding: bool,
}

impl KvState {
    /// An empty cache of `row` values per position, f16 or f32.
    pub fn new(row: usize, f16: bool) -> KvState {
        KvState { cache: KvState::empty(f16), row, f16, sliding: false }
    }

    fn empty(f16: bool) -> Cache {
        if f16 { Cache::KvF16 { k: Vec::new(), v: Vec::new() } } else { Cache::Kv { k: Vec::new(), v: Vec::new() } }
    }

    /// Replace the cache by its sealed O(1) state (`o1::O1Run::seal`); `sliding`: a sliding
    /// layer's bounded window rather than a planned layer.
    pub(crate) fn seal(&mut self, sealed: O1Layer, sliding: bool) {
        self.cache = Cache::O1(Box::new(sealed));
        self.sliding = sliding;
    }
}

impl MixerState for KvState {
    fn is_recurrent(&self) -> bool {
        matches!(self.cache, Cache::O1(_))
    }

    fn truncate(&mut self, len: usize) {
        let n = len * self.row;
        match &mut self.cache {
            Cache::Kv { k, v } => {
                k.truncate(n);
                v.truncate(n);
            }
            Cache::KvF16 { k, v } => {
                k.truncate(n);
                v.truncate(n);
            }
            Cache::O1(_) => unreachable!("a sealed O(1) state is recurrent: a checkpoint snapshots it"),
        }
    }

    fn reserve(&mut self, extra: usize) {
        let n = extra * self.row;
        match &mut self.cache {
            Cache::Kv { k, v } => {
                k.reserve(n);
                v.reserve(n);
            }
            Cache::KvF16 { k, v } => {
                k.reserve(n);
                v.reserve(n);
            }
            Cache::O1(_) => {}
        }
    }

    /// Back to an empty cache in the layer's format (a sealed layer too: an O(1) plan seals
    /// it again at the next prompt's end).
    fn clear(&mut self) {
        self.cache = KvState::empty(self.f16);
        self.sliding = false;
    }

    fn bytes(&self) -> StateBytes {
        match &self.cache {
            Cache::Kv { k, v } => StateBytes { kv: (k.len() + v.len()) * 4, ..StateBytes::default() },
            Cache::KvF16 { k, v } => StateBytes { kv: (k.len() + v.len()) * 2, ..StateBytes::default() },
            Cache::O1(o) if self.sliding => StateBytes { kv: o.bytes(), ..StateBytes::default() },
            Cache::O1(o) => StateBytes { o1: o.bytes(), ..StateBytes::default() },
        }
    }
}
