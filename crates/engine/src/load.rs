//! Opening a model as people ship it: a GGUF file, a Hugging Face folder, or cortiq's own .cmf
//! (told apart by content, not extension). All end as the same `Model`, addressed by GGUF tensor
//! names; HF tensors are renamed through formats' one name table and sanitized here (Gemma's +1
//! on norm gains), never in the forward pass; an HF folder's MTP block is kept only when whole
//! (a partial or absent one loads the model without MTP, with a warning). A .cmf is already
//! sanitized: its tensors are used as stored, its configuration parsed by the GGUF or HF code
//! according to what it embeds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cortiq_formats::FormatError;
use cortiq_formats::cmf::{self, Cmf, Metadata};
use cortiq_formats::gguf::Gguf;
use cortiq_formats::hf::HfConfig;
use cortiq_formats::names::mtp_own_gguf;
use cortiq_formats::safetensors::HfWeights;
use cortiq_formats::tokenizer::Tokenizer;

use crate::arch::{self, Arch};
use crate::config::{MixerKind, ModelConfig};
use crate::error::{EngineError, Result};
use crate::model::Model;
#[cfg(feature = "o1")]
use crate::o1::farfield::FarWeights;
use crate::qtensor::{Backing, QTensor};
use crate::weights::{CmfSource, GgufSource, TensorSource};

/// What a model was loaded from; the tokenizer and chat template are read from the same place.
// One per loaded model: the variants' size difference costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
pub enum Origin {
    Gguf(Gguf),
    Hf { dir: PathBuf, config: HfConfig },
    Cmf(Cmf),
}

pub struct Loaded {
    pub model: Model,
    pub origin: Origin,
}

impl Loaded {
    /// The O(1) settings a polished .cmf records (`cortiq polish`), served by default.
    #[cfg(feature = "o1")]
    pub fn served_o1(&self) -> Option<crate::o1::Served> {
        match &self.origin {
            Origin::Cmf(c) => c.header.o1.as_ref().map(crate::o1::served_o1),
            _ => None,
        }
    }

    /// The tokenizer shipped with the model: the GGUF's vocabulary, or the folder's
    /// tokenizer.json (+ tokenizer_config.json).
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Ok(match &self.origin {
            Origin::Gguf(g) => Tokenizer::from_gguf(g)?,
            Origin::Hf { dir, .. } => {
                let tj = dir.join("tokenizer.json");
                if !tj.exists() {
                    return Err(EngineError::BadConfig {
                        file: dir.display().to_string(),
                        what: "missing tokenizer (no tokenizer.json in the model folder)".into(),
                    });
                }
                let tc = dir.join("tokenizer_config.json");
                Tokenizer::from_tokenizer_json(&tj, tc.exists().then_some(tc.as_path()))?
            }
            Origin::Cmf(c) => match &c.header.metadata {
                Metadata::Gguf { .. } => Tokenizer::from_gguf(c)?,
                Metadata::Hf { files } => {
                    let tj = files.get("tokenizer.json").ok_or_else(|| EngineError::BadConfig {
                        file: c.path.display().to_string(),
                        what: "missing tokenizer (the .cmf embeds no tokenizer.json)".into(),
                    })?;
                    let tc = files.get("tokenizer_config.json").map(String::as_str);
                    Tokenizer::from_tokenizer_json_str(&c.embedded_path("tokenizer.json"), tj, tc)?
                }
            },
        })
    }
}

/// Open a `.gguf` file, a `.cmf` file or an HF folder (config.json + safetensors).
pub fn load(path: &Path) -> Result<Loaded> {
    if path.is_dir() {
        let config = arch::hf_config_from_dir(path)?;
        let arch = arch::for_hf(&config)?;
        let cfg = arch.config_from_hf(&config)?;
        let weights = HfWeights::open_dir(path)?;
        let src = HfSource::new(path, weights, arch, &config, &cfg);
        let model = Model::load_dense(&src, cfg)?;
        Ok(Loaded { model, origin: Origin::Hf { dir: path.to_path_buf(), config } })
    } else {
        if !path.exists() {
            return Err(FormatError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")).into());
        }
        if cmf::is_cmf(path) {
            return load_cmf(path);
        }
        let g = Gguf::open(path)?;
        let name = g.architecture()?.to_string();
        let arch = arch::by_gguf_name(&path.display().to_string(), &name)?;
        let cfg = arch.config_from_gguf(&g)?;
        let model = Model::load_dense(&GgufSource { gguf: &g }, cfg)?;
        Ok(Loaded { model, origin: Origin::Gguf(g) })
    }
}

fn load_cmf(path: &Path) -> Result<Loaded> {
    let c = Cmf::open(path)?;
    let arch = arch::by_gguf_name(&path.display().to_string(), &c.header.architecture)?;
    let cfg = match &c.header.metadata {
        Metadata::Gguf { .. } => arch.config_from_gguf(&c)?,
        Metadata::Hf { files } => {
            let text = files.get("config.json").ok_or_else(|| FormatError::missing(path, "embedded config.json"))?;
            arch.config_from_hf(&arch.hf_config_from_str(&c.embedded_path("config.json"), text)?)?
        }
    };
    #[cfg_attr(not(feature = "o1"), allow(unused_mut))]
    let mut model = Model::load_dense(&CmfSource { cmf: &c }, cfg)?;
    #[cfg(feature = "o1")]
    load_o1(path, &c, &mut model)?;
    #[cfg(not(feature = "o1"))]
    if c.header.o1.is_some() {
        tracing::warn!("{}: its O(1) serving settings are ignored (cortiq built without the o1 feature)", path.display());
    }
    Ok(Loaded { model, origin: Origin::Cmf(c) })
}

/// A polished model's O(1) parts: the learned far field, the window split, the score layers.
#[cfg(feature = "o1")]
fn load_o1(path: &Path, c: &Cmf, model: &mut Model) -> Result<()> {
    model.o1_far = load_far(path, c, &model.cfg)?;
    if let Some(sp) = c.header.o1.as_ref().and_then(|h| h.split.as_ref()) {
        let split = crate::o1::O1Split { step: sp.step, layers: sp.layers.clone(), curves: sp.curves.clone() };
        split.validate(model.cfg.n_layers).map_err(|what| EngineError::BadConfig { file: path.display().to_string(), what })?;
        model.o1_split = Some(std::sync::Arc::new(split));
    }
    if let Some(list) = c.header.o1.as_ref().and_then(|h| h.score_layers.as_ref()) {
        if let Some(&il) = list.iter().find(|&&il| il >= model.cfg.n_layers) {
            let what = format!("o1.score_layers names layer {il}; the model has {}", model.cfg.n_layers);
            return Err(EngineError::BadConfig { file: path.display().to_string(), what });
        }
        model.o1_score_layers = Some(list.as_slice().into());
    }
    Ok(())
}

/// The learned far field's feature maps (`blk.N.attn_far_*`, f32, written by `cortiq polish
/// --o1-far linear`): per layer all six tensors or none, and optionally the decay rates; a
/// partial or misshapen set is a malformed file.
#[cfg(feature = "o1")]
fn load_far(path: &Path, c: &Cmf, cfg: &ModelConfig) -> Result<Vec<Option<std::sync::Arc<FarWeights>>>> {
    use crate::o1::farfield::TENSORS;
    let bad = |what: String| EngineError::BadConfig { file: path.display().to_string(), what };
    let mut out = Vec::with_capacity(cfg.n_layers);
    for il in 0..cfg.n_layers {
        let infos: Vec<_> = TENSORS.iter().map(|s| c.tensor(&format!("blk.{il}.{s}"))).collect();
        if infos.iter().all(Option::is_none) {
            out.push(None);
            continue;
        }
        let mut vals: [Vec<f32>; 6] = Default::default();
        for ((info, s), v) in infos.iter().zip(TENSORS).zip(vals.iter_mut()) {
            let info = info.ok_or_else(|| bad(format!("layer {il}: far field tensor blk.{il}.{s} is missing")))?;
            if info.dtype != cortiq_kernels::quant::QuantType::F32 {
                return Err(bad(format!("blk.{il}.{s}: a far field tensor must be f32, found {}", info.dtype.name())));
            }
            *v = c.tensor_data(info).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        }
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let rank = vals[1].len().checked_div(nh).unwrap_or(0);
        let mut fw = FarWeights::from_tensors(rank, nh, nkv, hd, vals)
            .ok_or_else(|| bad(format!("layer {il}: far field tensors do not fit {nh} heads, {nkv} kv heads, head_dim {hd}")))?;
        // The decay rates are optional (files written before them have none: no decay).
        let dname = format!("blk.{il}.{}", crate::o1::farfield::DECAY_TENSOR);
        if let Some(info) = c.tensor(&dname) {
            if info.dtype != cortiq_kernels::quant::QuantType::F32 {
                return Err(bad(format!("{dname}: a far field tensor must be f32, found {}", info.dtype.name())));
            }
            let d: Vec<f32> = c.tensor_data(info).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            fw = fw
                .with_decay(d)
                .ok_or_else(|| bad(format!("{dname}: {nkv}×{rank} finite, non-negative decay rates expected")))?;
        }
        out.push(Some(std::sync::Arc::new(fw)));
    }
    Ok(out)
}

/// HF safetensors addressed by GGUF names.
pub(crate) struct HfSource {
    dir: PathBuf,
    weights: HfWeights,
    /// GGUF name -> HF name.
    names: HashMap<String, String>,
    norm_offset: f32,
    plain_norms: &'static [&'static str],
    fix: Option<crate::arch::HfFix>,
    /// The text config (what an `HfFix` may read).
    config: serde_json::Value,
}

impl HfSource {
    /// `hf` / `cfg`: the folder's config and the model built from it (MTP blocks are numbered
    /// after its `n_layers` ordinary layers and checked against them, see [`keep_whole_mtp`]).
    pub(crate) fn new(dir: &Path, weights: HfWeights, arch: &Arch, hf: &HfConfig, cfg: &ModelConfig) -> HfSource {
        let n_layers = cfg.n_layers;
        let mut names = weights
            .names()
            .filter_map(|n| Some((arch.names.hf_to_gguf(n).or_else(|| arch.names.hf_mtp_to_gguf(n, n_layers))?, n.to_string())))
            .collect();
        keep_whole_mtp(dir, arch, hf, cfg, &mut names);
        HfSource {
            dir: dir.to_path_buf(),
            weights,
            names,
            norm_offset: arch.hf_norm_offset,
            plain_norms: arch.hf_plain_norms,
            fix: arch.hf_fix,
            config: hf.text_raw().clone(),
        }
    }
}

/// Keeps the `mtp.*` tensors only when MTP block 0 is whole: its own `nextn.*` tensors and
/// every tensor the model's first full-attention layer has (the MTP layer is built like it).
/// Otherwise they all leave `names` (unmapped, so `convert` reports them dropped) and the model
/// loads without MTP, saying so: fine-tunes saved by transformers drop the block (its text
/// classes ignore `mtp.*`) or keep part of it, and their forward pass is whole without it —
/// refusing them (the engine's MTP loader errors on a partial block) would help no one.
/// Warns too when the config announces MTP layers (`mtp_num_hidden_layers`) that are absent.
fn keep_whole_mtp(dir: &Path, arch: &Arch, hf: &HfConfig, cfg: &ModelConfig, names: &mut HashMap<String, String>) {
    let n = cfg.n_layers;
    let is_mtp = |h: &str| h.starts_with("mtp.");
    if !names.values().any(|h| is_mtp(h)) {
        if hf.mtp_layers > 0 {
            tracing::warn!(
                model = %dir.display(),
                "config.json announces {} MTP layer(s) (mtp_num_hidden_layers) but the checkpoint has no mtp.* tensors; \
                 multi-token prediction is disabled",
                hf.mtp_layers
            );
        }
        return;
    }
    // No attention layer to build the MTP layer like: the engine loads no MTP block anyway.
    let Some(attn) = cfg.layers.iter().position(|l| l.mixer == MixerKind::Attention) else { return };
    let (attn_blk, mtp_blk) = (format!("blk.{attn}."), format!("blk.{n}."));
    let want: Vec<String> =
        names.keys().filter_map(|g| Some(format!("{mtp_blk}{}", g.strip_prefix(&attn_blk)?))).chain(mtp_own_gguf(n)).collect();
    // Named as the checkpoint names them (mtp.*); the GGUF name only where there is no HF twin.
    let mut missing: Vec<String> = want
        .iter()
        .filter(|g| !names.contains_key(*g))
        .map(|g| arch.names.gguf_mtp_to_hf(g, n).unwrap_or_else(|| g.clone()))
        .collect();
    if missing.is_empty() {
        return;
    }
    missing.sort();
    // A MoE block misses hundreds of expert tensors at once: name the first few.
    const SHOWN: usize = 16;
    let more = if missing.len() > SHOWN { format!(", and {} more", missing.len() - SHOWN) } else { String::new() };
    tracing::warn!(
        model = %dir.display(),
        "the MTP block is incomplete (missing {} of its {} tensors: {}{more}); its mtp.* tensors are ignored and \
         multi-token prediction is disabled",
        missing.len(),
        want.len(),
        missing[..missing.len().min(SHOWN)].join(", ")
    );
    names.retain(|_, h| !is_mtp(h));
}

impl HfSource {
    /// (GGUF name, HF shape) of every tensor the name table maps, sorted by name; tensors it
    /// does not map (a vision tower, say) are not part of the model.
    pub(crate) fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let mut v: Vec<_> =
            self.names.iter().filter_map(|(g, h)| Some((g.clone(), self.weights.meta(h)?.shape.clone()))).collect();
        // Tensors an `Arch::hf_fix` derives stand in for the ones they come from, shaped as
        // derived ([rows, cols]).
        if let Some(fix) = self.fix {
            let mut derived = Vec::new();
            v.retain(|(g, _)| {
                let Some((blk, rest)) = g.strip_prefix("blk.").and_then(|s| s.split_once('.')) else { return true };
                let outs = (fix.replaces)(rest);
                for o in outs {
                    let name = format!("blk.{blk}.{o}");
                    if let Ok(Some(t)) = self.get(&name) {
                        let shape = if t.rows == 1 { vec![t.cols] } else { vec![t.rows, t.cols] };
                        derived.push((name, shape));
                    }
                }
                outs.is_empty()
            });
            v.extend(derived);
        }
        v.sort();
        v
    }

    /// HF tensors the name table does not map (not part of the model), sorted.
    pub(crate) fn unmapped(&self) -> Vec<String> {
        let mapped: std::collections::HashSet<&str> = self.names.values().map(String::as_str).collect();
        self.weights.names().filter(|n| !mapped.contains(n)).map(str::to_string).collect()
    }

    /// The value added to norm gains (`hf_norm_offset` of the architecture).
    pub(crate) fn norm_offset(&self) -> f32 {
        self.norm_offset
    }

    /// Whether `get(name)` adds the norm offset to this tensor.
    fn offsets(&self, name: &str) -> bool {
        self.norm_offset != 0.0 && name.ends_with("norm.weight") && !self.plain_norms.iter().any(|p| name.ends_with(p))
    }

    /// Whether `get(name)` changes the stored values: a norm gain that gets the offset, or a
    /// GatedDeltaNet decay rate stored by HF as A_log and by GGUF (and the engine) as
    /// −exp(A_log).
    fn sanitizes(&self, name: &str) -> bool {
        self.offsets(name) || name.ends_with(".ssm_a")
    }

    /// The stored bytes of a tensor `get` returns unchanged; `None` for sanitized or absent ones.
    pub(crate) fn raw(&self, name: &str) -> Option<&[u8]> {
        if self.sanitizes(name) {
            return None;
        }
        // A tensor an `Arch::hf_fix` derives is not the stored one.
        if let Some(fix) = self.fix
            && name.strip_prefix("blk.").and_then(|s| s.split_once('.')).is_some_and(|(_, rest)| (fix.derives)(rest))
        {
            return None;
        }
        let t = self.weights.get(self.names.get(name)?).ok()??;
        Some(t.data)
    }
}

impl TensorSource for HfSource {
    fn file(&self) -> String {
        self.dir.display().to_string()
    }
    fn get(&self, name: &str) -> Result<Option<QTensor>> {
        if let Some(fix) = self.fix
            && let Some(t) = (fix.derive)(name, &|n| self.table_get(n), &self.config)?
        {
            return Ok(Some(t));
        }
        self.table_get(name)
    }
}

impl HfSource {
    /// The tensor the name table maps to `name`, with the norm offset and A_log fixes.
    fn table_get(&self, name: &str) -> Result<Option<QTensor>> {
        let Some(hf_name) = self.names.get(name) else { return Ok(None) };
        let Some(raw) = self.weights.get(hf_name)? else { return Ok(None) };
        let (rows, cols) = match raw.shape[..] {
            [c] => (1, c),
            [r, c] => (r, c),
            // A depthwise Conv1d weight [channels, 1, kernel] (LFM2, GatedDeltaNet) is the
            // [channels, kernel] matrix GGUF stores; stacked experts [E, rows, cols] (Granite's
            // fused input_linear) are [E·rows, cols], as llama.cpp stacks them.
            [a, b, c] => (a * b, c),
            // A vector stored with unit dimensions (Kimi's A_log [1, 1, heads, 1]).
            ref dims if dims.iter().filter(|&&x| x != 1).count() <= 1 => (1, dims.iter().product()),
            _ => {
                return Err(EngineError::ShapeMismatch {
                    file: self.file(),
                    tensor: hf_name.clone(),
                    expected: vec![0, 0],
                    found: raw.shape.clone(),
                });
            }
        };
        let (map, range) = self.weights.locate(hf_name).expect("tensor just found");
        let backing: Backing = map as Backing;
        let t = QTensor::new(name, raw.dtype, rows, cols, backing, range.start).ok_or_else(|| EngineError::BadConfig {
            file: self.file(),
            what: format!("tensor '{hf_name}' does not fit its stored bytes"),
        })?;
        if self.offsets(name) {
            let v: Vec<f32> = t.to_f32().into_iter().map(|w| w + self.norm_offset).collect();
            return Ok(Some(QTensor::from_f32(name, rows, cols, v)));
        }
        if name.ends_with(".ssm_a") {
            let v: Vec<f32> = t.to_f32().into_iter().map(|a_log| -a_log.exp()).collect();
            return Ok(Some(QTensor::from_f32(name, rows, cols, v)));
        }
        Ok(Some(t))
    }
}
