//! rserve: a continuous-batching OpenAI-compatible server over the runtime.
//!
//! Layers, each testable alone: [`scheduler`] (plain batching state over the KV cache),
//! [`engine`] (the batch loop on its own OS thread, owning model, cache and thread pool),
//! [`api`] (OpenAI request validation and response shapes), [`http`] (axum routes, SSE,
//! admission control, shutdown), [`tenant`] (API keys and cache-isolation domains),
//! [`worker_info`] (what a router such as `sglang-router` asks a worker) and [`error`] (the
//! one error shape every endpoint returns).

pub mod answer;
pub mod anthropic;
pub mod api;
pub mod constrain;
pub mod embeddings;
pub mod engine;
pub mod error;
pub mod http;
pub mod metrics;
pub mod models;
pub mod persist;
pub mod responses;
pub mod scheduler;
pub mod tenant;
pub mod text;
pub mod worker_info;

pub use http::{start, RunningServer, ServerConfig};
