//! Perplexity exactly as llama.cpp's llama-perplexity computes it, so figures compare: the text
//! is tokenized once (with BOS when the model adds one), cut into non-overlapping chunks of
//! n_ctx tokens, each chunk's first token replaced by BOS when the model adds one, and only the
//! second half of each chunk is scored (the first n_ctx/2 positions are context). The error
//! estimate is llama.cpp's: sqrt((mean(nll²) − mean(nll)²) / (count − 1)) · ppl.
//!
//! With an O(1) plan (`PplOptions::o1`, issue 5) every chunk starts a fresh sequence whose
//! first `tp` positions are the exact prompt; the plan seals there and the rest of the chunk is
//! served by the streaming steps (tp = n_ctx/2 by default: every scored token past the seal).
//! The plan's check mode runs each chunk in one forward call through the matrix form instead.
//!
//! [`perplexity_vs`] scores the same chunks with a base model beside (exact attention, the
//! same batches): the mean KL(base ‖ model) per scored token and the top-1 agreement, as
//! llama-perplexity's `--kl-divergence` reports them.

use crate::error::{EngineError, Result};
use crate::model::{Logits, Model};
use crate::o1::{O1Plan, O1Stats};
use crate::state::{SeqState, StateBytes};

#[derive(Clone, Copy, Debug)]
pub struct PplOptions {
    pub n_ctx: usize,
    /// Chunks to score; None = all whole chunks in the text.
    pub n_chunks: Option<usize>,
    /// Positions per forward call (llama.cpp's -b).
    pub n_batch: usize,
    /// Replaces the first token of every chunk when the model adds BOS.
    pub bos: Option<u32>,
    /// O(1)-memory decode per chunk (tp < n_ctx), or its matrix-form check.
    pub o1: Option<O1Plan>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PplResult {
    pub ppl: f64,
    pub stderr: f64,
    /// Scored tokens.
    pub count: usize,
    pub chunks: usize,
    /// What the O(1) guard did over all chunks (with a plan).
    pub o1: Option<O1Stats>,
    /// The largest per-sequence state at the end of a chunk.
    pub state_bytes: StateBytes,
}

/// −log softmax(logits)[target], in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
    -(logits[target as usize] as f64 - m - s.ln())
}

/// How far a model's next-token distributions are from a base model's on the scored tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlStats {
    /// Mean KL(base ‖ model) per scored token, nats, and its standard error.
    pub kl: f64,
    pub kl_stderr: f64,
    /// Fraction of scored positions where both models' most likely token is the same.
    pub top1: f64,
    /// The base model's perplexity on the same tokens.
    pub base_ppl: f64,
}

/// KL(p ‖ q) of two logit rows (softmax of each), in f64.
pub fn kl_logits(p: &[f32], q: &[f32]) -> f64 {
    let lse = |l: &[f32]| {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
    };
    let (lp, lq) = (lse(p), lse(q));
    p.iter()
        .zip(q)
        .map(|(&a, &b)| {
            let la = a as f64 - lp;
            la.exp() * (la - (b as f64 - lq))
        })
        .sum::<f64>()
        .max(0.0)
}

fn argmax(l: &[f32]) -> usize {
    l.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0
}

/// Score `tokens`; `progress(chunk_done, n_chunks, running_ppl)` after each chunk.
pub fn perplexity(
    model: &Model,
    tokens: &[u32],
    opt: &PplOptions,
    progress: &mut dyn FnMut(usize, usize, f64),
) -> Result<PplResult> {
    Ok(score(model, None, tokens, opt, progress)?.0)
}

/// [`perplexity`] with `base` run on the same chunks (exact, no O(1) plan): the model's
/// result and its [`KlStats`] against the base. The vocabularies must match.
pub fn perplexity_vs(
    model: &Model,
    base: &Model,
    tokens: &[u32],
    opt: &PplOptions,
    progress: &mut dyn FnMut(usize, usize, f64),
) -> Result<(PplResult, KlStats)> {
    if base.cfg.vocab != model.cfg.vocab {
        return Err(EngineError::BadConfig {
            file: "ppl".into(),
            what: format!("the base model's vocabulary ({}) is not the model's ({})", base.cfg.vocab, model.cfg.vocab),
        });
    }
    let (r, kl) = score(model, Some(base), tokens, opt, progress)?;
    Ok((r, kl.expect("a base was given")))
}

/// The chunk through `model` in batches of `n_batch` positions: logits[i] for chunk positions
/// `first..` (collected across batches).
fn scored_logits(model: &Model, chunk: &[u32], state: &mut SeqState, n_batch: usize, first: usize) -> Result<Vec<f32>> {
    let n_ctx = chunk.len();
    let mut logits: Vec<f32> = Vec::with_capacity((n_ctx - first) * model.cfg.vocab);
    for bs in (0..n_ctx).step_by(n_batch) {
        let be = (bs + n_batch).min(n_ctx);
        let want = if be > first { Logits::From(first.saturating_sub(bs)) } else { Logits::None };
        logits.extend(model.forward(&chunk[bs..be], state, want)?);
    }
    Ok(logits)
}

fn score(
    model: &Model,
    base: Option<&Model>,
    tokens: &[u32],
    opt: &PplOptions,
    progress: &mut dyn FnMut(usize, usize, f64),
) -> Result<(PplResult, Option<KlStats>)> {
    let n_ctx = opt.n_ctx;
    if n_ctx < 4 {
        return Err(EngineError::BadConfig { file: "ppl".into(), what: format!("context {n_ctx} is too small to score") });
    }
    let max_chunks = tokens.len() / n_ctx;
    let n_chunks = opt.n_chunks.map_or(max_chunks, |c| c.min(max_chunks));
    if n_chunks == 0 {
        return Err(EngineError::ContextOverflow {
            what: "perplexity needs at least one whole chunk; the text".into(),
            n_tokens: tokens.len(),
            n_ctx,
        });
    }
    let first = n_ctx / 2;
    let vocab = model.cfg.vocab;
    let mut n_batch = opt.n_batch.max(1);
    if let Some(p) = &opt.o1 {
        if p.tp() >= n_ctx {
            return Err(EngineError::BadConfig {
                file: "ppl".into(),
                what: format!("--o1-prefill {} must be below the context {n_ctx}", p.tp()),
            });
        }
        if p.checks() {
            // The matrix form recomputes the whole window per call.
            n_batch = n_ctx;
        }
    }
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    let mut o1_stats = opt.o1.map(|_| O1Stats::default());
    let mut state_bytes = StateBytes::default();
    // Σ KL, Σ KL², top-1 agreements, Σ base NLL.
    let (mut kl, mut kl2, mut same, mut base_sum) = (0f64, 0f64, 0usize, 0f64);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = opt.bos {
            chunk[0] = b;
        }
        let mut state = match opt.o1 {
            Some(plan) => model.new_state_o1(n_ctx, plan)?,
            None => model.new_state(n_ctx),
        };
        let logits = scored_logits(model, &chunk, &mut state, n_batch, first)?;
        if let (Some(acc), Some(s)) = (&mut o1_stats, state.o1_stats()) {
            *acc += s;
        }
        let b = state.bytes_by_kind();
        if b.total() > state_bytes.total() {
            state_bytes = b;
        }
        let base_logits = match base {
            Some(b) => Some(scored_logits(b, &chunk, &mut b.new_state(n_ctx), n_batch, first)?),
            None => None,
        };
        for i in 0..n_ctx - 1 - first {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let v = nll(row, chunk[first + i + 1]);
            sum += v;
            sum2 += v * v;
            count += 1;
            if let Some(bl) = &base_logits {
                let brow = &bl[i * vocab..(i + 1) * vocab];
                let k = kl_logits(brow, row);
                kl += k;
                kl2 += k * k;
                same += usize::from(argmax(brow) == argmax(row));
                base_sum += nll(brow, chunk[first + i + 1]);
            }
        }
        progress(c + 1, n_chunks, (sum / count as f64).exp());
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let stderr = if var > 0.0 && count > 1 { (var / (count - 1) as f64).sqrt() * ppl } else { 0.0 };
    let kl = base.map(|_| {
        let n = count as f64;
        let (m, var) = (kl / n, kl2 / n - (kl / n) * (kl / n));
        KlStats {
            kl: m,
            kl_stderr: if var > 0.0 && count > 1 { (var / (n - 1.0)).sqrt() } else { 0.0 },
            top1: same as f64 / n,
            base_ppl: (base_sum / n).exp(),
        }
    });
    Ok((PplResult { ppl, stderr, count, chunks: n_chunks, o1: o1_stats, state_bytes }, kl))
}

#[cfg(test)]
mod tests {
    use super::{argmax, kl_logits};

    /// KL of a distribution with itself is 0; two-token case against its closed form.
    #[test]
    fn kl_of_logit_rows() {
        let p = [0.3f32, -1.2, 2.0, 0.0];
        assert_eq!(kl_logits(&p, &p), 0.0);
        // Shifting every logit leaves the distribution unchanged.
        let q: Vec<f32> = p.iter().map(|x| x + 5.0).collect();
        assert!(kl_logits(&p, &q) < 1e-12);
        // p = (½, ½), q = (σ(1)·..): KL = ½ ln(½/q0) + ½ ln(½/q1).
        let (a, b) = ([0f32, 0.0], [1f32, 0.0]);
        let q0 = 1.0 / (1.0 + (-1f64).exp());
        let want = 0.5 * (0.5 / q0).ln() + 0.5 * (0.5 / (1.0 - q0)).ln();
        assert!((kl_logits(&a, &b) - want).abs() < 1e-12);
        assert_eq!(argmax(&p), 2);
    }
}
