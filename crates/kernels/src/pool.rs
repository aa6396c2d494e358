//! A persistent thread pool for the kernels' row-parallel loops (matvec, matmat, attention heads).
//!
//! Owns: the worker threads, the dispatch protocol (publish a job, wake, wait for completion),
//! the row-range splitting (static by default, an atomic chunk counter for uneven work), panic
//! propagation, and the inline fallback for nested calls.
//!
//! Why not rayon: decode issues a few hundred tiny parallel loops per token (~100 µs each on a
//! small model), so the per-dispatch cost matters. Rayon's work-stealing deque, its
//! sleep/wake heuristics and its job boxing cost microseconds per `par_iter`; here a dispatch is
//! one store to a generation counter that spinning workers are already watching (the design of
//! ggml's CPU threadpool, kept as plain as llama2.c's loops). `examples/pool_bench.rs` measures
//! the difference.
//!
//! Model: `n_threads - 1` persistent workers plus the calling thread, which does its share of
//! the work instead of waiting idle. A job is a number of units (one row range per thread for
//! the static split, one chunk each for the dynamic one) claimed from an atomic counter by
//! whoever is there. A call returns only when every unit is done and every worker that joined
//! has left, so closures may borrow from the caller's stack (scoped, like `std::thread::scope`).
//! Workers spin on a generation word for a bounded time after each job (the next matvec usually
//! follows within microseconds), then sleep on a condvar; the caller wakes sleepers only when
//! there are any. A worker that the OS has not scheduled by the time the caller has claimed
//! every unit is shut out of that job (it finds the gate closed), so a busy machine degrades
//! to the caller doing the work alone rather than to waiting a scheduler tick for a straggler.
//! The caller waits for workers that did join the same way: spin, then sleep until the last
//! one signals. Consequence for users: units must never wait on one another (no barriers
//! inside a job) — all of them may run on one thread.
//!
//! ```
//! use cortiq_kernels::pool::Pool;
//! let pool = Pool::new(2).unwrap();
//! let (rows, cols) = (6, 4);
//! let w: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect(); // [rows, cols]
//! let x = vec![1.0f32; cols]; // [cols]
//! let mut y = vec![0.0f32; rows]; // [rows]
//! // Each range of rows gets its own slice of y; w and x are borrowed, not moved.
//! pool.for_rows_mut(&mut y, 1, 2, |r0, ys| {
//!     for (j, yv) in ys.iter_mut().enumerate() {
//!         let r = r0 + j;
//!         *yv = w[r * cols..(r + 1) * cols].iter().zip(&x).map(|(a, b)| a * b).sum();
//!     }
//! });
//! assert_eq!(y, [6.0, 22.0, 38.0, 54.0, 70.0, 86.0]);
//! ```
//!
//! Nested calls (a task calling into a pool again) run inline on the calling thread: workers
//! cannot wait on themselves, and inner parallelism under an outer parallel loop buys nothing on
//! a handful of cores. Concurrent calls from different threads on one pool are serialized.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker (or the waiting caller) polls before sleeping, by default. Within a
/// decode step the serial gaps between parallel loops (norms, RoPE, sampling) are microseconds,
/// so workers stay hot through a whole token; after the budget they stop burning a shared core.
/// Past the first ~1,000 polls each round of polls also yields the CPU (see `spin_until`).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// Errors from creating a pool or from a task that panicked.
#[derive(Debug)]
pub enum PoolError {
    /// More threads asked for than the gate word can count.
    TooManyThreads { requested: usize, max: usize },
    /// The OS refused to start worker thread `index`.
    Spawn { index: usize, source: std::io::Error },
    /// A task panicked; the message is the panic payload when it was a string. The pool is
    /// still usable: workers catch the unwind and go back to waiting.
    TaskPanicked { message: String },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::TooManyThreads { requested, max } => write!(f, "pool: {requested} threads asked for, at most {max}"),
            PoolError::Spawn { index, source } => write!(f, "pool: cannot start worker thread {index}: {source}"),
            PoolError::TaskPanicked { message } => write!(f, "pool: a task panicked: {message}"),
        }
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Spawn { source, .. } => Some(source),
            PoolError::TaskPanicked { .. } | PoolError::TooManyThreads { .. } => None,
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

thread_local! {
    /// True on pool workers (always) and on a caller thread while it is inside a dispatch:
    /// a pool call made from such a thread runs inline (see module header).
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// Keeps the hot atomics on their own cache lines (128: adjacent-line prefetch pairs lines on
/// x86), so workers polling `gate` do not contend with participants claiming units on `next`.
#[repr(align(128))]
struct Padded<T>(T);

/// The published job: a unit index in 0..n_units -> that unit's work. The `'static` is a lie
/// told to the type system; see the SAFETY comment in `Pool::dispatch`.
type JobPtr = *const (dyn Fn(usize) + Sync + 'static);

// The gate word: | epoch (43 bits) | CLOSED (1) | workers inside the job (20) |.
const COUNT_MASK: u64 = (1 << 20) - 1;
const CLOSED: u64 = 1 << 20;
const EPOCH_SHIFT: u32 = 21;

struct Shared {
    /// One word so that "is this dispatch still open, and which one is it" and "enter it" are
    /// a single compare-exchange. A dispatch opens a new epoch with count 0; workers enter
    /// (count + 1) only while it is open, leave (count - 1) when done; the caller closes it once
    /// every unit is claimed and waits for count 0. A worker that wakes late finds it closed
    /// and never touches the job, so the caller never waits on a thread the OS has not
    /// scheduled: it just does that thread's units itself (a shared 2-core machine does this
    /// to us all the time).
    gate: Padded<AtomicU64>,
    /// Next unclaimed unit of the current job.
    next: Padded<AtomicUsize>,
    /// Units in the current job; written by the dispatcher before opening the gate.
    n_units: AtomicUsize,
    /// The current job; written only by the dispatcher while the gate is closed with count 0.
    job: UnsafeCell<Option<JobPtr>>,
    shutdown: AtomicBool,
    /// Set when a unit panicked in the current dispatch; no new units are claimed after it.
    panicked: AtomicBool,
    /// First panic payload of the current dispatch, re-raised on the caller.
    panic_payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    /// The caller is asleep (or about to sleep) on `done`.
    caller_sleeping: AtomicBool,
    /// `Pool::set_timing`: accumulate callers' waits into `wait_ns`.
    timing: AtomicBool,
    wait_ns: AtomicU64,
    /// `Pool::set_timing`: accumulate workers' time inside jobs into `busy_ns`.
    busy_ns: AtomicU64,
    done_lock: Mutex<()>,
    done: Condvar,
    spin: Duration,
}

// SAFETY: every field but `job` is Sync. `job` is an UnsafeCell accessed under a protocol:
// the dispatcher (holding `Pool::dispatch_lock`) writes it only while the gate is closed with
// no worker inside, then opens the gate with a SeqCst (release) store; a worker reads it only
// after entering through a SeqCst (acquire) compare-exchange on that open gate, and stops
// before leaving (release). The dispatcher waits for count 0 after closing before it writes
// again. Writes and reads are therefore never concurrent. The pointee is `Sync`, so sharing
// `&dyn Fn` across threads is sound.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks (tasks run outside them); tolerate poison anyway.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Claims and runs units until none are left, recording a panic instead of unwinding.
    fn run_units(&self, job: &(dyn Fn(usize) + Sync)) {
        let n_units = self.n_units.load(Ordering::Relaxed);
        let r = catch_unwind(AssertUnwindSafe(|| {
            while !self.panicked.load(Ordering::Relaxed) {
                // Relaxed: the RMW alone makes claims unique; data visibility rides on `gate`.
                let u = self.next.0.fetch_add(1, Ordering::Relaxed);
                if u >= n_units {
                    return;
                }
                job(u);
            }
        }));
        if let Err(payload) = r {
            self.panicked.store(true, Ordering::Relaxed);
            let mut slot = lock(&self.panic_payload);
            if slot.is_none() {
                *slot = Some(payload);
            }
        }
    }

    /// Spins until `cond` holds or the spin budget runs out; true if it held. The first
    /// `PURE_SPIN` polls are pure (the common case: the other side answers within a couple of
    /// microseconds); after that each round of polls also yields the CPU, because on an
    /// oversubscribed machine the thread we wait for may be queued behind us on this very core.
    fn spin_until(&self, cond: impl Fn() -> bool) -> bool {
        const PURE_SPIN: u32 = 16;
        let start = Instant::now();
        let mut rounds = 0u32;
        loop {
            // Check the clock only every 64 polls: Instant::now is ~20 ns, a poll ~1-40 ns.
            for _ in 0..64 {
                if cond() {
                    return true;
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= self.spin {
                return cond();
            }
            rounds += 1;
            if rounds > PURE_SPIN {
                std::thread::yield_now();
            }
        }
    }
}

fn worker_main(shared: Arc<Shared>) {
    IN_POOL.with(|f| f.set(true));
    crate::simd::flush_denormals();
    let sh = &*shared;
    // The gate starts at epoch 0; do not load it here, or a dispatch opened before this thread
    // first runs would be taken as already seen.
    let mut seen = 0u64;
    let epoch_of = |g: u64| g >> EPOCH_SHIFT;
    loop {
        // Wait for a new epoch: spin, then sleep.
        if !sh.spin_until(|| epoch_of(sh.gate.0.load(Ordering::Acquire)) != seen) {
            let mut guard = lock(&sh.sleep_lock);
            // Dekker pair with the dispatcher: we announce sleeping, then re-read the gate; it
            // opens the gate, then reads `sleepers`. SeqCst on all four makes at least one side
            // see the other, and we hold `sleep_lock` from the re-read until `wait` releases
            // it, so the dispatcher's notify (taken under the lock) cannot slip in between.
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while epoch_of(sh.gate.0.load(Ordering::SeqCst)) == seen {
                guard = sh.wake.wait(guard).unwrap_or_else(PoisonError::into_inner);
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        let mut g = sh.gate.0.load(Ordering::Acquire);
        seen = epoch_of(g);
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Enter the dispatch if it is still open (else we were late: nothing to do).
        let entered = loop {
            if g & CLOSED != 0 || epoch_of(g) != seen {
                break false;
            }
            match sh.gate.0.compare_exchange_weak(g, g + 1, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => break true,
                Err(now) => g = now,
            }
        };
        if !entered {
            continue;
        }
        // SAFETY: we entered the open gate (acquire), so the dispatcher's write of `job`
        // happened before this read, and it will not write `job` again or return (ending the
        // closure's borrow) until we leave below.
        let job = unsafe { (*sh.job.get()).expect("pool: gate opened without a job") };
        // SAFETY: as above, the pointee outlives this use.
        let busy_from = sh.timing.load(Ordering::Relaxed).then(Instant::now);
        sh.run_units(unsafe { &*job });
        if let Some(t0) = busy_from {
            sh.busy_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // Leave: our last access to the job is above; the release half of SeqCst publishes
        // the units' writes to the caller's acquire load of the gate.
        let prev = sh.gate.0.fetch_sub(1, Ordering::SeqCst);
        if prev & COUNT_MASK == 1 && prev & CLOSED != 0 && sh.caller_sleeping.load(Ordering::SeqCst) {
            let _g = lock(&sh.done_lock);
            sh.done.notify_one();
        }
    }
}

/// A raw output pointer shared by the units of `for_rows_mut`, each writing its own rows.
struct SendPtr<T>(*mut T);
// SAFETY: only used by `for_rows_mut`, whose units touch disjoint elements (see there).
unsafe impl<T: Send> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    /// Through a method, so closures capture the whole (Sync) wrapper, not the raw field.
    fn get(&self) -> *mut T {
        self.0
    }

    /// Columns c0..c1 of the row-major [n_rows, n_cols] buffer at the pointer: the n_rows
    /// slices `[i * n_cols + c0, i * n_cols + c1)`, disjoint from each other (different rows).
    ///
    /// # Safety
    /// The pointer addresses n_rows * n_cols live elements, c0 <= c1 <= n_cols, and no other
    /// reference to these elements exists while the slices live (the callers hand each column
    /// range to one call only and outlive every call).
    unsafe fn col_pieces<'a>(&self, n_rows: usize, n_cols: usize, c0: usize, c1: usize) -> Vec<&'a mut [T]> {
        (0..n_rows)
            // SAFETY: row i's piece lies inside the buffer (the contract above) and the rows'
            // pieces do not overlap; exclusivity is the caller's promise.
            .map(|i| unsafe { std::slice::from_raw_parts_mut(self.get().add(i * n_cols + c0), c1 - c0) })
            .collect()
    }
}

/// A fixed set of `n_threads - 1` workers plus the calling thread. See the module header.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// Serializes dispatches from different threads sharing one pool.
    dispatch_lock: Mutex<()>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("n_threads", &self.n_threads).field("spin", &self.shared.spin).finish()
    }
}

impl Pool {
    /// A pool of `n_threads` participants (the caller plus `n_threads - 1` workers), spinning
    /// `DEFAULT_SPIN` before sleeping. `n_threads == 0` means the machine's available
    /// parallelism; `1` starts no threads and runs everything inline.
    pub fn new(n_threads: usize) -> Result<Pool, PoolError> {
        Pool::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// As `new`, with the spin budget given: how long an idle worker (or the waiting caller)
    /// polls before sleeping. `Duration::ZERO` sleeps at once (lowest CPU use, slowest wake).
    pub fn with_spin(n_threads: usize, spin: Duration) -> Result<Pool, PoolError> {
        let n_threads = if n_threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { n_threads };
        let max = COUNT_MASK as usize;
        if n_threads > max {
            return Err(PoolError::TooManyThreads { requested: n_threads, max });
        }
        let shared = Arc::new(Shared {
            gate: Padded(AtomicU64::new(CLOSED)),
            next: Padded(AtomicUsize::new(0)),
            n_units: AtomicUsize::new(0),
            job: UnsafeCell::new(None),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            panic_payload: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            timing: AtomicBool::new(false),
            wait_ns: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            spin,
        });
        let mut pool = Pool { shared, workers: Vec::with_capacity(n_threads - 1), n_threads, dispatch_lock: Mutex::new(()) };
        for ith in 1..n_threads {
            let s = Arc::clone(&pool.shared);
            let handle = std::thread::Builder::new()
                .name(format!("cortiq-pool-{ith}"))
                .spawn(move || worker_main(s))
                .map_err(|source| PoolError::Spawn { index: ith, source })?;
            // On error, `pool` drops here and joins the workers already started.
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Number of participants (workers + the caller).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Measure (`true`) or not (the default) how long callers wait for workers after finishing
    /// their own share of a job: the load imbalance and wake-up latency a profile reports as
    /// "pool wait". Off, the cost is one relaxed load per dispatch.
    pub fn set_timing(&self, on: bool) {
        self.shared.timing.store(on, Ordering::Relaxed);
    }

    /// Nanoseconds callers spent waiting for workers since the last `take_wait_nanos` (0 unless
    /// timing is on).
    pub fn take_wait_nanos(&self) -> u64 {
        self.shared.wait_ns.swap(0, Ordering::Relaxed)
    }

    /// Nanoseconds the workers (not the caller) spent running jobs since the last
    /// `take_busy_nanos`, summed over workers (0 unless timing is on). Wall time times
    /// `n_threads - 1` minus this is the workers' idle time: the caller's serial sections and
    /// its own share of the jobs running past theirs.
    pub fn take_busy_nanos(&self) -> u64 {
        self.shared.busy_ns.swap(0, Ordering::Relaxed)
    }

    /// Calls `f(ith, nth)` once for each `ith` in `0..nth`, ggml style: the closure splits the
    /// work itself. `nth` is `n_threads`, or 1 when running inline (nested call or
    /// single-threaded pool). Each `ith` runs exactly once, usually each on its own thread,
    /// but a late worker's `ith` is done by whoever is free (the caller, typically), so do not
    /// assume one thread per `ith`. Returns when all are done; re-raises a task's panic here.
    pub fn broadcast<F: Fn(usize, usize) + Sync>(&self, f: F) {
        let r = if self.parallel_here() {
            let nth = self.n_threads;
            self.dispatch(nth, &|ith| f(ith, nth))
        } else {
            catch_unwind(AssertUnwindSafe(|| f(0, 1)))
        };
        if let Err(p) = r {
            resume_unwind(p);
        }
    }

    /// Calls `f(i)` for every task index in `0..n_tasks` exactly once, tasks handed out one at a
    /// time from an atomic counter (suits uneven tasks: attention heads, experts). Re-raises a
    /// task's panic on the caller.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        self.for_ranges_dynamic(n_tasks, 1, |start, end| (start..end).for_each(&f));
    }

    /// As `run`, returning a panic as `PoolError::TaskPanicked` instead of unwinding.
    pub fn try_run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) -> Result<(), PoolError> {
        self.try_for_ranges_dynamic(n_tasks, 1, |start, end| (start..end).for_each(&f))
    }

    /// Splits `0..n_rows` into one contiguous range per participant, boundaries on multiples of
    /// `grain` (e.g. the rows a SIMD kernel handles at once), and calls `f(start, end)` once per
    /// non-empty range. Every row is covered exactly once. Static split: the right choice for
    /// uniform rows (matvec), each thread streaming one contiguous slab of weights (a worker
    /// that has not woken by the time the caller finishes its slab gets its slab taken by the
    /// caller). Work that fits in one grain runs inline without waking anyone. Re-raises a
    /// task's panic.
    pub fn for_ranges<F: Fn(usize, usize) + Sync>(&self, n_rows: usize, grain: usize, f: F) {
        if let Err(e) = self.for_ranges_impl(n_rows, grain, &f) {
            resume_unwind(e);
        }
    }

    /// `for_ranges` over an output slice: `out` holds rows of `row_len` elements (the last may
    /// be short), split as `for_ranges` splits rows, and `f(first_row, rows)` gets each range's
    /// rows as its own `&mut` sub-slice. The safe way to write a matvec's or matmat's output
    /// in parallel. `row_len == 0` does nothing. Re-raises a task's panic.
    pub fn for_rows_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(&self, out: &mut [T], row_len: usize, grain: usize, f: F) {
        if row_len == 0 {
            return;
        }
        let len = out.len();
        let base = SendPtr(out.as_mut_ptr());
        self.for_ranges(len.div_ceil(row_len), grain, |r0, r1| {
            let (a, b) = (r0 * row_len, (r1 * row_len).min(len));
            // SAFETY: `for_ranges` hands out disjoint row ranges, each once, all inside `out`
            // (a <= b <= len), and does not return before every call is done, so each
            // sub-slice is the only live reference to its elements while `out` is borrowed
            // mutably by this function. T: Send because the elements are written from other
            // threads.
            let rows = unsafe { std::slice::from_raw_parts_mut(base.get().add(a), b - a) };
            f(r0, rows);
        });
    }

    /// `for_ranges` over the columns of a row-major [n_rows, n_cols] output: `f(c0, pieces)`
    /// gets, for its range c0..c1 of columns (boundaries on multiples of `grain`), the n_rows
    /// pieces `out[i * n_cols + c0..i * n_cols + c1]` as disjoint `&mut` slices. The batched
    /// decode's output: k sequences' rows side by side, each thread writing its weight rows'
    /// results straight into every sequence's row (no [rows, k] buffer and transpose).
    /// Re-raises a task's panic.
    pub fn for_cols_mut<T: Send, F: Fn(usize, &mut [&mut [T]]) + Sync>(
        &self,
        out: &mut [T],
        n_rows: usize,
        n_cols: usize,
        grain: usize,
        f: F,
    ) {
        assert_eq!(out.len(), n_rows * n_cols, "for_cols_mut: {} elements for {n_rows} x {n_cols}", out.len());
        if n_rows == 0 || n_cols == 0 {
            return;
        }
        let base = SendPtr(out.as_mut_ptr());
        self.for_ranges(n_cols, grain, |c0, c1| {
            // SAFETY: `for_ranges` hands out disjoint column ranges c0..c1 <= n_cols, each
            // once, and returns only after every call is done; `out` has n_rows * n_cols
            // elements (asserted) and stays borrowed mutably by this function meanwhile.
            let mut pieces = unsafe { base.col_pieces(n_rows, n_cols, c0, c1) };
            f(c0, &mut pieces);
        });
    }

    /// `for_cols_mut` with the static split's tail balanced: each participant's slab of columns
    /// is cut into pieces of `piece` columns (a multiple of `grain`); the owner takes its
    /// pieces front to back, and a participant whose slab is done takes the other slabs'
    /// pieces from the back (one compare-and-swap per piece). A streaming kernel keeps
    /// reading one contiguous slab, as with the static split, while a slower core (a shared
    /// one, a late start) no longer leaves the others waiting for its last rows. `f` may be
    /// called several times per thread, with any column range of whole grains. Re-raises a
    /// task's panic.
    pub fn for_cols_mut_balanced<T: Send, F: Fn(usize, &mut [&mut [T]]) + Sync>(
        &self,
        out: &mut [T],
        n_rows: usize,
        n_cols: usize,
        grain: usize,
        piece: usize,
        f: F,
    ) {
        assert_eq!(out.len(), n_rows * n_cols, "for_cols_mut_balanced: {} elements for {n_rows} x {n_cols}", out.len());
        if n_rows == 0 || n_cols == 0 {
            return;
        }
        let grain = grain.max(1);
        let piece = piece.div_ceil(grain).max(1) * grain;
        let n_chunks = n_cols.div_ceil(grain);
        let nth = self.n_threads.min(n_chunks);
        // Slab t: columns [start(t), start(t + 1)), as `for_ranges` splits them.
        let start = |t: usize| (t * n_chunks / nth * grain).min(n_cols);
        let pieces_of = |t: usize| (start(t + 1) - start(t)).div_ceil(piece);
        if nth <= 1 || !self.parallel_here() || (0..nth).all(|t| pieces_of(t) <= 1) {
            // One piece per slab: nothing to balance.
            return self.for_cols_mut(out, n_rows, n_cols, grain, f);
        }
        let base = SendPtr(out.as_mut_ptr());
        // Per slab: the next piece from the front (low 32 bits) and one past the last
        // unclaimed piece (high 32 bits); a claim moves one end, they meet when all is taken.
        let ends: Vec<AtomicU64> = (0..nth).map(|t| AtomicU64::new((pieces_of(t) as u64) << 32)).collect();
        let claim = |t: usize, front: bool| -> Option<usize> {
            let mut cur = ends[t].load(Ordering::Relaxed);
            loop {
                let (lo, hi) = (cur & 0xFFFF_FFFF, cur >> 32);
                if lo >= hi {
                    return None;
                }
                let (next, got) = if front { (cur + 1, lo) } else { (cur - (1 << 32), hi - 1) };
                // Relaxed: a claim only has to be unique; the data rides on the dispatch.
                match ends[t].compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(got as usize),
                    Err(now) => cur = now,
                }
            }
        };
        let run_piece = |t: usize, p: usize| {
            let c0 = start(t) + p * piece;
            let c1 = (c0 + piece).min(start(t + 1));
            // SAFETY: each (slab, piece) is claimed exactly once (the compare-and-swap above
            // hands every index out once, from either end), pieces and slabs are disjoint
            // column ranges c0..c1 <= n_cols, the dispatch returns only after every call is
            // done, and `out` has n_rows * n_cols elements (asserted), borrowed mutably here.
            let mut pieces = unsafe { base.col_pieces(n_rows, n_cols, c0, c1) };
            f(c0, &mut pieces);
        };
        let r = self.dispatch(nth, &|ith| {
            while let Some(p) = claim(ith, true) {
                run_piece(ith, p);
            }
            for t in (1..nth).map(|d| (ith + d) % nth) {
                while let Some(p) = claim(t, false) {
                    run_piece(t, p);
                }
            }
        });
        if let Err(e) = r {
            resume_unwind(e);
        }
    }

    /// `for_ranges_dynamic` over an output slice: rows of `row_len` elements handed out in
    /// chunks of `grain` rows from an atomic counter, each chunk as its own `&mut` sub-slice
    /// (uneven rows: causal attention, where later positions see more keys). Re-raises a
    /// task's panic.
    pub fn for_rows_mut_dynamic<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        out: &mut [T],
        row_len: usize,
        grain: usize,
        f: F,
    ) {
        if row_len == 0 {
            return;
        }
        let len = out.len();
        let base = SendPtr(out.as_mut_ptr());
        self.for_ranges_dynamic(len.div_ceil(row_len), grain, |r0, r1| {
            let (a, b) = (r0 * row_len, (r1 * row_len).min(len));
            // SAFETY: as in `for_rows_mut`: `for_ranges_dynamic` hands out disjoint chunks, each
            // once, all inside `out`, and returns only after every call is done.
            let rows = unsafe { std::slice::from_raw_parts_mut(base.get().add(a), b - a) };
            f(r0, rows);
        });
    }

    /// As `for_ranges`, returning a panic as `PoolError::TaskPanicked`.
    pub fn try_for_ranges<F: Fn(usize, usize) + Sync>(&self, n_rows: usize, grain: usize, f: F) -> Result<(), PoolError> {
        self.for_ranges_impl(n_rows, grain, &f).map_err(|p| PoolError::TaskPanicked { message: panic_message(&*p) })
    }

    /// Splits `0..n_rows` into chunks of `grain` rows (the last may be shorter) handed out from
    /// an atomic counter: participants that finish early take more (uneven work, or a core
    /// shared with another process). Calls `f(start, end)` once per chunk. Re-raises a panic;
    /// after a panic no new chunks are handed out.
    pub fn for_ranges_dynamic<F: Fn(usize, usize) + Sync>(&self, n_rows: usize, grain: usize, f: F) {
        if let Err(e) = self.for_ranges_dynamic_impl(n_rows, grain, &f) {
            resume_unwind(e);
        }
    }

    /// As `for_ranges_dynamic`, returning a panic as `PoolError::TaskPanicked`.
    pub fn try_for_ranges_dynamic<F: Fn(usize, usize) + Sync>(&self, n_rows: usize, grain: usize, f: F) -> Result<(), PoolError> {
        self.for_ranges_dynamic_impl(n_rows, grain, &f).map_err(|p| PoolError::TaskPanicked { message: panic_message(&*p) })
    }

    fn for_ranges_impl(&self, n_rows: usize, grain: usize, f: &(dyn Fn(usize, usize) + Sync)) -> Result<(), Box<dyn Any + Send>> {
        let grain = grain.max(1);
        let n_chunks = n_rows.div_ceil(grain);
        if n_chunks == 0 {
            return Ok(());
        }
        if n_chunks == 1 || !self.parallel_here() {
            return catch_unwind(AssertUnwindSafe(|| f(0, n_rows)));
        }
        let nth = self.n_threads.min(n_chunks);
        self.dispatch(nth, &|ith| {
            // Chunks [ith*C/nth, (ith+1)*C/nth): balanced to within one chunk, never empty.
            let c0 = ith * n_chunks / nth;
            let c1 = (ith + 1) * n_chunks / nth;
            f(c0 * grain, (c1 * grain).min(n_rows));
        })
    }

    fn for_ranges_dynamic_impl(
        &self,
        n_rows: usize,
        grain: usize,
        f: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<(), Box<dyn Any + Send>> {
        let grain = grain.max(1);
        let n_chunks = n_rows.div_ceil(grain);
        if n_chunks == 0 {
            return Ok(());
        }
        if n_chunks == 1 || !self.parallel_here() {
            // Inline: same chunk calls as the parallel path, so callers see one contract.
            return catch_unwind(AssertUnwindSafe(|| {
                for c in 0..n_chunks {
                    f(c * grain, ((c + 1) * grain).min(n_rows));
                }
            }));
        }
        self.dispatch(n_chunks, &|c| f(c * grain, ((c + 1) * grain).min(n_rows)))
    }

    /// False when a call here must run inline: single-threaded pool, or already inside a pool
    /// task / dispatch on this thread.
    fn parallel_here(&self) -> bool {
        self.n_threads > 1 && !IN_POOL.with(|c| c.get())
    }

    /// Publishes `job` over units `0..n_units`, claims units here alongside the workers, closes
    /// the gate once all are claimed, waits for the workers that entered, and returns the first
    /// panic payload. Never returns (or unwinds) before every worker is done with `job`.
    fn dispatch(&self, n_units: usize, job: &(dyn Fn(usize) + Sync)) -> Result<(), Box<dyn Any + Send>> {
        let sh = &*self.shared;
        let guard = lock(&self.dispatch_lock);
        IN_POOL.with(|c| c.set(true));
        // The gate is closed with count 0 here: the previous dispatch (or `new`) left it so,
        // and we hold `dispatch_lock`.
        let g = sh.gate.0.load(Ordering::Relaxed);
        debug_assert!(g & CLOSED != 0 && g & COUNT_MASK == 0, "pool: gate {g:#x} not idle");
        sh.panicked.store(false, Ordering::Relaxed);
        sh.next.0.store(0, Ordering::Relaxed);
        sh.n_units.store(n_units, Ordering::Relaxed);
        let ptr: *const (dyn Fn(usize) + Sync + '_) = job;
        // SAFETY (the scoped-borrow argument): we erase the closure's lifetime so workers can
        // hold a pointer to it. A worker dereferences it only between entering the gate we
        // open below (count + 1 while open) and leaving (count - 1). This function does not
        // return until it has closed the gate, so no worker can enter any more, and then
        // observed count 0 (acquire), so every worker that entered has left; and nothing
        // between here and that wait can unwind: our own units run under `catch_unwind` in
        // `run_units`, and the rest is atomics and poison-tolerant locks. So every use of the
        // pointer happens-before we return and the borrow of `job` ends. The gate is closed
        // with count 0 now, so no worker is reading `job` while we overwrite it.
        unsafe {
            let ptr: JobPtr = std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), JobPtr>(ptr);
            *sh.job.get() = Some(ptr);
        }
        // Open: new epoch, CLOSED clear, count 0. SeqCst: the release half publishes job,
        // next and n_units; the total order pairs with the workers' sleep check.
        sh.gate.0.store(((g >> EPOCH_SHIFT) + 1) << EPOCH_SHIFT, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&sh.sleep_lock);
            sh.wake.notify_all();
        }

        sh.run_units(job);
        let wait_from = sh.timing.load(Ordering::Relaxed).then(Instant::now);

        // Every unit is claimed (or a panic stopped claiming): close the gate so late workers
        // stay out, then wait for those inside: spin, then sleep until the last one signals.
        let g = sh.gate.0.fetch_or(CLOSED, Ordering::SeqCst);
        if g & COUNT_MASK != 0 && !sh.spin_until(|| sh.gate.0.load(Ordering::Acquire) & COUNT_MASK == 0) {
            let mut d = lock(&sh.done_lock);
            // Dekker pair with the last worker's leave (see worker_main).
            sh.caller_sleeping.store(true, Ordering::SeqCst);
            while sh.gate.0.load(Ordering::SeqCst) & COUNT_MASK != 0 {
                d = sh.done.wait(d).unwrap_or_else(PoisonError::into_inner);
            }
            sh.caller_sleeping.store(false, Ordering::SeqCst);
        }
        if let Some(t0) = wait_from {
            sh.wait_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        // SAFETY: the gate is closed and empty: no worker holds the pointer; clear it.
        unsafe { *sh.job.get() = None };
        IN_POOL.with(|c| c.set(false));
        let payload = lock(&sh.panic_payload).take();
        drop(guard);
        match payload {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }
}

impl Drop for Pool {
    /// Stops and joins every worker. No dispatch can be in flight (`&mut self`).
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::SeqCst);
        // A new epoch with the gate closed: workers wake, see `shutdown`, and exit.
        let g = sh.gate.0.load(Ordering::Relaxed);
        sh.gate.0.store((((g >> EPOCH_SHIFT) + 1) << EPOCH_SHIFT) | CLOSED, Ordering::SeqCst);
        {
            let _g = lock(&sh.sleep_lock);
            sh.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            // A worker never unwinds (tasks are caught), so join errors cannot carry news.
            let _ = h.join();
        }
    }
}
