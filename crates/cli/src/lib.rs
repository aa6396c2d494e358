//! cortiq-cli as a library: the pieces of the `cortiq` binary that tests and other tools reuse.
//! `main.rs` is the thin shell; `pull` fetches known models and texts into the user cache.

pub mod convert;
pub mod polish;
pub mod pull;
pub use cortiq_formats::registry;
