//! `rllama devices`: the ggml backends and devices found, and the reasons a machine is CPU
//! only. Backend modules that must be refused are real shared libraries compiled here: one
//! reporting another ggml backend API version (a library built for another ggml), and one
//! needing a driver library that is not installed.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{rllama, run_with_timeout};

fn ok(cmd: &mut Command) -> String {
    let out = run_with_timeout(cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The libraries the build put beside the binary; `None` (test skipped) when this build
/// has no ggml, which `GGML_SYS_REQUIRED=1` (CI) turns into a failure.
fn built_ggml_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_BIN_EXE_rllama"))
        .parent()
        .unwrap()
        .join("ggml");
    if dir.join("libggml.so").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("GGML_SYS_REQUIRED").as_deref() != Ok("1"),
        "GGML_SYS_REQUIRED=1 but {} has no libggml.so",
        dir.display()
    );
    eprintln!(
        "SKIPPED: this build has no ggml ({} missing)",
        dir.display()
    );
    None
}

fn cc(dir: &Path, name: &str, source: &str, extra: &[&str]) {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join(name))
        .arg(&c)
        .args(extra)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn devices_lists_the_cpu_backend_and_says_why_cpu_only() {
    let Some(_) = built_ggml_dir() else { return };
    let text = ok(rllama().arg("devices"));
    assert!(text.starts_with("ggml 0."), "{text}");
    assert!(text.contains("(backend API "), "{text}");
    let cpu = text
        .lines()
        .find(|l| l.starts_with("CPU "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(cpu.contains(" cpu "), "{cpu}");
    assert!(cpu.contains(" GiB / "), "{cpu}");
    assert!(
        text.contains("CPU only: no libggml-cuda.so, libggml-vulkan.so, libggml-sycl.so in "),
        "{text}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&ok(rllama().args(["devices", "--json"]))).unwrap();
    assert_eq!(json["cpu_only"], true);
    let backends = json["backends"].as_array().unwrap();
    let cpu = backends.iter().find(|b| b["backend"] == "cpu").unwrap();
    assert_eq!(cpu["name"], "CPU");
    assert_eq!(cpu["devices"][0]["kind"], "cpu");
    assert!(cpu["devices"][0]["memory_total"].as_u64().unwrap() > 0);
}

#[test]
fn a_directory_without_ggml_is_cpu_only_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let text = ok(rllama().arg("devices").arg("--ggml-dir").arg(dir.path()));
    assert!(text.contains("ggml: not available"), "{text}");
    assert!(text.contains("CPU only: no ggml: "), "{text}");
    assert!(
        text.contains(&dir.path().display().to_string()) || text.contains("built without ggml"),
        "{text}"
    );
}

#[test]
fn backends_built_for_another_ggml_or_missing_a_driver_are_refused_by_name() {
    let Some(built) = built_ggml_dir() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&built).unwrap().flatten() {
        // Dereferenced copies: libggml.so needs libggml-base.so.0 by soname, and the base
        // library is loaded first by path, so any of its names will do.
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    // A "Vulkan" module from another ggml: its registry entry reports backend API 2.
    cc(
        dir.path(),
        "libggml-vulkan.so",
        "struct reg { int api_version; void *iface[8]; void *context; };\n\
         static struct reg r = { 2, {0}, 0 };\n\
         int ggml_backend_score(void) { return 1; }\n\
         void *ggml_backend_init(void) { return &r; }\n",
        &[],
    );
    // A "CUDA" module whose driver library is not installed: linked against a stub that is
    // then removed, as libggml-cuda.so is against libcuda.so.1.
    let stub = tempfile::tempdir().unwrap();
    cc(
        stub.path(),
        "libfakedriver.so.1",
        "int fake_driver_init(void) { return 0; }\n",
        &[],
    );
    cc(
        dir.path(),
        "libggml-cuda.so",
        "extern int fake_driver_init(void);\n\
         int ggml_backend_score(void) { return 1; }\n\
         void *ggml_backend_init(void) { fake_driver_init(); return 0; }\n",
        &[&format!("{}/libfakedriver.so.1", stub.path().display())],
    );
    drop(stub);

    let text = ok(rllama().arg("devices").arg("--ggml-dir").arg(dir.path()));
    let api = text
        .lines()
        .next()
        .and_then(|l| l.split("(backend API ").nth(1))
        .and_then(|r| r.split(')').next())
        .unwrap_or_else(|| panic!("{text}"))
        .to_string();
    assert_ne!(api, "2", "{text}");
    let version = text.split_whitespace().nth(1).unwrap().to_string();
    assert!(
        text.contains(&format!(
            "libggml-vulkan.so: refused: built for another ggml: backend API version 2, \
             this build's ggml {version} uses {api}"
        )),
        "{text}"
    );
    assert!(
        text.contains("libggml-cuda.so: refused: does not load: "),
        "{text}"
    );
    assert!(text.contains("libfakedriver.so.1"), "{text}");
    // Still serves on the CPU backend, and says why there is no device.
    assert!(
        text.lines()
            .any(|l| l.starts_with("CPU ") && l.contains(" cpu ")),
        "{text}"
    );
    let last = text.lines().last().unwrap();
    assert!(
        last.starts_with("CPU only: cuda: does not load: "),
        "{last}"
    );
    assert!(
        last.contains("vulkan: built for another ggml: backend API version 2"),
        "{last}"
    );
    assert!(last.contains("no libggml-sycl.so in "), "{last}");
}

#[test]
fn run_with_layers_offloaded_and_without_a_gpu() {
    let Some(_) = built_ggml_dir() else { return };
    if common::model("smollm2-135m").is_none() {
        return;
    }
    let args = [
        "run",
        "-m",
        "smollm2-135m",
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "-t",
        "2",
    ];
    let out = run_with_timeout(
        rllama().args(args).args(["-ngl", "99", "-dev", "CPU"]),
        Duration::from_secs(120),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("offload: 30 layers + output on CPU (CPU): weights "),
        "{err}"
    );
    assert!(err.contains("finish: length"), "{err}");
    // No GPU here: -ngl without --device names the reason and the way out.
    let out = run_with_timeout(
        rllama().args(args).args(["-ngl", "4"]),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot offload: no GPU device found"), "{err}");
    assert_eq!(err.matches("no GPU device found").count(), 1, "{err}");
    // Too little device memory: how many layers would fit.
    let out = run_with_timeout(
        rllama()
            .args(args)
            .args(["-ngl", "99", "-dev", "CPU"])
            .env("RLLAMA_OFFLOAD_MEM_LIMIT", "100M"),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("30 layers and the output layer need"), "{err}");
    assert!(err.contains("layers would fit (-ngl "), "{err}");
}
