//! Memory read bandwidth, measured the way decode reads weights: every participant of the pool
//! streams one contiguous slab of a buffer much larger than the last-level cache, with wide
//! loads and nothing else to do. The decode roofline of a model is (bytes read per token) ÷
//! this figure; `cortiq bench` reports both in the same run as the speed it measures.

use std::time::Instant;

use crate::pool::Pool;
use crate::simd::{Level, level};

/// XOR of every word (something the loads must feed, so they are not optimized away). Scalar twin.
pub fn xor_fold_scalar(buf: &[u64]) -> u64 {
    buf.iter().fold(0, |a, &b| a ^ b)
}

/// `xor_fold_scalar` with 512-bit loads when available.
pub fn xor_fold(buf: &[u64]) -> u64 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: level() == Avx512 means avx512f was detected at run time.
        Level::Avx512 => unsafe { avx512::xor_fold(buf) },
        _ => xor_fold_scalar(buf),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support avx512f.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn xor_fold(buf: &[u64]) -> u64 {
        let n32 = buf.len() / 32 * 32;
        let p = buf.as_ptr();
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut i = 0;
        while i < n32 {
            // The same 8 KiB software prefetch as the matvec loops: without it a buffer in
            // 4 KiB pages reads at ~36 GB/s here (the hardware prefetchers stop at each page),
            // with transparent huge pages at ~63; with it, both at the latter.
            for l in 0..4 {
                let ahead = i + 8 * l + 1024;
                if ahead < buf.len() {
                    // SAFETY: `ahead` indexes inside `buf`; a prefetch never faults.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(ahead).cast()) };
                }
            }
            for (l, a) in acc.iter_mut().enumerate() {
                // SAFETY: i + 8*l + 8 <= n32 <= buf.len().
                *a = _mm512_xor_si512(*a, unsafe { _mm512_loadu_si512(p.add(i + 8 * l) as *const _) });
            }
            i += 32;
        }
        let v = _mm512_xor_si512(_mm512_xor_si512(acc[0], acc[1]), _mm512_xor_si512(acc[2], acc[3]));
        let mut lanes = [0u64; 8];
        // SAFETY: lanes is 64 bytes.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, v) };
        lanes.iter().fold(super::xor_fold_scalar(&buf[n32..]), |a, &b| a ^ b)
    }
}

/// Read bandwidth in bytes/s: the best of `reps` passes over a `bytes`-sized buffer (rounded
/// to whole slabs), split into one contiguous slab per pool participant.
pub fn read_bandwidth(pool: &Pool, bytes: usize, reps: usize) -> f64 {
    let words = (bytes / 8).max(1024);
    // Distinct values so no page is shared copy-on-write zero memory.
    let buf: Vec<u64> = (0..words as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        pool.for_ranges(words, 4096, |a, b| {
            sink.fetch_xor(xor_fold(&buf[a..b]), std::sync::atomic::Ordering::Relaxed);
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink.into_inner());
    (words * 8) as f64 / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_fold_matches_scalar() {
        for n in [0, 1, 31, 32, 33, 1000, 4099] {
            let v: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 7)).collect();
            assert_eq!(xor_fold(&v), xor_fold_scalar(&v), "n = {n}");
        }
    }
}
