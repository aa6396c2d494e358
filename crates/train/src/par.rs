//! The thread pool the f32 fast paths run on. The trainer shares one process-wide pool with the
//! engine (which computes the teacher): it installs the engine's pool with [`install`] before the
//! first op; without that, a pool over the machine's available parallelism starts on first use.

use std::sync::OnceLock;

use cortiq_kernels::pool::Pool;

static POOL: OnceLock<&'static Pool> = OnceLock::new();

/// Use `pool` for every parallel loop of this crate. Returns false (and changes nothing) when a
/// pool was already chosen, either by an earlier `install` or by first use.
pub fn install(pool: &'static Pool) -> bool {
    POOL.set(pool).is_ok()
}

/// The pool (started with the machine's available parallelism on first use unless installed).
pub fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let p = Pool::new(0).unwrap_or_else(|_| Pool::new(1).expect("a one-thread pool starts no thread"));
        Box::leak(Box::new(p))
    })
}
