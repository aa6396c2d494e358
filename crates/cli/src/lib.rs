//! cortiq-cli as a library: the pieces of the `cortiq` binary that tests and other tools reuse.
//! `main.rs` is the thin shell (parse, log, dispatch); each subcommand is one module here that
//! owns its clap arguments and its `cmd_*` function:
//!
//! - `run`: generation and interactive chat; also the reusable `SamplingArgs` and `encode_chat`
//! - `serve`: the OpenAI-compatible server (crates/server) and its flags
//! - `ppl`, `logits`, `tokenize`, `bench`, `convert`, `polish`: one subcommand each (`convert
//!   --linear-core` and `polish` are shells over the `cortiq-convert` crate: they resolve model
//!   and text names, then run its pipelines)
//! - `spec`: the speculative-decoding flags (`--spec`) and their `Speculator`
//! - `pull`: fetching known models and texts into the user cache, and `cortiq pull`
//! - `hub`: `hf:ORG/REPO[:QUANT]` models from the Hugging Face hub, in the hub's own cache
//! - `common`: what the model-running subcommands share (MODEL and numerics flags, opening the
//!   model, `--profile`); `o1args`: the O(1) / StreamingLLM flags and plan (feature `o1`)

pub mod bench;
pub mod common;
pub mod convert;
pub mod hub;
pub mod logits;
#[cfg(feature = "o1")]
pub mod o1args;
#[cfg(not(feature = "o1"))]
#[path = "o1args_off.rs"]
pub mod o1args;
#[cfg(feature = "o1")]
pub mod polish;
pub mod ppl;
pub mod pull;
pub mod run;
pub mod serve;
pub mod spec;
pub mod tokenize;
pub use cortiq_formats::registry;
