//! rserve replicas behind `sglang-router` on emulated machines (`tools/router_lab.py`, in
//! short form): two workers, each in a network namespace of its own behind a veth link,
//! the router and `rbench serve` in a third; nothing can leave the machine.
//!
//! - A multi-tenant shared-prefix load through the router: the cache-aware policy must
//!   find more of the prompts in the workers' prefix caches (their /metrics) than round
//!   robin, with every request answered under both.
//! - A worker killed mid-run: only requests in flight at the kill may fail, and every
//!   request sent after it must succeed.
//! - A worker restarted on its `--kv-persist` directory must find its prefixes again
//!   (beside the same restart on an empty directory).
//!
//! Times are printed, never asserted (speed is the evidence run's: the script in full
//! form, with netem-shaped links). Skipped, with the reason, without root, iproute2, curl,
//! sglang-router or `RSERVE_BIN`; under `RSERVE_ROUTER_REQUIRED=1` (CI) those are failures.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn skip(why: &str) {
    assert!(
        std::env::var("RSERVE_ROUTER_REQUIRED").as_deref() != Ok("1"),
        "RSERVE_ROUTER_REQUIRED=1 but {why}"
    );
    eprintln!("SKIPPED: {why}");
}

fn ready() -> Option<String> {
    let Ok(rserve) = std::env::var("RSERVE_BIN") else {
        skip("RSERVE_BIN is not set (the path of a built rserve)");
        return None;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("not root (the lab makes network namespaces)");
        return None;
    }
    for tool in ["ip", "tc", "curl"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            skip(&format!("{tool} is not installed"));
            return None;
        }
    }
    let router = Command::new("python3")
        .args(["-c", "import sglang_router"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !router {
        skip("sglang-router is not installed (pip install sglang-router==0.3.2)");
        return None;
    }
    Some(rserve)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn replicas_behind_sglang_router() {
    let Some(rserve) = ready() else { return };
    let Some(model) = runtime::registry::test_model("smollm2-135m") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .arg(root.join("tools/router_lab.py"))
        .args(["--out", out.path().to_str().unwrap()])
        .args([
            "--rserve",
            &rserve,
            "--rbench",
            env!("CARGO_BIN_EXE_rbench"),
        ])
        .args(["--model", model.to_str().unwrap()])
        .args(["--phases", "sweep,kill,persist"])
        .args(["--num-prompts", "32", "--kill-prompts", "32"])
        .status()
        .unwrap();
    let res: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap())
            .unwrap();
    for log in ["worker0.log", "worker1.log", "router.log"] {
        let text = std::fs::read_to_string(out.path().join(log)).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(8).collect();
        eprintln!(
            "--- {log} (last lines)\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    eprintln!("{}", serde_json::to_string_pretty(&res).unwrap());
    assert!(status.success(), "router_lab failed: {}", res["error"]);

    // The sweep: every request answered under both policies; cache-aware routing keeps
    // each tenant on one worker, so more of each prompt is found cached.
    let m = &res["sweep"]["median"];
    for p in ["cache_aware", "round_robin"] {
        assert_eq!(f(&m[p]["success_rate"]), 1.0, "{p}: {}", m[p]);
    }
    let (ca, rr) = (
        f(&m["cache_aware"]["hit_rate"]),
        f(&m["round_robin"]["hit_rate"]),
    );
    assert!(
        ca > rr + 0.05,
        "cache-aware hit rate {ca:.3} is not above round robin's {rr:.3}"
    );
    // Both workers served under both policies.
    for run in res["sweep"]["runs"].as_array().unwrap() {
        for w in run["per_worker"].as_array().unwrap() {
            assert!(f(&w["requests"]) > 0.0, "a worker got no request: {run}");
        }
    }

    // The kill: the victim was busy, and only what was in flight failed (on the client's
    // clock: sent before the kill and unanswered by then). The victim's own count is
    // printed beside it; a request it had ended can still be in transit when it dies.
    let k = &res["kill"];
    assert!(f(&k["inflight_at_kill"]) >= 1.0, "{k}");
    assert_eq!(f(&k["failed_sent_after_kill"]), 0.0, "{k}");
    assert_eq!(f(&k["failed"]), f(&k["failed_unfinished_at_kill"]), "{k}");
    assert!(
        f(&k["sent_after_kill"]) >= 1.0,
        "nothing was sent after the kill: {k}"
    );

    // The restart: on its --kv-persist directory the victim finds its prefixes again; on
    // an empty one it cannot.
    let p = &res["persist"];
    let kept = f(&p["persist"]["hit_rate_after_restart"]);
    let warm = f(&p["persist"]["hit_rate_warm"]);
    let lost = f(&p["empty"]["hit_rate_after_restart"]);
    assert!(f(&p["persist"]["files"]) >= 1.0, "{p}");
    assert!(
        kept >= 0.8 * warm,
        "hit rate {kept:.3} after the restart, {warm:.3} before: {p}"
    );
    assert!(
        kept > lost + 0.1,
        "persisted {kept:.3} vs empty {lost:.3}: {p}"
    );
}
