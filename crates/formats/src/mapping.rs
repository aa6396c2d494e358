//! Read-only memory maps of model files, shared by the GGUF, .cmf and safetensors readers.
//! Decode streams every weight once per token, so the maps ask the kernel for huge pages
//! (`MADV_HUGEPAGE`: where the kernel backs read-only file mappings with them, each 2 MiB page
//! costs one TLB entry instead of 512 and the hardware prefetchers run across it). The advice
//! is best effort: refusing it changes speed, never results.
//!
//! `WeightBytes` is what a loaded tensor points into (a map or an owned buffer); a map can give
//! back the pages of a range the engine has copied into a layout of its own.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use memmap2::Mmap;

use crate::FormatError;

/// Map `file` (opened from `path`, named in errors) read-only.
pub(crate) fn map_readonly(file: &File, path: &Path) -> Result<Mmap, FormatError> {
    // SAFETY: a read-only map of a file cortiq does not modify while mapped (writers rename a
    // new file into place rather than writing over an existing one); as with every mmap-based
    // loader, a concurrent external truncation is outside what we can defend against.
    let mmap = unsafe { Mmap::map(file) }.map_err(|e| FormatError::io(path, e))?;
    #[cfg(target_os = "linux")]
    {
        let _ = mmap.advise(memmap2::Advice::HugePage);
    }
    Ok(mmap)
}

/// How the page cache holds a mapped file's bytes, from a sample of 2 MiB windows
/// (`WeightBytes::page_share`): of `windows` sampled windows wholly in the cache, `huge` are
/// held in one 2 MiB page each (mapped by a single page-table entry), the rest in smaller pages.
///
/// Why it matters: decode streams a mixture's routed experts straight from the map, and 4 KiB
/// pages read more slowly than 2 MiB ones (a page walk per 4 KiB, the hardware prefetchers
/// stopping at every page boundary): on 2026-12-07 (Intel Xeon Emerald Rapids, AVX-512, 2
/// threads) a plain read of random 0.9 MB expert matrices ran at 19 GB/s from 4 KiB pages of
/// the map against 31 from anonymous huge pages (`examples/expert_stream FILE read`), and the
/// full-size Qwen3-30B-A3B-shaped decode ran 7% slower (BENCHMARKS.md). Which one a file gets is decided when its pages enter the cache: a
/// read through cortiq's map (huge pages asked for) or a large sequential read brings them in as
/// 2 MiB pages, while a file just written in small pieces (a download, a converter) stays
/// cached in small ones until the cache lets it go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageShare {
    pub windows: usize,
    pub huge: usize,
}

/// Both counts added (shares of several maps).
impl std::ops::Add for PageShare {
    type Output = PageShare;
    fn add(self, o: PageShare) -> PageShare {
        PageShare { windows: self.windows + o.windows, huge: self.huge + o.huge }
    }
}

/// Give the memory allocator's free pages back to the system, after a model's owned weights
/// (each matrix its own buffer, mostly a few MiB) were dropped: glibc's malloc keeps freed heap
/// memory for reuse, so a server that unloads a model would stay at its resident size
/// (measured: Qwen2.5-Coder-0.5B unloaded, 300 of its 485 MiB still resident). A no-op
/// elsewhere.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases pages the allocator holds free; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether this process may see how the page cache holds `path`: Linux's `mincore` reports a
/// file map's pages only for files the process could open for writing (its owner's, or
/// writable to it), and calls every page resident otherwise. `WeightBytes::page_share` and
/// `missing_bytes` mean nothing where this is false.
pub fn page_cache_visible(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid only reads the process's credentials.
        let euid = unsafe { libc::geteuid() };
        let owner = std::fs::metadata(path).is_ok_and(|m| m.uid() == euid);
        let writable = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            // SAFETY: a NUL-terminated path; access only checks permissions.
            .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0);
        owner || writable
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

/// The bytes a loaded tensor points into: a read-only file map or an owned buffer.
pub trait WeightBytes: Send + Sync {
    fn bytes(&self) -> &[u8];

    /// Whether the bytes are a file's map (page cache pages) rather than owned memory.
    fn is_file_map(&self) -> bool {
        false
    }

    /// The bytes of `range` will not be read again soon (the engine keeps its own copy of
    /// them): a map drops those pages from the process's resident memory, which the next read
    /// would fault back in from the file; an owned buffer ignores it. Best effort.
    fn release(&self, _range: Range<usize>) {}

    /// Keep the pages of `range` in memory (`mlock`, llama.cpp's `--mlock`): the kernel may
    /// then neither drop them (page-cache pressure, proactive reclaim) nor page them out, so a
    /// large model's cold experts are not read from disk again. An owned buffer is anonymous
    /// memory already and returns Ok.
    fn lock(&self, _range: Range<usize>) -> std::io::Result<()> {
        Ok(())
    }

    /// Bring the pages of `range` of a file map into memory now and map them
    /// (`MADV_POPULATE_READ`): what is not in the page cache is read from the file, through the
    /// map's huge-page advice (so a cold file comes in as 2 MiB pages). Owned bytes: Ok.
    fn populate(&self, _range: Range<usize>) -> std::io::Result<()> {
        Ok(())
    }

    /// Bytes of `range` of a file map that are not in the page cache (`mincore`); 0 for owned
    /// bytes or where it cannot be told.
    fn missing_bytes(&self, _range: Range<usize>) -> usize {
        0
    }

    /// How the page cache holds the bytes of `ranges` of a file map, from up to `max_windows`
    /// 2 MiB windows spread over them (`PageShare`); `None` for owned bytes, or where it cannot
    /// be told (not Linux, no `/proc`, a map not aligned to 2 MiB). Each sampled window in the
    /// cache is touched once and released again: no byte changes, nothing is read from disk.
    fn page_share(&self, _ranges: &[Range<usize>], _max_windows: usize) -> Option<PageShare> {
        None
    }
}

impl WeightBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl WeightBytes for Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn is_file_map(&self) -> bool {
        true
    }

    fn release(&self, range: Range<usize>) {
        // whole pages inside the range only (the map starts on a page boundary)
        const PAGE: usize = 4096;
        let (start, end) = (range.start.div_ceil(PAGE) * PAGE, range.end.min(self.len()) / PAGE * PAGE);
        if start < end {
            // SAFETY: this map is read-only and private (`map_readonly`): its pages are never
            // written, so dropping them loses nothing — a later read faults the same bytes back
            // in from the file (the map's standing assumption that the file is not modified
            // under it). The range lies inside the map. An error (e.g. another page size) only
            // means the pages stay resident.
            let _ = unsafe { self.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start) };
        }
    }

    fn lock(&self, range: Range<usize>) -> std::io::Result<()> {
        // every page the range touches (the map starts on a page boundary)
        const PAGE: usize = 4096;
        let (start, end) = (range.start / PAGE * PAGE, range.end.min(self.len()).div_ceil(PAGE) * PAGE);
        let end = end.min(self.len().div_ceil(PAGE) * PAGE);
        if start >= end {
            return Ok(());
        }
        // SAFETY: mlock only pins pages of this live mapping (start..end lies within its
        // page-rounded length); it reads nothing through the pointer and changes no byte.
        let rc = unsafe { libc::mlock(self.as_ptr().add(start).cast(), end - start) };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    }

    fn populate(&self, range: Range<usize>) -> std::io::Result<()> {
        let end = range.end.min(self.len());
        if range.start >= end {
            return Ok(());
        }
        #[cfg(target_os = "linux")]
        {
            self.advise_range(memmap2::Advice::PopulateRead, range.start, end - range.start)
        }
        #[cfg(not(target_os = "linux"))]
        {
            // a read of one byte per page does the same
            let sum = self[range.start..end].iter().step_by(4096).fold(0u8, |s, &b| s ^ b);
            std::hint::black_box(sum);
            Ok(())
        }
    }

    fn missing_bytes(&self, range: Range<usize>) -> usize {
        #[cfg(target_os = "linux")]
        {
            probe::missing_bytes(self, range)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = range;
            0
        }
    }

    fn page_share(&self, ranges: &[Range<usize>], max_windows: usize) -> Option<PageShare> {
        #[cfg(target_os = "linux")]
        {
            probe::page_share(self, ranges, max_windows)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (ranges, max_windows);
            None
        }
    }
}

/// `WeightBytes::page_share` for a map on Linux: the windows' residency from `mincore`, then
/// one read in each resident window, and the growth of the map's `FilePmdMapped` in
/// `/proc/self/smaps` counts the windows the kernel could map with one 2 MiB entry, which it
/// does exactly when the cache holds the window as one 2 MiB page (the map's huge-page advice
/// and 2 MiB alignment allowing it).
#[cfg(target_os = "linux")]
mod probe {
    use super::PageShare;
    use memmap2::Mmap;
    use std::ops::Range;

    const WIN: usize = 2 << 20;

    /// The kernel's page size (4 KiB on x86, 16 or 64 KiB on some ARM kernels).
    fn page() -> usize {
        // SAFETY: sysconf reads a system constant.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as usize } else { 4096 }
    }

    pub(super) fn page_share(map: &Mmap, ranges: &[Range<usize>], max_windows: usize) -> Option<PageShare> {
        let base = map.as_ptr() as usize;
        if !base.is_multiple_of(WIN) || max_windows == 0 {
            return None;
        }
        // every whole window inside the ranges, then an even sample of them
        let all: Vec<usize> = ranges
            .iter()
            .flat_map(|r| {
                let end = r.end.min(map.len());
                (r.start.div_ceil(WIN)..end / WIN).map(|w| w * WIN)
            })
            .collect();
        let step = all.len().div_ceil(max_windows).max(1);
        let resident: Vec<usize> = all.iter().step_by(step).copied().filter(|&w| in_cache(map, w)).collect();
        if resident.is_empty() {
            return Some(PageShare::default());
        }
        // unmapped first (a window this process maps already would not grow the count)
        release(map, &resident);
        let before = pmd_mapped_kb(base)?;
        for &w in &resident {
            // SAFETY: w + WIN <= map.len(), so the byte lies inside this live read-only map;
            // a volatile read of a u8 has no alignment requirement and changes nothing.
            unsafe { std::ptr::read_volatile(map.as_ptr().add(w)) };
        }
        let after = pmd_mapped_kb(base)?;
        release(map, &resident);
        let huge = (after.saturating_sub(before) as usize * 1024 / WIN).min(resident.len());
        Some(PageShare { windows: resident.len(), huge })
    }

    /// Bytes of the pages `range` touches that `mincore` finds outside the page cache.
    pub(super) fn missing_bytes(map: &Mmap, range: Range<usize>) -> usize {
        let page = page();
        let (start, end) = (range.start / page * page, range.end.min(map.len()));
        if start >= end {
            return 0;
        }
        let mut v = vec![0u8; (end - start).div_ceil(page)];
        // SAFETY: mincore reads no byte of the map; start..end lies inside it (start on a page
        // boundary, as the map's start is) and `v` has one byte per page of it.
        let rc = unsafe { libc::mincore(map.as_ptr().add(start) as *mut libc::c_void, end - start, v.as_mut_ptr()) };
        if rc != 0 {
            // not told: all of it, so a memory check on it errs on the safe side
            return end - start;
        }
        v.iter().filter(|b| *b & 1 == 0).count() * page
    }

    /// Unmap the windows at `ws` from this process (the page cache keeps them).
    fn release(map: &Mmap, ws: &[usize]) {
        for &w in ws {
            // SAFETY: as `WeightBytes::release`: a private read-only map's pages are never
            // written, so unmapping a window loses nothing; the window lies inside the map.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, w, WIN) };
        }
    }

    /// Whether every page of the window at `w` is in the page cache.
    fn in_cache(map: &Mmap, w: usize) -> bool {
        let mut v = vec![0u8; WIN.div_ceil(page())];
        // SAFETY: mincore reads no byte of the map; the window lies inside it (whole pages,
        // the map starts on a page boundary) and `v` has one byte per page.
        let rc = unsafe { libc::mincore(map.as_ptr().add(w) as *mut libc::c_void, WIN, v.as_mut_ptr()) };
        rc == 0 && v.iter().all(|b| b & 1 == 1)
    }

    /// `FilePmdMapped` (kB) of the mapping starting at `base`, from `/proc/self/smaps`.
    fn pmd_mapped_kb(base: usize) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        vma_field(&smaps, base, "FilePmdMapped:")
    }

    /// The value of `field` (kB) in the smaps entry of the mapping starting at `base`.
    pub(super) fn vma_field(smaps: &str, base: usize, field: &str) -> Option<u64> {
        let head = format!("{base:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        lines.next()?;
        lines
            // a field line's first word is its name and a colon; a mapping's is its address range
            .take_while(|l| l.split_whitespace().next().is_some_and(|w| w.ends_with(':')))
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    #[cfg(test)]
    mod tests {
        use super::super::{WeightBytes, map_readonly};
        use super::{WIN, vma_field};

        #[test]
        fn the_probe_counts_resident_windows_and_leaves_no_trace() {
            let dir = std::env::temp_dir().join(format!("cortiq-pages-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let path = dir.join("w.bin");
            // 8 windows written in whole 4 MiB pieces: in the page cache (mincore sees them)
            let piece: Vec<u8> = (0..2 * WIN).map(|i| (i % 251) as u8).collect();
            let mut bytes = Vec::new();
            for _ in 0..4 {
                bytes.extend_from_slice(&piece);
            }
            std::fs::write(&path, &bytes).expect("write");
            let f = std::fs::File::open(&path).expect("open");
            let map = map_readonly(&f, &path).expect("map");
            let first = map.page_share(&[0..map.len()], 4);
            let again = map.page_share(&[0..map.len()], 4);
            if let Some(s) = first {
                // the map is 2 MiB-aligned and /proc readable: 4 of the 8 windows sampled, each
                // resident (just written), huge or not as the kernel chose
                assert_eq!(s.windows, 4, "{s:?}");
                assert!(s.huge <= s.windows, "{s:?}");
                // released again: a second probe sees the windows the same way
                assert_eq!(again, first);
            }
            // a range with no whole window samples nothing
            if let Some(s) = map.page_share(&[WIN + 1..2 * WIN + 7], 4) {
                assert_eq!(s.windows, 0, "{s:?}");
            }
            // the bytes are untouched
            assert_eq!(&map[..], &bytes[..]);
            drop(map);
            let _ = std::fs::remove_dir_all(&dir);
        }

        #[test]
        fn populate_reads_a_dropped_file_back_in() {
            use std::os::fd::AsRawFd;
            let dir = std::env::temp_dir().join(format!("cortiq-populate-map-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let path = dir.join("w.bin");
            let bytes: Vec<u8> = (0..4 * WIN).map(|i| (i % 241) as u8).collect();
            std::fs::write(&path, &bytes).expect("write");
            let f = std::fs::File::open(&path).expect("open");
            f.sync_all().expect("fsync");
            let map = map_readonly(&f, &path).expect("map");
            // clean and mapped by no one: the page cache lets the file go
            // SAFETY: advice on an open descriptor; it never changes the file's bytes.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            // (a file system that is the page cache itself, tmpfs, keeps it: dropped = 0)
            let dropped = map.missing_bytes(0..map.len());
            assert!(dropped == 0 || dropped == map.len(), "{dropped} of {} bytes dropped", map.len());
            map.populate(WIN..3 * WIN).expect("populate");
            assert_eq!(map.missing_bytes(WIN..3 * WIN), 0, "populated range not all in memory");
            // at least its range read (readahead may take more)
            assert!(map.missing_bytes(0..map.len()) <= dropped.saturating_sub(2 * WIN), "populate read less than its range");
            assert_eq!(&map[..], &bytes[..]);
            drop(map);
            let _ = std::fs::remove_dir_all(&dir);
        }

        #[test]
        fn smaps_field_of_the_right_mapping() {
            let smaps = "7f0000000000-7f0000200000 r--p 00000000 fd:00 12 /m/a.gguf\nRss:                2048 kB\nFilePmdMapped:      0 kB\nVmFlags: rd mr mw me hg\n7f0000400000-7f0000800000 r--p 00000000 fd:00 13 /m/b.gguf\nRss:                4096 kB\nFilePmdMapped:   4096 kB\nSwap:                  8 kB\n";
            assert_eq!(vma_field(smaps, 0x7f00_0040_0000, "FilePmdMapped:"), Some(4096));
            assert_eq!(vma_field(smaps, 0x7f00_0000_0000, "FilePmdMapped:"), Some(0));
            assert_eq!(vma_field(smaps, 0x7f00_0000_0000, "Rss:"), Some(2048));
            assert_eq!(vma_field(smaps, 0x7f00_0020_0000, "Rss:"), None);
            // a field of the next mapping is not this one's
            assert_eq!(vma_field(smaps, 0x7f00_0000_0000, "Swap:"), None);
            assert_eq!(vma_field(smaps, 0x7f00_0040_0000, "Swap:"), Some(8));
        }
    }
}
