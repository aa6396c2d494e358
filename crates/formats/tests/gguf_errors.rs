//! The GGUF reader on a tiny file written byte by byte here (layout from the GGUF spec in
//! ggml/docs/gguf.md: magic, version, tensor count, kv count, kvs, tensor infos, padding to
//! general.alignment, data): every metadata value type parses to the value written, tensor
//! offsets honour the alignment; then truncations at every cut point and corrupted counts,
//! types and dims all give an Err naming the field or tensor, never a panic.

use std::collections::HashMap;
use std::path::PathBuf;

use cortiq_formats::FormatError;
use cortiq_formats::gguf::{Gguf, MetaValue};
use cortiq_kernels::quant::QuantType;

/// Little-endian byte writer that remembers where named fields start.
#[derive(Default, Clone)]
struct W {
    b: Vec<u8>,
    at: HashMap<String, usize>,
}

impl W {
    fn mark(&mut self, name: &str) {
        self.at.insert(name.to_string(), self.b.len());
    }
    fn u8(&mut self, v: u8) {
        self.b.push(v)
    }
    fn u32(&mut self, v: u32) {
        self.b.extend_from_slice(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.b.extend_from_slice(&v.to_le_bytes())
    }
    fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.b.extend_from_slice(s.as_bytes());
    }
    /// key, type, then the caller writes the value.
    fn kv(&mut self, key: &str, ty: u32) {
        self.mark(&format!("key:{key}"));
        self.str(key);
        self.mark(&format!("type:{key}"));
        self.u32(ty);
        self.mark(&format!("value:{key}"));
    }
    fn pad_to(&mut self, align: usize) {
        while !self.b.len().is_multiple_of(align) {
            self.b.push(0);
        }
    }
}

const F32_DATA: [f32; 6] = [1.0, -2.5, 3.25, 0.0, 1e-3, -7.0];

/// The reference file: v3, 17 kvs (every value type, arrays of u32 / strings / arrays),
/// two tensors (f32 [3,2] at 0, q8_0 [32,2] at 32 after padding), default alignment 32
/// unless `align` is given (then written as general.alignment u32).
fn build(version: u32, align: Option<u32>) -> W {
    let mut w = W::default();
    w.b.extend_from_slice(b"GGUF");
    w.mark("version");
    w.u32(version);
    w.mark("n_tensors");
    w.u64(2);
    w.mark("n_kv");
    let n_kv = 17 + align.is_some() as u64;
    w.u64(n_kv);
    w.kv("general.architecture", 8);
    w.str("llama");
    w.kv("t.u8", 0);
    w.u8(200);
    w.kv("t.i8", 1);
    w.u8((-100i8) as u8);
    w.kv("t.u16", 2);
    w.b.extend_from_slice(&60000u16.to_le_bytes());
    w.kv("t.i16", 3);
    w.b.extend_from_slice(&(-30000i16).to_le_bytes());
    w.kv("t.u32", 4);
    w.u32(4_000_000_000);
    w.kv("t.i32", 5);
    w.b.extend_from_slice(&(-2_000_000_000i32).to_le_bytes());
    w.kv("t.f32", 6);
    w.b.extend_from_slice(&1.5f32.to_le_bytes());
    w.kv("t.bool", 7);
    w.mark("bool_byte");
    w.u8(1);
    w.kv("t.str", 8);
    w.mark("str_len");
    w.str("héllo");
    w.kv("t.u64", 10);
    w.u64(u64::MAX - 1);
    w.kv("t.i64", 11);
    w.b.extend_from_slice(&i64::MIN.to_le_bytes());
    w.kv("t.f64", 12);
    w.b.extend_from_slice(&(-0.1f64).to_le_bytes());
    w.kv("t.arr_u32", 9);
    w.mark("arr_u32_type");
    w.u32(4);
    w.mark("arr_u32_len");
    w.u64(3);
    for v in [7u32, 8, 9] {
        w.u32(v);
    }
    w.kv("t.arr_str", 9);
    w.u32(8);
    w.u64(2);
    w.str("a");
    w.str("");
    w.kv("t.arr_arr", 9);
    w.u32(9);
    w.u64(2);
    w.u32(1); // inner: i8 x2
    w.u64(2);
    w.u8(1);
    w.u8(0xff);
    w.u32(0); // inner: u8 x0
    w.u64(0);
    w.kv("t.empty", 9);
    w.mark("empty_arr_type");
    w.u32(6);
    w.u64(0);
    if let Some(a) = align {
        w.kv("general.alignment", 4);
        w.mark("alignment");
        w.u32(a);
    }
    // tensor infos
    w.mark("tensor:a");
    w.str("a");
    w.mark("ndims:a");
    w.u32(2);
    w.mark("dims:a");
    w.u64(3);
    w.u64(2);
    w.mark("ttype:a");
    w.u32(0);
    w.mark("offset:a");
    w.u64(0);
    w.mark("tensor:b");
    w.str("b");
    w.mark("ndims:b");
    w.u32(2);
    w.mark("dims:b");
    w.u64(32);
    w.u64(2);
    w.mark("ttype:b");
    w.u32(8);
    w.mark("offset:b");
    let align = align.unwrap_or(32) as usize;
    let b_rel = 24usize.div_ceil(align) * align;
    w.u64(b_rel as u64);
    w.pad_to(align);
    w.mark("data");
    for v in F32_DATA {
        w.b.extend_from_slice(&v.to_le_bytes());
    }
    w.pad_to(align);
    assert_eq!(w.b.len() - w.at["data"], b_rel);
    // Two Q8_0 blocks (34 bytes each): the file ends exactly at b's last byte.
    w.b.extend((0..68).map(|i| i as u8));
    w
}

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("cortiq-gguf-{}-{tag}.gguf", std::process::id()))
}

fn open(tag: &str, bytes: &[u8]) -> Result<Gguf, FormatError> {
    let p = temp_path(tag);
    std::fs::write(&p, bytes).unwrap();
    let r = Gguf::open(&p);
    let _ = std::fs::remove_file(&p);
    r
}

fn err(tag: &str, bytes: &[u8]) -> String {
    match open(tag, bytes) {
        Ok(_) => panic!("{tag}: expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tiny_gguf_parses_every_value_type() {
    for (version, align) in [(3, None), (2, None), (3, Some(64u32))] {
        let w = build(version, align);
        let g = open(&format!("ok{version}{align:?}"), &w.b).unwrap_or_else(|e| panic!("v{version}: {e}"));
        assert_eq!(g.version, version);
        assert_eq!(g.alignment, align.unwrap_or(32) as u64);
        assert_eq!(g.architecture().unwrap(), "llama");
        let m = |k: &str| g.get(k).unwrap_or_else(|| panic!("missing {k}")).clone();
        assert_eq!(m("t.u8"), MetaValue::U8(200));
        assert_eq!(m("t.i8"), MetaValue::I8(-100));
        assert_eq!(m("t.u16"), MetaValue::U16(60000));
        assert_eq!(m("t.i16"), MetaValue::I16(-30000));
        assert_eq!(m("t.u32"), MetaValue::U32(4_000_000_000));
        assert_eq!(m("t.i32"), MetaValue::I32(-2_000_000_000));
        assert_eq!(m("t.f32"), MetaValue::F32(1.5));
        assert_eq!(m("t.bool"), MetaValue::Bool(true));
        assert_eq!(m("t.str"), MetaValue::Str("héllo".into()));
        assert_eq!(m("t.u64"), MetaValue::U64(u64::MAX - 1));
        assert_eq!(m("t.i64"), MetaValue::I64(i64::MIN));
        assert_eq!(m("t.f64"), MetaValue::F64(-0.1));
        assert_eq!(m("t.arr_u32"), MetaValue::Array(vec![MetaValue::U32(7), MetaValue::U32(8), MetaValue::U32(9)]));
        assert_eq!(m("t.arr_str"), MetaValue::Array(vec![MetaValue::Str("a".into()), MetaValue::Str(String::new())]));
        assert_eq!(
            m("t.arr_arr"),
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I8(1), MetaValue::I8(-1)]), MetaValue::Array(vec![])])
        );
        assert_eq!(m("t.empty"), MetaValue::Array(vec![]));
        assert_eq!(g.metadata.len(), 17 + align.is_some() as usize);
        // Typed getters.
        assert_eq!(g.get_u64("t.u32").unwrap(), 4_000_000_000);
        assert_eq!(g.get_f64("t.f32").unwrap(), 1.5);
        assert!(g.get_u64("t.i64").is_err());
        assert_eq!(g.opt_u64("absent").unwrap(), None);
        let e = g.get_str("t.u8").unwrap_err().to_string();
        assert!(e.contains("t.u8") && e.contains("expected string"), "{e}");
        let e = g.get_u64("absent").unwrap_err().to_string();
        assert!(e.contains("'absent'"), "{e}");

        // Tensors: dims in GGUF order, shape reversed; offsets aligned after the infos.
        assert_eq!(g.tensors.len(), 2);
        let a = g.tensor("a").unwrap();
        assert_eq!((a.dims.clone(), a.shape(), a.dtype, a.n_bytes), (vec![3, 2], vec![2, 3], QuantType::F32, 24));
        let data_start = w.at["data"] as u64;
        assert_eq!(data_start % g.alignment, 0);
        assert_eq!(a.offset, data_start);
        let got: Vec<f32> = g.tensor_data(a).chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, F32_DATA);
        let b = g.tensor("b").unwrap();
        assert_eq!((b.dtype, b.n_bytes, b.n_elements()), (QuantType::Q8_0, 68, 64));
        assert_eq!(b.offset, data_start + g.alignment.max(32));
        assert_eq!(g.tensor_data(b), (0..68).map(|i| i as u8).collect::<Vec<_>>());
        assert!(g.tensor("c").is_none());
    }
}

#[test]
fn every_truncation_is_an_error() {
    let w = build(3, None);
    let mut kinds = HashMap::new();
    for cut in 0..w.b.len() {
        match open("cut", &w.b[..cut]) {
            Ok(_) => panic!("cut at {cut} of {} opened", w.b.len()),
            Err(e) => {
                let s = e.to_string();
                assert!(s.contains("cortiq-gguf-"), "cut {cut}: no file in {s}");
                let kind = match e {
                    FormatError::Truncated { .. } => "truncated",
                    FormatError::Malformed { .. } => "malformed",
                    FormatError::BadField { .. } => "field",
                    _ => "other",
                };
                *kinds.entry(kind).or_insert(0) += 1;
                // Cuts inside the header name what was being read.
                if cut >= 4 && cut < w.at["data"] {
                    assert!(!s.ends_with(": "), "cut {cut}: {s}");
                }
                if cut >= w.at["data"] {
                    assert!(s.contains("tensor '"), "cut {cut} in the data: {s}");
                }
            }
        }
    }
    println!("{} cut points, all refused: {kinds:?}", w.b.len());
    assert_eq!(kinds.get("other"), None);
}

fn patch(w: &W, field: &str, at_extra: usize, bytes: &[u8]) -> Vec<u8> {
    let mut b = w.b.clone();
    let p = w.at[field] + at_extra;
    b[p..p + bytes.len()].copy_from_slice(bytes);
    b
}

#[test]
fn corrupted_fields_are_named() {
    let w = build(3, None);
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "magic",
            {
                let mut b = w.b.clone();
                b[0] = b'X';
                b
            },
            &["not a GGUF file"],
        ),
        ("version1", patch(&w, "version", 0, &1u32.to_le_bytes()), &["version 1"]),
        ("version4", patch(&w, "version", 0, &4u32.to_le_bytes()), &["version 4"]),
        ("n_tensors", patch(&w, "n_tensors", 0, &u64::MAX.to_le_bytes()), &["tensor count"]),
        ("n_kv", patch(&w, "n_kv", 0, &(1u64 << 40).to_le_bytes()), &["metadata count"]),
        ("n_kv+1", patch(&w, "n_kv", 0, &18u64.to_le_bytes()), &[]),
        ("n_tensors+1", patch(&w, "n_tensors", 0, &3u64.to_le_bytes()), &[]),
        ("kv type", patch(&w, "type:t.f32", 0, &13u32.to_le_bytes()), &["t.f32", "unknown metadata value type 13"]),
        ("bool", patch(&w, "bool_byte", 0, &[2]), &["t.bool", "neither 0 nor 1"]),
        ("str len", patch(&w, "str_len", 0, &(u64::MAX / 2).to_le_bytes()), &["t.str"]),
        ("utf8", patch(&w, "str_len", 8, &[0xff]), &["t.str", "UTF-8"]),
        ("key len", patch(&w, "key:t.u16", 0, &u64::MAX.to_le_bytes()), &["metadata key #3"]),
        ("arr len", patch(&w, "arr_u32_len", 0, &(u64::MAX / 4).to_le_bytes()), &["array length of 't.arr_u32'"]),
        ("arr type", patch(&w, "arr_u32_type", 0, &99u32.to_le_bytes()), &["t.arr_u32", "type 99"]),
        ("empty arr type", patch(&w, "empty_arr_type", 0, &99u32.to_le_bytes()), &["t.empty", "type 99"]),
        ("ndims 0", patch(&w, "ndims:a", 0, &0u32.to_le_bytes()), &["tensor 'a'", "0 dimensions"]),
        ("ndims 5", patch(&w, "ndims:b", 0, &5u32.to_le_bytes()), &["tensor 'b'"]),
        ("ndims huge", patch(&w, "ndims:a", 0, &u32::MAX.to_le_bytes()), &["tensor 'a'"]),
        ("dims overflow", patch(&w, "dims:a", 0, &(1u64 << 40).to_le_bytes()), &["tensor 'a'", "dims"]),
        ("dims block", patch(&w, "dims:b", 0, &33u64.to_le_bytes()), &["tensor 'b'", "q8_0"]),
        ("dims past file", patch(&w, "dims:b", 8, &3u64.to_le_bytes()), &["tensor 'b' data"]),
        ("ttype", patch(&w, "ttype:a", 0, &999u32.to_le_bytes()), &["tensor 'a'", "ggml type id 999"]),
        ("offset align", patch(&w, "offset:b", 0, &36u64.to_le_bytes()), &["tensor 'b'", "aligned"]),
        ("offset past", patch(&w, "offset:b", 0, &(1u64 << 20).to_le_bytes()), &["tensor 'b' data"]),
        ("offset overflow", patch(&w, "offset:b", 0, &(u64::MAX - 31).to_le_bytes()), &["tensor 'b'"]),
        ("dup tensor", patch(&w, "tensor:b", 8, b"a"), &["tensor 'a'", "twice"]),
        ("dup key", patch(&w, "key:t.i8", 8, b"t.u8"), &["t.u8", "twice"]),
    ];
    for (what, bytes, want) in &cases {
        let e = err(what, bytes);
        for s in *want {
            assert!(e.contains(s), "{what}: '{s}' not in: {e}");
        }
    }
    // general.alignment must be a power of two.
    let wa = build(3, Some(64));
    let e = err("align", &patch(&wa, "alignment", 0, &48u32.to_le_bytes()));
    assert!(e.contains("general.alignment"), "{e}");
    let e = err("align0", &patch(&wa, "alignment", 0, &0u32.to_le_bytes()));
    assert!(e.contains("general.alignment"), "{e}");
    // Nesting deeper than the reader allows.
    let mut d = W::default();
    d.b.extend_from_slice(b"GGUF");
    d.u32(3);
    d.u64(0);
    d.u64(1);
    d.kv("deep", 9);
    for _ in 0..5 {
        d.u32(9);
        d.u64(1);
    }
    d.u32(0);
    d.u64(0);
    let e = err("deep", &d.b);
    assert!(e.contains("deep") && e.contains("nested"), "{e}");
}

#[test]
fn byte_flips_never_panic() {
    // Every header byte replaced by 0xff and by 0x00 in turn: Ok or Err, never a panic or
    // a runaway allocation.
    let w = build(3, None);
    let end = w.at["data"];
    let (mut ok, mut errs) = (0, 0);
    for i in 0..end {
        for v in [0x00u8, 0xff, 0x7f] {
            let mut b = w.b.clone();
            b[i] = v;
            match open("flip", &b) {
                Ok(_) => ok += 1,
                Err(_) => errs += 1,
            }
        }
    }
    println!("{} flipped headers: {ok} still valid, {errs} refused", ok + errs);
    assert!(errs > 0);
}

/// `(type name, value)` of gguf-py's reader as a MetaValue.
fn meta_from_json(ty: &str, v: &serde_json::Value) -> MetaValue {
    match ty {
        "uint8" => MetaValue::U8(v.as_u64().unwrap() as u8),
        "int8" => MetaValue::I8(v.as_i64().unwrap() as i8),
        "uint16" => MetaValue::U16(v.as_u64().unwrap() as u16),
        "int16" => MetaValue::I16(v.as_i64().unwrap() as i16),
        "uint32" => MetaValue::U32(v.as_u64().unwrap() as u32),
        "int32" => MetaValue::I32(v.as_i64().unwrap() as i32),
        "uint64" => MetaValue::U64(v.as_u64().unwrap()),
        "int64" => MetaValue::I64(v.as_i64().unwrap()),
        "float32" => MetaValue::F32(v.as_f64().unwrap() as f32),
        "float64" => MetaValue::F64(v.as_f64().unwrap()),
        "bool" => MetaValue::Bool(v.as_bool().unwrap()),
        "string" => MetaValue::Str(v.as_str().unwrap().to_string()),
        t => panic!("type {t}"),
    }
}

#[test]
fn gguf_py_written_file_matches_gguf_py_reader() {
    // Written by llama.cpp's gguf-py GGUFWriter, described by its GGUFReader
    // (tools/gguf_tiny_reference.py, gguf==0.19.0).
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("gguf_tiny.json")).unwrap()).unwrap();
    let g = Gguf::open(dir.join("gguf_tiny.gguf")).unwrap();
    assert_eq!(g.version as u64, want["version"].as_u64().unwrap());
    assert_eq!(g.alignment, want["alignment"].as_u64().unwrap());
    let kv = want["kv"].as_object().unwrap();
    assert_eq!(g.metadata.len(), kv.len());
    for (k, e) in kv {
        let ty = e["type"].as_str().unwrap();
        let expect = if ty == "array" {
            let sub = e["sub_type"].as_str().unwrap();
            MetaValue::Array(e["value"].as_array().unwrap().iter().map(|x| meta_from_json(sub, x)).collect())
        } else {
            meta_from_json(ty, &e["value"])
        };
        assert_eq!(g.get(k), Some(&expect), "key {k}");
    }
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(g.tensors.len(), tensors.len());
    for (ours, t) in g.tensors.iter().zip(tensors) {
        let name = t["name"].as_str().unwrap();
        assert_eq!(ours.name, name);
        let dims: Vec<u64> = t["dims"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(ours.dims, dims, "{name}");
        assert_eq!(ours.dtype.ggml_id() as u64, t["ggml_type"].as_u64().unwrap(), "{name}");
        assert_eq!(ours.offset, t["offset"].as_u64().unwrap(), "{name} offset");
        assert_eq!(ours.n_bytes, t["n_bytes"].as_u64().unwrap(), "{name} n_bytes");
        if let Some(vals) = t["values"].as_array() {
            let data = g.tensor_data(ours);
            let got: Vec<f64> = match ours.dtype {
                QuantType::F32 => data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
                QuantType::F16 => data.chunks(2).map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64()).collect(),
                d => panic!("{name}: {d:?}"),
            };
            let want: Vec<f64> = vals.iter().map(|x| x.as_f64().unwrap()).collect();
            assert_eq!(got, want, "{name} values");
        }
    }
    // The q8_0 tensor holds bytes 0..68 as written.
    let q = g.tensor("q").unwrap();
    assert_eq!(g.tensor_data(q), (0..68).map(|i| i as u8).collect::<Vec<_>>());

    // Every truncation before the end of the last tensor's data is refused; gguf-py pads the
    // file after it to the alignment, and cutting that padding off leaves a valid file.
    let bytes = std::fs::read(dir.join("gguf_tiny.gguf")).unwrap();
    assert_eq!(bytes.len() as u64, want["file_size"].as_u64().unwrap());
    let data_end = g.tensors.iter().map(|t| t.offset + t.n_bytes).max().unwrap() as usize;
    assert!(data_end < bytes.len());
    for cut in 0..bytes.len() {
        assert_eq!(open("pycut", &bytes[..cut]).is_ok(), cut >= data_end, "cut at {cut} of {}", bytes.len());
    }
}
