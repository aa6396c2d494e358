//! cortiq-train: the fixed training graph of `cortiq polish`, written by hand (llm.c style, no
//! autograd). Every op is a (forward, backward) pair over plain slices, generic over [`Float`]
//! so that the code that trains in f32 is the code gradient-checked in f64 ([`gradcheck`]).
//!
//! Accumulation contract, for every op of this crate: **param grads +=, activations =**.
//! A forward writes (=) its outputs; a backward adds (+=) into the gradient buffers of its
//! inputs and parameters, so a tensor read by several ops (a residual stream, a kv head shared
//! by a query-head group) gets the sum without extra buffers. Callers zero gradients once per
//! step. Layout: row-major, tokens outermost (`[T, n_heads, head_dim]`), as the engine.

pub mod act;
pub mod attention;
pub mod delta;
pub mod float;
pub mod gradcheck;
pub mod landmark;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod nystrom;
pub mod optim;
pub mod par;
pub mod rope;

pub use float::Float;
