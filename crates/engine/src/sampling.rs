//! Token sampling: turns one row of logits into the next token id.
//!
//! Owns [`SamplerParams`] (llama.cpp's defaults), [`Sampler`] (the filter chain and the draw),
//! the seeded RNG (xoshiro256**, seeded through splitmix64) and a deterministic `exp`.
//!
//! The chain is llama.cpp's default order, minus the samplers we do not offer (DRY, typical,
//! XTC, top-n-sigma):
//!
//! ```text
//! penalties -> top-k -> top-p -> min-p -> temperature -> softmax -> draw
//! ```
//!
//! * penalties: over the last `repeat_last_n` ids of `history`; a logit `l` of a token seen
//!   `c > 0` times becomes `l / r` if `l > 0`, else `l * r` (llama.cpp, HF), then
//!   `- c * frequency_penalty - presence_penalty`.
//! * top-k keeps the `k` largest logits; top-p keeps the shortest prefix (by logit, descending)
//!   whose softmax mass reaches `p` (softmax over what top-k left, before temperature, as in
//!   llama.cpp); min-p keeps tokens with `exp(l - l_max) >= min_p`. Each keeps at least one token.
//! * temperature `<= 0` (or NaN) means greedy: argmax after penalties, no randomness used.
//!
//! Determinism: equal logits, history, params and seed give equal tokens on every run and every
//! platform with IEEE-754 binary floats (all of Rust's tier-1 targets), whichever SIMD path runs.
//! Every decision that chooses tokens uses only `+ - * /` and comparisons (exactly rounded by
//! IEEE 754, and Rust never fuses them into FMAs), the [`det_exp`] polynomial instead of the
//! platform's libm `exp`, a total order on `(logit descending, id ascending)` for ties, and
//! summation orders written out in the code (never left to the compiler). The platform `ln` is
//! only used to place a *conservative* min-p pre-filter cut whose survivors are then re-checked
//! exactly. Every stochastic call (temperature > 0) consumes exactly one `u64` of the RNG
//! stream, whatever the candidate count, so a stream stays aligned when parameters vary.
//!
//! Where we differ from llama.cpp, on purpose: `-inf` tokens are never candidates (llama.cpp
//! keeps them with p = 0; no draw can tell); softmax masses are f64 (llama.cpp: f32), so a top-p
//! or min-p boundary sitting within ~1e-7 of the threshold can fall the other way; the RNG is
//! xoshiro256** with an inverse-CDF draw, not mt19937 + `std::discrete_distribution`, so a seed
//! does not reproduce llama.cpp's token stream.
//!
//! Bad input never panics: NaN logits count as `-inf`; `+inf` logits win outright (the draw is
//! uniform over the `+inf` tokens, the limit of the softmax); if no token has a logit above
//! `-inf` (or `logits` is empty) the result is token 0; history ids outside the vocabulary are
//! ignored; non-finite or non-positive `repeat_penalty` and non-finite presence/frequency
//! penalties count as "off".
//!
//! Cost at a 262,144-token vocabulary (the hot spot is a handful of passes over the row, so
//! they are vectorised and dispatched at run time, see `cortiq_kernels::rows`): one copy of the logits
//! and a max scan (greedy stops here, ~50 us); top-k then finds its cut with counting passes
//! and runs `select_nth_unstable` on the few tokens above it, never a full sort (~150 us with
//! the defaults); top-p without top-k needs the softmax normaliser over the whole row (one
//! `det_exp` pass) and sorts only the tokens above the narrowest width whose mass reaches p.
//! A very flat row under top-p alone has to sort most of the row, as llama.cpp does too.

pub use cortiq_kernels::rows::det_exp;
use cortiq_kernels::rows::{count_ge, exp_rel_into, mass_ge, rel};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Sampling knobs. `Default` matches llama.cpp's CLI defaults with a fresh random seed.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// Softmax temperature; `<= 0` (or NaN) means greedy argmax.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Nucleus mass to keep; `>= 1` (or NaN) = off.
    pub top_p: f32,
    /// Keep tokens with probability `>= min_p * p_max`; `<= 0` (or NaN) = off.
    pub min_p: f32,
    /// Repetition penalty; 1 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token present in the window; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of every token in the window; 0 = off.
    pub frequency_penalty: f32,
    /// Penalty window: the last `repeat_last_n` ids of the history; 0 disables all penalties
    /// (as llama.cpp's `penalty_last_n = 0`), `usize::MAX` means the whole history.
    pub repeat_last_n: usize,
    /// RNG seed. `Default` draws one from the OS-seeded hasher and the clock.
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        // llama.cpp common_params_sampling: temp 0.8, top_k 40, top_p 0.95, min_p 0.05,
        // penalty_repeat 1.0, penalty_freq 0, penalty_present 0, penalty_last_n 64.
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: random_seed(),
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: argmax of the raw logits, every filter and penalty off, seed 0.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }

    /// True when [`Sampler::sample`] takes the argmax and uses no randomness.
    // The negated comparison is the point: a NaN temperature must mean greedy.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn is_greedy(&self) -> bool {
        !(self.temperature > 0.0)
    }
}

/// A seed that differs between calls and processes (what llama.cpp's `LLAMA_DEFAULT_SEED` asks
/// for). Not cryptographic; taken from std's OS-seeded `RandomState`, the clock and a counter.
pub fn random_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// xoshiro256** (Blackman & Vigna), state filled by splitmix64 from a 64-bit seed.
/// Small, fast, and specified bit-for-bit, so streams are identical on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        // splitmix64 never yields four zeros in a row, so the all-zero state cannot occur.
        Self { s: [next(), next(), next(), next()] }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One candidate token: its (penalised) logit and id.
#[derive(Debug, Clone, Copy)]
struct Cand {
    logit: f32,
    id: u32,
}

/// The chain's total order: larger logit first, then lower id. Logits here are never NaN and
/// never -0.0 (sanitised in `prepare`), so `total_cmp` agrees with `>` and `==`.
#[inline]
fn by_logit_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Result of the scan in `prepare`.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    /// Largest penalised logit (finite), or None when no token is above -inf.
    max: Option<f32>,
    /// Lowest id holding `max` (0 when `max` is None).
    argmax: u32,
}

/// Sum in 8 interleaved lanes combined in a fixed order: vectorisable, still the same
/// rounding on every platform (the order is written out, not left to the compiler).
fn lane_sum(v: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j];
        }
    }
    for (j, &x) in chunks.remainder().iter().enumerate() {
        acc[j] += x;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

/// First index holding `v` (0 if none). Scans 64-wide blocks with a non-short-circuiting
/// compare, which vectorises, and walks only the block that holds it: `position` alone does
/// one compare-and-branch per element (~4x slower at V = 262,144).
/// The largest value of `src` in 8 lanes (vectorises), NaNs skipped (`x > lane` is false for
/// them); -inf when there is none.
fn lane_max(src: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = src.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
        }
    }
    lanes.iter().chain(chunks.remainder()).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

fn first_index_of(src: &[f32], v: f32) -> usize {
    for (bi, block) in src.chunks(64).enumerate() {
        if block.iter().fold(false, |hit, &x| hit | (x == v)) {
            return bi * 64 + block.iter().position(|&x| x == v).unwrap_or(0);
        }
    }
    0
}

/// Draw block: the walk skips whole blocks by their lane sums, then walks one block.
const DRAW_BLOCK: usize = 256;

/// Total of `w` as the draw defines it: block lane sums added in block order.
fn draw_total(w: &[f64]) -> f64 {
    w.chunks(DRAW_BLOCK).map(lane_sum).fold(0.0, |z, s| z + s)
}

/// Index `i` with `cum(i-1) <= u * total < cum(i)` (inverse CDF), `u` in [0, 1).
/// When rounding makes the in-block walk miss, the last positive weight of that block (or of
/// the row) is taken; `w` must hold at least one positive weight.
fn draw_index(w: &[f64], u: f64) -> usize {
    let target = u * draw_total(w);
    let mut cum = 0.0;
    let mut last_positive = 0;
    for (bi, block) in w.chunks(DRAW_BLOCK).enumerate() {
        let s = lane_sum(block);
        if target < cum + s {
            let mut c = cum;
            let mut last_in_block = None;
            for (j, &x) in block.iter().enumerate() {
                c += x;
                if x > 0.0 {
                    last_in_block = Some(j);
                }
                if target < c && x > 0.0 {
                    return bi * DRAW_BLOCK + j;
                }
            }
            if let Some(j) = last_in_block {
                return bi * DRAW_BLOCK + j;
            }
        }
        if let Some(j) = block.iter().rposition(|&x| x > 0.0) {
            last_positive = bi * DRAW_BLOCK + j;
        }
        cum += s;
    }
    last_positive
}

/// Widths (nats below the max) probed for the top-k / top-p gather, narrowest first, by
/// vectorised passes (`count_ge` / `mass_ge`, ~20-100 us each at V = 262,144); past the last,
/// everything is gathered. Probing is cheaper than gathering (and selecting from) more tokens
/// than needed.
const N_PROBE: usize = 7;
const WIDTHS: [f32; N_PROBE] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Gathers of more than this many tokens (and 8 k) for top-k get their width bisected first.
const TOPK_GATHER_SOFT_MAX: usize = 4096;

/// Samples token ids with a fixed [`SamplerParams`] and its own RNG stream.
/// Reuses its buffers across calls; one `Sampler` per sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: Rng,
    /// [V] penalised, sanitised logits.
    scratch: Vec<f32>,
    /// [V] softmax numerators e^(l - max), id order (top-p without top-k only).
    weights: Vec<f64>,
    /// Surviving candidates; see `select` for their order.
    cands: Vec<Cand>,
    /// [n] logits of `cands[..n]`, the input of the temperature kernel.
    cand_l: Vec<f32>,
    /// [n] temperature-scaled numerators of `cands[..n]`.
    cand_w: Vec<f64>,
    /// Sorted copy of the penalty window.
    window: Vec<u32>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let rng = Rng::new(params.seed);
        Self {
            params,
            rng,
            scratch: Vec::new(),
            weights: Vec::new(),
            cands: Vec::new(),
            cand_l: Vec::new(),
            cand_w: Vec::new(),
            window: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Restarts the RNG stream from `seed` (also stored in the params).
    pub fn reseed(&mut self, seed: u64) {
        self.params.seed = seed;
        self.rng = Rng::new(seed);
    }

    /// Picks the next token from `logits` ([V]); `history` is every token so far (prompt and
    /// generated; only its last `repeat_last_n` matter).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        if self.params.is_greedy() && !self.penalized(history) {
            // What `prepare` would find, without copying the row: the first index of the
            // largest non-NaN logit (-0.0 and +0.0 compare equal either way), 0 if none.
            let max = lane_max(logits);
            return if max == f32::NEG_INFINITY { 0 } else { first_index_of(logits, max) as u32 };
        }
        let prep = self.prepare(logits, history);
        if self.params.is_greedy() {
            return prep.argmax;
        }
        // Drawn before anything can return early, so each stochastic call uses one u64.
        let u = self.rng.next_f64();
        let Some(max) = prep.max else { return 0 };
        if self.is_full_row() {
            // No filter: weights straight over the row, the index is the id (-inf weighs 0).
            let inv_t = 1.0 / self.params.temperature as f64;
            exp_rel_into(&self.scratch, max, inv_t, &mut self.cand_w);
            return draw_index(&self.cand_w, u) as u32;
        }
        let n = self.select(max);
        self.temperature_weights(n, max);
        self.cands[draw_index(&self.cand_w, u)].id
    }

    /// True when no filter is active and the draw runs over the whole row.
    // Negated comparisons on purpose: NaN top_p / min_p mean "off", as in `select`.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn is_full_row(&self) -> bool {
        let p = &self.params;
        let k_on = p.top_k > 0 && p.top_k < self.scratch.len();
        !k_on && !(p.top_p < 1.0) && !(p.min_p > 0.0)
    }

    /// The distribution `sample` would draw from: `(id, probability)` for every surviving
    /// candidate, most likely first (ties: lower id first). Greedy params give `[(argmax, 1)]`.
    /// Does not advance the RNG. Allocates; meant for tests, debugging and speculative decoding.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        let prep = self.prepare(logits, history);
        let Some(max) = prep.max else { return vec![(0, 1.0)] };
        if self.params.is_greedy() {
            return vec![(prep.argmax, 1.0)];
        }
        let n = self.select(max);
        self.temperature_weights(n, max);
        let z = draw_total(&self.cand_w);
        let mut out: Vec<(Cand, f64)> = self.cands[..n].iter().copied().zip(self.cand_w.iter().map(|&w| w / z)).collect();
        out.sort_unstable_by(|a, b| by_logit_desc(&a.0, &b.0));
        out.into_iter().map(|(c, p)| (c.id, p as f32)).collect()
    }

    /// `cand_w[i] = e^((l_i - max) / T)` for the first `n` candidates.   [n]
    fn temperature_weights(&mut self, n: usize, max: f32) {
        let inv_t = 1.0 / self.params.temperature as f64;
        self.cand_l.clear();
        self.cand_l.extend(self.cands[..n].iter().map(|c| c.logit));
        exp_rel_into(&self.cand_l, max, inv_t, &mut self.cand_w);
    }

    /// The repeat, frequency and presence penalties as applied (non-finite or invalid: off).
    fn penalties(&self) -> (f32, f32, f32) {
        let p = &self.params;
        let rp = if p.repeat_penalty.is_finite() && p.repeat_penalty > 0.0 { p.repeat_penalty } else { 1.0 };
        let fp = if p.frequency_penalty.is_finite() { p.frequency_penalty } else { 0.0 };
        let pp = if p.presence_penalty.is_finite() { p.presence_penalty } else { 0.0 };
        (rp, fp, pp)
    }

    /// Whether any penalty changes a logit of this row.
    fn penalized(&self, history: &[u32]) -> bool {
        let (rp, fp, pp) = self.penalties();
        self.params.repeat_last_n > 0 && !history.is_empty() && (rp != 1.0 || fp != 0.0 || pp != 0.0)
    }

    /// Copies `logits` into `scratch` with NaN -> -inf and -0.0 -> +0.0, applies the
    /// penalties, resolves +inf, and finds the max and (lowest-id) argmax.
    fn prepare(&mut self, logits: &[f32], history: &[u32]) -> Prepared {
        let p = &self.params;
        self.scratch.clear();
        // `x + 0.0` turns -0.0 into +0.0 so ties order the same in `>` and `total_cmp`.
        self.scratch.extend(logits.iter().map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x + 0.0 }));

        let (rp, fp, pp) = self.penalties();
        if self.penalized(history) {
            let start = history.len().saturating_sub(p.repeat_last_n);
            self.window.clear();
            self.window.extend_from_slice(&history[start..]);
            self.window.sort_unstable();
            for run in self.window.chunk_by(|a, b| a == b) {
                let count = run.len() as f32;
                let Some(l) = self.scratch.get_mut(run[0] as usize) else { continue };
                // llama.cpp: `logit <= 0 ? logit * r : logit / r`, then the additive terms.
                let mut v = if *l <= 0.0 { *l * rp } else { *l / rp };
                v -= count * fp + pp;
                *l = if v.is_nan() { f32::NEG_INFINITY } else { v + 0.0 };
            }
        }

        // Max in 8 lanes (no NaN is left), then the first index holding it.
        let mut max = lane_max(&self.scratch);
        if max == f32::NEG_INFINITY {
            return Prepared { max: None, argmax: 0 };
        }
        let argmax = first_index_of(&self.scratch, max) as u32;
        if max == f32::INFINITY {
            // The softmax limit: all mass split evenly over the +inf tokens.
            for l in &mut self.scratch {
                *l = if *l == f32::INFINITY { 0.0 } else { f32::NEG_INFINITY };
            }
            max = 0.0;
        }
        Prepared { max: Some(max), argmax }
    }

    /// The top-k cut: a logit `c` such that at least k tokens have `l >= c` (or -inf), found
    /// by counting passes over `WIDTHS`, then bisected while the gather would be much larger
    /// than k (flat rows). Only exact integer counts decide, so the cut is deterministic.
    fn top_k_cut(&self, max: f32, k: usize) -> f32 {
        let soft_max = TOPK_GATHER_SOFT_MAX.max(8 * k);
        let mut below = 0.0f32; // a width known to hold fewer than k tokens (or 0)
        for &w in &WIDTHS {
            let c = count_ge(&self.scratch, max - w);
            if c < k {
                below = w;
                continue;
            }
            let (mut above, mut c) = (w, c);
            // Flat row: shrink the width while the gather stays >= k.
            for _ in 0..8 {
                if c <= soft_max {
                    break;
                }
                let mid = 0.5 * (below + above);
                let cm = count_ge(&self.scratch, max - mid);
                if cm >= k {
                    (above, c) = (mid, cm);
                } else {
                    below = mid;
                }
            }
            return max - above;
        }
        f32::NEG_INFINITY
    }

    /// Runs top-k -> top-p -> min-p on `scratch`; leaves the survivors in `cands[..n]` and
    /// returns n >= 1. `cands[..n]` is sorted by `by_logit_desc` whenever top-k or top-p is
    /// active, otherwise in id order (avoids sorting up to the whole vocabulary).
    fn select(&mut self, max: f32) -> usize {
        let p = &self.params;
        let vocab = self.scratch.len();
        let k_on = p.top_k > 0 && p.top_k < vocab;
        let p_on = p.top_p < 1.0; // NaN -> off
        let min_p = if p.min_p > 0.0 { (p.min_p as f64).min(1.0) } else { 0.0 }; // NaN -> off
        let m_on = min_p > 0.0;
        let top_p = p.top_p as f64;
        let top_k = p.top_k;
        // Conservative logit cut for min-p (platform ln, minus a margin); exact test below.
        // The margin covers ln's last-ulp differences and f32 rounding of `max + ln` (4 ulps
        // of max); the exact test is `det_exp(l - max) >= min_p` below.
        let minp_cut = if m_on { max + (min_p.ln() as f32) - (1e-3 + max.abs() * 5e-7) } else { f32::NEG_INFINITY };
        // top-p after top-k normalises over the whole top-k set, including tokens min-p will
        // drop later, so in that case min-p must not shrink the gather.
        let use_minp_cut = !(k_on && p_on);

        // With top-k off, top-p's softmax normaliser spans every token.   weights: [V]
        let mut z_all = 0.0;
        if p_on && !k_on {
            exp_rel_into(&self.scratch, max, 1.0, &mut self.weights);
            z_all = draw_total(&self.weights);
        }

        // Gather cut. top-k fixes it once; top-p takes the narrowest probe width whose mass
        // reaches p (the walk below re-checks exactly and widens on a rounding miss).
        let k_cut = if k_on { self.top_k_cut(max, top_k) } else { f32::NEG_INFINITY };
        let mut wi = N_PROBE; // top-p: index into WIDTHS, N_PROBE = everything
        if p_on && !k_on {
            wi = 0;
            while wi < N_PROBE
                && mass_ge(&self.scratch, &self.weights, max - WIDTHS[wi]) < top_p * z_all
                && !(use_minp_cut && minp_cut >= max - WIDTHS[wi])
            {
                wi += 1;
            }
        }
        loop {
            // `complete`: every token that could survive the chain is in the gather (no wider
            // round could change the result).
            let (mut cut, mut complete) = if k_on {
                (k_cut, true)
            } else if p_on && wi < N_PROBE {
                (max - WIDTHS[wi], false)
            } else {
                (f32::NEG_INFINITY, true)
            };
            if use_minp_cut && minp_cut >= cut {
                // Tokens below the min-p cut can never be kept.
                cut = minp_cut;
                complete = true;
            }

            self.cands.clear();
            for (i, &l) in self.scratch.iter().enumerate() {
                if l >= cut && l > f32::NEG_INFINITY {
                    self.cands.push(Cand { logit: l, id: i as u32 });
                }
            }

            let mut sorted = false;
            if k_on {
                // The gather is an upper set of logits holding >= k tokens (or all of them).
                if self.cands.len() > top_k {
                    self.cands.select_nth_unstable_by(top_k - 1, by_logit_desc);
                    self.cands.truncate(top_k);
                }
                self.cands.sort_unstable_by(by_logit_desc);
                sorted = true;
            }

            let mut n = self.cands.len();
            if p_on {
                if !sorted {
                    self.cands.sort_unstable_by(by_logit_desc);
                    sorted = true;
                }
                let z = if k_on { self.cands.iter().map(|c| det_exp(rel(c.logit, max))).sum() } else { z_all };
                let mut cum = 0.0f64;
                let mut reached = None;
                for (i, c) in self.cands.iter().enumerate() {
                    cum += det_exp(rel(c.logit, max)) / z;
                    if cum >= top_p {
                        reached = Some(i + 1);
                        break;
                    }
                }
                match reached {
                    Some(len) => n = len,
                    None if !complete => {
                        wi += 1; // rounding: the mass pass said yes, the walk no; widen
                        continue;
                    }
                    None => {}
                }
            }

            if m_on {
                if sorted {
                    // Sorted descending: min-p keeps a prefix; the max (ratio 1) always stays.
                    let keep = self.cands[..n].iter().position(|c| det_exp(rel(c.logit, max)) < min_p).unwrap_or(n);
                    n = keep.max(1);
                } else {
                    self.cands.truncate(n);
                    self.cands.retain(|c| det_exp(rel(c.logit, max)) >= min_p);
                    n = self.cands.len();
                }
            }
            // The max token is always gathered and survives every filter, so n >= 1.
            debug_assert!(n >= 1);
            return n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_index_inverts_the_cdf() {
        // 600 weights spanning three draw blocks; check every boundary and zero weights.
        let mut w = vec![0.0f64; 600];
        w[10] = 1.0;
        w[300] = 2.0;
        w[599] = 1.0;
        assert_eq!(draw_index(&w, 0.0), 10);
        assert_eq!(draw_index(&w, 0.2499), 10);
        assert_eq!(draw_index(&w, 0.25), 300);
        assert_eq!(draw_index(&w, 0.7499), 300);
        assert_eq!(draw_index(&w, 0.75), 599);
        assert_eq!(draw_index(&w, 0.9999999), 599);
    }

    #[test]
    fn rng_reference_stream() {
        // splitmix64(0) first outputs, from Vigna's reference splitmix64.c.
        let mut x = 0u64;
        let mut sm = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        assert_eq!(sm(), 0xE220_A839_7B1D_CDAF);
        let mut r = Rng::new(0);
        let a: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        let mut r2 = Rng::new(0);
        let b: Vec<u64> = (0..4).map(|_| r2.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
    }
}
