//! `rllama synth` from the command line: a small cut of qwen2.5-7b is written, `inspect`
//! says it is synthetic, the independent `gguf` Python reader sees the same tensor table,
//! `run` generates from it; bad arguments fail without leaving a file behind.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{model, rllama, run_with_timeout};

fn ok(cmd: &mut Command) -> String {
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(cmd: &mut Command) -> String {
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    assert!(!out.status.success(), "{cmd:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn synth_inspect_and_run() {
    if model("qwen2.5-coder-0.5b").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen.gguf");
    let out = ok(rllama()
        .args(["synth", "--shape", "qwen2.5-7b", "--quant", "q4_k_m"])
        .args(["--layers", "2", "--scale-down", "16", "--seed", "3", "-o"])
        .arg(&path));
    assert!(out.contains("wrote"), "{out}");
    assert!(out.contains("vocabulary 151936"), "{out}");

    let text = ok(rllama().arg("inspect").arg(&path));
    assert!(
        text.contains(
            "name:         synthetic qwen2.5-7b (2 of 28 layers, widths / 16, random weights)"
        ),
        "{text}"
    );
    assert!(text.contains("synthetic:    yes"), "{text}");
    assert!(text.contains("file type:    Q4_K - Medium"), "{text}");

    let json: serde_json::Value =
        serde_json::from_str(&ok(rllama().args(["inspect", "--json"]).arg(&path))).unwrap();
    assert_eq!(json["synthetic"], true);
    assert_eq!(json["architecture"], "qwen2");
    assert_eq!(json["metadata"]["rllama.synthetic.seed"], 3);
    assert_eq!(json["metadata"]["qwen2.attention.head_count_kv"], 1);
    assert_eq!(json["tensor_types"]["Q6_K"], 3); // output + layer 1's attn_v, ffn_down

    // The independent reader sees the same table.
    let have_gguf_py = Command::new("python3")
        .args(["-c", "import gguf"])
        .status()
        .is_ok_and(|s| s.success());
    if have_gguf_py {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/gguf_tensors.py");
        let theirs: serde_json::Value =
            serde_json::from_str(&ok(Command::new("python3").arg(script).arg(&path))).unwrap();
        let (ot, tt) = (
            json["tensors"].as_array().unwrap(),
            theirs["tensors"].as_array().unwrap(),
        );
        assert_eq!(ot.len(), tt.len());
        for (o, t) in ot.iter().zip(tt) {
            for k in ["name", "type", "shape", "bytes"] {
                assert_eq!(o[k], t[k], "{}", o["name"]);
            }
        }
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the gguf Python package"
        );
    }

    let run: serde_json::Value = serde_json::from_str(&ok(rllama()
        .args(["run", "-p", "Hello", "-n", "4", "--json", "-t", "2", "-m"])
        .arg(&path)))
    .unwrap();
    assert!(
        !run["generated_ids"].as_array().unwrap().is_empty(),
        "{run}"
    );
}

#[test]
fn synth_rejects_bad_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    let synth = |args: &[&str]| {
        let mut c = rllama();
        c.args(["synth", "-o"]).arg(&path).args(args);
        c
    };
    let e = fails(&mut synth(&["--shape", "llama3-70b"]));
    assert!(e.contains("llama3-8b, qwen2.5-7b"), "{e}");
    let e = fails(&mut synth(&["--shape", "llama3-8b", "--quant", "q2_k"]));
    assert!(e.contains("q4_k_m"), "{e}");
    let e = fails(&mut synth(&["--shape", "llama3-8b", "--layers", "0"]));
    assert!(e.contains("layers"), "{e}");
    let e = fails(&mut synth(&["--shape", "llama3-8b", "--layers", "33"]));
    assert!(e.contains("33 layers"), "{e}");
    let e = fails(&mut synth(&[
        "--shape",
        "llama3-8b",
        "--tokenizer-from",
        "/nonexistent.gguf",
    ]));
    assert!(e.contains("nonexistent"), "{e}");
    assert!(!path.exists());
    assert!(!dir.path().join("bad.gguf.part").exists());
}
