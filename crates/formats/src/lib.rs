//! cortiq-formats: bytes on disk to typed tensors and metadata.
//!
//! GGUF files, safetensors (single and sharded), Hugging Face config.json, tokenizers (from
//! tokenizer.json or from GGUF metadata) and chat templates. Everything here parses at the
//! boundary into validated types; errors name the file, tensor or field.

pub mod calls;
pub mod chat;
mod chunk_writer;
pub mod cmf;
pub mod error;
pub mod gguf;
pub mod hf;
mod mapping;
pub mod names;
pub mod npy;
pub mod registry;
pub mod safetensors;
pub mod tokenizer;

pub use chunk_writer::{ChunkWriter, WRITE_CHUNK};
pub use error::FormatError;
pub use mapping::{PageShare, WeightBytes, page_cache_visible, return_free_memory};
