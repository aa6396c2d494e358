//! The persistent pool (kernels::pool): coverage (every index exactly once, over sizes, grains
//! and thread counts), scoped borrows, panic propagation, many tiny dispatches, drop, nesting.

use cortiq_kernels::pool::{Pool, PoolError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Counts visits per index; reports the first index not visited exactly once.
fn check_once(counts: &[AtomicUsize], what: &str) {
    for (i, c) in counts.iter().enumerate() {
        let v = c.load(Ordering::Relaxed);
        assert_eq!(v, 1, "{what}: index {i} of {} visited {v} times", counts.len());
    }
}

const SIZES: [usize; 14] = [0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 100, 896, 1001];
const GRAINS: [usize; 7] = [0, 1, 2, 3, 4, 16, 1000];

#[test]
fn every_index_exactly_once() {
    for n_threads in [1, 2, 3, 4, 8] {
        let pool = Pool::new(n_threads).unwrap();
        assert_eq!(pool.n_threads(), n_threads);
        for &n in &SIZES {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, |i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            check_once(&counts, &format!("run n_threads={n_threads} n={n}"));
            for &grain in &GRAINS {
                for dynamic in [false, true] {
                    let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    let calls = AtomicUsize::new(0);
                    let body = |start: usize, end: usize| {
                        assert!(start < end && end <= n, "bad range {start}..{end} for n={n}");
                        if grain > 1 {
                            assert_eq!(start % grain, 0, "range start {start} not on grain {grain}");
                        }
                        calls.fetch_add(1, Ordering::Relaxed);
                        for c in &counts[start..end] {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                    };
                    if dynamic {
                        pool.for_ranges_dynamic(n, grain, body);
                    } else {
                        pool.for_ranges(n, grain, body);
                    }
                    let what = format!("for_ranges dynamic={dynamic} n_threads={n_threads} n={n} grain={grain}");
                    check_once(&counts, &what);
                    let calls = calls.load(Ordering::Relaxed);
                    let n_chunks = n.div_ceil(grain.max(1));
                    if dynamic {
                        assert_eq!(calls, n_chunks, "{what}: one call per chunk");
                    } else {
                        assert!(calls <= n_threads.min(n_chunks), "{what}: {calls} calls, at most one per participant");
                    }
                }
            }
        }
    }
}

/// Repeats `f` (which records the threads it ran on) until `want` distinct threads were seen:
/// a worker that the OS schedules late is legitimately shut out of a job, so one job alone
/// cannot prove every worker takes part. Units sleep 2 ms to give workers time to arrive.
fn until_all_threads_seen(want: usize, f: impl Fn(&Mutex<std::collections::HashSet<std::thread::ThreadId>>)) {
    let seen = Mutex::new(std::collections::HashSet::new());
    for _ in 0..200 {
        f(&seen);
        if seen.lock().unwrap().len() >= want {
            return;
        }
    }
    panic!("only {} of {want} threads ever ran a unit", seen.lock().unwrap().len());
}

#[test]
fn static_split_is_balanced_and_parallel() {
    let pool = Pool::new(4).unwrap();
    let ranges = Mutex::new(Vec::new());
    pool.for_ranges(1000, 8, |s, e| ranges.lock().unwrap().push((s, e)));
    let mut r = ranges.into_inner().unwrap();
    r.sort();
    assert_eq!(r.len(), 4, "ranges {r:?}");
    // 125 chunks of 8 over 4 participants: 31 or 32 chunks each, contiguous.
    for &(s, e) in &r {
        let chunks = (e - s).div_ceil(8);
        assert!((31..=32).contains(&chunks), "unbalanced range {s}..{e} in {r:?}");
    }
    until_all_threads_seen(4, |seen| {
        pool.for_ranges(1000, 8, |_, _| {
            seen.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(2));
        })
    });
}

#[test]
fn borrowed_data_mutated_through_disjoint_chunks() {
    // y = W x for a [rows, cols] matrix, rows split across threads; the closure borrows W, x and
    // writes y through a raw base pointer to disjoint row ranges (what a matvec kernel does).
    let (rows, cols) = (301, 67);
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
    let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
    let expect: Vec<f32> = (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum()).collect();
    struct OutPtr(*mut f32);
    // SAFETY (test): each range writes only rows start..end, ranges are disjoint.
    unsafe impl Sync for OutPtr {}
    for n_threads in [1, 2, 3] {
        let pool = Pool::new(n_threads).unwrap();
        for dynamic in [false, true] {
            let mut y = vec![f32::NAN; rows];
            let out = OutPtr(y.as_mut_ptr());
            let body = |start: usize, end: usize| {
                let out = &out;
                for r in start..end {
                    let v: f32 = (0..cols).map(|c| w[r * cols + c] * x[c]).sum();
                    unsafe { *out.0.add(r) = v };
                }
            };
            if dynamic {
                pool.for_ranges_dynamic(rows, 4, body);
            } else {
                pool.for_ranges(rows, 4, body);
            }
            let (mut max, mut at) = (0f32, 0);
            for r in 0..rows {
                let d = (y[r] - expect[r]).abs();
                if d > max || d.is_nan() {
                    (max, at) = (d, r);
                }
            }
            assert!(max == 0.0, "n_threads={n_threads} dynamic={dynamic}: max diff {max} at row {at}");
        }
        // Safe-Rust version: a Mutex-guarded borrowed Vec of per-range sums.
        let sums = Mutex::new(vec![0u64; 0]);
        let data: Vec<u64> = (0..10_000).collect();
        pool.for_ranges(data.len(), 64, |s, e| {
            let part: u64 = data[s..e].iter().sum();
            sums.lock().unwrap().push(part);
        });
        let total: u64 = sums.into_inner().unwrap().iter().sum();
        assert_eq!(total, 10_000 * 9_999 / 2);
    }
}

trait WorkerPanic {
    fn try_broadcast_checked(&self) -> Result<(), PoolError>;
}

impl WorkerPanic for Pool {
    /// Units sleep so workers join, and panic only on a worker thread.
    fn try_broadcast_checked(&self) -> Result<(), PoolError> {
        self.try_run(self.n_threads(), |_| {
            std::thread::sleep(Duration::from_millis(2));
            if std::thread::current().name().is_some_and(|n| n.starts_with("cortiq-pool-")) {
                panic!("worker unit failed");
            }
        })
    }
}

#[test]
fn panic_propagates_and_pool_stays_usable() {
    for n_threads in [1, 2, 4] {
        let pool = Pool::new(n_threads).unwrap();
        for bad in [0usize, 5, 99] {
            // A panic on any participant (the caller owns index 0's range) reaches the caller.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(100, |i| {
                    if i == bad {
                        panic!("task {i} failed");
                    }
                })
            }));
            let payload = r.expect_err("the panic must reach the caller");
            let msg = payload.downcast_ref::<String>().cloned().unwrap_or_default();
            assert_eq!(msg, format!("task {bad} failed"), "n_threads={n_threads}");

            let e = pool.try_for_ranges(100, 10, |s, e| assert!(!(s..e).contains(&bad), "range holding {bad}")).unwrap_err();
            match e {
                PoolError::TaskPanicked { message } => {
                    assert!(message.contains(&format!("range holding {bad}")), "message {message:?}")
                }
                other => panic!("unexpected error {other}"),
            }
            // A panic on a worker thread (not the caller) also reaches the caller.
            if n_threads > 1 {
                let mut on_worker = false;
                for _ in 0..200 {
                    let r = pool.try_broadcast_checked();
                    if let Err(PoolError::TaskPanicked { message }) = r {
                        assert_eq!(message, "worker unit failed");
                        on_worker = true;
                        break;
                    }
                }
                assert!(on_worker, "no unit ever ran on a worker");
            }
            // Still usable, and the panic flag does not leak into the next dispatch.
            let counts: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
            pool.for_ranges_dynamic(1000, 7, |s, e| counts[s..e].iter().for_each(|c| _ = c.fetch_add(1, Ordering::Relaxed)));
            check_once(&counts, "after a panic");
        }
    }
}

#[test]
fn many_tiny_dispatches() {
    // 100k back-to-back empty-ish jobs: exercises the epoch/pending protocol for lost wakeups.
    for (n_threads, spin) in [(2, Duration::from_micros(200)), (3, Duration::ZERO), (2, Duration::ZERO)] {
        let pool = Pool::with_spin(n_threads, spin).unwrap();
        let hits = AtomicUsize::new(0);
        let iters = if spin.is_zero() { 20_000 } else { 100_000 };
        for _ in 0..iters {
            pool.run(n_threads, |_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), iters * n_threads, "n_threads={n_threads} spin={spin:?}");
    }
}

#[test]
fn dispatch_after_workers_fell_asleep() {
    let pool = Pool::with_spin(3, Duration::from_micros(10)).unwrap();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(5)); // workers are parked on the condvar now
        let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        pool.run(64, |i| _ = counts[i].fetch_add(1, Ordering::Relaxed));
        check_once(&counts, "after sleep");
    }
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Arc<()>>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn drop_joins_workers() {
    // Each worker parks a clone of `marker` in a thread-local; thread-locals are destroyed when
    // the thread exits, so the count returns to 1 only if drop waited for every worker to exit.
    let marker = Arc::new(());
    let pool = Pool::new(4).unwrap();
    let m = &marker;
    until_all_threads_seen(4, |seen| {
        pool.broadcast(|ith, nth| {
            assert_eq!(nth, 4);
            let t = std::thread::current();
            if let Some(name) = t.name().filter(|n| n.starts_with("cortiq-pool-")) {
                assert!(name["cortiq-pool-".len()..].parse::<usize>().is_ok_and(|k| (1..4).contains(&k)), "{name}");
                HELD.with(|h| _ = h.borrow_mut().get_or_insert_with(|| Arc::clone(m)));
            }
            seen.lock().unwrap().insert(t.id());
            let _ = ith;
            std::thread::sleep(Duration::from_millis(2));
        })
    });
    assert_eq!(Arc::strong_count(&marker), 4, "three workers hold a clone");
    let t0 = std::time::Instant::now();
    drop(pool);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(Arc::strong_count(&marker), 1, "drop returned before every worker exited");
    // Dropping many pools in a row, some right after creation, never hangs.
    for k in 0..50 {
        let p = Pool::new(3).unwrap();
        if k % 2 == 0 {
            p.run(3, |_| {});
        }
    }
}

#[test]
fn nested_call_runs_inline() {
    let pool = Pool::new(3).unwrap();
    let inner_hits = AtomicUsize::new(0);
    let inner_foreign = AtomicUsize::new(0);
    pool.run(6, |_| {
        let me = std::thread::current().id();
        // Same pool from inside a task: must not deadlock, must run on this thread.
        pool.for_ranges(100, 1, |s, e| {
            assert_eq!((s, e), (0, 100), "nested static split runs as one inline range");
            if std::thread::current().id() != me {
                inner_foreign.fetch_add(1, Ordering::Relaxed);
            }
            inner_hits.fetch_add(1, Ordering::Relaxed);
        });
        pool.broadcast(|ith, nth| assert_eq!((ith, nth), (0, 1)));
    });
    assert_eq!(inner_hits.load(Ordering::Relaxed), 6);
    assert_eq!(inner_foreign.load(Ordering::Relaxed), 0);
    // Pool used normally afterwards (the caller's in-pool flag was reset).
    until_all_threads_seen(3, |seen| {
        pool.broadcast(|_, nth| {
            assert_eq!(nth, 3);
            seen.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(2));
        })
    });
}

#[test]
fn late_workers_are_shut_out_not_waited_for() {
    // With a zero spin budget the workers are asleep when a job starts; a tiny job is finished
    // by the caller before they wake, and the call must not wait for them to be scheduled.
    let pool = Pool::with_spin(3, Duration::ZERO).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let counts: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
    let by_caller = AtomicUsize::new(0);
    let me = std::thread::current().id();
    for _ in 0..1000 {
        pool.broadcast(|ith, _| {
            counts[ith].fetch_add(1, Ordering::Relaxed);
            if std::thread::current().id() == me {
                by_caller.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(c.load(Ordering::Relaxed), 1000, "ith {i}");
    }
    // Not an assertion (scheduling decides it), a sanity print: how much the caller did itself.
    println!("caller ran {} of 3000 units", by_caller.load(Ordering::Relaxed));
}

#[test]
fn shared_between_threads() {
    // Two threads calling one pool concurrently are serialized, both complete correctly.
    let pool = Pool::new(2).unwrap();
    std::thread::scope(|s| {
        for t in 0..2 {
            let pool = &pool;
            s.spawn(move || {
                for k in 0..2000 {
                    let n = 10 + (k + t) % 50;
                    let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    pool.for_ranges(n, 3, |a, b| counts[a..b].iter().for_each(|c| _ = c.fetch_add(1, Ordering::Relaxed)));
                    check_once(&counts, "concurrent callers");
                }
            });
        }
    });
}

#[test]
fn single_thread_pool_runs_inline() {
    let pool = Pool::new(1).unwrap();
    let me = std::thread::current().id();
    let calls = Mutex::new(Vec::new());
    pool.for_ranges(100, 8, |s, e| {
        assert_eq!(std::thread::current().id(), me);
        calls.lock().unwrap().push((s, e));
    });
    assert_eq!(calls.into_inner().unwrap(), vec![(0, 100)], "one inline range");
    pool.run(10, |_| assert_eq!(std::thread::current().id(), me));
    pool.broadcast(|ith, nth| assert_eq!((ith, nth, std::thread::current().id()), (0, 1, me)));
}

#[test]
fn dynamic_split_balances_uneven_work() {
    // Chunk 0 is slow (20 ms); the other 63 are instant. With the atomic chunk counter the
    // participant not stuck in chunk 0 takes the rest: the slow chunk's thread runs only it.
    let pool = Pool::new(2).unwrap();
    for attempt in 0..20 {
        let per_thread = Mutex::new(std::collections::HashMap::<std::thread::ThreadId, Vec<usize>>::new());
        pool.for_ranges_dynamic(64, 1, |s, _| {
            if s == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            per_thread.lock().unwrap().entry(std::thread::current().id()).or_default().push(s);
        });
        let per_thread = per_thread.into_inner().unwrap();
        let total: usize = per_thread.values().map(Vec::len).sum();
        assert_eq!(total, 64);
        let slow = per_thread.values().find(|v| v.contains(&0)).unwrap();
        if per_thread.len() == 2 && slow.len() <= 2 {
            println!("attempt {attempt}: slow thread ran {slow:?}");
            return;
        }
    }
    panic!("the other participant never took over the remaining chunks in 20 tries");
}

#[test]
fn for_rows_mut_gives_disjoint_row_slices() {
    for n_threads in [1, 2, 3] {
        let pool = Pool::new(n_threads).unwrap();
        for (len, row_len, grain) in [(0, 3, 1), (10, 3, 1), (12, 3, 2), (1000, 7, 4), (5, 10, 1), (64, 1, 8)] {
            for dynamic in [false, true] {
                let mut out = vec![usize::MAX; len];
                let body = |r0: usize, rows: &mut [usize]| {
                    assert!(rows.len() <= (len.div_ceil(row_len) - r0) * row_len);
                    if dynamic {
                        assert!(rows.len() <= grain * row_len, "a dynamic chunk is at most `grain` rows");
                    }
                    for (j, v) in rows.iter_mut().enumerate() {
                        assert_eq!(*v, usize::MAX, "element {} written twice", r0 * row_len + j);
                        *v = r0 * row_len + j;
                    }
                };
                if dynamic {
                    pool.for_rows_mut_dynamic(&mut out, row_len, grain, body);
                } else {
                    pool.for_rows_mut(&mut out, row_len, grain, body);
                }
                let bad = out.iter().enumerate().find(|&(i, &v)| v != i);
                assert!(
                    bad.is_none(),
                    "n_threads={n_threads} len={len} row_len={row_len} dynamic={dynamic}: first wrong element {bad:?}"
                );
            }
        }
        let mut none = vec![1u8; 4];
        pool.for_rows_mut(&mut none, 0, 1, |_, _| panic!("row_len 0 must not call"));
    }
}

/// A `for_cols_mut*` task over [n_rows, n_cols] elements that start at usize::MAX: checks its
/// column range (whole grains, one piece per row, all the same width) and writes each element's
/// own index, refusing one written before.
fn mark_once(n_rows: usize, n_cols: usize, grain: usize) -> impl Fn(usize, &mut [&mut [usize]]) + Sync {
    move |c0, pieces| {
        assert_eq!(pieces.len(), n_rows, "one piece per row");
        let w = pieces[0].len();
        assert!(c0 % grain.max(1) == 0 && c0 + w <= n_cols, "range {c0}+{w} of {n_cols} columns, grain {grain}");
        for (i, piece) in pieces.iter_mut().enumerate() {
            assert_eq!(piece.len(), w, "every row's piece covers the same columns");
            for (j, v) in piece.iter_mut().enumerate() {
                assert_eq!(*v, usize::MAX, "element ({i}, {}) written twice", c0 + j);
                *v = i * n_cols + c0 + j;
            }
        }
    }
}

#[test]
fn for_cols_mut_gives_disjoint_column_pieces() {
    for n_threads in [1, 2, 3] {
        let pool = Pool::new(n_threads).unwrap();
        for (n_rows, n_cols, grain) in [(0, 5, 1), (3, 0, 1), (1, 10, 1), (4, 37, 16), (8, 1000, 16), (2, 7, 8)] {
            let mut out = vec![usize::MAX; n_rows * n_cols];
            pool.for_cols_mut(&mut out, n_rows, n_cols, grain, mark_once(n_rows, n_cols, grain));
            let bad = out.iter().enumerate().find(|&(i, &v)| v != i);
            assert!(bad.is_none(), "n_threads={n_threads} {n_rows}x{n_cols} grain {grain}: first wrong element {bad:?}");
        }
    }
}

/// The balanced split covers every element exactly once, in ranges of whole grains inside one
/// slab's piece grid, over thread counts, grains and piece sizes (one piece per slab falls
/// back to the static split); and with a participant slowed down (a shared core), the others
/// take pieces of its slab: it no longer runs all of its own.
#[test]
fn for_cols_mut_balanced_covers_once_and_shares_a_slow_slab() {
    for n_threads in [1, 2, 3] {
        let pool = Pool::new(n_threads).unwrap();
        for (n_rows, n_cols, grain, piece) in [
            (0, 5, 1, 1),
            (3, 0, 1, 1),
            (1, 10, 1, 3),
            (4, 37, 16, 16),
            (8, 1000, 16, 48),
            (2, 7, 8, 8),
            (1, 4096, 16, 1),
            (2, 500, 4, 1000),
        ] {
            let mut out = vec![usize::MAX; n_rows * n_cols];
            pool.for_cols_mut_balanced(&mut out, n_rows, n_cols, grain, piece, mark_once(n_rows, n_cols, grain));
            let bad = out.iter().enumerate().find(|&(i, &v)| v != i);
            assert!(
                bad.is_none(),
                "n_threads={n_threads} {n_rows}x{n_cols} grain {grain} piece {piece}: first wrong element {bad:?}"
            );
        }
    }
    // Two participants, 64 pieces of 16 columns in two slabs; whoever runs a piece of the
    // second slab sleeps 2 ms per piece, the first slab's pieces are instant. The second
    // slab's owner alone would take 64 ms; shared, the first thread takes most of it.
    let pool = Pool::new(2).unwrap();
    let owner_of_second = Mutex::new(std::collections::HashMap::<std::thread::ThreadId, usize>::new());
    let mut out = vec![0u8; 1024];
    let t = std::time::Instant::now();
    pool.for_cols_mut_balanced(&mut out, 1, 1024, 16, 16, |c0, _| {
        if c0 >= 512 {
            *owner_of_second.lock().unwrap().entry(std::thread::current().id()).or_default() += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let counts = owner_of_second.into_inner().unwrap();
    assert_eq!(counts.values().sum::<usize>(), 32, "the second slab's 32 pieces run once each");
    assert!(counts.len() == 2, "one thread ran the whole slow slab ({counts:?}, {:?})", t.elapsed());
}

#[test]
fn too_many_threads_is_an_error() {
    match Pool::new(1 << 21) {
        Err(PoolError::TooManyThreads { requested, max }) => assert_eq!((requested, max), (1 << 21, (1 << 20) - 1)),
        other => panic!("expected TooManyThreads, got {other:?}"),
    }
}
