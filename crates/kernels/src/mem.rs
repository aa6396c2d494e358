//! Process memory policy for the forward pass. A prefill step allocates and frees buffers of
//! tens of MB per layer (projections of 512 tokens × 6144 channels, say). glibc serves each
//! from a fresh mmap (or grows the heap) and hands it back to the kernel on free, so every
//! layer page-faults the same memory in again: 5–10% of a hybrid model's prefill went to
//! page faults, zeroing and unmapping. `keep_freed_memory` makes glibc keep freed memory for
//! reuse instead. Peak RSS is unchanged (the buffers were resident anyway); memory is returned
//! at exit.

/// Ask glibc to serve large allocations from the heap and never trim it. No-op elsewhere.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tunables; it is thread-safe in glibc and any
    // value is valid for these parameters (a refusal returns 0, which we may ignore: the
    // default policy is merely slower).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Hand the heap's free pages back to the kernel now (glibc's `malloc_trim`; no-op elsewhere).
/// For memory freed in bulk that the forward pass will not reuse soon: the prompt cache calls
/// it after evicting entries, so that the process's RSS follows the cache's budget rather than
/// keeping the evicted entries' pages (which `keep_freed_memory` otherwise would). The next
/// forward pass faults its scratch buffers in again once.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel (madvise / sbrk on chunks
    // the allocator owns and no live allocation uses); it is thread-safe in glibc and takes
    // any pad value.
    unsafe {
        libc::malloc_trim(0);
    }
}
