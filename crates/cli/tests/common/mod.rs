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

/// A byte-level BPE tokenizer.json over the 256 byte symbols (ids 0..255), no merges: enough
/// to drive `run` on the 256-token gemma3 fixture.
pub fn byte_tokenizer_json() -> String {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut pairs: Vec<(u32, char)> = bs.iter().zip(&cs).map(|(&b, &c)| (b, char::from_u32(c).unwrap())).collect();
    pairs.sort();
    let vocab: Vec<String> =
        pairs.iter().map(|(b, c)| format!("{}: {b}", serde_json::to_string(&c.to_string()).unwrap())).collect();
    format!(
        r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
"pre_tokenizer":{{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}},
"post_processor":null,"decoder":{{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}},
"model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,"vocab":{{{}}},"merges":[]}}}}"#,
        vocab.join(",")
    )
}
pub mod http;
