//! Helpers shared by the CLI integration tests: fixture folders, temp dirs, a tiny tokenizer.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures").join(arch)
}

pub struct TempDir(pub PathBuf);
impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("cortiq-bad-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn copy_fixture(arch: &str, tag: &str) -> TempDir {
    let t = TempDir::new(tag);
    for e in std::fs::read_dir(fixture(arch)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), t.0.join(e.file_name())).unwrap();
    }
    t
}

#[allow(unused_imports)] // not every test binary builds tokenizers
pub use cortiq_testkit::byte_tokenizer_json;
pub mod http;
