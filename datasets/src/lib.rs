//! Benchmark workloads. Every generator is deterministic for a seed so two runs (or two
//! engines in one run) see the same inputs.
//!
//! Token counts are always taken through a caller-supplied counter
//! (`&dyn Fn(&str) -> usize`), normally the served model's tokenizer, so this crate has no
//! model dependency and its tests can use a whitespace counter.

pub mod code_edit;
pub mod fixed;
pub mod sharegpt;
pub mod synthetic;

/// One benchmark request: the prompt text, its length in tokens (by the counter the set was
/// built with) and the number of output tokens to ask for (`max_tokens`).
#[derive(Debug, Clone, PartialEq)]
pub struct SampledRequest {
    pub prompt: String,
    pub prompt_len: usize,
    pub expected_output_len: usize,
    /// The ShareGPT entry id, when the request came from a file.
    pub id: Option<String>,
}

/// How requests arrive at the server.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrival {
    /// All requests are released at once (vLLM's `--request-rate inf`).
    AllAtOnce,
    /// One request at a time, each sent when the previous finished.
    Sequential,
    /// A fixed gap of `1 / rate` seconds between sends.
    Uniform { rate: f64 },
    /// Gamma-distributed gaps with mean `1 / rate` and shape `burstiness` (1 = Poisson), as
    /// vLLM's `--request-rate R --burstiness B`.
    Gamma { rate: f64, burstiness: f64 },
}

/// A named request set with its arrival pattern.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Label that goes into result files; synthetic sets say so in the label.
    pub label: String,
    pub requests: Vec<SampledRequest>,
    pub arrival: Arrival,
}
