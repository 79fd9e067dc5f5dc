//! Tokenizers built from GGUF metadata (work in progress).
