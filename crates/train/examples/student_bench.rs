//! One checkpointed training step (forward + backward, no optimizer) of a random-weight f32
//! student with SmolLM2-135M's geometry (30 layers, d 576, 9/3 heads of 64, FFN 1536, tied
//! 49,152-token head), every layer served by Nyström (W 64, 4 sinks, m 64, prompt = first half):
//! step time, training tokens/s, peak RSS. The loss scores the second half (as `ppl --o1`).
//! Run: `cargo run --release -p cortiq-train --example student_bench [T] [layers]`.

use std::time::Instant;

use cortiq_train::model::StudentGrads;

#[path = "common/smollm2_geo.rs"]
mod geo;
use geo::{Geo, VOCAB, f32v, peak_rss_mb};

fn main() {
    let t: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let n_layers: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let vocab = VOCAB;
    let mut g = Geo::new(t, n_layers);
    let teacher = f32v(&mut g.r, t * vocab, 2.0);
    let s = g.student();
    let tokens: Vec<u32> = (0..t).map(|i| (i * 7919 % vocab) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().copied().chain([0]).collect();
    let mut grads = StudentGrads::new(&s);
    let rss0 = peak_rss_mb();
    let t0 = Instant::now();
    let (out, _) = s.step(&tokens, &teacher, &targets, 0.5, t / 2, &mut grads).expect("step");
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "student step: {n_layers} layers, T={t}: {dt:.2} s, {:.0} tokens/s, loss {:.4}; peak RSS {:.0} MB (before the step {rss0:.0} MB) on {} threads",
        t as f64 / dt,
        out.loss,
        peak_rss_mb(),
        cortiq_train::par::pool().n_threads()
    );
}
