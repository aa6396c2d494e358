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
use std::sync::Mutex;

use cortiq_formats::safetensors::HfWeights;
use cortiq_kernels::act::{exp_fast, softmax_fast};
use cortiq_kernels::dot::gemm_nn;
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

/// A linear map y = W x + b, held transposed and packed: Wᵀ [in, out] cut into panels of
/// `PANEL` output columns, each panel [in, PANEL] contiguous, so that a batch of rows is a
/// register-blocked product over one panel at a time (`dot::gemm_nn`) whose weight rows are
/// adjacent (unpacked, each k stepped a whole row of Wᵀ ahead: a page apart for the FFN, and
/// the product ran at two thirds the speed). Every output is one FMA chain over the inputs in
/// order, whatever the batch, so a batch equals its inputs run alone.
struct Linear {
    panels: Vec<f32>,
    b: Vec<f32>,
    out: usize,
    inp: usize,
}

/// Output columns per packed panel (the product's 2 × 16-lane register block).
const PANEL: usize = 32;

impl Linear {
    fn new(w: Vec<f32>, b: Vec<f32>, out: usize, inp: usize) -> Linear {
        let mut panels = vec![0f32; w.len()];
        for c0 in (0..out).step_by(PANEL) {
            let wp = PANEL.min(out - c0);
            let panel = &mut panels[c0 * inp..(c0 + wp) * inp];
            for i in 0..inp {
                for j in 0..wp {
                    panel[i * wp + j] = w[(c0 + j) * inp + i];
                }
            }
        }
        Linear { panels, b, out, inp }
    }

    /// x [n, inp] -> y [n, out] (written whole), rows split over the pool; `then(first_row,
    /// rows)` finishes each thread's rows where they were computed (the activation, the
    /// residual and its norm).
    fn apply(&self, x: &[f32], n: usize, y: &mut [f32], then: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let (out, inp) = (self.out, self.inp);
        let y = &mut y[..n * out];
        pool().for_rows_mut(y, out, 8, |t0, rows| {
            let nr = rows.len() / out;
            let xs = &x[t0 * inp..(t0 + nr) * inp];
            for c0 in (0..out).step_by(PANEL) {
                let wp = PANEL.min(out - c0);
                gemm_nn(xs, nr, &self.panels[c0 * inp..(c0 + wp) * inp], wp, inp, wp, &mut rows[c0..], out);
            }
            for row in rows.chunks_exact_mut(out) {
                row.iter_mut().zip(&self.b).for_each(|(v, b)| *v += b);
            }
            then(t0, rows);
        });
    }
}

struct Norm {
    g: Vec<f32>,
    b: Vec<f32>,
}

struct EncLayer {
    /// Q, K and V as one product.
    qkv: Linear,
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
    /// The forward's buffers, kept between calls: a fresh [2048, 1536] buffer per product was
    /// page faults and zeroing at every layer.
    scratch: Mutex<Scratch>,
}

/// `Encoder::hidden_batch`'s activations.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    a: Vec<f32>,
    h: Vec<f32>,
    up: Vec<f32>,
}

impl Encoder {
    /// From an HF folder holding a BERT config.json and its safetensors (`BertModel` names,
    /// with or without the `bert.` prefix of a task model), or a GGUF file of architecture
    /// `bert` (llama.cpp's converter's names; any weight type it dequantizes).
    pub fn load(path: &Path) -> Result<Encoder> {
        if path.is_file() {
            return Self::load_gguf(path);
        }
        let dir = path;
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
        let max_positions = get("max_position_embeddings")?;
        let max_seq = std::fs::read_to_string(dir.join("sentence_bert_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|c| c.get("max_seq_length")?.as_u64())
            .map_or(max_positions, |n| (n as usize).min(max_positions));
        let cfg = EncoderConfig {
            vocab: get("vocab_size")?,
            d_model: get("hidden_size")?,
            n_layers: get("num_hidden_layers")?,
            n_heads: get("num_attention_heads")?,
            d_ff: get("intermediate_size")?,
            max_positions,
            max_seq,
            eps: c.get("layer_norm_eps").and_then(serde_json::Value::as_f64).unwrap_or(1e-12) as f32,
        };
        let w = HfWeights::open_dir(dir)?;
        let prefix = if w.contains("bert.embeddings.word_embeddings.weight") { "bert." } else { "" };
        let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let full = format!("{prefix}{name}");
            let t = w.get(&full)?.ok_or_else(|| EngineError::MissingTensor { file: file.clone(), tensor: full.clone() })?;
            to_f32(&file, &full, t.dtype, t.data, &t.shape, shape)
        };
        let types = w.meta(&format!("{prefix}embeddings.token_type_embeddings.weight")).map_or(1, |m| m.shape[0]);
        Self::build(cfg, &file, types, &read)
    }

    /// From a GGUF file of architecture `bert` (`convert_hf_to_gguf.py`'s tensor names).
    fn load_gguf(path: &Path) -> Result<Encoder> {
        let g = cortiq_formats::gguf::Gguf::open(path)?;
        let file = path.display().to_string();
        let arch = g.architecture()?;
        if arch != "bert" {
            return Err(EngineError::BadConfig { file, what: format!("architecture {arch:?} is not a BERT encoder") });
        }
        let n = |k: &str| g.get_u64(&format!("bert.{k}")).map(|v| v as usize);
        let max_positions = n("context_length")?;
        let word = g
            .tensor("token_embd.weight")
            .ok_or_else(|| EngineError::MissingTensor { file: file.clone(), tensor: "token_embd.weight".into() })?;
        let cfg = EncoderConfig {
            vocab: word.shape()[0],
            d_model: n("embedding_length")?,
            n_layers: n("block_count")?,
            n_heads: n("attention.head_count")?,
            d_ff: n("feed_forward_length")?,
            max_positions,
            max_seq: max_positions,
            eps: g.opt_f64("bert.attention.layer_norm_epsilon")?.unwrap_or(1e-12) as f32,
        };
        let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let full = gguf_name(name);
            let t = g.tensor(&full).ok_or_else(|| EngineError::MissingTensor { file: file.clone(), tensor: full.clone() })?;
            to_f32(&file, &full, t.dtype, g.tensor_data(t), &t.shape(), shape)
        };
        let types = g.tensor("token_types.weight").map_or(1, |t| t.shape()[0]);
        Self::build(cfg, &file, types, &read)
    }

    /// The encoder from its shape and a reader of its tensors by their HF names (without a
    /// task model's prefix), each checked against the shape it must have.
    fn build(cfg: EncoderConfig, file: &str, types: usize, read: &dyn Fn(&str, &[usize]) -> Result<Vec<f32>>) -> Result<Encoder> {
        if cfg.n_heads == 0 || !cfg.d_model.is_multiple_of(cfg.n_heads) {
            let what = format!("hidden_size {} is not a multiple of {} heads", cfg.d_model, cfg.n_heads);
            return Err(EngineError::BadConfig { file: file.to_string(), what });
        }
        let (d, f) = (cfg.d_model, cfg.d_ff);
        let linear = |name: &str, out: usize, inp: usize| -> Result<Linear> {
            Ok(Linear::new(read(&format!("{name}.weight"), &[out, inp])?, read(&format!("{name}.bias"), &[out])?, out, inp))
        };
        let norm = |name: &str| -> Result<Norm> {
            Ok(Norm { g: read(&format!("{name}.weight"), &[d])?, b: read(&format!("{name}.bias"), &[d])? })
        };
        let layers = (0..cfg.n_layers)
            .map(|i| {
                let p = format!("encoder.layer.{i}");
                // Q, K and V stacked into one [3d, d] map (their outputs side by side).
                let (mut w, mut b) = (Vec::with_capacity(3 * d * d), Vec::with_capacity(3 * d));
                for m in ["query", "key", "value"] {
                    w.extend(read(&format!("{p}.attention.self.{m}.weight"), &[d, d])?);
                    b.extend(read(&format!("{p}.attention.self.{m}.bias"), &[d])?);
                }
                Ok(EncLayer {
                    qkv: Linear::new(w, b, 3 * d, d),
                    o: linear(&format!("{p}.attention.output.dense"), d, d)?,
                    ln_attn: norm(&format!("{p}.attention.output.LayerNorm"))?,
                    up: linear(&format!("{p}.intermediate.dense"), f, d)?,
                    down: linear(&format!("{p}.output.dense"), d, f)?,
                    ln_ffn: norm(&format!("{p}.output.LayerNorm"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoder {
            word: read("embeddings.word_embeddings.weight", &[cfg.vocab, d])?,
            position: read("embeddings.position_embeddings.weight", &[cfg.max_positions, d])?,
            token_type: read("embeddings.token_type_embeddings.weight", &[types, d])?,
            ln_embed: norm("embeddings.LayerNorm")?,
            layers,
            cfg,
            scratch: Mutex::new(Scratch::default()),
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
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let Scratch { x, qkv, a, h, up } = &mut *guard;
        for (buf, width) in [(&mut *x, d), (&mut *qkv, 3 * d), (&mut *a, d), (&mut *h, d), (&mut *up, self.cfg.d_ff)] {
            if buf.len() < rows * width {
                buf.resize(rows * width, 0.0);
            }
        }
        for (tokens, span) in inputs.iter().zip(&spans) {
            for (t, row) in x[span.start * d..span.end * d].chunks_exact_mut(d).enumerate() {
                let (w, p) = (&self.word[tokens[t] as usize * d..][..d], &self.position[t * d..][..d]);
                for j in 0..d {
                    row[j] = w[j] + p[j] + self.token_type[j];
                }
            }
        }
        let eps = self.cfg.eps;
        pool().for_rows_mut(&mut x[..rows * d], d, 8, |_, rows| layer_norm(rows, d, &self.ln_embed, eps));
        for l in &self.layers {
            l.qkv.apply(x, rows, qkv, &|_, _| {});
            self.attention(qkv, &spans, a);
            l.o.apply(a, rows, h, &add_norm(x, &l.ln_attn, d, eps));
            l.up.apply(h, rows, up, &|_, r| gelu_erf(r));
            l.down.apply(up, rows, x, &add_norm(h, &l.ln_ffn, d, eps));
        }
        Ok(x[..rows * d].to_vec())
    }

    /// Bidirectional attention of every position over the positions of its own input
    /// (`spans`: each input's rows), from the rows of Q, K and V side by side (`qkv` [rows,
    /// 3d]) into `out` [rows, d]. Per input and head, on each thread's share of the query rows:
    /// S = Q·Kᵀ and O = softmax(S)·V as register-blocked products (`gemm_nn`: each output one
    /// FMA chain in order, so a row's values do not depend on which rows share the call).
    fn attention(&self, qkv: &[f32], spans: &[std::ops::Range<usize>], out: &mut [f32]) {
        let (d, h) = (self.cfg.d_model, self.cfg.n_heads);
        let hd = d / h;
        let rows = spans.last().map_or(0, |r| r.end);
        let scale = 1.0 / (hd as f32).sqrt();
        pool().for_rows_mut(&mut out[..rows * d], d, 1, |t0, chunk| {
            let (mut q, mut kt, mut s) = (Vec::new(), Vec::new(), Vec::new());
            let t1 = t0 + chunk.len() / d;
            let first = spans.partition_point(|r| r.end <= t0);
            for span in spans[first..].iter().take_while(|r| r.start < t1) {
                let (qa, qb) = (span.start.max(t0), span.end.min(t1));
                let (m, n) = (qb - qa, span.len());
                for hh in 0..h {
                    // Q rows of this share, scaled; Kᵀ [hd, n] of the whole input
                    q.clear();
                    for t in qa..qb {
                        q.extend(qkv[t * 3 * d + hh * hd..][..hd].iter().map(|v| v * scale));
                    }
                    kt.resize(hd * n, 0.0);
                    for (u, t) in span.clone().enumerate() {
                        for (j, &v) in qkv[t * 3 * d + d + hh * hd..][..hd].iter().enumerate() {
                            kt[j * n + u] = v;
                        }
                    }
                    s.resize(m * n, 0.0);
                    gemm_nn(&q, m, &kt, n, hd, n, &mut s, n);
                    s.chunks_exact_mut(n).for_each(softmax_fast);
                    let v = &qkv[span.start * 3 * d + 2 * d + hh * hd..];
                    gemm_nn(&s, m, v, 3 * d, n, hd, &mut chunk[(qa - t0) * d + hh * hd..], d);
                }
            }
        });
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
        let lin = |l: &Linear| (l.panels.len() + l.b.len()) as u64;
        let norm = |n: &Norm| (n.g.len() + n.b.len()) as u64;
        let layers: u64 = self
            .layers
            .iter()
            .map(|l| lin(&l.qkv) + lin(&l.o) + lin(&l.up) + lin(&l.down) + norm(&l.ln_attn) + norm(&l.ln_ffn))
            .sum();
        layers + (self.word.len() + self.position.len() + self.token_type.len()) as u64 + norm(&self.ln_embed)
    }
}

/// A tensor's values as f32, its shape checked.
fn to_f32(
    file: &str,
    name: &str,
    dtype: cortiq_kernels::quant::QuantType,
    data: &[u8],
    got: &[usize],
    want: &[usize],
) -> Result<Vec<f32>> {
    if got != want {
        return Err(EngineError::ShapeMismatch {
            file: file.to_string(),
            tensor: name.to_string(),
            expected: want.to_vec(),
            found: got.to_vec(),
        });
    }
    let mut out = vec![0f32; want.iter().product()];
    dequantize_row(dtype, data, &mut out);
    Ok(out)
}

/// llama.cpp's GGUF name of a BERT tensor's HF name (`convert_hf_to_gguf.py`'s map).
fn gguf_name(hf: &str) -> String {
    const EMBED: [(&str, &str); 4] = [
        ("embeddings.word_embeddings", "token_embd"),
        ("embeddings.position_embeddings", "position_embd"),
        ("embeddings.token_type_embeddings", "token_types"),
        ("embeddings.LayerNorm", "token_embd_norm"),
    ];
    const LAYER: [(&str, &str); 8] = [
        ("attention.self.query", "attn_q"),
        ("attention.self.key", "attn_k"),
        ("attention.self.value", "attn_v"),
        ("attention.output.dense", "attn_output"),
        ("attention.output.LayerNorm", "attn_output_norm"),
        ("intermediate.dense", "ffn_up"),
        ("output.dense", "ffn_down"),
        ("output.LayerNorm", "layer_output_norm"),
    ];
    let (stem, suffix) = hf.rsplit_once('.').unwrap_or((hf, ""));
    if let Some((_, g)) = EMBED.iter().find(|(h, _)| *h == stem) {
        return format!("{g}.{suffix}");
    }
    if let Some(rest) = stem.strip_prefix("encoder.layer.")
        && let Some((i, part)) = rest.split_once('.')
        && let Some((_, g)) = LAYER.iter().find(|(h, _)| *h == part)
    {
        return format!("blk.{i}.{g}.{suffix}");
    }
    hf.to_string()
}

/// Positions one batch of `Encoder::embed_batch` holds at most: short inputs share a pass over
/// the weights, and a batch's activations stay in L2 (MiniLM's FFN middle, 512 × 1536 f32, is
/// 3 MB). 1,000 alice29 sentences on MiniLM (2 threads, Intel Xeon AVX-512, 2026-12-07): 4.1-4.4
/// s at 512, 4.5-5.0 at 256, 5.2 at 2048, slower still at 4096.
const EMBED_ROWS: usize = 512;

/// Whether `path` is a BERT encoder: a folder whose config.json's `model_type` is "bert", or a
/// GGUF file of architecture `bert`.
pub fn is_encoder(path: &Path) -> bool {
    if path.is_file() {
        return cortiq_formats::gguf::Gguf::open(path).is_ok_and(|g| g.architecture().is_ok_and(|a| a == "bert"));
    }
    std::fs::read_to_string(path.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|c| c.get("model_type").and_then(serde_json::Value::as_str) == Some("bert"))
}

/// The pooling a sentence-transformers folder declares (its `modules.json` lists a Pooling
/// module whose config.json sets one `pooling_mode_*`), and whether a Normalize module follows;
/// a GGUF file's `*.pooling_type` (normalized, as llama-server's embeddings are by default);
/// None for a model without either.
pub fn declared_pooling(path: &Path) -> Option<(Pooling, bool)> {
    if path.is_file() {
        let g = cortiq_formats::gguf::Gguf::open(path).ok()?;
        let arch = g.architecture().ok()?.to_string();
        let kind = g.opt_u64(&format!("{arch}.pooling_type")).ok()??;
        return Pooling::from_name(&kind.to_string()).map(|p| (p, true));
    }
    let dir = path;
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

/// A product's finish for a post-LN block: the residual `res` added to each row (rows from
/// `first`), then LayerNorm.
fn add_norm<'a>(res: &'a [f32], n: &'a Norm, d: usize, eps: f32) -> impl Fn(usize, &mut [f32]) + Sync + 'a {
    move |first, rows| {
        rows.iter_mut().zip(&res[first * d..]).for_each(|(y, r)| *y += r);
        layer_norm(rows, d, n, eps);
    }
}

/// LayerNorm over each row of `x` [n, d] in place: (x - mean) / sqrt(var + eps) · g + b. The
/// statistics sum in 16 f32 lanes (vectorized; over a 384-wide row they stay within a few ulp
/// of f64's), the lanes and the division in f64.
fn layer_norm(x: &mut [f32], d: usize, n: &Norm, eps: f32) {
    let lanes = |row: &[f32], f: &dyn Fn(f32) -> f32| -> f64 {
        let mut acc = [0f32; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            acc.iter_mut().zip(c).for_each(|(a, &v)| *a += f(v));
        }
        acc.iter().map(|&a| f64::from(a)).sum::<f64>() + chunks.remainder().iter().map(|&v| f64::from(f(v))).sum::<f64>()
    };
    for row in x.chunks_exact_mut(d) {
        let mean = (lanes(row, &|v| v) / d as f64) as f32;
        let var = lanes(row, &|v| (v - mean) * (v - mean)) / d as f64;
        let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
        for ((v, g), b) in row.iter_mut().zip(&n.g).zip(&n.b) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// GELU with the error function (BERT's `gelu`) in place: x/2 · (1 + erf(x/√2)), erf by
/// Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7) over the vector exp (`exp_fast`,
/// ~1.5 ulp): libm's scalar exp per value was a fifth of MiniLM's time, on one thread.
fn gelu_erf(x: &mut [f32]) {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    let mut e = [0f32; 256];
    for chunk in x.chunks_mut(256) {
        let e = &mut e[..chunk.len()];
        for (e, &v) in e.iter_mut().zip(chunk.iter()) {
            let z = v * std::f32::consts::FRAC_1_SQRT_2;
            *e = -z * z;
        }
        exp_fast(e);
        for (v, &e) in chunk.iter_mut().zip(e.iter()) {
            let t = 1.0 / (1.0 + P * (*v * std::f32::consts::FRAC_1_SQRT_2).abs());
            let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
            let erf = (1.0 - poly * e).copysign(*v);
            *v = 0.5 * *v * (1.0 + erf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gelu_erf;

    /// erf at known points (Abramowitz & Stegun table 7.1), through GELU: x/2 · (1 + erf(x/√2)).
    #[test]
    fn gelu_erf_to_its_tolerance() {
        for (z, erf) in
            [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (2.0, 0.995_322_265_0), (-1.0, -0.842_700_792_9)]
        {
            let x = z * std::f64::consts::SQRT_2;
            let want = 0.5 * x * (1.0 + erf);
            let mut got = [x as f32];
            gelu_erf(&mut got);
            assert!((f64::from(got[0]) - want).abs() < 1e-6 * (1.0 + want.abs()), "gelu({x}) = {} vs {want}", got[0]);
        }
    }
}
