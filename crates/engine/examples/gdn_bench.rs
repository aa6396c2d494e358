//! GatedDeltaNet mixer timing at Qwen3.5-0.8B-like geometry (d_model 1024, 16 key and value
//! heads of 128, conv kernel 4), f32 random weights: a 512-token prefill (chunked WY form) and
//! 64 single-token decode steps, with the kernel part (the delta rule alone) shown apart.
//!
//! `cargo run --release -p cortiq-engine --example gdn_bench`

use std::time::Instant;

use cortiq_engine::mixers::gdn::{GdnConfig, GdnState, GdnWeights, OutGate, gated_deltanet};
use cortiq_engine::qtensor::QTensor;
use cortiq_kernels::delta::{CHUNK, gated_delta_chunked, gated_delta_recurrent};

fn main() {
    let cfg = GdnConfig {
        d_model: 1024,
        n_k_heads: 16,
        n_v_heads: 16,
        d_k: 128,
        d_v: 128,
        conv_kernel: 4,
        norm_eps: 1e-6,
        out_gate: OutGate::Silu,
        v_tiled: false,
    };
    let mut s = 0x1234_5678u64;
    let mut v = |n: usize, sc: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * sc
            })
            .collect()
    };
    let d = cfg.d_model;
    let t =
        |name: &str, r: usize, c: usize, v: &mut dyn FnMut(usize, f32) -> Vec<f32>| QTensor::from_f32(name, r, c, v(r * c, 0.03));
    let w = GdnWeights {
        in_proj_qkv: t("qkv", cfg.conv_dim(), d, &mut v),
        in_proj_z: t("z", cfg.value_dim(), d, &mut v),
        in_proj_b: t("b", cfg.n_v_heads, d, &mut v),
        in_proj_a: t("a", cfg.n_v_heads, d, &mut v),
        conv: v(cfg.conv_dim() * 4, 0.5),
        dt_bias: v(16, 1.0),
        a: v(16, 1.0).iter().map(|x| -x.exp()).collect(),
        norm: vec![1.0; 128],
        out_proj: t("out", d, cfg.value_dim(), &mut v),
    };
    let n = 512;
    let h = v(n * d, 1.0);
    let mut st = GdnState::new(&cfg);
    let t0 = Instant::now();
    let _ = gated_deltanet(&cfg, &w, &h, n, &mut st);
    let pre = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for i in 0..64 {
        let _ = gated_deltanet(&cfg, &w, &h[i * d..(i + 1) * d], 1, &mut st);
    }
    let dec = t1.elapsed().as_secs_f64() / 64.0;
    // The delta rule alone, one head, 512 tokens.
    let (dk, dv) = (128, 128);
    let q = v(n * dk, 0.05);
    let k = v(n * dk, 0.05);
    let vv = v(n * dv, 1.0);
    let g: Vec<f32> = v(n, 0.1).iter().map(|x| -x.abs()).collect();
    let beta = vec![0.5f32; n];
    let (mut s1, mut o1) = (vec![0f32; dk * dv], vec![0f32; n * dv]);
    let t2 = Instant::now();
    gated_delta_chunked(&q, &k, &vv, &g, &beta, n, dk, dv, CHUNK, &mut s1, &mut o1);
    let chunk_head = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    gated_delta_recurrent(&q, &k, &vv, &g, &beta, n, dk, dv, &mut s1, &mut o1);
    let rec_head = t3.elapsed().as_secs_f64();
    println!("GDN layer, 512-token prefill: {:.1} ms; decode step: {:.3} ms", pre * 1e3, dec * 1e3);
    println!("delta rule, one head x 512 tokens: chunked {:.2} ms, recurrent {:.2} ms", chunk_head * 1e3, rec_head * 1e3);
}
