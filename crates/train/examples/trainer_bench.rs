//! Full training steps of the polish trainer (Trainer::train_step: checkpointed forward +
//! backward, clipping, AdamW on f32 masters) on a random-weight f32 student with SmolLM2-135M's
//! geometry (30 layers, d 576, 9/3 heads of 64, FFN 1536, tied 49,152-token head), every layer
//! served by Nyström (W 64, 4 sinks, m 64, prompt = first half), the loss over the second half.
//! The counterpart of tools/bench/train_step_torch.py (PyTorch eager float32, same step, same
//! geometry, same weight draw). Prints seconds per step, training tokens/s and peak RSS.
//! Run: `cargo run --release -p cortiq-train --example trainer_bench [T] [layers] [steps] [threads]`
//! (threads 0 or absent: the machine's available parallelism).
//!
//! On this (shared, 2-core, loaded) machine, best step after the first, one thread each (torch's
//! OpenMP barriers stall on a busy machine: at 2 threads its step took 2-10× longer):
//!
//! | geometry | cortiq (s, tok/s, peak RSS) | torch 2.15 eager f32 | ratio |
//! |---|---|---|---|
//! | 30 layers, T = 1024 | 13.3 s, 77 tok/s, 2.3 GB | 29.3 s, 35 tok/s, 8.1 GB | 2.2× |
//! | 10 layers, T = 1024 | 5.05 s, 203 tok/s, 1.2 GB | 9.92 s, 103 tok/s, 3.8 GB | 1.97× |
//! | 30 layers, T = 512 | 5.53 s, 93 tok/s, 2.1 GB | 5.41 s, 95 tok/s, 4.9 GB | 0.98× |
//! | 2 layers, T = 256 | 0.40 s, 638 tok/s | 0.36 s, 709 tok/s | 0.90× |

use std::time::Instant;

use cortiq_train::data::Windows;
use cortiq_train::optim::AdamW;
use cortiq_train::trainer::{TrainConfig, Trainer};

#[path = "common/smollm2_geo.rs"]
mod geo;
use geo::{Geo, VOCAB, f32v, peak_rss_mb};

fn main() {
    let t: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let n_layers: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let steps: u64 = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let threads: usize = std::env::args().nth(4).and_then(|s| s.parse().ok()).unwrap_or(0);
    let pool = cortiq_kernels::pool::Pool::new(threads).expect("thread pool");
    cortiq_train::par::install(Box::leak(Box::new(pool)));
    let vocab = VOCAB;
    let mut g = Geo::new(t, n_layers);
    let teacher = f32v(&mut g.r, t * vocab, 2.0);
    let s = g.student();
    let tokens: Vec<u32> = (0..=t).map(|i| (i * 7919 % vocab) as u32).collect();
    let cfg_t = TrainConfig {
        ctx: t,
        batch: 1,
        steps,
        warmup: 0,
        lr: 1e-4,
        min_lr: 1e-4,
        gain_lr_mult: 1.0,
        far_lr_mult: 1.0,
        vmf_lr_mult: 1.0,
        vmf_copied_mult: 1.0,
        adamw: AdamW { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 },
        clip: 1.0,
        kl_weight: 0.5,
        seed: 0,
        shuffle: false,
        score_all: false,
    };
    let mut tr = Trainer::new(s, cfg_t, Windows { ctx: t, windows: vec![tokens] }).expect("trainer");
    // The teacher hands out a precomputed [T, V] (a copy per window, as an engine would).
    let mut teach = |_: &[u32]| Ok::<_, String>(teacher.clone());
    let rss0 = peak_rss_mb();
    let mut times = vec![];
    for i in 0..steps {
        let t0 = Instant::now();
        let rep = tr.train_step(&mut teach).expect("step");
        let dt = t0.elapsed().as_secs_f64();
        times.push(dt);
        println!(
            "step {i}: {dt:.2} s, {:.0} tokens/s, loss {:.4}, grad norm {:.3}, peak RSS {:.0} MB",
            t as f64 / dt,
            rep.loss,
            rep.grad_norm,
            peak_rss_mb()
        );
    }
    let best = times.iter().skip(usize::from(times.len() > 1)).cloned().fold(f64::INFINITY, f64::min);
    println!(
        "cortiq trainer, {n_layers} layers, T={t}: best step after the first {best:.2} s = {:.1} tokens/s; peak RSS {:.0} MB (before the steps {rss0:.0} MB) on {} threads",
        t as f64 / best,
        peak_rss_mb(),
        cortiq_train::par::pool().n_threads()
    );
}
