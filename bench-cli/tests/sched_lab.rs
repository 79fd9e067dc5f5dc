//! `rbench sched` on a kernel where schedulers really switch: the lab guest (a Linux 6.12
//! kernel with sched_ext, `../shared/lab`). One guest boot runs
//!
//! 1. a plan with `eevdf`, `scx:scx_simple` and `scx:scx_qmap` on the lab model (a
//!    two-layer synthetic llama-3, `common::lab_model`) and a tiny workload on both
//!    engines (ours and the llama.cpp rbench links, built for the guest's CPU), and checks
//!    the recorded proof of every window (ops names, every workload thread's
//!    `ext.enabled`, the kernel back on `disabled` after each window), llama.cpp's
//!    threads as ours;
//! 2. a run interrupted with SIGINT in the middle of an scx window: the scheduler must be
//!    gone and the state `disabled`, and `--resume` must run only the missing windows.
//!
//! The guest is emulated (about 90x slower than the host), so the binaries are built for
//! `x86-64-v3` into `target/lab`, rbench with the `llamacpp` feature (or taken from
//! `RBENCH_LAB_BIN`, the rbench binary with rserve beside it). One vCPU: with two, this guest's kernel sometimes oopses while
//! disabling a scheduler (an int3 in `__schedule` during text patching under QEMU TCG).
//! Without the lab the test is skipped with a message, unless `RBENCH_LAB_REQUIRED=1`
//! (CI), where that is a failure.

mod common;

use std::path::Path;

use serde_json::Value;

fn windows(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "sched_window")
        .collect()
}

#[test]
fn schedulers_switch_for_real_and_the_proof_says_so() {
    let Some(run) = common::lab_run("scheduler experiments") else {
        return;
    };
    let Some(model) = common::lab_model() else {
        return;
    };
    let rbench = common::lab_bins().join("rbench");
    // The guest can write only its working directory, shared with the host.
    let dir = common::repo().join("target/lab-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The model is read from the guest's tmpfs: through the host share every window's
    // process would fault its weights in over 9p again (tens of seconds each, emulated).
    let common = format!(
        "{rb} sched -m /dev/shm/model.gguf -t 1 --cooldown 1",
        rb = rbench.display(),
    );
    let script = format!(
        r#"set -u
cp {m} /dev/shm/model.gguf
{common} --variants eevdf,scx:scx_simple,scx:scx_qmap --engine rllama,llamacpp --workloads pp2+tg2 -r 1 --result-file plan.jsonl > plan.md 2> plan.err
echo "plan-exit=$?"
echo "after-plan-state=$(cat /sys/kernel/sched_ext/state)"
# Interrupt in the middle of an scx window.
{common} --workloads pp2,tg2 --variants scx:scx_simple -r 2 --result-file int.jsonl > int.md 2> int.err &
pid=$!
for i in $(seq 1 600); do
  [ "$(cat /sys/kernel/sched_ext/state)" = enabled ] && break
  sleep 0.1
done
echo "during-state=$(cat /sys/kernel/sched_ext/state) ops=$(cat /sys/kernel/sched_ext/root/ops 2>/dev/null)"
sleep 2
kill -INT $pid
wait $pid
echo "int-exit=$?"
echo "after-int-state=$(cat /sys/kernel/sched_ext/state)"
echo "scx-procs=$(pgrep -cx scx_simple || true)"
{common} --workloads pp2,tg2 --variants scx:scx_simple -r 2 --resume int.jsonl > resume.md 2> resume.err
echo "resume-exit=$?"
echo "after-resume-state=$(cat /sys/kernel/sched_ext/state)"
"#,
        m = model.display()
    );
    std::fs::write(dir.join("lab.sh"), script).unwrap();
    let out = common::run_guest(
        &run,
        &["--cpus", "1", "--mem", "2G", "--", "bash", "lab.sh"],
        &dir,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let ctx = format!(
        "lab stdout:\n{stdout}\nlab stderr:\n{}\nplan.err:\n{}\nint.err:\n{}\nresume.err:\n{}",
        String::from_utf8_lossy(&out.stderr),
        log("plan.err"),
        log("int.err"),
        log("resume.err")
    );
    assert!(out.status.success(), "{ctx}");
    for want in [
        "plan-exit=0",
        "after-plan-state=disabled",
        "during-state=enabled ops=simple",
        "int-exit=130",
        "after-int-state=disabled",
        "scx-procs=0",
        "resume-exit=0",
        "after-resume-state=disabled",
    ] {
        assert!(stdout.contains(want), "missing '{want}'\n{ctx}");
    }

    // 1. The plan's proof.
    let ws = windows(&dir.join("plan.jsonl"));
    assert_eq!(ws.len(), 6, "{ctx}");
    let engines: Vec<&str> = ws.iter().map(|w| w["engine"].as_str().unwrap()).collect();
    assert_eq!(
        engines,
        ["rllama", "llamacpp", "rllama", "llamacpp", "rllama", "llamacpp"],
        "{ctx}"
    );
    for w in &ws {
        let v = w["variant"].as_str().unwrap();
        assert_eq!(w["valid"], true, "{w}");
        let threads = w["proof"]["threads"].as_array().unwrap();
        assert!(!threads.is_empty(), "{w}");
        match v {
            "eevdf" => {
                assert_eq!(w["proof"]["start"]["state"], "disabled", "{w}");
                assert!(threads.iter().all(|t| t["ext_enabled"] == false), "{w}");
            }
            _ => {
                let ops = v.strip_prefix("scx:scx_").unwrap();
                assert_eq!(w["proof"]["start"]["ops"], ops, "{w}");
                assert_eq!(w["proof"]["end"]["ops"], ops, "{w}");
                assert_eq!(
                    w["proof"]["start"]["enable_seq"],
                    w["proof"]["end"]["enable_seq"]
                );
                assert_eq!(w["proof"]["scheduler_pid_alive_at_end"], true, "{w}");
                assert_eq!(w["proof"]["released"]["state"], "disabled", "{w}");
                assert!(threads.iter().all(|t| t["ext_enabled"] == true), "{w}");
            }
        }
        assert!(w["metrics"]["avg_ts"].as_f64().unwrap() > 0.0, "{w}");
    }
    for e in ["rllama", "llamacpp"] {
        assert!(
            log("plan.md").contains(&format!("| scx:scx_qmap | {e} | qmap | 100% |")),
            "{}",
            log("plan.md")
        );
    }
    assert!(
        log("plan.md").contains("rllama / llamacpp [95% CI]"),
        "{}",
        log("plan.md")
    );

    // 2. Interrupted, then resumed: every window exactly once, all valid.
    let ws = windows(&dir.join("int.jsonl"));
    let mut keys: Vec<(u64, String)> = ws
        .iter()
        .map(|w| {
            (
                w["rep"].as_u64().unwrap(),
                w["workload"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [(0, "pp2"), (0, "tg2"), (1, "pp2"), (1, "tg2")]
            .map(|(r, w)| (r, w.to_string()))
            .to_vec(),
        "{ctx}"
    );
    assert!(ws.iter().all(|w| w["valid"] == true), "{ctx}");
    assert!(log("int.err").contains("--resume"), "{}", log("int.err"));
}
