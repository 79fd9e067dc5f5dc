//! `rbench`: the llama-bench-compatible engine benchmark (see BENCHMARKS.md for the
//! definitions), optionally side by side with llama.cpp.

pub mod cli;
#[cfg(feature = "llamacpp")]
mod reference;
pub mod report;
pub mod run;
pub mod sys;

use std::io::Write;

use anyhow::{Context, Result};

use cli::{Engine, Params};
use report::{Printer, RunInfo};
use run::{BenchOptions, LoadedModel, Progress, TestResult};

/// Short git hash of this build, from the build script.
pub const BUILD_COMMIT: &str = env!("RBENCH_GIT_COMMIT");
/// Commit count of this build's history, from the build script.
pub const BUILD_NUMBER: &str = env!("RBENCH_GIT_COUNT");

/// llama.cpp's build description (`llama_print_system_info`).
#[cfg(feature = "llamacpp")]
fn llamacpp_system_info() -> String {
    llamacpp_ref::system_info()
}

/// Never reached: `check_supported` refuses `--engine llamacpp` without the feature.
#[cfg(not(feature = "llamacpp"))]
fn llamacpp_system_info() -> String {
    String::new()
}

/// A clear error, before anything runs, when the linked llama.cpp was built for CPU
/// features this CPU lacks (it would die of SIGILL).
#[cfg(feature = "llamacpp")]
fn llamacpp_runs_here() -> Result<()> {
    match llamacpp_ref::cpu_mismatch() {
        Some(why) => anyhow::bail!("--engine llamacpp: {why}"),
        None => Ok(()),
    }
}

#[cfg(not(feature = "llamacpp"))]
fn llamacpp_runs_here() -> Result<()> {
    Ok(())
}

/// Whether `--engine llamacpp` can run in this build on this CPU (for callers that start
/// rbench later, such as `rbench sched`): the feature is compiled in and the linked
/// llama.cpp's CPU features are this CPU's.
pub fn llamacpp_engine_available() -> Result<()> {
    if !cfg!(feature = "llamacpp") {
        anyhow::bail!(run::NOT_BUILT);
    }
    llamacpp_runs_here()
}

/// Runs the benchmark described by `params`, writing results to `out`.
pub fn run<W: Write>(params: &Params, out: W) -> Result<Vec<TestResult>> {
    run::check_supported(params)?;
    let llamacpp_system_info = if params.engines.contains(&Engine::LlamaCpp) {
        llamacpp_runs_here()?;
        let info = llamacpp_system_info();
        if params.engines.contains(&Engine::Rllama) {
            // Checked before anything runs: no ratio against a crippled reference.
            run::check_reference_simd(&info)?;
        }
        Some(info)
    } else {
        None
    };

    sys::apply(params)?;

    // Resolve (and fetch) every model before timing anything, so a typo fails fast.
    let mut paths = Vec::new();
    for m in &params.models {
        let p = runtime::registry::resolve(m).with_context(|| format!("model '{m}'"))?;
        paths.push((m.clone(), p));
    }

    let load_note = report::load_note(report::load_average(), cli::default_threads());
    if let Some(n) = &load_note {
        eprintln!("rbench: {n}");
    }
    let info = RunInfo {
        build_commit: BUILD_COMMIT.to_string(),
        build_number: BUILD_NUMBER.parse().unwrap_or(0),
        version: env!("CARGO_PKG_VERSION").to_string(),
        cpu_info: report::cpu_info(),
        cpu_mask: params.cpu_mask.clone().unwrap_or_else(|| "0x0".into()),
        llamacpp_system_info,
        load_note,
        interleave_note: (params.interleave > 0).then(|| {
            format!(
                "note: tg tests interleaved: the engines took turns every {} generated tokens \
                 (--interleave), so both ran in the same machine state; pp and pg tests \
                 alternate whole repetitions",
                params.interleave
            )
        }),
    };
    let mut printer = Printer::new(out, params, info);
    printer.header()?;

    let tests = params.tests();
    let mut progress = Progress::new(params.progress);
    let mut results: Vec<TestResult> = Vec::new();
    let mut loaded: Option<(LoadedModel, usize)> = None;
    let run_opts = BenchOptions::from_params(params);
    let outcome = (|| -> Result<()> {
        for (i, spec) in tests.iter().enumerate() {
            let path = &paths
                .iter()
                .find(|(name, _)| *name == spec.model)
                .expect("every test's model was resolved")
                .1;
            if !matches!(&loaded, Some((l, ngl)) if &l.path == path && *ngl == spec.n_gpu_layers) {
                loaded = None; // drop the previous model (and its device buffers) first
                loaded = Some((
                    LoadedModel::open_offloaded(path, params, spec.n_gpu_layers)?,
                    spec.n_gpu_layers,
                ));
            }
            let model = &loaded.as_ref().expect("just loaded").0;
            if i > 0 {
                run::delay(params.delay);
            }
            let rs = run::run_test(spec, i, tests.len(), model, &run_opts, &mut progress)?;
            for r in &rs {
                printer.test(r)?;
            }
            results.extend(rs);
        }
        Ok(())
    })();
    progress.finish_line();
    // Close the output (valid JSON, the build line) even when a test failed.
    printer.footer(&results)?;
    outcome?;
    Ok(results)
}

/// Entry point for the binary: parses `args`, runs, maps errors to exit codes
/// (2 = usage, 1 = failure).
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let params = match Params::parse_from(args) {
        Ok(p) => p,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let stdout = std::io::stdout();
    match run(&params, stdout.lock()) {
        Ok(_) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rbench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
