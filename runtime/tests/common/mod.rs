//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub use runtime::registry::test_model as model;

pub const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];
