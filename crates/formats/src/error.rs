//! The typed error of the formats crate. Every variant names what was wrong and where.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: truncated: {what} needs bytes up to {need} but the file has {have}")]
    Truncated { path: PathBuf, what: String, need: u64, have: u64 },
    #[error("{path}: malformed: {msg}")]
    Malformed { path: PathBuf, msg: String },
    #[error("{path}: tensor '{tensor}' has unsupported dtype {dtype}")]
    UnsupportedDtype { path: PathBuf, tensor: String, dtype: String },
    #[error("{path}: missing {what}")]
    Missing { path: PathBuf, what: String },
    #[error("{path}: field '{field}': {msg}")]
    BadField { path: PathBuf, field: String, msg: String },
}

impl FormatError {
    pub fn malformed(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        FormatError::Malformed { path: path.into(), msg: msg.into() }
    }
    pub fn missing(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        FormatError::Missing { path: path.into(), what: what.into() }
    }
    pub fn field(path: impl Into<PathBuf>, field: impl Into<String>, msg: impl Into<String>) -> Self {
        FormatError::BadField { path: path.into(), field: field.into(), msg: msg.into() }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io { path: path.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, FormatError>;
