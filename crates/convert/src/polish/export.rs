//! Writing the polished model: the source's .cmf or GGUF with the trained tensors replaced,
//! everything else copied byte for byte (metadata, tokenizer, frozen and quantized tensors),
//! and the O(1) settings recorded in the header so `run` / `ppl` serve it in O(1) mode.
//!
//! Trained matrices (the FFNs of converted layers) are stored as f16 by default: re-quantizing
//! them to the source's 4-bit type would round away most of what the polish changed (its
//! updates are far below a Q4 step), while f16 keeps ~3 significant digits. Norm gains are
//! always f32, as the converter stores 1-D tensors.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{Context, Result, bail};
use cortiq_engine::load::{Loaded, Origin};
use cortiq_formats::cmf::{self, CmfHeader, CmfWriter, Metadata, O1Header, PlannedTensor, SourceInfo, TypedKv};
use cortiq_formats::gguf::TensorInfo;
use cortiq_kernels::quant::QuantType;

/// The source's tensors.
fn source_tensors(l: &Loaded) -> Result<Vec<&TensorInfo>> {
    Ok(match &l.origin {
        Origin::Gguf(g) => g.tensors.iter().collect(),
        Origin::Cmf(c) => c.tensors.iter().collect(),
        Origin::Hf { dir, .. } => bail!(
            "polish writes its output from a GGUF or .cmf source; convert the folder first: cortiq convert -m {} -o MODEL.cmf",
            dir.display()
        ),
    })
}

/// A source tensor's stored bytes.
fn raw<'a>(l: &'a Loaded, t: &TensorInfo) -> &'a [u8] {
    match &l.origin {
        Origin::Gguf(g) => g.tensor_data(t),
        Origin::Cmf(c) => c.tensor_data(t),
        Origin::Hf { .. } => unreachable!("refused by source_tensors"),
    }
}

/// Writes `out`: the model of `l` with `replaced` tensors (GGUF names -> f32 values of the same
/// shape) stored as `matrix_type` (2-D) or f32 (1-D), `added` tensors (new names, 1-D f32)
/// after the source's, and `o1` in the header (None: the header records no O(1) settings).
pub fn write_polished(
    l: &Loaded,
    out: &Path,
    replaced: &HashMap<String, Vec<f32>>,
    matrix_type: QuantType,
    o1: Option<O1Header>,
    added: &[(String, Vec<f32>)],
    force: bool,
) -> Result<u64> {
    let tensors = source_tensors(l)?;
    let (arch, source, metadata, norm_offset) = match &l.origin {
        Origin::Gguf(g) => (
            g.architecture()?.to_string(),
            SourceInfo { kind: "gguf".into(), file: file_name(&g.path) },
            Metadata::Gguf { kv: TypedKv(g.metadata.clone()) },
            0.0,
        ),
        Origin::Cmf(c) => (
            c.header.architecture.clone(),
            SourceInfo { kind: "cmf".into(), file: file_name(&c.path) },
            c.header.metadata.clone(),
            c.header.norm_offset_folded,
        ),
        Origin::Hf { .. } => unreachable!("refused by source_tensors"),
    };
    let mut plan = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
        let dtype = match replaced.get(&t.name) {
            None => t.dtype,
            Some(v) => {
                let n: u64 = shape.iter().product();
                if v.len() as u64 != n {
                    bail!("polished tensor '{}' has {} values, the source {n}", t.name, v.len());
                }
                if shape.len() == 1 { QuantType::F32 } else { matrix_type }
            }
        };
        // A tensor copied as stored keeps its layout (a .cmf's interleaved experts); a polished
        // one is written row-major.
        let interleaved = t.interleaved && !replaced.contains_key(&t.name);
        plan.push(PlannedTensor { interleaved, ..PlannedTensor::new(t.name.clone(), dtype, shape) });
    }
    if let Some(name) = replaced.keys().find(|n| !tensors.iter().any(|t| &&t.name == n)) {
        bail!("polished tensor '{name}' is not in the source model");
    }
    for (name, v) in added {
        if tensors.iter().any(|t| &t.name == name) {
            bail!("added tensor '{name}' is already in the source model");
        }
        plan.push(PlannedTensor::new(name.clone(), QuantType::F32, vec![v.len() as u64]));
    }
    let header = CmfHeader {
        format_version: cmf::FORMAT_VERSION,
        architecture: arch,
        source,
        quant: format!("keep (polished tensors {})", matrix_type.name()),
        norm_offset_folded: norm_offset,
        metadata,
        o1,
        tensors: Vec::new(),
    };
    let mut w = CmfWriter::create(out, header, &plan, force)?;
    for (t, p) in tensors.iter().zip(&plan) {
        match replaced.get(&t.name) {
            None => w.write_data(raw(l, t))?,
            Some(v) => w.write_data(&encode(v, p.dtype).with_context(|| format!("tensor '{}'", t.name))?)?,
        }
        w.end_tensor()?;
    }
    for (_, v) in added {
        w.write_data(&encode(v, QuantType::F32)?)?;
        w.end_tensor()?;
    }
    let bytes = w.finish()?;
    // Read back what was written: a file this build cannot open is a bug, reported now.
    cmf::Cmf::open(out)?;
    Ok(bytes)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// f32 values as `dtype`'s bytes (f32 or f16; a finite value that overflows f16 is an error).
fn encode(v: &[f32], dtype: QuantType) -> Result<Vec<u8>> {
    Ok(match dtype {
        QuantType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        QuantType::F16 => {
            let mut out = Vec::with_capacity(v.len() * 2);
            for (j, &x) in v.iter().enumerate() {
                let h = half::f16::from_f32(x);
                if h.is_infinite() && x.is_finite() {
                    bail!("element {j} = {x} overflows f16 (use --store f32)");
                }
                out.extend_from_slice(&h.to_le_bytes());
            }
            out
        }
        other => bail!("polished tensors are stored as f32 or f16, not {other}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cortiq_engine::convert::{ConvertOptions, QuantSpec, convert};

    /// A mixture .cmf whose experts are stored interleaved, written back with nothing polished:
    /// every tensor keeps its layout and its bytes (an interleaved tensor written as row-major
    /// would be read as other weights, or refused by its size).
    #[test]
    fn copied_tensors_keep_their_layout() {
        let dir = std::env::temp_dir().join(format!("cortiq-export-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/qwen3_moe");
        let (src, out) = (dir.join("il.cmf"), dir.join("out.cmf"));
        let opts = ConvertOptions { quant: QuantSpec::To(QuantType::Q8_0), ..ConvertOptions::default() };
        convert(&fx, &src, &opts, &|_, _, _| {}).unwrap();
        let l = cortiq_engine::load::load(&src).unwrap();
        write_polished(&l, &out, &HashMap::new(), QuantType::F32, None, &[], false).unwrap();
        let (a, b) = (cmf::Cmf::open(&src).unwrap(), cmf::Cmf::open(&out).unwrap());
        assert!(a.tensors.iter().any(|t| t.interleaved), "the source has no interleaved tensor: the check tests nothing");
        for (x, y) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!((&x.name, x.interleaved), (&y.name, y.interleaved));
            assert!(a.tensor_data(x) == b.tensor_data(y), "{}: bytes differ", x.name);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
