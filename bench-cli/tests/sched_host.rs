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
    assert!(stdout.contains("| tg2 | policy:batch | 2/2 |"), "{stdout}");
    assert!(
        stdout.contains("| policy:batch | none (fair class) | 0% | 3/120 |"),
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
