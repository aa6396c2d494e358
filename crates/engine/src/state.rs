//! Per-sequence state: one entry per layer (STYLE principle 9). Dense models have only KV
//! caches (f32, or f16 for half the memory and llama.cpp's cache format); hybrid mixers add
//! their own variants. Callers use `len`, `checkpoint` and `rollback`, never the layer internals.

use half::f16;

/// One layer's state.
pub enum LayerState {
    /// Keys and values of every position so far: each [len, n_kv_heads, head_dim].
    Kv { k: Vec<f32>, v: Vec<f32> },
    /// The same, stored as f16 (llama.cpp's default cache type): half the bytes. Values are
    /// rounded to nearest-even on append, as ggml's f32 -> f16 copy does.
    KvF16 { k: Vec<f16>, v: Vec<f16> },
}

pub struct SeqState {
    pub layers: Vec<LayerState>,
    /// Positions already processed.
    pub len: usize,
    /// Maximum positions this sequence may hold.
    pub n_ctx: usize,
    kv_dim: usize,
}

/// A point to roll a sequence back to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    len: usize,
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
        SeqState { layers, len: 0, n_ctx, kv_dim }
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint { len: self.len }
    }

    /// Forget every position after the checkpoint.
    pub fn rollback(&mut self, cp: Checkpoint) {
        assert!(cp.len <= self.len, "rollback to {} beyond current length {}", cp.len, self.len);
        self.len = cp.len;
        let n = cp.len * self.kv_dim;
        for l in &mut self.layers {
            match l {
                LayerState::Kv { k, v } => {
                    k.truncate(n);
                    v.truncate(n);
                }
                LayerState::KvF16 { k, v } => {
                    k.truncate(n);
                    v.truncate(n);
                }
            }
        }
    }

    /// Keep the first `len` positions (len ≤ self.len).
    pub fn truncate(&mut self, len: usize) {
        self.rollback(Checkpoint { len });
    }

    pub fn clear(&mut self) {
        self.rollback(Checkpoint { len: 0 });
    }

    /// Bytes held by the state (KV caches).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, v } => (k.len() + v.len()) * 4,
                LayerState::KvF16 { k, v } => (k.len() + v.len()) * 2,
            })
            .sum()
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
}
