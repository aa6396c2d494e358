//! cortiq-engine: QTensor (the only dtype dispatch), shared blocks, one file per architecture,
//! per-sequence state, generation, sampling and perplexity.

pub mod arch;
pub mod blocks;
pub mod codec;
pub mod compat;
pub mod config;
pub mod convert;
pub mod encoder;
pub mod error;
pub mod generate;
pub mod geometry;
pub mod load;
pub mod mixers;
pub mod model;
pub mod moe;
pub mod numerics;
#[cfg(feature = "o1")]
pub mod o1;
#[cfg(not(feature = "o1"))]
#[path = "o1/off.rs"]
pub mod o1;
pub mod par;
pub mod perplexity;
pub mod prefix;
pub mod profile;
pub mod qtensor;
pub mod rope;
pub mod session;
pub mod state;
pub mod weights;

pub use error::{EngineError, Result};
pub use model::{BatchEntry, Logits, Model, Pooling, VerifyJournal};
pub use numerics::Numerics;
pub mod sampling;
pub mod sched;
pub mod spec;
pub mod stop;
