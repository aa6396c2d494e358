//! The typed error of the conversion pipelines: the engine's and the formats' own errors as
//! they are, an I/O failure naming its file, and the pipelines' own refusals as one line naming
//! the flag or value at fault (`bail!`). `Context` adds what was being done, as anyhow's does.

use cortiq_engine::EngineError;
use cortiq_formats::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Format(#[from] FormatError),
    // The cause is in the message (not `source()`), so that anyhow's chain prints it once.
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// An I/O failure whose file the caller names (`Context`).
    #[error(transparent)]
    Os(#[from] std::io::Error),
    #[error(transparent)]
    Train(#[from] cortiq_train::trainer::TrainError),
    #[error(transparent)]
    Nystrom(#[from] cortiq_train::nystrom::NystromError),
    #[cfg(feature = "o1")]
    #[error(transparent)]
    Student(#[from] crate::polish::student::StudentError),
    /// A refusal: what is wrong, naming the flag or value.
    #[error("{0}")]
    Bad(String),
    /// `what` failed because of `source`.
    #[error("{what}: {cause}")]
    Context { what: String, cause: Box<ConvertError> },
}

pub type Result<T, E = ConvertError> = std::result::Result<T, E>;

/// Return early with a `ConvertError::Bad` from a format string.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::ConvertError::Bad(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// What was being done when an error happened (`Result`) or a value was missing (`Option`).
pub trait Context<T> {
    fn context(self, what: &str) -> Result<T>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<ConvertError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: &str) -> Result<T> {
        self.map_err(|e| ConvertError::Context { what: what.to_string(), cause: Box::new(e.into()) })
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| ConvertError::Context { what: what(), cause: Box::new(e.into()) })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: &str) -> Result<T> {
        self.ok_or_else(|| ConvertError::Bad(what.to_string()))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| ConvertError::Bad(what()))
    }
}
