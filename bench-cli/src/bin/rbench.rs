//! `rbench`: llama-bench-compatible engine benchmark. See `rbench --help`.

fn main() -> std::process::ExitCode {
    bench_cli::engine::main_with_args(std::env::args().collect())
}
