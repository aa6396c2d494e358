//! Fuzzing cortiq's own model files: a .cmf written by `cortiq convert` from the Llama fixture,
//! mutated by `cortiq_testkit::fuzz`, opened by the reader and then loaded as a model; every
//! mutant opens or is refused with an error, none panics. CORTIQ_FUZZ_SECS bounds the run (2 s in
//! the test command).

mod common;

use common::{TempDir, fixture};
use cortiq_formats::cmf::Cmf;
use cortiq_testkit::fuzz::fuzz_file;

#[test]
fn fuzz_cmf_reader_and_load() {
    let dir = TempDir::new("fuzz-cmf-seed");
    let seed = dir.0.join("seed.cmf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cortiq"))
        .args(["convert", "-m", fixture("llama").to_str().unwrap(), "-o", seed.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "convert: {}", String::from_utf8_lossy(&out.stderr));
    assert!(cortiq_engine::load::load(&seed).is_ok(), "the seed loads");
    // The header and tensor table come first; mutations land there.
    fuzz_file("cmf", &seed, "case.cmf", 32 << 10, |p| {
        if Cmf::open(p).is_ok() {
            let _ = cortiq_engine::load::load(p);
        }
    });
}
