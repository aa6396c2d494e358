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

use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights};
use cortiq_train::data::Windows;
use cortiq_train::gradcheck::Rng;
use cortiq_train::model::{Student, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, O1Config};
use cortiq_train::optim::AdamW;
use cortiq_train::rope::{RopeStyle, RopeTable};
use cortiq_train::trainer::{TrainConfig, Trainer};

fn f32v(r: &mut Rng, n: usize, s: f64) -> Vec<f32> {
    (0..n).map(|_| (r.uniform() * 2.0 - 1.0) as f32 * s as f32 * 1.7).collect()
}

fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

struct LayerW {
    v: Vec<Vec<f32>>, // attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down
}

fn main() {
    let t: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let n_layers: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let steps: u64 = std::env::args().nth(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let threads: usize = std::env::args().nth(4).and_then(|s| s.parse().ok()).unwrap_or(0);
    let pool = cortiq_kernels::pool::Pool::new(threads).expect("thread pool");
    cortiq_train::par::install(Box::leak(Box::new(pool)));
    let (d, nh, nkv, hd, ff, vocab) = (576, 9, 3, 64, 1536, 49152);
    let mut r = Rng(1);
    let layers: Vec<LayerW> = (0..n_layers)
        .map(|_| LayerW {
            v: vec![
                vec![1.0; d],
                f32v(&mut r, nh * hd * d, 0.04),
                f32v(&mut r, nkv * hd * d, 0.04),
                f32v(&mut r, nkv * hd * d, 0.04),
                f32v(&mut r, d * nh * hd, 0.04),
                vec![1.0; d],
                f32v(&mut r, ff * d, 0.04),
                f32v(&mut r, ff * d, 0.04),
                f32v(&mut r, d * ff, 0.025),
            ],
        })
        .collect();
    let embed = f32v(&mut r, vocab * d, 0.05);
    let final_norm = vec![1.0f32; d];
    let rope = RopeTable::<f32>::new(t, hd, 100_000.0);
    let o1 = O1Config { window: 64, sinks: 4, landmarks: 64, ridge: DEFAULT_RIDGE, far: Far::Skeleton };
    let cfg = BlockConfig {
        d_model: d,
        n_heads: nh,
        n_kv_heads: nkv,
        head_dim: hd,
        d_ff: ff,
        norm_eps: 1e-5,
        norm_style: NormStyle::Plain,
        act: Act::Silu,
        attn_scale: 1.0 / (hd as f64).sqrt(),
        rope_style: RopeStyle::NeoX,
        mixer: BlockMixer::Nystrom { cfg: o1, tp: t / 2 },
    };
    let s = Student {
        embed: &embed,
        embed_scale: None,
        layers: layers
            .iter()
            .map(|l| StudentLayer {
                cfg,
                w: BlockWeights {
                    attn_norm: &l.v[0],
                    wq: &l.v[1],
                    wk: &l.v[2],
                    wv: &l.v[3],
                    bq: None,
                    bk: None,
                    bv: None,
                    q_norm: None,
                    k_norm: None,
                    wo: &l.v[4],
                    post_attn_norm: None,
                    ffn_norm: &l.v[5],
                    gate: &l.v[6],
                    up: &l.v[7],
                    down: &l.v[8],
                    post_ffn_norm: None,
                },
                rope: &rope,
                train: true,
            })
            .collect(),
        final_norm: &final_norm,
        norm_style: NormStyle::Plain,
        norm_eps: 1e-5,
        lm_head: &embed,
        vocab,
        d_model: d,
    };
    let tokens: Vec<u32> = (0..=t).map(|i| (i * 7919 % vocab) as u32).collect();
    let teacher = f32v(&mut r, t * vocab, 2.0);
    let cfg_t = TrainConfig {
        ctx: t,
        batch: 1,
        steps,
        warmup: 0,
        lr: 1e-4,
        min_lr: 1e-4,
        gain_lr_mult: 1.0,
        adamw: AdamW { lr: 1e-4, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 },
        clip: 1.0,
        kl_weight: 0.5,
        seed: 0,
        shuffle: false,
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
