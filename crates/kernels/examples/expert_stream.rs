//! Decode's row-major matvec streaming an MoE layer's experts: 768 x 2048 matrices (Qwen3-30B-A3B's
//! expert shape, 0.9 MB in Q4_K) picked at random, each of 2 threads taking every other one, read
//! from four places: a file map (its pages as the page cache holds them), anonymous huge-page
//! memory, the same memory in order, and one matrix pair that stays in cache (the kernel's
//! compute ceiling). Prints GB/s of weights per round; the prefetch distance comes from
//! `CORTIQ_PREFETCH_AHEAD` when set (`vecdot_avx512::prefetch_distance`), so distances compare
//! in alternating runs. The file's bytes are used as weights whatever they hold (speed only).
//!
//! With `read`, each row reads the same bytes without the kernel (a 64-bit XOR over them): the
//! memory's own speed from each place, e.g. a map whose pages the cache holds in 4 KiB pages
//! against one in 2 MiB pages (`cortiq_formats::PageShare`).
//!
//! `cargo run --release -p cortiq-kernels --example expert_stream -- FILE [q6k] [down] [read]`
//! (FILE: any large file, e.g. bench/moe_geometry.py's full-size output)

use cortiq_kernels::quant::{QuantType, act_type, matvec_fast, quantize_act};
use std::time::Instant;

/// Anonymous memory the "anon" and "seq" rows read (kept small beside an ~18 GB file's page
/// cache on a 24 GiB machine).
const ANON: usize = 2 << 30;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: expert_stream FILE [q6k] [down] [read]");
        std::process::exit(2);
    };
    let ty = if args.iter().any(|a| a == "q6k") { QuantType::Q6K } else { QuantType::Q4K };
    let read_only = args.iter().skip(1).any(|a| a == "read");
    // `down`: the expert's down projection (2048 x 768, three blocks a row) instead of gate/up
    let (rows, cols) = if args.iter().skip(1).any(|a| a == "down") { (2048usize, 768usize) } else { (768, 2048) };
    let mb = ty.row_bytes(cols).expect("whole blocks") * rows;
    let f = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(1);
    });
    // SAFETY: a read-only private map of a file this example never writes.
    let map = unsafe { memmap(&f) };
    let n_file = map.len() / mb;
    let mut anon = huge_anon(ANON);
    for (i, c) in anon.chunks_mut(mb).enumerate() {
        let n = c.len();
        c.copy_from_slice(&map[(i % n_file) * mb..][..n]);
    }
    let n_anon = ANON / mb;
    // The file's first ANON bytes are in the page cache already (read for the copy above): its
    // row reads those, so map and anonymous memory compare on the same bytes, both resident.
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut a = Vec::new();
    quantize_act(act_type(ty).expect("quantized activations"), &x, &mut a);
    let mut seed = 0x1234_5678u64;
    let mut rnd = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let steps = 48 * 24; // one token's expert matrices at top-8 of 48 layers, three each
    for round in 0..3 {
        for (name, buf) in [("file", map), ("anon", &anon[..]), ("seq", &anon[..]), ("hot", &anon[..])] {
            let picks: Vec<usize> = (0..steps * 4)
                .map(|i| match name {
                    "file" => rnd(n_file.min(n_anon)),
                    "anon" => rnd(n_anon),
                    "seq" => i % n_anon,
                    _ => i % 2,
                })
                .collect();
            let t = Instant::now();
            std::thread::scope(|s| {
                for th in 0..2 {
                    let (picks, a) = (&picks, &a);
                    s.spawn(move || {
                        let mut y = vec![0f32; rows];
                        let mut x = 0u64;
                        for &p in picks.iter().skip(th).step_by(2) {
                            let w = &buf[p * mb..][..mb];
                            if read_only {
                                x ^= w.chunks_exact(8).fold(0, |s, c| s ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
                            } else {
                                matvec_fast(ty, w, rows, cols, a, &mut y);
                            }
                        }
                        std::hint::black_box((&y, x));
                    });
                }
            });
            let gbs = (picks.len() * mb) as f64 / t.elapsed().as_secs_f64() / 1e9;
            let what = if read_only { "read" } else { ty.name() };
            println!("round {round} {what} {name}: {gbs:.1} GB/s");
        }
    }
}

/// The whole file mapped read-only, huge pages asked for (as `cortiq_formats` maps models).
///
/// # Safety
/// The file must not be truncated while the map lives.
unsafe fn memmap(f: &std::fs::File) -> &'static [u8] {
    use std::os::fd::AsRawFd;
    let len = f.metadata().expect("file size").len() as usize;
    // SAFETY: a fresh read-only private mapping of `len` bytes of an open file; leaked for the
    // program's life, so the slice never dangles.
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap failed");
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
        std::slice::from_raw_parts(p as *const u8, len)
    }
}

/// `n` zero bytes, huge pages asked for before the first touch (as the engine's own weight
/// copies are, `ileave::zeroed_huge`).
fn huge_anon(n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = Vec::with_capacity(n);
    let start = v.as_ptr() as usize;
    let (a, b) = (start.next_multiple_of(2 << 20), (start + n) / (2 << 20) * (2 << 20));
    if a < b {
        // SAFETY: advice on whole 2 MiB pages inside this vector's allocation; it changes how
        // the kernel backs them, never their contents.
        unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
    }
    v.resize(n, 0);
    v
}
