//! The engine's one thread pool (kernels::pool::Pool): every parallel loop of the forward pass
//! (matvec/matmat row ranges, attention heads, norms over rows) runs on it. One process-wide
//! pool rather than one per model: the CLI sets the thread count once (`-t`), and tests that
//! load several models in parallel threads share it (the pool serializes their dispatches).
//! Starting it also sets the process's allocator policy (`kernels::mem::keep_freed_memory`).

use std::sync::OnceLock;

use cortiq_kernels::pool::{Pool, PoolError};

static POOL: OnceLock<Pool> = OnceLock::new();

/// Start the pool with `n_threads` participants (0 = the machine's available parallelism).
/// Must come before the first forward pass; a second call with a different count is an error
/// naming both counts, the same count is a no-op.
pub fn init(n_threads: usize) -> Result<(), String> {
    let want = if n_threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { n_threads };
    let mut err: Option<PoolError> = None;
    let pool = POOL.get_or_init(|| {
        cortiq_kernels::mem::keep_freed_memory();
        Pool::new(want).unwrap_or_else(|e| {
            err = Some(e);
            Pool::new(1).expect("a one-thread pool starts no thread")
        })
    });
    if let Some(e) = err {
        return Err(e.to_string());
    }
    if pool.n_threads() != want {
        return Err(format!("thread pool already running with {} threads, cannot switch to {want}", pool.n_threads()));
    }
    Ok(())
}

/// The pool (started with the machine's available parallelism on first use if `init` was not
/// called).
pub fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        cortiq_kernels::mem::keep_freed_memory();
        Pool::new(0).unwrap_or_else(|_| Pool::new(1).expect("a one-thread pool starts no thread"))
    })
}
