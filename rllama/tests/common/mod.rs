//! Helpers shared by the `rllama` binary's tests.
#![allow(dead_code, unused_imports)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use runtime::registry::test_model as model;

pub const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

/// Runs a command with a deadline, so a hang fails the test instead of stalling CI.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut so, &mut v).ok();
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut se, &mut v).ok();
        v
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            child.kill().ok();
            panic!("command {cmd:?} did not finish within {limit:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    }
}

pub fn rllama() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rllama"))
}
