//! The PyTorch fixture (tests/fixtures/torch_agreement/, written by tools/fixtures/gen_train.py)
//! loaded as an owned tiny Llama-style student, in f32 or f64: the model of the torch agreement
//! test and of the trainer tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use cortiq_formats::safetensors::HfWeights;
use cortiq_train::Float;
use cortiq_train::act::Act;
use cortiq_train::block::{BlockConfig, BlockMixer, BlockWeights};
use cortiq_train::data::Windows;
use cortiq_train::model::{Student, StudentLayer};
use cortiq_train::norm::NormStyle;
use cortiq_train::nystrom::{Far, O1Config};
use cortiq_train::optim::AdamW;
use cortiq_train::rope::{RopeStyle, RopeTable};
use cortiq_train::trainer::TrainConfig;

pub const LAYER: [&str; 9] = ["attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "gate", "up", "down"];

pub struct Fixture<F> {
    pub meta: BTreeMap<String, String>,
    pub tensors: BTreeMap<String, Vec<F>>,
    pub rope: RopeTable<F>,
    /// [B][T + 1] token windows.
    pub windows: Vec<Vec<u32>>,
    /// [B][(T − tp)·V] teacher logits of the scored rows.
    pub teacher: Vec<Vec<F>>,
}

impl<F: Float> Fixture<F> {
    pub fn load() -> Self {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_agreement/model.safetensors");
        let w = HfWeights::open_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let meta = w.file_metadata(0).cloned().unwrap_or_default();
        let mut tensors = BTreeMap::new();
        for name in w.names().map(str::to_string).collect::<Vec<_>>() {
            let t = w.tensor(&name).unwrap();
            let v: Vec<F> =
                t.data.chunks_exact(4).map(|b| F::from_f64(f32::from_le_bytes(b.try_into().unwrap()) as f64)).collect();
            tensors.insert(name, v);
        }
        let mut fx = Fixture { meta, tensors, rope: RopeTable::new(1, 2, 1.0), windows: vec![], teacher: vec![] };
        let (t, tp, v, b) = (fx.us("T"), fx.us("tp"), fx.us("vocab"), fx.us("batch"));
        fx.rope = RopeTable::new(t, fx.us("head_dim"), fx.f("rope_theta"));
        let toks = fx.tensors.remove("tokens").unwrap();
        fx.windows = toks.chunks_exact(t + 1).map(|w| w.iter().map(|x| x.to_f64() as u32).collect()).collect();
        let te = fx.tensors.remove("teacher").unwrap();
        fx.teacher = te.chunks_exact((t - tp) * v).map(|c| c.to_vec()).collect();
        assert_eq!((fx.windows.len(), fx.teacher.len()), (b, b), "fixture batch");
        fx
    }

    pub fn f(&self, k: &str) -> f64 {
        self.meta.get(k).unwrap_or_else(|| panic!("fixture metadata lacks {k}")).parse().unwrap()
    }
    pub fn us(&self, k: &str) -> usize {
        self.meta.get(k).unwrap_or_else(|| panic!("fixture metadata lacks {k}")).parse().unwrap()
    }
    /// A comma-separated metadata list.
    pub fn list(&self, k: &str) -> Vec<f64> {
        self.meta[k].split(',').map(|x| x.parse().unwrap()).collect()
    }
    fn t(&self, k: &str) -> &[F] {
        self.tensors.get(k).unwrap_or_else(|| panic!("fixture lacks tensor {k}"))
    }

    pub fn block_config(&self) -> BlockConfig {
        let o1 = O1Config {
            window: self.us("window"),
            sinks: self.us("sinks"),
            landmarks: self.us("landmarks"),
            ridge: self.f("ridge"),
            far: Far::Skeleton,
        };
        BlockConfig {
            d_model: self.us("d"),
            n_heads: self.us("heads"),
            n_kv_heads: self.us("kv_heads"),
            head_dim: self.us("head_dim"),
            d_ff: self.us("ffn"),
            norm_eps: self.f("norm_eps"),
            norm_style: NormStyle::Plain,
            act: Act::Silu,
            attn_scale: 1.0 / (self.us("head_dim") as f64).sqrt(),
            rope_style: RopeStyle::NeoX,
            mixer: BlockMixer::Nystrom { cfg: o1, tp: self.us("tp") },
        }
    }

    /// The student: every layer Nyström and trainable.
    pub fn student(&self) -> Student<'_, F> {
        let cfg = self.block_config();
        let layers = (0..self.us("layers"))
            .map(|l| {
                let g = |n: &str| self.t(&format!("layers.{l}.{n}"));
                let w = BlockWeights {
                    attn_norm: g("attn_norm"),
                    wq: g("wq"),
                    wk: g("wk"),
                    wv: g("wv"),
                    bq: None,
                    bk: None,
                    bv: None,
                    q_norm: None,
                    k_norm: None,
                    wo: g("wo"),
                    post_attn_norm: None,
                    ffn_norm: g("ffn_norm"),
                    gate: g("gate"),
                    up: g("up"),
                    down: g("down"),
                    post_ffn_norm: None,
                    far: None,
                    vmf: None,
                };
                StudentLayer { cfg, w, rope: &self.rope, train: true, train_vmf: false }
            })
            .collect();
        Student {
            embed: self.t("embed"),
            embed_scale: None,
            layers,
            final_norm: self.t("final_norm"),
            norm_style: NormStyle::Plain,
            norm_eps: self.f("norm_eps"),
            lm_head: self.t("lm_head"),
            vocab: self.us("vocab"),
            d_model: self.us("d"),
        }
    }

    /// The run of the fixture (fixed order: torch walks the one batch as given).
    pub fn train_config(&self) -> TrainConfig {
        TrainConfig {
            ctx: self.us("T"),
            batch: self.us("batch"),
            steps: self.us("steps") as u64,
            warmup: self.us("warmup") as u64,
            lr: self.f("lr"),
            min_lr: self.f("min_lr"),
            gain_lr_mult: 1.0,
            far_lr_mult: 1.0,
            vmf_lr_mult: 1.0,
            vmf_copied_mult: 1.0,
            adamw: AdamW {
                lr: self.f("lr"),
                beta1: self.f("beta1"),
                beta2: self.f("beta2"),
                eps: self.f("eps"),
                weight_decay: self.f("weight_decay"),
            },
            clip: self.f("clip"),
            kl_weight: self.f("kl_weight"),
            seed: 0,
            shuffle: false,
            score_all: false,
        }
    }

    pub fn windows(&self) -> Windows {
        Windows { ctx: self.us("T"), windows: self.windows.clone() }
    }

    /// Teacher logits [T, V] of a fixture window (rows before tp are zeros: never scored).
    pub fn teacher_for(&self, inputs: &[u32]) -> Result<Vec<F>, String> {
        let (t, tp, v) = (self.us("T"), self.us("tp"), self.us("vocab"));
        let b = self.windows.iter().position(|w| &w[..t] == inputs).ok_or("window not in the fixture")?;
        let mut z = vec![F::ZERO; tp * v];
        z.extend_from_slice(&self.teacher[b]);
        Ok(z)
    }
}
