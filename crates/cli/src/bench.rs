//! `cortiq bench`: prompt-processing and generation speed with llama-bench's method (pp then tg
//! lines, mean ± sd over repetitions), optionally after a depth context, with an O(1) or
//! StreamingLLM plan, with the verify cost curve of speculative decoding, or against the
//! memory-bandwidth roofline.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use cortiq_engine::{Logits, VerifyJournal};

use crate::common::{Common, O1Args, Profiler, open_model, state_line};

/// The flags of `cortiq bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub common: Common,
    /// Prompt tokens processed in one prefill (0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens generated one at a time (0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions of each test.
    #[arg(short, long, default_value_t = 3)]
    pub reps: usize,
    /// Positions per prefill step.
    #[arg(short, long, default_value_t = 512)]
    pub batch: usize,
    /// Also measure the machine's memory read bandwidth and report decode as a share of the
    /// bandwidth roofline (bandwidth ÷ the bytes a step reads: weights, and at depth the K/V
    /// rows each attention layer sees in their stored type, recurrent states once).
    #[arg(long)]
    pub roofline: bool,
    /// Context already in the sequence before each test (llama-bench's -d): pp and tg run after
    /// an unmeasured prefill of this many tokens (`pp512 @ d8192`).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Also measure the verify cost of speculative decoding, V(k) = one k-position
    /// `forward_verify` ÷ one decode step, for k = 1..=SPEC_K_MAX (n-gen calls of each,
    /// alternating with the single steps they are divided by).
    #[arg(long)]
    pub spec: bool,
    /// The longest verify --spec measures.
    #[arg(long, default_value_t = 8)]
    pub spec_k_max: usize,
    /// With --o1 / --kv-window the depth context is the sealed prompt (tp = DEPTH, prefilled
    /// once, exact) and pp/tg run after the seal; the per-sequence state bytes are printed.
    #[command(flatten)]
    pub o1: O1Args,
}

/// llama-bench's method: pp = one prefill of n_prompt tokens from an empty context (logits of
/// the last position only); tg = n_gen single-token decodes from an empty context. Token ids
/// are arbitrary but fixed (speed does not depend on them).
pub fn cmd_bench(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("--reps must be at least 1");
    }
    // Bench measures what its flags say: a polished model's recorded plan is not applied.
    a.o1.plan(a.depth, None, false, None)?;
    let loaded = open_model(&a.common)?;
    let model = &loaded.model;
    // before any step maps the experts' pages (`--mlock` pins them: no probe then)
    let visible = crate::pull::resolve_model(a.common.model_arg()?).is_ok_and(|p| cortiq_formats::page_cache_visible(&p));
    let share = (a.roofline && !a.common.mlock && visible).then(|| model.expert_page_share(crate::common::PAGE_SAMPLE)).flatten();
    let mut o1 = a.o1.clone();
    o1.apply_budget(model, None, false)?;
    let plan = o1.plan(a.depth, None, false, None)?;
    let vocab = model.cfg.vocab as u32;
    let toks: Vec<u32> = (0..(a.depth + a.n_prompt.max(a.n_gen)) as u32).map(|i| (i.wrapping_mul(7919) + 13) % vocab).collect();
    let (ctx, rest) = toks.split_at(a.depth);
    let mode = plan.as_ref().map_or_else(String::new, crate::o1args::bench_mode);
    let at = if a.depth > 0 { format!(" @ d{}{mode}", a.depth) } else { mode.clone() };
    // The state holding the depth context (with a plan: the sealed prompt), prefilled once,
    // unmeasured; each test starts from a copy with room for its positions.
    // --spec's verifies reach k − 1 positions past the n_gen steps.
    let n_max = a.n_prompt.max(a.n_gen) + if a.spec { a.spec_k_max } else { 0 };
    let mut base = match plan {
        Some(p) => model.new_state_o1(a.depth + n_max, p)?,
        None => model.new_state(a.depth + n_max),
    };
    if a.depth > 0 {
        let t = Instant::now();
        model.prefill(ctx, &mut base, a.batch.max(1))?;
        eprintln!("depth context: {} tokens prefilled in {:.1}s", a.depth, t.elapsed().as_secs_f64());
    }
    let fresh = |n: usize| -> Result<cortiq_engine::state::SeqState> {
        let mut st = base.clone();
        st.reserve(n);
        Ok(st)
    };
    let mut last_state = None;
    let threads = cortiq_engine::par::pool().n_threads();
    println!("model: {} ({}), threads: {threads}", a.common.model_arg()?, model.cfg.arch);
    let report = |name: String, n: usize, times: &[f64]| {
        let rates: Vec<f64> = times.iter().map(|t| n as f64 / t).collect();
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        let sd = if rates.len() > 1 {
            (rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len() - 1) as f64).sqrt()
        } else {
            0.0
        };
        println!("{name}: {mean:.2} ± {sd:.2} tok/s");
        mean
    };
    if a.n_prompt > 0 {
        let prof = Profiler::start(&a.common);
        let (mut times, mut profiled) = (Vec::new(), 0.0);
        // One unmeasured warm-up run pages the weights in.
        for rep in 0..=a.reps {
            let mut st = fresh(a.n_prompt)?;
            let t = Instant::now();
            model.prefill(&rest[..a.n_prompt], &mut st, a.batch.max(1))?;
            let dt = t.elapsed().as_secs_f64();
            profiled += dt;
            if rep > 0 {
                times.push(dt);
            }
            last_state = Some(st);
        }
        report(format!("pp{}{at}", a.n_prompt), a.n_prompt, &times);
        prof.finish_over(&format!("pp{} (all {} runs)", a.n_prompt, a.reps + 1), profiled);
    }
    if a.n_gen > 0 {
        let prof = Profiler::start(&a.common);
        let (mut times, mut profiled) = (Vec::new(), 0.0);
        let bytes0 = cortiq_engine::qtensor::weight_bytes();
        for rep in 0..=a.reps {
            let mut st = fresh(a.n_gen)?;
            let t = Instant::now();
            for &tk in &rest[..a.n_gen] {
                model.forward(&[tk], &mut st, Logits::Last)?;
            }
            let dt = t.elapsed().as_secs_f64();
            profiled += dt;
            if rep > 0 {
                times.push(dt);
            }
            last_state = Some(st);
        }
        let tg = report(format!("tg{}{at}", a.n_gen), a.n_gen, &times);
        if a.common.profile || a.roofline {
            // Counted by the products themselves (each matrix's bytes per call), against the
            // active parameters: a mixture that read more than its routed experts shows here.
            let per_tok = (cortiq_engine::qtensor::weight_bytes() - bytes0) as f64 / ((a.reps + 1) * a.n_gen) as f64;
            let active = model.decode_weight_bytes() as f64;
            println!(
                "weights read: {:.1} MB per token (counted), active parameters {:.1} MB: {:.3}x",
                per_tok / 1e6,
                active / 1e6,
                per_tok / active
            );
        }
        // The decode steps only: the verify costs and the bandwidth probe below are not theirs.
        prof.finish_over(&format!("tg{} (all {} runs)", a.n_gen, a.reps + 1), profiled);
        if a.spec {
            verify_costs(model, &a, &fresh, rest, &at)?;
        }
        if a.roofline {
            if let Some(s) = share {
                println!(
                    "experts' file pages: {} of {} sampled 2 MiB windows in the page cache as 2 MiB pages (at load)",
                    s.huge, s.windows
                );
            }
            // Measured here, between the runs it judges: the machine's state is the same.
            let bw = cortiq_kernels::membw::read_bandwidth(cortiq_engine::par::pool(), 1 << 30, 10);
            // The state a step reads, at the run's middle step: the last run's state less half
            // its steps (per-position bytes times positions; sliding layers read their window).
            let st = last_state.as_ref().unwrap_or(&base);
            let state_end = model.decode_state_bytes(st) as f64;
            let state_mid = state_end * (a.depth + a.n_gen / 2) as f64 / st.len.max(1) as f64;
            let weights = model.decode_weight_bytes() as f64;
            let bytes = weights + state_mid;
            let roof = bw / bytes;
            println!("mem read: {:.1} GB/s ({threads} threads, 1 GiB, best of 10)", bw / 1e9);
            println!(
                "roofline: {:.1} MB per token ({:.1} MB weights + {:.1} MB state) -> {roof:.1} tok/s; tg{} reached {:.1}%",
                bytes / 1e6,
                weights / 1e6,
                state_mid / 1e6,
                a.n_gen,
                100.0 * tg / roof
            );
        }
    }
    let st = last_state.unwrap_or(base);
    println!("state: {}", state_line(&st.bytes_by_kind(), st.len));
    if let Some(s) = st.o1_stats().filter(|s| s.rows > 0) {
        println!("o1 guard: dropped {} of {} (position, head) rows", s.dropped, s.rows);
    }
    Ok(())
}

/// The verify cost curve: per round, n_gen single steps, then for each k n_gen verifies of k
/// positions (each keeping one position, untimed, so the context grows as in decode), every
/// test from the depth state; V(k) = mean verify time ÷ mean step time of the same round, then
/// averaged over rounds (the machine drifts between rounds, less within one).
fn verify_costs(
    model: &cortiq_engine::Model,
    a: &BenchArgs,
    fresh: &dyn Fn(usize) -> Result<cortiq_engine::state::SeqState>,
    toks: &[u32],
    at: &str,
) -> Result<()> {
    if a.spec_k_max == 0 || a.n_gen == 0 {
        bail!("--spec needs --spec-k-max and --n-gen of at least 1");
    }
    let (n, kmax) = (a.n_gen, a.spec_k_max);
    let mut v = vec![Vec::new(); kmax + 1]; // per k: V of each round
    let mut step_ms = Vec::new();
    let mut journal = VerifyJournal::default();
    for rep in 0..=a.reps {
        let mut st = fresh(n)?;
        let t = Instant::now();
        for &tk in &toks[..n] {
            model.forward(&[tk], &mut st, Logits::Last)?;
        }
        let step = t.elapsed().as_secs_f64() / n as f64;
        for (k, vk) in v.iter_mut().enumerate().skip(1) {
            let mut st = fresh(n + k)?;
            let mut secs = 0.0;
            for i in 0..n {
                let chunk: Vec<u32> = (0..k).map(|j| toks[(i + j) % toks.len()]).collect();
                let t = Instant::now();
                model.forward_verify(&chunk, &mut st, &mut journal)?;
                secs += t.elapsed().as_secs_f64();
                model.verify_keep(&mut st, &mut journal, 1)?;
            }
            if rep > 0 {
                vk.push(secs / n as f64 / step);
            }
        }
        if rep > 0 {
            step_ms.push(step * 1e3);
        }
    }
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    println!("verify cost{at}: one decode step {:.2} ms; V(k) = k-position verify / step", mean(&step_ms));
    for (k, vk) in v.iter().enumerate().skip(1) {
        println!(
            "  V({k}) = {:.3}  ({:.2} ms, {:.1} positions per step-time)",
            mean(vk),
            mean(vk) * mean(&step_ms),
            k as f64 / mean(vk)
        );
    }
    Ok(())
}
