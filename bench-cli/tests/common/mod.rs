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

/// The directory holding rbench (with the llama.cpp engine), rserve and rllama built for
/// the guest's CPU (`x86-64-v3`, into `target/lab`), or the one `RBENCH_LAB_BIN` (rbench)
/// lies in.
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
            "--features",
            "bench-cli/llamacpp",
        ])
        .current_dir(repo())
        // Alone (no `native` before it), this target-cpu makes the linked llama.cpp
        // portable too: `rbench sched --engine llamacpp` runs it in the guest.
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

/// The model the lab tests run: a synthetic llama-3 layout cut to two layers of width 256
/// (`runtime::synth`, Q4_K_M, smollm2-135m's tokenizer), written once into
/// `target/lab-models/`. It is a real GGUF that our whole load and forward path runs, but
/// about a tenth of smollm2's work per token: what these tests check is which scheduler or
/// NUMA node the work ran under, not the model's text, and the emulated guest runs our
/// code several hundred times slower than the host. `None` (after saying why) where the
/// tokenizer's source model is not to be had.
pub fn lab_model() -> Option<PathBuf> {
    use runtime::synth;
    let tok_name = "smollm2-135m";
    let tok_path = runtime::registry::test_model(tok_name)?;
    let dir = repo().join("target/lab-models");
    let path = dir.join("llama3-lab-2l-w256.gguf");
    if path.is_file() {
        return Some(path);
    }
    std::fs::create_dir_all(&dir).unwrap();
    let tok = runtime::GgufFile::open(&tok_path).expect("tokenizer source");
    let shape = synth::Shape::llama3_8b().scaled_down(32).with_layers(2);
    shape
        .validate(synth::SynthQuant::Q4KM)
        .expect("lab model shape");
    let spec = synth::SynthSpec {
        shape,
        quant: synth::SynthQuant::Q4KM,
        seed: 0,
        tokenizer: &tok,
        tokenizer_name: tok_name.to_string(),
        pad_vocab: false,
    };
    let tmp = dir.join(format!("lab-model.{}.tmp", std::process::id()));
    synth::synthesize(&spec, &tmp, |_, _| {}).expect("writing the lab model");
    std::fs::rename(&tmp, &path).unwrap();
    Some(path)
}
