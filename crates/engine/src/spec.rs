//! Speculative decoding's drafters (issue 13): what proposes the tokens a k-position verify
//! (`Model::forward_verify`) then checks, and the `Speculator` a generation loop drives: the
//! drafter, the draft length bounds and their adaptation, the verify's journal and the
//! drafted/accepted counts. The drafters: n-gram (prompt lookup, as llama.cpp's
//! `ngram-simple`), a draft model, and the target's own MTP block.
//!
//! A drafter sees the sequence's whole token history (prompt and generated text) and proposes
//! up to `n_max` next tokens; its draft changes only how many positions one forward verifies,
//! never which tokens come out (sample-and-match keeps a drafted token only where the
//! target's own sample, on its own logits, equals it).
//!
//! Written by hand: the lookup runs once per decode step on the engine thread, so it must cost
//! O(1) per new token (an index updated incrementally), not a scan of the history.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::{Logits, Model, VerifyJournal};
use crate::state::{LayerState, SeqState};

/// Proposes the next tokens of a sequence from its history.
pub trait Drafter {
    /// Up to `n_max` tokens expected to follow `history` (empty: no guess, decode plainly).
    /// `history` is the accepted text (prompt and tokens kept so far): it grows between calls;
    /// a rejected draft never entered it.
    fn draft(&mut self, history: &[u32], n_max: usize) -> Vec<u32>;

    /// `draft` for a drafter that reads the target model itself (its MTP heads); the others
    /// ignore it.
    fn draft_for(&mut self, _target: &Model, history: &[u32], n_max: usize) -> Vec<u32> {
        self.draft(history, n_max)
    }

    /// Whether the drafter reads the target's final hidden states: then every target forward
    /// is followed by `observe` with the rows of the positions it kept.
    fn wants_hidden(&self) -> bool {
        false
    }

    /// The target's final-normed hidden rows [n, d_model] of the next n positions kept, in
    /// order from the sequence's start.
    fn observe(&mut self, _hidden: &[f32], _d_model: usize) {}

    /// The target's sequence starts over (its state was cleared).
    fn reset(&mut self) {}
}

/// Multi-token prediction: the target's own MTP block (Qwen3-Next / Qwen3.5) drafts from the
/// last kept position's hidden state and the token about to be fed, chained for k > 1 on its
/// own output (`Model::mtp_forward`). Its attention cache holds one entry per position of the
/// sequence (h_p with x_{p+1}); before a draft the positions observed since the last one
/// enter it in one chunk, and the chained entries are cut off after the draft.
pub struct MtpDrafter {
    block: usize,
    state: Option<LayerState>,
    /// Positions in the MTP cache.
    entered: usize,
    /// Hidden rows of positions entered.. (observed, not yet in the cache).
    pending: Vec<f32>,
    /// Positions observed.
    seen: usize,
}

impl MtpDrafter {
    /// Drafts with MTP block `block` of the target.
    pub fn new(block: usize) -> MtpDrafter {
        MtpDrafter { block, state: None, entered: 0, pending: Vec::new(), seen: 0 }
    }
}

impl Drafter for MtpDrafter {
    fn draft(&mut self, _history: &[u32], _n_max: usize) -> Vec<u32> {
        Vec::new() // MTP drafts from the target: `draft_for`
    }

    fn draft_for(&mut self, target: &Model, history: &[u32], n_max: usize) -> Vec<u32> {
        let (d, l) = (target.cfg.d_model, history.len().saturating_sub(1));
        // The target holds positions 0..l; its rows must all have been observed.
        if n_max == 0 || l == 0 || self.seen != l || self.block >= target.mtp.len() {
            return Vec::new();
        }
        let state = self.state.get_or_insert_with(|| target.new_mtp_state(self.block));
        // Positions entered..l with their next tokens; the last one's logits give the draft.
        let Ok((mut h, mut logits)) =
            target.mtp_forward(self.block, &history[self.entered + 1..=l], &self.pending, self.entered, state)
        else {
            return Vec::new();
        };
        self.entered = l;
        self.pending.clear();
        let mut out = Vec::with_capacity(n_max);
        loop {
            let (id, _) = top_token(&logits);
            out.push(id);
            if out.len() == n_max {
                break;
            }
            let last = h[h.len() - d..].to_vec();
            match target.mtp_forward(self.block, &[id], &last, l + out.len() - 1, state) {
                Ok(r) => (h, logits) = r,
                Err(_) => break,
            }
        }
        // The chained entries came from drafted tokens: only the sequence's own stay.
        state.truncate(l);
        out
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, hidden: &[f32], d_model: usize) {
        self.pending.extend_from_slice(hidden);
        self.seen += hidden.len() / d_model;
    }

    fn reset(&mut self) {
        *self = MtpDrafter::new(self.block);
    }
}

/// Prompt lookup: the most recent earlier occurrence of the history's last `n` tokens gives
/// the draft (the tokens that followed it there), for n from `n_max_match` down to
/// `n_min_match`: the longest match wins, ties to the most recent occurrence. Text with no
/// repeat of at least `n_min_match` tokens yields no draft, so it costs nothing.
#[derive(Debug)]
pub struct NgramDrafter {
    n_min_match: usize,
    n_max_match: usize,
    /// Per match length n (index n - n_min_match): n-gram -> the position just after its most
    /// recent occurrence that ends before the history's last token.
    index: Vec<HashMap<Vec<u32>, usize>>,
    /// The history the index was built over (a prefix of every later call's history, else the
    /// index is rebuilt).
    seen: Vec<u32>,
}

impl NgramDrafter {
    /// A drafter matching n-grams of `n_min_match..=n_max_match` tokens (both at least 1).
    pub fn new(n_min_match: usize, n_max_match: usize) -> NgramDrafter {
        let n_min_match = n_min_match.max(1);
        let n_max_match = n_max_match.max(n_min_match);
        NgramDrafter { n_min_match, n_max_match, index: vec![HashMap::new(); n_max_match - n_min_match + 1], seen: Vec::new() }
    }

    /// Brings the index up to `h`: every n-gram `h[p - n..p]` for p in 1..=h.len() maps to p
    /// (its continuation's start), a later occurrence overwriting an earlier one. Growth costs
    /// work per new token; a history that is not an extension of the last one (cut back, replaced:
    /// rare, as drafts enter the history only once accepted) rebuilds the index.
    fn update(&mut self, h: &[u32]) {
        if !h.starts_with(&self.seen) {
            self.index.iter_mut().for_each(HashMap::clear);
            self.seen.clear();
        }
        let (from, to) = (self.seen.len(), h.len());
        for end in (from + 1)..=to {
            for (i, map) in self.index.iter_mut().enumerate() {
                let n = self.n_min_match + i;
                if end >= n {
                    map.insert(h[end - n..end].to_vec(), end);
                }
            }
        }
        self.seen.extend_from_slice(&h[from..]);
    }
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, history: &[u32], n_max: usize) -> Vec<u32> {
        if n_max == 0 || history.is_empty() {
            return Vec::new();
        }
        // Index the n-grams whose continuation exists (ending at len - 1 at the latest); the
        // suffix itself, ending at len, is the key and must not find itself.
        self.update(&history[..history.len() - 1]);
        let len = history.len();
        for n in (self.n_min_match..=self.n_max_match.min(len - 1)).rev() {
            let key = &history[len - n..];
            if let Some(&at) = self.index[n - self.n_min_match].get(key) {
                return history[at..(at + n_max).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

/// Drafted and accepted tokens so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Tokens proposed and verified.
    pub drafted: usize,
    /// Of those, kept (the target sampled the same token).
    pub accepted: usize,
    /// Verify forwards run (decode steps that checked a draft).
    pub verifies: usize,
}

/// How a sequence speculates (the CLI's and the server's settings, per request): the drafter
/// and the draft length bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecParams {
    pub method: SpecMethod,
    /// Tokens per draft at most.
    pub n_max: usize,
    /// Drafts shorter than this are not verified (a plain step instead).
    pub n_min: usize,
}

/// Which drafter proposes the tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SpecMethod {
    /// Prompt lookup (`NgramDrafter`) with matches of `min..=max` tokens.
    Ngram { min: usize, max: usize },
    /// A smaller model sharing the target's vocabulary (`ModelDrafter`), drafting greedily
    /// while its top token's probability is at least `p_min`.
    Draft { p_min: f32 },
    /// The target's own first MTP block (`MtpDrafter`).
    Mtp,
}

/// The defaults of `cortiq run --spec` and of a server request asking for n-gram drafts: up
/// to 16 tokens per draft, matches of 3 to 8 tokens.
pub const DEFAULT_N_MAX: usize = 16;
pub const DEFAULT_NGRAM_MIN: usize = 3;
pub const DEFAULT_NGRAM_MAX: usize = 8;

impl SpecParams {
    /// N-gram drafts with the default bounds.
    pub fn ngram() -> SpecParams {
        SpecParams {
            method: SpecMethod::Ngram { min: DEFAULT_NGRAM_MIN, max: DEFAULT_NGRAM_MAX },
            n_max: DEFAULT_N_MAX,
            n_min: 0,
        }
    }

    /// A fresh speculator for one sequence; `draft` is the draft model (`SpecMethod::Draft`
    /// needs one; checked against the target by `check_draft_vocab` when it was loaded).
    pub fn speculator(&self, draft: Option<&Arc<Model>>, n_ctx: usize) -> Result<Speculator, SpecError> {
        let drafter: Box<dyn Drafter + Send> = match self.method {
            SpecMethod::Ngram { min, max } => Box::new(NgramDrafter::new(min, max)),
            SpecMethod::Draft { p_min } => {
                let m = draft.ok_or(SpecError::NoDraftModel)?;
                Box::new(ModelDrafter::new(m.clone(), n_ctx, p_min))
            }
            SpecMethod::Mtp => Box::new(MtpDrafter::new(0)),
        };
        Ok(Speculator::new(drafter, self.n_max, self.n_min))
    }
}

/// Why speculation cannot be set up.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("draft-model speculation needs a draft model (--spec-draft MODEL)")]
    NoDraftModel,
    #[error("the draft model's vocabulary differs from the target's: {0}")]
    Vocab(String),
}

/// A draft model proposes tokens by greedy decoding of its own copy of the sequence: before
/// each draft its state is brought up to the history (cut back to the part it shares with it,
/// then the new tokens in one chunk), then it decodes up to n tokens, stopping early where its
/// top token's probability falls below `p_min`. A KV cache keeps the drafted tokens (what the
/// target accepts is then already in it); a recurrent draft model rolls back to the history
/// after each draft (a checkpoint), so what the target keeps is fed again next time. Written
/// by hand: it is the draft loop of the product's speculation.
pub struct ModelDrafter {
    model: Arc<Model>,
    state: SeqState,
    /// The tokens in `state`, in order.
    fed: Vec<u32>,
    p_min: f32,
}

impl ModelDrafter {
    /// A drafter over `model` with a context of `n_ctx` positions (the target's).
    pub fn new(model: Arc<Model>, n_ctx: usize, p_min: f32) -> ModelDrafter {
        let state = model.new_state(n_ctx);
        ModelDrafter { model, state, fed: Vec::new(), p_min }
    }

    /// The draft model's logits after `history` (its state brought up to it), or None where
    /// it cannot follow (an error of its own: then no draft, plain decoding goes on).
    fn sync(&mut self, history: &[u32]) -> Option<Vec<f32>> {
        let common = self.fed.iter().zip(history).take_while(|(a, b)| a == b).count();
        if common < self.fed.len() || common == history.len() {
            // Cut back (or the history did not grow: its last token is fed again for logits).
            let keep = common.min(history.len() - 1);
            if self.state.can_truncate() {
                self.state.truncate(keep);
                self.fed.truncate(keep);
            } else {
                self.state.clear();
                self.fed.clear();
            }
        }
        let new = &history[self.fed.len()..];
        match self.model.prefill(new, &mut self.state, 512) {
            Ok(logits) => {
                self.fed.extend_from_slice(new);
                Some(logits)
            }
            Err(_) => {
                // The state may have moved part way: start over at the next draft.
                self.state.clear();
                self.fed.clear();
                None
            }
        }
    }
}

impl Drafter for ModelDrafter {
    fn draft(&mut self, history: &[u32], n_max: usize) -> Vec<u32> {
        if n_max == 0 || history.is_empty() || history.len() + n_max >= self.state.n_ctx {
            return Vec::new();
        }
        let Some(mut logits) = self.sync(history) else { return Vec::new() };
        // A cache that truncates keeps the drafted tokens it was fed (the next sync cuts back
        // to what the target kept); a recurrent one goes back to the history.
        let cp = (!self.state.can_truncate()).then(|| self.state.checkpoint());
        let mut out = Vec::with_capacity(n_max);
        while out.len() < n_max {
            let (id, p) = top_token(&logits);
            if p < self.p_min {
                break;
            }
            out.push(id);
            if out.len() == n_max {
                break;
            }
            match self.model.forward(&[id], &mut self.state, Logits::Last) {
                Ok(l) => {
                    logits = l;
                    self.fed.push(id);
                }
                Err(_) => break,
            }
        }
        if let Some(cp) = cp {
            self.state.rollback(cp);
            self.fed.truncate(history.len());
        }
        out
    }
}

/// The most likely token of a logits row and its softmax probability.
fn top_token(logits: &[f32]) -> (u32, f32) {
    let (mut best, mut max) = (0usize, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > max {
            (best, max) = (i, v);
        }
    }
    let z: f32 = logits.iter().map(|&v| (v - max).exp()).sum();
    (best as u32, 1.0 / z)
}

/// The draft model must speak the target's vocabulary: the same ids for the same bytes.
/// `target` and `draft` give each id's bytes; `n` ids are compared (the tokenizers' size).
pub fn check_draft_vocab(
    n_target: usize,
    n_draft: usize,
    target: &dyn Fn(u32) -> Vec<u8>,
    draft: &dyn Fn(u32) -> Vec<u8>,
) -> Result<(), SpecError> {
    if n_target != n_draft {
        return Err(SpecError::Vocab(format!("{n_draft} tokens against the target's {n_target}")));
    }
    match (0..n_target as u32).find(|&id| target(id) != draft(id)) {
        None => Ok(()),
        Some(id) => Err(SpecError::Vocab(format!(
            "token {id} is {:?} in the draft model, {:?} in the target",
            String::from_utf8_lossy(&draft(id)),
            String::from_utf8_lossy(&target(id))
        ))),
    }
}

/// One sequence's speculation: its drafter, the draft length bounds, the verify's journal and
/// the counts. The draft length adapts to what is accepted: it doubles (up to `n_max`) after a
/// draft kept whole and falls to one more than what was kept after a rejection, so text the
/// drafter guesses badly pays for short drafts only; after drafts rejected outright the next
/// 1, 3, 7, .. (at most 31) steps decode plainly, so a drafter that keeps missing (novel text,
/// an untrained MTP head) costs next to nothing.
pub struct Speculator {
    drafter: Box<dyn Drafter + Send>,
    n_max: usize,
    n_min: usize,
    /// The current bound on the draft length (adaptive, within n_min.max(1)..=n_max).
    cap: usize,
    /// Steps left to decode without drafting, and the length of the last such pause.
    skip: usize,
    backoff: usize,
    pub(crate) journal: VerifyJournal,
    pub stats: SpecStats,
    /// The tokens already in the sequence's state before the next generation's prompt (a chat
    /// turn that continues the conversation's state): the drafter sees them as history.
    prior: Vec<u32>,
}

impl Speculator {
    /// Drafts of at most `n_max` tokens; shorter than `n_min` ones are not verified (a plain
    /// step instead).
    pub fn new(drafter: Box<dyn Drafter + Send>, n_max: usize, n_min: usize) -> Speculator {
        let n_min = n_min.min(n_max);
        let journal = VerifyJournal::default();
        Speculator {
            drafter,
            n_max,
            n_min,
            cap: n_max,
            skip: 0,
            backoff: 0,
            journal,
            stats: SpecStats::default(),
            prior: Vec::new(),
        }
    }

    /// The draft to verify after `history` (its last token the one about to be fed), at most
    /// `room` tokens, cut before any id outside the target's `vocab`: empty when the drafter
    /// has none or fewer than n_min. A draft returned is verified: it is counted as drafted.
    pub(crate) fn draft(&mut self, target: &Model, history: &[u32], room: usize) -> Vec<u32> {
        let (n, vocab) = (self.cap.min(room), target.cfg.vocab);
        if self.skip > 0 {
            self.skip -= 1;
            return Vec::new();
        }
        if n == 0 || n < self.n_min {
            return Vec::new();
        }
        let mut d = self.drafter.draft_for(target, history, n);
        d.truncate(n);
        if let Some(bad) = d.iter().position(|&t| t as usize >= vocab) {
            d.truncate(bad);
        }
        if d.len() < self.n_min.max(1) {
            return Vec::new();
        }
        self.stats.drafted += d.len();
        self.stats.verifies += 1;
        d
    }

    /// The next generation continues a state that already holds `tokens` (its prompt comes
    /// after them): the drafter's history starts with them. A generation on an empty state
    /// starts the drafter over instead.
    pub fn set_prior(&mut self, tokens: &[u32]) {
        self.prior = tokens.to_vec();
    }

    /// The history before the prompt, and the drafter started over when the state is empty.
    pub(crate) fn begin(&mut self, state_len: usize) -> Vec<u32> {
        // An empty state, or one whose tokens were not given: the drafter starts over (an MTP
        // head, which must have seen every position, then stays silent: plain decoding).
        if state_len == 0 || self.prior.len() != state_len {
            self.drafter.reset();
            self.prior.clear();
        }
        self.prior.clone()
    }

    /// Whether the target's hidden rows must be handed to `observe`.
    pub(crate) fn wants_hidden(&self) -> bool {
        self.drafter.wants_hidden()
    }

    /// The target kept these positions (their final-normed hidden rows, [n, d_model]).
    pub(crate) fn observe(&mut self, hidden: &[f32], d_model: usize) {
        self.drafter.observe(hidden, d_model);
    }

    /// The sampler drew the next drafted token.
    pub(crate) fn accept_one(&mut self) {
        self.stats.accepted += 1;
    }

    /// A verify of `drafted` tokens kept `accepted` of them: the next draft's length bound.
    pub(crate) fn adapt(&mut self, drafted: usize, accepted: usize) {
        let lo = self.n_min.max(1);
        self.cap = if accepted == drafted { (2 * self.cap).min(self.n_max) } else { (accepted + 1).clamp(lo, self.n_max) };
        if accepted == 0 {
            self.backoff = (2 * self.backoff + 1).min(31);
            self.skip = self.backoff;
        } else {
            self.backoff = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lookup by brute force: longest n first, the most recent earlier occurrence.
    fn brute(history: &[u32], n_min: usize, n_max_match: usize, n_max: usize) -> Vec<u32> {
        let len = history.len();
        if n_max == 0 || len == 0 {
            return Vec::new();
        }
        for n in (n_min..=n_max_match.min(len - 1)).rev() {
            let key = &history[len - n..];
            // occurrences ending at end < len
            for end in (n..len).rev() {
                if &history[end - n..end] == key {
                    return history[end..(end + n_max).min(len)].to_vec();
                }
            }
        }
        Vec::new()
    }

    /// The vocabulary check names the first id whose bytes differ, or the sizes.
    #[test]
    fn draft_vocab_must_match() {
        let a = |id: u32| format!("t{id}").into_bytes();
        let b = |id: u32| if id == 7 { b"seven".to_vec() } else { format!("t{id}").into_bytes() };
        assert_eq!(check_draft_vocab(10, 10, &a, &a), Ok(()));
        let e = check_draft_vocab(10, 10, &a, &b).unwrap_err().to_string();
        assert!(e.contains("token 7") && e.contains("seven") && e.contains("t7"), "{e}");
        let e = check_draft_vocab(10, 12, &a, &a).unwrap_err().to_string();
        assert!(e.contains("12 tokens") && e.contains("10"), "{e}");
    }

    #[test]
    fn repeats_are_drafted_and_novel_text_is_not() {
        let mut d = NgramDrafter::new(2, 4);
        // "a b c d e ... a b c" -> continue with "d e"
        let h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(d.draft(&h, 2), vec![4, 5]);
        assert_eq!(d.draft(&h, 8), vec![4, 5, 9, 9, 1, 2, 3]);
        let mut d = NgramDrafter::new(2, 4);
        assert!(d.draft(&[1, 2, 3, 4, 5, 6, 7], 8).is_empty(), "no repeat, no draft");
        assert!(d.draft(&[], 8).is_empty() && d.draft(&[1], 8).is_empty());
        assert!(d.draft(&[1, 2, 1, 2], 0).is_empty(), "n_max 0");
    }

    /// The longest match wins over a more recent shorter one.
    #[test]
    fn the_longest_match_wins() {
        let mut d = NgramDrafter::new(1, 3);
        // ...7 8 9 [5] ... 8 9 [6] ... 7 8 9 -> the 3-gram "7 8 9" continues with 5
        let h = [7, 8, 9, 5, 0, 8, 9, 6, 0, 7, 8, 9];
        assert_eq!(d.draft(&h, 1), vec![5]);
        let mut d = NgramDrafter::new(1, 2);
        assert_eq!(d.draft(&h, 1), vec![6], "with 2-grams at most, the most recent \"8 9\"");
    }

    /// The incremental index gives the brute-force answer at every step of growing histories
    /// (small vocabularies: many repeats), also when the history is cut back (a rejected
    /// draft) or replaced.
    #[test]
    fn incremental_lookup_equals_brute_force() {
        let mut s = 0x5EED_1234_ABCD_0001u64;
        let mut next = |m: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % m) as u32
        };
        for (vocab, n_min, n_max_match) in [(3, 1, 3), (5, 2, 4), (20, 1, 2), (2, 3, 6)] {
            let mut d = NgramDrafter::new(n_min, n_max_match);
            let mut h: Vec<u32> = Vec::new();
            for step in 0..400 {
                match next(10) {
                    0 if h.len() > 3 => {
                        let cut = h.len() - 1 - next(3) as usize;
                        h.truncate(cut);
                    }
                    1 if step % 97 == 0 => h = (0..next(30)).map(|_| next(vocab as u64)).collect(),
                    _ => h.push(next(vocab as u64)),
                }
                let n_max = next(6) as usize;
                assert_eq!(
                    d.draft(&h, n_max),
                    brute(&h, n_min, n_max_match, n_max),
                    "vocab {vocab} n {n_min}..={n_max_match} step {step} history {h:?}"
                );
            }
        }
    }
}
