//! cortiq-train: the fixed training graph of `cortiq polish`, written by hand (llm.c style, no
//! autograd). Every op is a (forward, backward) pair over plain slices, generic over [`Float`]
//! so that the code that trains in f32 is the code gradient-checked in f64 ([`gradcheck`]).
//!
//! Accumulation contract, for every op of this crate: **param grads +=, activations =**.
//! A forward writes (=) its outputs; a backward adds (+=) into the gradient buffers of its
//! inputs and parameters, so a tensor read by several ops (a residual stream, a kv head shared
//! by a query-head group) gets the sum without extra buffers. Callers zero gradients once per
//! step. Layout: row-major, tokens outermost (`[T, n_heads, head_dim]`), as the engine.
//!
//! Ops: [`matmul`] (linear), [`act`] (SiLU, GELU-tanh, gated FFN), [`norm`] (RMSNorm, both gain
//! styles), [`rope`], [`landmark`] (segment means), [`attention`] (exact causal, GQA, sliding),
//! [`nystrom`] (the O(1) operator, M frozen), [`delta`] (gated delta rule, BPTT), [`vmf`] (the vmf_phase core, its phases, conv and gate, and the whole mixer), [`loss`]
//! (CE + KL, and the fused chunked LM head); [`block`] assembles a decoder layer from them and
//! [`model`] a student from blocks, stepping with layer checkpointing;
//! [`optim`] is AdamW with warmup + cosine and clipping; [`gradcheck`] the f64 finite-difference
//! harness. [`trainer`] is the training loop (master copies, batches, validation ppl ratio,
//! NaN stop), [`data`] packs token files into windows and orders them, [`ckpt`] writes and
//! resumes checkpoints atomically and bit-identically. Tests: `cargo test --release -p cortiq-train` (tests/gradcheck.rs per op,
//! tests/block.rs per layer kind, tests/student.rs the checkpointed step, tests/tiny_model.rs a
//! hand-assembled student with a gated-delta layer, tests/f32_paths.rs the f32 instantiation,
//! tests/torch_agreement.rs the trainer against PyTorch, tests/trainer.rs resume and failures);
//! `examples/train_ops_bench.rs` times the f32 paths; `engine_xcheck/` (its own workspace)
//! compares the Nyström forward with the engine's matrix form.

pub mod act;
pub mod attention;
pub mod block;
pub mod budget;
pub mod ckpt;
pub mod data;
pub mod delta;
pub mod farfield;
pub mod float;
pub mod gradcheck;
pub mod landmark;
pub mod loss;
pub mod matmul;
pub mod model;
pub mod norm;
pub mod nystrom;
pub mod optim;
pub mod par;
pub mod rope;
pub mod trainer;
pub mod vmf;
pub mod vmf_window;

pub use float::Float;
