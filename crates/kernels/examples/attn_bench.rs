//! Decode attention's kernel (`kvattn::attend_split`), single thread: ns per (query head, cached
//! position) over splits of 256 positions, for the geometries of the acceptance models, the
//! cache hot (one layer, in L3) or cold (LAYERS copies cycled, read from memory), in each
//! stored type (f32, f16, 8-bit).
//!
//! `cargo run --release -p cortiq-kernels --example attn_bench [LAYERS [f32|f16|q8 ...]]`

use cortiq_kernels::kvattn::{Exp, KvRows, ScoreRule, Split, attend_split, part_len, quantize_q8};
use half::f16;
use std::time::Instant;

/// One layer's keys or values in a stored type.
enum Rows {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Q8(Vec<i8>, Vec<f32>),
}

impl Rows {
    fn new(x: Vec<f32>, kind: &str) -> Rows {
        match kind {
            "f32" => Rows::F32(x),
            "f16" => Rows::F16(x.iter().map(|&v| f16::from_f32(v)).collect()),
            "q8" => {
                let (mut q, mut d) = (Vec::new(), Vec::new());
                quantize_q8(&x, &mut q, &mut d);
                Rows::Q8(q, d)
            }
            _ => panic!("kv type {kind}: f32, f16 or q8"),
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Rows::F32(x) => KvRows::F32(x),
            Rows::F16(x) => KvRows::F16(x),
            Rows::Q8(q, d) => KvRows::Q8 { q, d },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Rows::F32(x) => 4 * x.len(),
            Rows::F16(x) => 2 * x.len(),
            Rows::Q8(q, d) => q.len() + 4 * d.len(),
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let layers: usize = args.next().map_or(1, |v| v.parse().expect("LAYERS: a count"));
    let kinds: Vec<String> = args.collect();
    let kinds = if kinds.is_empty() { vec!["f32".to_string()] } else { kinds };
    for kind in &kinds {
        // (heads per kv head, kv heads, head_dim, positions): Qwen2.5-0.5B, SmolLM2, Gemma3, Qwen3.5.
        for (g, nkv, hd, nk) in [(7usize, 2usize, 64usize, 4096usize), (3, 3, 64, 4096), (4, 1, 256, 4096), (4, 2, 256, 4096)] {
            let stride = nkv * hd;
            let fill = |l: usize, m: usize| -> Vec<f32> {
                (0..nk * stride).map(|i| (((i + l) * m % 1000) as f32 / 1000.0) - 0.5).collect()
            };
            let ks: Vec<Rows> = (0..layers).map(|l| Rows::new(fill(l, 7919), kind)).collect();
            let vs: Vec<Rows> = (0..layers).map(|l| Rows::new(fill(l, 104729), kind)).collect();
            let q: Vec<f32> = (0..nkv * g * hd).map(|i| (i % 13) as f32 / 13.0).collect();
            let rule = ScoreRule { scale: 0.125, softcap: None, exp: Exp::Fast };
            let (mut scratch, mut out) = (Vec::new(), vec![0f32; nkv * g * part_len(hd)]);
            let reps = 100.max(4 * layers);
            // Per pass over every layer: the mean and the fastest (this machine's speed drifts
            // within a run; the fastest pass is the steadiest figure for comparing kernels).
            let (mut all, mut best) = (0f64, f64::INFINITY);
            for pass in 0..reps.div_ceil(layers) {
                let t = Instant::now();
                for l in 0..layers {
                    let (k, v) = (ks[(pass + l) % layers].rows(), vs[(pass + l) % layers].rows());
                    for a in (0..nk).step_by(256) {
                        let s = Split { keys: k, vals: v, stride, off: 0, row0: a, n: 256.min(nk - a) };
                        attend_split(&q, hd, g, &s, &rule, &mut scratch, &mut out);
                    }
                }
                let dt = t.elapsed().as_secs_f64() / layers as f64;
                all += dt;
                best = best.min(dt);
            }
            let dt = all / reps.div_ceil(layers) as f64;
            let per = (nk * g * nkv) as f64;
            println!(
                "{kind} g {g} kv heads {nkv} hd {hd} positions {nk}: {:.2} ns per (head, position) (fastest pass {:.2}), {:.1} GB/s of K/V",
                dt * 1e9 / per,
                best * 1e9 / per,
                (ks[0].bytes() + vs[0].bytes()) as f64 / dt / 1e9
            );
        }
    }
}
