//! `rbench`: llama-bench-compatible engine benchmark (`rbench -m MODEL …`, see
//! `rbench --help`), plus `rbench serve …` (serving sweeps), `rbench soak …` (a long
//! run against one server, checked for leaks), `rbench report …` and
//! `rbench membw …` (memory read bandwidth, the decode roofline), `rbench sched …`
//! (the plan under schedulers and placements, with proof) and the hidden
//! `rbench antagonist spin|membw N` (background load for `rbench sched --antagonist`).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    runtime::options::init();
    match args.get(1).map(String::as_str) {
        Some("serve") => bench_cli::serve::main_with_args(args[1..].to_vec()),
        Some("soak") => bench_cli::serve::soak::main_with_args(args[1..].to_vec()),
        Some("report") => bench_cli::report::main_with_args(args[1..].to_vec()),
        Some("membw") => bench_cli::membw::main_with_args(args[1..].to_vec()),
        Some("sched") => bench_cli::sched::main_with_args(args[1..].to_vec()),
        Some("antagonist") => bench_cli::sched::antagonist_main(args[1..].to_vec()),
        _ => bench_cli::llama_bench::main_with_args(args),
    }
}
