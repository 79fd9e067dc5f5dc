//! `rbench soak` against the real `rserve`: a short soak (80 seconds of load) with real
//! ShareGPT prompts at concurrency 64, cancels, bursts past the queue and a 5% hostile
//! share (pathological schemas with adverse logit_bias, slow headers, oversize bodies,
//! drops), whose accounting, idle KV, flatness and hostile-TPOT checks must pass; and a
//! server killed mid-run, which must end the soak with a failure, not a hang. Skipped, with a message, unless `RSERVE_BIN` points at
//! a built `rserve` (CI sets it). Needs smollm2-135m and the sharegpt dataset (fetched and
//! cached like the other tests').

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The two soaks share the machine's two cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn rserve() -> Option<String> {
    let bin = std::env::var("RSERVE_BIN").ok();
    if bin.is_none() {
        eprintln!("SKIPPED: set RSERVE_BIN=path/to/rserve to run the soak tests");
    }
    bin
}

fn read_json(p: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?}"))
}

#[test]
fn short_soak_against_real_rserve() {
    let Some(bin) = rserve() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    runtime::registry::test_model("smollm2-135m");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let t0 = Instant::now();
    // A KV cache this size (8 slots x 512 tokens) is touched within the warm-up, so RSS
    // is flat afterwards; prompts are filtered to fit the slots.
    let out = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .env("RSERVE_BIN", &bin)
        .args(["soak", "--spawn", "rserve", "--server-threads", "2"])
        .args(["--server-parallel", "8", "--server-ctx", "512"])
        .args(["--duration", "80s", "--concurrency", "64"])
        .args(["--dataset", "sharegpt", "--num-prompts", "300"])
        .args(["--max-prompt-len", "384", "--max-total-len", "480"])
        .args(["--output-len", "32", "--ignore-eos"])
        .args(["--cancel-fraction", "0.1", "--burst-every", "20s"])
        .args(["--hostile-fraction", "0.05"])
        .args(["--result-file", json.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "{stderr}\n{stdout}\n(took {:.0}s)",
        t0.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "soak failed:\n{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("verdict:") && l.ends_with("PASS")),
        "{stdout}"
    );

    let v = read_json(&json);
    assert_eq!(v["verdict"], "pass");
    let a = &v["accounting"];
    let n = |k: &str| a[k].as_u64().unwrap();
    assert_eq!(
        n("sent"),
        n("completed") + n("rejected_429") + n("cancelled") + n("failed")
    );
    assert_eq!(n("failed"), 0);
    assert!(n("completed") > 0);
    assert!(n("cancelled") > 0, "no cancel: {a}");
    assert!(n("rejected_429") > 0, "no 429: {a}");
    assert!(n("bursts") >= 3, "{a}");
    assert_eq!(v["server_end"]["kv_blocks_used"], 0.0);
    for name in [
        "accounting",
        "kv idle",
        "conns closed",
        "server received",
        "server 429s",
        "server finished",
        "rss flat",
        "fds flat",
        "hostile tpot",
        "hostile handled",
    ] {
        assert_eq!(
            check(&v, name)["status"],
            "pass",
            "{name}: {}",
            check(&v, name)
        );
    }
    // Samples from the start to the end of the load, with /proc and /metrics data.
    let samples = v["samples"].as_array().unwrap();
    assert!(samples.len() >= 15, "{} samples", samples.len());
    assert_eq!(samples.last().unwrap()["t_s"], 80.0);
    for s in samples {
        // At t=0 the weights may not be paged in yet; after warm-up they are.
        let floor = if s["t_s"].as_f64().unwrap() >= 40.0 {
            50.0
        } else {
            1.0
        };
        assert!(s["proc"]["rss_mib"].as_f64().unwrap() > floor, "{s}");
        assert!(
            s["metrics"]["kv_blocks_total"].as_f64().unwrap() > 0.0,
            "{s}"
        );
        // rserve counts its connections: the fds check subtracts those.
        assert!(s["server_conns"].as_u64().unwrap() >= 1, "{s}");
    }
    assert_eq!(v["flatness"]["fds_net_less"], "server connections");
    let svg = std::fs::read_to_string(dir.path().join("soak.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Server RSS"));
    assert!(dir.path().join("rserve.log").is_file());
}

#[test]
fn a_server_that_dies_fails_the_soak_without_a_hang() {
    let Some(bin) = rserve() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    runtime::registry::test_model("smollm2-135m");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new(&bin)
        .args([
            "-m",
            "smollm2-135m",
            "-t",
            "2",
            "--parallel",
            "4",
            "-c",
            "512",
        ])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = server.id();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let mut soak = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(["soak", "--url", &format!("http://127.0.0.1:{port}")])
        .args(["--pid", &pid.to_string(), "--duration", "10m"])
        .args(["--concurrency", "8", "--dataset", "fixed:64/16"])
        .args(["--num-prompts", "20", "--sample-every", "1s"])
        .args(["--result-file", json.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill the server once the load is running (the result file is written per sample).
    let t0 = Instant::now();
    while !json.is_file() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the soak never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    // Stop exactly the server we started, by its PID.
    server.kill().unwrap();
    let killed = Instant::now();
    let status = loop {
        if let Some(st) = soak.try_wait().unwrap() {
            break st;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(90),
            "rbench soak still running 90 s after its server died"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = server.wait();
    let out = soak.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("FAIL"), "{stdout}");
    let v = read_json(&json);
    assert_eq!(v["verdict"], "fail");
    assert_eq!(check(&v, "server alive")["status"], "fail");
    assert!(v["server_died"]["why"]
        .as_str()
        .unwrap()
        .contains(&pid.to_string()));
    // Requests in flight when it died count as failed; the accounting still adds up.
    let a = &v["accounting"];
    let n = |k: &str| a[k].as_u64().unwrap();
    assert_eq!(
        n("sent"),
        n("completed") + n("rejected_429") + n("cancelled") + n("failed")
    );
}
