//! BERT encoders for sentence embeddings (issue 51: all-MiniLM-L6-v2 and its kin, the models
//! retrieval apps embed with): word + absolute position + token-type embeddings and a
//! LayerNorm, then per layer bidirectional multi-head attention with biases, add & LayerNorm,
//! a GELU (erf) FFN, add & LayerNorm (post-LN); the last hidden state pooled and normalized as
//! sentence-transformers' `Pooling` and `Normalize` modules do.
//!
//! Written here rather than as a decoder `Model`: no causal mask, no KV state, no LM head, and
//! norms with biases — nothing of the decoder's serving machinery applies. These models are
//! small (22M parameters for MiniLM-L6): their weights are read once into f32, products go
//! through `dot::gemm_nt`, rows of a product split over the pool.

use std::path::Path;

use cortiq_formats::safetensors::HfWeights;
use cortiq_kernels::dot::gemm_nt;
use cortiq_kernels::quant::dequantize_row;

use crate::error::{EngineError, Result};
use crate::model::Pooling;
use crate::par::pool;

/// The encoder's shape, from its config.json.
#[derive(Clone, Debug)]
pub struct EncoderConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub d_ff: usize,
    pub max_positions: usize,
    /// The longest input the model was trained to embed (sentence-transformers'
    /// `max_seq_length`, which cuts longer ones), at most `max_positions`.
    pub max_seq: usize,
    pub eps: f32,
}

/// A linear map y = W x + b, W [out, in] row-major.
struct Linear {
    w: Vec<f32>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
}

impl Linear {
    /// x [n, inp] -> [n, out]
    fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; n * self.out];
        pool().for_cols_mut(&mut y, n, self.out, 16, |c0, outs| {
            let cols = outs[0].len();
            let w = &self.w[c0 * self.inp..(c0 + cols) * self.inp];
            let mut tile = vec![0f32; n * cols];
            gemm_nt(x, n, w, cols, self.inp, &mut tile, cols);
            for (t, row) in tile.chunks_exact(cols).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    outs[t][j] = v + self.b[c0 + j];
                }
            }
        });
        y
    }
}

struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
}

struct EncLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ln_attn: Norm,
    up: Linear,
    down: Linear,
    ln_ffn: Norm,
}

/// A loaded BERT encoder.
pub struct Encoder {
    pub cfg: EncoderConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    ln_embed: Norm,
    layers: Vec<EncLayer>,
}

impl Encoder {
    /// From an HF folder holding a BERT config.json and its safetensors (`BertModel` names,
    /// with or without the `bert.` prefix of a task model).
    pub fn load(dir: &Path) -> Result<Encoder> {
        let file = dir.display().to_string();
        let bad = |what: String| EngineError::BadConfig { file: file.clone(), what };
        let text = std::fs::read_to_string(dir.join("config.json")).map_err(|e| bad(format!("config.json: {e}")))?;
        let c: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("config.json: {e}")))?;
        let get = |k: &str| {
            c.get(k).and_then(serde_json::Value::as_u64).map(|v| v as usize).ok_or_else(|| bad(format!("config.json: no '{k}'")))
        };
        if c.get("model_type").and_then(serde_json::Value::as_str) != Some("bert") {
            return Err(bad("config.json: not a BERT encoder (model_type is not \"bert\")".into()));
        }
        let act = c.get("hidden_act").and_then(serde_json::Value::as_str).unwrap_or("gelu");
        if act != "gelu" {
            return Err(EngineError::Unsupported(format!("{file}: hidden_act {act:?} (gelu only)")));
        }
        let cfg = EncoderConfig {
            vocab: get("vocab_size")?,
            d_model: get("hidden_size")?,
            n_layers: get("num_hidden_layers")?,
            n_heads: get("num_attention_heads")?,
            d_ff: get("intermediate_size")?,
            max_positions: get("max_position_embeddings")?,
            max_seq: std::fs::read_to_string(dir.join("sentence_bert_config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|c| c.get("max_seq_length")?.as_u64())
                .map_or(usize::MAX, |n| n as usize),
            eps: c.get("layer_norm_eps").and_then(serde_json::Value::as_f64).unwrap_or(1e-12) as f32,
        };
        let cfg = EncoderConfig { max_seq: cfg.max_seq.min(cfg.max_positions), ..cfg };
        if cfg.n_heads == 0 || !cfg.d_model.is_multiple_of(cfg.n_heads) {
            return Err(bad(format!("hidden_size {} is not a multiple of {} heads", cfg.d_model, cfg.n_heads)));
        }
        let w = HfWeights::open_dir(dir)?;
        let prefix = if w.contains("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let full = format!("{prefix}{name}");
            let t = w.get(&full)?.ok_or_else(|| EngineError::MissingTensor { file: file.clone(), tensor: full.clone() })?;
            if t.shape != shape {
                return Err(EngineError::ShapeMismatch {
                    file: file.clone(),
                    tensor: full,
                    expected: shape.to_vec(),
                    found: t.shape,
                });
            }
            let mut out = vec![0f32; shape.iter().product()];
            dequantize_row(t.dtype, t.data, &mut out);
            Ok(out)
        };
        let (d, f) = (cfg.d_model, cfg.d_ff);
        let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
            Ok(Linear { w: read(&format!("{name}.weight"), &[out, inp])?, b: read(&format!("{name}.bias"), &[out])?, out, inp })
        };
        let norm = |name: &str| -> Result<Norm> {
            Ok(Norm { g: read(&format!("{name}.weight"), &[d])?, b: read(&format!("{name}.bias"), &[d])? })
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let p = format!("encoder.layer.{i}");
                Ok(EncLayer {
                    q: linear(&format!("{p}.attention.self.query"), d, d)?,
                    k: linear(&format!("{p}.attention.self.key"), d, d)?,
                    v: linear(&format!("{p}.attention.self.value"), d, d)?,
                    o: linear(&format!("{p}.attention.output.dense"), d, d)?,
                    ln_attn: norm(&format!("{p}.attention.output.LayerNorm"))?,
                    up: linear(&format!("{p}.intermediate.dense"), f, d)?,
                    down: linear(&format!("{p}.output.dense"), d, f)?,
                    ln_ffn: norm(&format!("{p}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let types = w.meta(&format!("{prefix}embeddings.token_type_embeddings.weight")).map_or(1, |m| m.shape[0]);
        Ok(Encoder {
            word: read("embeddings.word_embeddings.weight", &[cfg.vocab, d])?,
            position: read("embeddings.position_embeddings.weight", &[cfg.max_positions, d])?,
            token_type: read("embeddings.token_type_embeddings.weight", &[types, d])?,
            ln_embed: norm("embeddings.LayerNorm")?,
            layers,
            cfg,
        })
    }

    /// The last hidden state of one input (token type 0, no padding). -> [n, d_model]
    pub fn hidden(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.hidden_batch(&[tokens])
    }

    /// The last hidden states of several inputs in one pass over the weights: their rows
    /// stacked ([Σn, d_model], in order), every product over all of them, attention within
    /// each input (as if each ran alone, unpadded).
    pub fn hidden_batch(&self, inputs: &[&[u32]]) -> Result<Vec<f32>> {
        let d = self.cfg.d_model;
        let mut spans = Vec::with_capacity(inputs.len());
        for tokens in inputs {
            let n = tokens.len();
            if n == 0 {
                return Err(EngineError::EmptyEntry);
            }
            if n > self.cfg.max_positions {
                return Err(EngineError::ContextOverflow { what: "encoder".into(), n_tokens: n, n_ctx: self.cfg.max_positions });
            }
            if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
                return Err(EngineError::BadToken { id, vocab: self.cfg.vocab });
            }
            let start = spans.last().map_or(0, |r: &std::ops::Range<usize>| r.end);
            spans.push(start..start + n);
        }
        let rows = spans.last().map_or(0, |r| r.end);
        let mut x = vec![0f32; rows * d];
        for (tokens, span) in inputs.iter().zip(&spans) {
            for (t, row) in x[span.start * d..span.end * d].chunks_exact_mut(d).enumerate() {
                let (w, p) = (&self.word[tokens[t] as usize * d..][..d], &self.position[t * d..][..d]);
                for j in 0..d {
                    row[j] = w[j] + p[j] + self.token_type[j];
                }
            }
        }
        layer_norm(&mut x, d, &self.ln_embed, self.cfg.eps);
        for l in &self.layers {
            let a = self.attention(l, &x, &spans);
            let mut h = l.o.apply(&a, rows);
            h.iter_mut().zip(&x).for_each(|(h, x)| *h += x);
            layer_norm(&mut h, d, &l.ln_attn, self.cfg.eps);
            let mut up = l.up.apply(&h, rows);
            up.iter_mut().for_each(|v| *v = gelu_erf(*v));
            let mut y = l.down.apply(&up, rows);
            y.iter_mut().zip(&h).for_each(|(y, h)| *y += h);
            layer_norm(&mut y, d, &l.ln_ffn, self.cfg.eps);
            x = y;
        }
        Ok(x)
    }

    /// Bidirectional attention of every position over the positions of its own input
    /// (`spans`: each input's rows). x [rows, d] -> [rows, d]
    fn attention(&self, l: &EncLayer, x: &[f32], spans: &[std::ops::Range<usize>]) -> Vec<f32> {
        let (d, h) = (self.cfg.d_model, self.cfg.n_heads);
        let hd = d / h;
        let rows = spans.last().map_or(0, |r| r.end);
        let (q, k, v) = (l.q.apply(x, rows), l.k.apply(x, rows), l.v.apply(x, rows));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut out = vec![0f32; rows * d];
        pool().for_rows_mut(&mut out, d, 1, |t0, chunk| {
            let mut s = Vec::new();
            for (i, row) in chunk.chunks_exact_mut(d).enumerate() {
                let t = t0 + i;
                let span = &spans[spans.partition_point(|r| r.end <= t)];
                s.resize(span.len(), 0f32);
                for hh in 0..h {
                    let qi = &q[t * d + hh * hd..][..hd];
                    for (su, u) in s.iter_mut().zip(span.clone()) {
                        *su = qi.iter().zip(&k[u * d + hh * hd..][..hd]).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut z = 0f32;
                    s.iter_mut().for_each(|v| {
                        *v = (*v - m).exp();
                        z += *v;
                    });
                    let o = &mut row[hh * hd..(hh + 1) * hd];
                    for (&p, u) in s.iter().zip(span.clone()) {
                        let vu = &v[u * d + hh * hd..][..hd];
                        o.iter_mut().zip(vu).for_each(|(o, v)| *o += p / z * v);
                    }
                }
            }
        });
        out
    }

    /// One input's sentence embedding: the last hidden state pooled (`pooling`), scaled to
    /// unit length when `normalize` (sentence-transformers' Pooling and Normalize on one
    /// unpadded input). -> [d_model]
    pub fn embed(&self, tokens: &[u32], pooling: Pooling, normalize: bool) -> Result<Vec<f32>> {
        Ok(self.embed_batch(&[tokens.to_vec()], pooling, normalize)?.remove(0))
    }

    /// Sentence embeddings of several inputs, equal to `embed` of each: groups of at most
    /// `EMBED_ROWS` positions run as one batch (one pass over the weights per group).
    pub fn embed_batch(&self, inputs: &[Vec<u32>], pooling: Pooling, normalize: bool) -> Result<Vec<Vec<f32>>> {
        let d = self.cfg.d_model;
        let mut out = Vec::with_capacity(inputs.len());
        let mut i = 0;
        while i < inputs.len() {
            let mut j = i + 1;
            let mut n = inputs[i].len();
            while j < inputs.len() && n + inputs[j].len() <= EMBED_ROWS {
                n += inputs[j].len();
                j += 1;
            }
            let group: Vec<&[u32]> = inputs[i..j].iter().map(Vec::as_slice).collect();
            let x = self.hidden_batch(&group)?;
            let mut at = 0;
            for t in &group {
                out.push(crate::model::pool_rows(&x[at * d..(at + t.len()) * d], d, pooling, normalize));
                at += t.len();
            }
            i = j;
        }
        Ok(out)
    }

    /// Parameters (the f32 values it holds).
    pub fn param_count(&self) -> u64 {
        let lin = |l: &Linear| (l.w.len() + l.b.len()) as u64;
        let norm = |n: &Norm| (n.g.len() + n.b.len()) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| {
                lin(&l.q) + lin(&l.k) + lin(&l.v) + lin(&l.o) + lin(&l.up) + lin(&l.down) + norm(&l.ln_attn) + norm(&l.ln_ffn)
            })
            .sum();
        layers + (self.word.len() + self.position.len() + self.token_type.len()) as u64 + norm(&self.ln_embed)
    }
}

/// Positions one batch of `Encoder::embed_batch` holds at most: short inputs share a pass over
/// the weights (MiniLM-L6's 22M f32 parameters, 90 MB, outlive no cache).
const EMBED_ROWS: usize = 2048;

/// Whether `dir` holds a BERT encoder (config.json's `model_type` "bert").
pub fn is_encoder_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|c| c.get("model_type").and_then(serde_json::Value::as_str) == Some("bert"))
}

/// The pooling a sentence-transformers folder declares (its `modules.json` lists a Pooling
/// module whose config.json sets one `pooling_mode_*`), and whether a Normalize module follows;
/// None for a folder without those.
pub fn declared_pooling(dir: &Path) -> Option<(Pooling, bool)> {
    let read = |p: &Path| std::fs::read_to_string(p).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
    let modules = read(&dir.join("modules.json"))?;
    let modules = modules.as_array()?;
    let kind = |m: &serde_json::Value| m.get("type").and_then(serde_json::Value::as_str).unwrap_or("").to_string();
    let pool = modules.iter().find(|m| kind(m).ends_with("Pooling"))?;
    let path = pool.get("path").and_then(serde_json::Value::as_str)?;
    let cfg = read(&dir.join(path).join("config.json"))?;
    let on = |k: &str| cfg.get(k).and_then(serde_json::Value::as_bool) == Some(true);
    let pooling = if on("pooling_mode_lasttoken") {
        Pooling::Last
    } else if on("pooling_mode_cls_token") {
        Pooling::First
    } else if on("pooling_mode_mean_tokens") {
        Pooling::Mean
    } else {
        return None;
    };
    Some((pooling, modules.iter().any(|m| kind(m).ends_with("Normalize"))))
}

/// LayerNorm over each row of `x` [n, d] in place: (x - mean) / sqrt(var + eps) · g + b, the
/// statistics in f64.
fn layer_norm(x: &mut [f32], d: usize, n: &Norm, eps: f32) {
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / d as f64;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        for ((v, g), b) in row.iter_mut().zip(&n.g).zip(&n.b) {
            *v = ((f64::from(*v) - mean) * inv) as f32 * g + b;
        }
    }
}

/// GELU with the error function (BERT's `gelu`): x/2 · (1 + erf(x/√2)).
fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// erf(x) from the complementary function's Chebyshev fit (Numerical Recipes' `erfcc`,
/// fractional error below 1.2e-7): std has no erf.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 { 1.0 - erfc } else { erfc - 1.0 }
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_to_its_tolerance() {
        // erf at known points (Abramowitz & Stegun table 7.1)
        for (x, e) in
            [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (2.0, 0.995_322_265_0), (-1.0, -0.842_700_792_9)]
        {
            assert!((erf(x) - e).abs() < 2e-7, "erf({x}) = {} vs {e}", erf(x));
        }
    }
}
