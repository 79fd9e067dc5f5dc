//! `rbench serve --spawn`: two real `rserve` instances with different flags, started and
//! stopped by rbench, run interleaved per point, and shown side by side by `rbench report`.
//! Skipped, with a message, unless `RSERVE_BIN` points at a built `rserve` (CI sets it).

use std::process::Command;

use serde_json::Value;

#[test]
fn two_spawned_servers_interleave_and_report_side_by_side() {
    let Ok(bin) = std::env::var("RSERVE_BIN") else {
        eprintln!("SKIPPED: set RSERVE_BIN=path/to/rserve to run the --spawn test");
        return;
    };
    runtime::registry::test_model("smollm2-135m");
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("sbs.jsonl");
    let srv = |extra: &str| format!("{bin} -m smollm2-135m -t 2 --parallel 4 -c 1024{extra}");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rbench"))
            .args(["serve", "--spawn"])
            .arg(format!("cached={}", srv("")))
            .arg("--spawn")
            .arg(format!("nocache={}", srv(" --no-prefix-cache")))
            .args(["--dataset", "fixed:48/8", "--num-prompts", "6"])
            .args(["--concurrency", "1,2,3", "--cooldown", "0.2", "--restart"])
            .args(["--result-file", results.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<Value> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // A B | B A | A B: the order alternates by point.
    let order: Vec<(u64, String)> = lines
        .iter()
        .map(|l| {
            (
                l["max_concurrency"].as_u64().unwrap(),
                l["backend"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = [
        (1, "cached"),
        (1, "nocache"),
        (2, "nocache"),
        (2, "cached"),
        (3, "cached"),
        (3, "nocache"),
    ]
    .iter()
    .map(|(c, n)| (*c, n.to_string()))
    .collect();
    assert_eq!(order, want);
    for l in &lines {
        assert_eq!(l["success_rate"], 1.0, "{l}");
        assert_eq!(l["server_version"], "rserve 0.1.0");
        let cmd = l["server_cmd"].as_str().unwrap();
        assert_eq!(
            cmd.contains("--no-prefix-cache"),
            l["backend"] == "nocache",
            "{cmd}"
        );
        assert!(cmd.contains("--port "), "{cmd}");
    }
    // --restart: a fresh server (a new port) for every run; all of them stopped at the end.
    let mut urls: Vec<&str> = lines
        .iter()
        .map(|l| l["server_url"].as_str().unwrap())
        .collect();
    urls.sort_unstable();
    urls.dedup();
    assert_eq!(urls.len(), lines.len(), "{urls:?}");
    for u in urls {
        let addr = u.trim_start_matches("http://");
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "{u} still answers after rbench exited"
        );
    }
    assert!(dir.path().join("cached.log").is_file());

    // The report: both servers as columns, the ratio, the command lines.
    let rep = Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(["report", results.to_str().unwrap()])
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&rep.stdout);
    eprintln!("{md}");
    for want in [
        "cached success %",
        "nocache success %",
        "nocache/cached out tok/s",
        "--no-prefix-cache",
        "| fixed:48/8 | 3 | 100.0 (6/6) | 100.0 (6/6) |",
    ] {
        assert!(md.contains(want), "report lacks {want:?}:\n{md}");
    }

    // Resume: everything is in the file, no server is started again.
    let out = run(&["--resume", results.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("resume: skipping").count(), 6, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&results).unwrap().lines().count(),
        6
    );
}
