//! `rbench` command line: llama-bench's flags, value lists and ranges, and the expansion
//! of parameter lists into the tests to run (their Cartesian product, in llama-bench's
//! order).

use std::fmt;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Parser, ValueEnum};

/// Output format of the results on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Markdown table (llama-bench's default).
    Md,
    /// Comma-separated values with a header line.
    Csv,
    /// A JSON array of test objects.
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// An engine under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// Our runtime.
    Rllama,
    /// llama.cpp through `runtime::reference` (needs the `llamacpp` feature).
    LlamaCpp,
}

impl Engine {
    /// The name used on the command line and in the `engine` field.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Rllama => "rllama",
            Engine::LlamaCpp => "llamacpp",
        }
    }

    /// A human-readable name for tables.
    pub fn display(self) -> &'static str {
        match self {
            Engine::Rllama => "rllama",
            Engine::LlamaCpp => "llama.cpp",
        }
    }

    pub fn parse(s: &str) -> Result<Engine> {
        match s.trim().to_ascii_lowercase().as_str() {
            "rllama" | "ours" => Ok(Engine::Rllama),
            "llamacpp" | "llama.cpp" | "llama-cpp" => Ok(Engine::LlamaCpp),
            other => bail!("unknown engine '{other}' (known: rllama, llamacpp)"),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const AFTER_HELP: &str = "\
Multiple values can be given for each test parameter by separating them with ',' or by \
giving the flag several times (-p 128,512 -p 1024). Ranges: 'first-last', \
'first-last+step' or 'first-last*mult' (e.g. -t 1-4, -p 128-1024*2). Every combination \
of model, batch sizes, threads and depth runs each of the pp, tg and pg tests.

Tests, as llama-bench defines them: ppN evaluates a prompt of N random tokens (BOS first \
when the model adds one) in n_batch chunks; tgN generates N tokens one at a time (random \
tokens are fed, sampling is not timed); pgPP,TG does both; '@ dD' first fills the KV cache \
with D tokens (not timed). t/s = (n_prompt + n_gen) / seconds per repetition; the table \
shows the mean and the sample standard deviation.

--engine rllama,llamacpp runs each test on both engines, alternating repetitions \
(rllama, llama.cpp, rllama, ...), and prints the ours/llama.cpp ratio per test. llama.cpp \
runs with its defaults (flash attention auto, f16 KV cache). It needs a build with \
`cargo build --release -p bench-cli --features llamacpp`.";

/// The raw command line (before list expansion). Multi-letter single-dash flags
/// (`-pg`, `-ub`) are rewritten by [`normalize_args`] before clap sees them.
#[derive(Parser, Debug)]
#[command(
    name = "rbench",
    version,
    about = "llama-bench-compatible engine benchmark for rllama (and llama.cpp side by side)",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Model: registry name (fetched when missing) or GGUF path [default: smollm2-135m]
    #[arg(short = 'm', long = "model", value_name = "NAME|PATH", action = ArgAction::Append)]
    pub model: Vec<String>,
    /// Prompt tokens for the pp test; 0 = no pp test [default: 512]
    #[arg(short = 'p', long = "n-prompt", value_name = "N", action = ArgAction::Append)]
    pub n_prompt: Vec<String>,
    /// Generated tokens for the tg test; 0 = no tg test [default: 128]
    #[arg(short = 'n', long = "n-gen", value_name = "N", action = ArgAction::Append)]
    pub n_gen: Vec<String>,
    /// Prompt + generation test, `-pg PP,TG` (repeatable)
    #[arg(long = "pg", value_name = "PP,TG", action = ArgAction::Append)]
    pub pg: Vec<String>,
    /// KV cache depth: tokens already in the cache when the test starts [default: 0]
    #[arg(short = 'd', long = "n-depth", value_name = "N", action = ArgAction::Append)]
    pub n_depth: Vec<String>,
    /// Threads [default: available cores]
    #[arg(short = 't', long = "threads", value_name = "N", action = ArgAction::Append)]
    pub threads: Vec<String>,
    /// Repetitions of each test
    #[arg(
        short = 'r',
        long = "repetitions",
        value_name = "N",
        default_value_t = 5
    )]
    pub repetitions: usize,
    /// Logical batch size (tokens per llama_decode call) [default: 2048]
    #[arg(short = 'b', long = "batch-size", value_name = "N", action = ArgAction::Append)]
    pub n_batch: Vec<String>,
    /// Physical batch size, `-ub` [default: 512]. rllama evaluates prompts in chunks of
    /// min(n_batch, n_ubatch) tokens per forward pass
    #[arg(long = "ubatch-size", value_name = "N", action = ArgAction::Append)]
    pub n_ubatch: Vec<String>,
    /// Output format on stdout
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    pub output: OutputFormat,
    /// Skip the warmup run (one prompt pass and one generated token) before each test
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// Seconds to sleep between tests
    #[arg(long = "delay", value_name = "SECONDS", default_value_t = 0.0)]
    pub delay: f64,
    /// Process priority: -1 low, 0 normal, 1 medium, 2 high, 3 realtime (as nice values
    /// 5, 0, -5, -10, -20; raising it needs privileges)
    #[arg(
        long = "prio",
        value_name = "-1|0|1|2|3",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub prio: i32,
    /// CPU affinity mask in hex (e.g. 0x3 = CPUs 0 and 1), applied to the whole process
    #[arg(short = 'C', long = "cpu-mask", value_name = "HEX", action = ArgAction::Append)]
    pub cpu_mask: Vec<String>,
    /// Engines, comma-separated: rllama, llamacpp. With both, repetitions alternate and a
    /// ratio table is printed
    #[arg(long = "engine", value_name = "LIST", action = ArgAction::Append)]
    pub engine: Vec<String>,
    /// Progress on stderr (always on; accepted for llama-bench compatibility)
    #[arg(long = "progress")]
    pub progress: bool,
    /// Suppress the progress lines on stderr
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    /// With two engines, tg tests alternate the engines every N generated tokens instead
    /// of every repetition, so both see the same machine state (a shared host whose
    /// memory bandwidth drifts between runs); each engine's time is the sum of its own
    /// tokens, and which engine goes first alternates per repetition (each turn starts
    /// after an untimed 20 ms pause, for the other engine's threads to stop spinning).
    /// 0: alternate whole repetitions
    #[arg(long = "interleave", value_name = "N", default_value_t = 0)]
    pub interleave: usize,
    /// Layers to offload to a ggml device, `-ngl` (the last N layers; above the layer count
    /// the output layer too), a list to sweep (-ngl 0,16,99) [default: 0]
    #[arg(long = "n-gpu-layers", value_name = "N", action = ArgAction::Append)]
    pub n_gpu_layers: Vec<String>,
    /// rllama's run options (--numa applies to both engines; rows record the per-node
    /// page counts of --numa-weights; the `isa` column marks fast kernels `/fast`, and
    /// `/fast+packed` where they read repacked rows).
    #[command(flatten)]
    pub run: runtime::options::RunArgs,
}

/// Rewrites llama-bench's multi-letter single-dash flags into clap's long form
/// (`-pg` → `--pg`, `-ub` → `--ubatch-size`, `-ngl` → `--n-gpu-layers`, `-dev` →
/// `--device`), also in their `-flag=value` form.
pub fn normalize_args<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    const ALIASES: &[(&str, &str)] = &[
        ("-pg", "--pg"),
        ("-ub", "--ubatch-size"),
        ("-ngl", "--n-gpu-layers"),
        ("-dev", "--device"),
        ("-ncmoe", "--n-cpu-moe"),
    ];
    args.into_iter()
        .map(Into::into)
        .map(|a| {
            for (short, long) in ALIASES {
                if a == *short {
                    return long.to_string();
                }
                if let Some(rest) = a.strip_prefix(&format!("{short}=")) {
                    return format!("{long}={rest}");
                }
            }
            a
        })
        .collect()
}

/// Parses one value list: comma-separated items, each a number or a range
/// `first-last`, `first-last+step`, `first-last*mult` (llama-bench's syntax).
pub fn parse_list(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            bail!("empty value in list '{s}'");
        }
        out.extend(parse_range(item).with_context(|| format!("invalid value '{item}'"))?);
    }
    Ok(out)
}

fn parse_num(s: &str) -> Result<usize> {
    s.trim()
        .parse::<usize>()
        .with_context(|| format!("'{s}' is not a non-negative integer"))
}

fn parse_range(item: &str) -> Result<Vec<usize>> {
    let Some((first, rest)) = item.split_once('-') else {
        return Ok(vec![parse_num(item)?]);
    };
    let first = parse_num(first)?;
    const MAX_VALUES: usize = 100_000;
    let mut out = Vec::new();
    if let Some((last, step)) = rest.split_once('+') {
        let (last, step) = (parse_num(last)?, parse_num(step)?);
        if step == 0 {
            bail!("range step must be > 0");
        }
        let mut v = first;
        while v <= last {
            out.push(v);
            v += step;
            if out.len() > MAX_VALUES {
                bail!("range expands to too many values");
            }
        }
    } else if let Some((last, mult)) = rest.split_once('*') {
        let (last, mult) = (parse_num(last)?, parse_num(mult)?);
        if mult < 2 {
            bail!("range multiplier must be >= 2");
        }
        if first == 0 {
            bail!("a multiplicative range cannot start at 0");
        }
        let mut v = first;
        while v <= last {
            out.push(v);
            v = v.saturating_mul(mult);
        }
    } else {
        let last = parse_num(rest)?;
        if last.saturating_sub(first) > MAX_VALUES {
            bail!("range expands to too many values");
        }
        out.extend(first..=last);
    }
    if out.is_empty() {
        bail!("empty range (first > last)");
    }
    Ok(out)
}

/// Expands every occurrence of a list flag; `default` when the flag was not given.
fn expand(values: &[String], default: &[usize], what: &str) -> Result<Vec<usize>> {
    if values.is_empty() {
        return Ok(default.to_vec());
    }
    let mut out = Vec::new();
    for v in values {
        out.extend(parse_list(v).with_context(|| format!("{what}: '{v}'"))?);
    }
    Ok(out)
}

fn nonzero(values: &[usize], what: &str) -> Result<()> {
    if values.contains(&0) {
        bail!("{what} must be > 0");
    }
    Ok(())
}

/// Parses `-pg PP,TG`.
pub fn parse_pg(s: &str) -> Result<(usize, usize)> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != 2 {
        bail!("-pg expects PP,TG (two numbers), got '{s}'");
    }
    Ok((parse_num(parts[0])?, parse_num(parts[1])?))
}

/// Parses a CPU mask in hex (`0x` prefix optional) into CPU indices.
pub fn parse_cpu_mask(s: &str) -> Result<Vec<usize>> {
    let hex = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if hex.is_empty() || hex.len() > 256 {
        bail!("invalid CPU mask '{s}'");
    }
    let mut cpus = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let d = c
            .to_digit(16)
            .with_context(|| format!("invalid CPU mask '{s}': '{c}' is not a hex digit"))?;
        for bit in 0..4 {
            if d & (1 << bit) != 0 {
                cpus.push(i * 4 + bit);
            }
        }
    }
    Ok(cpus)
}

/// Everything a run needs, with lists expanded.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub models: Vec<String>,
    pub n_prompt: Vec<usize>,
    pub n_gen: Vec<usize>,
    pub pg: Vec<(usize, usize)>,
    pub n_depth: Vec<usize>,
    pub threads: Vec<usize>,
    pub n_batch: Vec<usize>,
    pub n_ubatch: Vec<usize>,
    pub repetitions: usize,
    pub output: OutputFormat,
    pub warmup: bool,
    pub delay: f64,
    pub prio: i32,
    /// Hex mask as given (`None` = no affinity change).
    pub cpu_mask: Option<String>,
    pub engines: Vec<Engine>,
    pub progress: bool,
    /// `--interleave`: tg tests alternate engines every this many tokens (0: per
    /// repetition).
    pub interleave: usize,
    /// `-ngl` values to sweep.
    pub n_gpu_layers: Vec<usize>,
    /// rllama's run options but threads and `-ngl` (which the tests sweep).
    pub run: runtime::options::RunArgs,
}

pub const DEFAULT_N_PROMPT: usize = 512;
pub const DEFAULT_N_GEN: usize = 128;
pub const DEFAULT_N_BATCH: usize = 2048;
pub const DEFAULT_N_UBATCH: usize = 512;

/// Default thread count: the cores available to this process.
pub use runtime::options::default_threads;

impl Params {
    /// Parses a full command line (`args[0]` is the program name).
    pub fn parse_from<I, S>(args: I) -> Result<Params, clap::Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let cli = Cli::try_parse_from(normalize_args(args))?;
        Params::from_cli(cli).map_err(|e| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e:#}\n"))
        })
    }

    pub fn from_cli(cli: Cli) -> Result<Params> {
        let mut models = Vec::new();
        for m in &cli.model {
            for part in m.split(',') {
                let part = part.trim();
                if part.is_empty() {
                    bail!("-m: empty model name in '{m}'");
                }
                models.push(part.to_string());
            }
        }
        if models.is_empty() {
            models.push(runtime::registry::DEFAULT_MODEL.to_string());
        }
        let n_prompt = expand(&cli.n_prompt, &[DEFAULT_N_PROMPT], "-p")?;
        let n_gen = expand(&cli.n_gen, &[DEFAULT_N_GEN], "-n")?;
        let pg = cli
            .pg
            .iter()
            .map(|s| parse_pg(s))
            .collect::<Result<Vec<_>>>()?;
        let n_depth = expand(&cli.n_depth, &[0], "-d")?;
        let threads = expand(&cli.threads, &[default_threads()], "-t")?;
        nonzero(&threads, "-t (threads)")?;
        let n_batch = expand(&cli.n_batch, &[DEFAULT_N_BATCH], "-b")?;
        nonzero(&n_batch, "-b (batch size)")?;
        let n_ubatch = expand(&cli.n_ubatch, &[DEFAULT_N_UBATCH], "-ub")?;
        nonzero(&n_ubatch, "-ub (ubatch size)")?;
        if cli.repetitions == 0 {
            bail!("-r (repetitions) must be > 0");
        }
        if !(cli.delay.is_finite() && cli.delay >= 0.0) {
            bail!("--delay must be a non-negative number of seconds");
        }
        if !(-1..=3).contains(&cli.prio) {
            bail!("--prio must be one of -1, 0, 1, 2, 3");
        }
        let cpu_mask = match cli.cpu_mask.as_slice() {
            [] => None,
            [one] if !one.contains(',') => {
                let cpus = parse_cpu_mask(one)?;
                if cpus.is_empty() {
                    None // 0x0: llama-bench's default, no affinity
                } else {
                    Some(one.clone())
                }
            }
            _ => bail!(
                "-C: several CPU masks (one test per mask) are not supported yet; give one \
                 mask, it applies to the whole run"
            ),
        };
        let n_gpu_layers = expand(&cli.n_gpu_layers, &[0], "-ngl")?;
        let mut engines = Vec::new();
        for e in &cli.engine {
            for part in e.split(',') {
                let eng = Engine::parse(part)?;
                if !engines.contains(&eng) {
                    engines.push(eng);
                }
            }
        }
        if engines.is_empty() {
            engines.push(Engine::Rllama);
        }
        if engines.contains(&Engine::LlamaCpp) && n_gpu_layers.iter().any(|&n| n > 0) {
            bail!(
                "-ngl > 0 with --engine llamacpp: the in-tool llama.cpp is a CPU build, so its \
                 rows would not be offloaded; compare offload with llama.cpp's own GPU \
                 llama-bench, or run -ngl sweeps with --engine rllama"
            );
        }
        if cli.interleave > 0 && engines.len() < 2 {
            bail!(
                "--interleave {} alternates two engines token by token: give them with \
                 --engine rllama,llamacpp",
                cli.interleave
            );
        }
        let p = Params {
            models,
            n_prompt,
            n_gen,
            pg,
            n_depth,
            threads,
            n_batch,
            n_ubatch,
            repetitions: cli.repetitions,
            output: cli.output,
            warmup: !cli.no_warmup,
            delay: cli.delay,
            prio: cli.prio,
            cpu_mask,
            engines,
            progress: !cli.no_progress,
            interleave: cli.interleave,
            n_gpu_layers,
            run: cli.run,
        };
        if p.tests().is_empty() {
            bail!("nothing to run: every test has 0 tokens (check -p, -n and -pg)");
        }
        Ok(p)
    }

    /// How rllama runs a test of `threads` threads with `n_gpu_layers` layers offloaded:
    /// the one place rbench turns its flags into run options.
    pub fn run_options(&self, threads: usize, n_gpu_layers: usize) -> runtime::RunOptions {
        self.run.options(threads, n_gpu_layers)
    }

    /// The tests to run: every combination of model, n_batch, n_ubatch, threads and depth
    /// (outer to inner), each with the pp tests, then the tg tests, then the pg tests.
    pub fn tests(&self) -> Vec<TestSpec> {
        let mut out = Vec::new();
        for model in &self.models {
            for &n_gpu_layers in &self.n_gpu_layers {
                for &n_batch in &self.n_batch {
                    for &n_ubatch in &self.n_ubatch {
                        for &threads in &self.threads {
                            for &n_depth in &self.n_depth {
                                let base = TestSpec {
                                    model: model.clone(),
                                    n_batch,
                                    n_ubatch,
                                    threads,
                                    n_prompt: 0,
                                    n_gen: 0,
                                    n_depth,
                                    n_gpu_layers,
                                };
                                for &p in self.n_prompt.iter().filter(|&&p| p > 0) {
                                    out.push(TestSpec {
                                        n_prompt: p,
                                        ..base.clone()
                                    });
                                }
                                for &n in self.n_gen.iter().filter(|&&n| n > 0) {
                                    out.push(TestSpec {
                                        n_gen: n,
                                        ..base.clone()
                                    });
                                }
                                for &(p, n) in &self.pg {
                                    if p == 0 && n == 0 {
                                        continue;
                                    }
                                    out.push(TestSpec {
                                        n_prompt: p,
                                        n_gen: n,
                                        ..base.clone()
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// KV slots the longest test needs (what an offloaded model's device cache holds).
    pub fn max_kv_slots(&self) -> usize {
        let n = self.tests().iter().map(TestSpec::n_ctx).max().unwrap_or(0);
        n.div_ceil(16) * 16
    }
}

/// One test: a model, its parameters and token counts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TestSpec {
    /// As given on the command line (registry name or path).
    pub model: String,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub threads: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub n_depth: usize,
    /// Layers offloaded to a ggml device (`-ngl`).
    pub n_gpu_layers: usize,
}

impl TestSpec {
    /// llama-bench's test name: `pp512`, `tg128`, `pp512+tg128`, with ` @ d512` for a depth.
    pub fn name(&self) -> String {
        let mut s = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        if self.n_depth > 0 {
            s.push_str(&format!(" @ d{}", self.n_depth));
        }
        s
    }

    /// Tokens timed per repetition.
    pub fn n_tokens(&self) -> usize {
        self.n_prompt + self.n_gen
    }

    /// KV positions the test needs (llama-bench's n_ctx).
    pub fn n_ctx(&self) -> usize {
        self.n_depth + self.n_prompt + self.n_gen
    }

    /// Tokens per forward pass for rllama (it has no separate physical batch).
    pub fn our_chunk(&self) -> usize {
        self.n_batch.min(self.n_ubatch)
    }
}
