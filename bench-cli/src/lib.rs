//! rbench's library: statistics and report formatting shared by the engine and serving
//! benchmarks.

pub mod engine;
pub mod report;
pub mod serve;
pub mod stats;
