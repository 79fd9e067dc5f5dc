//! NUMA placement on a machine that really has two nodes: the lab guest
//! (`../shared/lab/run --nodes 2`). One boot, two vCPUs (one per node), the lab model
//! (`common::lab_model`, a two-layer synthetic llama-3):
//!
//! - `numactl --membind=1` with first-touch weights: every weight page on node 1;
//! - `--numa-weights interleave`: pages on both nodes, about half each;
//! - `--numa-weights replicate --numa distribute`: one copy per node, each wholly on its
//!   node, and the two threads on CPUs of different nodes;
//! - `--numa isolate`: every thread on the node the process started on;
//! - `rbench --numa distribute --numa-weights replicate`: the row records the same.
//!
//! Binaries as in `sched_lab.rs`: built for `x86-64-v3` into `target/lab`, or taken from
//! `RBENCH_LAB_BIN` (rbench, with rllama beside it). Without the lab the test is skipped
//! with a message, unless `RBENCH_LAB_REQUIRED=1` (CI).

mod common;

use serde_json::Value;

fn pages(report: &Value) -> Vec<(Option<u64>, u64, u64, u64)> {
    report["weight_pages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["copy_node"].as_u64(),
                p["per_node"]["0"].as_u64().unwrap_or(0),
                p["per_node"]["1"].as_u64().unwrap_or(0),
                p["absent"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The node each pool worker (not the unpinned caller, index 0) reported.
fn worker_nodes(report: &Value) -> Vec<u64> {
    report["observed"].as_array().unwrap()[1..]
        .iter()
        .map(|o| o["node"].as_u64().unwrap())
        .collect()
}

#[test]
fn pages_and_threads_land_on_the_nodes_asked_for() {
    let Some(run) = common::lab_run("NUMA") else {
        return;
    };
    let Some(model) = common::lab_model() else {
        return;
    };
    let bins = common::lab_bins();
    let dir = common::repo().join("target/lab-numa-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rl = format!(
        "{} inspect --numa --json {}",
        bins.join("rllama").display(),
        model.display()
    );
    let script = format!(
        r#"set -u
numactl -H > topo.txt
sync; echo 3 > /proc/sys/vm/drop_caches
numactl --membind=1 {rl} -t 1 > membind1.json 2> membind1.err; echo "membind1-exit=$?"
numactl --membind=1 {rl} -t 2 --numa-weights interleave > membind1-il.json 2> membind1-il.err; echo "membind1-il-exit=$?"
{rl} -t 2 --numa-weights interleave > interleave.json 2> interleave.err; echo "interleave-exit=$?"
{rl} -t 2 --numa-mode distribute --numa-weights replicate > replicate.json 2> replicate.err; echo "replicate-exit=$?"
taskset -c 1 {rl} -t 2 --numa-mode isolate > isolate.json 2> isolate.err; echo "isolate-exit=$?"
{rb} -m {m} -p 2 -n 0 -r 1 -t 2 --no-warmup --numa distribute --numa-weights replicate -o jsonl > bench.jsonl 2> bench.err; echo "bench-exit=$?"
"#,
        rb = bins.join("rbench").display(),
        m = model.display(),
    );
    std::fs::write(dir.join("lab.sh"), script).unwrap();
    let out = common::run_guest(
        &run,
        &[
            "--cpus", "2", "--mem", "2G", "--nodes", "2", "--", "bash", "lab.sh",
        ],
        &dir,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let ctx = format!(
        "lab stdout:\n{stdout}\nlab stderr:\n{}\ntopo:\n{}\nerrs:\n{}{}{}{}{}",
        String::from_utf8_lossy(&out.stderr),
        log("topo.txt"),
        log("membind1.err"),
        log("interleave.err"),
        log("replicate.err"),
        log("isolate.err"),
        log("bench.err"),
    );
    assert!(out.status.success(), "{ctx}");
    for want in [
        "membind1-exit=0",
        "membind1-il-exit=0",
        "interleave-exit=0",
        "replicate-exit=0",
        "isolate-exit=0",
        "bench-exit=0",
    ] {
        assert!(stdout.contains(want), "missing '{want}'\n{ctx}");
    }
    let json = |f: &str| -> Value {
        serde_json::from_str(&log(f)).unwrap_or_else(|e| panic!("{f}: {e}\n{ctx}"))
    };

    // numactl --membind=1: the file's pages were read under that policy.
    let r = json("membind1.json");
    assert_eq!(r["nodes"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(r["policy_mems"], "1", "{r}");
    let p = pages(&r);
    assert_eq!(p.len(), 1, "{r}");
    // First touch leaves never-read pages absent (rows of the token embedding that no
    // prompt token selects: the lab model's output matrix is its own tensor), so only
    // the resident pages are counted: every one of them on node 1.
    let (_, n0, n1, _absent) = p[0];
    assert!(n1 > 0 && n0 == 0, "membind=1: {r}");

    // Interleave under --membind=1 stays within node 1: numactl is never overridden.
    let r = json("membind1-il.json");
    let p = pages(&r);
    assert!(
        p[0].2 > 0 && p[0].1 == 0 && p[0].3 == 0,
        "membind=1 interleave: {r}"
    );

    // Interleave: one copy, spread evenly over both nodes.
    let r = json("interleave.json");
    let p = pages(&r);
    assert_eq!(p.len(), 1, "{r}");
    let (copy, n0, n1, absent) = p[0];
    assert_eq!(copy, None);
    assert_eq!(absent, 0, "{r}");
    let (lo, hi) = (n0.min(n1) as f64, n0.max(n1) as f64);
    assert!(
        lo > 0.0 && lo / hi > 0.9,
        "interleave should split evenly: {r}"
    );

    // Replicate + distribute: a copy per node, each wholly local; threads on both nodes.
    let r = json("replicate.json");
    let p = pages(&r);
    assert_eq!(p.len(), 2, "{r}");
    for (copy, n0, n1, absent) in p {
        assert_eq!(absent, 0, "{r}");
        match copy {
            Some(0) => assert!(n0 > 0 && n1 == 0, "{r}"),
            Some(1) => assert!(n1 > 0 && n0 == 0, "{r}"),
            _ => panic!("unexpected copy {copy:?}: {r}"),
        }
    }
    assert_eq!(r["thread_plan"]["nodes"], serde_json::json!([0, 1]), "{r}");
    assert_eq!(worker_nodes(&r), [1], "{r}");
    assert_eq!(r["observed"][1]["cpu"], 1, "{r}");

    // Isolate from CPU 1 (node 1), two threads on its one CPU: confined there, not pinned.
    let r = json("isolate.json");
    assert_eq!(r["allowed_cpus"], "1", "{r}");
    assert_eq!(r["thread_plan"]["nodes"], serde_json::json!([1, 1]), "{r}");
    assert_eq!(r["thread_plan"]["cpus"], Value::Null, "{r}");
    assert!(
        r["observed"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["node"] == 1),
        "{r}"
    );

    // The benchmark row carries the same facts.
    let row: Value = serde_json::from_str(log("bench.jsonl").lines().next().unwrap_or("{}"))
        .unwrap_or_else(|e| panic!("bench.jsonl: {e}\n{ctx}"));
    assert_eq!(row["numa"], "distribute", "{row}");
    assert_eq!(row["numa_weights"], "replicate", "{row}");
    assert_eq!(row["numa_nodes"], 2, "{row}");
    assert_eq!(
        row["numa_detail"]["thread_nodes"],
        serde_json::json!([0, 1]),
        "{row}"
    );
    let copies = row["numa_detail"]["weight_pages"].as_array().unwrap();
    assert_eq!(copies.len(), 2, "{row}");
}
