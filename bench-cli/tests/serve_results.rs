//! Result lines (vLLM keys), resume matching and report generation. Pure unit-level tests
//! on synthetic request outputs and a committed result file; no server involved.

use bench_cli::report;
use bench_cli::serve::client::{ErrorKind, RequestOutput};
use bench_cli::serve::result::{self, Goodput, PointSettings};
use serde_json::Value;

fn settings(c: Option<usize>) -> PointSettings {
    PointSettings {
        backend: "openai".into(),
        base_url: "http://127.0.0.1:1".into(),
        model_id: "m".into(),
        endpoint: "/v1/completions".into(),
        dataset: "sharegpt-synthetic".into(),
        num_prompts: 3,
        seed: 0,
        request_rate: None,
        burstiness: 1.0,
        max_concurrency: c,
        output_len: Some(4),
        ignore_eos: false,
    }
}

fn outputs() -> Vec<RequestOutput> {
    let ok = |ttft: f64, lat: f64, n: usize| RequestOutput {
        prompt_len: 10,
        usage_output_tokens: Some(n),
        content_chunks: n,
        generated_text: "x".repeat(n),
        finish_reason: Some("length".into()),
        ttft,
        itl: vec![(lat - ttft) / (n - 1) as f64; n - 1],
        latency: lat,
        ..Default::default()
    };
    vec![
        ok(0.1, 0.4, 4),
        ok(0.2, 0.8, 4),
        RequestOutput {
            prompt_len: 10,
            error: Some((ErrorKind::Timeout, "slow".into())),
            ..Default::default()
        },
    ]
}

#[test]
fn result_line_has_vllm_keys_and_values() {
    let g = Goodput::parse(&["ttft:150".into(), "e2el:1000".into()]).unwrap();
    let m = result::summarize(
        &settings(Some(2)),
        &outputs(),
        2.0,
        &[99.0, 90.0],
        &g,
        "20260101-000000",
        &|s| s.len(),
    );
    for k in [
        "date",
        "backend",
        "model_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "success_rate",
        "error_counts",
        "dataset",
        "seed",
        "concurrency",
    ] {
        assert!(m.contains_key(k), "missing {k}");
    }
    for metric in ["ttft", "tpot", "itl", "e2el"] {
        for stat in ["mean", "median", "std", "p99", "p90"] {
            assert!(
                m.contains_key(&format!("{stat}_{metric}_ms")),
                "missing {stat}_{metric}_ms"
            );
        }
    }
    assert_eq!(m["completed"], 2);
    assert_eq!(m["failed"], 1);
    assert_eq!(m["request_rate"], "inf");
    assert_eq!(m["total_input_tokens"], 20);
    assert_eq!(m["total_output_tokens"], 8);
    assert!((m["success_rate"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(m["error_counts"]["timeout"], 1);
    assert_eq!(m["error_counts"]["http_status"], 0);
    assert_eq!(m["request_throughput"], 1.0);
    assert_eq!(m["output_throughput"], 4.0);
    // Only the first request meets ttft <= 150 ms.
    assert_eq!(m["request_goodput"], 0.5);
    // TPOT = (latency - ttft) / (n - 1): 100 ms and 200 ms.
    assert!((m["mean_tpot_ms"].as_f64().unwrap() - 150.0).abs() < 1e-9);
    assert!((m["median_ttft_ms"].as_f64().unwrap() - 150.0).abs() < 1e-9);
    // Population std (numpy's np.std), as vLLM: ttfts 100, 200 -> 50.
    assert!((m["std_ttft_ms"].as_f64().unwrap() - 50.0).abs() < 1e-9);
    let text = result::summary_text(&m, &[99.0], false);
    assert!(text.contains("Successful requests:"));
    assert!(text.contains("timeout"));
    let no_goodput = result::summarize(
        &settings(None),
        &outputs(),
        2.0,
        &[99.0],
        &Goodput::default(),
        "d",
        &|s| s.len(),
    );
    assert!(no_goodput["request_goodput"].is_null());
    assert!(no_goodput["max_concurrency"].is_null());
}

#[test]
fn resume_skips_points_already_written() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("r.jsonl");
    assert!(result::read_lines(&f).is_empty());
    for c in [Some(1), Some(4)] {
        let m = result::summarize(
            &settings(c),
            &outputs(),
            1.0,
            &[99.0],
            &Goodput::default(),
            "d",
            &|s| s.len(),
        );
        result::append_line(&f, &m).unwrap();
    }
    // A torn last line (interrupted write) is skipped, not fatal.
    std::fs::write(&f, std::fs::read_to_string(&f).unwrap() + "{\"truncated\":").unwrap();
    let done = result::read_lines(&f);
    assert_eq!(done.len(), 2);
    assert!(result::already_done(&done, &settings(Some(1))));
    assert!(result::already_done(&done, &settings(Some(4))));
    assert!(!result::already_done(&done, &settings(Some(16))));
    assert!(!result::already_done(&done, &settings(None)));
    let mut other = settings(Some(1));
    other.seed = 1;
    assert!(!result::already_done(&done, &other));
    other = settings(Some(1));
    other.dataset = "preset:baseline".into();
    assert!(!result::already_done(&done, &other));
    other = settings(Some(1));
    other.request_rate = Some(2.0);
    assert!(!result::already_done(&done, &other));
}

#[test]
fn report_from_committed_result_file() {
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/report/testdata/sample_results.jsonl");
    let rows = report::load(&[f.clone(), f]).unwrap();
    assert_eq!(rows.len(), 6);
    let md = report::markdown(&rows);
    assert!(md.starts_with("| file | dataset | concurrency |"));
    assert_eq!(md.lines().count(), 2 + 6);
    assert!(md.contains("| sample_results.jsonl | sharegpt-synthetic | 16 | inf | 16/16 |"));
    let html = report::html(&rows);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(html.matches("<svg").count(), 4);
    assert!(html.contains("<table>") && html.contains("<th>TTFT p99 ms</th>"));
    assert!(!html.contains("<script") && !html.contains("src=\"http"));
    assert!(html.contains("<polyline"));
    let v: Value = serde_json::from_str(
        std::fs::read_to_string(
            env!("CARGO_MANIFEST_DIR").to_string() + "/src/report/testdata/sample_results.jsonl",
        )
        .unwrap()
        .lines()
        .next()
        .unwrap(),
    )
    .unwrap();
    assert_eq!(v["dataset"], "sharegpt-synthetic");
}
