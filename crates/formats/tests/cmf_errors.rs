//! The .cmf reader and writer on synthetic files: a round trip (bytes, offsets, alignment,
//! typed metadata), and every way a file can be damaged giving a one-line error that names the
//! file and, where one is at fault, the tensor or field; never a panic. The writer refuses an
//! existing output without `force` and leaves no temporary file behind when it fails or is
//! dropped unfinished.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cortiq_formats::cmf::{self, Cmf, CmfHeader, CmfWriter, Metadata, PlannedTensor, SourceInfo, TypedKv};
use cortiq_formats::gguf::{GgufMeta, MetaValue};
use cortiq_kernels::quant::QuantType;
use serde_json::Value;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-cmf-fmt-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn header() -> CmfHeader {
    let mut kv = BTreeMap::new();
    kv.insert("general.architecture".to_string(), MetaValue::Str("llama".into()));
    kv.insert("llama.block_count".to_string(), MetaValue::U32(2));
    kv.insert("tokenizer.ggml.scores".to_string(), MetaValue::Array(vec![MetaValue::F32(-0.5), MetaValue::F32(1e-30)]));
    CmfHeader {
        format_version: cmf::FORMAT_VERSION,
        architecture: "llama".into(),
        source: SourceInfo { kind: "gguf".into(), file: "x.gguf".into() },
        quant: "keep".into(),
        norm_offset_folded: 0.0,
        metadata: Metadata::Gguf { kv: TypedKv(kv) },
        o1: None,
        tensors: Vec::new(),
    }
}

/// Three tensors: f32 [3, 5] (60 bytes: the next offset is padded), f32 [7], q8_0 [2, 32].
fn plan() -> Vec<PlannedTensor> {
    vec![
        PlannedTensor::new("a.weight", QuantType::F32, vec![3, 5]),
        PlannedTensor::new("b.weight", QuantType::F32, vec![7]),
        PlannedTensor::new("c.weight", QuantType::Q8_0, vec![2, 32]),
    ]
}

fn data(i: usize, n: u64) -> Vec<u8> {
    (0..n).map(|j| (i as u64 * 31 + j * 7) as u8).collect()
}

fn write_good(path: &Path) -> Vec<Vec<u8>> {
    let mut w = CmfWriter::create(path, header(), &plan(), false).unwrap();
    let sizes = [60u64, 28, 68];
    let mut all = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let d = data(i, n);
        // In two pieces: the writer appends.
        w.write_data(&d[..n as usize / 2]).unwrap();
        w.write_data(&d[n as usize / 2..]).unwrap();
        w.end_tensor().unwrap();
        all.push(d);
    }
    w.finish().unwrap();
    all
}

#[test]
fn round_trip() {
    let dir = scratch("rt");
    let p = dir.join("m.cmf");
    let want = write_good(&p);
    let c = Cmf::open(&p).unwrap();
    assert_eq!(c.header.architecture, "llama");
    let data_start = c.tensors[0].offset;
    assert_eq!(data_start % cmf::ALIGN, 0, "data section not aligned");
    for (i, t) in c.tensors.iter().enumerate() {
        assert_eq!(t.offset % cmf::ALIGN, 0, "{} at {}", t.name, t.offset);
        assert_eq!(c.tensor_data(t), &want[i][..], "{} bytes", t.name);
        // The data pointer itself is aligned (the map is page-aligned).
        assert_eq!(c.tensor_data(t).as_ptr() as usize % cmf::ALIGN as usize, 0);
    }
    assert_eq!(c.tensor("a.weight").unwrap().dims, vec![5, 3], "dims are GGUF order");
    assert_eq!(c.tensor("c.weight").unwrap().dtype, QuantType::Q8_0);
    assert_eq!(GgufMeta::get_u64(&c, "llama.block_count").unwrap(), 2);
    assert_eq!(c.get("tokenizer.ggml.scores"), header_kv("tokenizer.ggml.scores").as_ref());
    let e = GgufMeta::get_str(&c, "absent.key").unwrap_err().to_string();
    assert!(e.contains("absent.key") && e.contains("m.cmf"), "{e}");
    assert!(cmf::is_cmf(&p));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn header_kv(k: &str) -> Option<MetaValue> {
    match header().metadata {
        Metadata::Gguf { kv } => kv.0.get(k).cloned(),
        Metadata::Hf { .. } => None,
    }
}

/// The file with its JSON header edited by `f` (the data section carried over unchanged,
/// re-padded after the new JSON).
fn rewrite(bytes: &[u8], f: impl Fn(&mut Value)) -> Vec<u8> {
    let json_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap()) as usize;
    let data_start = (24 + json_len).div_ceil(64) * 64;
    let mut v: Value = serde_json::from_slice(&bytes[24..24 + json_len]).unwrap();
    f(&mut v);
    let json = serde_json::to_vec(&v).unwrap();
    let mut out = bytes[..16].to_vec();
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize((24 + json.len()).div_ceil(64) * 64, 0);
    out.extend_from_slice(&bytes[data_start..]);
    out
}

/// A tensor planned interleaved: its size is the interleaved groups' (`ileave_bytes`, rows
/// padded to 16), the file is stamped version 2 and says `"layout": "il16"`, and the reader
/// marks the tensor interleaved; a file without one stays version 1 (`round_trip`). An unknown
/// layout in a version-2 file is an error naming it.
#[test]
fn interleaved_layout_round_trip() {
    let dir = scratch("il");
    let p = dir.join("il.cmf");
    let mut plan = plan();
    plan.push(PlannedTensor { interleaved: true, ..PlannedTensor::new("d_exps.weight", QuantType::Q8_0, vec![40, 64]) });
    let il_bytes = cortiq_kernels::quant::ileave_bytes(QuantType::Q8_0, 40, 64).unwrap() as u64;
    assert!(il_bytes > 40 * 68, "40 rows pad to 48: the size check below could not fail");
    let mut w = CmfWriter::create(&p, header(), &plan, false).unwrap();
    for (i, n) in [60u64, 28, 68, il_bytes].into_iter().enumerate() {
        w.write_data(&data(i, n)).unwrap();
        w.end_tensor().unwrap();
    }
    w.finish().unwrap();
    let b = std::fs::read(&p).unwrap();
    assert_eq!(b[8], 2, "a file with an interleaved tensor is version 2");
    let c = Cmf::open(&p).unwrap();
    let d = c.tensor("d_exps.weight").unwrap();
    assert!(d.interleaved && !c.tensor("c.weight").unwrap().interleaved);
    assert_eq!((d.n_bytes, c.tensor_data(d)), (il_bytes, &data(3, il_bytes)[..]));
    let bad = dir.join("bad.cmf");
    let t = |k: &'static str, v: Value| move |j: &mut Value| j["tensors"][3][k] = v.clone();
    for (tag, bytes, want) in [
        ("unknown", rewrite(&b, t("layout", Value::from("tiles"))), "layout 'tiles'"),
        ("row-major-size", rewrite(&b, |j| drop(j["tensors"][3].as_object_mut().unwrap().remove("layout"))), "says"),
    ] {
        std::fs::write(&bad, bytes).unwrap();
        let e = Cmf::open(&bad).err().unwrap_or_else(|| panic!("{tag}: opened")).to_string();
        assert!(e.contains("d_exps.weight") && e.contains(want) && !e.contains('\n'), "{tag}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_files_are_one_line_errors() {
    let dir = scratch("damaged");
    let good = dir.join("good.cmf");
    write_good(&good);
    let b = std::fs::read(&good).unwrap();
    let json_len = u64::from_le_bytes(b[16..24].try_into().unwrap()) as usize;
    let t = |i: usize, k: &'static str, v: Value| move |j: &mut Value| j["tensors"][i][k] = v.clone();
    let mut version3 = b.clone();
    version3[8] = 3;
    let mut long_json = b.clone();
    long_json[16..24].copy_from_slice(&(b.len() as u64).to_le_bytes());
    let mut garbage = b.clone();
    garbage[24..30].copy_from_slice(b"}}}}}}");
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("empty", Vec::new(), vec!["truncated", "header"]),
        ("short", b[..10].to_vec(), vec!["truncated", "header"]),
        ("json-cut", b[..24 + json_len / 2].to_vec(), vec!["truncated", "JSON header"]),
        ("json-len", long_json, vec!["truncated", "JSON header"]),
        // The last tensor (68 bytes) is followed by 60 bytes of padding: cut into its data.
        ("data-cut", b[..b.len() - 70].to_vec(), vec!["truncated", "c.weight"]),
        ("magic", [b"GGUF\0\0\0\0".as_slice(), &b[8..]].concat(), vec!["not a .cmf"]),
        ("version", version3, vec!["version 3"]),
        // a layout needs a version-2 file, and only "il16" is one
        ("layout-v1", rewrite(&b, t(2, "layout", Value::from("il16"))), vec!["c.weight", "layout 'il16'"]),
        ("garbage-json", garbage, vec!["JSON header"]),
        ("offset-past-end", rewrite(&b, t(1, "offset", Value::from(1u64 << 20))), vec!["truncated", "b.weight"]),
        ("offset-huge", rewrite(&b, t(1, "offset", Value::from(u64::MAX - 63))), vec!["b.weight"]),
        ("misaligned", rewrite(&b, t(1, "offset", Value::from(8))), vec!["b.weight", "64-aligned"]),
        ("dtype", rewrite(&b, t(0, "dtype", Value::from("q9_X"))), vec!["a.weight", "q9_X"]),
        ("bytes", rewrite(&b, t(1, "bytes", Value::from(29))), vec!["b.weight", "29"]),
        ("blocks", rewrite(&b, t(2, "shape", serde_json::json!([2, 33]))), vec!["c.weight", "q8_0"]),
        ("no-dims", rewrite(&b, t(1, "shape", serde_json::json!([]))), vec!["b.weight"]),
        ("dup", rewrite(&b, t(1, "name", Value::from("a.weight"))), vec!["a.weight", "twice"]),
        ("overlap", rewrite(&b, t(2, "offset", Value::from(0))), vec!["overlaps"]),
        ("format-version", rewrite(&b, |j| j["format_version"] = Value::from(7)), vec!["format_version"]),
        (
            "typed-kv",
            rewrite(&b, |j| j["metadata"]["gguf"]["kv"]["llama.block_count"] = serde_json::json!({"t": "u8", "v": 300})),
            vec!["JSON header", "llama.block_count", "300 does not fit u8"],
        ),
        ("missing-field", rewrite(&b, |j| drop(j.as_object_mut().unwrap().remove("tensors"))), vec!["tensors"]),
    ];
    for (tag, bytes, want) in cases {
        let p = dir.join(format!("{tag}.cmf"));
        std::fs::write(&p, &bytes).unwrap();
        let e = match Cmf::open(&p) {
            Ok(_) => panic!("{tag}: opened"),
            Err(e) => e.to_string(),
        };
        println!("{tag}: {e}");
        assert!(!e.contains('\n'), "{tag}: multi-line error: {e}");
        assert!(e.contains(&p.display().to_string()), "{tag}: error does not name the file: {e}");
        for w in want {
            assert!(e.contains(w), "{tag}: error lacks '{w}': {e}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn writer_refuses_overwrite_and_leaves_no_temp_file() {
    let dir = scratch("writer");
    let out = dir.join("m.cmf");
    write_good(&out);
    let before = std::fs::read(&out).unwrap();

    let e = CmfWriter::create(&out, header(), &plan(), false).err().expect("must refuse").to_string();
    assert!(e.contains("--force") && e.contains("m.cmf"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), before);

    // Dropped half-way (an error upstream): the temp file goes, the old output stays.
    let mut w = CmfWriter::create(&out, header(), &plan(), true).unwrap();
    let tmp = w.temp_path().to_path_buf();
    assert!(tmp.exists() && tmp.parent() == out.parent(), "temp file {} not beside the output", tmp.display());
    w.write_data(&data(0, 60)).unwrap();
    w.end_tensor().unwrap();
    drop(w);
    assert!(!tmp.exists(), "temp file left behind");
    assert_eq!(std::fs::read(&out).unwrap(), before, "unfinished write touched the output");

    // Too many bytes, ending a short tensor, finishing early: errors, and nothing left behind.
    let mut w = CmfWriter::create(&out, header(), &plan(), true).unwrap();
    let e = w.write_data(&[0u8; 61]).unwrap_err().to_string();
    assert!(e.contains("a.weight"), "{e}");
    w.write_data(&[0u8; 10]).unwrap();
    let e = w.end_tensor().unwrap_err().to_string();
    assert!(e.contains("a.weight") && e.contains("10"), "{e}");
    drop(w);
    let mut w = CmfWriter::create(&out, header(), &plan(), true).unwrap();
    w.write_data(&data(0, 60)).unwrap();
    w.end_tensor().unwrap();
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("b.weight") && e.contains("never written"), "{e}");
    assert_eq!(entries(&dir), ["m.cmf"]);
    assert_eq!(std::fs::read(&out).unwrap(), before);

    // With force, a complete write replaces the file.
    let mut w = CmfWriter::create(&out, header(), &plan()[..1], true).unwrap();
    w.write_data(&data(5, 60)).unwrap();
    w.end_tensor().unwrap();
    w.finish().unwrap();
    let c = Cmf::open(&out).unwrap();
    assert_eq!(c.tensors.len(), 1);
    assert_eq!(c.tensor_data(&c.tensors[0]), &data(5, 60)[..]);
    assert_eq!(entries(&dir), ["m.cmf"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writer_rejects_bad_plans() {
    let dir = scratch("plan");
    let out = dir.join("m.cmf");
    let mut p = plan();
    p[2].shape = vec![2, 33];
    let e = CmfWriter::create(&out, header(), &p, false).err().unwrap().to_string();
    assert!(e.contains("c.weight"), "{e}");
    let mut p = plan();
    p[1].name = "a.weight".into();
    let e = CmfWriter::create(&out, header(), &p, false).err().unwrap().to_string();
    assert!(e.contains("a.weight") && e.contains("twice"), "{e}");
    assert!(entries(&dir).is_empty(), "files left: {:?}", entries(&dir));
    std::fs::remove_dir_all(&dir).unwrap();
}
