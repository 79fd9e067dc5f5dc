//! End-to-end runs of the `rbench` binary on the smallest registry model (fetched when
//! missing): every output format parses and carries the statistics llama-bench defines.
//! Kept tiny (a few tokens, 1-2 repetitions) for a 2-core CI machine.

use std::process::{Command, Output};

use serde_json::Value;

const MODEL: &str = "smollm2-135m";

fn rbench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(args)
        .output()
        .expect("run rbench")
}

fn ok(args: &[&str]) -> (String, String) {
    let out = rbench(args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        out.status.success(),
        "rbench {args:?} failed ({:?}):\n{stderr}\n{stdout}",
        out.status
    );
    (stdout, stderr)
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Checks the statistics of one result object against its samples.
fn check_stats(v: &Value, reps: usize) {
    let ns: Vec<f64> = v["samples_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let ts: Vec<f64> = v["samples_ts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(ns.len(), reps, "{v}");
    assert_eq!(ts.len(), reps, "{v}");
    let n_tok = (u(v, "n_prompt") + u(v, "n_gen")) as f64;
    for (t, n) in ts.iter().zip(&ns) {
        assert!(*n > 0.0);
        assert!(
            close(*t, n_tok * 1e9 / n),
            "t/s {t} vs {n} ns for {n_tok} tokens"
        );
    }
    let mean = ts.iter().sum::<f64>() / reps as f64;
    assert!(
        close(f(v, "avg_ts"), mean),
        "avg_ts is the mean of samples_ts"
    );
    let sd = if reps > 1 {
        (ts.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (reps - 1) as f64).sqrt()
    } else {
        0.0
    };
    assert!(
        close(f(v, "stddev_ts"), sd),
        "stddev_ts uses n-1: {} vs {sd}",
        f(v, "stddev_ts")
    );
    let mean_ns = ns.iter().sum::<f64>() / reps as f64;
    assert!((f(v, "avg_ns") - mean_ns).abs() <= 1.0);
}

const LLAMA_BENCH_FIELDS: &[&str] = &[
    "build_commit",
    "build_number",
    "cpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
    "engine",
    "kv_bytes",
    "kv_tokens",
];

#[test]
fn json_output_has_llama_bench_fields_and_statistics() {
    let (stdout, stderr) = ok(&["-m", MODEL, "-p", "16", "-n", "4", "-r", "2", "-o", "json"]);
    let v: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    let rows = v.as_array().expect("a JSON array");
    assert_eq!(rows.len(), 2, "pp16 and tg4");
    for r in rows {
        for k in LLAMA_BENCH_FIELDS {
            assert!(r.get(*k).is_some(), "field {k} missing: {r}");
        }
        assert_eq!(r["engine"], "rllama");
        assert_eq!(r["backends"], "CPU");
        assert_eq!(r["n_batch"], 2048);
        assert_eq!(r["n_ubatch"], 512);
        assert!(r["model_type"].as_str().unwrap().starts_with("llama "));
        assert!(u(r, "model_size") > 50_000_000);
        assert!(u(r, "model_n_params") > 100_000_000);
        assert!(u(r, "model_bytes") > 50_000_000);
        let ctx = u(r, "n_prompt") + u(r, "n_gen");
        assert!(u(r, "kv_tokens") >= ctx);
        assert!(u(r, "kv_bytes") > 0);
        assert!(r["test_time"].as_str().unwrap().ends_with('Z'));
        assert!(r["pinned"].is_boolean(), "pinned: {r}");
        // smollm2's matrices are Q4_1 and Q8_0 (the output shares the Q8_0 embedding).
        let isa = r["isa"].as_str().unwrap();
        assert!(
            isa.starts_with("Q4_1=") && isa.contains(",Q8_0="),
            "isa: {isa}"
        );
        assert!(!isa.contains("=scalar") || quant_is_scalar(), "isa: {isa}");
        check_stats(r, 2);
    }
    assert_eq!((u(&rows[0], "n_prompt"), u(&rows[0], "n_gen")), (16, 0));
    assert_eq!((u(&rows[1], "n_prompt"), u(&rows[1], "n_gen")), (0, 4));
    assert!(
        stderr.contains("test 1/2 pp16"),
        "progress on stderr: {stderr}"
    );
    assert!(stderr.contains("rep 2/2"), "progress on stderr: {stderr}");
}

#[test]
fn jsonl_is_one_object_per_line() {
    let (stdout, _) = ok(&[
        "-m",
        MODEL,
        "-p",
        "8",
        "-n",
        "2",
        "-pg",
        "8,2",
        "-r",
        "1",
        "-o",
        "jsonl",
        "--no-warmup",
        "--no-pin",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for l in &lines {
        let v: Value = serde_json::from_str(l).expect("each line is a JSON object");
        assert!(v.is_object());
        assert_eq!(v["pinned"], false, "--no-pin");
        check_stats(&v, 1);
        assert_eq!(v["stddev_ts"], 0.0);
    }
    let pg: Value = serde_json::from_str(lines[2]).unwrap();
    assert_eq!((u(&pg, "n_prompt"), u(&pg, "n_gen")), (8, 2));
}

#[test]
fn markdown_table_shape() {
    let (stdout, _) = ok(&[
        "-m", MODEL, "-p", "8", "-n", "2", "-d", "0,8", "-r", "2", "-t", "1",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines[0];
    let cols: Vec<&str> = header.trim_matches('|').split('|').map(str::trim).collect();
    assert_eq!(
        cols,
        [
            "model",
            "size",
            "params",
            "backend",
            "threads",
            "test",
            "t/s",
            "model MiB",
            "KV MiB",
            "KV tokens"
        ]
    );
    // llama-bench's widths: model 30 left, size/params 10, backend 10 left, threads 7,
    // test 15, t/s 20.
    assert!(header.starts_with(&format!(
        "| {:<30} | {:>10} | {:>10} | {:<10} |",
        "model", "size", "params", "backend"
    )));
    assert!(header.contains(&format!(
        "| {:>7} | {:>15} | {:>20} |",
        "threads", "test", "t/s"
    )));
    assert!(lines[1].starts_with(&format!("| {} | {}: |", "-".repeat(30), "-".repeat(9))));
    let rows: Vec<&str> = lines[2..]
        .iter()
        .copied()
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    let tests: Vec<String> = rows
        .iter()
        .map(|r| r.split('|').nth(6).unwrap().trim().to_string())
        .collect();
    assert_eq!(tests, ["pp8", "tg2", "pp8 @ d8", "tg2 @ d8"]);
    for r in &rows {
        assert_eq!(r.chars().count(), header.chars().count(), "aligned: {r}");
        let cells: Vec<&str> = r.trim_matches('|').split('|').map(str::trim).collect();
        assert!(cells[1].ends_with(" MiB"), "size in MiB: {}", cells[1]);
        assert!(cells[2].ends_with(" M"), "params in M: {}", cells[2]);
        assert_eq!(cells[3], "CPU");
        assert_eq!(cells[4], "1");
        let (mean, sd) = cells[6].split_once(" ± ").expect("mean ± sd");
        for x in [mean, sd] {
            assert_eq!(x.split_once('.').unwrap().1.len(), 2, "%.2f: {x}");
            x.parse::<f64>().unwrap();
        }
        cells[7].parse::<f64>().unwrap();
        cells[8].parse::<f64>().unwrap();
        cells[9].parse::<u64>().unwrap();
    }
    // One roofline note per tg test: weights x t/s.
    let notes: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("tg roofline: model weights "))
        .collect();
    assert_eq!(notes.len(), 2, "{stdout}");
    for n in notes {
        let (_, rest) = n.split_once(" = ").unwrap();
        let gbps: f64 = rest.split_once(" GB/s").unwrap().0.parse().unwrap();
        assert!(gbps > 0.0, "{n}");
        assert!(n.contains("rbench membw -t 1"), "{n}");
    }
    // Which instruction sets our kernels ran, once per model.
    let kernels: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("rllama kernels (llama "))
        .collect();
    assert_eq!(kernels.len(), 1, "{stdout}");
    assert!(kernels[0].contains("Q4_1="), "{}", kernels[0]);
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("build: ") && last.ends_with(&format!("({})", env!("CARGO_PKG_VERSION"))),
        "{last}"
    );
}

#[test]
fn csv_has_header_and_quoted_rows() {
    let (stdout, _) = ok(&[
        "-m",
        MODEL,
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-o",
        "csv",
        "--no-warmup",
    ]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for k in [
        "model_filename",
        "avg_ts",
        "stddev_ts",
        "n_prompt",
        "engine",
        "kv_bytes",
        "kv_tokens",
        "pinned",
        "isa",
    ] {
        assert!(header.contains(&k), "{k} in CSV header");
    }
    let vals: Vec<&str> = lines[1].split("\",\"").collect();
    assert_eq!(vals.len(), header.len());
    assert!(lines[1].starts_with('"') && lines[1].ends_with('"'));
    let i = header.iter().position(|h| *h == "n_prompt").unwrap();
    assert_eq!(vals[i], "8");
}

#[test]
fn bad_model_is_a_clear_error() {
    let out = rbench(&[
        "-m",
        "/nonexistent/dir/model.gguf",
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rbench: error:"), "{stderr}");
    assert!(stderr.contains("/nonexistent/dir/model.gguf"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = rbench(&["-m", "no-such-registry-model", "-r", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-registry-model"));

    // Usage errors exit 2, like clap's.
    let out = rbench(&["-p", "x"]);
    assert_eq!(out.status.code(), Some(2));
}

#[cfg(not(feature = "llamacpp"))]
#[test]
fn llamacpp_engine_without_the_feature_says_how_to_rebuild() {
    let out = rbench(&[
        "--engine",
        "rllama,llamacpp",
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--features llamacpp"), "{stderr}");
}

/// Whether the in-tool llama.cpp has every SIMD extension of this host (else rbench
/// refuses to report a ratio).
#[cfg(feature = "llamacpp")]
fn reference_has_host_simd() -> bool {
    let host = bench_cli::llama_bench::run::host_simd();
    let info = llamacpp_ref::system_info();
    bench_cli::llama_bench::run::missing_reference_simd(&info, &host).is_empty()
}

/// A prompt at depth runs in both engines (llama.cpp continues after the depth tokens).
#[cfg(feature = "llamacpp")]
#[test]
fn llamacpp_runs_prompts_at_depth() {
    if !reference_has_host_simd() {
        return;
    }
    let out = rbench(&[
        "-m",
        MODEL,
        "-p",
        "16",
        "-n",
        "0",
        "-d",
        "24",
        "-r",
        "1",
        "-t",
        "2",
        "--engine",
        "rllama,llamacpp",
        "-o",
        "csv",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    // n_prompt, n_gen, n_depth.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(r#","16","0","24","#))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for engine in [r#""rllama""#, r#""llamacpp""#] {
        assert!(
            rows.iter().any(|r| r.contains(engine)),
            "{engine}: {stdout}"
        );
    }
}

#[cfg(feature = "llamacpp")]
#[test]
fn side_by_side_with_llamacpp() {
    let simd_ok = reference_has_host_simd();
    let out = rbench(&[
        "-m",
        MODEL,
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "2",
        "--engine",
        "rllama,llamacpp",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !simd_ok {
        assert_eq!(out.status.code(), Some(1));
        assert!(stderr.contains("refusing to report"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}\n{stdout}");
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| --"))
        .collect();
    // Main table: header + 4 rows (2 tests x 2 engines); ratio table: header + 2 rows.
    let engine_col = |r: &str| r.split('|').nth(5).unwrap().trim().to_string();
    let main: Vec<String> = rows[1..5].iter().map(|r| engine_col(r)).collect();
    assert_eq!(
        main,
        ["rllama", "llama.cpp", "rllama", "llama.cpp"],
        "{stdout}"
    );
    assert!(stdout.contains("| ours/llama.cpp |"), "{stdout}");
    let ratio_rows: Vec<&&str> = rows
        .iter()
        .skip_while(|r| !r.contains("ours/llama.cpp"))
        .skip(1)
        .collect();
    assert_eq!(ratio_rows.len(), 2, "{stdout}");
    for r in ratio_rows {
        let ratio: f64 = r
            .trim_matches('|')
            .rsplit('|')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ratio > 0.0 && ratio.is_finite());
    }
    assert!(stdout.contains("llama.cpp system_info: "), "{stdout}");

    // JSON rows say which engine produced them.
    let out = rbench(&[
        "-m",
        MODEL,
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "2",
        "-t",
        "2",
        "--engine",
        "rllama,llamacpp",
        "-o",
        "json",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let engines: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["engine"].as_str().unwrap())
        .collect();
    assert_eq!(engines, ["rllama", "llamacpp"]);
    for r in v.as_array().unwrap() {
        check_stats(r, 2);
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("ours/llama.cpp"));
}

/// Whether this machine runs our scalar kernels (no AVX2; or lowered by the environment).
fn quant_is_scalar() -> bool {
    #[cfg(target_arch = "x86_64")]
    let simd = std::arch::is_x86_feature_detected!("avx2");
    #[cfg(not(target_arch = "x86_64"))]
    let simd = false;
    !simd
        || std::env::var("RLLAMA_FORCE_SCALAR").is_ok_and(|v| v == "1")
        || std::env::var("RLLAMA_SIMD").is_ok_and(|v| v == "scalar")
}

/// `--numerics fast` runs our fast kernel orders and says so in each row's `isa` (the
/// default stays llama.cpp's exact orders).
#[test]
fn numerics_fast_is_recorded_per_row() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "-m",
            MODEL,
            "-p",
            "8",
            "-n",
            "2",
            "-r",
            "1",
            "-o",
            "jsonl",
            "--no-warmup",
        ];
        args.extend_from_slice(extra);
        let (stdout, _) = ok(&args);
        stdout
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["isa"].to_string())
            .collect::<Vec<_>>()
    };
    for isa in run(&[]) {
        assert!(!isa.contains("/fast"), "default is exact: {isa}");
    }
    for isa in run(&["--numerics", "fast"]) {
        // smollm2 is Q4_1 + Q8_0: both have fast kernels wherever AVX2 does.
        if std::is_x86_feature_detected!("avx2") {
            assert!(isa.contains("Q4_1=") && isa.contains("/fast"), "{isa}");
        }
    }
    let out = rbench(&["-m", MODEL, "--numerics", "sloppy"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exact"));
}

/// `--interleave N`: tg tests take turns every N tokens (at depth too), each engine's
/// rows keep their statistics, pp tests still alternate whole repetitions, and the note
/// says how the engines alternated.
#[cfg(feature = "llamacpp")]
#[test]
fn interleaved_tg_with_llamacpp() {
    if !reference_has_host_simd() {
        return;
    }
    let out = rbench(&[
        "-m",
        MODEL,
        "-p",
        "8",
        "-n",
        "10",
        "-d",
        "0,12",
        "-r",
        "2",
        "-t",
        "2",
        "--engine",
        "rllama,llamacpp",
        "--interleave",
        "4",
        "-o",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    // pp8, tg10 at depths 0 and 12, on both engines.
    assert_eq!(rows.len(), 8, "{v}");
    for r in rows {
        check_stats(r, 2);
        assert!(u(r, "avg_ns") > 0);
    }
    let tg: Vec<(&str, u64)> = rows
        .iter()
        .filter(|r| u(r, "n_gen") == 10)
        .map(|r| (r["engine"].as_str().unwrap(), u(r, "n_depth")))
        .collect();
    assert_eq!(
        tg,
        [
            ("rllama", 0),
            ("llamacpp", 0),
            ("rllama", 12),
            ("llamacpp", 12)
        ]
    );
    assert!(
        stderr.contains("engines took turns every 4 generated tokens")
            && stderr.contains("tg tests take turns every few tokens"),
        "{stderr}"
    );
    // Without a second engine there is nothing to interleave.
    let out = rbench(&["-m", MODEL, "-n", "4", "--interleave", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--engine rllama,llamacpp"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
