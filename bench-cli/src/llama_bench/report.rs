//! Result output: llama-bench's markdown table (plus our memory columns), CSV, JSON and
//! JSONL with llama-bench's field names (plus `engine`, `model_bytes`, `kv_bytes`,
//! `kv_tokens`, `pinned`, `isa`), the side-by-side ratio table, the kernels' instruction
//! sets and the tg roofline notes.

use std::io::{self, Write};

use serde_json::{json, Value};

use super::cli::{Engine, OutputFormat, Params, DEFAULT_N_BATCH, DEFAULT_N_UBATCH};
use super::run::TestResult;

/// What every row says about the build and the machine.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// Short git hash of this build (`unknown` outside a checkout).
    pub build_commit: String,
    /// Commits in this build's history (llama.cpp's `build_number` is the same count).
    pub build_number: u64,
    /// Our version (the workspace version).
    pub version: String,
    pub cpu_info: String,
    /// Hex CPU mask as given, `0x0` when none.
    pub cpu_mask: String,
    /// llama.cpp's `llama_print_system_info()`, when llama.cpp is benchmarked.
    pub llamacpp_system_info: Option<String>,
    /// A warning that other processes were competing for the CPUs when the run started.
    pub load_note: Option<String>,
    /// How the engines alternated, when not by whole repetitions (`--interleave`).
    pub interleave_note: Option<String>,
}

impl RunInfo {
    pub fn engine_version(&self, e: Engine) -> String {
        match e {
            Engine::Rllama => format!("rllama {}", self.version),
            Engine::LlamaCpp => "llama.cpp (llama-cpp-sys-2 0.1.161)".into(),
        }
    }
}

/// The CPU's model name from /proc/cpuinfo (llama-bench's `cpu_info`).
pub fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The 1-minute load average (Linux), `None` when unknown.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A note when the machine was already busy before the benchmark started (load average of
/// at least half a core): the results then include other processes' interference.
pub fn load_note(load: Option<f64>, n_cpus: usize) -> Option<String> {
    let load = load?;
    (load >= 0.5).then(|| {
        format!(
            "note: 1-minute load average was {load:.2} on {n_cpus} CPUs before the run: other \
             processes competed for the CPUs, so these numbers are noisy"
        )
    })
}

/// `123.45 MiB` / `1.23 GiB`, as llama-bench prints model sizes.
pub fn format_size(bytes: u64) -> String {
    let b = bytes as f64;
    if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

/// `134.52 M` / `1.54 B`, as llama-bench prints parameter counts.
pub fn format_params(n: u64) -> String {
    let n = n as f64;
    if n < 1e9 {
        format!("{:.2} M", n / 1e6)
    } else {
        format!("{:.2} B", n / 1e9)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / 1024.0 / 1024.0)
}

/// The fields of one result, in output order: llama-bench's, then ours.
pub fn fields(r: &TestResult, info: &RunInfo) -> Vec<(&'static str, Value)> {
    let opt = |v: Option<u64>| v.map_or(Value::Null, Value::from);
    vec![
        ("build_commit", json!(info.build_commit)),
        ("build_number", json!(info.build_number)),
        ("cpu_info", json!(info.cpu_info)),
        (
            "gpu_info",
            json!(r.device_memory.as_ref().map_or("", |(d, _)| d.as_str())),
        ),
        ("backends", json!(r.backend)),
        ("model_filename", json!(r.info.filename)),
        ("model_type", json!(r.info.model_type)),
        ("model_size", json!(r.info.size)),
        ("model_n_params", json!(r.info.n_params)),
        ("n_batch", json!(r.spec.n_batch)),
        ("n_ubatch", json!(r.spec.n_ubatch)),
        ("n_threads", json!(r.spec.threads)),
        ("cpu_mask", json!(info.cpu_mask)),
        ("cpu_strict", json!(false)),
        ("poll", json!(50)),
        ("type_k", json!("f16")),
        ("type_v", json!("f16")),
        ("n_gpu_layers", json!(r.spec.n_gpu_layers)),
        ("no_kv_offload", json!(false)),
        ("flash_attn", json!(r.flash_attn)),
        ("use_mmap", json!(true)),
        ("embeddings", json!(false)),
        ("n_prompt", json!(r.spec.n_prompt)),
        ("n_gen", json!(r.spec.n_gen)),
        ("n_depth", json!(r.spec.n_depth)),
        ("test_time", json!(r.test_time)),
        ("avg_ns", json!(r.avg_ns())),
        ("stddev_ns", json!(r.stddev_ns())),
        ("avg_ts", json!(r.avg_ts())),
        ("stddev_ts", json!(r.stddev_ts())),
        ("samples_ns", json!(r.samples_ns)),
        ("samples_ts", json!(r.samples_ts())),
        ("engine", json!(r.engine.name())),
        ("engine_version", json!(info.engine_version(r.engine))),
        ("model_bytes", json!(r.model_bytes)),
        ("active_bytes", json!(r.active_bytes)),
        ("kv_bytes", opt(r.kv_bytes)),
        ("kv_tokens", opt(r.kv_tokens)),
        ("pinned", json!(r.pinned)),
        ("isa", json!(r.isa)),
        ("numa", json!(r.numa.mode)),
        ("numa_weights", json!(r.numa.weights)),
        ("numa_nodes", json!(r.numa.nodes)),
        ("numa_detail", r.numa.to_json()),
        (
            "device_weight_bytes",
            opt(r.device_memory.as_ref().map(|(_, m)| m.weights as u64)),
        ),
        (
            "device_kv_bytes",
            opt(r.device_memory.as_ref().map(|(_, m)| m.kv_cache as u64)),
        ),
        (
            "device_compute_bytes",
            opt(r.device_memory.as_ref().map(|(_, m)| m.compute as u64)),
        ),
    ]
}

/// One JSON object with the fields in order (serde_json's map would sort them).
pub fn json_object(r: &TestResult, info: &RunInfo, indent: Option<&str>) -> String {
    let parts: Vec<String> = fields(r, info)
        .into_iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect();
    match indent {
        Some(ind) => format!(
            "{ind}{{\n{}\n{ind}}}",
            parts
                .iter()
                .map(|p| format!("{ind}  {p}"))
                .collect::<Vec<_>>()
                .join(",\n")
        ),
        None => format!("{{{}}}", parts.join(", ")),
    }
}

fn csv_quote(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(";"),
        other => other.to_string(),
    };
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A markdown column: header, width (negative = left-aligned, as llama-bench).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Model,
    Size,
    Params,
    Backend,
    Engine,
    Threads,
    NBatch,
    NUbatch,
    Test,
    Ts,
    ModelMib,
    KvMib,
    KvTokens,
    Numa,
    NumaWeights,
    Pages,
    Ngl,
    DevMib,
}

impl Col {
    fn header(self) -> &'static str {
        match self {
            Col::Model => "model",
            Col::Size => "size",
            Col::Params => "params",
            Col::Backend => "backend",
            Col::Engine => "engine",
            Col::Threads => "threads",
            Col::NBatch => "n_batch",
            Col::NUbatch => "n_ubatch",
            Col::Test => "test",
            Col::Ts => "t/s",
            Col::ModelMib => "model MiB",
            Col::KvMib => "KV MiB",
            Col::KvTokens => "KV tokens",
            Col::Numa => "numa",
            Col::NumaWeights => "weights",
            Col::Pages => "weight pages per node",
            Col::Ngl => "ngl",
            Col::DevMib => "device MiB w/kv/compute",
        }
    }

    /// llama-bench's widths; other columns are max(len, 10), strings left-aligned.
    fn width(self) -> i32 {
        match self {
            Col::Model => -30,
            Col::Size | Col::Params => 10,
            Col::Backend | Col::Engine => -10,
            Col::Threads | Col::NBatch => 7,
            Col::NUbatch => 8,
            Col::Test => 15,
            Col::Ts => 20,
            Col::ModelMib | Col::KvMib | Col::KvTokens => 10,
            Col::Numa => -10,
            Col::NumaWeights => -11,
            Col::Pages => -24,
            Col::Ngl => 3,
            Col::DevMib => 24,
        }
    }

    fn value(self, r: &TestResult) -> String {
        match self {
            Col::Model => r.info.model_type.clone(),
            Col::Size => format_size(r.info.size),
            Col::Params => format_params(r.info.n_params),
            Col::Backend => r.backend.clone(),
            Col::Engine => r.engine.display().into(),
            Col::Threads => r.spec.threads.to_string(),
            Col::NBatch => r.spec.n_batch.to_string(),
            Col::NUbatch => r.spec.n_ubatch.to_string(),
            Col::Test => r.spec.name(),
            Col::Ts => format!("{:.2} ± {:.2}", r.avg_ts(), r.stddev_ts()),
            Col::ModelMib => mib(r.model_bytes),
            Col::KvMib => r.kv_bytes.map_or("?".into(), mib),
            Col::KvTokens => r.kv_tokens.map_or("?".into(), |t| t.to_string()),
            Col::Numa => {
                let mut s = if r.numa.mode.is_empty() {
                    "-".to_string()
                } else {
                    r.numa.mode.clone()
                };
                if let Some(n) = &r.numa.thread_nodes {
                    s.push_str(&format!(
                        " [{}]",
                        n.iter()
                            .map(|x| x.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    ));
                }
                s
            }
            Col::NumaWeights => r.numa.weights.clone(),
            Col::Pages => r.numa.pages_summary(),
            Col::Ngl => r.spec.n_gpu_layers.to_string(),
            Col::DevMib => r.device_memory.as_ref().map_or("-".into(), |(_, m)| {
                format!(
                    "{} / {} / {}",
                    mib(m.weights as u64),
                    mib(m.kv_cache as u64),
                    mib(m.compute as u64)
                )
            }),
        }
    }
}

fn cell(s: &str, width: i32) -> String {
    let w = width.unsigned_abs() as usize;
    if width < 0 {
        format!(" {s:<w$} |")
    } else {
        format!(" {s:>w$} |")
    }
}

fn rule(width: i32) -> String {
    let w = width.unsigned_abs() as usize;
    format!(
        " {}{} |",
        "-".repeat(w - 1),
        if width > 0 { ":" } else { "-" }
    )
}

/// Writes results as they finish, in the chosen format.
pub struct Printer<W: Write> {
    out: W,
    format: OutputFormat,
    info: RunInfo,
    cols: Vec<Col>,
    engines: Vec<Engine>,
    n_printed: usize,
    /// The backend column fits `CPU,<device>` when layers are offloaded (rows stream as
    /// they finish, so the width is fixed from the parameters).
    backend_width: i32,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, params: &Params, info: RunInfo) -> Printer<W> {
        let mut cols = vec![Col::Model, Col::Size, Col::Params, Col::Backend];
        let offload = params.n_gpu_layers.iter().any(|&n| n > 0);
        if offload {
            cols.push(Col::Ngl);
        }
        if params.engines != [Engine::Rllama] {
            cols.push(Col::Engine);
        }
        cols.push(Col::Threads);
        if params.n_batch != [DEFAULT_N_BATCH] {
            cols.push(Col::NBatch);
        }
        if params.n_ubatch != [DEFAULT_N_UBATCH] {
            cols.push(Col::NUbatch);
        }
        cols.extend([Col::Test, Col::Ts, Col::ModelMib, Col::KvMib, Col::KvTokens]);
        if offload {
            cols.push(Col::DevMib);
        }
        let backend_width = if offload {
            // The device named, or a typical first GPU's name ("Vulkan0", "CUDA0").
            let dev = params.run.device.as_deref().map_or(7, str::len);
            -(("CPU,".len() + dev).max(10) as i32)
        } else {
            Col::Backend.width()
        };
        let multi_node = runtime::numa::machine().is_some_and(|t| t.n_nodes() > 1);
        if params.run.numa.is_some()
            || params.run.numa_weights != runtime::numa::WeightPlacement::FirstTouch
            || multi_node
        {
            cols.extend([Col::Numa, Col::NumaWeights, Col::Pages]);
        }
        Printer {
            out,
            format: params.output,
            info,
            cols,
            engines: params.engines.clone(),
            n_printed: 0,
            backend_width,
        }
    }

    pub fn header(&mut self) -> io::Result<()> {
        match self.format {
            OutputFormat::Md => {
                let mut h = String::from("|");
                let mut r = String::from("|");
                for c in &self.cols {
                    h.push_str(&cell(c.header(), self.width(*c)));
                    r.push_str(&rule(self.width(*c)));
                }
                writeln!(self.out, "{h}\n{r}")?;
            }
            OutputFormat::Csv => {
                // Field names do not depend on the values.
                let names: Vec<&str> = self.field_names();
                writeln!(self.out, "{}", names.join(","))?;
            }
            OutputFormat::Json => writeln!(self.out, "[")?,
            OutputFormat::Jsonl => {}
        }
        self.out.flush()
    }

    fn width(&self, c: Col) -> i32 {
        if c == Col::Backend {
            self.backend_width
        } else {
            c.width()
        }
    }

    fn field_names(&self) -> Vec<&'static str> {
        // CSV, like llama-bench's, carries no per-sample arrays.
        CSV_FIELDS.to_vec()
    }

    /// Prints one finished result and flushes.
    pub fn test(&mut self, r: &TestResult) -> io::Result<()> {
        match self.format {
            OutputFormat::Md => {
                let mut line = String::from("|");
                for c in &self.cols {
                    line.push_str(&cell(&c.value(r), self.width(*c)));
                }
                writeln!(self.out, "{line}")?;
            }
            OutputFormat::Csv => {
                let f = fields(r, &self.info);
                let vals: Vec<String> = CSV_FIELDS
                    .iter()
                    .map(|name| {
                        f.iter()
                            .find(|(k, _)| k == name)
                            .map_or_else(String::new, |(_, v)| csv_quote(v))
                    })
                    .collect();
                writeln!(self.out, "{}", vals.join(","))?;
            }
            OutputFormat::Json => {
                if self.n_printed > 0 {
                    writeln!(self.out, ",")?;
                }
                write!(self.out, "{}", json_object(r, &self.info, Some("  ")))?;
            }
            OutputFormat::Jsonl => writeln!(self.out, "{}", json_object(r, &self.info, None))?,
        }
        self.n_printed += 1;
        self.out.flush()
    }

    /// Closes the output. For markdown, also the ratio table (with two engines), llama.cpp's
    /// system info, the tg roofline notes and the build line; other formats put those on
    /// stderr.
    pub fn footer(&mut self, results: &[TestResult]) -> io::Result<()> {
        let ratio = self.ratio_table(results);
        let roofline = roofline_notes(results);
        let sysinfo = self
            .info
            .llamacpp_system_info
            .as_ref()
            .map(|s| format!("llama.cpp system_info: {s}"));
        let mut isas: Vec<String> = Vec::new();
        for r in results
            .iter()
            .filter(|r| r.engine == Engine::Rllama && !r.isa.is_empty())
        {
            let line = format!("rllama kernels ({}): {}", r.info.model_type, r.isa);
            if !isas.contains(&line) {
                isas.push(line);
            }
        }
        // Only beside our kernels' line: the note is about them.
        let flavor = (!isas.is_empty()).then(super::run::flavor_note).flatten();
        match self.format {
            OutputFormat::Md => {
                if let Some(t) = &ratio {
                    write!(self.out, "\n{t}")?;
                }
                if let Some(n) = &self.info.interleave_note {
                    writeln!(self.out, "\n{n}")?;
                }
                if let Some(s) = &sysinfo {
                    writeln!(self.out, "\n{s}")?;
                }
                if !isas.is_empty() {
                    writeln!(self.out, "\n{}", isas.join("\n"))?;
                }
                if let Some(n) = &flavor {
                    writeln!(self.out, "{n}")?;
                }
                if !roofline.is_empty() {
                    writeln!(self.out, "\n{}", roofline.join("\n"))?;
                }
                if let Some(n) = &self.info.load_note {
                    writeln!(self.out, "\n{n}")?;
                }
                writeln!(
                    self.out,
                    "\nbuild: {} ({})",
                    self.info.build_commit, self.info.version
                )?;
            }
            OutputFormat::Json => {
                if self.n_printed > 0 {
                    writeln!(self.out)?;
                }
                writeln!(self.out, "]")?;
            }
            OutputFormat::Csv | OutputFormat::Jsonl => {}
        }
        self.out.flush()?;
        if self.format != OutputFormat::Md {
            let mut e = io::stderr().lock();
            if let Some(t) = &ratio {
                write!(e, "\n{t}")?;
            }
            if let Some(n) = &self.info.interleave_note {
                writeln!(e, "{n}")?;
            }
            if let Some(s) = &sysinfo {
                writeln!(e, "{s}")?;
            }
            if let Some(n) = &flavor {
                writeln!(e, "{n}")?;
            }
            for n in &roofline {
                writeln!(e, "{n}")?;
            }
        }
        Ok(())
    }

    /// `ours/llama.cpp` per test when both engines ran, as a markdown table.
    fn ratio_table(&self, results: &[TestResult]) -> Option<String> {
        if !(self.engines.contains(&Engine::Rllama) && self.engines.contains(&Engine::LlamaCpp)) {
            return None;
        }
        let rows = ratio_rows(results);
        if rows.is_empty() {
            return None;
        }
        let cols: [(&str, i32); 6] = [
            ("model", -30),
            ("threads", 7),
            ("test", 15),
            ("rllama t/s", 20),
            ("llama.cpp t/s", 20),
            ("ours/llama.cpp", 14),
        ];
        let mut s = String::from("|");
        for (h, w) in cols {
            s.push_str(&cell(h, w));
        }
        s.push_str("\n|");
        for (_, w) in cols {
            s.push_str(&rule(w));
        }
        s.push('\n');
        for (ours, reference) in rows {
            let vals = [
                ours.info.model_type.clone(),
                ours.spec.threads.to_string(),
                ours.spec.name(),
                format!("{:.2} ± {:.2}", ours.avg_ts(), ours.stddev_ts()),
                format!("{:.2} ± {:.2}", reference.avg_ts(), reference.stddev_ts()),
                format!("{:.2}", ours.avg_ts() / reference.avg_ts()),
            ];
            s.push('|');
            for (v, (_, w)) in vals.iter().zip(cols) {
                s.push_str(&cell(v, w));
            }
            s.push('\n');
        }
        let how = if self.info.interleave_note.is_some() {
            "tg tests take turns every few tokens (below), other tests alternate repetitions"
        } else {
            "repetitions alternate between the engines"
        };
        s.push_str(&format!(
            "\nours/llama.cpp = rllama t/s / llama.cpp t/s; {how}; llama.cpp with its defaults \
             (flash_attn auto, f16 KV cache).\n"
        ));
        Some(s)
    }
}

/// The bytes a tg test streams per second if every generated token reads all weights once:
/// model bytes x t/s, in GB/s (1e9 bytes). Decode is bound by memory bandwidth, so this is
/// the figure to hold against `rbench membw` with the same threads.
pub fn tg_read_gbps(model_bytes: u64, tg_ts: f64) -> f64 {
    model_bytes as f64 * tg_ts / 1e9
}

/// One note per tg-only test (pp tests are compute-bound; the KV cache read is left out).
pub fn roofline_notes(results: &[TestResult]) -> Vec<String> {
    results
        .iter()
        .filter(|r| r.spec.n_prompt == 0 && r.spec.n_gen > 0)
        .map(|r| {
            let ts = r.avg_ts();
            // A MoE token reads only its experts: the roofline counts what it reads.
            let what = if r.active_bytes < r.model_bytes {
                format!(
                    "weights one token reads (its experts only, of {} MiB)",
                    mib(r.model_bytes)
                )
            } else {
                "model weights".to_string()
            };
            format!(
                "tg roofline: {what} {} MiB x {ts:.2} t/s = {:.2} GB/s read per token \
                 stream ({}, {}, t={}; compare with `rbench membw -t {}`)",
                mib(r.active_bytes),
                tg_read_gbps(r.active_bytes, ts),
                r.spec.name(),
                r.engine.display(),
                r.spec.threads,
                r.spec.threads,
            )
        })
        .collect()
}

/// Pairs each rllama result with the llama.cpp result of the same test.
pub fn ratio_rows(results: &[TestResult]) -> Vec<(&TestResult, &TestResult)> {
    results
        .iter()
        .filter(|r| r.engine == Engine::Rllama)
        .filter_map(|ours| {
            results
                .iter()
                .find(|r| r.engine == Engine::LlamaCpp && r.spec == ours.spec)
                .map(|reference| (ours, reference))
        })
        .collect()
}

/// CSV columns: llama-bench's (no per-sample arrays), then ours.
pub const CSV_FIELDS: &[&str] = &[
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "cpu_mask",
    "cpu_strict",
    "poll",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "no_kv_offload",
    "flash_attn",
    "use_mmap",
    "embeddings",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "engine",
    "engine_version",
    "model_bytes",
    "active_bytes",
    "kv_bytes",
    "kv_tokens",
    "pinned",
    "isa",
    "numa",
    "numa_weights",
    "numa_nodes",
    "device_weight_bytes",
    "device_kv_bytes",
    "device_compute_bytes",
];
