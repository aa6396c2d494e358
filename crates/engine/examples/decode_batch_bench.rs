//! Aggregate decode throughput of `Model::forward_decode_batch` for k concurrent sequences
//! against one sequence decoding alone (the serving core's decode batch). Each sequence first
//! prefills its own short prompt; then STEPS batched steps are timed, greedy tokens fed back.
//! Prints tok/s for one sequence and for each k, and the ratio (aggregate / single).
//!
//! `cargo run --release -p cortiq-engine --example decode_batch_bench -- MODEL.gguf [THREADS] [STEPS]`

use std::time::Instant;

use cortiq_engine::load::load;
use cortiq_engine::state::SeqState;
use cortiq_engine::{Logits, Numerics, par};

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
    println!("{path}: {threads} threads, {steps} steps per run");
    for k in [1usize, 2, 4, 8] {
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
        let t0 = Instant::now();
        for _ in 0..steps {
            let mut refs: Vec<&mut SeqState> = states.iter_mut().collect();
            let logits = model.forward_decode_batch(&next, &mut refs).unwrap();
            for (j, n) in next.iter_mut().enumerate() {
                *n = argmax(&logits[j * v..(j + 1) * v]);
            }
        }
        let tps = (k * steps) as f64 / t0.elapsed().as_secs_f64();
        if k == 1 {
            single = tps;
        }
        println!("  k {k}: {tps:7.1} tok/s aggregate ({:.2}x one sequence)", tps / single);
    }
}
