//! Calibration text: a tokenizer's windows over text files, the input of the fold and the heal.

use std::path::PathBuf;

use cortiq_formats::tokenizer::Tokenizer;

use crate::error::{ConvertError, Result};

/// Up to `max` windows of t tokens (BOS first where the model adds one), in order, from the
/// text files.
pub fn text_windows(tok: &Tokenizer, files: &[PathBuf], bos: Option<u32>, t: usize, max: usize) -> Result<Vec<Vec<u32>>> {
    let body = t - usize::from(bos.is_some());
    let mut windows = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(p).map_err(|cause| ConvertError::Io { path: p.display().to_string(), cause })?;
        let ids = tok.encode_with(&text, false, false)?;
        for c in ids.chunks_exact(body).take(max.saturating_sub(windows.len())) {
            windows.push(bos.into_iter().chain(c.iter().copied()).collect::<Vec<u32>>());
        }
    }
    Ok(windows)
}
