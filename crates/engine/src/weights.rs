//! Where tensors come from: a GGUF file, a .cmf file or an HF folder, all addressed by GGUF
//! tensor names (formats' name table maps HF names). Shapes are checked here, once, at load time.

use std::sync::Arc;

use cortiq_formats::cmf::Cmf;
use cortiq_formats::gguf::{Gguf, TensorInfo};

use crate::error::{EngineError, Result};
use crate::qtensor::{Backing, QTensor};

/// A source of named tensors.
pub trait TensorSource {
    /// The file or folder, for error messages.
    fn file(&self) -> String;
    /// The tensor with this GGUF name as [rows, cols] (1-D tensors have rows = 1), or None.
    fn get(&self, name: &str) -> Result<Option<QTensor>>;

    /// A required tensor of exactly this [rows, cols] shape.
    fn require(&self, name: &str, rows: usize, cols: usize) -> Result<QTensor> {
        let t = self.get(name)?.ok_or_else(|| EngineError::MissingTensor { file: self.file(), tensor: name.to_string() })?;
        check_shape(self, &t, rows, cols)?;
        Ok(t)
    }

    /// An optional tensor which, when present, must have this shape.
    fn optional(&self, name: &str, rows: usize, cols: usize) -> Result<Option<QTensor>> {
        match self.get(name)? {
            None => Ok(None),
            Some(t) => {
                check_shape(self, &t, rows, cols)?;
                Ok(Some(t))
            }
        }
    }

    /// A required 1-D tensor of `n` values, widened to f32 (norm gains, biases).
    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        Ok(self.require(name, 1, n)?.to_f32())
    }
}

fn check_shape<S: TensorSource + ?Sized>(src: &S, t: &QTensor, rows: usize, cols: usize) -> Result<()> {
    if t.rows != rows || t.cols != cols {
        let shape = |r: usize, c: usize| if r == 1 { vec![c] } else { vec![r, c] };
        return Err(EngineError::ShapeMismatch {
            file: src.file(),
            tensor: t.name.clone(),
            expected: shape(rows, cols),
            found: shape(t.rows, t.cols),
        });
    }
    Ok(())
}

/// Tensors of an opened GGUF file, zero-copy views of its memory map.
pub struct GgufSource<'a> {
    pub gguf: &'a Gguf,
}

impl TensorSource for GgufSource<'_> {
    fn file(&self) -> String {
        self.gguf.path.display().to_string()
    }
    fn get(&self, name: &str) -> Result<Option<QTensor>> {
        let Some(info) = self.gguf.tensor(name) else { return Ok(None) };
        mapped(&self.file(), info, Arc::clone(self.gguf.mmap_of(info)) as Backing).map(Some)
    }
}

/// Tensors of an opened .cmf file, zero-copy views of its memory map. They are stored ready to
/// use (sanitized by the converter), so nothing is applied here.
pub struct CmfSource<'a> {
    pub cmf: &'a Cmf,
}

impl TensorSource for CmfSource<'_> {
    fn file(&self) -> String {
        self.cmf.path.display().to_string()
    }
    fn get(&self, name: &str) -> Result<Option<QTensor>> {
        let Some(info) = self.cmf.tensor(name) else { return Ok(None) };
        mapped(&self.file(), info, Arc::clone(self.cmf.mmap()) as Backing).map(Some)
    }
}

/// A view of a tensor in a memory map. GGUF-order dims (innermost first): rows = the product of
/// the outer dims. A vector stored with more than two dims all but one of which are 1 (Kimi's
/// ssm_a [1, heads, 1, 1]) is one row.
fn mapped(file: &str, info: &TensorInfo, backing: Backing) -> Result<QTensor> {
    let (cols, rows) = if info.dims.len() > 2 && info.dims.iter().filter(|&&x| x != 1).count() <= 1 {
        (info.dims.iter().product::<u64>() as usize, 1)
    } else {
        (info.dims[0] as usize, info.dims[1..].iter().product::<u64>() as usize)
    };
    let view = if info.interleaved { QTensor::new_interleaved } else { QTensor::new };
    view(&info.name, info.dtype, rows, cols, backing, info.offset as usize).ok_or_else(|| EngineError::BadConfig {
        file: file.to_string(),
        what: format!("tensor '{}' does not fit its stored bytes", info.name),
    })
}
