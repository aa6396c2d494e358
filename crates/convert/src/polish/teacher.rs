//! The polish's teacher: the original model in the engine with exact numerics and full exact
//! attention, scoring one window per call. Only the rows the loss reads (from T/2, the scored
//! half after the sealed prompt) are computed through the LM head; the prompt rows of the
//! returned `[T, V]` are zeros, which the trainer never reads. Validation windows repeat at
//! every validation, so their scored rows are cached ([`CachedTeacher`]).

use std::collections::HashMap;

use cortiq_engine::{Logits, Model};

/// Positions per engine forward call (as `ppl`'s default batch).
const CHUNK: usize = 512;

/// Exact teacher logits `[T, V]` of `tokens`, rows before `score_from` zero.
pub fn teacher_logits(model: &Model, tokens: &[u32], score_from: usize) -> cortiq_engine::Result<Vec<f32>> {
    let (t, v) = (tokens.len(), model.cfg.vocab);
    let mut st = model.new_state(t);
    let mut z = vec![0f32; score_from.min(t) * v];
    z.reserve((t - score_from.min(t)) * v);
    for (ci, c) in tokens.chunks(CHUNK).enumerate() {
        let (c0, c1) = (ci * CHUNK, ci * CHUNK + c.len());
        let want = if c1 <= score_from { Logits::None } else { Logits::From(score_from.saturating_sub(c0)) };
        z.extend(model.forward(c, &mut st, want)?); // [rows scored in this chunk, V]
    }
    debug_assert_eq!(z.len(), t * v);
    Ok(z)
}

/// The teacher over windows seen again and again (validation): scored rows kept per window.
pub struct CachedTeacher<'m> {
    pub model: &'m Model,
    pub score_from: usize,
    cache: HashMap<Vec<u32>, Vec<f32>>,
}

impl<'m> CachedTeacher<'m> {
    pub fn new(model: &'m Model, score_from: usize) -> Self {
        CachedTeacher { model, score_from, cache: HashMap::new() }
    }

    /// `[T, V]` logits of `tokens` (rows before `score_from` zero), from the cache when seen.
    pub fn logits(&mut self, tokens: &[u32]) -> cortiq_engine::Result<Vec<f32>> {
        let v = self.model.cfg.vocab;
        let s0 = self.score_from.min(tokens.len());
        if !self.cache.contains_key(tokens) {
            let z = teacher_logits(self.model, tokens, s0)?;
            self.cache.insert(tokens.to_vec(), z[s0 * v..].to_vec());
        }
        let rows = &self.cache[tokens];
        let mut z = vec![0f32; s0 * v];
        z.extend_from_slice(rows);
        Ok(z)
    }
}
