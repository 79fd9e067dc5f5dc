//! Integration test against the real `rserve` (not a stub). Skipped, with a message, unless
//! `RSERVE_BIN` points at a built `rserve` binary, e.g.
//! `RSERVE_BIN=target/release/rserve cargo test -p bench-cli --test serve_rserve`.
//! Needs the `smollm2-135m` model in the local registry cache.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        // Stop exactly the process we spawned, by PID.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn models_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200") && buf.contains("\"data\"")
}

#[test]
fn sweep_against_real_rserve() {
    let Ok(bin) = std::env::var("RSERVE_BIN") else {
        eprintln!("SKIPPED: set RSERVE_BIN=path/to/rserve to run the real-server sweep test");
        return;
    };
    let port = free_port();
    let child = Command::new(&bin)
        .args([
            "-m",
            "smollm2-135m",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(["-np", "4", "-c", "2048", "--queue-size", "64"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rserve");
    let _server = Server(child);
    let t0 = Instant::now();
    while !models_ready(port) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "rserve did not become ready"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("sweep.jsonl");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rbench"))
            .args([
                "serve",
                "--url",
                &format!("http://127.0.0.1:{port}"),
                "--dataset",
                "sharegpt-synthetic",
            ])
            .args([
                "--num-prompts",
                "8",
                "--concurrency",
                "1,4",
                "--output-len",
                "16",
                "--seed",
                "1",
            ])
            .args(["--result-file", results.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    assert_eq!(stdout.matches("Serving Benchmark Result").count(), 2);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for (l, c) in lines.iter().zip([1, 4]) {
        assert_eq!(l["max_concurrency"], c);
        assert_eq!(l["completed"], 8);
        assert_eq!(l["failed"], 0);
        assert_eq!(l["success_rate"], 1.0);
        assert_eq!(l["model_id"], "smollm2-135m");
        assert_eq!(l["usage_missing"], 0);
        assert!(l["total_output_tokens"].as_u64().unwrap() > 0);
        assert!(l["total_output_tokens"].as_u64().unwrap() <= 8 * 16);
        assert!(l["median_ttft_ms"].as_f64().unwrap() > 0.0);
    }
    // Resume: both points are done, nothing is re-run or re-written.
    let out = run(&["--resume", results.to_str().unwrap()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("resume: skipping"));
    assert_eq!(
        std::fs::read_to_string(&results).unwrap().lines().count(),
        2
    );
}
