//! Aggregate decode throughput of `Model::forward_batch_into` (one decode position per entry) for k concurrent sequences
//! against one sequence decoding alone (the serving core's decode batch). Each sequence first
//! prefills its own short prompt; then STEPS batched steps are timed, greedy tokens fed back.
//! Prints tok/s for one sequence and for each k, and the ratio (aggregate / single).
//!
//! `cargo run --release -p cortiq-engine --example decode_batch_bench -- MODEL.gguf [THREADS] [STEPS] [KS] [ROUNDS]`
//! (KS: the column counts to run, comma-separated, default 1,2,4,8; ROUNDS: how many times the
//! whole sweep runs, default 1 — on a shared machine the best round of each k is printed at the
//! end with its ratio to the best single-sequence round; with `CORTIQ_BENCH_PROFILE=1` each k's
//! timed steps also print the profile's per-op breakdown)

use std::time::Instant;

use cortiq_engine::load::load;
use cortiq_engine::state::SeqState;
use cortiq_engine::{BatchEntry, Logits, Numerics, par, profile};

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().expect("usage: decode_batch_bench MODEL [THREADS] [STEPS]");
    let threads = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let steps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(48);
    let ks: Vec<usize> =
        args.get(3).map(|a| a.split(',').filter_map(|k| k.parse().ok()).collect()).unwrap_or_else(|| vec![1, 2, 4, 8]);
    let rounds: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(1).max(1);
    let prof = std::env::var("CORTIQ_BENCH_PROFILE").is_ok_and(|v| v == "1");
    par::init(threads).unwrap();
    let loaded = load(std::path::Path::new(path)).unwrap();
    let tok = loaded.tokenizer().unwrap();
    let mut model = loaded.model;
    model.set_numerics(Numerics::Fast); // the CLI's default
    let prompts = [
        "def add(a, b):",
        "The capital of France is",
        "Once upon a time",
        "import numpy as np",
        "SELECT * FROM",
        "fn main() {",
        "Dear Sir,",
        "#include <stdio.h>",
    ];
    let mut single = 0.0;
    let mut best = vec![0f64; ks.len()];
    println!("{path}: {threads} threads, {steps} steps per run");
    for (ki, &k) in ks.iter().enumerate().cycle().take(ks.len() * rounds) {
        let mut states: Vec<SeqState> = Vec::new();
        let mut next: Vec<u32> = Vec::new();
        for j in 0..k {
            let ids = tok.encode(prompts[j % prompts.len()], true).unwrap();
            let mut st = model.new_state(ids.len() + steps + 8);
            let l = model.forward(&ids, &mut st, Logits::Last).unwrap();
            next.push(argmax(&l));
            states.push(st);
        }
        let v = model.cfg.vocab;
        if prof {
            profile::reset();
            profile::enable(true);
        }
        // The logits buffer is kept across steps, as the server's scheduler keeps it.
        let mut logits = Vec::new();
        let t0 = Instant::now();
        for _ in 0..steps {
            let mut batch: Vec<BatchEntry> = next
                .iter()
                .zip(states.iter_mut())
                .map(|(t, st)| BatchEntry {
                    tokens: std::slice::from_ref(t),
                    state: st,
                    want: Logits::Last,
                    verify: None,
                    hidden: None,
                })
                .collect();
            model.forward_batch_into(&mut batch, &mut logits).unwrap();
            for (j, n) in next.iter_mut().enumerate() {
                *n = argmax(&logits[j * v..(j + 1) * v]);
            }
        }
        let el = t0.elapsed().as_secs_f64();
        let tps = (k * steps) as f64 / el;
        if k == 1 || single == 0.0 {
            single = tps;
        }
        best[ki] = best[ki].max(tps);
        println!("  k {k}: {tps:7.1} tok/s aggregate ({:.2}x one sequence)", tps / single);
        if prof {
            profile::enable(false);
            print!("{}", profile::format_report(el * 1e3));
        }
    }
    if rounds > 1 {
        println!("best of {rounds} rounds:");
        for (&k, &b) in ks.iter().zip(&best) {
            println!("  k {k}: {b:7.1} tok/s aggregate ({:.2}x the best single round)", b / best[0]);
        }
    }
}
