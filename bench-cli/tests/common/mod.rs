//! Shared by the lab tests: booting the guest.

use std::path::Path;
use std::process::{Command, Output};

/// Runs `lab/run ARGS` in `dir`. A guest that dies before the script prints anything
/// (`lab/run` exits 255 with empty output: a QEMU or boot failure, seen once in a few
/// dozen boots on a loaded host) is booted once more, saying so; a guest that dies
/// after the script started is the result, not retried.
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
