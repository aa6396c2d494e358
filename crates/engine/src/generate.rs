//! The reference generation loop: chunked prefill of the prompt, then sample → stop checks →
//! decode one token at a time, or (speculative decoding, `generate_spec`) a draft's tokens per
//! verify, one sequence through `Model::forward` / `forward_verify` alone. The product
//! generates through the serving core (`sched`: `cortiq serve` and `cortiq run`); this loop is
//! the plain-decoding oracle its tests compare against (tests/sched.rs, tests/spec.rs), as
//! simple as a loop can be. Detokenization is the caller's (`piece`), so it knows no
//! tokenizer; stop strings are matched on the streamed text and never emitted.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::model::{Logits, Model};
use crate::sampling::{Sampler, SamplerParams};
use crate::spec::Speculator;
use crate::state::SeqState;
use crate::stop::StopMatcher;

#[derive(Clone, Debug)]
pub struct GenOptions {
    /// Tokens to generate at most.
    pub n_predict: usize,
    pub sampler: SamplerParams,
    /// Generation ends when one of these is sampled (it is not emitted).
    pub eos: Vec<u32>,
    /// Generation ends when the text contains one of these (it is not emitted).
    pub stops: Vec<String>,
    /// Positions per prefill forward call.
    pub prefill_chunk: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    StopString,
    Length,
    /// The context filled up before n_predict tokens.
    Context,
}

#[derive(Clone, Debug)]
pub struct GenStats {
    /// Prompt positions prefilled.
    pub n_prompt: usize,
    pub n_generated: usize,
    pub prefill: Duration,
    pub decode: Duration,
    pub stop: StopReason,
    /// The generated ids (the EOS that ended generation excluded).
    pub tokens: Vec<u32>,
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Decode speed over the tokens that needed a forward pass (the first comes from prefill).
    pub fn decode_tps(&self) -> f64 {
        self.n_generated.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Generate after `prompt` (appended to `state`). `piece(id)` returns the newly completed text
/// of a token (a streaming detokenizer); `emit` receives text safe to show.
pub fn generate(
    model: &Model,
    state: &mut SeqState,
    prompt: &[u32],
    opt: &GenOptions,
    piece: &mut dyn FnMut(u32) -> String,
    emit: &mut dyn FnMut(&str),
) -> Result<GenStats> {
    run(model, state, prompt, opt, None, piece, emit)
}

/// `generate` with speculative decoding: before each decode step `spec`'s drafter proposes
/// the next tokens, one `forward_verify` checks them all, and sample-and-match keeps a drafted
/// token only where the sampler, run on that position's logits with the same history, draws
/// it. The sampler is called once per emitted token, in order, on logits bit-identical to
/// plain decoding's, so the output **equals `generate`'s token for token** at any temperature
/// and seed, and the state ends where plain decoding leaves it. `spec.stats` counts drafted
/// and accepted tokens.
pub fn generate_spec(
    model: &Model,
    state: &mut SeqState,
    prompt: &[u32],
    opt: &GenOptions,
    spec: &mut Speculator,
    piece: &mut dyn FnMut(u32) -> String,
    emit: &mut dyn FnMut(&str),
) -> Result<GenStats> {
    run(model, state, prompt, opt, Some(spec), piece, emit)
}

/// A draft under verification: its tokens and how many of them the sampler has drawn so far.
struct Pending {
    draft: Vec<u32>,
    accepted: usize,
}

#[allow(clippy::too_many_arguments)]
fn run(
    model: &Model,
    state: &mut SeqState,
    prompt: &[u32],
    opt: &GenOptions,
    mut spec: Option<&mut Speculator>,
    piece: &mut dyn FnMut(u32) -> String,
    emit: &mut dyn FnMut(&str),
) -> Result<GenStats> {
    let t0 = Instant::now();
    // The drafter's history: what the state holds already, then the prompt and the output.
    // The sampler's (its penalties' window) is plain decoding's: the prompt and the output.
    let prior = spec.as_deref_mut().map(|sp| sp.begin(state.len)).unwrap_or_default();
    let prior = &prior[..];
    // Logits rows still to sample from: one after a plain step, 1 + draft after a verify.
    let d_model = model.cfg.d_model;
    let mut rows = match spec.as_deref_mut().filter(|sp| sp.wants_hidden()) {
        Some(sp) => {
            let (last, hidden) = model.prefill_hidden(prompt, state, opt.prefill_chunk)?;
            sp.observe(&hidden, d_model);
            last
        }
        None => model.prefill(prompt, state, opt.prefill_chunk)?,
    }; // [r, vocab]
    let (vocab, mut row) = (model.cfg.vocab, 0);
    let prefill = t0.elapsed();
    let h0 = prior.len();
    let mut history: Vec<u32> = [prior, prompt].concat();
    let mut sampler = Sampler::new(opt.sampler.clone());
    let mut stops = StopMatcher::new(opt.stops.clone());
    let mut out = Vec::new();
    let mut pending: Option<Pending> = None;
    let t1 = Instant::now();
    let mut reason = StopReason::Length;
    while out.len() < opt.n_predict {
        let id = {
            let _s = crate::profile::span(crate::profile::Op::Sampling);
            sampler.sample(&rows[row * vocab..(row + 1) * vocab], &history[h0..])
        };
        if opt.eos.contains(&id) {
            reason = StopReason::Eos;
            break;
        }
        out.push(id);
        history.push(id);
        let (text, stopped) = stops.push(&piece(id));
        if !text.is_empty() {
            emit(&text);
        }
        if stopped {
            reason = StopReason::StopString;
            break;
        }
        if out.len() == opt.n_predict {
            break;
        }
        // The draft goes on where the sampler drew its next token: that position is already in
        // the state, its logits the next row.
        if let Some(p) = &mut pending
            && p.accepted < p.draft.len()
            && p.draft[p.accepted] == id
        {
            p.accepted += 1;
            spec.as_deref_mut().expect("a pending draft comes from the speculator").accept_one();
            row += 1;
            continue;
        }
        if let Some(p) = pending.take() {
            finish(model, state, spec.as_deref_mut(), &p)?;
        }
        if state.len >= state.n_ctx {
            reason = StopReason::Context;
            break;
        }
        // Feed `id`, with a draft after it where the drafter has one and it fits.
        let draft = match spec.as_deref_mut() {
            Some(sp) => {
                let room = (opt.n_predict - out.len() - 1).min(state.n_ctx - state.len - 1);
                sp.draft(model, &history, room)
            }
            None => Vec::new(),
        };
        row = 0;
        if draft.is_empty() {
            match spec.as_deref_mut().filter(|sp| sp.wants_hidden()) {
                // A plain step that also hands its final-normed row to the drafter.
                Some(sp) => {
                    let hidden;
                    (rows, hidden) = model.forward_hidden(&[id], state, Logits::Last)?;
                    sp.observe(&hidden, d_model);
                }
                None => rows = model.forward(&[id], state, Logits::Last)?,
            }
        } else {
            let sp = spec.as_deref_mut().expect("a draft comes from the speculator");
            let mut tokens = Vec::with_capacity(1 + draft.len());
            tokens.push(id);
            tokens.extend_from_slice(&draft);
            rows = model.forward_verify(&tokens, state, &mut sp.journal)?;
            pending = Some(Pending { draft, accepted: 0 });
        }
    }
    if let Some(p) = pending.take() {
        finish(model, state, spec, &p)?;
    }
    if reason != StopReason::StopString {
        let rest = stops.finish();
        if !rest.is_empty() {
            emit(&rest);
        }
    }
    Ok(GenStats { n_prompt: prompt.len(), n_generated: out.len(), prefill, decode: t1.elapsed(), stop: reason, tokens: out })
}

/// A verify is over: keep its fed token and the drafted tokens the sampler drew, and count.
fn finish(model: &Model, state: &mut SeqState, spec: Option<&mut Speculator>, p: &Pending) -> Result<()> {
    let sp = spec.expect("a pending draft comes from the speculator");
    model.verify_keep(state, &mut sp.journal, 1 + p.accepted)?;
    sp.adapt(p.draft.len(), p.accepted);
    if sp.wants_hidden() {
        let rows = sp.journal.hidden(model.cfg.d_model).to_vec();
        sp.observe(&rows, model.cfg.d_model);
    }
    Ok(())
}
