//! cortiq-convert: the pipelines that turn one model into another, apart from the CLI (which
//! resolves names, parses flags and calls these): `linearize`, the vmf_phase fold of a dense
//! model's attention layers (`cortiq convert --linear-core vmf_phase`), with its window option
//! (`linearize_window`) and its split of a window budget over the layers (`window_split`); `polish`, the distillation that heals a converted model (its Nyström
//! or windowed layers, the learned far field; feature `o1`); `calib`, the calibration text
//! windows they read. Model and text names arrive resolved to paths (the CLI's `pull`).
//! Hand-written: the fold is the product's own method (issue 16), not a library's.

pub mod calib;
pub mod error;
pub mod linearize;
pub mod linearize_window;
#[cfg(feature = "o1")]
pub mod polish;
pub mod window_split;

pub use error::{ConvertError, Result};
