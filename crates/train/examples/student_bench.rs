//! One checkpointed training step (forward + backward, no optimizer) of a random-weight f32
//! student with SmolLM2-135M's geometry (30 layers, d 576, 9/3 heads of 64, FFN 1536, tied
//! 49,152-token head), every layer served by Nyström (W 64, 4 sinks, m 64, prompt = first half):
//! step time, training tokens/s, peak RSS. The loss scores the second half (as `ppl --o1`).
//! Run: `cargo run --release -p cortiq-train --example student_bench [T] [layers]`.

use std::time::Instant;

use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights};
use cortiq_train::gradcheck::Rng;
use cortiq_train::model::{Student, StudentGrads, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, O1Config};
use cortiq_train::rope::{RopeStyle, RopeTable};

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
    let tokens: Vec<u32> = (0..t).map(|i| (i * 7919 % vocab) as u32).collect();
    let targets: Vec<u32> = tokens[1..].iter().copied().chain([0]).collect();
    let teacher = f32v(&mut r, t * vocab, 2.0);
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
