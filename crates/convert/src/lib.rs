//! cortiq-convert: the pipelines that turn one model into another, apart from the CLI (which
//! resolves names, parses flags and calls these): `linearize`, the vmf_phase fold of a dense
//! model's attention layers (`cortiq convert --linear-core vmf_phase`), with its window option
//! (`linearize_window`); `calib`, the calibration text windows they and the heal read.
//! Hand-written: the fold is the product's own method (issue 16), not a library's.

pub mod calib;
pub mod error;
pub mod linearize;
pub mod linearize_window;

pub use error::{ConvertError, Result};
