//! Dispatch overhead of kernels::pool::Pool against rayon and std::thread::scope, and a
//! realistic job: an [N, N] f32 matvec split by rows (N = 896, Qwen2.5-0.5B's hidden size).
//!
//! `cargo run --release -p cortiq-kernels --example pool_bench [-- THREADS [N]]`
//!
//! Each figure is ns (or us) per call, the median and the best over REPS batches (the machine
//! may be shared: the best approximates a quiet one; compare ratios, not absolutes). rayon uses its global pool sized to THREADS, called
//! from the main thread as the engine does (`par_iter` from outside the pool).

use cortiq_kernels::dot::dot;
use cortiq_kernels::pool::Pool;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

const REPS: usize = 15;

/// (median, best) ns per call of `f` over REPS batches of `iters` calls, after one warm-up
/// batch; the best approximates a quiet machine.
fn stats_ns(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..iters {
        f();
    }
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    (v[REPS / 2], v[0])
}

/// Spins `n` dependent multiply-adds: CPU work that touches no memory.
fn busy(n: u64) {
    let mut x = 1.000_000_1f64;
    for _ in 0..n {
        x = black_box(x * 1.000_000_1 + 1e-9);
    }
    black_box(x);
}

/// Iterations of `busy` taking about `us` microseconds on this thread.
fn calibrate(us: f64) -> u64 {
    let n = 100_000u64;
    let ns = stats_ns(5, || busy(n)).1;
    ((us * 1000.0 / ns) * n as f64).max(1.0) as u64
}

struct OutPtr(*mut f32);
// SAFETY: every user writes only its own disjoint row range.
unsafe impl Sync for OutPtr {}

fn matvec_rows(w: &[f32], x: &[f32], out: &OutPtr, k: usize, start: usize, end: usize) {
    for r in start..end {
        let v = dot(&w[r * k..(r + 1) * k], x);
        // SAFETY: r in this caller's own range, inside the output's length.
        unsafe { *out.0.add(r) = v };
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let nt = args.first().copied().unwrap_or(2).max(2);
    let n = args.get(1).copied().unwrap_or(896);
    rayon::ThreadPoolBuilder::new().num_threads(nt).build_global().expect("rayon global pool");
    let pool = Pool::new(nt).expect("pool");
    let pool_nospin = Pool::with_spin(nt, Duration::ZERO).expect("pool");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("threads: {nt}; cores seen: {cores}; median and best of {REPS} batches; ratios use medians");

    // ---- empty job ----
    // Mostly measures the caller claiming every unit before a worker arrives (then the call
    // never waits for anyone) plus the occasional worker that joins and must be waited for.
    println!("\nempty job (dispatch + wait), ns per call:");
    let rows = vec![
        ("pool.for_ranges(nt, 1)", stats_ns(20_000, || pool.for_ranges(nt, 1, |s, e| _ = black_box((s, e))))),
        ("pool.broadcast", stats_ns(20_000, || pool.broadcast(|i, n| _ = black_box((i, n))))),
        ("pool.run(nt)", stats_ns(20_000, || pool.run(nt, |i| _ = black_box(i)))),
        ("pool.for_ranges, spin 0", stats_ns(20_000, || pool_nospin.for_ranges(nt, 1, |s, e| _ = black_box((s, e))))),
        ("rayon (0..nt).into_par_iter().for_each", stats_ns(20_000, || (0..nt).into_par_iter().for_each(|i| _ = black_box(i)))),
        (
            "std::thread::scope spawning nt-1",
            stats_ns(500, || {
                std::thread::scope(|s| {
                    for i in 1..nt {
                        s.spawn(move || black_box(i));
                    }
                    black_box(0);
                })
            }),
        ),
    ];
    let base = rows[0].1.0;
    for (name, (med, best)) in &rows {
        println!("  {name:<40} median {med:>9.0} ns  best {best:>9.0} ns  {:>7.1}x pool", med / base);
    }

    // ---- fixed busy work per unit: a worker must join for the job to go faster ----
    // Each of nt units costs ~`us` microseconds, so the ideal is `us` (all in parallel) against
    // nt*us serial; (time - us) is the real round-trip overhead.
    for us in [2.0f64, 10.0, 50.0] {
        let spins = calibrate(us);
        let rows = vec![
            ("serial (caller alone)", stats_ns(200, || (0..nt).for_each(|_| busy(spins)))),
            ("pool.run(nt)", stats_ns(200, || pool.run(nt, |_| busy(spins)))),
            ("pool.run(nt), spin 0", stats_ns(200, || pool_nospin.run(nt, |_| busy(spins)))),
            ("rayon into_par_iter", stats_ns(200, || (0..nt).into_par_iter().for_each(|_| busy(spins)))),
            (
                "std::thread::scope",
                stats_ns(100, || {
                    std::thread::scope(|s| {
                        for _ in 1..nt {
                            s.spawn(|| busy(spins));
                        }
                        busy(spins);
                    })
                }),
            ),
        ];
        println!("\n{nt} units of ~{us} us busy work each (ideal {us} us, serial {} us), us per call:", us * nt as f64);
        for (name, (med, best)) in &rows {
            println!(
                "  {name:<40} median {:>8.2} us  best {:>8.2} us  (best - ideal {:>7.2} us)",
                med / 1e3,
                best / 1e3,
                best / 1e3 - us
            );
        }
    }

    // ---- matvec ----
    let w: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut y = vec![0f32; n];
    let out = OutPtr(y.as_mut_ptr());
    let (w, x, o) = (&w[..], &x[..], &out);
    let iters = (2_000_000_000 / (n * n)).clamp(20, 2_000);
    println!(
        "\n[{n}, {n}] f32 matvec ({:.1} MiB of weights, cache-resident after warm-up), us per call:",
        (n * n * 4) as f64 / (1 << 20) as f64
    );
    let chunk = n.div_ceil(nt);
    let rows = vec![
        ("single thread", stats_ns(iters, || matvec_rows(w, x, o, n, 0, n))),
        ("pool.for_ranges grain 4 (static)", stats_ns(iters, || pool.for_ranges(n, 4, |s, e| matvec_rows(w, x, o, n, s, e)))),
        (
            "pool.for_rows_mut grain 4 (safe slices)",
            stats_ns(iters, || {
                // SAFETY: `out` points at `y`, alive for the whole benchmark; nothing else touches it.
                let y = unsafe { std::slice::from_raw_parts_mut(o.0, n) };
                pool.for_rows_mut(y, 1, 4, |r0, ys| {
                    for (j, yv) in ys.iter_mut().enumerate() {
                        let r = r0 + j;
                        *yv = dot(&w[r * n..(r + 1) * n], x);
                    }
                })
            }),
        ),
        (
            "pool.for_ranges_dynamic grain 32",
            stats_ns(iters, || pool.for_ranges_dynamic(n, 32, |s, e| matvec_rows(w, x, o, n, s, e))),
        ),
        ("pool.for_ranges, spin 0", stats_ns(iters, || pool_nospin.for_ranges(n, 4, |s, e| matvec_rows(w, x, o, n, s, e)))),
        (
            "rayon par_chunks_mut(n/nt) over y",
            stats_ns(iters, || {
                // The safe rayon idiom: one chunk of outputs per thread.
                // SAFETY: `out` points at `y`, alive for the whole benchmark; nothing else touches it.
                let y = unsafe { std::slice::from_raw_parts_mut(o.0, n) };
                y.par_chunks_mut(chunk).enumerate().for_each(|(c, ys)| {
                    for (j, yv) in ys.iter_mut().enumerate() {
                        let r = c * chunk + j;
                        *yv = dot(&w[r * n..(r + 1) * n], x);
                    }
                })
            }),
        ),
        (
            "std::thread::scope spawning nt-1",
            stats_ns(iters.min(500), || {
                std::thread::scope(|s| {
                    for t in 1..nt {
                        s.spawn(move || matvec_rows(w, x, o, n, t * chunk, ((t + 1) * chunk).min(n)));
                    }
                    matvec_rows(w, x, o, n, 0, chunk.min(n));
                })
            }),
        ),
    ];
    black_box(&y);
    let (single_med, single_best) = rows[0].1;
    for (name, (med, best)) in &rows {
        println!(
            "  {name:<40} median {:>7.1} us  best {:>7.1} us  speedup vs single: median {:>4.2}x  best {:>4.2}x",
            med / 1e3,
            best / 1e3,
            single_med / med,
            single_best / best
        );
    }
}
