//! safetensors loading: single and sharded folders written with the `safetensors` crate
//! (the format's reference implementation), bytes checked against that crate's own reader;
//! then truncated and corrupted files, which must give a FormatError naming the file (and
//! the tensor where there is one), never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cortiq_formats::FormatError;
use cortiq_formats::safetensors::HfWeights;
use cortiq_kernels::quant::QuantType;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cortiq-st-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Deterministic bytes (an LCG), so every tensor's content differs.
fn bytes(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            (x >> 24) as u8
        })
        .collect()
}

struct Spec {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn spec(name: &'static str, dtype: Dtype, shape: &[usize], seed: u32) -> Spec {
    let n: usize = shape.iter().product::<usize>() * dtype.bitsize() / 8;
    Spec { name, dtype, shape: shape.to_vec(), data: bytes(n, seed) }
}

fn serialize(specs: &[Spec]) -> Vec<u8> {
    let views: Vec<(&str, TensorView)> =
        specs.iter().map(|s| (s.name, TensorView::new(s.dtype, s.shape.clone(), &s.data).unwrap())).collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize(views, Some(meta)).unwrap()
}

fn model_specs() -> Vec<Spec> {
    vec![
        spec("model.embed_tokens.weight", Dtype::F32, &[3, 4], 1),
        spec("model.norm.weight", Dtype::BF16, &[4], 2),
        spec("model.layers.0.self_attn.q_proj.weight", Dtype::F16, &[4, 4], 3),
        spec("model.layers.0.self_attn.q_proj.bias", Dtype::F16, &[4], 4),
        spec("lm_head.weight", Dtype::BF16, &[3, 4], 5),
        // Int / fp8 buffers an HF folder may carry: listed, refused only when requested.
        spec("model.rotary.position_ids", Dtype::I64, &[1, 5], 6),
        spec("model.layers.0.mlp.up_proj.weight_scale", Dtype::F8_E4M3, &[2], 7),
        spec("scalar", Dtype::F32, &[], 8),
    ]
}

fn qt(d: Dtype) -> Option<QuantType> {
    match d {
        Dtype::F32 => Some(QuantType::F32),
        Dtype::F16 => Some(QuantType::F16),
        Dtype::BF16 => Some(QuantType::BF16),
        _ => None,
    }
}

/// Every tensor of `specs` is reachable through `w` with the right dtype, shape and bytes,
/// and the bytes equal what the reference reader returns from `file_bytes`.
fn check_all(w: &HfWeights, specs: &[Spec], reference: &[(Vec<u8>, Vec<&'static str>)]) {
    for s in specs {
        match qt(s.dtype) {
            Some(q) => {
                let t = w.tensor(s.name).unwrap_or_else(|e| panic!("{}: {e}", s.name));
                assert_eq!(t.name, s.name);
                assert_eq!(t.dtype, q, "{}", s.name);
                assert_eq!(t.shape, s.shape, "{}", s.name);
                if let Some(i) = t.data.iter().zip(&s.data).position(|(a, b)| a != b) {
                    panic!("{}: first differing byte at {i} of {}", s.name, s.data.len());
                }
                assert_eq!(t.data.len(), s.data.len(), "{}", s.name);
            }
            None => match w.get(s.name) {
                Err(FormatError::UnsupportedDtype { tensor, dtype, .. }) => {
                    assert_eq!(tensor, s.name);
                    assert_eq!(dtype, s.dtype.to_string());
                    let e = w.tensor(s.name).unwrap_err().to_string();
                    assert!(e.contains(s.name) && e.contains("unsupported dtype"), "{e}");
                }
                other => panic!("{}: expected UnsupportedDtype, got {other:?}", s.name),
            },
        }
        let m = w.meta(s.name).unwrap();
        assert_eq!(m.dtype, s.dtype.to_string());
        assert_eq!(m.shape, s.shape);
    }
    // Bytes identical to the safetensors crate's own reader.
    let mut n = 0;
    for (file, names) in reference {
        let st = SafeTensors::deserialize(file).unwrap();
        for name in names {
            let want = st.tensor(name).unwrap();
            let (map, range) = w.locate(name).unwrap();
            assert_eq!(&map[range], want.data(), "{name} vs reference reader");
            n += 1;
        }
    }
    assert_eq!(n, specs.len());
}

#[test]
fn single_file_folder() {
    let d = temp_dir("single");
    let specs = model_specs();
    let file = serialize(&specs);
    std::fs::write(d.join("model.safetensors"), &file).unwrap();
    let w = HfWeights::open_dir(&d).unwrap();
    assert_eq!(w.len(), specs.len());
    let mut want: Vec<&str> = specs.iter().map(|s| s.name).collect();
    want.sort();
    assert_eq!(w.names().collect::<Vec<_>>(), want);
    check_all(&w, &specs, &[(file.clone(), specs.iter().map(|s| s.name).collect())]);
    assert_eq!(w.files(), [d.join("model.safetensors")]);
    assert_eq!(w.mmaps().len(), 1);
    assert_eq!(w.file_metadata(0).unwrap().get("format").map(String::as_str), Some("pt"));
    assert!(w.get("nope").unwrap().is_none());
    assert!(!w.contains("nope") && w.contains("scalar"));
    let e = w.tensor("nope").unwrap_err();
    assert!(matches!(e, FormatError::Missing { .. }) && e.to_string().contains("'nope'"), "{e}");

    // Data stays reachable through a cloned map after the struct is gone.
    let (map, range) = w.locate("model.norm.weight").unwrap();
    drop(w);
    assert_eq!(&map[range], &specs[1].data[..]);

    // open_file on the same path agrees.
    let w2 = HfWeights::open_file(d.join("model.safetensors")).unwrap();
    assert_eq!(w2.len(), specs.len());
    let _ = std::fs::remove_dir_all(&d);
}

/// Each file's bytes with the names it holds, for the reference reader.
type Reference = Vec<(Vec<u8>, Vec<&'static str>)>;

fn write_sharded(d: &Path) -> (Vec<Spec>, Reference) {
    let specs = model_specs();
    let (a, b): (Vec<&Spec>, Vec<&Spec>) = specs.iter().partition(|s| s.name.starts_with("model.layers"));
    let fa: Vec<Spec> =
        a.iter().map(|s| Spec { name: s.name, dtype: s.dtype, shape: s.shape.clone(), data: s.data.clone() }).collect();
    let fb: Vec<Spec> =
        b.iter().map(|s| Spec { name: s.name, dtype: s.dtype, shape: s.shape.clone(), data: s.data.clone() }).collect();
    let (ba, bb) = (serialize(&fa), serialize(&fb));
    std::fs::write(d.join("model-00001-of-00002.safetensors"), &ba).unwrap();
    std::fs::write(d.join("model-00002-of-00002.safetensors"), &bb).unwrap();
    let mut map = serde_json::Map::new();
    for s in &fa {
        map.insert(s.name.into(), "model-00001-of-00002.safetensors".into());
    }
    for s in &fb {
        map.insert(s.name.into(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 1234}, "weight_map": map});
    std::fs::write(d.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index).unwrap()).unwrap();
    let reference = vec![(ba, fa.iter().map(|s| s.name).collect()), (bb, fb.iter().map(|s| s.name).collect())];
    (specs, reference)
}

#[test]
fn sharded_folder() {
    let d = temp_dir("sharded");
    let (specs, reference) = write_sharded(&d);
    // A stray single file must not be preferred over the index.
    std::fs::write(d.join("model.safetensors"), b"garbage").unwrap();
    let w = HfWeights::open_dir(&d).unwrap();
    assert_eq!(w.len(), specs.len());
    assert_eq!(w.mmaps().len(), 2);
    assert_eq!(w.meta("model.layers.0.self_attn.q_proj.weight").unwrap().file, 0);
    assert_eq!(w.meta("lm_head.weight").unwrap().file, 1);
    check_all(&w, &specs, &reference);
    let _ = std::fs::remove_dir_all(&d);
}

fn index_err(d: &Path, edit: impl Fn(&mut serde_json::Value)) -> String {
    let p = d.join("model.safetensors.index.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    let orig = v.clone();
    edit(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    let e = match HfWeights::open_dir(d) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    std::fs::write(&p, serde_json::to_string(&orig).unwrap()).unwrap();
    e
}

#[test]
fn sharded_index_errors() {
    let d = temp_dir("badindex");
    write_sharded(&d);
    // Listed tensor absent from its shard.
    let e = index_err(&d, |v| {
        v["weight_map"]["model.layers.9.mlp.down_proj.weight"] = "model-00001-of-00002.safetensors".into();
    });
    assert!(e.contains("model.layers.9.mlp.down_proj.weight") && e.contains("model-00001-of-00002"), "{e}");
    // Listed in the wrong shard.
    let e = index_err(&d, |v| v["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors".into());
    assert!(e.contains("lm_head.weight") && e.contains("model-00002-of-00002"), "{e}");
    // Missing shard file.
    let e = index_err(&d, |v| v["weight_map"]["lm_head.weight"] = "model-00003-of-00003.safetensors".into());
    assert!(e.contains("model-00003-of-00003.safetensors"), "{e}");
    // Escaping the folder.
    let e = index_err(&d, |v| v["weight_map"]["lm_head.weight"] = "../model.safetensors".into());
    assert!(e.contains("weight_map.lm_head.weight") && e.contains("not a file inside"), "{e}");
    let e = index_err(&d, |v| v["weight_map"]["lm_head.weight"] = 3.into());
    assert!(e.contains("weight_map.lm_head.weight"), "{e}");
    let e = index_err(&d, |v| v.as_object_mut().unwrap().remove("weight_map").map(|_| ()).unwrap());
    assert!(e.contains("weight_map") && e.contains("index.json"), "{e}");
    let e = index_err(&d, |v| v["weight_map"] = serde_json::json!({}));
    assert!(e.contains("empty"), "{e}");
    // The same tensor in two shards.
    let dup = serialize(&[spec("lm_head.weight", Dtype::BF16, &[3, 4], 5)]);
    std::fs::write(d.join("model-00001-of-00002.safetensors"), dup).unwrap();
    let e = HfWeights::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("lm_head.weight") && e.contains("also appears"), "{e}");
    // Invalid index JSON.
    std::fs::write(d.join("model.safetensors.index.json"), "{\"weight_map\": ").unwrap();
    let e = HfWeights::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("model.safetensors.index.json") && e.contains("invalid JSON"), "{e}");
    // Empty folder.
    let empty = temp_dir("empty");
    let e = HfWeights::open_dir(&empty).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&empty);
}

/// A safetensors file from a hand-written header and data section.
fn hand_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn open_bytes(d: &Path, name: &str, b: &[u8]) -> Result<HfWeights, FormatError> {
    let p = d.join(name);
    std::fs::write(&p, b).unwrap();
    HfWeights::open_file(&p)
}

#[test]
fn truncated_and_corrupted_files() {
    let d = temp_dir("bad");
    let specs = model_specs();
    let good = serialize(&specs);
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;

    // Every cut point: an error naming the file, never a panic.
    let mut n_cuts = 0;
    for cut in 0..good.len() {
        match open_bytes(&d, "cut.safetensors", &good[..cut]) {
            Ok(_) => panic!("cut at {cut} of {} opened", good.len()),
            Err(e) => {
                let s = e.to_string();
                assert!(s.contains("cut.safetensors"), "cut {cut}: {s}");
                if cut < 8 {
                    assert!(s.contains("header length"), "cut {cut}: {s}");
                } else if cut < 8 + header_len {
                    assert!(s.contains("header"), "cut {cut}: {s}");
                } else {
                    // Data cut: the error names a tensor.
                    assert!(matches!(e, FormatError::Truncated { .. }) && s.contains("tensor '"), "cut {cut}: {s}");
                }
            }
        }
        n_cuts += 1;
    }
    println!("{n_cuts} truncations of a {}-byte file all refused", good.len());
    assert!(open_bytes(&d, "cut.safetensors", &good).is_ok());

    // Header length beyond the file / absurd.
    let mut b = good.clone();
    b[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    let e = open_bytes(&d, "h.safetensors", &b).err().unwrap().to_string();
    assert!(e.contains("truncated") && e.contains("header"), "{e}");
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = open_bytes(&d, "h.safetensors", &b).err().unwrap().to_string();
    assert!(e.contains("header length"), "{e}");

    // Corrupted header JSON.
    let mut b = good.clone();
    b[8] = b'x';
    let e = open_bytes(&d, "j.safetensors", &b).err().unwrap().to_string();
    assert!(e.contains("j.safetensors") && e.contains("not valid JSON"), "{e}");
    let mut b = good.clone();
    b[8 + header_len / 2] = 0xff;
    let e = open_bytes(&d, "j.safetensors", &b).err().unwrap().to_string();
    assert!(e.contains("j.safetensors"), "{e}");

    let data = bytes(48, 9);
    let cases: &[(&str, &str)] = &[
        // data offsets beyond the file
        (r#"{"w": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]}}"#, "tensor 'w' data"),
        (
            r#"{"w": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551615]}}"#,
            "tensor 'w' data",
        ),
        // size disagrees with shape
        (r#"{"w": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 48]}}"#, "tensor 'w'"),
        (r#"{"w": {"dtype": "BF16", "shape": [4294967296, 4294967296, 4294967296], "data_offsets": [0, 48]}}"#, "tensor 'w'"),
        (r#"{"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}"#, "reversed"),
        (r#"{"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}"#, "'shape'"),
        (r#"{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0]}}"#, "'data_offsets'"),
        (r#"{"w": {"shape": [4], "data_offsets": [0, 16]}}"#, "'dtype'"),
        (r#"{"w": 5}"#, "tensor 'w'"),
        (
            r#"{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
             "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}"#,
            "overlap",
        ),
        (r#"{"__metadata__": {"format": 1}}"#, "__metadata__.format"),
        (r#"[1, 2]"#, "not a JSON object"),
    ];
    for (header, want) in cases {
        let e = open_bytes(&d, "c.safetensors", &hand_file(header, &data)).err();
        let e = e.unwrap_or_else(|| panic!("{header} opened")).to_string();
        assert!(e.contains("c.safetensors") && e.contains(want), "{header}: {e}");
    }
    // An unknown dtype string opens (size unchecked) and errors only when requested.
    let w = open_bytes(
        &d,
        "u.safetensors",
        &hand_file(
            r#"{"odd": {"dtype": "Q9_WEIRD", "shape": [7], "data_offsets": [0, 5]},
                 "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 32]}}"#,
            &data,
        ),
    )
    .unwrap();
    assert_eq!(w.tensor("w").unwrap().data, &data[16..32]);
    assert!(matches!(w.get("odd"), Err(FormatError::UnsupportedDtype { .. })));
    // Trailing spaces after the JSON (writers pad the header to 8 bytes) are fine.
    let w = open_bytes(
        &d,
        "p.safetensors",
        &hand_file(r#"{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}     "#, &data[..4]),
    )
    .unwrap();
    assert_eq!(w.tensor("w").unwrap().shape, [2]);
    let _ = std::fs::remove_dir_all(&d);
}
