//! GGUF v2/v3 reader: header, metadata of every value type, tensor infos, alignment.
//!
//! The file is memory-mapped once; tensor data is handed out as byte slices of the map in
//! the stored type (nothing is widened here). Every count and offset read from the file is
//! checked against the file length before it is used, so a truncated or corrupted file is
//! a `FormatError` naming the field, never a panic or a huge allocation.
//!
//! Split files (llama.cpp's gguf-split, `NAME-00001-of-00003.gguf`: every part a GGUF of its
//! own, the first holding all metadata, each `split.no` / `split.count` /
//! `split.tensors.count`) open as one `Gguf` from the first part: each part is mapped, and a
//! tensor's `shard` says which map holds its bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cortiq_kernels::quant::QuantType;
use memmap2::Mmap;

use crate::error::{FormatError, Result};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// Any integer type widened to i64 (u64 beyond i64::MAX is `None`).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            MetaValue::U8(v) => v as i64,
            MetaValue::I8(v) => v as i64,
            MetaValue::U16(v) => v as i64,
            MetaValue::I16(v) => v as i64,
            MetaValue::U32(v) => v as i64,
            MetaValue::I32(v) => v as i64,
            MetaValue::U64(v) => i64::try_from(v).ok()?,
            MetaValue::I64(v) => v,
            MetaValue::Bool(v) => v as i64,
            _ => return None,
        })
    }
    /// Any numeric type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
    /// The GGUF type's name ("u32", "string", "array" ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::Str(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }
}

/// A tensor's description. `dims` is in GGUF order: `dims[0]` is the innermost (contiguous)
/// dimension, so a weight of HF shape [out, in] has `dims == [in, out]`.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: QuantType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    pub n_bytes: u64,
    /// Which part of a split file holds the data (0 for a single file).
    pub shard: usize,
    /// The rows are in the 16-row interleaved layout (a .cmf's `"layout": "il16"`; never in a
    /// GGUF file).
    pub interleaved: bool,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Shape in row-major (outermost first) order, as HF and numpy write it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An opened GGUF file.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    index: BTreeMap<String, usize>,
    /// One map per part: `mmaps[info.shard]`.
    mmaps: Vec<Arc<Mmap>>,
}

/// `NAME-00001-of-00003.gguf` -> `("NAME", 1, 3)`, llama.cpp's split naming.
pub fn split_name(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = file_name.strip_suffix(".gguf")?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix, no.parse().ok()?, count.parse().ok()?))
}

impl Gguf {
    /// Open a GGUF file; for a split one, its first part (the others are found beside it).
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref().to_path_buf();
        let mut g = Self::open_one(&path)?;
        let Some(count) = g.split_key("split.count")? else { return Ok(g) };
        let no = g.split_key("split.no")?.unwrap_or(0);
        if count <= 1 {
            return Ok(g);
        }
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let Some((prefix, _, _)) = split_name(&name) else {
            return Err(FormatError::field(
                &path,
                "split.count",
                format!("{count} parts, but the file is not named NAME-00001-of-{count:05}.gguf"),
            ));
        };
        if no != 0 {
            let first = format!("{prefix}-00001-of-{count:05}.gguf");
            return Err(FormatError::malformed(
                &path,
                format!("part {} of a {count}-part split GGUF; open the first part, {first}", no + 1),
            ));
        }
        for k in 1..count {
            let part = path.with_file_name(format!("{prefix}-{:05}-of-{count:05}.gguf", k + 1));
            let p = Self::open_one(&part)?;
            if p.split_key("split.no")? != Some(k) || p.split_key("split.count")? != Some(count) {
                return Err(FormatError::field(&part, "split.no", format!("expected part {} of {count}", k + 1)));
            }
            let shard = g.mmaps.len();
            g.mmaps.push(Arc::clone(&p.mmaps[0]));
            for mut t in p.tensors {
                t.shard = shard;
                if g.index.insert(t.name.clone(), g.tensors.len()).is_some() {
                    return Err(FormatError::malformed(&part, format!("tensor '{}' is in two parts", t.name)));
                }
                g.tensors.push(t);
            }
        }
        if let Some(n) = g.split_key("split.tensors.count")?
            && n != g.tensors.len() as u64
        {
            return Err(FormatError::field(
                &path,
                "split.tensors.count",
                format!("{n}, but the {count} parts hold {} tensors", g.tensors.len()),
            ));
        }
        Ok(g)
    }

    fn open_one(path: &Path) -> Result<Gguf> {
        let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
        let mmap = crate::mapping::map_readonly(&file, path)?;
        Self::parse(path.to_path_buf(), Arc::new(mmap))
    }

    /// An integer `split.*` key, if present.
    fn split_key(&self, key: &str) -> Result<Option<u64>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .filter(|&n| n >= 0)
                .map(|n| Some(n as u64))
                .ok_or_else(|| FormatError::field(&self.path, key, format!("{v:?} is not a count"))),
        }
    }

    fn parse(path: PathBuf, mmap: Arc<Mmap>) -> Result<Gguf> {
        let mut r = Reader { buf: &mmap[..], pos: 0, path: &path };
        let magic = r.bytes(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(FormatError::malformed(&path, format!("not a GGUF file (magic {:02x?})", magic)));
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(FormatError::malformed(&path, format!("GGUF version {version} is not supported (2 and 3 are)")));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Each metadata entry and tensor info takes well over 8 bytes: bound the counts by
        // the file size so a corrupted count cannot drive a huge allocation.
        r.check_count(n_kv, 8 + 4, "metadata count")?;
        r.check_count(n_tensors, 8 + 4 + 4 + 8, "tensor count")?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let ty = r.u32(&format!("type of metadata '{key}'"))?;
            let value = r.value(ty, &key, 0)?;
            // llama.cpp refuses duplicate keys too; silently keeping the last would hide a
            // corrupted or hand-edited file.
            if metadata.contains_key(&key) {
                return Err(FormatError::field(&path, &key, "metadata key appears twice"));
            }
            metadata.insert(key, value);
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 && (a as u64).is_power_of_two() => a as u64,
                _ => return Err(FormatError::field(&path, "general.alignment", format!("{v:?} is not a power of two"))),
            },
        };

        let mut infos = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("tensor #{i} name"))?;
            let n_dims = r.u32(&format!("tensor '{name}' n_dims"))?;
            if n_dims == 0 || n_dims > 4 {
                return Err(FormatError::malformed(&path, format!("tensor '{name}' has {n_dims} dimensions (1..=4 allowed)")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64(&format!("tensor '{name}' dims"))?);
            }
            let ty = r.u32(&format!("tensor '{name}' type"))?;
            let rel = r.u64(&format!("tensor '{name}' offset"))?;
            infos.push((name, dims, ty, rel));
        }
        let data_start = r.pos.div_ceil(alignment as usize) as u64 * alignment;
        let file_len = mmap.len() as u64;

        let mut tensors = Vec::with_capacity(infos.len());
        let mut index = BTreeMap::new();
        for (name, dims, ty, rel) in infos {
            let dtype = QuantType::from_ggml_id(ty).ok_or_else(|| FormatError::UnsupportedDtype {
                path: path.clone(),
                tensor: name.clone(),
                dtype: format!("ggml type id {ty}"),
            })?;
            let n_el = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let n_bytes = n_el
                .filter(|&n| dims[0] % dtype.block_size() as u64 == 0 && n < (1u64 << 48))
                .map(|n| n / dtype.block_size() as u64 * dtype.type_size() as u64)
                .ok_or_else(|| FormatError::malformed(&path, format!("tensor '{name}' has invalid dims {dims:?} for {dtype}")))?;
            if rel % alignment != 0 {
                return Err(FormatError::malformed(&path, format!("tensor '{name}' offset {rel} is not {alignment}-aligned")));
            }
            let offset = data_start
                .checked_add(rel)
                .ok_or_else(|| FormatError::malformed(&path, format!("tensor '{name}' offset {rel} overflows")))?;
            let end = offset.saturating_add(n_bytes);
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
            tensors.push(TensorInfo { name, dims, dtype, offset, n_bytes, shard: 0, interleaved: false });
        }

        Ok(Gguf { path, version, alignment, metadata, tensors, index, mmaps: vec![mmap] })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of a tensor (a slice of its part's memory map).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmaps[info.shard][info.offset as usize..(info.offset + info.n_bytes) as usize]
    }

    /// The shared memory map holding `info`'s bytes, for holders that outlive this struct.
    pub fn mmap_of(&self, info: &TensorInfo) -> &Arc<Mmap> {
        &self.mmaps[info.shard]
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    // The typed lookups live on `GgufMeta` (shared with .cmf files); these keep the
    // inherent spelling working without the trait in scope.

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        GgufMeta::architecture(self)
    }
    pub fn get_str(&self, key: &str) -> Result<&str> {
        GgufMeta::get_str(self, key)
    }
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        GgufMeta::get_u64(self, key)
    }
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        GgufMeta::get_f64(self, key)
    }
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        GgufMeta::opt_u64(self, key)
    }
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        GgufMeta::opt_f64(self, key)
    }
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        GgufMeta::opt_str(self, key)
    }
}

/// GGUF-style key/value metadata and tensor shapes, with typed lookups whose errors name the
/// file and key. A GGUF file provides it, and so does a .cmf converted from one (it carries the
/// same keys), so the architecture files and the GGUF tokenizer read both through one path.
pub trait GgufMeta {
    /// The file the values came from, for error messages.
    fn meta_path(&self) -> &Path;
    /// The raw value of a key.
    fn get(&self, key: &str) -> Option<&MetaValue>;
    /// A tensor's description, for values GGUF derives from tensors (the vocabulary size is
    /// the embedding's outer dim; llama3 rope scaling travels as `rope_freqs.weight`).
    fn tensor(&self, name: &str) -> Option<&TensorInfo>;
    /// The stored bytes of a tensor this source described.
    fn tensor_data(&self, info: &TensorInfo) -> &[u8];

    /// `general.architecture`.
    fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.get(key).ok_or_else(|| FormatError::missing(self.meta_path(), format!("metadata key '{key}'")))?;
        v.as_str().ok_or_else(|| FormatError::field(self.meta_path(), key, format!("expected string, found {}", v.type_name())))
    }

    fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.get(key).ok_or_else(|| FormatError::missing(self.meta_path(), format!("metadata key '{key}'")))?;
        v.as_i64()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| FormatError::field(self.meta_path(), key, format!("expected unsigned integer, found {v:?}")))
    }

    fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.get(key).ok_or_else(|| FormatError::missing(self.meta_path(), format!("metadata key '{key}'")))?;
        v.as_f64().ok_or_else(|| FormatError::field(self.meta_path(), key, format!("expected number, found {}", v.type_name())))
    }

    /// An optional typed value: `Ok(None)` when absent, an error when present with the wrong type.
    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        if self.get(key).is_none() { Ok(None) } else { self.get_u64(key).map(Some) }
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        if self.get(key).is_none() { Ok(None) } else { self.get_f64(key).map(Some) }
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        if self.get(key).is_none() { Ok(None) } else { self.get_str(key).map(Some) }
    }
}

impl GgufMeta for Gguf {
    fn meta_path(&self) -> &Path {
        &self.path
    }
    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }
    fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        Gguf::tensor(self, name)
    }
    fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        Gguf::tensor_data(self, info)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| FormatError::Truncated {
            path: self.path.to_path_buf(),
            what: what.to_string(),
            need: self.pos as u64 + n as u64,
            have: self.buf.len() as u64,
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.bytes(N, what)?.try_into().expect("slice of length N"))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn check_count(&self, n: u64, min_each: u64, what: &str) -> Result<()> {
        let left = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_each) > left {
            return Err(FormatError::malformed(self.path, format!("{what} {n} cannot fit in the {left} bytes left")));
        }
        Ok(())
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let b = self.bytes(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| FormatError::malformed(self.path, format!("{what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<MetaValue> {
        Ok(match ty {
            0 => MetaValue::U8(self.arr::<1>(key)?[0]),
            1 => MetaValue::I8(self.arr::<1>(key)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.arr(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.arr(key)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.arr(key)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.arr(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.arr(key)?)),
            7 => match self.arr::<1>(key)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(FormatError::field(self.path, key, format!("bool byte {b} is neither 0 nor 1"))),
            },
            8 => MetaValue::Str(self.string(key)?),
            9 => {
                if depth > 2 {
                    return Err(FormatError::field(self.path, key, "arrays nested too deeply"));
                }
                let ety = self.u32(key)?;
                // Checked here, not only per element: an empty array of an unknown type is
                // as corrupt as a full one.
                if ety > 12 {
                    return Err(FormatError::field(self.path, key, format!("unknown array element type {ety}")));
                }
                let n = self.u64(key)?;
                self.check_count(n, 1, &format!("array length of '{key}'"))?;
                // Capacity capped: a corrupted count that still fits the file (1 byte per
                // element) would otherwise reserve ~32 bytes of MetaValue per file byte.
                let mut v = Vec::with_capacity((n as usize).min(1 << 16));
                for _ in 0..n {
                    v.push(self.value(ety, key, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.arr(key)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.arr(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.arr(key)?)),
            t => return Err(FormatError::field(self.path, key, format!("unknown metadata value type {t}"))),
        })
    }
}
