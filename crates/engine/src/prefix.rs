//! The prompt-state cache: the states of prompt prefixes kept in RAM, so that a request whose
//! prompt starts with a cached prefix processes only the rest. It holds dense KV caches,
//! sliding-window caches, MLA caches and recurrent states (GatedDeltaNet, KDA, short conv)
//! alike, through the state API only (`SeqState::checkpoint` / `rollback` / `truncate`):
//! an entry is a prefix's whole state plus checkpoints (recurrent snapshots) at earlier points
//! of it, so a prompt that leaves the cached one part-way resumes from the last checkpoint
//! before the point where they part. Bounded in bytes (every byte of every entry counted,
//! checkpoints shared between entries counted once), least recently used out first.
//!
//! Written here rather than taken from a crate: what is cached, where, and how it is restored
//! is the serving core's (principle 14), and it must keep the determinism contract:
//!
//! **Served from the cache == served cold, bit for bit.** The cache only ever holds a state a
//! cold prefill of that prefix computes, and restores it where a cold prefill passes through
//! the same values. That rests on one property of the forward, which tests/prefix.rs checks on
//! every fixture and real model: *a prompt's values do not depend on where its prefill is cut
//! into calls, as long as every call starts at a multiple of the model's grid
//! (`Model::cut_grid`: [`GRID`] with GatedDeltaNet or KDA layers, else 1) and spans two to
//! [`MAX_CALL`] positions.* The conditions are where it fails otherwise: the delta-rule kernels
//! (GatedDeltaNet, KDA) chunk by `GRID` from a call's start; a one-position call takes the
//! decode product, whose summation order differs from the multi-row product's; and under fast
//! numerics an interleaved matrix multiplies up to `MAX_CALL` positions with its decode kernel
//! and more with the integer matmat, whose values differ (by up to ~0.3 in Qwen2.5-Coder's
//! logits: another rounding of the same integer products, amplified over 24 layers). Calls
//! of at most 256 positions cost no prefill speed (Qwen2.5-Coder-0.5B Q4_K_M, 2 threads,
//! 2048 positions: 335-343 tok/s in calls of 256 vs 305-334 in calls of 512). So
//! [`next_cut`] cuts every prefill that way (cold or cached, `Model::prefill` too), entries and
//! checkpoints sit at grid points, and a restored request still computes at least its last two
//! positions.
//!
//! Positions a generation decoded are not reused as they are: a decode step's values differ
//! from a prefill's in the last bits (one-row products, the recurrence instead of the chunked
//! form), so a conversation's next turn built on them would not equal the same request sent
//! cold. The scheduler prefills a finished generation's tokens again while it is idle
//! instead, and caches that (the next turn then processes only its new tokens, exactly).
//!
//! Constant-memory sequences: before the seal at the end of their prompt, a StreamingLLM plan's
//! layers are exact attention's KV caches, so such a sequence restores a plain prefix (its
//! plan kept) and leaves its prompt's entry as the plain state it equals; the seal then runs
//! as cold. Not cached: Nyström skeleton plans (the prompt's query sums per landmark depend on
//! the plan's own prompt length and are not in a cached prefix) and llama.cpp numerics (its
//! matmul order depends on the call's length, so the property fails).

use std::collections::HashSet;
use std::sync::Arc;

use crate::Result;
use crate::model::{Logits, Model};
use crate::state::{Checkpoint, SeqState};

/// Where prefill calls may start and the cache may restore in a model with delta-rule layers
/// (their kernels' chunk); other models restore anywhere (a grid of 1).
pub const GRID: usize = cortiq_kernels::delta::CHUNK;

/// The most positions one prefill call takes: up to here an interleaved matrix multiplies with
/// its decode kernel, beyond with another product (module doc).
pub const MAX_CALL: usize = crate::qtensor::IL_MATMAT_MAX;
const _: () = assert!(MAX_CALL.is_multiple_of(GRID));

/// What to keep of the state at a prefill call's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    Nothing,
    /// A checkpoint (every `CacheConfig::every` positions of a long prompt).
    Checkpoint,
    /// The prompt's cache entry: the last grid point a continuation can restore (at least two
    /// positions before the prompt's end).
    Entry,
}

/// One prefill call: positions `done..end`, then `keep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub end: usize,
    pub keep: Keep,
}

/// The last point of the `grid` at least two positions before `len` (0 when there is none):
/// where a prompt of `len` positions leaves its cache entry.
pub fn entry_point(len: usize, grid: usize) -> usize {
    len.saturating_sub(2) / grid * grid
}

/// The next prefill call of a sequence of `len` positions with `done` of them in the state:
/// up to the next multiple (absolute positions) of `chunk` (rounded up to the grid, at most
/// [`MAX_CALL`]), of `every` (checkpoints; None: none), the entry point (when `entry`: the
/// prompt is cached), or the end, whichever comes first — never leaving a single position for
/// a call (a cut that would moves on). The calls thus depend on the positions alone, and from
/// a grid point every one of them starts on the grid and spans two to `MAX_CALL` positions
/// (one for a one-token prompt), which makes the values independent of the cuts (module doc).
/// A state that ends off the grid (a chat's next turn on top of its decoded answer) gets on
/// it at its first cut.
pub fn next_cut(done: usize, len: usize, chunk: usize, every: Option<usize>, entry: bool, grid: usize) -> Cut {
    debug_assert!(done < len && MAX_CALL.is_multiple_of(grid));
    let round = |n: usize| n.max(1).div_ceil(grid) * grid;
    // The first multiple of m at least two positions on.
    let next_multiple = |m: usize| (done + 2).div_ceil(m) * m;
    let entry = if entry { entry_point(len, grid) } else { 0 };
    let mut end = len;
    // A cut leaves two positions or more before the end and before the entry point.
    let mut fit = |c: usize| {
        if c >= done + 2 && c + 2 <= len && (entry == 0 || c >= entry || c + 2 <= entry) {
            end = end.min(c);
        }
    };
    let m = round(chunk).min(MAX_CALL);
    let mut c = next_multiple(m);
    // At most MAX_CALL positions: from off the grid, and where the end is one position past
    // the multiple (the call would run to the end), one grid step back; likewise one position
    // before the entry point (a grid of 1).
    if c - done > MAX_CALL || (c + 2 > len && len - done > MAX_CALL) || c + 1 == entry {
        c -= grid;
    }
    fit(c);
    if let Some(e) = every {
        fit(next_multiple(round(e)));
    }
    fit(entry);
    let keep = if end == entry && end > 0 {
        Keep::Entry
    } else if every.is_some_and(|e| end < len && end.is_multiple_of(round(e))) {
        Keep::Checkpoint
    } else {
        Keep::Nothing
    };
    Cut { end, keep }
}

/// The cache's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes the cache holds at most (`--cache-ram`).
    pub ram: usize,
    /// A checkpoint every this many positions of a prompt (rounded up to the grid), so that a
    /// prompt leaving a cached one part-way resumes near where they part.
    pub every: usize,
}

/// A cached entry seen from outside: its tokens, the state after them, its checkpoints.
pub type EntryView<'a> = (&'a [u32], &'a SeqState, &'a [Arc<Checkpoint>]);

/// Whose prefixes an entry holds: a request restores only its own scope's entries (the
/// server's `--cache-scope key` gives each API key its own, so one tenant's prompts, and the
/// timing and `cached_tokens` that would show them, are never another's). One byte budget and
/// one LRU order over all scopes.
pub type Scope = u64;

/// The scope every request shares unless the server separates them.
pub const SHARED: Scope = 0;

/// What a restore found: the positions now in the state, and the checkpoints up to there (the
/// requesting sequence's entry inherits them, shared).
pub struct Restored {
    pub len: usize,
    pub checkpoints: Vec<Arc<Checkpoint>>,
    /// Positions the prompt shares with the entry restored (≥ len): where they part.
    pub common: usize,
}

struct Entry {
    scope: Scope,
    tokens: Vec<u32>,
    /// The state after `tokens`.
    state: SeqState,
    /// Snapshots at grid points before `tokens.len()`, ascending (none for a state that can be
    /// truncated: it restores anywhere on the grid).
    checkpoints: Vec<Arc<Checkpoint>>,
    /// The state's and tokens' bytes (checkpoints are counted apart, once each).
    own: usize,
    used: u64,
}

impl Entry {
    /// The furthest point of this entry a prompt with `common` positions in common with it can
    /// restore, leaving at least two positions of its `len` to compute.
    fn reach(&self, common: usize, len: usize) -> usize {
        let cap = common.min(len.saturating_sub(2));
        if cap >= self.tokens.len() {
            self.tokens.len()
        } else if self.state.can_truncate() {
            cap / self.state.grid() * self.state.grid()
        } else {
            self.checkpoints.iter().map(|c| c.len()).filter(|&l| l <= cap).max().unwrap_or(0)
        }
    }
}

/// Whether every point an entry of `tokens` with `checkpoints` restores, `big` restores too
/// (with the same values: `big`'s tokens start with these).
fn covers(big: &Entry, tokens: &[u32], checkpoints: &[Arc<Checkpoint>]) -> bool {
    covers_parts(&big.tokens, big.state.can_truncate(), &big.checkpoints, tokens, checkpoints)
}

/// `covers` for an entry not built yet: its tokens, whether its state truncates, its
/// checkpoints.
fn covers_parts(
    big: &[u32],
    truncatable: bool,
    big_checkpoints: &[Arc<Checkpoint>],
    tokens: &[u32],
    checkpoints: &[Arc<Checkpoint>],
) -> bool {
    let n = tokens.len();
    if n > big.len() || big[..n] != tokens[..] {
        return false;
    }
    if truncatable || n == big.len() {
        return true;
    }
    let theirs: HashSet<usize> = big_checkpoints.iter().map(|c| c.len()).collect();
    theirs.contains(&n) && checkpoints.iter().all(|c| theirs.contains(&c.len()))
}

/// The cache: entries, least recently used out first once the bytes pass `CacheConfig::ram`.
pub struct PrefixCache {
    cfg: CacheConfig,
    entries: Vec<Entry>,
    bytes: usize,
    clock: u64,
}

impl PrefixCache {
    pub fn new(cfg: CacheConfig) -> PrefixCache {
        PrefixCache { cfg, entries: Vec::new(), bytes: 0, clock: 0 }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    /// Bytes held: every entry's state and tokens, and each checkpoint once.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Cached prefixes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Make `state` the state of the longest prefix of `prompt` the cache can restore (leaving
    /// at least two positions to compute), keeping its `n_ctx`; None (state untouched) when no
    /// entry shares a restorable prefix.
    pub fn restore(&mut self, prompt: &[u32], state: &mut SeqState) -> Option<Restored> {
        self.restore_in(SHARED, prompt, state)
    }

    /// `restore` from `scope`'s entries only.
    pub fn restore_in(&mut self, scope: Scope, prompt: &[u32], state: &mut SeqState) -> Option<Restored> {
        if !state.cacheable() {
            return None;
        }
        let (mut best, mut reach, mut common) = (None, 0, 0);
        for (i, e) in self.entries.iter().enumerate().filter(|(_, e)| e.scope == scope) {
            let c = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
            let r = e.reach(c, prompt.len());
            if r > reach || (r == reach && r > 0 && best.is_some_and(|b: usize| e.used > self.entries[b].used)) {
                (best, reach, common) = (Some(i), r, c);
            }
        }
        let i = best?;
        self.clock += 1;
        let e = &mut self.entries[i];
        e.used = self.clock;
        // An O(1) sequence keeps its plan: before the seal its caches are a plain one's.
        let o1 = state.o1.take();
        state.copy_from(&e.state);
        if reach < e.tokens.len() {
            if state.can_truncate() {
                state.truncate(reach);
            } else {
                let cp = e.checkpoints.iter().find(|c| c.len() == reach).expect("reach is a checkpoint");
                state.rollback_to(cp);
            }
        }
        state.o1 = o1;
        let checkpoints = e.checkpoints.iter().filter(|c| c.len() <= reach).cloned().collect();
        Some(Restored { len: reach, checkpoints, common })
    }

    /// Cache `state` as the state after `tokens` (a grid point), with the checkpoints taken on
    /// the way. Entries it covers go; it is not stored when one covers it or it alone exceeds
    /// the budget. Returns how many entries left to make room (least recently used first).
    pub fn insert(&mut self, tokens: &[u32], state: &SeqState, checkpoints: Vec<Arc<Checkpoint>>) -> usize {
        self.insert_in(SHARED, tokens, state, checkpoints)
    }

    /// `insert` into `scope` (only its entries cover or are covered by the new one).
    pub fn insert_in(&mut self, scope: Scope, tokens: &[u32], state: &SeqState, checkpoints: Vec<Arc<Checkpoint>>) -> usize {
        debug_assert_eq!(tokens.len(), state.len);
        if !state.cacheable() {
            return 0;
        }
        // The entry holds the plain state: an O(1) sequence before its seal is cached as the
        // plain one it equals. Coverage is checked before the copy (a covering entry is only
        // touched).
        let truncatable = state.layers.iter().all(|l| !l.is_recurrent());
        let checkpoints = if truncatable { Vec::new() } else { checkpoints };
        self.clock += 1;
        if let Some(old) = self.entries.iter_mut().find(|e| e.scope == scope && covers(e, tokens, &checkpoints)) {
            old.used = self.clock;
            return 0;
        }
        let plan = state.o1().map_or(0, |r| r.bytes());
        let own = state.bytes() - plan + std::mem::size_of_val(tokens) + std::mem::size_of::<Entry>();
        let cps: usize = checkpoints.iter().map(|c| c.bytes()).sum();
        if own + cps > self.cfg.ram || tokens.is_empty() {
            return 0;
        }
        // Room first, then the copy: the process never holds the full budget and the new
        // entry at once (the entries it covers go, then the least recently used ones).
        let before = self.entries.len();
        self.entries.retain(|e| e.scope != scope || !covers_parts(tokens, truncatable, &checkpoints, &e.tokens, &e.checkpoints));
        self.recount();
        let mut evicted = 0;
        while !self.entries.is_empty() && self.bytes + own + self.unheld(&checkpoints) > self.cfg.ram {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].used).expect("not empty");
            self.entries.swap_remove(lru);
            evicted += 1;
            self.recount();
        }
        if self.entries.len() < before {
            // The freed entries' pages go back to the kernel (the process keeps freed memory
            // for the forward pass otherwise: `cortiq_kernels::mem`).
            cortiq_kernels::mem::release_freed_memory();
        }
        let plain = SeqState { layers: state.layers.clone(), len: state.len, n_ctx: state.n_ctx, o1: None, grid: state.grid };
        self.entries.push(Entry { scope, tokens: tokens.to_vec(), state: plain, checkpoints, own, used: self.clock });
        self.recount();
        debug_assert!(self.bytes <= self.cfg.ram, "room was made before the entry went in");
        evicted
    }

    /// Bytes of those `checkpoints` that no entry holds yet (what storing them adds).
    fn unheld(&self, checkpoints: &[Arc<Checkpoint>]) -> usize {
        let held: HashSet<*const Checkpoint> = self.entries.iter().flat_map(|e| e.checkpoints.iter().map(Arc::as_ptr)).collect();
        checkpoints
            .iter()
            .filter(|c| !held.contains(&Arc::as_ptr(c)))
            .map(|c| c.bytes() + std::mem::size_of::<Checkpoint>())
            .sum()
    }

    /// The entry sharing the longest prefix with `tokens` (a conversation to save): its tokens,
    /// state and checkpoints.
    pub fn best_for(&self, tokens: &[u32]) -> Option<EntryView<'_>> {
        self.best_for_in(SHARED, tokens)
    }

    /// `best_for` among `scope`'s entries.
    pub fn best_for_in(&self, scope: Scope, tokens: &[u32]) -> Option<EntryView<'_>> {
        let common = |e: &Entry| e.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let e = self.entries.iter().filter(|e| e.scope == scope && common(e) > 0).max_by_key(|e| (common(e), e.used))?;
        Some((&e.tokens, &e.state, &e.checkpoints))
    }

    /// Drop every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        cortiq_kernels::mem::release_freed_memory();
    }

    fn recount(&mut self) {
        let mut seen = HashSet::new();
        let mut bytes = 0;
        for e in &self.entries {
            bytes += e.own;
            for c in &e.checkpoints {
                if seen.insert(Arc::as_ptr(c)) {
                    bytes += c.bytes() + std::mem::size_of::<Checkpoint>();
                }
            }
        }
        self.bytes = bytes;
    }
}

/// A cached prefill's bookkeeping: the checkpoints taken on the way, which the prompt's entry
/// takes along (shared with the entry it started from).
#[derive(Default)]
pub struct Filling {
    scope: Scope,
    checkpoints: Vec<Arc<Checkpoint>>,
    /// The last grid point the prompt shares with the entry it restored, past the checkpoint
    /// it restored: a checkpoint there lets the next prompt that parts at the same place (the
    /// same system prompt or document, another question) restore all of it.
    branch: Option<usize>,
}

impl Filling {
    /// Start a prefill of `prompt` (state cleared by the caller): the state becomes the longest
    /// cached prefix; returns the bookkeeping and the positions restored (0: none).
    pub fn start(cache: &mut PrefixCache, prompt: &[u32], state: &mut SeqState) -> (Filling, usize) {
        Filling::start_in(cache, SHARED, prompt, state)
    }

    /// `start` in `scope`: restored from its entries, the prompt's own cached there.
    pub fn start_in(cache: &mut PrefixCache, scope: Scope, prompt: &[u32], state: &mut SeqState) -> (Filling, usize) {
        let Some(r) = cache.restore_in(scope, prompt, state) else { return (Filling { scope, ..Filling::default() }, 0) };
        let mut checkpoints = r.checkpoints;
        let recurrent = state.layers.iter().any(|l| l.is_recurrent());
        // The entry this prompt leaves must restore where this one started, too.
        if recurrent && checkpoints.last().is_none_or(|c| c.len() < r.len) {
            checkpoints.push(Arc::new(state.plain_checkpoint()));
        }
        let g = state.grid();
        let branch = (r.common.min(prompt.len().saturating_sub(2)) / g * g).max(r.len);
        let branch = (recurrent && branch > r.len).then_some(branch);
        (Filling { scope, checkpoints, branch }, r.len)
    }

    /// The next prefill call ([`next_cut`]), cut short at the branch point (a checkpoint).
    pub fn cut(&self, done: usize, len: usize, chunk: usize, every: Option<usize>, grid: usize) -> Cut {
        let c = next_cut(done, len, chunk, every, true, grid);
        match self.branch {
            Some(b) if done < b && b < c.end && b >= done + 2 => Cut { end: b, keep: Keep::Checkpoint },
            _ => c,
        }
    }

    /// After a call that ended at `tokens.len()` (the state's length), keep what the cut says:
    /// a checkpoint, or the entry. Returns the entries evicted to make room.
    pub fn after(&mut self, cache: &mut PrefixCache, keep: Keep, tokens: &[u32], state: &SeqState) -> usize {
        match keep {
            Keep::Checkpoint if state.layers.iter().any(|l| l.is_recurrent()) => {
                self.checkpoints.push(Arc::new(state.plain_checkpoint()));
                0
            }
            Keep::Entry => cache.insert_in(self.scope, tokens, state, self.checkpoints.clone()),
            _ => 0,
        }
    }
}

/// Prefill `prompt` into `state` through `cache` (None: cold, the same cuts without the
/// entry): the longest cached prefix restored, the rest computed in [`next_cut`] calls of at
/// most `chunk` positions, its checkpoints and entry cached. Returns the logits of the last
/// position and the positions reused. `state` is cleared first. The tests' prefill path; the
/// scheduler takes the same cuts step by step.
pub fn prefill(
    model: &Model,
    mut cache: Option<&mut PrefixCache>,
    prompt: &[u32],
    state: &mut SeqState,
    chunk: usize,
) -> Result<(Vec<f32>, usize)> {
    state.clear();
    let (mut fill, mut done) = match cache.as_deref_mut() {
        Some(c) => Filling::start(c, prompt, state),
        None => (Filling::default(), 0),
    };
    let reused = done;
    let every = cache.as_deref().map(|c| c.config().every);
    let mut logits = Vec::new();
    while done < prompt.len() {
        let cut = match cache {
            Some(_) => fill.cut(done, prompt.len(), chunk, every, state.grid()),
            None => next_cut(done, prompt.len(), chunk, every, false, state.grid()),
        };
        let want = if cut.end == prompt.len() { Logits::Last } else { Logits::None };
        logits = model.forward(&prompt[done..cut.end], state, want)?;
        done = cut.end;
        if let Some(c) = cache.as_deref_mut() {
            fill.after(c, cut.keep, &prompt[..done], state);
        }
    }
    Ok((logits, reused))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls of a prefill from `start`.
    fn cuts(start: usize, len: usize, chunk: usize, every: Option<usize>, entry: bool) -> Vec<Cut> {
        cuts_on(start, len, chunk, every, entry, GRID)
    }

    fn cuts_on(start: usize, len: usize, chunk: usize, every: Option<usize>, entry: bool, grid: usize) -> Vec<Cut> {
        let mut out = Vec::new();
        let mut done = start;
        while done < len {
            let c = next_cut(done, len, chunk, every, entry, grid);
            assert!(c.end > done, "progress from {done}");
            out.push(c);
            done = c.end;
        }
        out
    }

    #[test]
    fn cuts_start_on_the_grid_and_span_two_positions() {
        for grid in [1, GRID] {
            for len in 1usize..600 {
                for chunk in [1, 16, 40, 64, 256, 512] {
                    for (every, entry) in [(None, false), (None, true), (Some(16), true), (Some(50), true), (Some(128), true)] {
                        for start in (0..len.saturating_sub(1)).step_by(if grid == 1 { 7 } else { grid }) {
                            let mut done = start;
                            let mut entries = 0;
                            for c in cuts_on(start, len, chunk, every, entry, grid) {
                                assert!(done % grid == 0, "call from {done} (len {len}, chunk {chunk})");
                                assert!(c.end - done >= 2 || len == 1, "call {done}..{} of {len}", c.end);
                                assert!(c.end - done <= MAX_CALL, "call {done}..{} of {len}", c.end);
                                if c.keep == Keep::Entry {
                                    assert_eq!(c.end, entry_point(len, grid));
                                    entries += 1;
                                }
                                done = c.end;
                            }
                            assert_eq!(done, len);
                            let want = usize::from(entry && entry_point(len, grid) >= start + 2);
                            assert_eq!(entries, want, "len {len} start {start}: one entry point past the start");
                        }
                    }
                }
            }
        }
        // From off the grid (a chat's next turn on its decoded answer): on the grid after the
        // first call, which spans 2 to MAX_CALL positions.
        for len in 300usize..800 {
            for start in [1, 15, 17, 254, 255, 257] {
                for chunk in [16, 256] {
                    let all = cuts(start, len, chunk, None, false);
                    let mut done = start;
                    for (i, c) in all.iter().enumerate() {
                        assert!(i == 0 || done % GRID == 0, "call {i} from {done}");
                        assert!((2..=MAX_CALL).contains(&(c.end - done)), "call {done}..{} of {len}", c.end);
                        done = c.end;
                    }
                }
            }
        }
        // A 100-position prompt in chunks of 64 with checkpoints every 32: 32, 64 (the chunk's
        // end, a checkpoint), the entry at 96, then the last 4.
        let ends: Vec<(usize, Keep)> = cuts(0, 100, 64, Some(32), true).iter().map(|c| (c.end, c.keep)).collect();
        assert_eq!(ends, [(32, Keep::Checkpoint), (64, Keep::Checkpoint), (96, Keep::Entry), (100, Keep::Nothing)]);
        // 65 positions in chunks of 64: not 64 + 1, but 48 (the entry point) + 17.
        let ends: Vec<usize> = cuts(0, 65, 64, None, true).iter().map(|c| c.end).collect();
        assert_eq!(ends, [48, 65]);
        // Uncached, 65 in chunks of 64 is one call (no call of one position).
        let ends: Vec<usize> = cuts(0, 65, 64, None, false).iter().map(|c| c.end).collect();
        assert_eq!(ends, [65]);
        // Without delta-rule layers (a grid of 1) the entry is two positions before the end.
        let ends: Vec<usize> = cuts_on(0, 65, 64, None, true, 1).iter().map(|c| c.end).collect();
        assert_eq!(ends, [63, 65]);
    }
}
