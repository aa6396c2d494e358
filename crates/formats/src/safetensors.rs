//! Hugging Face safetensors weights: a single `model.safetensors` or a sharded set named by
//! `model.safetensors.index.json`, memory-mapped, tensors handed out as byte slices in
//! their stored dtype and row-major shape (nothing is converted here).
//!
//! The header is parsed by hand (8-byte little-endian length, then JSON) so every failure
//! names the file and tensor: a header length past the file, invalid JSON, a shape whose
//! size disagrees with its byte range, a byte range past the file. A tensor whose dtype we
//! cannot compute with (I64, F8_*, ...) is kept in the listing and only becomes an error
//! when it is requested: HF folders carry such buffers (position ids, quantization scales)
//! that a loader never asks for.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cortiq_kernels::quant::QuantType;
use memmap2::Mmap;
use serde_json::Value;

use crate::error::{FormatError, Result};

/// Header lengths above this are refused before any allocation (the safetensors reference
/// implementation uses the same 100 MB bound).
const MAX_HEADER: u64 = 100_000_000;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor as stored: dtype, row-major shape and its bytes in the mapped file.
/// `data` is not guaranteed to be aligned to the element size.
#[derive(Clone, Debug)]
pub struct RawTensor<'a> {
    pub name: &'a str,
    pub dtype: QuantType,
    /// Row-major (outermost first), as stored: an HF linear weight is [out, in].
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// What the header says about a tensor, whatever its dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorMeta {
    /// The safetensors dtype string, e.g. "BF16", "I64".
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Index into [`HfWeights::files`].
    pub file: usize,
    /// Absolute byte range in that file.
    pub range: Range<usize>,
}

/// The weights of one HF folder (or one safetensors file).
pub struct HfWeights {
    files: Vec<PathBuf>,
    mmaps: Vec<Arc<Mmap>>,
    tensors: BTreeMap<String, TensorMeta>,
    /// `__metadata__` of each file (string -> string), in file order.
    file_metadata: Vec<BTreeMap<String, String>>,
}

impl HfWeights {
    /// Opens `<dir>/model.safetensors.index.json` (sharded) if present, else
    /// `<dir>/model.safetensors`.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<HfWeights> {
        let dir = dir.as_ref();
        let index = dir.join(INDEX_FILE);
        if index.exists() {
            return Self::open_index(&index);
        }
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            return Self::open_files(vec![single]);
        }
        Err(FormatError::missing(dir, format!("{SINGLE_FILE} or {INDEX_FILE}")))
    }

    /// Opens one `.safetensors` file.
    pub fn open_file(path: impl AsRef<Path>) -> Result<HfWeights> {
        Self::open_files(vec![path.as_ref().to_path_buf()])
    }

    /// Opens a sharded set from its index file. Every shard named in `weight_map` is opened;
    /// each name in `weight_map` must be found in the shard it names.
    pub fn open_index(index_path: impl AsRef<Path>) -> Result<HfWeights> {
        let index_path = index_path.as_ref();
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let s = std::fs::read_to_string(index_path).map_err(|e| FormatError::io(index_path, e))?;
        let v: Value = serde_json::from_str(&s).map_err(|e| FormatError::malformed(index_path, format!("invalid JSON: {e}")))?;
        let map = match v.get("weight_map") {
            Some(Value::Object(m)) => m,
            Some(_) => return Err(FormatError::field(index_path, "weight_map", "expected an object")),
            None => return Err(FormatError::missing(index_path, "field 'weight_map'")),
        };
        let mut shard_names: Vec<&str> = Vec::new();
        let mut wanted: Vec<(&str, &str)> = Vec::with_capacity(map.len());
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| FormatError::field(index_path, format!("weight_map.{name}"), "expected a file name"))?;
            // A shard must be a plain relative path inside the folder.
            let p = Path::new(file);
            if file.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(FormatError::field(
                    index_path,
                    format!("weight_map.{name}"),
                    format!("'{file}' is not a file inside the folder"),
                ));
            }
            if !shard_names.contains(&file) {
                shard_names.push(file);
            }
            wanted.push((name, file));
        }
        if shard_names.is_empty() {
            return Err(FormatError::malformed(index_path, "weight_map is empty"));
        }
        // Shard order: as the names sort (model-00001-of-00003 ... ), stable across runs.
        shard_names.sort_unstable();
        let w = Self::open_files(shard_names.iter().map(|f| dir.join(f)).collect())?;
        for (name, file) in wanted {
            let expected = shard_names.iter().position(|f| *f == file).expect("listed above");
            match w.tensors.get(name) {
                Some(m) if m.file == expected => {}
                Some(m) => {
                    return Err(FormatError::malformed(
                        index_path,
                        format!("weight_map puts '{name}' in {file} but it is in {}", w.files[m.file].display()),
                    ));
                }
                None => {
                    return Err(FormatError::missing(dir.join(file), format!("tensor '{name}' (listed in {INDEX_FILE})")));
                }
            }
        }
        Ok(w)
    }

    fn open_files(paths: Vec<PathBuf>) -> Result<HfWeights> {
        let mut w = HfWeights { files: Vec::new(), mmaps: Vec::new(), tensors: BTreeMap::new(), file_metadata: Vec::new() };
        for (fi, path) in paths.into_iter().enumerate() {
            let file = File::open(&path).map_err(|e| FormatError::io(&path, e))?;
            let mmap = crate::mapping::map_readonly(&file, &path)?;
            let (entries, meta) = parse_header(&path, &mmap)?;
            for (name, (dtype, shape, range)) in entries {
                if let Some(prev) = w.tensors.get(&name) {
                    return Err(FormatError::malformed(
                        &path,
                        format!("tensor '{name}' also appears in {}", w.files[prev.file].display()),
                    ));
                }
                w.tensors.insert(name, TensorMeta { dtype, shape, file: fi, range });
            }
            w.files.push(path);
            w.mmaps.push(Arc::new(mmap));
            w.file_metadata.push(meta);
        }
        Ok(w)
    }

    /// A tensor by name: `Ok(None)` when absent, `Err(UnsupportedDtype)` when present in a
    /// dtype other than F32/F16/BF16.
    pub fn get(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let Some((key, m)) = self.tensors.get_key_value(name) else { return Ok(None) };
        let dtype = float_dtype(&m.dtype).ok_or_else(|| FormatError::UnsupportedDtype {
            path: self.files[m.file].clone(),
            tensor: name.to_string(),
            dtype: m.dtype.clone(),
        })?;
        Ok(Some(RawTensor { name: key, dtype, shape: m.shape.clone(), data: &self.mmaps[m.file][m.range.clone()] }))
    }

    /// A tensor that must exist: `Err(Missing)` naming the tensor when absent.
    pub fn tensor(&self, name: &str) -> Result<RawTensor<'_>> {
        self.get(name)?.ok_or_else(|| {
            let where_ = if self.files.len() == 1 { self.files[0].clone() } else { self.dir() };
            FormatError::missing(where_, format!("tensor '{name}'"))
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Header facts of a tensor, whatever its dtype.
    pub fn meta(&self, name: &str) -> Option<&TensorMeta> {
        self.tensors.get(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The mapped files, in the order `TensorMeta::file` indexes.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The memory maps, for holders that outlive this struct (clone the Arc).
    pub fn mmaps(&self) -> &[Arc<Mmap>] {
        &self.mmaps
    }

    /// The map holding `name` and the tensor's byte range in it, for zero-copy holders.
    pub fn locate(&self, name: &str) -> Option<(Arc<Mmap>, Range<usize>)> {
        self.tensors.get(name).map(|m| (self.mmaps[m.file].clone(), m.range.clone()))
    }

    /// The `__metadata__` string map of file `i` (empty when the file has none).
    pub fn file_metadata(&self, i: usize) -> Option<&BTreeMap<String, String>> {
        self.file_metadata.get(i)
    }

    fn dir(&self) -> PathBuf {
        self.files[0].parent().map(Path::to_path_buf).unwrap_or_default()
    }
}

/// The float dtypes the engine computes with.
fn float_dtype(s: &str) -> Option<QuantType> {
    match s {
        "F32" => Some(QuantType::F32),
        "F16" => Some(QuantType::F16),
        "BF16" => Some(QuantType::BF16),
        _ => None,
    }
}

/// Bits per element of every dtype the safetensors format defines (None: unknown string;
/// its size then cannot be checked, and it can never be requested anyway).
fn dtype_bits(s: &str) -> Option<u64> {
    Some(match s {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

type Entries = Vec<(String, (String, Vec<usize>, Range<usize>))>;

/// Parses and validates one file's header against the file length.
fn parse_header(path: &Path, buf: &[u8]) -> Result<(Entries, BTreeMap<String, String>)> {
    let file_len = buf.len() as u64;
    let n = buf.get(..8).ok_or_else(|| FormatError::Truncated {
        path: path.to_path_buf(),
        what: "header length".into(),
        need: 8,
        have: file_len,
    })?;
    let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
    if n > MAX_HEADER {
        return Err(FormatError::malformed(path, format!("header length {n} exceeds the {MAX_HEADER}-byte limit")));
    }
    let data_start = 8 + n;
    if data_start > file_len {
        return Err(FormatError::Truncated { path: path.to_path_buf(), what: "header".into(), need: data_start, have: file_len });
    }
    let header = &buf[8..data_start as usize];
    let v: Value =
        serde_json::from_slice(header).map_err(|e| FormatError::malformed(path, format!("header is not valid JSON: {e}")))?;
    let Value::Object(obj) = v else {
        return Err(FormatError::malformed(path, "header is not a JSON object"));
    };
    let data_len = file_len - data_start;

    let mut meta = BTreeMap::new();
    let mut entries = Vec::with_capacity(obj.len());
    for (name, e) in obj {
        if name == "__metadata__" {
            let Value::Object(m) = e else {
                return Err(FormatError::field(path, "__metadata__", "expected an object"));
            };
            for (k, v) in m {
                let Value::String(s) = v else {
                    return Err(FormatError::field(path, format!("__metadata__.{k}"), "expected a string"));
                };
                meta.insert(k, s);
            }
            continue;
        }
        let bad = |msg: String| FormatError::malformed(path, format!("tensor '{name}': {msg}"));
        let dtype = e.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("missing string 'dtype'".into()))?.to_string();
        let shape = e
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok())).collect::<Option<Vec<_>>>())
            .ok_or_else(|| bad("'shape' must be a list of non-negative integers".into()))?;
        let offs = e
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
            .ok_or_else(|| bad("'data_offsets' must be [begin, end]".into()))?;
        let (b, end) = offs;
        if b > end {
            return Err(bad(format!("data_offsets [{b}, {end}] are reversed")));
        }
        if end > data_len {
            return Err(FormatError::Truncated {
                path: path.to_path_buf(),
                what: format!("tensor '{name}' data (offsets [{b}, {end}] past the {data_len}-byte data section)"),
                need: data_start + end,
                have: file_len,
            });
        }
        if let Some(bits) = dtype_bits(&dtype) {
            let n_el = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let n_bytes = n_el.and_then(|n| n.checked_mul(bits)).map(|b| b.div_ceil(8));
            if n_bytes != Some(end - b) {
                return Err(bad(format!("shape {shape:?} of {dtype} needs {n_bytes:?} bytes but data_offsets span {}", end - b)));
            }
        }
        let range = (data_start + b) as usize..(data_start + end) as usize;
        entries.push((name, (dtype, shape, range)));
    }
    // Tensors must not share bytes: overlapping ranges mean a corrupted header.
    let mut spans: Vec<(&Range<usize>, &str)> = entries.iter().map(|(n, (_, _, r))| (r, n.as_str())).collect();
    spans.sort_by_key(|(r, _)| (r.start, r.end));
    for w in spans.windows(2) {
        let ((a, an), (b, bn)) = (w[0], w[1]);
        if b.start < a.end && !a.is_empty() && !b.is_empty() {
            return Err(FormatError::malformed(path, format!("tensors '{an}' and '{bn}' overlap ({a:?} and {b:?})")));
        }
    }
    Ok((entries, meta))
}
