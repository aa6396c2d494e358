//! Read-only memory maps of model files, shared by the GGUF, .cmf and safetensors readers.
//! Decode streams every weight once per token, so the maps ask the kernel for huge pages
//! (`MADV_HUGEPAGE`: where the kernel backs read-only file mappings with them, each 2 MiB page
//! costs one TLB entry instead of 512 and the hardware prefetchers run across it). The advice
//! is best effort: refusing it changes speed, never results.

use std::fs::File;
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
