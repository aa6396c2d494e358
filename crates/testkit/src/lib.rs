//! cortiq-testkit: what the crates' tests share. A dev-dependency only; the product never links it.
//!
//! Owns two things every test group needs and must not get subtly wrong:
//! - **Real models and texts** (`real_model`, `real_text`): the path of a pulled checkpoint or
//!   text in the model cache, resolved exactly as `cortiq pull` resolves it (the one function,
//!   `cortiq_formats::registry::cache_dir`: `$CORTIQ_CACHE`, `$XDG_CACHE_HOME/cortiq`,
//!   `~/.cache/cortiq`). A file that is absent is a test FAILURE with a message that says how to
//!   fetch it, never a silent skip: a skipped check that reports "ok" is how a broken build
//!   passes. `scripts/test` pulls every real model before it runs the tests.
//! - **Error measures that propagate NaN** (`max_abs_diff`, `max_abs`, ...): `f32::max` drops a
//!   NaN (`0.0f32.max(NAN) == 0.0`), so a hand-written `fold(0.0, f32::max)` over a broken
//!   output reads 0 and passes any tolerance. These return NaN when any input is NaN, and every
//!   `assert!(err <= tol)` then fails, as it must.
//!
//! The kernels crate's tests use it too; Cargo allows that dev-dependency cycle (kernels' tests
//! -> testkit -> formats -> kernels), and nothing here touches kernel types.

use std::path::PathBuf;

pub use cortiq_formats::registry::{KnownModel, KnownText, cache_dir};
use cortiq_formats::registry::{find_model, find_text};

/// How to get a missing real model or text, for failure messages.
fn how_to_fetch(name: &str) -> String {
    format!("run scripts/test (it pulls the real models and texts first), or `cortiq pull {name}`")
}

/// The registry entry of the known model `name` (short name or file name); panics on a name the
/// registry does not know (a typo in a test is a failure too).
pub fn known_model(name: &str) -> &'static KnownModel {
    find_model(name).unwrap_or_else(|| panic!("test asks for an unknown model '{name}' (see cortiq_formats::registry)"))
}

/// Path of the real model `name` (short name such as `smollm2-135m`, or its file name) in the
/// model cache. Panics with a message naming the path and how to fetch it when it is absent.
pub fn real_model(name: &str) -> PathBuf {
    let m = known_model(name);
    let path = cache_dir().join("models").join(m.file);
    if !m.is_cached(&cache_dir().join("models")) {
        panic!(
            "real model {} is not in the model cache: {} does not exist; {} (cache resolved from CORTIQ_CACHE, \
             XDG_CACHE_HOME, HOME as `cortiq pull` does)",
            m.name,
            path.display(),
            how_to_fetch(m.name)
        );
    }
    path
}

/// Path of the known text `name` (`alice29.txt`, `lcet10.txt`, ...) in the cache; panics with
/// the path and how to fetch it when it is absent.
pub fn real_text(name: &str) -> PathBuf {
    let t = find_text(name).unwrap_or_else(|| panic!("test asks for an unknown text '{name}'"));
    let path = cache_dir().join("texts").join(t.name);
    if !path.is_file() {
        panic!("text {} is not in the cache: {} does not exist; {}", t.name, path.display(), how_to_fetch(t.name));
    }
    path
}

/// `real_model(name)` as a `&str` argument for the `cortiq` binary (the tests pass paths, not
/// names: a name would make the binary download the model, and the test would pass on a machine
/// where `scripts/test` never pulled).
pub fn real_model_arg(name: &str) -> String {
    real_model(name).to_str().expect("cache path is UTF-8").to_string()
}

/// `real_text(name)` as a `&str` argument for the `cortiq` binary.
pub fn real_text_arg(name: &str) -> String {
    real_text(name).to_str().expect("cache path is UTF-8").to_string()
}

/// The tests' deterministic generator (xorshift64): same seed, same draws on every machine.
pub struct XorShift(pub u64);

impl XorShift {
    /// The next 64 random bits (the seed must not be 0). Named as the tests' generators always
    /// were, not an `Iterator` (it never ends).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `n` token ids below `vocab` (the tests' prompts and drafts).
    pub fn ids(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|_| (self.next() % vocab as u64) as u32).collect()
    }

    /// Uniform in [-1, 1) on a 2^-23 grid.
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    /// `n` values of `f() * scale` (a test's random weights or inputs).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// The larger of `acc` and `x`, NaN if either is NaN (`f64::max` would drop the NaN).
#[inline]
pub fn nan_max(acc: f64, x: f64) -> f64 {
    if acc.is_nan() || x.is_nan() { f64::NAN } else { acc.max(x) }
}

/// max |a[i] - b[i]| and the first index where it is reached; `(NaN, i)` at the first i where
/// either side is NaN (or both are infinite with the same sign's difference undefined). Panics
/// when the lengths differ.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len(), "max_abs_diff: lengths differ");
    let mut best = (0f32, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d.is_nan() {
            return (f32::NAN, i);
        }
        if d > best.0 {
            best = (d, i);
        }
    }
    best
}

/// `max_abs_diff` in f64.
pub fn max_abs_diff_f64(a: &[f64], b: &[f64]) -> (f64, usize) {
    assert_eq!(a.len(), b.len(), "max_abs_diff_f64: lengths differ");
    let mut best = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d.is_nan() {
            return (f64::NAN, i);
        }
        if d > best.0 {
            best = (d, i);
        }
    }
    best
}

/// max |v[i]| (0 for an empty slice), NaN if any element is NaN.
pub fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, &x| if m.is_nan() || x.is_nan() { f32::NAN } else { m.max(x.abs()) })
}

/// max over an iterator of f64 errors (0 when empty), NaN if any is NaN: for loops that compute
/// their own error measure (relative errors, per-row norms).
pub fn max_err(errs: impl IntoIterator<Item = f64>) -> f64 {
    errs.into_iter().fold(0.0, nan_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_is_never_dropped() {
        assert!(max_abs_diff(&[1.0, f32::NAN, 3.0], &[1.0, 2.0, 0.0]).0.is_nan());
        assert_eq!(max_abs_diff(&[1.0, f32::NAN, 3.0], &[1.0, 2.0, 0.0]).1, 1);
        assert!(max_abs_diff(&[0.0], &[f32::NAN]).0.is_nan());
        assert!(max_abs_diff(&[f32::INFINITY], &[f32::INFINITY]).0.is_nan());
        assert!(max_abs_diff_f64(&[0.0, 1.0], &[f64::NAN, 1.0]).0.is_nan());
        assert!(max_abs(&[1.0, f32::NAN]).is_nan());
        assert!(max_abs(&[f32::NAN, 1.0]).is_nan());
        assert!(max_err([0.5, f64::NAN, 0.1]).is_nan());
        assert!(nan_max(f64::NAN, 1.0).is_nan() && nan_max(1.0, f64::NAN).is_nan());
        // ... which is exactly what f32::max gets wrong.
        assert_eq!([1.0f32, f32::NAN].iter().fold(0f32, |m, &x| m.max(x)), 1.0);
    }

    #[test]
    fn finite_values_give_the_max_and_its_first_index() {
        assert_eq!(max_abs_diff(&[1.0, 5.0, 2.0, -4.0], &[1.0, 3.0, 2.0, 0.0]), (4.0, 3));
        assert_eq!(max_abs_diff(&[], &[]), (0.0, 0));
        assert_eq!(max_abs(&[-3.0, 2.0]), 3.0);
        assert_eq!(max_err([0.1, 0.3, 0.2]), 0.3);
    }

    #[test]
    fn real_model_names_resolve_in_the_registry() {
        assert_eq!(known_model("smollm2-135m").file, "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(known_model("gemma-3-270m-q4_k_m.gguf").name, "gemma3-270m");
    }

    #[test]
    #[should_panic(expected = "unknown model")]
    fn an_unknown_model_name_fails() {
        known_model("no-such-model");
    }
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

pub mod fuzz;
