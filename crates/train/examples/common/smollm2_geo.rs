//! Shared by the trainer examples (`student_bench`, `trainer_bench`): a random-weight f32
//! student with SmolLM2-135M's geometry (d 576, 9/3 heads of 64, FFN 1536, tied 49,152-token
//! head), every layer served by Nyström (W 64, 4 sinks, m 64, prompt = first half of T), drawn
//! in the order tools/bench/train_step_torch.py draws it; and the process's peak RSS.

use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights};
use cortiq_train::gradcheck::Rng;
use cortiq_train::model::{Student, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{DEFAULT_RIDGE, Far, O1Config};
use cortiq_train::rope::{RopeStyle, RopeTable};

pub const D: usize = 576;
pub const VOCAB: usize = 49152;
const NH: usize = 9;
const NKV: usize = 3;
const HD: usize = 64;
const FF: usize = 1536;

pub fn f32v(r: &mut Rng, n: usize, s: f64) -> Vec<f32> {
    (0..n).map(|_| (r.uniform() * 2.0 - 1.0) as f32 * s as f32 * 1.7).collect()
}

/// Peak resident set (VmHWM) in MB.
pub fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The weights the student borrows; `r` continues the draw (the teacher's logits come next).
pub struct Geo {
    /// Per layer: attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down.
    layers: Vec<Vec<Vec<f32>>>,
    embed: Vec<f32>,
    final_norm: Vec<f32>,
    rope: RopeTable<f32>,
    cfg: BlockConfig,
    pub r: Rng,
}

impl Geo {
    pub fn new(t: usize, n_layers: usize) -> Self {
        let (d, nh, nkv, hd, ff) = (D, NH, NKV, HD, FF);
        let mut r = Rng(1);
        let layers = (0..n_layers)
            .map(|_| {
                vec![
                    vec![1.0; d],
                    f32v(&mut r, nh * hd * d, 0.04),
                    f32v(&mut r, nkv * hd * d, 0.04),
                    f32v(&mut r, nkv * hd * d, 0.04),
                    f32v(&mut r, d * nh * hd, 0.04),
                    vec![1.0; d],
                    f32v(&mut r, ff * d, 0.04),
                    f32v(&mut r, ff * d, 0.04),
                    f32v(&mut r, d * ff, 0.025),
                ]
            })
            .collect();
        let embed = f32v(&mut r, VOCAB * d, 0.05);
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
        Geo { layers, embed, final_norm: vec![1.0; d], rope: RopeTable::new(t, hd, 100_000.0), cfg, r }
    }

    pub fn student(&self) -> Student<'_, f32> {
        Student {
            embed: &self.embed,
            embed_scale: None,
            layers: self
                .layers
                .iter()
                .map(|l| StudentLayer {
                    cfg: self.cfg,
                    w: BlockWeights {
                        attn_norm: &l[0],
                        wq: &l[1],
                        wk: &l[2],
                        wv: &l[3],
                        bq: None,
                        bk: None,
                        bv: None,
                        q_norm: None,
                        k_norm: None,
                        wo: &l[4],
                        post_attn_norm: None,
                        ffn_norm: &l[5],
                        gate: &l[6],
                        up: &l[7],
                        down: &l[8],
                        post_ffn_norm: None,
                        far: None,
                        vmf: None,
                    },
                    rope: &self.rope,
                    train: true,
                    train_vmf: false,
                })
                .collect(),
            final_norm: &self.final_norm,
            norm_style: NormStyle::Plain,
            norm_eps: 1e-5,
            lm_head: &self.embed,
            vocab: VOCAB,
            d_model: D,
        }
    }
}
