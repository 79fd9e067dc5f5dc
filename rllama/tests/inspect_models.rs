//! `rllama inspect --json` on the real models agrees with the independent `gguf` Python
//! reader on tensor count, names, types, shapes and byte sizes.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{model, rllama, run_with_timeout, MODELS};

fn python_gguf_available() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn inspect_json_matches_gguf_py_on_all_models() {
    if !python_gguf_available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the gguf Python package"
        );
        eprintln!("skipping: `pip install gguf` to run this comparison");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/gguf_tensors.py");
    for name in MODELS {
        let Some(path) = model(name) else { return };
        let ours = run_with_timeout(
            rllama().args(["inspect", "--json"]).arg(&path),
            Duration::from_secs(60),
        );
        assert!(
            ours.status.success(),
            "{}",
            String::from_utf8_lossy(&ours.stderr)
        );
        let ours: serde_json::Value = serde_json::from_slice(&ours.stdout).unwrap();
        let theirs = run_with_timeout(
            Command::new("python3").arg(script).arg(&path),
            Duration::from_secs(120),
        );
        assert!(
            theirs.status.success(),
            "{}",
            String::from_utf8_lossy(&theirs.stderr)
        );
        let theirs: serde_json::Value = serde_json::from_slice(&theirs.stdout).unwrap();

        let ot = ours["tensors"].as_array().unwrap();
        let tt = theirs["tensors"].as_array().unwrap();
        assert_eq!(ot.len(), tt.len(), "{name}: tensor count");
        assert_eq!(ours["n_tensors"].as_u64().unwrap() as usize, tt.len());
        for (o, t) in ot.iter().zip(tt) {
            assert_eq!(o["name"], t["name"], "{name}");
            assert_eq!(o["type"], t["type"], "{name}: {}", o["name"]);
            assert_eq!(o["shape"], t["shape"], "{name}: {}", o["name"]);
            assert_eq!(o["bytes"], t["bytes"], "{name}: {}", o["name"]);
        }
        let keys: Vec<&String> = ours["metadata"].as_object().unwrap().keys().collect();
        let their_keys: Vec<String> =
            serde_json::from_value(theirs["metadata_keys"].clone()).unwrap();
        let mut a: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
        let mut b: Vec<&str> = their_keys.iter().map(|s| s.as_str()).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{name}: metadata keys");
        eprintln!("{name}: {} tensors agree", ot.len());
    }
}

#[test]
fn inspect_json_reports_architecture_and_types() {
    let Some(path) = model("gemma3-270m") else {
        return;
    };
    let out = run_with_timeout(
        rllama().args(["inspect", "--json"]).arg(&path),
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "gemma3");
    let types = v["tensor_types"].as_object().unwrap();
    for t in ["Q5_0", "Q4_K", "Q8_0", "Q6_K", "F32"] {
        assert!(types.contains_key(t), "missing {t} in {types:?}");
    }
}
