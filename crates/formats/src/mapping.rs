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

/// The bytes a loaded tensor points into: a read-only file map or an owned buffer.
pub trait WeightBytes: Send + Sync {
    fn bytes(&self) -> &[u8];

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
}
