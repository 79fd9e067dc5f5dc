//! `rbench -ngl 0,99 -dev CPU`: the sweep runs our engine with no layer and with every
//! layer (and the output layer) on ggml's CPU backend standing in for a GPU; rows carry
//! llama-bench's `backends` and `n_gpu_layers` and the device memory columns, and the
//! markdown table gets its `ngl` and device memory columns. Skipped with the reason
//! where this build has no ggml (a failure under `GGML_SYS_REQUIRED=1`, as in CI).

use std::process::Command;

use serde_json::Value;

fn ggml_built() -> bool {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_rbench"))
        .parent()
        .unwrap()
        .join("ggml");
    if dir.join("libggml.so").exists() {
        return true;
    }
    assert!(
        std::env::var("GGML_SYS_REQUIRED").as_deref() != Ok("1"),
        "GGML_SYS_REQUIRED=1 but {} has no libggml.so",
        dir.display()
    );
    eprintln!("SKIPPED: this build has no ggml");
    false
}

fn rbench(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "rbench {args:?}:\n{stderr}\n{stdout}");
    (stdout, stderr)
}

#[test]
fn ngl_sweep_rows_and_columns() {
    if !ggml_built() {
        return;
    }
    let common = [
        "-m",
        "smollm2-135m",
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "2",
        "-ngl",
        "0,99",
        "-dev",
        "CPU",
    ];
    let mut args = common.to_vec();
    args.extend(["-o", "jsonl"]);
    let (out, err) = rbench(&args);
    let rows: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4, "{out}");
    for r in &rows[..2] {
        assert_eq!(r["n_gpu_layers"], 0);
        assert_eq!(r["backends"], "CPU");
        assert!(r["device_weight_bytes"].is_null());
    }
    for r in &rows[2..] {
        assert_eq!(r["n_gpu_layers"], 99);
        assert_eq!(r["backends"], "CPU,CPU");
        assert_eq!(r["gpu_info"], "CPU");
        // All 30 layers and the output matrix: most of the file.
        let w = r["device_weight_bytes"].as_u64().unwrap();
        assert!(w > r["model_size"].as_u64().unwrap() / 2, "{r}");
        assert!(r["device_kv_bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["device_compute_bytes"].as_u64().unwrap() > 0, "{r}");
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
    }
    assert!(err.contains("offload: 30 layers + output on CPU"), "{err}");

    let (md, _) = rbench(&common);
    let header = md.lines().find(|l| l.starts_with("| model")).unwrap();
    assert!(
        header.contains("| backend") && header.contains("| ngl |"),
        "{header}"
    );
    assert!(header.contains("device MiB w/kv/compute"), "{header}");
    assert!(
        md.lines()
            .any(|l| l.contains("| CPU,CPU ") && l.contains("|  99 |")),
        "{md}"
    );
}

/// Runs rbench on a tiny pp test with every layer offloaded to `device`, expecting it to
/// fail; returns stderr.
fn fails_offloading_to(device: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args([
            "-m",
            "smollm2-135m",
            "-p",
            "8",
            "-n",
            "0",
            "-r",
            "1",
            "-ngl",
            "99",
            "-dev",
            device,
        ])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn offload_errors_are_clear() {
    if !ggml_built() {
        return;
    }
    let err = fails_offloading_to("NoSuchGPU", &[]);
    assert!(err.contains("no ggml device named \"NoSuchGPU\""), "{err}");
    let err = fails_offloading_to("CPU", &[("RLLAMA_OFFLOAD_MEM_LIMIT", "80M")]);
    assert!(
        err.contains("not enough device memory") && err.contains("layers would fit (-ngl "),
        "{err}"
    );
}
