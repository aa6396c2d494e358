//! cortiq-kernels: pure functions on slices, no model knowledge.
//!
//! Owns the quantized block formats (GGUF's legacy and k-quants; cortiq's own types come in
//! the speed issue), their dequantization, f32 matrix kernels, and elementwise ops (norms,
//! RoPE, softmax, activations). Every SIMD kernel has a scalar twin kept forever and tested
//! against it; the SIMD path is chosen at run time.

pub mod act;
pub mod attn;
pub mod conv;
pub mod delta;
pub mod dot;
pub mod ggml;
pub mod kvattn;
pub mod mem;
pub mod membw;
pub mod ops;
pub mod pool;
pub mod quant;
pub mod rows;
pub mod simd;
pub mod ssm;
pub mod vmf;
