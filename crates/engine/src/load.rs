//! Opening a model as people ship it: a GGUF file or a Hugging Face folder. Both end as the
//! same `Model`, addressed by GGUF tensor names; HF tensors are renamed through formats' one
//! name table and sanitized here (Gemma's +1 on norm gains), never in the forward pass.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cortiq_formats::FormatError;
use cortiq_formats::gguf::Gguf;
use cortiq_formats::hf::HfConfig;
use cortiq_formats::names::hf_to_gguf;
use cortiq_formats::safetensors::HfWeights;
use cortiq_formats::tokenizer::Tokenizer;

use crate::arch::{self, Arch};
use crate::error::{EngineError, Result};
use crate::model::Model;
use crate::qtensor::{Backing, QTensor};
use crate::weights::{GgufSource, TensorSource};

/// What a model was loaded from; the tokenizer and chat template are read from the same place.
pub enum Origin {
    Gguf(Gguf),
    Hf { dir: PathBuf, config: HfConfig },
}

pub struct Loaded {
    pub model: Model,
    pub origin: Origin,
}

impl Loaded {
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
        })
    }
}

/// Open a `.gguf` file or an HF folder (config.json + safetensors).
pub fn load(path: &Path) -> Result<Loaded> {
    if path.is_dir() {
        let config = HfConfig::from_dir(path)?;
        let arch = arch::by_hf_name(&config.path.display().to_string(), &hf_arch_names(&config))?;
        let cfg = (arch.from_hf)(&config)?;
        let weights = HfWeights::open_dir(path)?;
        let src = HfSource::new(path, weights, arch);
        let model = Model::load_dense(&src, cfg)?;
        Ok(Loaded { model, origin: Origin::Hf { dir: path.to_path_buf(), config } })
    } else {
        if !path.exists() {
            return Err(FormatError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")).into());
        }
        let g = Gguf::open(path)?;
        let name = g.architecture()?.to_string();
        let arch = arch::by_gguf_name(&path.display().to_string(), &name)?;
        let cfg = (arch.from_gguf)(&g)?;
        let model = Model::load_dense(&GgufSource { gguf: &g }, cfg)?;
        Ok(Loaded { model, origin: Origin::Gguf(g) })
    }
}

fn hf_arch_names(c: &HfConfig) -> Vec<String> {
    let mut v = c.architectures.clone();
    v.push(c.model_type.clone());
    v.extend(c.outer_model_type.clone());
    v
}

/// HF safetensors addressed by GGUF names.
struct HfSource {
    dir: PathBuf,
    weights: HfWeights,
    /// GGUF name -> HF name.
    names: HashMap<String, String>,
    norm_offset: f32,
}

impl HfSource {
    fn new(dir: &Path, weights: HfWeights, arch: &Arch) -> HfSource {
        let names = weights.names().filter_map(|n| Some((hf_to_gguf(arch.name, n)?, n.to_string()))).collect();
        HfSource { dir: dir.to_path_buf(), weights, names, norm_offset: arch.hf_norm_offset }
    }
}

impl TensorSource for HfSource {
    fn file(&self) -> String {
        self.dir.display().to_string()
    }
    fn get(&self, name: &str) -> Result<Option<QTensor>> {
        let Some(hf_name) = self.names.get(name) else { return Ok(None) };
        let Some(raw) = self.weights.get(hf_name)? else { return Ok(None) };
        let (rows, cols) = match raw.shape[..] {
            [c] => (1, c),
            [r, c] => (r, c),
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
        if self.norm_offset != 0.0 && name.ends_with("norm.weight") {
            let v: Vec<f32> = t.to_f32().into_iter().map(|w| w + self.norm_offset).collect();
            return Ok(Some(QTensor::from_f32(name, rows, cols, v)));
        }
        Ok(Some(t))
    }
}
