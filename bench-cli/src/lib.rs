//! rbench's library: statistics and report formatting shared by the engine and serving
//! benchmarks, and the memory bandwidth measurement.

pub mod engine;
pub mod membw;
pub mod report;
pub mod serve;
pub mod stats;
