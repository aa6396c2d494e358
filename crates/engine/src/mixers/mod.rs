//! Token mixers other than softmax attention (issue 4): each a block function with its own
//! constant-size per-sequence state. Architecture files will compose them with the shared
//! blocks; `LayerState` will carry their states.

pub mod gdn;
pub mod kda;
pub mod mla;
pub mod nystrom;
pub mod shortconv;
