//! Offline checks of the model/text cache: path resolution, error texts, and that a corrupted
//! cached file is detected and refetched (or reported). The network is never touched: parts are
//! served from memory by `MemSource`, and the sha256 values are computed by `sha2` on those
//! bytes, independently of the code under test's streaming hasher.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use cortiq_cli::pull::{self, Dist, Part, PartSource};
use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

/// Serves member bytes from memory and counts how often it was asked.
struct MemSource {
    members: HashMap<&'static str, Vec<u8>>,
    opens: Cell<usize>,
}

impl PartSource for MemSource {
    fn open(&self, part: &Part, _: &ProgressBar) -> Result<Box<dyn Read>> {
        self.opens.set(self.opens.get() + 1);
        let bytes = self.members.get(part.member).ok_or_else(|| anyhow!("no member {}", part.member))?;
        Ok(Box::new(Cursor::new(bytes.clone())))
    }
}

const PARTS: [Part; 3] = [
    Part { package: "pkg-a", version: "1.0", dist: Dist::Wheel, member: "a/data/part00", inner: None },
    Part { package: "pkg-b", version: "1.0", dist: Dist::Wheel, member: "b/data/part01", inner: None },
    Part { package: "pkg-c", version: "1.0", dist: Dist::Wheel, member: "c/data/part02", inner: None },
];

/// Three parts of unequal length with distinct, position-dependent bytes, so that a wrong
/// order or a dropped part changes the hash.
fn fixture() -> (MemSource, Vec<u8>, String) {
    let mut members = HashMap::new();
    let mut whole = Vec::new();
    for (i, (p, len)) in PARTS.iter().zip([3000usize, 1 << 20 | 17, 5]).enumerate() {
        let bytes: Vec<u8> = (0..len).map(|j| (j * 31 + i * 7) as u8).collect();
        whole.extend_from_slice(&bytes);
        members.insert(p.member, bytes);
    }
    let sha = hex(&Sha256::digest(&whole));
    (MemSource { members, opens: Cell::new(0) }, whole, sha)
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh scratch directory per test (tests run in parallel threads of one process).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cortiq-pull-test-{}-{test}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

fn leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

#[test]
fn fresh_fetch_assembles_in_order_and_writes_sidecar() {
    let dir = scratch("fresh");
    let (src, whole, sha) = fixture();
    let path = pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("fetch");
    assert_eq!(path, dir.join("m.gguf"));
    let got = fs::read(&path).expect("read back");
    assert_eq!(got.len(), whole.len(), "assembled size");
    let first_diff = got.iter().zip(&whole).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "assembled bytes differ from the concatenation at byte {first_diff:?}");
    let side = fs::read_to_string(dir.join("m.gguf.sha256")).expect("sidecar");
    assert_eq!(side, format!("{sha}  m.gguf\n"));
    assert_eq!(src.opens.get(), 3);
    // No temp file or scratch directory left behind.
    let mut names = leftovers(&dir);
    names.sort();
    assert_eq!(names, ["m.gguf", "m.gguf.sha256"]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn verified_cache_hit_does_not_fetch() {
    let dir = scratch("hit");
    let (src, whole, sha) = fixture();
    pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("first fetch");
    let before = src.opens.get();
    pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("cache hit");
    assert_eq!(src.opens.get(), before, "a verified cached file must not be refetched");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn cached_file_without_sidecar_is_hashed_once_and_kept() {
    let dir = scratch("nosidecar");
    let (src, whole, sha) = fixture();
    // E.g. copied in by hand: right bytes, no sidecar.
    fs::write(dir.join("m.gguf"), &whole).expect("write");
    pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("verify");
    assert_eq!(src.opens.get(), 0, "good bytes must not be refetched");
    assert!(dir.join("m.gguf.sha256").exists(), "sidecar written after verification");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn corrupted_cached_file_is_detected_and_refetched() {
    let dir = scratch("corrupt");
    let (src, whole, sha) = fixture();
    let path = pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("first fetch");
    // Flip one byte in the middle, keep the size, and drop the sidecar (as if the disk, not
    // cortiq, changed the file after a crash mid-write).
    let mut bad = whole.clone();
    bad[whole.len() / 2] ^= 0x40;
    fs::write(&path, &bad).expect("corrupt");
    fs::remove_file(dir.join("m.gguf.sha256")).expect("drop sidecar");
    pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("refetch");
    assert_eq!(src.opens.get(), 6, "the corrupt file must be refetched (3 parts twice)");
    assert!(fs::read(&path).expect("read") == whole, "refetched bytes differ from the source");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn truncated_cached_file_is_refetched_even_with_sidecar() {
    let dir = scratch("truncated");
    let (src, whole, sha) = fixture();
    let path = pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("first fetch");
    fs::write(&path, &whole[..1000]).expect("truncate");
    pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect("refetch");
    assert_eq!(src.opens.get(), 6);
    assert_eq!(fs::metadata(&path).expect("stat").len(), whole.len() as u64);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn wrong_upstream_bytes_are_reported_and_leave_nothing() {
    let dir = scratch("mismatch");
    let (mut src, whole, sha) = fixture();
    // Same length, one byte different in the last part: only the hash can tell.
    src.members.get_mut(PARTS[2].member).expect("part")[0] ^= 1;
    let err = pull::ensure_file(&dir, "m.gguf", whole.len() as u64, &sha, &PARTS, &src).expect_err("a hash mismatch must fail");
    let msg = format!("{err:#}");
    assert!(msg.contains("sha256 mismatch") && msg.contains(&sha), "error should name the expected hash: {msg}");
    assert!(!msg.contains('\n'), "error should be one line: {msg}");
    assert!(leftovers(&dir).is_empty(), "nothing may stay behind: {:?}", leftovers(&dir));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn oversized_upstream_data_is_stopped() {
    let dir = scratch("oversize");
    let (src, whole, sha) = fixture();
    let err =
        pull::ensure_file(&dir, "m.gguf", whole.len() as u64 - 10, &sha, &PARTS, &src).expect_err("too many bytes must fail");
    assert!(format!("{err:#}").contains("exceeds the expected"), "{err:#}");
    assert!(leftovers(&dir).is_empty(), "nothing may stay behind: {:?}", leftovers(&dir));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn resolve_returns_existing_paths_unchanged() {
    let dir = scratch("resolve");
    let file = dir.join("local.gguf");
    fs::write(&file, b"GGUF").expect("write");
    let arg = file.to_str().expect("utf-8 temp path");
    assert_eq!(pull::resolve_model(arg).expect("file"), file);
    let d = dir.to_str().expect("utf-8 temp path");
    assert_eq!(pull::resolve_model(d).expect("dir"), dir);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn resolve_unknown_name_lists_known_names() {
    let err = pull::resolve_model("no-such-model-or-file.gguf").expect_err("must fail");
    let msg = format!("{err:#}");
    assert!(msg.contains("no-such-model-or-file.gguf") && msg.contains("no such file"), "{msg}");
    for m in pull::known_models() {
        assert!(msg.contains(m.name), "error should list {}: {msg}", m.name);
    }
    assert!(!msg.contains('\n'), "error should be one line: {msg}");
}

#[test]
fn unknown_text_and_model_names_list_known_names() {
    let dir = scratch("unknown");
    let src = fixture().0;
    let msg = format!("{:#}", pull::pull_text_with(&dir, "moby.txt", &src).expect_err("must fail"));
    for t in pull::known_texts() {
        assert!(msg.contains(t.name), "error should list {}: {msg}", t.name);
    }
    let msg = format!("{:#}", pull::pull_model_with(&dir, "llama-70b", &src).expect_err("must fail"));
    assert!(msg.contains("smollm2-135m") && msg.contains("qwen2.5-coder-0.5b"), "{msg}");
    assert_eq!(src.opens.get(), 0);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn registry_is_consistent() {
    let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    for m in pull::known_models() {
        if m.folder.is_empty() {
            assert!(hex(m.sha256), "{}: sha256 must be 64 lower-case hex digits", m.name);
            assert!(!m.parts.is_empty() && m.size > 0, "{}", m.name);
            assert!(m.file.ends_with(".gguf"), "{}", m.name);
            continue;
        }
        // A folder model: every file verified on its own, the sizes summing to the model's.
        assert!(m.sha256.is_empty() && m.parts.is_empty(), "{}: a folder model's own sha256 and parts are unused", m.name);
        assert_eq!(m.folder.iter().map(|f| f.size).sum::<u64>(), m.size, "{}: file sizes", m.name);
        for f in m.folder {
            assert!(hex(f.sha256) && f.size > 0, "{} {}", m.name, f.path);
            assert_eq!(f.part.inner, Some(f.path), "{} {}: the member inside the archive", m.name, f.path);
        }
        assert!(m.folder.iter().any(|f| f.path == "config.json"), "{}: no config.json", m.name);
    }
    for t in pull::known_texts() {
        assert_eq!(t.sha256.len(), 64, "{}", t.name);
        assert_eq!(t.parts.len(), 1, "{}", t.name);
        assert!(t.parts[0].member.ends_with(t.name), "{}", t.name);
    }
}

#[test]
fn cache_dir_precedence() {
    use std::ffi::OsString;
    let s = |v: &str| Some(OsString::from(v));
    assert_eq!(pull::cache_dir_from(s("/c"), s("/x"), s("/h")), PathBuf::from("/c"));
    assert_eq!(pull::cache_dir_from(s(""), s("/x"), s("/h")), PathBuf::from("/x/cortiq"));
    assert_eq!(pull::cache_dir_from(None, s("rel"), s("/h")), PathBuf::from("/h/.cache/cortiq"));
    assert_eq!(pull::cache_dir_from(None, None, s("/h")), PathBuf::from("/h/.cache/cortiq"));
}
