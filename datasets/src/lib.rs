//! Benchmark workloads. Every generator is deterministic for a seed so two runs (or two
//! engines in one run) see the same inputs.

pub mod fixed;
