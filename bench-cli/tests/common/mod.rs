//! Shared by the lab tests: finding the lab, building for its CPU, booting the guest.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `../shared/lab/run`, or `None` after saying why the test is skipped; without the lab
/// and with `RBENCH_LAB_REQUIRED` set (CI), that is a failure. `topic` names the
/// ARCHITECTURE.md section the message points to.
pub fn lab_run(topic: &str) -> Option<PathBuf> {
    let run = repo().join("../shared/lab/run");
    if run.is_file() {
        return Some(run);
    }
    assert!(
        std::env::var_os("RBENCH_LAB_REQUIRED").is_none(),
        "RBENCH_LAB_REQUIRED is set but ../shared/lab/run is missing"
    );
    eprintln!("skipping: no lab at ../shared/lab (see ARCHITECTURE.md, {topic})");
    None
}

/// The directory holding rbench, rserve and rllama built for the guest's CPU
/// (`x86-64-v3`, into `target/lab`), or the one `RBENCH_LAB_BIN` (rbench) lies in.
pub fn lab_bins() -> PathBuf {
    if let Some(p) = std::env::var_os("RBENCH_LAB_BIN") {
        return PathBuf::from(p).parent().unwrap().to_path_buf();
    }
    let target = repo().join("target/lab");
    let st = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "-p",
            "bench-cli",
            "-p",
            "server",
            "-p",
            "rllama",
            "--bins",
        ])
        .current_dir(repo())
        .env("RUSTFLAGS", "-C target-cpu=x86-64-v3")
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("running cargo");
    assert!(st.success(), "building the lab binaries failed");
    target.join("release")
}

/// Runs `lab/run ARGS` in `dir`. A guest that dies before the script prints anything
/// (`lab/run` exits 255 with empty output: a QEMU or boot failure, as one fresh-clone
/// CI run here had) is booted once more, saying so; a guest that dies after the script
/// started is the result, not retried.
pub fn run_guest(run: &Path, args: &[&str], dir: &Path) -> Output {
    let boot = || {
        Command::new(run)
            .args(args)
            .current_dir(dir)
            .output()
            .expect("running the lab")
    };
    let out = boot();
    if out.status.code() == Some(255) && out.stdout.is_empty() {
        eprintln!(
            "lab guest died before the script ran; booting it once more\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return boot();
    }
    out
}
