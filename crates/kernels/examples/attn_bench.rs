//! Decode attention's kernel (`kvattn::attend_split`), single thread: ns per (query head, cached
//! position) over splits of 256 positions, for the geometries of the acceptance models, the
//! cache hot (one layer, in L3) or cold (LAYERS copies cycled, read from memory).
//!
//! `cargo run --release -p cortiq-kernels --example attn_bench [LAYERS]`

use cortiq_kernels::kvattn::{Exp, KvRows, ScoreRule, Split, attend_split, part_len};
use std::time::Instant;

fn main() {
    let layers: usize = std::env::args().nth(1).map_or(1, |v| v.parse().expect("LAYERS: a count"));
    // (heads per kv head, kv heads, head_dim, positions): Qwen2.5-0.5B, SmolLM2, Gemma3, Qwen3.5.
    for (g, nkv, hd, nk) in [(7usize, 2usize, 64usize, 4096usize), (3, 3, 64, 4096), (4, 1, 256, 4096), (4, 2, 256, 4096)] {
        let stride = nkv * hd;
        let fill =
            |l: usize, m: usize| -> Vec<f32> { (0..nk * stride).map(|i| (((i + l) * m % 1000) as f32 / 1000.0) - 0.5).collect() };
        let ks: Vec<Vec<f32>> = (0..layers).map(|l| fill(l, 7919)).collect();
        let vs: Vec<Vec<f32>> = (0..layers).map(|l| fill(l, 104729)).collect();
        let q: Vec<f32> = (0..nkv * g * hd).map(|i| (i % 13) as f32 / 13.0).collect();
        let rule = ScoreRule { scale: 0.125, softcap: None, exp: Exp::Fast };
        let (mut scratch, mut out) = (Vec::new(), vec![0f32; nkv * g * part_len(hd)]);
        let reps = 20 * layers.max(1);
        let t = Instant::now();
        for rep in 0..reps {
            let (k, v) = (&ks[rep % layers], &vs[rep % layers]);
            for a in (0..nk).step_by(256) {
                let s = Split { keys: KvRows::F32(k), vals: KvRows::F32(v), stride, off: 0, row0: a, n: 256.min(nk - a) };
                attend_split(&q, hd, g, &s, &rule, &mut scratch, &mut out);
            }
        }
        let dt = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "g {g} kv heads {nkv} hd {hd} positions {nk}: {:.2} ns per (head, position), {:.1} GB/s of K/V",
            dt * 1e9 / (nk * g * nkv) as f64,
            (2 * nk * stride * 4) as f64 / dt / 1e9
        );
    }
}
