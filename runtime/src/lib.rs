//! The inference runtime: GGUF loading, model registry, tokenizers, architectures,
//! sampling, KV cache and the batched forward pass; synthetic models at real sizes.

pub mod affinity;
pub mod chat;
pub mod gguf;
pub mod kv;
pub mod load;
pub mod matmul;
pub mod model;
pub mod numa;
pub mod offload;
pub mod options;
pub mod packed;
pub mod pool;
pub mod reasoning;
pub mod registry;
pub mod runner;
pub mod sampling;
pub mod speculative;
pub mod synth;
pub mod tokenizer;
pub mod tools;
pub mod tune;
pub mod weights;

pub use gguf::{GgufError, GgufFile};
pub use load::{load, ContextSize, LoadError, Loaded, ModelFile};
pub use matmul::Numerics;
pub use options::RunOptions;
pub use quant::isa::{active as kernel_isa, Isa};
pub use quant::order::{flavor as ggml_flavor, Flavor};
pub use quant::DotOrder;
