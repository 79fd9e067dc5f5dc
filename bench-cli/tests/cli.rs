//! rbench's command line: lists, ranges, the Cartesian product, defaults, test names.

use bench_cli::llama_bench::cli::{
    default_threads, normalize_args, parse_cpu_mask, parse_list, parse_pg, Engine, OutputFormat,
    Params, TestSpec,
};

fn params(args: &[&str]) -> Params {
    let mut v = vec!["rbench"];
    v.extend_from_slice(args);
    Params::parse_from(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn parse_err(args: &[&str]) -> String {
    let mut v = vec!["rbench"];
    v.extend_from_slice(args);
    Params::parse_from(v).expect_err("should fail").to_string()
}

#[test]
fn lists_and_ranges() {
    assert_eq!(parse_list("512").unwrap(), vec![512]);
    assert_eq!(parse_list("1,2,4").unwrap(), vec![1, 2, 4]);
    assert_eq!(parse_list("1-4").unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(parse_list("1-8+2").unwrap(), vec![1, 3, 5, 7]);
    assert_eq!(parse_list("128-1024*2").unwrap(), vec![128, 256, 512, 1024]);
    assert_eq!(parse_list("0,16-18").unwrap(), vec![0, 16, 17, 18]);
    assert_eq!(parse_list("3-3").unwrap(), vec![3]);
    for bad in [
        "", "a", "1,,2", "4-1", "1-8+0", "1-8*1", "0-8*2", "-3", "1.5",
    ] {
        assert!(parse_list(bad).is_err(), "{bad:?} should be rejected");
    }
    assert_eq!(parse_pg("512,128").unwrap(), (512, 128));
    assert!(parse_pg("512").is_err());
    assert!(parse_pg("1,2,3").is_err());
}

#[test]
fn defaults_match_llama_bench() {
    let p = params(&[]);
    assert_eq!(p.models, vec![runtime::registry::DEFAULT_MODEL]);
    assert_eq!(p.n_prompt, vec![512]);
    assert_eq!(p.n_gen, vec![128]);
    assert!(p.pg.is_empty());
    assert_eq!(p.n_depth, vec![0]);
    assert_eq!(p.threads, vec![default_threads()]);
    assert_eq!(p.n_batch, vec![2048]);
    assert_eq!(p.n_ubatch, vec![512]);
    assert_eq!(p.repetitions, 5);
    assert_eq!(p.output, OutputFormat::Md);
    assert!(p.warmup);
    assert_eq!(p.engines, vec![Engine::Rllama]);
    assert!(
        p.run_options(1, 0).pin || runtime::options::Env::get().no_pin,
        "threads are pinned unless --no-pin"
    );
    assert!(!params(&["--no-pin"]).run_options(1, 0).pin);
    let names: Vec<String> = p.tests().iter().map(TestSpec::name).collect();
    assert_eq!(names, ["pp512", "tg128"]);
    // Prompts are evaluated in ubatch-sized forward passes.
    assert_eq!(p.tests()[0].our_chunk(), 512);
}

#[test]
fn cartesian_product_in_llama_bench_order() {
    let p = params(&[
        "-m",
        "a.gguf,b.gguf",
        "-p",
        "16,32",
        "-n",
        "0",
        "-n",
        "8",
        "-pg",
        "64,4",
        "-t",
        "1-2",
        "-d",
        "0,100",
        "-b",
        "128",
        "-ub",
        "64",
        "-r",
        "3",
        "-o",
        "jsonl",
    ]);
    assert_eq!(p.models, ["a.gguf", "b.gguf"]);
    assert_eq!(p.n_gen, [0, 8]);
    assert_eq!(p.pg, [(64, 4)]);
    assert_eq!(p.output, OutputFormat::Jsonl);
    let tests = p.tests();
    // 2 models x 2 threads x 2 depths x (2 pp + 1 tg + 1 pg); n_gen 0 adds no test.
    assert_eq!(tests.len(), 2 * 2 * 2 * 4);
    let first: Vec<String> = tests[..8]
        .iter()
        .map(|t| format!("{} t{} {}", t.model, t.threads, t.name()))
        .collect();
    assert_eq!(
        first,
        [
            "a.gguf t1 pp16",
            "a.gguf t1 pp32",
            "a.gguf t1 tg8",
            "a.gguf t1 pp64+tg4",
            "a.gguf t1 pp16 @ d100",
            "a.gguf t1 pp32 @ d100",
            "a.gguf t1 tg8 @ d100",
            "a.gguf t1 pp64+tg4 @ d100",
        ]
    );
    assert_eq!(tests[8].threads, 2);
    assert_eq!(tests[16].model, "b.gguf");
    assert!(tests.iter().all(|t| t.n_batch == 128 && t.n_ubatch == 64));
    assert_eq!(tests[7].n_ctx(), 100 + 64 + 4);
    assert_eq!(tests[7].n_tokens(), 68);
    assert_eq!(tests[0].our_chunk(), 64);
}

#[test]
fn repeated_flags_append() {
    let p = params(&["-p", "1", "-p", "2,3", "-t", "4", "--threads", "8"]);
    assert_eq!(p.n_prompt, [1, 2, 3]);
    assert_eq!(p.threads, [4, 8]);
    let p = params(&["-m", "x", "--model", "y"]);
    assert_eq!(p.models, ["x", "y"]);
}

#[test]
fn llama_bench_spellings() {
    assert_eq!(
        normalize_args(["rbench", "-pg", "1,2", "-ub", "8", "-ub=16", "-p"]),
        [
            "rbench",
            "--pg",
            "1,2",
            "--ubatch-size",
            "8",
            "--ubatch-size=16",
            "-p"
        ]
    );
    let p = params(&[
        "--n-prompt",
        "8",
        "--n-gen",
        "2",
        "--n-depth",
        "4",
        "--batch-size",
        "32",
        "--ubatch-size",
        "16",
        "--repetitions",
        "2",
        "--output",
        "csv",
        "--no-warmup",
        "--delay",
        "0",
        "--prio",
        "0",
        "--progress",
    ]);
    assert_eq!(p.n_prompt, [8]);
    assert_eq!(p.n_depth, [4]);
    assert_eq!(p.output, OutputFormat::Csv);
    assert!(!p.warmup);
}

#[test]
fn engines() {
    let p = params(&["--engine", "rllama,llamacpp"]);
    assert_eq!(p.engines, [Engine::Rllama, Engine::LlamaCpp]);
    let p = params(&["--engine", "llama.cpp", "--engine", "rllama,llamacpp"]);
    assert_eq!(p.engines, [Engine::LlamaCpp, Engine::Rllama]);
    assert!(parse_err(&["--engine", "vllm"]).contains("unknown engine"));
}

#[test]
fn test_names() {
    let t = |p, n, d| TestSpec {
        model: "m".into(),
        n_batch: 2048,
        n_ubatch: 512,
        threads: 1,
        n_prompt: p,
        n_gen: n,
        n_depth: d,
        n_gpu_layers: 0,
    };
    assert_eq!(t(512, 0, 0).name(), "pp512");
    assert_eq!(t(0, 128, 0).name(), "tg128");
    assert_eq!(t(512, 128, 0).name(), "pp512+tg128");
    assert_eq!(t(512, 0, 512).name(), "pp512 @ d512");
    assert_eq!(t(0, 128, 4096).name(), "tg128 @ d4096");
}

#[test]
fn rejects_bad_values() {
    assert!(parse_err(&["-t", "0"]).contains("threads"));
    assert!(parse_err(&["-b", "0"]).contains("batch"));
    assert!(parse_err(&["-r", "0"]).contains("repetitions"));
    assert!(parse_err(&["-p", "0", "-n", "0"]).contains("nothing to run"));
    assert!(parse_err(&["-p", "x"]).contains("-p"));
    assert!(parse_err(&["--prio", "7"]).contains("--prio"));
    assert!(parse_err(&["--delay=-1"]).contains("--delay"));
    assert!(parse_err(&["-o", "sql"]).contains("sql"));
    assert!(parse_err(&["-C", "0x1,0x2"]).contains("not supported yet"));
    assert!(parse_err(&["-C", "0xg"]).contains("hex"));
    let p = params(&["--prio", "-1", "--numa", "distribute", "-C", "0x3"]);
    assert_eq!(p.prio, -1);
    assert_eq!(p.cpu_mask.as_deref(), Some("0x3"));
    // 0x0 is llama-bench's "no mask".
    assert_eq!(params(&["-C", "0x0"]).cpu_mask, None);
}

#[test]
fn cpu_masks() {
    assert_eq!(parse_cpu_mask("0x3").unwrap(), [0, 1]);
    assert_eq!(parse_cpu_mask("f0").unwrap(), [4, 5, 6, 7]);
    assert_eq!(parse_cpu_mask("0x101").unwrap(), [0, 8]);
    assert!(parse_cpu_mask("0x").is_err());
}

#[test]
fn offload_sweeps() {
    let p = params(&["-ngl", "0,16,99", "-dev", "CPU", "-p", "8", "-n", "0"]);
    assert_eq!(p.n_gpu_layers, vec![0, 16, 99]);
    assert_eq!(p.run.device.as_deref(), Some("CPU"));
    let ngl: Vec<usize> = p.tests().iter().map(|t| t.n_gpu_layers).collect();
    assert_eq!(ngl, vec![0, 16, 99]);
    let p = params(&["--n-gpu-layers=4", "-p", "8"]);
    assert_eq!(p.n_gpu_layers, vec![4]);
    assert_eq!(params(&[]).n_gpu_layers, vec![0]);
    let e = parse_err(&["-ngl", "99", "--engine", "rllama,llamacpp"]);
    assert!(e.contains("in-tool llama.cpp is a CPU build"), "{e}");
    // -ngl 0 with llama.cpp is the ordinary CPU comparison.
    assert_eq!(
        params(&["-ngl", "0", "--engine", "rllama,llamacpp"]).n_gpu_layers,
        vec![0]
    );
}
