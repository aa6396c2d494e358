//! Per-token cost of the sampler at Gemma's vocabulary (V = 262,144), for six settings: a timing
//! print, not a test (machines are noisy; a wall-clock figure cannot be a pass/fail bound). Was
//! the test `timing_at_gemma_vocab` in tests/sampling.rs, which asserted nothing.
//!
//! `cargo run --release -p cortiq-engine --example sampling_timing`

use cortiq_engine::sampling::{Rng, Sampler, SamplerParams};

/// A peaked, LLM-like row (a few strong tokens over Gaussian-ish noise), the same draw as
/// tests/sampling.rs `llm_like_row`.
fn llm_like_row(n: usize, seed: u64, spread: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            // sum of 4 uniforms ~ bell curve on [-2, 2]
            let s: f64 = (0..4).map(|_| r.next_f64()).sum::<f64>() - 2.0;
            (s as f32) * spread
        })
        .collect();
    for j in 0..20 {
        let i = (r.next_u64() % n as u64) as usize;
        v[i] += 3.0 * spread + j as f32 * 0.37;
    }
    v
}

/// This thread's on-CPU nanoseconds (Linux), so figures survive a loaded machine.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
}

fn main() {
    let row = llm_like_row(262_144, 8, 2.5);
    let hist: Vec<u32> = (0..64).map(|i| i * 97).collect();
    for (name, params) in [
        ("defaults", SamplerParams { seed: 1, ..SamplerParams::default() }),
        ("greedy", SamplerParams::greedy()),
        ("top_p 0.9 only", SamplerParams { top_k: 0, top_p: 0.9, min_p: 0.0, seed: 1, ..SamplerParams::default() }),
        ("min_p 0.05 only", SamplerParams { top_k: 0, top_p: 1.0, min_p: 0.05, seed: 1, ..SamplerParams::default() }),
        ("no filters", SamplerParams { top_k: 0, top_p: 1.0, min_p: 0.0, seed: 1, ..SamplerParams::default() }),
        (
            "defaults + penalties",
            SamplerParams {
                repeat_penalty: 1.1,
                frequency_penalty: 0.1,
                presence_penalty: 0.1,
                seed: 1,
                ..SamplerParams::default()
            },
        ),
    ] {
        let mut s = Sampler::new(params);
        s.sample(&row, &hist);
        // Run >= 0.3 s: schedstat advances at scheduler ticks, not per call.
        let mut iters = 0;
        let t0 = std::time::Instant::now();
        let c0 = thread_cpu_ns();
        while t0.elapsed().as_secs_f64() < 0.3 {
            std::hint::black_box(s.sample(&row, &hist));
            iters += 1;
        }
        let wall = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        let cpu = thread_cpu_ns().zip(c0).map(|(b, a)| (b - a) as f64 / 1e3 / iters as f64);
        println!("sample {name}: {wall:.1} us/token wall, {cpu:.1?} us/token on-CPU");
    }
}
