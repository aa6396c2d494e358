//! cortiq's own model file (.cmf): one file that runs alone, memory-mapped and opened without
//! copying a tensor.
//!
//! Layout (integers little-endian):
//!
//! ```text
//!   0   b"CORTIQMF"            magic
//!   8   u32 version            = FORMAT_VERSION
//!  12   u32 reserved           = 0 (readers ignore it)
//!  16   u64 json_len
//!  24   JSON header            json_len bytes of UTF-8
//!       zero padding           to the next multiple of 64: the data section starts here (D)
//!   D   tensor data            tensor i at D + tensors[i].offset; every offset a multiple of 64,
//!                              zero padding between tensors
//! ```
//!
//! The JSON header ([`CmfHeader`]):
//!
//! ```text
//! { "format_version": 1, "architecture": "gemma3",
//!   "source": {"kind": "gguf" | "hf" | "cmf", "file": "<file or folder name>"},
//!   "quant": "keep" | "f16" | ..., "norm_offset_folded": 0.0,
//!   "metadata": {"gguf": {"kv": {KEY: {"t": TYPE, "v": VALUE}, ...}}}
//!             | {"hf": {"files": {"config.json": TEXT, "tokenizer.json": TEXT, ...}}},
//!   "o1": {"window", "sinks", "landmarks", "ridge", "trained_ctx", "steps"},   (polished only)
//!   "tensors": [{"name", "dtype", "shape", "offset", "bytes"[, "layout": "il16"]}, ...] }
//! ```
//!
//! `"layout": "il16"` (format version 2; absent in version 1, where every tensor is row-major):
//! the tensor's rows are stored in the decode kernels' 16-row interleaved groups
//! (`cortiq_kernels::quant::ileave`, rows padded to a multiple of 16; `bytes` is
//! `ileave_bytes` of the rows), as `cortiq convert` writes a mixture's stacked experts whose
//! per-expert rows are whole groups: the fast decode kernels then read them in place from the
//! map. A writer stamps version 2 only on files that hold such a tensor, so every other file
//! stays readable by version-1 readers.
//!
//! Model configuration, tokenizer and chat template are embedded in the form of the source, so
//! the existing parsers read them unchanged: a GGUF's metadata keys travel as typed JSON and are
//! read through [`GgufMeta`] (the architecture files and the GGUF tokenizer), an HF folder's
//! small files travel verbatim and are parsed from their text. Tensor names are the engine's
//! (GGUF names); tensors are stored ready to use (an HF Gemma's +1 on its norm gains already
//! added, recorded in `norm_offset_folded`), so a loader applies nothing.
//!
//! Typed metadata values: `{"t": "u32", "v": 5}`; a homogeneous array of scalars is
//! `{"t": "[f32]", "v": [...]}`, an empty one `{"t": "[]", "v": []}`, any other array
//! `{"t": "[*]", "v": [typed, ...]}`. f32 values are written as the JSON number of their exact
//! f64 widening (read back as f64 then narrowed: exact whatever the JSON float parser's last
//! digit does) or as a string for NaN/±inf; f64 values as the string of Rust's shortest
//! round-trip formatting (exact through `str::parse`). NaN payloads are not preserved.
//!
//! Every offset, size and type read from a file is checked against the file before use, so a
//! truncated or corrupted file is a one-line `FormatError` naming the file and the tensor or
//! field, never a panic. The writer streams (header, then each tensor as it is produced) into a
//! temporary file beside the output and renames it into place only when complete; dropped
//! unfinished, it removes the temporary file.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cortiq_kernels::quant::QuantType;
use memmap2::Mmap;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{FormatError, Result};
use crate::gguf::{GgufMeta, MetaValue, TensorInfo};

pub const MAGIC: &[u8; 8] = b"CORTIQMF";
pub const FORMAT_VERSION: u32 = 1;
/// The version of files with interleaved tensors (`TensorEntry::layout`); readers take both.
pub const FORMAT_VERSION_LAYOUT: u32 = 2;
/// `TensorEntry::layout` of the 16-row interleaved layout.
pub const LAYOUT_IL16: &str = "il16";
/// Tensor data alignment: a cache line, and what AVX-512 loads like.
pub const ALIGN: u64 = 64;
/// Magic, version, reserved, JSON length.
const PREAMBLE: u64 = 24;

/// Whether the file starts with the .cmf magic (detection by content, not extension).
pub fn is_cmf(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == MAGIC
}

/// Where the model came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// "gguf", "hf" or "cmf".
    pub kind: String,
    /// File or folder name (no directories).
    pub file: String,
}

/// The embedded configuration + tokenizer + chat template, in the source's own form.
/// Externally tagged (`{"gguf": {...}}`): serde reads that form in one pass, where an internal
/// `"kind"` tag would first buffer the whole vocabulary in a generic tree (measured: the
/// largest cost of opening a Gemma 3 .cmf).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metadata {
    /// Every GGUF metadata key/value of the source.
    Gguf { kv: TypedKv },
    /// HF folder files by name, verbatim (config.json, generation_config.json, tokenizer.json,
    /// tokenizer_config.json, chat_template.jinja: those that exist).
    Hf { files: BTreeMap<String, String> },
}

/// One tensor as the JSON header lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorEntry {
    pub name: String,
    /// A `QuantType` name ("f32", "q4_K", ...).
    pub dtype: String,
    /// Row-major, outermost first (HF/numpy order).
    pub shape: Vec<u64>,
    /// From the start of the data section; a multiple of `ALIGN`.
    pub offset: u64,
    pub bytes: u64,
    /// `Some("il16")`: rows in the 16-row interleaved layout (see the module header); absent:
    /// row-major.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

/// The JSON header.
/// Unknown fields are ignored (additions that old readers may skip keep the version; anything
/// else bumps it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CmfHeader {
    pub format_version: u32,
    /// The engine's architecture name (GGUF's `general.architecture` spelling).
    pub architecture: String,
    pub source: SourceInfo,
    /// What the converter was asked for ("keep", "f16", ...), for people reading the header.
    pub quant: String,
    /// Added to every RMSNorm gain before writing (an HF Gemma's 1.0); loaders add nothing.
    pub norm_offset_folded: f32,
    pub metadata: Metadata,
    /// O(1) serving settings of a polished model (`cortiq polish`): `run` / `ppl` serve it in
    /// O(1) mode by default. Absent in converted models (and skipped when writing them, so
    /// their headers are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub o1: Option<O1Header>,
    pub tensors: Vec<TensorEntry>,
}

/// The O(1) settings a polished model was trained for (the engine's `O1Settings`, plus the
/// training context for people reading the header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct O1Header {
    /// Exact window W.
    pub window: usize,
    /// Attention sinks S.
    pub sinks: usize,
    /// Landmark cap m.
    pub landmarks: usize,
    /// Ridge factor.
    pub ridge: f64,
    /// Context T the polish trained with (the first T/2 tokens the sealed prompt).
    pub trained_ctx: usize,
    /// Optimizer steps of the polish.
    pub steps: u64,
    /// The learned far field's feature count when the file carries one (`blk.N.attn_far_*`,
    /// `cortiq polish --o1-far linear`): window and sinks above are then sink+window's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far_rank: Option<usize>,
    /// The calibrated window split (`cortiq polish`): per planned layer, the relative
    /// attention-output error of sinks + w exact positions at w = step·(j + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<O1SplitHeader>,
    /// The eviction rule the far field was fitted beside (`polish --far-rule`): "score" when it
    /// was score eviction (then served with it by default); absent for sink+window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub far_rule: Option<String>,
    /// With `far_rule` "score": the planned layers served with score eviction (`polish
    /// --far-rule auto` chose them, the others keep sink+window); absent: every planned layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_layers: Option<Vec<usize>>,
}

/// See [`O1Header::split`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct O1SplitHeader {
    pub step: usize,
    pub layers: Vec<usize>,
    pub curves: Vec<Vec<f32>>,
}

/// An opened .cmf file.
pub struct Cmf {
    pub path: PathBuf,
    pub header: CmfHeader,
    /// Validated tensors: dims in GGUF order (innermost first), absolute offsets.
    pub tensors: Vec<TensorInfo>,
    index: BTreeMap<String, usize>,
    mmap: Arc<Mmap>,
}

fn find_dtype(name: &str) -> Option<QuantType> {
    QuantType::from_name(name)
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Bytes of a tensor of `shape` (outermost first) in `dtype`; `None` when the innermost
/// dimension is not whole blocks or the size overflows.
pub fn tensor_bytes(dtype: QuantType, shape: &[u64]) -> Option<u64> {
    let (&cols, outer) = shape.split_last()?;
    let rows = outer.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    let row = dtype.row_bytes(usize::try_from(cols).ok()?)? as u64;
    rows.checked_mul(row).filter(|&n| n < 1 << 48)
}

/// Bytes of a tensor of `shape` in `dtype`, stored row-major or (`interleaved`) in the 16-row
/// interleaved layout; `None` where the type or width has no such layout or the size overflows.
pub fn stored_bytes(dtype: QuantType, shape: &[u64], interleaved: bool) -> Option<u64> {
    if !interleaved {
        return tensor_bytes(dtype, shape);
    }
    let (&cols, outer) = shape.split_last()?;
    let rows = outer.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    let n = cortiq_kernels::quant::ileave_bytes(dtype, usize::try_from(rows).ok()?, usize::try_from(cols).ok()?)?;
    Some(n as u64).filter(|&n| n < 1 << 48)
}

impl Cmf {
    pub fn open(path: impl AsRef<Path>) -> Result<Cmf> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| FormatError::io(&path, e))?;
        let mmap = crate::mapping::map_readonly(&file, &path)?;
        Self::parse(path, Arc::new(mmap))
    }

    fn parse(path: PathBuf, mmap: Arc<Mmap>) -> Result<Cmf> {
        let buf = &mmap[..];
        let file_len = buf.len() as u64;
        if file_len < PREAMBLE {
            return Err(FormatError::Truncated { path, what: "header".into(), need: PREAMBLE, have: file_len });
        }
        if &buf[..8] != MAGIC {
            return Err(FormatError::malformed(&path, format!("not a .cmf file (magic {:02x?})", &buf[..8])));
        }
        let le32 = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let version = le32(8);
        if version != FORMAT_VERSION && version != FORMAT_VERSION_LAYOUT {
            return Err(FormatError::malformed(
                &path,
                format!(
                    ".cmf version {version} is not supported (this build reads {FORMAT_VERSION} and {FORMAT_VERSION_LAYOUT})"
                ),
            ));
        }
        let json_len = u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"));
        let json_end = PREAMBLE.saturating_add(json_len);
        if json_end > file_len {
            return Err(FormatError::Truncated { path, what: "JSON header".into(), need: json_end, have: file_len });
        }
        let header: CmfHeader = serde_json::from_slice(&buf[PREAMBLE as usize..json_end as usize])
            .map_err(|e| FormatError::malformed(&path, format!("JSON header: {e}")))?;
        if header.format_version != version {
            return Err(FormatError::field(
                &path,
                "format_version",
                format!("{} disagrees with the binary header's {version}", header.format_version),
            ));
        }
        let data_start = align_up(json_end);

        let mut tensors = Vec::with_capacity(header.tensors.len());
        let mut index = BTreeMap::new();
        for t in &header.tensors {
            let name = &t.name;
            let dtype = find_dtype(&t.dtype).ok_or_else(|| FormatError::UnsupportedDtype {
                path: path.clone(),
                tensor: name.clone(),
                dtype: t.dtype.clone(),
            })?;
            if t.shape.is_empty() || t.shape.len() > 4 {
                return Err(FormatError::malformed(&path, format!("tensor '{name}' has shape {:?} (1 to 4 dims)", t.shape)));
            }
            let interleaved = match t.layout.as_deref() {
                None => false,
                Some(LAYOUT_IL16) if version == FORMAT_VERSION_LAYOUT => true,
                Some(l) => {
                    return Err(FormatError::malformed(
                        &path,
                        format!(
                            "tensor '{name}' has layout '{l}' (a version-{FORMAT_VERSION_LAYOUT} file may say '{LAYOUT_IL16}')"
                        ),
                    ));
                }
            };
            let bytes = stored_bytes(dtype, &t.shape, interleaved).ok_or_else(|| {
                FormatError::malformed(&path, format!("tensor '{name}' has invalid shape {:?} for {dtype}", t.shape))
            })?;
            if bytes != t.bytes {
                return Err(FormatError::malformed(
                    &path,
                    format!("tensor '{name}' says {} bytes but {dtype} {:?} takes {bytes}", t.bytes, t.shape),
                ));
            }
            if t.offset % ALIGN != 0 {
                return Err(FormatError::malformed(&path, format!("tensor '{name}' offset {} is not {ALIGN}-aligned", t.offset)));
            }
            let offset = data_start
                .checked_add(t.offset)
                .ok_or_else(|| FormatError::malformed(&path, format!("tensor '{name}' offset {} overflows", t.offset)))?;
            let end = offset.saturating_add(bytes);
            if end > file_len {
                return Err(FormatError::Truncated {
                    path: path.clone(),
                    what: format!("tensor '{name}' data"),
                    need: end,
                    have: file_len,
                });
            }
            if index.insert(name.clone(), tensors.len()).is_some() {
                return Err(FormatError::malformed(&path, format!("tensor '{name}' appears twice")));
            }
            let dims = t.shape.iter().rev().copied().collect();
            tensors.push(TensorInfo { name: name.clone(), dims, dtype, offset, n_bytes: bytes, shard: 0, interleaved });
        }
        // Overlapping tensors mean a corrupted directory (two names aliasing the same bytes).
        let mut spans: Vec<(u64, u64, &str)> = tensors.iter().map(|t| (t.offset, t.offset + t.n_bytes, &t.name[..])).collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(FormatError::malformed(&path, format!("tensor '{}' overlaps tensor '{}'", w[1].2, w[0].2)));
            }
        }
        Ok(Cmf { path, header, tensors, index, mmap })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of a tensor (a slice of the memory map).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }

    /// The shared memory map, for holders that outlive this struct.
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    /// The GGUF key/values a .cmf converted from a GGUF carries (`None` for other sources).
    pub fn gguf_kv(&self) -> Option<&BTreeMap<String, MetaValue>> {
        match &self.header.metadata {
            Metadata::Gguf { kv } => Some(&kv.0),
            Metadata::Hf { .. } => None,
        }
    }

    /// An embedded HF file's text (`None` when absent or the source was not an HF folder).
    pub fn hf_file(&self, name: &str) -> Option<&str> {
        match &self.header.metadata {
            Metadata::Hf { files } => files.get(name).map(String::as_str),
            Metadata::Gguf { .. } => None,
        }
    }

    /// A path naming an embedded file in errors: `model.cmf:tokenizer.json`.
    pub fn embedded_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{}:{name}", self.path.display()))
    }
}

/// The GGUF-keyed view; a .cmf from another source has no keys (lookups report them missing).
impl GgufMeta for Cmf {
    fn meta_path(&self) -> &Path {
        &self.path
    }
    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.gguf_kv()?.get(key)
    }
    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        Cmf::tensor(self, name)
    }
    fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        Cmf::tensor_data(self, info)
    }
}

// ---------------------------------------------------------------------------------------
// Writer

/// One tensor to write: its name, stored type and shape (outermost first).
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: QuantType,
    pub shape: Vec<u64>,
    /// Store the rows in the 16-row interleaved layout (`TensorEntry::layout`).
    pub interleaved: bool,
}

impl PlannedTensor {
    /// A row-major tensor.
    pub fn new(name: impl Into<String>, dtype: QuantType, shape: Vec<u64>) -> PlannedTensor {
        PlannedTensor { name: name.into(), dtype, shape, interleaved: false }
    }
}

/// Streams a .cmf: the header first, then each planned tensor's bytes in plan order
/// (`write_data` any number of times, then `end_tensor`), then `finish` renames the
/// temporary file into place. Dropped before `finish`, it removes the temporary file.
pub struct CmfWriter {
    out: PathBuf,
    tmp: PathBuf,
    file: Option<crate::ChunkWriter<File>>,
    force: bool,
    /// (name, bytes) in plan order.
    plan: Vec<(String, u64)>,
    /// Index of the tensor being written.
    cur: usize,
    /// Bytes of the current tensor written so far.
    cur_written: u64,
    /// Bytes written to the file so far.
    pos: u64,
}

impl CmfWriter {
    /// Plans offsets for `tensors` (filling `header.tensors`), creates the temporary file beside
    /// `out` and writes the header. Refuses an existing `out` unless `force`.
    pub fn create(out: &Path, mut header: CmfHeader, tensors: &[PlannedTensor], force: bool) -> Result<CmfWriter> {
        if !force && out.exists() {
            return Err(exists_error(out));
        }
        let mut entries = Vec::with_capacity(tensors.len());
        let mut off = 0u64;
        let mut seen = std::collections::BTreeSet::new();
        for t in tensors {
            if !seen.insert(&t.name) {
                return Err(FormatError::malformed(out, format!("tensor '{}' planned twice", t.name)));
            }
            let bytes = stored_bytes(t.dtype, &t.shape, t.interleaved).ok_or_else(|| {
                FormatError::malformed(out, format!("tensor '{}': shape {:?} is not whole {} blocks", t.name, t.shape, t.dtype))
            })?;
            entries.push(TensorEntry {
                name: t.name.clone(),
                dtype: t.dtype.name().into(),
                shape: t.shape.clone(),
                offset: off,
                bytes,
                layout: t.interleaved.then(|| LAYOUT_IL16.to_string()),
            });
            off = align_up(off + bytes);
        }
        let layouts = tensors.iter().any(|t| t.interleaved);
        let version = if layouts { FORMAT_VERSION_LAYOUT } else { FORMAT_VERSION };
        header.format_version = version;
        header.tensors = entries;
        let json = serde_json::to_vec(&header).map_err(|e| FormatError::malformed(out, format!("JSON header: {e}")))?;

        let name = out.file_name().ok_or_else(|| FormatError::malformed(out, "output path has no file name"))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = out.with_file_name(tmp_name);
        let f = File::create(&tmp).map_err(|e| FormatError::io(&tmp, e))?;
        let mut w = CmfWriter {
            out: out.to_path_buf(),
            tmp,
            // writes ending on 4 MiB boundaries: the page cache keeps the new file in 2 MiB
            // pages, which the first load maps as such (`ChunkWriter`)
            file: Some(crate::ChunkWriter::new(f, 0, crate::WRITE_CHUNK)),
            force,
            plan: header.tensors.iter().map(|t| (t.name.clone(), t.bytes)).collect(),
            cur: 0,
            cur_written: 0,
            pos: 0,
        };
        w.raw(MAGIC)?;
        w.raw(&version.to_le_bytes())?;
        w.raw(&0u32.to_le_bytes())?;
        w.raw(&(json.len() as u64).to_le_bytes())?;
        w.raw(&json)?;
        w.pad()?;
        Ok(w)
    }

    /// The temporary file being written (removed on drop unless finished).
    pub fn temp_path(&self) -> &Path {
        &self.tmp
    }

    fn raw(&mut self, b: &[u8]) -> Result<()> {
        let f = self.file.as_mut().expect("open until finish");
        f.write_all(b).map_err(|e| FormatError::io(&self.tmp, e))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> Result<()> {
        let n = (align_up(self.pos) - self.pos) as usize;
        self.raw(&[0u8; ALIGN as usize][..n])
    }

    /// Name of the tensor the next bytes belong to (`None` when all are written).
    pub fn current(&self) -> Option<&str> {
        self.plan.get(self.cur).map(|(n, _)| n.as_str())
    }

    /// Appends bytes of the current tensor.
    pub fn write_data(&mut self, chunk: &[u8]) -> Result<()> {
        let Some((name, bytes)) = self.plan.get(self.cur) else {
            return Err(FormatError::malformed(&self.out, "data written after the last planned tensor"));
        };
        if self.cur_written + chunk.len() as u64 > *bytes {
            return Err(FormatError::malformed(
                &self.out,
                format!("tensor '{name}': {} bytes written, {bytes} planned", self.cur_written + chunk.len() as u64),
            ));
        }
        self.cur_written += chunk.len() as u64;
        self.raw(chunk)
    }

    /// Closes the current tensor (which must be complete) and pads to the next boundary.
    pub fn end_tensor(&mut self) -> Result<()> {
        let Some((name, bytes)) = self.plan.get(self.cur) else {
            return Err(FormatError::malformed(&self.out, "end_tensor after the last planned tensor"));
        };
        if self.cur_written != *bytes {
            return Err(FormatError::malformed(
                &self.out,
                format!("tensor '{name}': {} bytes written, {bytes} planned", self.cur_written),
            ));
        }
        self.cur += 1;
        self.cur_written = 0;
        self.pad()
    }

    /// Flushes, syncs and renames the temporary file to the output; returns the file size.
    pub fn finish(mut self) -> Result<u64> {
        if let Some(name) = self.current() {
            return Err(FormatError::malformed(&self.out, format!("tensor '{name}' was never written")));
        }
        let f = self.file.take().expect("open until finish");
        let f = f.into_inner().map_err(|e| FormatError::io(&self.tmp, e))?;
        f.sync_all().map_err(|e| FormatError::io(&self.tmp, e))?;
        drop(f);
        // Checked again: the output may have appeared while we were writing.
        if !self.force && self.out.exists() {
            return Err(exists_error(&self.out));
        }
        std::fs::rename(&self.tmp, &self.out).map_err(|e| FormatError::io(&self.out, e))?;
        self.tmp = PathBuf::new();
        Ok(self.pos)
    }
}

impl Drop for CmfWriter {
    fn drop(&mut self) {
        // Unfinished (an error, or a panic upstream): leave nothing half-written behind.
        self.file.take();
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn exists_error(out: &Path) -> FormatError {
    FormatError::io(out, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "already exists (pass --force to overwrite)"))
}

// ---------------------------------------------------------------------------------------
// Typed metadata values as JSON

/// GGUF key/values serialized as `{"t": TYPE, "v": VALUE}` objects (see the module header).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TypedKv(pub BTreeMap<String, MetaValue>);

/// Scalar type names, as GGUF's value types are named by `MetaValue::type_name` ("str" for
/// strings: short, it repeats 262k times in a Gemma vocabulary).
fn scalar_name(v: &MetaValue) -> Option<&'static str> {
    match v {
        MetaValue::Str(_) => Some("str"),
        MetaValue::Array(_) => None,
        v => Some(v.type_name()),
    }
}

/// The f64 of an f32, or a string for non-finite values (JSON has no NaN/inf).
enum F32Json {
    Num(f64),
    Str(&'static str),
}

fn f32_json(x: f32) -> F32Json {
    if x.is_nan() {
        F32Json::Str("NaN")
    } else if x == f32::INFINITY {
        F32Json::Str("inf")
    } else if x == f32::NEG_INFINITY {
        F32Json::Str("-inf")
    } else {
        F32Json::Num(x as f64)
    }
}

/// A scalar's bare JSON value.
struct Bare<'a>(&'a MetaValue);

impl Serialize for Bare<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self.0 {
            MetaValue::U8(v) => s.serialize_u8(*v),
            MetaValue::I8(v) => s.serialize_i8(*v),
            MetaValue::U16(v) => s.serialize_u16(*v),
            MetaValue::I16(v) => s.serialize_i16(*v),
            MetaValue::U32(v) => s.serialize_u32(*v),
            MetaValue::I32(v) => s.serialize_i32(*v),
            MetaValue::U64(v) => s.serialize_u64(*v),
            MetaValue::I64(v) => s.serialize_i64(*v),
            MetaValue::F32(v) => match f32_json(*v) {
                F32Json::Num(x) => s.serialize_f64(x),
                F32Json::Str(t) => s.serialize_str(t),
            },
            // LowerExp without precision is Rust's shortest round-trip form, short for 1e-6.
            MetaValue::F64(v) => s.collect_str(&format_args!("{v:e}")),
            MetaValue::Bool(v) => s.serialize_bool(*v),
            MetaValue::Str(v) => s.serialize_str(v),
            MetaValue::Array(_) => Err(serde::ser::Error::custom("nested array written as a scalar")),
        }
    }
}

/// A value with its type tag.
struct Typed<'a>(&'a MetaValue);

impl Serialize for Typed<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        match self.0 {
            MetaValue::Array(a) => {
                let first = a.first().and_then(scalar_name);
                let homogeneous = first.is_some() && a.iter().all(|x| scalar_name(x) == first);
                if a.is_empty() {
                    m.serialize_entry("t", "[]")?;
                    m.serialize_entry("v", &[(); 0])?;
                } else if homogeneous {
                    m.serialize_entry("t", &format!("[{}]", first.expect("homogeneous")))?;
                    m.serialize_entry("v", &Seq(a, false))?;
                } else {
                    m.serialize_entry("t", "[*]")?;
                    m.serialize_entry("v", &Seq(a, true))?;
                }
            }
            v => {
                m.serialize_entry("t", scalar_name(v).expect("scalar"))?;
                m.serialize_entry("v", &Bare(v))?;
            }
        }
        m.end()
    }
}

/// Array elements, bare or each typed.
struct Seq<'a>(&'a [MetaValue], bool);

impl Serialize for Seq<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut q = s.serialize_seq(Some(self.0.len()))?;
        for x in self.0 {
            if self.1 { q.serialize_element(&Typed(x))? } else { q.serialize_element(&Bare(x))? }
        }
        q.end()
    }
}

impl Serialize for TypedKv {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, &Typed(v))?;
        }
        m.end()
    }
}

/// A scalar type named by a tag.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scalar {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F32,
    F64,
    Bool,
    Str,
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Scalar::U8 => "u8",
            Scalar::I8 => "i8",
            Scalar::U16 => "u16",
            Scalar::I16 => "i16",
            Scalar::U32 => "u32",
            Scalar::I32 => "i32",
            Scalar::U64 => "u64",
            Scalar::I64 => "i64",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
            Scalar::Bool => "bool",
            Scalar::Str => "str",
        })
    }
}

impl Scalar {
    fn parse(t: &str) -> Option<Scalar> {
        Some(match t {
            "u8" => Scalar::U8,
            "i8" => Scalar::I8,
            "u16" => Scalar::U16,
            "i16" => Scalar::I16,
            "u32" => Scalar::U32,
            "i32" => Scalar::I32,
            "u64" => Scalar::U64,
            "i64" => Scalar::I64,
            "f32" => Scalar::F32,
            "f64" => Scalar::F64,
            "bool" => Scalar::Bool,
            "str" => Scalar::Str,
            _ => return None,
        })
    }
}

/// What a tag says the value is.
#[derive(Clone, Copy)]
enum Tag {
    Scalar(Scalar),
    /// Homogeneous array of bare scalars.
    Array(Scalar),
    Empty,
    /// Array of typed values.
    Mixed,
}

fn parse_tag(t: &str) -> Option<Tag> {
    Some(match t {
        "[]" => Tag::Empty,
        "[*]" => Tag::Mixed,
        _ => match t.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
            Some(inner) => Tag::Array(Scalar::parse(inner)?),
            None => Tag::Scalar(Scalar::parse(t)?),
        },
    })
}

/// A bare scalar of a known type.
struct ScalarSeed(Scalar);

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = MetaValue;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<MetaValue, D::Error> {
        d.deserialize_any(ScalarVisitor(self.0))
    }
}

struct ScalarVisitor(Scalar);

impl ScalarVisitor {
    fn int<E: de::Error>(&self, v: i128) -> std::result::Result<MetaValue, E> {
        let bad = || E::custom(format!("{v} does not fit {}", self.0));
        Ok(match self.0 {
            Scalar::U8 => MetaValue::U8(v.try_into().map_err(|_| bad())?),
            Scalar::I8 => MetaValue::I8(v.try_into().map_err(|_| bad())?),
            Scalar::U16 => MetaValue::U16(v.try_into().map_err(|_| bad())?),
            Scalar::I16 => MetaValue::I16(v.try_into().map_err(|_| bad())?),
            Scalar::U32 => MetaValue::U32(v.try_into().map_err(|_| bad())?),
            Scalar::I32 => MetaValue::I32(v.try_into().map_err(|_| bad())?),
            Scalar::U64 => MetaValue::U64(v.try_into().map_err(|_| bad())?),
            Scalar::I64 => MetaValue::I64(v.try_into().map_err(|_| bad())?),
            // Whole numbers in a float slot: serde_json hands integral-looking numbers as ints.
            Scalar::F32 => MetaValue::F32(v as f64 as f32),
            Scalar::F64 => MetaValue::F64(v as f64),
            _ => return Err(E::custom(format!("expected {}, found integer {v}", self.0))),
        })
    }
}

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = MetaValue;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a {} value", self.0)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<MetaValue, E> {
        self.int(v as i128)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<MetaValue, E> {
        self.int(v as i128)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<MetaValue, E> {
        match self.0 {
            // The writer wrote the f32's exact f64 widening; narrowing returns that f32 even if
            // the parser missed the f64 by an ulp.
            Scalar::F32 => Ok(MetaValue::F32(v as f32)),
            // The writer uses strings for f64 (exact); a number from a hand-edited file is
            // taken as the parser read it.
            Scalar::F64 => Ok(MetaValue::F64(v)),
            s => Err(E::custom(format!("expected {s}, found number {v}"))),
        }
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<MetaValue, E> {
        match self.0 {
            Scalar::Bool => Ok(MetaValue::Bool(v)),
            s => Err(E::custom(format!("expected {s}, found bool"))),
        }
    }
    fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<MetaValue, E> {
        match self.0 {
            Scalar::Str => Ok(MetaValue::Str(v.to_string())),
            Scalar::F32 => v.parse().map(MetaValue::F32).map_err(|_| E::custom(format!("'{v}' is not an f32"))),
            Scalar::F64 => v.parse().map(MetaValue::F64).map_err(|_| E::custom(format!("'{v}' is not an f64"))),
            s => Err(E::custom(format!("expected {s}, found string"))),
        }
    }
    fn visit_string<E: de::Error>(self, v: String) -> std::result::Result<MetaValue, E> {
        match self.0 {
            Scalar::Str => Ok(MetaValue::Str(v)),
            _ => self.visit_str(&v),
        }
    }
}

/// A sequence of elements, each read by `seed()`.
struct SeqSeed<F>(F);

impl<'de, F, S> DeserializeSeed<'de> for SeqSeed<F>
where
    F: Fn() -> S,
    S: DeserializeSeed<'de, Value = MetaValue>,
{
    type Value = Vec<MetaValue>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Vec<MetaValue>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, F, S> Visitor<'de> for SeqSeed<F>
where
    F: Fn() -> S,
    S: DeserializeSeed<'de, Value = MetaValue>,
{
    type Value = Vec<MetaValue>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Vec<MetaValue>, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(x) = seq.next_element_seed((self.0)())? {
            v.push(x);
        }
        Ok(v)
    }
}

/// `{"t": TAG, "v": VALUE}`, "t" first (the writer's order), so the value is read straight
/// into its type without an intermediate JSON tree.
struct TypedSeed;

impl<'de> DeserializeSeed<'de> for TypedSeed {
    type Value = MetaValue;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<MetaValue, D::Error> {
        d.deserialize_map(TypedVisitor)
    }
}

struct TypedVisitor;

impl<'de> Visitor<'de> for TypedVisitor {
    type Value = MetaValue;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a typed value {\"t\": type, \"v\": value}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<MetaValue, A::Error> {
        let k: Option<String> = m.next_key()?;
        if k.as_deref() != Some("t") {
            return Err(de::Error::custom("typed value must start with \"t\""));
        }
        let t: String = m.next_value()?;
        let tag = parse_tag(&t).ok_or_else(|| de::Error::custom(format!("unknown value type '{t}'")))?;
        let k: Option<String> = m.next_key()?;
        if k.as_deref() != Some("v") {
            return Err(de::Error::custom("typed value needs \"v\" after \"t\""));
        }
        let v = match tag {
            Tag::Scalar(s) => m.next_value_seed(ScalarSeed(s))?,
            Tag::Array(s) => MetaValue::Array(m.next_value_seed(SeqSeed(|| ScalarSeed(s)))?),
            Tag::Mixed => MetaValue::Array(m.next_value_seed(SeqSeed(|| TypedSeed))?),
            Tag::Empty => {
                let v = m.next_value_seed(SeqSeed(|| ScalarSeed(Scalar::Str)))?;
                if !v.is_empty() {
                    return Err(de::Error::custom("type \"[]\" with a non-empty value"));
                }
                MetaValue::Array(v)
            }
        };
        if m.next_key::<String>()?.is_some() {
            return Err(de::Error::custom("typed value has keys besides \"t\" and \"v\""));
        }
        Ok(v)
    }
}

impl<'de> Deserialize<'de> for TypedKv {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<TypedKv, D::Error> {
        struct KvVisitor;
        impl<'de> Visitor<'de> for KvVisitor {
            type Value = TypedKv;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of typed values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<TypedKv, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = m.next_key::<String>()? {
                    let v = m.next_value_seed(TypedSeed).map_err(|e| de::Error::custom(format!("key '{k}': {e}")))?;
                    if out.insert(k.clone(), v).is_some() {
                        return Err(de::Error::custom(format!("key '{k}' appears twice")));
                    }
                }
                Ok(TypedKv(out))
            }
        }
        d.deserialize_map(KvVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv() -> TypedKv {
        let mut m = BTreeMap::new();
        m.insert("a.u8".into(), MetaValue::U8(255));
        m.insert("a.i8".into(), MetaValue::I8(-128));
        m.insert("a.u16".into(), MetaValue::U16(65535));
        m.insert("a.i16".into(), MetaValue::I16(-32768));
        m.insert("a.u32".into(), MetaValue::U32(4_000_000_000));
        m.insert("a.i32".into(), MetaValue::I32(-2_000_000_000));
        m.insert("a.u64".into(), MetaValue::U64(u64::MAX));
        m.insert("a.i64".into(), MetaValue::I64(i64::MIN));
        m.insert("a.f32".into(), MetaValue::F32(0.1));
        m.insert("a.f32w".into(), MetaValue::F32(3.0));
        m.insert("a.f32inf".into(), MetaValue::F32(f32::NEG_INFINITY));
        m.insert("a.f64".into(), MetaValue::F64(1e-6 + 1e-22));
        m.insert("a.bool".into(), MetaValue::Bool(true));
        m.insert("a.str".into(), MetaValue::Str("h\u{e9}llo \"\n".into()));
        m.insert("a.strs".into(), MetaValue::Array(vec![MetaValue::Str("x".into()), MetaValue::Str(String::new())]));
        m.insert(
            "a.f32s".into(),
            MetaValue::Array(vec![
                MetaValue::F32(-1000.0),
                MetaValue::F32(1.0e-30),
                MetaValue::F32(f32::MAX),
                MetaValue::F32(f32::MIN_POSITIVE / 3.0),
            ]),
        );
        m.insert("a.empty".into(), MetaValue::Array(vec![]));
        m.insert(
            "a.nested".into(),
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I32(1)]), MetaValue::Array(vec![MetaValue::Str("z".into())])]),
        );
        TypedKv(m)
    }

    #[test]
    fn typed_values_round_trip_bit_for_bit() {
        let kv = kv();
        let json = serde_json::to_string(&kv).unwrap();
        let back: TypedKv = serde_json::from_str(&json).unwrap();
        for (k, v) in &kv.0 {
            let b = &back.0[k];
            // PartialEq on f32 is numeric; compare bits too.
            let bits = |v: &MetaValue| {
                format!("{v:?}") + &if let MetaValue::F32(x) = v { x.to_bits().to_string() } else { String::new() }
            };
            assert_eq!(bits(v), bits(b), "{k}: written {v:?}, read {b:?} (json {json})");
        }
        assert_eq!(back, kv);
    }

    #[test]
    fn typed_values_reject_wrong_types() {
        for (json, want) in [
            (r#"{"k":{"t":"u8","v":256}}"#, "key 'k'"),
            (r#"{"k":{"t":"u9","v":1}}"#, "unknown value type 'u9'"),
            (r#"{"k":{"v":1,"t":"u8"}}"#, "must start with"),
            (r#"{"k":{"t":"[str]","v":["a",1]}}"#, "expected str"),
            (r#"{"k":{"t":"bool","v":"yes"}}"#, "expected bool"),
            (r#"{"k":{"t":"u8","v":1,"x":2}}"#, "besides"),
        ] {
            let e = serde_json::from_str::<TypedKv>(json).unwrap_err().to_string();
            assert!(e.contains(want), "{json}: error '{e}' lacks '{want}'");
        }
    }
}
