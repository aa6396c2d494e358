//! Conversion of any model the engine loads (a GGUF file, an HF folder, a .cmf) into cortiq's
//! own file (.cmf, see `cortiq_formats::cmf`), keeping, widening or quantizing each tensor.
//!
//! What is written:
//! - the tensors the engine addresses, under its GGUF names, ready to use: an HF checkpoint's
//!   sanitizing (Gemma's +1 on norm gains) is applied before writing and recorded in the header
//!   (`norm_offset_folded`), so the loader applies nothing. HF tensors the name table does not
//!   map (a vision tower, say) are left out and listed in the report;
//! - the configuration, tokenizer and chat template in the source's own form (GGUF metadata
//!   keys, or the HF folder's small JSON/Jinja files verbatim), so the same parsers read them.
//!
//! Tensor types:
//! - 1-D tensors (norm gains, biases) are always f32: the engine widens them to f32 at load
//!   anyway, so this is lossless and costs nothing at run time;
//! - the vocabulary matrices, `token_embd.weight` and a separate `output.weight`, take
//!   `embeddings` when set, else `quant`. Both, because they are the same kind of matrix (one
//!   row per token; tied models have only the first, which then is the output head too), and the
//!   head is the tensor most sensitive to quantization (llama.cpp keeps it at q6_K or better in
//!   its mixes); this gives one switch whether or not the model ties them;
//! - every other tensor takes `quant`: `keep` copies the stored bytes, a type widens each row to
//!   f32 (`QTensor::row_f32`) and re-encodes it (f32, f16, bf16, or one of cortiq's quantized
//!   types). A row length that is not whole blocks of the requested type falls back to f16,
//!   listed in the report. A finite weight that overflows f16 is an error naming the tensor,
//!   never a silent infinity.
//!
//! Layout: a mixture's routed experts (`*_exps*` tensors whose per-expert rows are whole groups
//! of 16, in a type with the decode kernels' interleaved layout) are stored interleaved
//! (`cmf` version 2, `"layout": "il16"`) unless `plain_experts`: fast decode reads the routed
//! experts in place from the map with the interleaved kernels, the copy `--no-mmap` makes
//! (1.14x the row-major kernels' decode on the full-size Qwen3-30B-A3B shape, BENCHMARKS.md),
//! without copying; a load needs no repacking on CPUs without AVX-512 either. The other
//! numerics un-interleave the rows they read.
//!
//! The output is streamed tensor by tensor into a temporary file beside it and renamed into
//! place at the end (`CmfWriter`): an error leaves nothing behind, and an existing output is
//! refused unless `force`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cortiq_formats::cmf::{Cmf, CmfHeader, CmfWriter, Metadata, PlannedTensor, SourceInfo, TypedKv};
use cortiq_formats::gguf::Gguf;
use cortiq_formats::safetensors::HfWeights;
use cortiq_formats::{FormatError, cmf};
use cortiq_kernels::quant::QuantType;
use rayon::prelude::*;

use crate::arch;
use crate::error::{EngineError, Result};
use crate::load::HfSource;
use crate::qtensor::QTensor;
use crate::weights::{CmfSource, GgufSource, TensorSource};

/// What to store a tensor as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantSpec {
    /// The source's stored type and bytes.
    Keep,
    To(QuantType),
}

impl QuantSpec {
    /// "keep", or a type this converter can produce (see [`QuantSpec::producible`]).
    pub fn parse(s: &str) -> std::result::Result<QuantSpec, String> {
        if s == "keep" {
            return Ok(QuantSpec::Keep);
        }
        let all = QuantSpec::producible();
        match all.iter().find(|t| t.name().eq_ignore_ascii_case(s)) {
            Some(&t) => Ok(QuantSpec::To(t)),
            None => Err(format!(
                "unknown or unproducible type '{s}' (choose keep, {})",
                all.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The types a tensor can be converted to: f32, f16, bf16, GGUF's q8_0 (for the vocabulary
    /// matrices above all) and cortiq's own quantized types (q8r, q4t, q1). GGUF's other
    /// quantized types are only read, never produced.
    pub fn producible() -> Vec<QuantType> {
        let mut v = vec![QuantType::F32, QuantType::F16, QuantType::BF16, QuantType::Q8_0];
        v.extend(own_types());
        v
    }

    /// `Keep` when rows of `cols` values are not whole blocks of the type.
    fn filter_rows(self, cols: usize) -> QuantSpec {
        match self {
            QuantSpec::To(ty) if ty.row_bytes(cols).is_none() => QuantSpec::Keep,
            s => s,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            QuantSpec::Keep => "keep",
            QuantSpec::To(t) => t.name(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub quant: QuantSpec,
    /// Type of the vocabulary matrices (token embedding, separate output head); `None`: `quant`.
    pub embeddings: Option<QuantSpec>,
    /// Type of the source's f32 matrices (a hybrid's linear-core matrices, a polished model's
    /// trained ones), whatever `quant` says of the others; `None`: `quant`. The vocabulary
    /// matrices follow `embeddings` when it is given; an f32 matrix whose rows are not whole
    /// blocks of the type stays f32.
    pub f32_as: Option<QuantType>,
    /// Overwrite an existing output.
    pub force: bool,
    /// Keep a mixture's experts row-major (as GGUF stores them) instead of interleaved.
    pub plain_experts: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions { quant: QuantSpec::Keep, embeddings: None, f32_as: None, force: false, plain_experts: false }
    }
}

/// What a conversion wrote.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    pub out: PathBuf,
    /// Size of the written file.
    pub bytes: u64,
    pub tensors: usize,
    /// Per stored type: (tensor count, data bytes).
    pub by_dtype: BTreeMap<String, (usize, u64)>,
    /// Tensors stored as f16 because their rows are not whole blocks of the requested type.
    pub fallbacks: Vec<String>,
    /// Tensors stored in the interleaved layout (a mixture's experts).
    pub interleaved: usize,
    /// Source tensors that are not part of the model (not in the HF name table).
    pub dropped: Vec<String>,
}

/// The opened source.
enum Source {
    Gguf(Gguf),
    Hf(HfSource),
    Cmf(Cmf),
}

/// Files of an HF folder a .cmf embeds (those that exist; config.json is required).
const HF_FILES: &[&str] =
    &["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"];

impl Source {
    /// The stored bytes of a tensor when `get` returns them unchanged.
    fn raw(&self, name: &str) -> Option<&[u8]> {
        match self {
            Source::Gguf(g) => g.tensor(name).map(|i| g.tensor_data(i)),
            Source::Hf(src) => src.raw(name),
            // an interleaved tensor's bytes are not its row-major ones
            Source::Cmf(c) => c.tensor(name).filter(|i| !i.interleaved).map(|i| c.tensor_data(i)),
        }
    }
}

impl TensorSource for Source {
    fn file(&self) -> String {
        match self {
            Source::Gguf(g) => GgufSource { gguf: g }.file(),
            Source::Hf(src) => src.file(),
            Source::Cmf(c) => CmfSource { cmf: c }.file(),
        }
    }
    fn get(&self, name: &str) -> Result<Option<QTensor>> {
        match self {
            Source::Gguf(g) => GgufSource { gguf: g }.get(name),
            Source::Hf(src) => src.get(name),
            Source::Cmf(c) => CmfSource { cmf: c }.get(name),
        }
    }
}

fn own_types() -> Vec<QuantType> {
    QuantType::OWN.to_vec()
}

/// Convert `src` (GGUF file, HF folder or .cmf) to the .cmf `out`. `progress(done, total, name)`
/// is called before each tensor and once at the end with `done == total`.
pub fn convert(src: &Path, out: &Path, opts: &ConvertOptions, progress: &dyn Fn(usize, usize, &str)) -> Result<ConvertReport> {
    if !opts.force && out.exists() {
        return Err(FormatError::io(
            out,
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already exists (pass --force to overwrite)"),
        )
        .into());
    }
    let file_name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (source, arch_name, metadata, norm_offset, kind, mut dropped) = open_source(src)?;
    let ts: &dyn TensorSource = &source;

    // (name, shape outermost first) of every tensor, in the source's order.
    let list: Vec<(String, Vec<usize>)> = match &source {
        Source::Gguf(g) => g.tensors.iter().map(|t| (t.name.clone(), t.shape())).collect(),
        Source::Cmf(c) => c.tensors.iter().map(|t| (t.name.clone(), t.shape())).collect(),
        Source::Hf(src) => src.tensors(),
    };
    dropped.sort();

    // Plan: each tensor's stored type.
    let mut plan = Vec::with_capacity(list.len());
    let mut fallbacks = Vec::new();
    for (name, shape) in &list {
        let t = ts.get(name)?.ok_or_else(|| EngineError::MissingTensor { file: ts.file(), tensor: name.clone() })?;
        let vocab = matches!(name.as_str(), "token_embd.weight" | "output.weight");
        let spec = match (vocab, opts.embeddings, opts.f32_as) {
            (true, Some(e), _) => e,
            // Small f32 matrices whose rows are not whole blocks (a conv's taps) stay f32.
            (_, _, Some(ty)) if t.dtype == QuantType::F32 => QuantSpec::To(ty).filter_rows(t.cols),
            (true, None, _) => opts.quant,
            (false, _, _) => opts.quant,
        };
        let dtype = if shape.len() == 1 {
            QuantType::F32
        } else {
            match spec {
                QuantSpec::Keep => t.dtype,
                QuantSpec::To(ty) if ty.row_bytes(t.cols).is_some() => ty,
                QuantSpec::To(ty) => {
                    fallbacks.push(format!("{name}: rows of {} are not whole {ty} blocks; stored as f16", t.cols));
                    QuantType::F16
                }
            }
        };
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let interleaved = !opts.plain_experts && interleavable(name, dtype, &shape);
        plan.push(PlannedTensor { interleaved, ..PlannedTensor::new(name.clone(), dtype, shape) });
    }

    let header = CmfHeader {
        format_version: cmf::FORMAT_VERSION,
        architecture: arch_name,
        source: SourceInfo { kind: kind.into(), file: file_name },
        quant: {
            let mut q = opts.quant.name().to_string();
            if let Some(e) = opts.embeddings {
                q += &format!(" (embeddings {})", e.name());
            }
            if let Some(t) = opts.f32_as {
                q += &format!(" (f32 matrices {})", t.name());
            }
            q
        },
        norm_offset_folded: norm_offset,
        metadata,
        // A polished .cmf re-converted (re-quantized, say) keeps its O(1) serving settings.
        o1: match &source {
            Source::Cmf(c) => c.header.o1.clone(),
            _ => None,
        },
        tensors: Vec::new(),
    };
    let mut w = CmfWriter::create(out, header, &plan, opts.force)?;
    let mut by_dtype: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let n = plan.len();
    for (i, p) in plan.iter().enumerate() {
        progress(i, n, &p.name);
        let t = ts.get(&p.name)?.ok_or_else(|| EngineError::MissingTensor { file: ts.file(), tensor: p.name.clone() })?;
        let written = write_tensor(&mut w, &source, &t, p)?;
        w.end_tensor()?;
        let e = by_dtype.entry(p.dtype.name().to_string()).or_default();
        e.0 += 1;
        e.1 += written;
    }
    let bytes = w.finish()?;
    // Read back what was written (header, offsets, sizes): a file this build cannot open is a
    // converter bug, better reported now than at the first run.
    let check = Cmf::open(out)?;
    if check.tensors.len() != n {
        return Err(EngineError::BadConfig {
            file: out.display().to_string(),
            what: format!("wrote {n} tensors but reads back {}", check.tensors.len()),
        });
    }
    progress(n, n, "");
    let interleaved = plan.iter().filter(|p| p.interleaved).count();
    Ok(ConvertReport { out: out.to_path_buf(), bytes, tensors: n, by_dtype, fallbacks, interleaved, dropped })
}

type Opened = (Source, String, Metadata, f32, &'static str, Vec<String>);

/// Opens the source, checks that the engine can build its configuration (so an unsupported
/// model fails before anything is written), and collects what the .cmf embeds.
fn open_source(path: &Path) -> Result<Opened> {
    let file = path.display().to_string();
    if path.is_dir() {
        let config = arch::hf_config_from_dir(path)?;
        let arch = arch::for_hf(&config)?;
        let cfg = arch.config_from_hf(&config)?;
        let mut files = BTreeMap::new();
        for f in HF_FILES {
            let p = path.join(f);
            if p.exists() {
                files.insert(f.to_string(), std::fs::read_to_string(&p).map_err(|e| FormatError::io(&p, e))?);
            }
        }
        let weights = HfWeights::open_dir(path)?;
        let src = HfSource::new(path, weights, arch, &config, &cfg);
        let dropped = src.unmapped();
        let offset = src.norm_offset();
        return Ok((Source::Hf(src), arch.name.to_string(), Metadata::Hf { files }, offset, "hf", dropped));
    }
    if !path.exists() {
        return Err(FormatError::io(path, std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder")).into());
    }
    if cmf::is_cmf(path) {
        let c = Cmf::open(path)?;
        let arch = arch::by_gguf_name(&file, &c.header.architecture)?;
        let (metadata, offset, name) = (c.header.metadata.clone(), c.header.norm_offset_folded, arch.name.to_string());
        return Ok((Source::Cmf(c), name, metadata, offset, "cmf", Vec::new()));
    }
    let g = Gguf::open(path)?;
    let arch = arch::by_gguf_name(&file, g.architecture()?)?;
    arch.config_from_gguf(&g)?;
    let metadata = Metadata::Gguf { kv: TypedKv(g.metadata.clone()) };
    Ok((Source::Gguf(g), arch.name.to_string(), metadata, 0.0, "gguf", Vec::new()))
}

/// Rows widened and re-encoded per work item: ~4 MB of f32, so memory stays bounded and every
/// core has work.
const CHUNK_F32: usize = 1 << 20;

/// Whether the planned tensor `name` of `dtype` and `shape` (outermost first) is stored
/// interleaved: a routed experts' matrix (stacked `[experts, rows, cols]` or one expert's
/// `[rows, cols]`) whose rows per expert are whole groups of `IL_ROWS` (each half of a fused
/// gate|up too), so that every expert is whole groups of its own, in a type and width with the
/// layout.
fn interleavable(name: &str, dtype: QuantType, shape: &[u64]) -> bool {
    use cortiq_kernels::quant::{IL_ROWS, ileave_group_bytes, ileave_supported};
    let expert = name.contains("_exps.") && name.ends_with(".weight");
    // A fused gate|up stack is viewed as two halves per expert: each half whole groups.
    let group = if name.contains("gate_up_exps") { 2 * IL_ROWS } else { IL_ROWS };
    match shape {
        [.., rows, cols] if expert && shape.len() <= 3 => {
            (*rows as usize).is_multiple_of(group)
                && ileave_supported(dtype)
                && ileave_group_bytes(dtype, *cols as usize).is_some()
        }
        _ => false,
    }
}

/// Writes one planned tensor's bytes (`p.dtype`, interleaved where `p.interleaved`); returns
/// the bytes written.
fn write_tensor(w: &mut CmfWriter, source: &Source, t: &QTensor, p: &PlannedTensor) -> Result<u64> {
    let dtype = p.dtype;
    if p.interleaved {
        // The whole tensor row-major (an expert stack: ~100 MB for a 30B-A3B layer), then its
        // groups.
        let mut rows = Vec::with_capacity(t.n_bytes());
        row_major(source, t, dtype, &mut |chunk| {
            rows.extend_from_slice(chunk);
            Ok(())
        })
        .map_err(|e| bad(w, t, e))?;
        let packed = cortiq_kernels::quant::ileave(dtype, &rows, t.rows, t.cols);
        w.write_data(&packed)?;
        return Ok(packed.len() as u64);
    }
    let mut total = 0u64;
    let mut err = None;
    row_major(source, t, dtype, &mut |chunk| {
        total += chunk.len() as u64;
        w.write_data(chunk).map_err(|e| {
            let msg = e.to_string();
            err = Some(e);
            msg
        })
    })
    .map_err(|e| match err.take() {
        Some(io) => EngineError::from(io),
        None => bad(w, t, e),
    })?;
    Ok(total)
}

/// `t`'s rows in `dtype`, row-major, given to `sink` in pieces: the stored bytes when the type
/// is kept (un-interleaved from an interleaved source), else each row widened to f32 and
/// re-encoded, ~`CHUNK_F32` values at a time.
fn row_major(
    source: &Source,
    t: &QTensor,
    dtype: QuantType,
    sink: &mut dyn FnMut(&[u8]) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    if dtype == t.dtype {
        return match source.raw(&t.name) {
            Some(raw) => sink(raw),
            None => sink(&t.bytes()),
        };
    }
    let row_bytes = dtype.row_bytes(t.cols).ok_or_else(|| format!("{} columns are not whole {dtype} blocks", t.cols))?;
    let rows_per = (CHUNK_F32 / t.cols.max(1)).max(1);
    let mut out = Vec::new();
    for r0 in (0..t.rows).step_by(rows_per) {
        let nr = rows_per.min(t.rows - r0);
        out.resize(nr * row_bytes, 0u8);
        out.par_chunks_mut(row_bytes).enumerate().try_for_each_init(
            || vec![0f32; t.cols],
            |wide, (i, o)| {
                t.row_f32(r0 + i, wide);
                encode_row(dtype, wide, o).map_err(|e| format!("row {}: {e}", r0 + i))
            },
        )?;
        sink(&out)?;
    }
    Ok(())
}

fn bad(w: &CmfWriter, t: &QTensor, msg: String) -> EngineError {
    EngineError::BadConfig { file: w.temp_path().display().to_string(), what: format!("tensor '{}': {msg}", t.name) }
}

/// One f32 row into `dtype`'s bytes (`out` is exactly one row).
fn encode_row(dtype: QuantType, src: &[f32], out: &mut [u8]) -> std::result::Result<(), String> {
    match dtype {
        QuantType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(src) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        QuantType::F16 => {
            for (j, (o, &v)) in out.chunks_exact_mut(2).zip(src).enumerate() {
                let h = half::f16::from_f32(v);
                if h.is_infinite() && v.is_finite() {
                    return Err(format!("element {j} = {v} overflows f16 (largest 65504); keep or use f32/bf16"));
                }
                o.copy_from_slice(&h.to_le_bytes());
            }
        }
        QuantType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(src) {
                o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        other => return quantize_own(other, src, out),
    }
    Ok(())
}

/// cortiq's own types, by the kernels' quantizers (deterministic, scalar).
fn quantize_own(dtype: QuantType, src: &[f32], out: &mut [u8]) -> std::result::Result<(), String> {
    cortiq_kernels::quant::quantize_row(dtype, src, out).map_err(|e| e.to_string())
}
