//! `rbench sched`: the benchmark plan under several schedulers, policies, cgroups and
//! placements, with the proof of what ran (see the `sched-experiments` crate), for our
//! engine and llama.cpp's side by side. Engine tests run the engine as the placed child
//! (one repetition per window after its own warmup): `rbench` itself for `rllama` and
//! `llamacpp` (the llama.cpp it links), or a `llama-bench` binary whose JSON rows are read.
//! Serving windows start a server (`rserve`, `llama-server` or any command, as `rbench serve
//! --spawn` takes them) under the variant and run an `rbench serve` sweep against it from
//! outside. `cmd:"…"` runs a user's own benchmark command under the variant. Every thread
//! of the placed process tree is proven, ours or not. `rbench antagonist spin|membw N` is
//! the background load.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use sched_experiments::harness::{Harness, HarnessOptions, WindowOutcome, Workload};
use sched_experiments::plan::{self, Order, Plan, Task};
use sched_experiments::{fingerprint, interrupt, Antagonist, Roots, Variant};

use crate::serve::spawn::{builtin_with, is_label, parse_spawn, SpawnDefaults, SpawnSpec};
use serde_json::{json, Value};

#[derive(Parser, Debug, Default)]
#[command(
    name = "rbench sched",
    about = "Benchmarks under schedulers, policies, cgroups and placements, with proof of which applied",
    after_help = "Variants: eevdf | scx:NAME[:ARGS] | policy:batch|idle|ext|nice:N|fifo:P|rr:P | \
cgroup:cpu.max=QUOTA/PERIOD|cpuset=CPUS[:MEMS]|weight=W | affinity:CPUS | pinned | unpinned | \
numactl:ARGS | numa:distribute|isolate|numactl | weights:first-touch|interleave|replicate, combined \
with '+' (e.g. scx:scx_simple+unpinned, numa:distribute+weights:replicate).\n\
Workloads: ppN, tgN, ppN+tgM, any of them @dDEPTH (on every --engine), \
serve:c=1,4,16[:n=PROMPTS][:len=TOKENS] (against every --spawn server), cmd:\"CMD\" or \
cmd:NAME=\"CMD\" (a command of yours run under each variant through sh -c: exit status, wall \
time, and the llama-bench JSON/JSONL rows or vLLM bench serve result it prints).\n\
Engines: rllama, llamacpp (the llama.cpp rbench links), PATH to a llama-bench binary, or \
NAME=PATH. Servers: rserve, llama-server, NAME=\"CMD ...\" ({port} is replaced; without it \
--host 127.0.0.1 --port P is appended).\n\
Example: rbench sched -m smollm2-135m --variants eevdf,scx:scx_simple,policy:batch \
--engine rllama,llamacpp --spawn rserve --spawn llama-server \
--workloads pp512,tg128,serve:c=1,4,16 -r 5 --result-file sched.jsonl"
)]
pub struct SchedArgs {
    /// Model (registry name or GGUF path).
    #[arg(short = 'm', long)]
    pub model: Option<String>,
    /// Comma list of variants (see below); the first is the baseline of the ratios.
    #[arg(long)]
    pub variants: Option<String>,
    /// One more variant (repeatable; for variants whose text holds a comma).
    #[arg(long = "variant")]
    pub variant: Vec<String>,
    /// Comma list of workloads.
    #[arg(long)]
    pub workloads: Option<String>,
    /// Engines for the ppN/tgN workloads, comma list (repeatable) [default: rllama].
    #[arg(long = "engine", value_name = "LIST")]
    pub engine: Vec<String>,
    /// A server for the serve: workloads (repeatable) [default: rserve].
    #[arg(long = "spawn", value_name = "SERVER")]
    pub spawn: Vec<String>,
    /// Repetitions (windows) per variant and workload.
    #[arg(short = 'r', long = "repetitions")]
    pub reps: Option<usize>,
    /// Compute threads of the workload [default: available CPUs].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Fixed pause between windows, seconds [default: 5].
    #[arg(long)]
    pub cooldown: Option<f64>,
    /// Extra attempts of a window whose proof failed [default: 2].
    #[arg(long)]
    pub retries: Option<usize>,
    /// Window order: abba (default) or shuffled:SEED.
    #[arg(long)]
    pub order: Option<String>,
    /// Background load for every window: spin:N, membw:N or cmd:"...".
    #[arg(long)]
    pub antagonist: Option<String>,
    /// Stop a sched_ext scheduler that already holds the machine (it is not restarted).
    #[arg(long)]
    pub take_over: bool,
    /// Append one JSON line per window here [default: rbench-sched.jsonl].
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// Continue a result file: only the missing windows run.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// A TOML plan with the same keys as these flags (flags override it).
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Serving windows: dataset for `rbench serve` [default: sharegpt-synthetic].
    #[arg(long)]
    pub dataset: Option<String>,
    /// Serving windows: prompts per sweep point [default: 32].
    #[arg(long)]
    pub serve_prompts: Option<usize>,
    /// Serving windows: output tokens per request [default: 64].
    #[arg(long)]
    pub serve_output_len: Option<usize>,
    /// Seconds a workload may run before the window is invalid [default: 1800].
    #[arg(long)]
    pub window_timeout: Option<f64>,
    /// Seconds to wait for a scheduler to take over or let go [default: 30].
    #[arg(long)]
    pub scx_timeout: Option<f64>,
    /// The rserve binary for serving windows [default: next to this rbench].
    #[arg(long)]
    pub rserve: Option<PathBuf>,
    /// Serving windows: per-slot context of the built-in servers [default: 2048].
    #[arg(long)]
    pub serve_ctx: Option<usize>,
}

/// The plan as the TOML file spells it.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    model: Option<String>,
    variants: Option<Vec<String>>,
    workloads: Option<Vec<String>>,
    engines: Option<Vec<String>>,
    servers: Option<Vec<String>>,
    repetitions: Option<usize>,
    threads: Option<usize>,
    cooldown: Option<f64>,
    retries: Option<usize>,
    order: Option<String>,
    antagonist: Option<String>,
    take_over: Option<bool>,
    result_file: Option<PathBuf>,
    dataset: Option<String>,
    serve_prompts: Option<usize>,
    serve_output_len: Option<usize>,
    serve_ctx: Option<usize>,
    window_timeout: Option<f64>,
    scx_timeout: Option<f64>,
}

/// An engine of the ppN/tgN workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineSpec {
    /// Ours: `rbench --engine rllama`.
    Rllama,
    /// The llama.cpp rbench links: `rbench --engine llamacpp`.
    LlamaCpp,
    /// A llama-bench binary (mainline's, ik_llama.cpp's, a user's build).
    LlamaBench { name: String, path: PathBuf },
}

impl EngineSpec {
    pub fn name(&self) -> &str {
        match self {
            EngineSpec::Rllama => "rllama",
            EngineSpec::LlamaCpp => "llamacpp",
            EngineSpec::LlamaBench { name, .. } => name,
        }
    }
}

/// The engine label of `cmd:` workloads.
const CMD_ENGINE: &str = "cmd";

/// Parses `--engine` lists: `rllama`, `llamacpp`, a path to llama-bench (it holds a `/`),
/// or `NAME=PATH`.
pub fn parse_engines(lists: &[String]) -> Result<Vec<EngineSpec>> {
    let mut out: Vec<EngineSpec> = Vec::new();
    for tok in lists
        .iter()
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let e = match tok {
            "rllama" => EngineSpec::Rllama,
            "llamacpp" | "llama.cpp" => EngineSpec::LlamaCpp,
            _ => {
                let (name, path) = match tok.split_once('=') {
                    Some((n, p)) => (n.trim().to_string(), PathBuf::from(p.trim())),
                    None if tok.contains('/') => {
                        let p = PathBuf::from(tok);
                        let n = p
                            .file_name()
                            .map(|f| f.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        (n, p)
                    }
                    None => bail!(
                        "--engine {tok}: not an engine (rllama, llamacpp, a path to llama-bench, \
                         or NAME=PATH)"
                    ),
                };
                if !is_label(&name) {
                    bail!("--engine {tok}: the name must be letters, digits, '-', '_' or '.'");
                }
                if matches!(name.as_str(), "rllama" | "llamacpp" | CMD_ENGINE) {
                    bail!("--engine {tok}: '{name}' is a built-in engine name; give NAME=PATH");
                }
                if !path.is_file() {
                    bail!("--engine {tok}: {} is not a file", path.display());
                }
                EngineSpec::LlamaBench { name, path }
            }
        };
        if out.iter().any(|o| o.name() == e.name()) {
            bail!("--engine: '{}' is listed twice", e.name());
        }
        out.push(e);
    }
    if out.is_empty() {
        out.push(EngineSpec::Rllama);
    }
    Ok(out)
}

/// One workload as written on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadSpec {
    /// llama-bench's tests: prompt, generated tokens, depth; `pg` runs them as one test.
    Engine {
        n_prompt: usize,
        n_gen: usize,
        depth: usize,
        pg: bool,
    },
    Serve {
        concurrency: Vec<String>,
        prompts: Option<usize>,
        output_len: Option<usize>,
    },
    /// A user's command, run through `sh -c` under the variant.
    Cmd { name: String, cmd: String },
}

impl WorkloadSpec {
    pub fn name(&self) -> String {
        match self {
            WorkloadSpec::Engine {
                n_prompt,
                n_gen,
                depth,
                pg,
            } => {
                let base = match (*pg, n_prompt, n_gen) {
                    (true, p, g) => format!("pp{p}+tg{g}"),
                    (false, p, 0) => format!("pp{p}"),
                    (false, _, g) => format!("tg{g}"),
                };
                if *depth > 0 {
                    format!("{base}@d{depth}")
                } else {
                    base
                }
            }
            WorkloadSpec::Serve { concurrency, .. } => format!("serve:c={}", concurrency.join(",")),
            WorkloadSpec::Cmd { name, .. } => format!("cmd:{name}"),
        }
    }
}

/// Splits a workload list on the commas outside double quotes (a `cmd:"…"` keeps its
/// own commas).
fn split_outside_quotes(s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if quoted {
        bail!("workloads {s:?}: a double quote is not closed");
    }
    out.push(cur);
    Ok(out)
}

/// `cmd:"CMD"` or `cmd:NAME="CMD"` (the quotes are optional when CMD has no comma).
fn parse_cmd(tok: &str, rest: &str) -> Result<WorkloadSpec> {
    let unquote = |c: &str| {
        let c = c.trim();
        c.strip_prefix('"')
            .and_then(|c| c.strip_suffix('"'))
            .unwrap_or(c)
            .to_string()
    };
    let named = rest
        .split_once('=')
        .filter(|(n, _)| !n.is_empty() && !n.contains(['"', ' ']));
    let (name, cmd) = match named {
        Some((n, c)) => (n.to_string(), unquote(c)),
        None => {
            let cmd = unquote(rest);
            let first = cmd.split_whitespace().next().unwrap_or_default();
            let base = Path::new(first)
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            (base, cmd)
        }
    };
    if cmd.trim().is_empty() {
        bail!("workload '{tok}': empty command");
    }
    if !is_label(&name) {
        bail!("workload '{tok}': name it with cmd:NAME=\"CMD\" (letters, digits, '-', '_', '.')");
    }
    Ok(WorkloadSpec::Cmd { name, cmd })
}

/// Parses the workload list: `pp512,tg128,pp512+tg128@d1024,serve:c=1,4,16:n=8`. A bare
/// number (or `inf`) after a `serve:c=` item continues its concurrency list.
pub fn parse_workloads(s: &str) -> Result<Vec<WorkloadSpec>> {
    let mut out: Vec<WorkloadSpec> = Vec::new();
    for tok in split_outside_quotes(s)?
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    {
        if let Some(rest) = tok.strip_prefix("cmd:") {
            let w = parse_cmd(tok, rest)?;
            if out.iter().any(|o| o.name() == w.name()) {
                bail!(
                    "workload '{tok}': {} is used twice; name each with cmd:NAME=\"CMD\"",
                    w.name()
                );
            }
            out.push(w);
            continue;
        }
        let continues = tok.chars().all(|c| c.is_ascii_digit())
            || tok == "inf"
            || tok.starts_with(|c: char| c.is_ascii_digit()) && tok.contains(':');
        if continues {
            if let Some(WorkloadSpec::Serve {
                concurrency,
                prompts,
                output_len,
            }) = out.last_mut()
            {
                let (c, opts) = tok.split_once(':').unwrap_or((tok, ""));
                concurrency.push(c.to_string());
                apply_serve_opts(opts, prompts, output_len)?;
                continue;
            }
        }
        if let Some(rest) = tok.strip_prefix("serve:") {
            let rest = rest
                .strip_prefix("c=")
                .with_context(|| format!("workload '{tok}': expected serve:c=LIST"))?;
            let (c, opts) = rest.split_once(':').unwrap_or((rest, ""));
            let mut prompts = None;
            let mut output_len = None;
            apply_serve_opts(opts, &mut prompts, &mut output_len)?;
            out.push(WorkloadSpec::Serve {
                concurrency: vec![c.to_string()],
                prompts,
                output_len,
            });
            continue;
        }
        let (test, depth) = match tok.split_once("@d") {
            Some((t, d)) => (
                t,
                d.parse()
                    .with_context(|| format!("workload '{tok}': bad depth"))?,
            ),
            None => (tok, 0),
        };
        let num = |p: &str, pre: &str| -> Result<usize> {
            p.strip_prefix(pre)
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .with_context(|| format!("workload '{tok}': expected {pre}N"))
        };
        let spec = match test.split_once('+') {
            Some((p, g)) => WorkloadSpec::Engine {
                n_prompt: num(p, "pp")?,
                n_gen: num(g, "tg")?,
                depth,
                pg: true,
            },
            None if test.starts_with("pp") => WorkloadSpec::Engine {
                n_prompt: num(test, "pp")?,
                n_gen: 0,
                depth,
                pg: false,
            },
            None if test.starts_with("tg") => WorkloadSpec::Engine {
                n_prompt: 0,
                n_gen: num(test, "tg")?,
                depth,
                pg: false,
            },
            None => bail!(
                "unknown workload '{tok}' (ppN, tgN, ppN+tgM, @dDEPTH, serve:c=LIST, cmd:\"CMD\")"
            ),
        };
        out.push(spec);
    }
    if out.is_empty() {
        bail!("no workloads given");
    }
    for w in &out {
        if let WorkloadSpec::Serve { concurrency, .. } = w {
            for c in concurrency {
                if c != "inf" && c.parse::<usize>().map_or(true, |n| n == 0) {
                    bail!("serve concurrency '{c}' is not a positive number or inf");
                }
            }
        }
    }
    Ok(out)
}

fn apply_serve_opts(
    opts: &str,
    prompts: &mut Option<usize>,
    len: &mut Option<usize>,
) -> Result<()> {
    for o in opts.split(':').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("n", v)) => *prompts = Some(v.parse().with_context(|| format!("serve n={v}"))?),
            Some(("len", v)) => *len = Some(v.parse().with_context(|| format!("serve len={v}"))?),
            _ => bail!("serve option '{o}' (n=PROMPTS, len=TOKENS)"),
        }
    }
    Ok(())
}

/// Splits a variant list on commas that are not inside an `affinity:` / `cpuset=` CPU list
/// (a part made only of digits and `-` continues the previous variant).
pub fn parse_variants(list: &str, extra: &[String]) -> Result<Vec<Variant>> {
    let mut labels: Vec<String> = Vec::new();
    for tok in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let cpu_part = tok
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == ':');
        match labels.last_mut() {
            Some(prev) if cpu_part && (prev.contains("affinity:") || prev.contains("cpuset=")) => {
                prev.push(',');
                prev.push_str(tok);
            }
            _ => labels.push(tok.to_string()),
        }
    }
    labels.extend(extra.iter().cloned());
    if labels.is_empty() {
        bail!("no variants given (e.g. --variants eevdf,scx:scx_simple,policy:batch)");
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for l in labels {
        if !seen.insert(l.clone()) {
            bail!("variant '{l}' is listed twice");
        }
        out.push(Variant::parse(&l)?);
    }
    Ok(out)
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Everything a plan needs, merged from flags, the plan file and defaults.
struct Settings {
    model: String,
    variants: Vec<Variant>,
    workloads: Vec<WorkloadSpec>,
    engines: Vec<EngineSpec>,
    /// `--spawn` texts, parsed per serving point (slots follow the point's sweep).
    servers: Vec<String>,
    reps: usize,
    threads: usize,
    cooldown: f64,
    retries: usize,
    order: Order,
    antagonist: Option<Antagonist>,
    take_over: bool,
    result_file: PathBuf,
    dataset: String,
    serve_prompts: usize,
    serve_output_len: usize,
    serve_ctx: usize,
    window_timeout: f64,
    scx_timeout: f64,
}

fn settings(a: &SchedArgs) -> Result<Settings> {
    let pf: PlanFile = match &a.plan {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("plan {}", p.display()))?
        }
        None => PlanFile::default(),
    };
    let variants = match (&a.variants, &pf.variants) {
        (Some(v), _) => parse_variants(v, &a.variant)?,
        (None, Some(v)) => parse_variants(&v.join(","), &a.variant)?,
        (None, None) => parse_variants("", &a.variant)?,
    };
    let workloads = match (&a.workloads, &pf.workloads) {
        (Some(w), _) => parse_workloads(w)?,
        (None, Some(w)) => parse_workloads(&w.join(","))?,
        (None, None) => parse_workloads("pp512,tg128")?,
    };
    let order = match a.order.as_ref().or(pf.order.as_ref()).map(String::as_str) {
        None | Some("abba") => Order::Abba,
        Some(o) => match o.strip_prefix("shuffled:").and_then(|s| s.parse().ok()) {
            Some(seed) => Order::Shuffled(seed),
            None => bail!("--order {o}: abba or shuffled:SEED"),
        },
    };
    let antagonist = a
        .antagonist
        .as_ref()
        .or(pf.antagonist.as_ref())
        .map(|s| Antagonist::parse(s))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let engines = if a.engine.is_empty() {
        parse_engines(&pf.engines.clone().unwrap_or_default())?
    } else {
        parse_engines(&a.engine)?
    };
    let servers: Vec<String> = if !a.spawn.is_empty() {
        a.spawn.clone()
    } else {
        pf.servers.clone().unwrap_or_else(|| vec!["rserve".into()])
    };
    let mut seen = std::collections::BTreeSet::new();
    for sv in &servers {
        let name = sv.split_once('=').map_or(sv.as_str(), |(n, _)| n).trim();
        if !seen.insert(name.to_string()) {
            bail!("--spawn: '{name}' is listed twice");
        }
    }
    let reps = a.reps.or(pf.repetitions).unwrap_or(5);
    if reps == 0 {
        bail!("-r must be at least 1");
    }
    Ok(Settings {
        model: a
            .model
            .clone()
            .or(pf.model)
            .unwrap_or_else(|| runtime::registry::DEFAULT_MODEL.to_string()),
        variants,
        workloads,
        engines,
        servers,
        reps,
        threads: a
            .threads
            .or(pf.threads)
            .unwrap_or_else(runtime::options::default_threads),
        cooldown: a.cooldown.or(pf.cooldown).unwrap_or(5.0),
        retries: a.retries.or(pf.retries).unwrap_or(2),
        order,
        antagonist,
        take_over: a.take_over || pf.take_over.unwrap_or(false),
        result_file: a
            .resume
            .clone()
            .or_else(|| a.result_file.clone())
            .or(pf.result_file)
            .unwrap_or_else(|| PathBuf::from("rbench-sched.jsonl")),
        dataset: a
            .dataset
            .clone()
            .or(pf.dataset)
            .unwrap_or_else(|| "sharegpt-synthetic".into()),
        serve_prompts: a.serve_prompts.or(pf.serve_prompts).unwrap_or(32),
        serve_output_len: a.serve_output_len.or(pf.serve_output_len).unwrap_or(64),
        serve_ctx: a.serve_ctx.or(pf.serve_ctx).unwrap_or(2048),
        window_timeout: a.window_timeout.or(pf.window_timeout).unwrap_or(1800.0),
        scx_timeout: a.scx_timeout.or(pf.scx_timeout).unwrap_or(30.0),
    })
}

/// The engine-test command line of `e` for one test.
fn engine_argv(
    e: &EngineSpec,
    rbench: &str,
    model: &str,
    threads: usize,
    (n_prompt, n_gen, depth, pg): (usize, usize, usize, bool),
) -> Vec<String> {
    let exe = match e {
        EngineSpec::LlamaBench { path, .. } => path.display().to_string(),
        _ => rbench.to_string(),
    };
    let mut argv = vec![exe, "-m".into(), model.to_string()];
    if pg {
        argv.extend(["-p".into(), "0".into(), "-n".into(), "0".into()]);
        argv.extend(["-pg".into(), format!("{n_prompt},{n_gen}")]);
    } else {
        argv.extend([
            "-p".into(),
            n_prompt.to_string(),
            "-n".into(),
            n_gen.to_string(),
        ]);
    }
    // An older llama-bench has no -d: it is given only when asked for.
    if depth > 0 || !matches!(e, EngineSpec::LlamaBench { .. }) {
        argv.extend(["-d".into(), depth.to_string()]);
    }
    argv.extend([
        "-t".into(),
        threads.to_string(),
        "-r".into(),
        "1".into(),
        "-o".into(),
        "jsonl".into(),
    ]);
    match e {
        EngineSpec::Rllama => argv.push("--no-progress".into()),
        EngineSpec::LlamaCpp => {
            argv.extend(["--engine".into(), "llamacpp".into(), "--no-progress".into()])
        }
        EngineSpec::LlamaBench { .. } => {}
    }
    argv
}

/// The tasks as the harness runs them: each engine test on every engine, each serving
/// point against every server, each command once.
fn tasks(
    s: &Settings,
    model: &Path,
    rbench: &Path,
    rserve: &Path,
    scratch: &Path,
) -> Result<Vec<Task>> {
    let exe = rbench.display().to_string();
    let model = model.display().to_string();
    let mut out = Vec::new();
    for (i, w) in s.workloads.iter().enumerate() {
        let name = w.name();
        match w {
            WorkloadSpec::Engine {
                n_prompt,
                n_gen,
                depth,
                pg,
            } => {
                for e in &s.engines {
                    out.push(Task {
                        engine: e.name().to_string(),
                        workload: Workload::Command {
                            name: name.clone(),
                            argv: engine_argv(
                                e,
                                &exe,
                                &model,
                                s.threads,
                                (*n_prompt, *n_gen, *depth, *pg),
                            ),
                        },
                    });
                }
            }
            WorkloadSpec::Cmd { cmd, .. } => out.push(Task {
                engine: CMD_ENGINE.into(),
                workload: Workload::Command {
                    name,
                    argv: vec!["sh".into(), "-c".into(), cmd.clone()],
                },
            }),
            WorkloadSpec::Serve {
                concurrency,
                prompts,
                output_len,
            } => {
                // One window per concurrency point and server, each with a fresh server:
                // a point never inherits the prefix cache (or the heap) of the points
                // before it. Every point's server has the same slots, the sweep's largest
                // concurrency.
                let parallel = concurrency
                    .iter()
                    .filter_map(|c| c.parse::<usize>().ok())
                    .max()
                    .unwrap_or(16)
                    .clamp(1, 64);
                let defaults = SpawnDefaults {
                    model: model.clone(),
                    threads: s.threads,
                    parallel,
                    ctx: s.serve_ctx,
                };
                for c in concurrency {
                    for (j, text) in s.servers.iter().enumerate() {
                        let spec = match text.trim() {
                            "rserve" => builtin_with("rserve", &defaults, Some(rserve))?,
                            _ => parse_spawn(text, &defaults)?,
                        };
                        out.push(Task {
                            engine: spec.name.clone(),
                            workload: serve_point(
                                s,
                                &exe,
                                &spec,
                                &model,
                                c,
                                prompts.unwrap_or(s.serve_prompts),
                                output_len.unwrap_or(s.serve_output_len),
                                &scratch.join(format!("serve-{i}-{c}-{j}.jsonl")),
                            )?,
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// One serving window: the server of `spec` on a free port, a discarded warmup request,
/// then `rbench serve` at concurrency `c` writing its result line to `result`.
#[allow(clippy::too_many_arguments)] // the point's settings, all plain values
fn serve_point(
    s: &Settings,
    exe: &str,
    spec: &SpawnSpec,
    model: &str,
    c: &str,
    prompts: usize,
    output_len: usize,
    result: &Path,
) -> Result<Workload> {
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let url = format!("http://{addr}");
    let server_argv = if spec.shell {
        vec!["sh".into(), "-c".into(), spec.command_line(port)]
    } else {
        let p = port.to_string();
        spec.argv.iter().map(|a| a.replace("{port}", &p)).collect()
    };
    let client = |dataset: &str, n: usize, conc: &str, len: usize| -> Vec<String> {
        [
            exe,
            "serve",
            "--url",
            &url,
            "--dataset",
            dataset,
            "--num-prompts",
            &n.to_string(),
            "--concurrency",
            conc,
            "--output-len",
            &len.to_string(),
            "--tokenizer-model",
            model,
            "--ignore-eos",
        ]
        .map(String::from)
        .to_vec()
    };
    let mut client_argv = client(&s.dataset, prompts, c, output_len);
    client_argv.extend(["--result-file".to_string(), result.display().to_string()]);
    Ok(Workload::Serve {
        name: format!("serve:c={c}"),
        server_argv,
        addr,
        health_path: "/health".into(),
        warmup_argv: Some(client("fixed:16/4", 1, "1", 4)),
        client_argv,
    })
}

/// The fields kept from an engine's result row (rbench's and llama-bench's share
/// llama-bench's names).
const ENGINE_KEEP: [&str; 16] = [
    "avg_ts",
    "stddev_ts",
    "samples_ts",
    "avg_ns",
    "n_prompt",
    "n_gen",
    "n_depth",
    "n_threads",
    "pinned",
    "isa",
    "numa",
    "numa_weights",
    "numa_nodes",
    "numa_detail",
    "build_commit",
    "cpu_info",
];

/// The fields kept from a serving result (vLLM's `bench serve` names).
const SERVE_KEEP: [&str; 20] = [
    "max_concurrency",
    "num_prompts",
    "completed",
    "failed",
    "success_rate",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p99_e2el_ms",
    "dataset",
];

fn keep(v: &Value, keys: &[&str]) -> Value {
    Value::Object(
        keys.iter()
            .filter_map(|k| v.get(*k).map(|x| (k.to_string(), x.clone())))
            .collect(),
    )
}

/// The JSON values a command printed: JSONL lines, or one JSON document (llama-bench's
/// `-o json` array, a result object), flattened one array level.
fn json_values(out: &str) -> Vec<Value> {
    let mut vals: Vec<Value> = match serde_json::from_str::<Value>(out.trim()) {
        Ok(v) => vec![v],
        Err(_) => out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .collect(),
    };
    vals = vals
        .into_iter()
        .flat_map(|v| match v {
            Value::Array(a) => a,
            v => vec![v],
        })
        .filter(Value::is_object)
        .collect();
    vals
}

/// vLLM's `bench serve` printed result block ("Output token throughput (tok/s):  123.4"),
/// under its JSON field names.
fn vllm_printed_result(out: &str) -> Option<Value> {
    const NAMES: [(&str, &str); 18] = [
        ("Successful requests", "completed"),
        ("Failed requests", "failed"),
        ("Maximum request concurrency", "max_concurrency"),
        ("Benchmark duration (s)", "duration"),
        ("Request throughput (req/s)", "request_throughput"),
        ("Output token throughput (tok/s)", "output_throughput"),
        ("Total Token throughput (tok/s)", "total_token_throughput"),
        ("Mean TTFT (ms)", "mean_ttft_ms"),
        ("Median TTFT (ms)", "median_ttft_ms"),
        ("P99 TTFT (ms)", "p99_ttft_ms"),
        ("Mean TPOT (ms)", "mean_tpot_ms"),
        ("Median TPOT (ms)", "median_tpot_ms"),
        ("P99 TPOT (ms)", "p99_tpot_ms"),
        ("Mean ITL (ms)", "mean_itl_ms"),
        ("Median ITL (ms)", "median_itl_ms"),
        ("P99 ITL (ms)", "p99_itl_ms"),
        ("Median E2EL (ms)", "median_e2el_ms"),
        ("P99 E2EL (ms)", "p99_e2el_ms"),
    ];
    let mut m = serde_json::Map::new();
    for l in out.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let k = k.trim();
        if let Some((_, name)) = NAMES.iter().find(|(t, _)| t.eq_ignore_ascii_case(k)) {
            if let Ok(x) = v.trim().parse::<f64>() {
                m.insert(name.to_string(), json!(x));
            }
        }
    }
    if !m.contains_key("output_throughput") {
        return None;
    }
    if let (Some(ok), Some(bad)) = (
        m.get("completed").and_then(Value::as_f64),
        m.get("failed").and_then(Value::as_f64),
    ) {
        if ok + bad > 0.0 {
            m.insert("success_rate".into(), json!(ok / (ok + bad)));
        }
    }
    Some(Value::Object(m))
}

/// What a `cmd:` window's command reported: llama-bench rows (JSON or JSONL), serving
/// results (vLLM's or `rbench serve`'s JSON, or vLLM's printed block), and the headline
/// `figure` of the report (t/s of a single row, output tok/s of a single result, else
/// the wall time).
fn cmd_metrics(o: &WindowOutcome) -> Value {
    let vals = json_values(&o.stdout);
    let rows: Vec<Value> = vals
        .iter()
        .filter(|v| v.get("avg_ts").is_some())
        .map(|v| keep(v, &ENGINE_KEEP))
        .collect();
    let mut points: Vec<Value> = vals
        .iter()
        .filter(|v| v.get("output_throughput").is_some())
        .map(|v| keep(v, &SERVE_KEEP))
        .collect();
    if points.is_empty() {
        points.extend(vllm_printed_result(&o.stdout));
    }
    let (figure, unit) = match (rows.as_slice(), points.as_slice()) {
        ([r], []) => (r["avg_ts"].clone(), "t/s"),
        ([], [p]) => (p["output_throughput"].clone(), "out tok/s"),
        _ => (json!(o.duration_s), "s wall"),
    };
    json!({
        "wall_s": o.duration_s,
        "exit": o.exit,
        "rows": rows,
        "points": points,
        "figure": figure,
        "unit": unit,
    })
}

/// The metrics of a window and the reasons its output makes it invalid.
fn window_metrics(
    variant: Option<&Variant>,
    task: &Task,
    o: &WindowOutcome,
) -> (Value, Vec<String>) {
    let mut reasons = Vec::new();
    let engine = task.engine.as_str();
    match &task.workload {
        Workload::Command { .. } if engine == CMD_ENGINE => (cmd_metrics(o), reasons),
        Workload::Command { .. } => {
            let ours = matches!(engine, "rllama" | "llamacpp");
            let rows: Vec<Value> = json_values(&o.stdout)
                .into_iter()
                .filter(|v| v.get("avg_ts").is_some())
                .collect();
            let Some(r) = rows.first() else {
                if o.valid {
                    reasons.push(format!("{engine} printed no result row"));
                }
                return (Value::Null, reasons);
            };
            if let Some(v) = variant {
                // pinned/unpinned switch our pool; llama.cpp never pins its threads.
                match (v.pin, engine, r["pinned"].as_bool()) {
                    (Some(false), "rllama", Some(true)) => reasons
                        .push("the variant is unpinned but rbench reports pinned threads".into()),
                    (Some(true), "rllama", Some(false)) => reasons.push(
                        "the variant is pinned but rbench could not pin (fewer allowed CPUs than threads?)"
                            .into(),
                    ),
                    (Some(true), e, _) if e != "rllama" => reasons.push(format!(
                        "`pinned` is rllama's pool pinning; {e} does not pin its threads \
                         (compare placements with affinity:CPUS instead)"
                    )),
                    _ => {}
                }
                if !ours && (v.numa.is_some() || v.weights.is_some()) {
                    reasons.push(format!(
                        "numa:/weights: are rllama's placement; {engine} ignores them (use numactl:ARGS)"
                    ));
                }
                if ours {
                    if let Some(m) = &v.numa {
                        if r["numa"].as_str() != Some(m.as_str()) {
                            reasons.push(format!(
                                "the variant asks for --numa {m} but the row says {}",
                                r["numa"]
                            ));
                        }
                    }
                    if let Some(w) = &v.weights {
                        if r["numa_weights"].as_str() != Some(w.as_str()) {
                            reasons.push(format!(
                                "the variant asks for --numa-weights {w} but the row says {}",
                                r["numa_weights"]
                            ));
                        }
                    }
                }
            }
            (keep(r, &ENGINE_KEEP), reasons)
        }
        Workload::Serve { client_argv, .. } => {
            let file = client_argv
                .iter()
                .position(|a| a == "--result-file")
                .and_then(|i| client_argv.get(i + 1))
                .map(PathBuf::from);
            let text = file
                .as_ref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .unwrap_or_default();
            if let Some(f) = &file {
                let _ = std::fs::remove_file(f);
            }
            let points: Vec<Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .map(|p| keep(&p, &SERVE_KEEP))
                .collect();
            if points.is_empty() && o.valid {
                reasons.push("rbench serve wrote no result".into());
            }
            (json!({ "points": points }), reasons)
        }
    }
}

/// `rbench antagonist spin|membw N`: background load until killed.
pub fn antagonist_main(args: Vec<String>) -> ExitCode {
    let kind = args.get(1).map(String::as_str).unwrap_or("");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1).max(1);
    match kind {
        "spin" => {
            for _ in 0..n {
                std::thread::spawn(|| {
                    let mut x = 1u64;
                    loop {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                });
            }
        }
        "membw" => {
            // One buffer far above the caches, streamed by every thread.
            let buf: &'static [u64] = Box::leak(vec![1u64; 32 << 20].into_boxed_slice());
            for t in 0..n {
                std::thread::spawn(move || loop {
                    let mut s = 0u64;
                    let start = t * buf.len() / n;
                    for &v in buf[start..].iter().chain(&buf[..start]) {
                        s = s.wrapping_add(v);
                    }
                    std::hint::black_box(s);
                });
            }
        }
        _ => {
            eprintln!("usage: rbench antagonist spin|membw N");
            return ExitCode::from(2);
        }
    }
    loop {
        std::thread::park();
    }
}

/// Entry point for `rbench sched ARGS…`.
pub fn main_with_args(args: Vec<String>) -> ExitCode {
    let a: SchedArgs = match crate::parse_args(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The sibling binary `name` of the running rbench.
fn sibling(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating rbench")?;
    let p = me.with_file_name(name);
    if !p.is_file() {
        bail!(
            "{} not found next to rbench; build it (cargo build --release -p server) or pass --rserve",
            p.display()
        );
    }
    Ok(p)
}

pub fn run(a: &SchedArgs) -> Result<ExitCode> {
    let s = settings(a)?;
    if a.resume.is_some() && !s.result_file.exists() {
        bail!("--resume {}: no such file", s.result_file.display());
    }
    let rbench = std::env::current_exe().context("locating rbench")?;
    let needs_server = s
        .workloads
        .iter()
        .any(|w| matches!(w, WorkloadSpec::Serve { .. }))
        && s.servers.iter().any(|t| t.trim() == "rserve");
    let engine_tests = s
        .workloads
        .iter()
        .any(|w| matches!(w, WorkloadSpec::Engine { .. }));
    if engine_tests && s.engines.contains(&EngineSpec::LlamaCpp) {
        crate::llama_bench::llamacpp_engine_available()?;
    }
    let rserve = match (&a.rserve, needs_server) {
        (Some(p), _) => p.clone(),
        (None, true) => sibling("rserve")?,
        (None, false) => PathBuf::new(),
    };
    let scratch = tempfile::Builder::new()
        .prefix("rbench-sched-")
        .tempdir()
        .context("creating a scratch directory")?;
    let roots = Roots::host();
    let h = Harness::new(
        roots.clone(),
        HarnessOptions {
            scx_timeout: Duration::from_secs_f64(s.scx_timeout),
            window_timeout: Duration::from_secs_f64(s.window_timeout),
            log_dir: scratch.path().to_path_buf(),
            antagonist: s.antagonist.clone(),
            antagonist_argv: vec![rbench.display().to_string(), "antagonist".into()],
            ..Default::default()
        },
    );
    // Everything that can be refused is refused before the first window (and before a
    // model download).
    let bins = h.preflight(&s.variants, s.take_over)?;
    let model =
        runtime::registry::resolve(&s.model).with_context(|| format!("model '{}'", s.model))?;
    interrupt::install();
    let plan = Plan {
        variants: s.variants.clone(),
        tasks: tasks(&s, &model, &rbench, &rserve, scratch.path())?,
        reps: s.reps,
        cooldown: Duration::from_secs_f64(s.cooldown),
        retries: s.retries,
        order: s.order,
        take_over: s.take_over,
    };
    let scx_bins: Vec<(String, PathBuf)> =
        bins.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut fp = fingerprint::collect(&roots, &scx_bins);
    fp["rbench_model"] = json!(model.display().to_string());
    fp["threads"] = json!(s.threads);
    fp["engines"] = json!(s
        .engines
        .iter()
        .map(|e| match e {
            EngineSpec::LlamaBench { name, path } => json!({"name": name, "path": path}),
            e => json!({"name": e.name(), "path": rbench}),
        })
        .collect::<Vec<_>>());
    fp["servers"] = json!(s.servers);
    eprintln!(
        "rbench sched: {} variants x {} tasks (workload on engine) x {} repetitions on {}; results -> {}",
        plan.variants.len(),
        plan.tasks.len(),
        plan.reps,
        fingerprint::label(&fp),
        s.result_file.display()
    );
    let mut metrics = |v: &Variant, t: &Task, o: &WindowOutcome| window_metrics(Some(v), t, o);
    let mut progress = |m: &str| eprintln!("rbench sched: {m}");
    let r = plan::run(
        &h,
        &plan,
        &bins,
        &s.result_file,
        &fp,
        &mut metrics,
        &mut progress,
    );
    match r {
        Ok(sum) => {
            eprintln!(
                "rbench sched: {} windows run ({} valid, {} invalid, {} still invalid after retries), {} already in the file",
                sum.windows_run, sum.valid, sum.invalid, sum.exhausted, sum.skipped
            );
            let report = crate::report::sched::load(std::slice::from_ref(&s.result_file))?;
            print!("{}", crate::report::sched::markdown(&report));
            Ok(if sum.exhausted > 0 {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            })
        }
        // An interrupt that lands while a scheduler is starting arrives as the scheduler
        // step's own `Interrupted`: the same clean stop (the lab test once saw exit 1).
        Err(plan::PlanError::Harness(e)) if e.is_interrupted() => {
            eprintln!(
                "rbench sched: interrupted; the scheduler was stopped and the machine restored. \
                 Finished windows are in {f}; `rbench sched --resume {f}` (same flags) runs the rest.",
                f = s.result_file.display()
            );
            Ok(ExitCode::from(130))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_lists() {
        let w = parse_workloads("pp512,tg128,pp64+tg16@d256,serve:c=1,4,16:n=8,tg4").unwrap();
        assert_eq!(
            w.iter().map(WorkloadSpec::name).collect::<Vec<_>>(),
            ["pp512", "tg128", "pp64+tg16@d256", "serve:c=1,4,16", "tg4"]
        );
        assert_eq!(
            w[3],
            WorkloadSpec::Serve {
                concurrency: vec!["1".into(), "4".into(), "16".into()],
                prompts: Some(8),
                output_len: None
            }
        );
        for bad in [
            "pp",
            "pp0",
            "xx12",
            "serve:c=0",
            "serve:1",
            "serve:c=2:k=1",
            "",
        ] {
            assert!(parse_workloads(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn variant_lists_keep_cpu_lists_together() {
        let v = parse_variants(
            "eevdf,affinity:0,2-3,cgroup:cpuset=0,1:0,policy:batch",
            &["scx:scx_simple".into()],
        )
        .unwrap();
        let labels: Vec<&str> = v.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "eevdf",
                "affinity:0,2-3",
                "cgroup:cpuset=0,1:0",
                "policy:batch",
                "scx:scx_simple"
            ]
        );
        assert!(parse_variants("eevdf,eevdf", &[]).is_err());
        assert!(parse_variants("", &[]).is_err());
    }

    #[test]
    fn plan_files_and_flags_merge() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("plan.toml");
        std::fs::write(
            &p,
            "model = \"smollm2-135m\"\nvariants = [\"eevdf\", \"policy:batch\"]\n\
             workloads = [\"pp64\", \"serve:c=1,4\"]\nrepetitions = 3\nantagonist = \"spin:2\"\n\
             order = \"shuffled:9\"\n",
        )
        .unwrap();
        let a = SchedArgs {
            plan: Some(p.clone()),
            reps: Some(7),
            ..Default::default()
        };
        let s = settings(&a).unwrap();
        assert_eq!(s.variants.len(), 2);
        assert_eq!(s.workloads.len(), 2);
        assert_eq!(s.reps, 7, "flags override the plan");
        assert_eq!(s.antagonist, Some(Antagonist::Spin(2)));
        assert_eq!(s.order, Order::Shuffled(9));
        std::fs::write(&p, "variant = [\"eevdf\"]\n").unwrap();
        let e = settings(&a).err().unwrap();
        assert!(format!("{e:#}").contains("unknown field"), "{e:#}");
    }

    #[test]
    fn engines_servers_and_commands_parse() {
        let d = tempfile::tempdir().unwrap();
        let lb = d.path().join("llama-bench");
        std::fs::write(&lb, "").unwrap();
        let e = parse_engines(&[
            format!("rllama,llamacpp,{}", lb.display()),
            format!("ik={}", lb.display()),
        ])
        .unwrap();
        let names: Vec<&str> = e.iter().map(EngineSpec::name).collect();
        assert_eq!(names, ["rllama", "llamacpp", "llama-bench", "ik"]);
        assert_eq!(parse_engines(&[]).unwrap(), vec![EngineSpec::Rllama]);
        for bad in [
            "rllama,rllama",
            "vllm",
            "ik=/no/such/file",
            "rllama=/bin/sh",
        ] {
            assert!(parse_engines(&[bad.to_string()]).is_err(), "{bad}");
        }
        let w = parse_workloads(
            r#"pp8,cmd:"python3 bench.py --sizes 1,2,4",cmd:mine="sh -c 'echo 1, 2'",serve:c=1,2"#,
        )
        .unwrap();
        assert_eq!(
            w.iter().map(WorkloadSpec::name).collect::<Vec<_>>(),
            ["pp8", "cmd:python3", "cmd:mine", "serve:c=1,2"]
        );
        assert_eq!(
            w[1],
            WorkloadSpec::Cmd {
                name: "python3".into(),
                cmd: "python3 bench.py --sizes 1,2,4".into()
            }
        );
        assert_eq!(
            w[2],
            WorkloadSpec::Cmd {
                name: "mine".into(),
                cmd: "sh -c 'echo 1, 2'".into()
            }
        );
        for bad in [r#"cmd:"a,b"#, "cmd:", r#"cmd:"x",cmd:"x""#] {
            assert!(parse_workloads(bad).is_err(), "{bad}");
        }
    }

    fn outcome(stdout: &str) -> WindowOutcome {
        WindowOutcome {
            valid: true,
            reasons: vec![],
            proof: Value::Null,
            stdout: stdout.into(),
            stderr_tail: String::new(),
            exit: "exit status: 0".into(),
            duration_s: 2.5,
        }
    }

    fn command(engine: &str) -> Task {
        Task {
            engine: engine.into(),
            workload: Workload::Command {
                name: "w".into(),
                argv: vec![],
            },
        }
    }

    #[test]
    fn foreign_rows_and_command_figures() {
        // llama-bench's own JSONL row on an external engine.
        let row = r#"{"build_commit": "abc", "n_prompt": 64, "n_gen": 0, "avg_ts": 900.5, "samples_ts": [900.5]}"#;
        let (m, r) = window_metrics(
            Some(&Variant::parse("eevdf").unwrap()),
            &command("llama-bench"),
            &outcome(row),
        );
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(
            (m["avg_ts"].as_f64(), m["build_commit"].as_str()),
            (Some(900.5), Some("abc"))
        );
        // Our pool's switches mean nothing to llama.cpp: said, not silently accepted.
        let (_, r) = window_metrics(
            Some(&Variant::parse("pinned").unwrap()),
            &command("llamacpp"),
            &outcome(row),
        );
        assert!(r[0].contains("does not pin"), "{r:?}");
        let (_, r) = window_metrics(
            Some(&Variant::parse("numa:distribute").unwrap()),
            &command("llama-bench"),
            &outcome(row),
        );
        assert!(r.iter().any(|x| x.contains("numactl")), "{r:?}");
        let (_, r) = window_metrics(None, &command("llama-bench"), &outcome("built\n"));
        assert_eq!(r, ["llama-bench printed no result row"]);
        // A command printing llama-bench's -o json array: its rows; one row is the figure.
        let arr = format!("[{row}]");
        let (m, r) = window_metrics(None, &command(CMD_ENGINE), &outcome(&arr));
        assert!(r.is_empty());
        assert_eq!(
            (m["figure"].as_f64(), m["unit"].as_str()),
            (Some(900.5), Some("t/s"))
        );
        // vLLM's printed result block.
        let vllm = "============ Serving Benchmark Result ============\n\
            Successful requests:                     30\nFailed requests:                         2\n\
            Request throughput (req/s):              1.5\nOutput token throughput (tok/s):         96.25\n\
            Median TTFT (ms):                        40.1\nP99 TPOT (ms):                           12.0\n";
        let (m, _) = window_metrics(None, &command(CMD_ENGINE), &outcome(vllm));
        let p = &m["points"][0];
        assert_eq!(p["output_throughput"], 96.25);
        assert_eq!(p["median_ttft_ms"], 40.1);
        assert_eq!(p["success_rate"], 30.0 / 32.0);
        assert_eq!(m["figure"], 96.25);
        // Anything else: exit status and wall time.
        let (m, _) = window_metrics(None, &command(CMD_ENGINE), &outcome("done\n"));
        assert_eq!(
            (m["figure"].as_f64(), m["unit"].as_str()),
            (Some(2.5), Some("s wall"))
        );
        assert_eq!(m["exit"], "exit status: 0");
    }

    #[test]
    fn tasks_cover_every_engine_and_server() {
        let d = tempfile::tempdir().unwrap();
        let lb = d.path().join("llama-bench");
        std::fs::write(&lb, "").unwrap();
        let model = d.path().join("m.gguf");
        std::fs::write(&model, "").unwrap();
        let rserve = d.path().join("rserve");
        std::fs::write(&rserve, "").unwrap();
        let a = SchedArgs {
            model: Some(model.display().to_string()),
            variants: Some("eevdf".into()),
            workloads: Some(r#"pp8@d16,serve:c=1,2,cmd:"true""#.into()),
            engine: vec![format!("rllama,llamacpp,{}", lb.display())],
            spawn: vec!["rserve".into(), "other=my-server --flag".into()],
            threads: Some(2),
            ..Default::default()
        };
        let s = settings(&a).unwrap();
        let t = tasks(&s, &model, Path::new("/x/rbench"), &rserve, d.path()).unwrap();
        let names: Vec<(String, String)> = t
            .iter()
            .map(|t| (t.workload.name().to_string(), t.engine.clone()))
            .collect();
        let want = [
            ("pp8@d16", "rllama"),
            ("pp8@d16", "llamacpp"),
            ("pp8@d16", "llama-bench"),
            ("serve:c=1", "rserve"),
            ("serve:c=1", "other"),
            ("serve:c=2", "rserve"),
            ("serve:c=2", "other"),
            ("cmd:true", "cmd"),
        ];
        assert_eq!(
            names,
            want.map(|(a, b)| (a.to_string(), b.to_string())).to_vec()
        );
        let argv = |i: usize| match &t[i].workload {
            Workload::Command { argv, .. } => argv.join(" "),
            Workload::Serve { server_argv, .. } => server_argv.join(" "),
        };
        assert!(
            argv(1).contains("--engine llamacpp") && argv(1).contains("-d 16"),
            "{}",
            argv(1)
        );
        assert!(
            argv(2).starts_with(&lb.display().to_string()) && argv(2).contains("-o jsonl"),
            "{}",
            argv(2)
        );
        assert!(
            argv(3).starts_with(&rserve.display().to_string()),
            "{}",
            argv(3)
        );
        assert!(
            argv(4).starts_with("sh -c my-server --flag --host 127.0.0.1 --port "),
            "{}",
            argv(4)
        );
        assert_eq!(argv(7), "sh -c true");
    }

    #[test]
    fn metrics_from_rbench_rows() {
        let w = command("rllama");
        let o = WindowOutcome {
            valid: true,
            reasons: vec![],
            proof: Value::Null,
            stdout: r#"{"avg_ts": 12.5, "samples_ts": [12.5], "pinned": true, "n_prompt": 8, "isa": "Q4_1=avx2"}"#.into(),
            stderr_tail: String::new(),
            exit: "exit status: 0".into(),
            duration_s: 1.0,
        };
        let unpinned = Variant::parse("unpinned").unwrap();
        let (m, r) = window_metrics(Some(&unpinned), &w, &o);
        assert_eq!(m["avg_ts"], 12.5);
        assert_eq!(r.len(), 1, "pinned rows in an unpinned variant are caught");
        let (_, r) = window_metrics(Some(&Variant::parse("eevdf").unwrap()), &w, &o);
        assert!(r.is_empty());
        // A NUMA variant whose row shows other settings is caught; a matching one keeps
        // the row's NUMA proof in the metrics.
        let numa = Variant::parse("numa:distribute+weights:replicate").unwrap();
        let (_, r) = window_metrics(Some(&numa), &w, &o);
        assert_eq!(r.len(), 2, "{r:?}");
        let placed = WindowOutcome {
            stdout: r#"{"avg_ts": 3.0, "numa": "distribute", "numa_weights": "replicate", "numa_detail": {"thread_nodes": [0, 1]}}"#.into(),
            ..o.clone()
        };
        let (m, r) = window_metrics(Some(&numa), &w, &placed);
        assert!(r.is_empty(), "{r:?}");
        assert_eq!(m["numa_detail"]["thread_nodes"], serde_json::json!([0, 1]));
        let empty = WindowOutcome {
            stdout: String::new(),
            ..o
        };
        assert_eq!(
            window_metrics(None, &w, &empty).1,
            vec!["rllama printed no result row"]
        );
    }
}
