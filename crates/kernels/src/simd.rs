//! Run-time CPU feature selection. Kernels ask here once and cache the answer; every SIMD path
//! has a scalar twin that is always compiled and tested against it.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Scalar,
    /// AVX-512 F (+ FMA): 16-lane f32.
    Avx512,
    /// AVX2 + FMA + F16C, no AVX-512 (Zen 1-3, Intel client cores since Alder Lake): 8-lane
    /// kernels where they are written (each the same arithmetic as its scalar twin, bit for
    /// bit); the rest run their scalar twins.
    Avx2,
}

static LEVEL: OnceLock<Level> = OnceLock::new();

/// The best SIMD level this CPU supports, capped by `CORTIQ_SIMD`: `scalar` forces the scalar
/// twins; `avx2` runs the AVX2 tier on a CPU that also has AVX-512 (the proxy for the AVX2
/// machines most people own: every kernel then takes the path such a CPU takes); `avx512` or
/// unset, the best the CPU has. A level the CPU lacks falls back to the best it has. Any other
/// value is refused with a warning on stderr (once) and ignored.
pub fn level() -> Level {
    *LEVEL.get_or_init(|| {
        let cap = match std::env::var("CORTIQ_SIMD").as_deref() {
            Err(_) | Ok("") | Ok("avx512") | Ok("auto") => Level::Avx512,
            Ok("avx2") => Level::Avx2,
            Ok("scalar") => Level::Scalar,
            Ok(other) => {
                eprintln!("warning: CORTIQ_SIMD={other:?} is not one of scalar, avx2, avx512: ignored");
                Level::Avx512
            }
        };
        if cap == Level::Scalar {
            return Level::Scalar;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if cap == Level::Avx512 && std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
                return Level::Avx512;
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return Level::Avx2;
            }
        }
        Level::Scalar
    })
}

static AVX512BW: OnceLock<bool> = OnceLock::new();

/// `Level::Avx512` plus AVX-512 BW and VL (byte/word lanes and masked 128/256-bit ops) and F16C:
/// what the block dequantizers in `quant::dequant_avx512` need. Every AVX-512 CPU shipped since
/// Skylake-SP has all of them; Knights Landing (F without BW) falls back to the scalar twins.
/// False whenever `level()` is `Scalar`, so `CORTIQ_SIMD=scalar` turns these kernels off too.
pub fn avx512bw() -> bool {
    *AVX512BW.get_or_init(|| {
        if level() != Level::Avx512 {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vl")
                && std::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Flush denormal results and treat denormal inputs as zero (MXCSR FTZ + DAZ) on the calling
/// thread. The recurrent mixers decay their states by e^{g} per token; with strong decay the
/// values sink below f32's normal range (1.2e-38), and x86 cores take a microcode assist on
/// every denormal operand, tens of times slower: a random Qwen3.5-geometry prefill spent most
/// of its time there. Values that small are zero for every result the engine produces (the
/// parity tests are unchanged). The engine sets this on its pool threads and on the thread
/// that runs a forward pass.
pub fn flush_denormals() {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(deprecated)]
        // SAFETY: reading and writing MXCSR only changes this thread's float environment; FTZ
        // (bit 15) and DAZ (bit 6) are defined on every x86-64 CPU with SSE2 (all of them).
        unsafe {
            use std::arch::x86_64::{_mm_getcsr, _mm_setcsr};
            _mm_setcsr(_mm_getcsr() | 0x8040);
        }
    }
}
