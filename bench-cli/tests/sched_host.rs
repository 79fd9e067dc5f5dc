//! `rbench sched` on the host: variants that need no sched_ext (EEVDF, an unprivileged
//! policy, an affinity) run with their proof read back from `/proc`; what this host cannot
//! do (sched_ext, cgroup v2 controllers) is refused up front with the fix, before any
//! window runs.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn rbench(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rbench"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run rbench")
}

#[test]
fn fair_class_policy_and_affinity_windows_carry_their_proof() {
    let Some(model) = runtime::registry::test_model("smollm2-135m") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let m = model.display().to_string();
    let out = rbench(
        &[
            "sched",
            "-m",
            &m,
            "--variants",
            "eevdf,policy:batch,affinity:0",
            "--workloads",
            "tg2",
            "-r",
            "2",
            "-t",
            "1",
            "--cooldown",
            "0",
            "--result-file",
            "r.jsonl",
        ],
        d.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<Value> = std::fs::read_to_string(d.path().join("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["kind"], "sched_run");
    assert!(lines[0]["fingerprint"]["logical_cpus"].as_u64().unwrap() >= 1);
    let ws: Vec<&Value> = lines
        .iter()
        .filter(|l| l["kind"] == "sched_window")
        .collect();
    assert_eq!(ws.len(), 6);
    // A B B A: the second repetition runs the variants backwards.
    let order: Vec<&str> = ws.iter().map(|w| w["variant"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        [
            "eevdf",
            "policy:batch",
            "affinity:0",
            "affinity:0",
            "policy:batch",
            "eevdf"
        ]
    );
    for w in &ws {
        assert_eq!(w["valid"], true, "{w}");
        let threads = w["proof"]["threads"].as_array().unwrap();
        assert!(!threads.is_empty());
        let want_policy = if w["variant"] == "policy:batch" { 3 } else { 0 };
        assert!(threads.iter().all(|t| t["policy"] == want_policy), "{w}");
        if w["variant"] == "affinity:0" {
            assert_eq!(w["proof"]["cpus_allowed"], "0", "{w}");
        }
        assert!(w["metrics"]["avg_ts"].as_f64().unwrap() > 0.0);
    }
    assert!(
        stdout.contains("| tg2 | policy:batch | rllama | 2/2 |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| policy:batch | rllama | none (fair class) | 0% | 3/120 | rbench |"),
        "{stdout}"
    );
    // The report reads the same file.
    let rep = rbench(&["report", "r.jsonl", "--html", "r.html"], d.path());
    assert!(
        rep.status.success(),
        "{}",
        String::from_utf8_lossy(&rep.stderr)
    );
    let html = std::fs::read_to_string(d.path().join("r.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("tg2: tokens/s per variant"));
}

/// llama.cpp beside ours in the same windows: the engine linked into rbench, a server
/// started through a shell (a grandchild of the placed process), and a user's command;
/// every one's threads proven, and an escape caught.
#[test]
fn foreign_engines_servers_and_commands_run_inside_the_variant() {
    let Some(model) = runtime::registry::test_model("smollm2-135m") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let m = model.display().to_string();
    // Built without llama.cpp (the test command builds with it): said, and nothing ran.
    let engines = if cfg!(feature = "llamacpp") {
        "rllama,llamacpp"
    } else {
        "rllama"
    };
    let rserve = std::env::var("RSERVE_BIN").unwrap_or_else(|_| {
        Path::new(env!("CARGO_BIN_EXE_rbench"))
            .with_file_name("rserve")
            .display()
            .to_string()
    });
    if !Path::new(&rserve).is_file() {
        eprintln!("skipped: no rserve binary at {rserve} (cargo build --release -p server)");
        return;
    }
    // The "foreign" server is rserve behind a shell script that starts it as its child.
    // What the user's command prints: a llama-bench JSON row.
    std::fs::write(d.path().join("row.json"), r#"{"avg_ts": 7.5, "n_gen": 2}"#).unwrap();
    let shell_server = format!("wrapped=sh -c '{rserve} -m {m} -t 1 --parallel 2 \"$@\"; true' x");
    let out = rbench(
        &[
            "sched",
            "-m",
            &m,
            "--variants",
            "eevdf,policy:batch",
            "--engine",
            engines,
            "--spawn",
            "rserve",
            "--spawn",
            &shell_server,
            "--workloads",
            r#"tg2,serve:c=1:n=2:len=4,cmd:probe="cat row.json; sleep 0.3""#,
            "--dataset",
            "fixed:16/4",
            "-r",
            "2",
            "-t",
            "1",
            "--cooldown",
            "0",
            "--result-file",
            "e.jsonl",
        ],
        d.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    let ws: Vec<Value> = std::fs::read_to_string(d.path().join("e.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["kind"] == "sched_window")
        .collect();
    let n_engines = engines.split(',').count();
    assert_eq!(ws.len(), 2 * 2 * (n_engines + 2 + 1), "{stderr}");
    for w in &ws {
        assert_eq!(w["valid"], true, "{w}");
        let want_policy = if w["variant"] == "policy:batch" { 3 } else { 0 };
        let threads = w["proof"]["threads"].as_array().unwrap();
        assert!(!threads.is_empty(), "{w}");
        assert!(threads.iter().all(|t| t["policy"] == want_policy), "{w}");
        let comms: Vec<&str> = w["proof"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["comm"].as_str())
            .collect();
        match (
            w["workload"].as_str().unwrap(),
            w["engine"].as_str().unwrap(),
        ) {
            ("tg2", "llamacpp") => {
                // llama.cpp's own worker threads are among those proven.
                assert!(w["metrics"]["avg_ts"].as_f64().unwrap() > 0.0, "{w}");
                assert!(w["proof"]["max_threads"].as_u64().unwrap() >= 1, "{w}");
            }
            ("serve:c=1", "wrapped") => {
                assert!(
                    comms.contains(&"rserve"),
                    "the wrapped server is proven: {w}"
                );
                assert_eq!(w["metrics"]["points"][0]["success_rate"], 1.0, "{w}");
            }
            ("cmd:probe", "cmd") => {
                assert_eq!(w["metrics"]["figure"], 7.5, "{w}");
                assert_eq!(w["metrics"]["exit"], "exit status: 0", "{w}");
            }
            _ => {}
        }
    }
    if n_engines == 2 {
        assert!(stdout.contains("rllama / llamacpp [95% CI]"), "{stdout}");
        assert!(
            stdout.contains("| tg2 | policy:batch | llamacpp | 2/2 |"),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("| serve:c=1 | policy:batch | wrapped | 1 | 2/2 | 100.0 |"),
        "{stdout}"
    );
    // A variant whose CPUs a command's child leaves is invalid, naming the thread.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 && sched_experiments::placement::find_binary("taskset").is_some() {
        let out = rbench(
            &[
                "sched",
                "--variants",
                "affinity:0",
                "--workloads",
                r#"cmd:escape="sh -c 'taskset -c 1 sleep 0.5'; true""#,
                "-r",
                "1",
                "--retries",
                "0",
                "--result-file",
                "x.jsonl",
            ],
            d.path(),
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(d.path().join("x.jsonl")).unwrap();
        assert!(
            text.contains("escaped the variant's CPUs") && text.contains("(sleep) on 1"),
            "{text}"
        );
    }
}

#[test]
fn what_the_host_cannot_do_is_refused_before_any_window() {
    let d = tempfile::tempdir().unwrap();
    let has_scx = Path::new("/sys/kernel/sched_ext").is_dir();
    if !has_scx {
        let out = rbench(
            &[
                "sched",
                "--variants",
                "eevdf,scx:scx_simple",
                "--workloads",
                "tg2",
                "--result-file",
                "r.jsonl",
            ],
            d.path(),
        );
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{e}");
        assert!(
            e.contains("CONFIG_SCHED_CLASS_EXT") && e.contains("lab"),
            "{e}"
        );
        assert!(!d.path().join("r.jsonl").exists(), "nothing ran");
    }
    // cgroup v2 with the cpu controller is not everywhere (hybrid hosts bind it to v1).
    let out = rbench(
        &[
            "sched",
            "--variants",
            "cgroup:cpu.max=50000/100000",
            "--workloads",
            "tg2",
            "-r",
            "1",
            "--result-file",
            "c.jsonl",
        ],
        d.path(),
    );
    let e = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        let text = std::fs::read_to_string(d.path().join("c.jsonl")).unwrap();
        assert!(text.contains("\"workload_in_procs\":true"), "{text}");
        eprintln!("note: this host has cgroup v2 with the cpu controller; the window ran");
    } else {
        assert!(e.contains("cgroup"), "{e}");
        assert!(!d.path().join("c.jsonl").exists(), "nothing ran");
        eprintln!(
            "note: cgroup variants refused here, as they should be: {}",
            e.trim()
        );
    }
    for (bad, want) in [
        ("--variants=policy:fast", "unknown policy"),
        ("--workloads=xx1", "unknown workload"),
        ("--antagonist=fork", "unknown antagonist"),
    ] {
        let out = rbench(&["sched", "--variant", "eevdf", bad], d.path());
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {e}");
        assert!(e.contains(want), "{bad}: {e}");
    }
}
