//! The engine's typed error. Variants name the file, tensor, field or value at fault.

use cortiq_formats::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("{file}: unknown architecture '{arch}' (supported: {supported})")]
    UnknownArch { file: String, arch: String, supported: String },
    #[error("{file}: missing tensor '{tensor}'")]
    MissingTensor { file: String, tensor: String },
    #[error("{file}: tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { file: String, tensor: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("{file}: {what}")]
    BadConfig { file: String, what: String },
    #[error("{what}: {n_tokens} tokens do not fit the context of {n_ctx}")]
    ContextOverflow { what: String, n_tokens: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    /// A setting this model cannot take (named in the message).
    #[error("{0}")]
    Unsupported(String),
    #[error("a batch entry has no tokens")]
    EmptyEntry,
    /// One entry of a batched call failed (nothing in the batch has moved).
    #[error("batch entry {entry}: {source}")]
    Batch { entry: usize, source: Box<EngineError> },
}

pub type Result<T> = std::result::Result<T, EngineError>;
