//! rbench's library: statistics and report formatting shared by the engine and serving
//! benchmarks, and the memory bandwidth measurement.

pub mod llama_bench;
pub mod membw;
pub mod report;
pub mod sched;
pub mod serve;
pub mod stats;

/// Parses a subcommand's arguments; on `--help`, `--version` or a usage error prints
/// clap's message and returns the exit code to end with (0 for help, 2 for errors).
pub fn parse_args<A: clap::Parser>(args: Vec<String>) -> Result<A, std::process::ExitCode> {
    A::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        std::process::ExitCode::from(if e.use_stderr() { 2 } else { 0 })
    })
}
