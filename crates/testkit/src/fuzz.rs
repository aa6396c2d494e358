//! Seeded mutation fuzzing shared by the crates' fuzz targets: a valid file mutated (flipped
//! bytes, counts and lengths overwritten with edge values, truncations, spliced chunks,
//! insertions), written to a temporary path and handed to the target, which must return rather
//! than panic. Bounded by `CORTIQ_FUZZ_SECS` (2 s a target in the test command; 600 for a long
//! local run). Written by hand rather than with cargo-fuzz (nightly, a separate build): the
//! mutations are the structured ones binary formats fail on, and the run fits the stable suite.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::XorShift;

/// A draw below `n` (0 when n is 0).
pub fn below(r: &mut XorShift, n: usize) -> usize {
    (r.next() % n.max(1) as u64) as usize
}

/// The time each target runs: `CORTIQ_FUZZ_SECS`, default 2 seconds.
pub fn budget() -> Duration {
    let secs: f64 = std::env::var("CORTIQ_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// One mutant of `seed`: mutations land mostly in the first `hot` bytes (the header and tables,
/// where parsing happens).
pub fn mutate(seed: &[u8], hot: usize, r: &mut XorShift) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + below(r, 4) {
        if b.is_empty() {
            break;
        }
        let hot = hot.min(b.len()).max(1);
        match below(r, 6) {
            0 => {
                let i = below(r, hot);
                b[i] ^= 1 << below(r, 8);
            }
            1 => {
                let i = below(r, hot);
                b[i] = r.next() as u8;
            }
            2 => {
                // An edge value over a u32 or u64 (counts, lengths, types, offsets).
                let vals: [u64; 8] = [0, 1, 0x7f, 0xff, 0xffff_ffff, 1 << 31, u64::MAX, 1 << 40];
                let v = vals[below(r, vals.len())];
                let w = if below(r, 2) == 0 { 4 } else { 8 };
                let i = below(r, hot.saturating_sub(w).max(1));
                if i + w <= b.len() {
                    b[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
                }
            }
            3 => {
                let n = below(r, b.len() + 1);
                b.truncate(n);
            }
            4 => {
                // Splice: a chunk of the file copied over another place.
                if b.len() > 16 {
                    let n = 1 + below(r, 64.min(b.len() / 2));
                    let from = below(r, b.len() - n);
                    let to = below(r, hot.min(b.len() - n).max(1));
                    let chunk = b[from..from + n].to_vec();
                    b[to..to + n].copy_from_slice(&chunk);
                }
            }
            _ => {
                let i = below(r, hot.min(b.len()).max(1));
                let n = below(r, 16);
                b.splice(i..i, (0..n).map(|_| r.next() as u8));
            }
        }
    }
    b
}

/// Run `target` on mutants of `seed_file` for the budget; a panic names the case's seed.
pub fn fuzz_file(name: &str, seed_file: &Path, file_name: &str, hot: usize, target: impl Fn(&Path)) {
    let seed = std::fs::read(seed_file).unwrap();
    let dir = std::env::temp_dir().join(format!("cortiq-fuzz-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file_name);
    target(seed_file);
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < budget() {
        let case = 0x5EED_0000_0000 + n;
        let mut r = XorShift(case.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        std::fs::write(&path, mutate(&seed, hot, &mut r)).unwrap();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&path)));
        if res.is_err() {
            let keep = dir.join(format!("crash-{case:x}"));
            let _ = std::fs::copy(&path, &keep);
            panic!("{name}: case {case:#x} panicked (the input is kept at {})", keep.display());
        }
        n += 1;
    }
    std::fs::remove_dir_all(&dir).ok();
    eprintln!("[{name}] {n} mutants in {:.1}s, no panic", t0.elapsed().as_secs_f64());
}
