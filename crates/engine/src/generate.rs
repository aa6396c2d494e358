//! The generation loop: chunked prefill of the prompt, then sample → stop checks → decode one
//! token at a time. Detokenization is the caller's (`piece`), so this loop knows no tokenizer;
//! stop strings are matched on the streamed text and never emitted.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::model::{Logits, Model};
use crate::sampling::{Sampler, SamplerParams};
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
    let t0 = Instant::now();
    let mut logits = model.prefill(prompt, state, opt.prefill_chunk)?;
    let prefill = t0.elapsed();
    let mut history: Vec<u32> = prompt.to_vec();
    let mut sampler = Sampler::new(opt.sampler.clone());
    let mut stops = StopMatcher::new(opt.stops.clone());
    let mut out = Vec::new();
    let t1 = Instant::now();
    let mut reason = StopReason::Length;
    while out.len() < opt.n_predict {
        let id = {
            let _s = crate::profile::span(crate::profile::Op::Sampling);
            sampler.sample(&logits, &history)
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
        if state.len >= state.n_ctx {
            reason = StopReason::Context;
            break;
        }
        logits = model.forward(&[id], state, Logits::Last)?;
    }
    if reason != StopReason::StopString {
        let rest = stops.finish();
        if !rest.is_empty() {
            emit(&rest);
        }
    }
    Ok(GenStats { n_prompt: prompt.len(), n_generated: out.len(), prefill, decode: t1.elapsed(), stop: reason, tokens: out })
}
