//! The scheduler (`sched.rs`): a request's tokens equal the plain generation loop's with the
//! same prefill chunk and seed, alone or beside any neighbours and whatever the arrival order;
//! speculative decoding changes no token;
//! cancellation frees a slot; the queue bound and the context limit refuse at `submit`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::fixture;
use cortiq_engine::Model;
use cortiq_engine::generate::{GenOptions, generate};
use cortiq_engine::load::load;
use cortiq_engine::sampling::SamplerParams;
use cortiq_engine::sched::{Event, Finish, Handle, Request, SchedConfig, Sink, SubmitError};
use cortiq_engine::spec::{SpecMethod, SpecParams};

struct ChanSink(mpsc::Sender<Event>, Arc<AtomicBool>);

impl Sink for ChanSink {
    fn send(&self, ev: Event) -> bool {
        self.0.send(ev).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.1.load(Ordering::Relaxed)
    }
}

/// A client that takes `1` to read each event.
struct SlowSink(ChanSink, Duration);

impl Sink for SlowSink {
    fn send(&self, ev: Event) -> bool {
        std::thread::sleep(self.1);
        self.0.send(ev)
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

fn sampler(seed: u64) -> SamplerParams {
    SamplerParams { temperature: 0.9, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplerParams::greedy() }
}

fn request(prompt: Vec<u32>, seed: u64, n: usize, tx: &mpsc::Sender<Event>, closed: &Arc<AtomicBool>) -> Request {
    Request {
        prompt,
        n_predict: n,
        sampler: sampler(seed),
        eos: Vec::new(),
        stops: Vec::new(),
        logprobs: None,
        logit_bias: Vec::new(),
        index: seed as usize,
        sink: Box::new(ChanSink(tx.clone(), closed.clone())),
        constraint: None,
        spec: None,
        cache: true,
        cache_scope: cortiq_engine::prefix::SHARED,
    }
}

/// Tokens per request index until every one of `n` requests is done.
fn collect(rx: &mpsc::Receiver<Event>, n: usize) -> Vec<(usize, Vec<u32>)> {
    collect_counting(rx, n).0
}

/// `collect`, and the drafted and accepted tokens the requests' Done events report.
fn collect_counting(rx: &mpsc::Receiver<Event>, n: usize) -> (Vec<(usize, Vec<u32>)>, usize, usize) {
    let mut out: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
    let (mut done, mut n_drafted, mut n_accepted) = (0, 0, 0);
    while done < n {
        match rx.recv_timeout(Duration::from_secs(60)).expect("scheduler event") {
            Event::Token { index, id, .. } => out.entry(index).or_default().push(id),
            Event::Done { finish, drafted, accepted, .. } => {
                assert_eq!(finish, Finish::Length);
                n_drafted += drafted;
                n_accepted += accepted;
                done += 1;
            }
            Event::Error { message, .. } => panic!("{message}"),
            Event::Started { .. } => {}
        }
    }
    (out.into_iter().collect(), n_drafted, n_accepted)
}

/// `prompts()` through the plain loop, one request at a time: n tokens each, request i
/// sampled with seed i, prefilled in chunks of `chunk`.
fn references(model: &Model, chunk: usize, n: usize) -> Vec<Vec<u32>> {
    prompts()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut st = model.new_state(256);
            let opt = GenOptions { n_predict: n, sampler: sampler(i as u64), eos: vec![], stops: vec![], prefill_chunk: chunk };
            generate(model, &mut st, p, &opt, &mut |_| String::new(), &mut |_| {}).unwrap().tokens
        })
        .collect()
}

/// The five prompts as requests of n tokens, those listed speculating with n-gram drafts.
fn speculating_requests(n: usize, speculating: &[usize], tx: &mpsc::Sender<Event>, closed: &Arc<AtomicBool>) -> Vec<Request> {
    speculating_with(SpecMethod::Ngram { min: 1, max: 4 }, n, speculating, tx, closed)
}

/// `speculating_requests` drafting with `method`.
fn speculating_with(
    method: SpecMethod,
    n: usize,
    speculating: &[usize],
    tx: &mpsc::Sender<Event>,
    closed: &Arc<AtomicBool>,
) -> Vec<Request> {
    prompts()
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = request(p, i as u64, n, tx, closed);
            if speculating.contains(&i) {
                r.spec = Some(SpecParams { method, n_max: 4, n_min: 0 });
            }
            r
        })
        .collect()
}

fn prompts() -> Vec<Vec<u32>> {
    (0..5u32).map(|i| (0..(3 + 11 * i)).map(|t| 3 + (t * 29 + i * 7) % 250).collect()).collect()
}

#[test]
fn sched_equals_generate_alone_and_under_load() {
    // Dense with sliding windows (Gemma 3), short conv + attention (LFM2), GatedDeltaNet +
    // gated attention (Qwen3.5), KDA + MLA + MoE (Kimi Linear): all 256-token vocabularies, so
    // one tokenizer detokenizes them all.
    let tok = Arc::new(loaded_tokenizer());
    for arch in ["gemma3", "lfm2", "qwen3_5", "kimi_linear"] {
        let model = Arc::new(load(&fixture(arch)).unwrap().model);
        let chunk = 8;
        let n = 12;
        // The plain loop, one request at a time.
        let reference = references(&model, chunk, n);
        let h = Handle::new(SchedConfig {
            slots: 5,
            n_ctx: 256,
            queue: 16,
            prefill_chunk: chunk,
            prefill_budget: 2 * chunk,
            draft_budget: None,
            gather: Duration::from_millis(1),
            timeout: None,
            cache: None,
            o1: None,
        });
        let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
        let engine = std::thread::spawn(move || h2.run(&m2, &t2));
        let closed = Arc::new(AtomicBool::new(false));
        // Alone, one after the other; then all five at once; then in reverse order at once.
        let (tx, rx) = mpsc::channel();
        for (i, p) in prompts().into_iter().enumerate() {
            h.submit(vec![request(p, i as u64, n, &tx, &closed)]).unwrap();
            let got = collect(&rx, 1);
            assert_eq!(got[0].1, reference[i], "{arch}: request {i} alone differs from generate()");
        }
        for order in [vec![0, 1, 2, 3, 4], vec![4, 2, 0, 3, 1]] {
            let ps = prompts();
            let reqs = order.iter().map(|&i| request(ps[i].clone(), i as u64, n, &tx, &closed)).collect();
            h.submit(reqs).unwrap();
            for (i, toks) in collect(&rx, 5) {
                assert_eq!(toks, reference[i], "{arch}: request {i} beside 4 others (order {order:?}) differs");
            }
        }
        // Speculative decoding (n-gram drafts, verified on their own beside the batch): the
        // same tokens, for the speculating requests and for their plain neighbours.
        for speculating in [vec![1, 3], vec![0, 1, 2, 3, 4]] {
            h.submit(speculating_requests(n, &speculating, &tx, &closed)).unwrap();
            let (got, drafted, accepted) = collect_counting(&rx, 5);
            for (i, toks) in got {
                assert_eq!(toks, reference[i], "{arch}: request {i} (speculating: {speculating:?}) differs");
            }
            println!("{arch}: speculating {speculating:?}: drafted {drafted}, accepted {accepted}");
            assert!(drafted > 0, "{arch}: no draft was verified");
        }
        let c = h.counters();
        assert!(c.decode_rows.load(Ordering::Relaxed) > c.decode_steps.load(Ordering::Relaxed), "{arch}: decode steps did batch");
        h.shutdown();
        engine.join().unwrap();
    }
}

/// MTP drafts in the serving core (the batch hands each MTP slot its final-normed hidden rows,
/// `BatchEntry::hidden`): the same tokens as plain decoding for the speculating requests and
/// their neighbours, alone and under load, and drafts are made; a request whose prompt was
/// restored from the prompt cache (rows its head never saw) decodes plainly, same tokens.
#[test]
fn sched_mtp_equals_plain() {
    let tok = Arc::new(loaded_tokenizer());
    for arch in ["qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        let model = Arc::new(load(&fixture(arch)).unwrap().model);
        assert!(!model.mtp.is_empty(), "{arch}: the fixture has an MTP block");
        let (chunk, n) = (8, 16);
        let reference = references(&model, chunk, n);
        let h = Handle::new(SchedConfig {
            slots: 5,
            n_ctx: 256,
            queue: 16,
            prefill_chunk: chunk,
            prefill_budget: 2 * chunk,
            draft_budget: None,
            gather: Duration::from_millis(20),
            timeout: None,
            cache: Some(cortiq_engine::prefix::CacheConfig { ram: 64 << 20, every: 16 }),
            o1: None,
        });
        let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
        let engine = std::thread::spawn(move || h2.run(&m2, &t2));
        let closed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let mut r = speculating_with(SpecMethod::Mtp, n, &[4], &tx, &closed).pop().unwrap();
        r.cache = false;
        h.submit(vec![r]).unwrap();
        let (got, alone, _) = collect_counting(&rx, 1);
        assert_eq!(got[0].1, reference[4], "{arch}: MTP alone differs from plain decoding");
        for speculating in [vec![1, 3], vec![0, 1, 2, 3, 4]] {
            let mut reqs = speculating_with(SpecMethod::Mtp, n, &speculating, &tx, &closed);
            reqs.iter_mut().for_each(|r| r.cache = false);
            h.submit(reqs).unwrap();
            let (got, drafted, accepted) = collect_counting(&rx, 5);
            for (i, toks) in got {
                assert_eq!(toks, reference[i], "{arch}: request {i} (MTP on {speculating:?}) differs");
            }
            println!("{arch}: MTP on {speculating:?}: drafted {drafted}, accepted {accepted}");
            assert!(drafted > 0, "{arch}: no MTP draft was verified");
        }
        // Cached: the first request fills the cache, the second restores its prompt.
        for k in 0..2 {
            h.submit(speculating_with(SpecMethod::Mtp, n, &[2], &tx, &closed).into_iter().skip(2).take(1).collect()).unwrap();
            let (got, _, _) = collect_counting(&rx, 1);
            assert_eq!(got[0].1, reference[2], "{arch}: MTP with the prompt cache (run {k}) differs");
        }
        assert!(alone > 0, "{arch}: no MTP draft alone");
        h.shutdown();
        engine.join().unwrap();
    }
}

/// `draft_budget` bounds the positions the speculating streams draft while plain ones share
/// the step, and changes no token: with 0 nothing is drafted beside them, with 1 at most one
/// position a step.
#[test]
fn sched_draft_budget_bounds_drafts_and_changes_no_token() {
    let tok = Arc::new(loaded_tokenizer());
    let model = Arc::new(load(&fixture("gemma3")).unwrap().model);
    let (chunk, n) = (8, 12);
    let reference = references(&model, chunk, n);
    let mut drafted_by = Vec::new();
    for budget in [Some(0), Some(1), None] {
        let h = Handle::new(SchedConfig {
            slots: 5,
            n_ctx: 256,
            queue: 16,
            prefill_chunk: chunk,
            prefill_budget: 2 * chunk,
            draft_budget: budget,
            gather: Duration::from_millis(20),
            timeout: None,
            cache: None,
            o1: None,
        });
        let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
        let engine = std::thread::spawn(move || h2.run(&m2, &t2));
        let closed = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        h.submit(speculating_requests(n, &[1, 3], &tx, &closed)).unwrap();
        let (got, drafted, accepted) = collect_counting(&rx, 5);
        for (i, toks) in got {
            assert_eq!(toks, reference[i], "draft budget {budget:?}: request {i} differs");
        }
        println!("draft budget {budget:?}: drafted {drafted}, accepted {accepted}");
        drafted_by.push(drafted);
        h.shutdown();
        engine.join().unwrap();
    }
    assert_eq!(drafted_by[0], 0, "budget 0 beside plain streams: no draft");
    assert!(drafted_by[1] <= drafted_by[2] && drafted_by[2] > 0, "drafted with budget 1 / unbounded: {drafted_by:?}");
}

#[test]
fn sched_cancel_queue_and_context() {
    let loaded = load(&fixture("qwen3_5")).unwrap();
    let model = Arc::new(loaded.model);
    let tok = Arc::new(loaded_tokenizer());
    let h = Handle::new(SchedConfig {
        slots: 1,
        n_ctx: 64,
        queue: 1,
        prefill_chunk: 4,
        prefill_budget: 4,
        draft_budget: None,
        gather: Duration::from_millis(2),
        timeout: None,
        cache: None,
        o1: None,
    });
    let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
    let engine = std::thread::spawn(move || h2.run(&m2, &t2));
    let (tx, rx) = mpsc::channel();
    let open = Arc::new(AtomicBool::new(false));
    assert_eq!(
        h.submit(vec![request(vec![5; 64], 0, 4, &tx, &open)]).unwrap_err(),
        SubmitError::TooLong { n_prompt: 64, n_ctx: 64 }
    );
    assert_eq!(h.submit(vec![request(vec![], 0, 4, &tx, &open)]).unwrap_err(), SubmitError::EmptyPrompt);
    // A request bound to run until the context fills, then cancelled once it is generating.
    // Its client reads slowly (20 ms a token): the context (61 tokens) cannot fill before the
    // test cancels it, however the threads are scheduled.
    let gone = Arc::new(AtomicBool::new(false));
    let mut long = request(vec![7, 8, 9], 1, 1000, &tx, &gone);
    long.sink = Box::new(SlowSink(ChanSink(tx.clone(), gone.clone()), Duration::from_millis(20)));
    h.submit(vec![long]).unwrap();
    loop {
        if let Event::Token { .. } = rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            break;
        }
    }
    // One queued behind it, then a third is refused.
    h.submit(vec![request(vec![1, 2], 2, 3, &tx, &open)]).unwrap();
    assert!(matches!(h.submit(vec![request(vec![1, 2], 3, 3, &tx, &open)]), Err(SubmitError::QueueFull(1))));
    gone.store(true, Ordering::Relaxed);
    // The queued request now runs to its end.
    loop {
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            Event::Done { index: 2, n_generated, .. } => {
                assert_eq!(n_generated, 3);
                break;
            }
            Event::Done { index, .. } => panic!("request {index} finished; the cancelled one must not"),
            _ => {}
        }
    }
    assert_eq!(h.counters().cancelled.load(Ordering::Relaxed), 1);
    h.shutdown();
    engine.join().unwrap();
}

/// A burst after an idle spell starts in one step: three requests submitted 30 ms apart (as
/// three HTTP handlers might), within the gather window, all begin decoding together, so every decode step carries all
/// three rows. The request sent alone afterwards still runs (it waits at most the window).
#[test]
fn sched_gathers_a_burst_into_one_step() {
    let model = Arc::new(load(&fixture("llama")).unwrap().model);
    let tok = Arc::new(loaded_tokenizer());
    let h = Handle::new(SchedConfig {
        slots: 4,
        n_ctx: 128,
        queue: 8,
        prefill_chunk: 8,
        prefill_budget: 8,
        draft_budget: None,
        gather: Duration::from_millis(200),
        timeout: None,
        cache: None,
        o1: None,
    });
    let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
    let engine = std::thread::spawn(move || h2.run(&m2, &t2));
    let (tx, rx) = mpsc::channel();
    let open = Arc::new(AtomicBool::new(false));
    while !h.is_ready() {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(20)); // the engine waits for work, idle
    for i in 0..3u64 {
        h.submit(vec![request(vec![3 + i as u32; 6], i, 5, &tx, &open)]).unwrap();
        // Time enough for the engine to wake and step (µs on this fixture) if it did not wait.
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(collect(&rx, 3).len(), 3);
    let c = h.counters();
    let (steps, rows) = (c.decode_steps.load(Ordering::Relaxed), c.decode_rows.load(Ordering::Relaxed));
    assert_eq!(rows, 3 * steps, "every decode step held the whole burst ({rows} rows in {steps} steps)");
    assert_eq!(steps, 4, "5 tokens each: the first from the prompt step, then 4 decode steps together");
    h.submit(vec![request(vec![9; 3], 7, 2, &tx, &open)]).unwrap();
    assert_eq!(collect(&rx, 1)[0].1.len(), 2);
    h.shutdown();
    engine.join().unwrap();
}

fn loaded_tokenizer() -> cortiq_formats::tokenizer::Tokenizer {
    load(&fixture("qwen3_5")).unwrap().tokenizer().unwrap()
}

/// One request's tokens, the bits of its log-probabilities (chosen and top 3), and the prompt
/// positions its Done event says the cache restored.
fn collect_one(rx: &mpsc::Receiver<Event>) -> (Vec<u32>, Vec<u32>, usize) {
    let (mut toks, mut bits) = (Vec::new(), Vec::new());
    loop {
        match rx.recv_timeout(Duration::from_secs(60)).expect("scheduler event") {
            Event::Token { id, logprob, .. } => {
                toks.push(id);
                let lp = logprob.expect("logprobs asked");
                bits.push(lp.logprob.to_bits());
                bits.extend(lp.top.iter().flat_map(|&(i, l)| [i, l.to_bits()]));
            }
            Event::Done { n_cached, .. } => return (toks, bits, n_cached),
            Event::Error { message, .. } => panic!("{message}"),
            Event::Started { .. } => {}
        }
    }
}

/// The prompt cache in the scheduler: a request served from a cached prefix gives the tokens
/// and log-probabilities (in bits) of the same request on a scheduler without a cache; Done
/// says how many positions were restored. After a generation the idle refill caches prompt +
/// output, so a chat's next turn (prompt + output + new tokens) restores all but the last
/// 2-17 positions of what it shares; a prompt leaving a cached one part-way restores up to the
/// last checkpoint (recurrent layers) or grid point (KV caches) before they part.
#[test]
fn sched_prompt_cache_equals_cold() {
    use cortiq_engine::prefix::{CacheConfig, entry_point};
    let tok = Arc::new(loaded_tokenizer());
    for arch in ["qwen2", "gemma3", "lfm2", "qwen3_5", "kimi_linear"] {
        let model = Arc::new(load(&fixture(arch)).unwrap().model);
        let hybrid = !model.new_state(1).can_truncate();
        let start = |cache: Option<CacheConfig>| {
            let h = Handle::new(SchedConfig {
                slots: 2,
                n_ctx: 256,
                queue: 8,
                prefill_chunk: 16,
                prefill_budget: 32,
                draft_budget: None,
                gather: Duration::ZERO,
                timeout: None,
                cache,
                o1: None,
            });
            let (m2, t2, h2) = (model.clone(), tok.clone(), h.clone());
            (h.clone(), std::thread::spawn(move || h2.run(&m2, &t2)))
        };
        let (warm, warm_thread) = start(Some(CacheConfig { ram: 1 << 30, every: 32 }));
        let (cold, cold_thread) = start(None);
        let closed = Arc::new(AtomicBool::new(false));
        let ask = |h: &Handle, prompt: &[u32]| {
            let (tx, rx) = mpsc::channel();
            let mut r = request(prompt.to_vec(), 7, 12, &tx, &closed);
            r.logprobs = Some(3);
            h.submit(vec![r]).unwrap();
            collect_one(&rx)
        };
        let turn1: Vec<u32> = (0..90u32).map(|t| 3 + (t * 37 + 11) % 250).collect();
        let (t1, b1, c1) = ask(&warm, &turn1);
        assert_eq!(c1, 0, "{arch}: nothing cached yet");
        assert_eq!((&t1, &b1), (&ask(&cold, &turn1).0, &ask(&cold, &turn1).1), "{arch}: first turn");
        // The refill of turn 1's prompt + output runs while the scheduler idles.
        let t0 = std::time::Instant::now();
        while warm.counters().cache_refills.load(Ordering::Relaxed) == 0 {
            assert!(t0.elapsed() < Duration::from_secs(30), "{arch}: no refill after a generation");
            std::thread::sleep(Duration::from_millis(5));
        }
        let said: Vec<u32> = [&turn1[..], &t1].concat();
        let turn2: Vec<u32> = [&said[..], &[5, 6, 7, 8, 9, 10, 11]].concat();
        let (t2, b2, c2) = ask(&warm, &turn2);
        assert_eq!(c2, entry_point(said.len(), model.cut_grid()), "{arch}: the next turn restores prompt + output");
        let (t2c, b2c, _) = ask(&cold, &turn2);
        assert_eq!((t2, b2), (t2c, b2c), "{arch}: next turn, cached vs cold");
        let part = 50;
        let other: Vec<u32> = [&turn1[..part], &(0..30u32).map(|t| 200 - t).collect::<Vec<_>>()[..]].concat();
        let (t3, b3, c3) = ask(&warm, &other);
        assert_eq!(c3, if hybrid { part / 32 * 32 } else { part }, "{arch}: parting prompt");
        let (t3c, b3c, _) = ask(&cold, &other);
        assert_eq!((t3, b3), (t3c, b3c), "{arch}: parting prompt, cached vs cold");
        let c = warm.counters();
        println!(
            "{arch}: hits {}, misses {}, reused {} positions, {} entries, {} bytes, refills {} ({} positions)",
            c.cache_hits.load(Ordering::Relaxed),
            c.cache_misses.load(Ordering::Relaxed),
            c.cache_reused_tokens.load(Ordering::Relaxed),
            c.cache_entries.load(Ordering::Relaxed),
            c.cache_bytes.load(Ordering::Relaxed),
            c.cache_refills.load(Ordering::Relaxed),
            c.cache_refill_tokens.load(Ordering::Relaxed),
        );
        for (h, t) in [(warm, warm_thread), (cold, cold_thread)] {
            h.shutdown();
            t.join().unwrap();
        }
    }
}
