//! `rbench`: llama-bench-compatible engine benchmark (`rbench -m MODEL …`, see
//! `rbench --help`), plus `rbench serve …` (serving sweeps), `rbench report …` and
//! `rbench membw …` (memory read bandwidth, the decode roofline).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("serve") => bench_cli::serve::main_with_args(args[1..].to_vec()),
        Some("report") => bench_cli::report::main_with_args(args[1..].to_vec()),
        Some("membw") => bench_cli::membw::main_with_args(args[1..].to_vec()),
        _ => bench_cli::llama_bench::main_with_args(args),
    }
}
