//! Run-time CPU feature selection. Kernels ask here once and cache the answer; every SIMD path
//! has a scalar twin that is always compiled and tested against it.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Scalar,
    /// AVX-512 F (+ FMA): 16-lane f32.
    Avx512,
}

static LEVEL: OnceLock<Level> = OnceLock::new();

/// The best SIMD level this CPU supports, unless `CORTIQ_SIMD=scalar` forces the scalar twins.
pub fn level() -> Level {
    *LEVEL.get_or_init(|| {
        if std::env::var("CORTIQ_SIMD").map(|v| v == "scalar").unwrap_or(false) {
            return Level::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                return Level::Avx512;
            }
        }
        Level::Scalar
    })
}
