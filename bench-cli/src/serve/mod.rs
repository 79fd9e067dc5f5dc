//! `rbench serve`: ShareGPT-style concurrency sweeps against an OpenAI-compatible server,
//! with vLLM `bench serve` definitions and result keys (see `shared/BENCHMARKS.md`).
//!
//! ```text
//! rbench serve --url http://127.0.0.1:8080 --dataset ShareGPT_V3_unfiltered_cleaned_split.json \
//!     --num-prompts 200 --concurrency 1,2,4,8,16,32,64 --result-file sweep.jsonl
//! rbench serve --url … --dataset sharegpt-synthetic --request-rate 4 --burstiness 1 \
//!     --goodput ttft:500 tpot:50 --resume sweep.jsonl
//! rbench serve --url … --dataset chunked_prefill     # presets carry their own arrivals
//! rbench report sweep.jsonl other.jsonl --html report.html
//! ```
//!
//! Each sweep point prints a vLLM-style summary and appends one JSON line as soon as it
//! finishes; `--resume FILE` skips points whose settings are already in FILE. Exit status 3
//! when any request failed (failures are also counted by kind in the result line).

pub mod client;
pub mod result;
pub mod soak;
pub mod spawn;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use datasets::{Arrival, SampledRequest, Workload};
use rand::{Rng, SeedableRng};

use client::{Endpoint, RequestOutput};
use result::{Goodput, PointSettings};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rbench serve",
    about = "Serving benchmark: concurrency sweeps against an OpenAI-compatible server"
)]
pub struct ServeArgs {
    /// Server base URL, e.g. http://127.0.0.1:8080 (or start servers with --spawn).
    #[arg(long, required_unless_present = "spawn", conflicts_with = "spawn")]
    pub url: Option<String>,
    /// Start this server and benchmark it; repeat for servers side by side (interleaved per
    /// point). `NAME="CMD ..."` (`{port}` is replaced; without it `--host 127.0.0.1 --port P`
    /// is appended) or a built-in: `rserve` (next to rbench) or `llama-server`
    /// ($LLAMA_SERVER, PATH, or built from the llama.cpp checkout in $LLAMA_CPP_SRC).
    #[arg(long)]
    pub spawn: Vec<String>,
    #[command(flatten)]
    pub server: spawn::ServerFlags,
    /// Runs of each spawned server per point: 1 alternates the order by point (A B, B A,
    /// ...), 2 runs A B B A at every point.
    #[arg(long, default_value_t = 1)]
    pub spawn_reps: usize,
    /// Restart each spawned server before each of its runs (nothing cached carries over).
    #[arg(long)]
    pub restart: bool,
    /// Seconds of idle after each point (fixed, at most 60).
    #[arg(long, default_value_t = 2.0)]
    pub cooldown: f64,
    /// Requests sent and discarded before each point (warms caches, threads, pages).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// `sharegpt` (the real ShareGPT V3 file, fetched and cached once), a ShareGPT JSON
    /// file, `sharegpt-synthetic` (a generated stand-in), a preset (baseline,
    /// continuous_batching, paged_attention, chunked_prefill, prefix_caching),
    /// `fixed:ISL/OSL`, `shared-prefix:K[:GROUPS]` (N requests sharing a K-token system
    /// prompt; with GROUPS, that many tenants with a prompt each, interleaved) or
    /// `code-edit` (Python modules to send back with a function renamed: answers that
    /// repeat their prompt, as speculative decoding's prompt lookup likes).
    #[arg(long, default_value = "sharegpt-synthetic")]
    pub dataset: String,
    #[arg(long, default_value_t = 200)]
    pub num_prompts: usize,
    /// Comma list of client-side max concurrencies, one sweep point each (`inf` = unlimited).
    /// Default: 1,2,4,8,16,32,64 (presets: their own pattern).
    #[arg(long, alias = "max-concurrency")]
    pub concurrency: Option<String>,
    /// Requests per second (gamma-distributed gaps); default all at once (inf).
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Gamma shape of the arrival gaps (1 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// SLOs for goodput: ttft:MS tpot:MS e2el:MS
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    #[command(flatten)]
    pub req: RequestFlags,
    /// Append one JSON line per sweep point here.
    #[arg(long)]
    pub result_file: Option<PathBuf>,
    /// Skip sweep points already in this file (matched on settings); also the result file
    /// when --result-file is not given.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Add per-request arrays to each result line.
    #[arg(long)]
    pub save_detailed: bool,
    /// Comma list of percentiles to report.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// Backend label for the result file.
    #[arg(long, default_value = "openai")]
    pub backend: String,
}

/// What every request of `rbench serve` and `rbench soak` carries, and how the dataset's
/// prompts are cut to fit.
#[derive(clap::Args, Debug, Clone)]
pub struct RequestFlags {
    /// Model name sent in requests (default: the first id of GET /v1/models; `rbench
    /// serve` falls back to "default" when there is none).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, value_parser = ["chat", "completions"], default_value = "completions")]
    pub endpoint: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fixed output length (max_tokens) instead of the dataset's.
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Ask the server to ignore end-of-generation, so every request produces exactly its
    /// output length (vLLM's `--ignore-eos`; what scheduler comparisons want). Without
    /// it an immediate end of generation is an empty output, which `rbench serve` counts
    /// as failed (`rbench soak`: completed).
    #[arg(long)]
    pub ignore_eos: bool,
    /// ShareGPT filter limits.
    #[arg(long, default_value_t = 1024)]
    pub max_prompt_len: usize,
    #[arg(long, default_value_t = 2048)]
    pub max_total_len: usize,
    /// Tokenizer for token counts (registry name or GGUF path); default the spawned
    /// server's model, else --model if it resolves, else smollm2-135m.
    #[arg(long)]
    pub tokenizer_model: Option<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
}

impl RequestFlags {
    /// The workload of `dataset` cut by these flags.
    pub fn workload<'a>(
        &self,
        dataset: &'a str,
        num_prompts: usize,
        request_rate: Option<f64>,
        burstiness: f64,
    ) -> WorkloadOptions<'a> {
        WorkloadOptions {
            dataset,
            num_prompts,
            seed: self.seed,
            output_len: self.output_len,
            max_prompt_len: self.max_prompt_len,
            max_total_len: self.max_total_len,
            request_rate,
            burstiness,
        }
    }

    /// The endpoint at `url` for these requests (route, `ignore_eos`).
    pub fn endpoint(&self, url: &str) -> Result<Endpoint> {
        let mut ep = Endpoint::parse(url, self.endpoint == "chat")?;
        ep.ignore_eos = self.ignore_eos;
        Ok(ep)
    }
}

/// What [`build_workload`] builds: the dataset, how many requests, and the arrivals.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadOptions<'a> {
    /// `--dataset`: a name, a preset or a ShareGPT JSON file.
    pub dataset: &'a str,
    pub num_prompts: usize,
    pub seed: u64,
    /// Fixed output length instead of the dataset's.
    pub output_len: Option<usize>,
    /// ShareGPT filter limits.
    pub max_prompt_len: usize,
    pub max_total_len: usize,
    /// Requests per second (gamma gaps of shape `burstiness`); `None`: all at once.
    pub request_rate: Option<f64>,
    pub burstiness: f64,
}

/// The tokenizer that counts prompt and output tokens: the one asked for, else the
/// spawned servers' model, else the served model when it resolves (a registry name or a
/// path), else smollm2-135m.
pub fn tokenizer_name(explicit: Option<&str>, spawned: Option<&str>, served: &str) -> String {
    match (explicit, spawned) {
        (Some(t), _) | (None, Some(t)) => t.to_string(),
        _ if runtime::registry::resolve(served).is_ok() => served.to_string(),
        _ => "smollm2-135m".into(),
    }
}

/// `None` = unlimited.
pub fn parse_concurrency(s: &str) -> Result<Vec<Option<usize>>> {
    s.split(',')
        .map(|x| match x.trim() {
            "inf" | "unlimited" => Ok(None),
            n => match n.parse::<usize>() {
                Ok(0) | Err(_) => bail!("bad concurrency {n:?}"),
                Ok(v) => Ok(Some(v)),
            },
        })
        .collect()
}

/// Counts the tokens of a text.
pub type TokenCounter = Box<dyn Fn(&str) -> usize + Send + Sync>;

/// A token counter from a GGUF tokenizer (BOS included when the model adds it, as vLLM's
/// `tokenizer(prompt).input_ids`).
pub fn gguf_counter(name_or_path: &str) -> Result<TokenCounter> {
    let path = runtime::registry::resolve(name_or_path)
        .with_context(|| format!("resolving tokenizer model {name_or_path}"))?;
    let g = runtime::gguf::GgufFile::open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let tok = runtime::tokenizer::Tokenizer::from_gguf(&g).context("loading tokenizer")?;
    Ok(Box::new(move |s: &str| tok.encode(s, true, false).len()))
}

/// Build the workload named by `--dataset`.
pub fn build_workload(a: &WorkloadOptions, count: &dyn Fn(&str) -> usize) -> Result<Workload> {
    let d = a.dataset;
    let all = |requests| Workload {
        label: String::new(),
        requests,
        arrival: Arrival::AllAtOnce,
    };
    let mut w = if d == datasets::synthetic::SHAREGPT_SYNTHETIC {
        let mut w = all(datasets::synthetic::sharegpt_synthetic(
            a.num_prompts,
            a.seed,
            a.output_len,
            count,
        ));
        w.label = d.to_string();
        w
    } else if let Some(mut w) = datasets::synthetic::preset(d, a.seed, count) {
        w.requests
            .truncate(a.num_prompts.max(1).min(w.requests.len()));
        if let Some(n) = a.output_len {
            w.requests
                .iter_mut()
                .for_each(|r| r.expected_output_len = n);
        }
        w
    } else if let Some((isl, osl)) = datasets::synthetic::parse_fixed(d) {
        let mut w = all(datasets::synthetic::fixed_isl_osl(
            a.num_prompts,
            isl,
            a.output_len.unwrap_or(osl),
            a.seed,
            count,
        ));
        w.label = format!("fixed:{isl}/{osl}");
        w
    } else if d == "code-edit" {
        // Modules of 4 to 10 functions to send back with one name changed.
        let mut w = all(datasets::code_edit::code_edit(
            a.num_prompts,
            (4, 10),
            a.seed,
            count,
        ));
        if let Some(n) = a.output_len {
            w.requests
                .iter_mut()
                .for_each(|r| r.expected_output_len = n);
        }
        w.label = d.to_string();
        w
    } else if let Some(rest) = d.strip_prefix("shared-prefix:") {
        let (k, groups) = rest.split_once(':').unwrap_or((rest, "1"));
        let k: usize = k.parse().context("shared-prefix:K[:GROUPS]: K")?;
        let groups: usize = groups
            .parse()
            .ok()
            .filter(|&g| g >= 1)
            .context("shared-prefix:K[:GROUPS]: GROUPS must be a count of 1 or more")?;
        let mut w = all(datasets::synthetic::shared_prefix_groups(
            a.num_prompts,
            k,
            groups,
            (32, 128),
            a.output_len.unwrap_or(256),
            a.seed,
            count,
        ));
        w.label = d.to_string();
        w
    } else {
        let Some(path) = runtime::registry::resolve_dataset(d)? else {
            bail!(
                "--dataset {d:?}: no such file; use a ShareGPT JSON file, sharegpt (the real file, fetched once), \
                 sharegpt-synthetic, fixed:ISL/OSL, shared-prefix:K[:GROUPS], code-edit or one of {:?}",
                datasets::synthetic::PRESETS
            );
        };
        let path = path.as_path();
        let datasets::sharegpt::Loaded { pairs, total, cut } =
            datasets::sharegpt::load_pairs(path)?;
        if let Some(c) = cut {
            eprintln!(
                "sharegpt: {} is cut short (input ends at line {}, column {}): {total} complete entries \
                 salvaged, the partial entry after them dropped",
                path.display(),
                c.line,
                c.column
            );
        }
        if total == 0 {
            bail!("{}: no complete ShareGPT entry", path.display());
        }
        let mut o = datasets::sharegpt::SampleOptions::new(a.num_prompts, a.seed);
        o.output_len = a.output_len;
        o.max_prompt_len = a.max_prompt_len;
        o.max_total_len = a.max_total_len;
        let n_pairs = pairs.len();
        let s = datasets::sharegpt::sample(pairs, &o, count);
        eprintln!(
            "sharegpt: {total} entries, {n_pairs} with >= 2 turns, {} sampled, {} dropped by the length filter",
            s.requests.len(),
            s.dropped.len()
        );
        if s.requests.len() < a.num_prompts {
            eprintln!(
                "warning: only {} of {} prompts passed the filter",
                s.requests.len(),
                a.num_prompts
            );
        }
        let mut w = all(s.requests);
        w.label = format!(
            "sharegpt:{}",
            path.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        w
    };
    if let Some(rate) = a.request_rate {
        w.arrival = Arrival::Gamma {
            rate,
            burstiness: a.burstiness,
        };
    }
    Ok(w)
}

/// Gamma(shape, scale) by Marsaglia–Tsang (with the shape < 1 boost).
pub fn gamma(rng: &mut impl Rng, shape: f64, scale: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        return gamma(rng, shape + 1.0, scale) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        let x = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = rng.gen_range(f64::EPSILON..1.0);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v * scale;
        }
    }
}

/// Send offsets (seconds from the start) of `n` requests under `arrival`; `None` for
/// sequential (each waits for the previous).
pub fn arrival_offsets(arrival: Arrival, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xa771_7a15);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            let at = t;
            let gap = match arrival {
                Arrival::AllAtOnce | Arrival::Sequential => 0.0,
                Arrival::Uniform { rate } => 1.0 / rate,
                Arrival::Gamma { rate, burstiness } => {
                    gamma(&mut rng, burstiness, 1.0 / (rate * burstiness))
                }
            };
            if i + 1 < n {
                t += gap;
            }
            at
        })
        .collect()
}

/// Run one sweep point; returns the outputs (in request order), the duration, and when it
/// began (seconds since the Unix epoch: `send_offset`s count from it, so events outside
/// the client, such as a worker killed mid-run, can be placed among the requests).
pub async fn run_point(
    ep: &Endpoint,
    model: &str,
    requests: &[SampledRequest],
    arrival: Arrival,
    max_concurrency: Option<usize>,
    seed: u64,
    timeout: Duration,
) -> (Vec<RequestOutput>, f64, f64) {
    let max_concurrency = if arrival == Arrival::Sequential {
        Some(1)
    } else {
        max_concurrency
    };
    let sem = Arc::new(tokio::sync::Semaphore::new(
        max_concurrency.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let offsets = arrival_offsets(arrival, requests.len(), seed);
    let start = Instant::now();
    let start_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut handles = Vec::with_capacity(requests.len());
    for (r, off) in requests.iter().zip(offsets) {
        tokio::time::sleep_until((start + Duration::from_secs_f64(off)).into()).await;
        let arrived = Instant::now();
        let permit = sem.clone().acquire_owned();
        let (ep, model, r) = (ep.clone(), model.to_string(), r.clone());
        handles.push(tokio::spawn(async move {
            let _permit = permit.await;
            let queue_time = arrived.elapsed().as_secs_f64();
            let send_offset = start.elapsed().as_secs_f64();
            let mut o = client::send(
                &ep,
                &model,
                &r.prompt,
                r.prompt_len,
                r.expected_output_len,
                timeout,
            )
            .await;
            o.queue_time = queue_time;
            o.send_offset = send_offset;
            o
        }));
    }
    let mut outs = Vec::with_capacity(handles.len());
    for h in handles {
        outs.push(h.await.unwrap_or_else(|e| RequestOutput {
            error: Some((client::ErrorKind::Connection, format!("task failed: {e}"))),
            ..Default::default()
        }));
    }
    (outs, start.elapsed().as_secs_f64(), start_unix)
}

/// The speculative-decoding counters of an rserve's `/metrics` (None: another server,
/// or none answered).
#[derive(Clone, Copy, Debug, PartialEq)]
struct SpecCounters {
    drafts: f64,
    draft_tokens: f64,
    accepted: f64,
}

fn spec_counters(ep: &Endpoint) -> Option<SpecCounters> {
    let (status, body) = spawn::http_get(&ep.host, ep.port, "/metrics", true)?;
    if status != 200 {
        return None;
    }
    parse_spec_counters(&body)
}

fn parse_spec_counters(text: &str) -> Option<SpecCounters> {
    let get = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
    };
    Some(SpecCounters {
        drafts: get("rserve_spec_decode_num_drafts_total")?,
        draft_tokens: get("rserve_spec_decode_num_draft_tokens_total")?,
        accepted: get("rserve_spec_decode_num_accepted_tokens_total")?,
    })
}

/// Ask `/v1/models` for the first model id, retrying for up to `wait` while the server is
/// still loading.
pub async fn first_model(ep: &Endpoint, wait: Duration) -> Option<String> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(m) = models_once(ep).await {
            return Some(m);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn models_once(ep: &Endpoint) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .ok()?;
    let req = format!(
        "GET /v1/models HTTP/1.1\r\nHost: {}:{}\r\nConnection: close\r\n\r\n",
        ep.host, ep.port
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf);
    let body = &text[text.find('{')?..text.rfind('}')? + 1];
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v.pointer("/data/0/id")?.as_str().map(str::to_string)
}

/// UTC timestamp `YYYYMMDD-HHMMSS` (vLLM's `date` format).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (y, m, d, h, mi, s) = crate::llama_bench::run::civil_utc(secs);
    format!("{y:04}{m:02}{d:02}-{h:02}{mi:02}{s:02}")
}

/// Entry point for `rbench serve ARGS…` (`args[0]` is the subcommand name).
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let a: ServeArgs = match crate::parse_args(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(all_ok) => {
            if all_ok {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(3)
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One sweep target: a server and what its result lines record about it.
struct Target {
    ep: Endpoint,
    base_url: String,
    backend: String,
    model: String,
    /// `server_cmd` and `server_version` for spawned servers.
    extra: Vec<(&'static str, serde_json::Value)>,
}

/// What every point of a sweep shares.
struct Sweep<'a> {
    a: &'a ServeArgs,
    rt: &'a tokio::runtime::Runtime,
    w: Workload,
    count: TokenCounter,
    percentiles: Vec<f64>,
    goodput: Goodput,
    request_rate: Option<f64>,
    burstiness: f64,
    result_file: Option<PathBuf>,
    done: Vec<serde_json::Value>,
}

impl Sweep<'_> {
    fn settings(&self, t: &Target, c: Option<usize>) -> PointSettings {
        PointSettings {
            backend: t.backend.clone(),
            base_url: t.base_url.clone(),
            model_id: t.model.clone(),
            endpoint: t.ep.path.clone(),
            dataset: self.w.label.clone(),
            num_prompts: self.w.requests.len(),
            seed: self.a.req.seed,
            request_rate: self.request_rate,
            burstiness: self.burstiness,
            max_concurrency: c,
            output_len: self.a.req.output_len,
            ignore_eos: self.a.req.ignore_eos,
        }
    }

    /// Warmup, the point, its summary and result line, the cooldown. `Ok(false)` when a
    /// request failed.
    fn point(
        &self,
        t: &Target,
        c: Option<usize>,
        extra: &[(&'static str, serde_json::Value)],
    ) -> Result<bool> {
        let a = self.a;
        let settings = self.settings(t, c);
        let timeout = Duration::from_secs_f64(a.req.timeout);
        t.ep.pool.clear();
        if let Some(r) = self.w.requests.first() {
            for _ in 0..a.warmup {
                let o = self.rt.block_on(client::send(
                    &t.ep,
                    &t.model,
                    &r.prompt,
                    r.prompt_len,
                    r.expected_output_len.min(16),
                    timeout,
                ));
                if let Some((k, e)) = &o.error {
                    eprintln!("  warmup request failed ({}): {e}", k.name());
                }
            }
        }
        let spec_before = spec_counters(&t.ep);
        let (outs, dur, start_unix) = self.rt.block_on(run_point(
            &t.ep,
            &t.model,
            &self.w.requests,
            self.w.arrival,
            c,
            a.req.seed,
            timeout,
        ));
        let mut m = result::summarize(
            &settings,
            &outs,
            dur,
            &self.percentiles,
            &self.goodput,
            &utc_now(),
            &*self.count,
        );
        m.insert("start_unix".into(), serde_json::json!(start_unix));
        let spec = spec_before
            .zip(spec_counters(&t.ep))
            .map(|(b, a)| SpecCounters {
                drafts: a.drafts - b.drafts,
                draft_tokens: a.draft_tokens - b.draft_tokens,
                accepted: a.accepted - b.accepted,
            })
            .filter(|d| d.drafts > 0.0);
        if let Some(d) = &spec {
            m.insert("spec_drafts".into(), serde_json::json!(d.drafts));
            m.insert(
                "spec_draft_tokens".into(),
                serde_json::json!(d.draft_tokens),
            );
            m.insert("spec_accepted_tokens".into(), serde_json::json!(d.accepted));
            m.insert(
                "spec_acceptance_rate".into(),
                serde_json::json!(d.accepted / d.draft_tokens.max(1.0)),
            );
            m.insert(
                "spec_mean_draft_len".into(),
                serde_json::json!(d.draft_tokens / d.drafts),
            );
        }
        for (k, v) in t.extra.iter().chain(extra) {
            m.insert(k.to_string(), v.clone());
        }
        if a.save_detailed {
            m.extend(result::detailed(&outs, &*self.count));
        }
        if !t.extra.is_empty() {
            println!("\n[{}]", t.backend);
        }
        print!(
            "{}",
            result::summary_text(&m, &self.percentiles, self.request_rate.is_some())
        );
        if let Some(d) = &spec {
            println!(
                "{:<40}{:<10.2}\n{:<40}{:<10.1}\n{:<40}{:<10.2}",
                "Spec decode acceptance rate:",
                d.accepted / d.draft_tokens.max(1.0),
                "Spec decode mean draft length:",
                d.draft_tokens / d.drafts,
                "Spec decode tokens per draft step:",
                1.0 + d.accepted / d.drafts,
            );
        }
        for (i, o) in outs.iter().enumerate() {
            if let Some((k, e)) = &o.error {
                eprintln!("  request {i} failed ({}): {e}", k.name());
            }
        }
        if let Some(f) = &self.result_file {
            result::append_line(f, &m).with_context(|| format!("writing {}", f.display()))?;
        }
        if a.cooldown > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(a.cooldown));
        }
        Ok(outs.iter().all(RequestOutput::success))
    }
}

/// Run the sweep; `Ok(false)` when some request failed (exit status 3).
pub fn run(a: &ServeArgs) -> Result<bool> {
    if !(0.0..=60.0).contains(&a.cooldown) {
        bail!("--cooldown must be 0..=60 seconds (a fixed pause, never a wait for a condition)");
    }
    let percentiles: Vec<f64> = a
        .metric_percentiles
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .context("--metric-percentiles")?;
    let goodput = Goodput::parse(&a.goodput)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let endpoint = |url: &str| a.req.endpoint(url);
    let model_of = |ep: &Endpoint| match &a.req.model {
        Some(m) => m.clone(),
        None => rt
            .block_on(first_model(ep, Duration::from_secs(120)))
            .unwrap_or_else(|| {
                eprintln!("warning: GET /v1/models gave no model id; sending model \"default\"");
                "default".into()
            }),
    };
    // Spawned servers: parse every spec before starting anything.
    let defaults = a.server.defaults();
    let specs: Vec<spawn::SpawnSpec> = a
        .spawn
        .iter()
        .map(|s| spawn::parse_spawn(s, &defaults))
        .collect::<Result<_>>()?;
    {
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            bail!("--spawn: every server needs its own name");
        }
    }
    let logs = tempfile::Builder::new()
        .prefix("rbench-serve-")
        .tempdir()
        .context("creating a directory for server logs")?;
    let log_dir = match &a.result_file {
        Some(f) => f.parent().map_or_else(|| PathBuf::from("."), PathBuf::from),
        None => logs.path().to_path_buf(),
    };
    let ready = Duration::from_secs(600);
    let versions: Vec<String> = specs.iter().map(spawn::version_of).collect();
    let mut running: Vec<Option<spawn::Spawned>> = specs.iter().map(|_| None).collect();
    let mut targets = Vec::new();
    if specs.is_empty() {
        let url = a.url.clone().context("--url or --spawn is required")?;
        let ep = endpoint(&url)?;
        targets.push(Target {
            model: model_of(&ep),
            base_url: url,
            backend: a.backend.clone(),
            ep,
            extra: Vec::new(),
        });
    } else {
        // Started when first needed (a resumed sweep may need none).
        for (i, sp) in specs.iter().enumerate() {
            eprintln!("rbench serve: {} is {}", sp.name, versions[i]);
            targets.push(Target {
                model: a.req.model.clone().unwrap_or_default(),
                // Ports change on restarts: resumes match spawned servers by name.
                base_url: format!("spawned:{}", sp.name),
                backend: sp.name.clone(),
                ep: endpoint("http://127.0.0.1:0")?,
                extra: vec![
                    ("server_cmd", serde_json::json!(sp.command_line(0))),
                    ("server_version", serde_json::json!(versions[i])),
                    ("server_url", serde_json::Value::Null),
                ],
            });
        }
    }
    let tok_name = tokenizer_name(
        a.req.tokenizer_model.as_deref(),
        (!specs.is_empty()).then_some(a.server.server_model.as_str()),
        &targets[0].model,
    );
    let count = gguf_counter(&tok_name)?;
    let w = build_workload(
        &a.req
            .workload(&a.dataset, a.num_prompts, a.request_rate, a.burstiness),
        &*count,
    )?;
    if w.requests.is_empty() {
        bail!("the dataset produced no requests");
    }
    let conc = match &a.concurrency {
        _ if w.arrival == Arrival::Sequential => vec![Some(1)],
        Some(c) => parse_concurrency(c)?,
        None if w.label.starts_with("preset:") => vec![None],
        None => parse_concurrency("1,2,4,8,16,32,64")?,
    };
    let result_file = a.result_file.clone().or_else(|| a.resume.clone());
    let done = a
        .resume
        .as_deref()
        .map(result::read_lines)
        .unwrap_or_default();
    let (request_rate, burstiness) = match w.arrival {
        Arrival::AllAtOnce => (None, 1.0),
        Arrival::Sequential => (None, 1.0),
        Arrival::Uniform { rate } => (Some(rate), f64::INFINITY),
        Arrival::Gamma { rate, burstiness } => (Some(rate), burstiness),
    };
    eprintln!(
        "rbench serve: {} -> {}, dataset {} ({} requests, tokenizer {tok_name}), arrivals {:?}",
        targets
            .iter()
            .map(|t| format!("{} ({})", t.backend, t.base_url))
            .collect::<Vec<_>>()
            .join(", "),
        targets[0].ep.path,
        w.label,
        w.requests.len(),
        w.arrival
    );
    let sweep = Sweep {
        a,
        rt: &rt,
        w,
        count,
        percentiles,
        goodput,
        request_rate,
        burstiness,
        result_file,
        done,
    };
    let mut all_ok = true;
    for (pi, c) in conc.into_iter().enumerate() {
        if specs.is_empty() {
            let t = &targets[0];
            if result::already_done(&sweep.done, &sweep.settings(t, c)) {
                eprintln!("resume: skipping max_concurrency {c:?} (already in the result file)");
                continue;
            }
            all_ok &= sweep.point(t, c, &[])?;
            continue;
        }
        let order = spawn::order(specs.len(), pi, a.spawn_reps.max(1));
        let mut seen = vec![0usize; specs.len()];
        for (slot, &i) in order.iter().enumerate() {
            let rep = seen[i];
            seen[i] += 1;
            let extra = [
                ("run_order", serde_json::json!(slot)),
                ("rep", serde_json::json!(rep)),
            ];
            if sweep.done.iter().any(|l| {
                // The model id is known once the server answers; match the rest.
                let mut st = sweep.settings(&targets[i], c);
                if targets[i].model.is_empty() {
                    st.model_id = l
                        .get("model_id")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("")
                        .to_string();
                }
                st.matches(l)
                    && l.get("rep").and_then(serde_json::Value::as_u64) == Some(rep as u64)
            }) {
                eprintln!(
                    "resume: skipping {} max_concurrency {c:?} rep {rep} (already in the result file)",
                    specs[i].name
                );
                continue;
            }
            let started = running[i].is_some();
            let alive = running[i].as_mut().is_some_and(|s| s.alive());
            if started && !alive {
                eprintln!(
                    "rbench serve: warning: {} is no longer running (see its log in {}); starting it again",
                    specs[i].name,
                    log_dir.display()
                );
            }
            if a.restart || !alive {
                if let Some(mut old) = running[i].take() {
                    old.stop();
                }
                let s = spawn::Spawned::start(&specs[i], &log_dir, ready)?;
                let url = s.url();
                targets[i].ep = endpoint(&url)?;
                if targets[i].model.is_empty() {
                    targets[i].model = model_of(&targets[i].ep);
                }
                targets[i].extra[0].1 = serde_json::json!(s.command_line);
                targets[i].extra[2].1 = serde_json::json!(url);
                running[i] = Some(s);
            }
            eprintln!(
                "rbench serve: point {} (concurrency {}), run {}/{}: {}",
                pi + 1,
                c.map_or("inf".into(), |c| c.to_string()),
                slot + 1,
                order.len(),
                specs[i].name
            );
            all_ok &= sweep.point(&targets[i], c, &extra)?;
        }
    }
    for s in running.iter_mut().flatten() {
        s.stop();
    }
    Ok(all_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_counters_come_from_rserve_metrics_only() {
        let text = "# HELP x\nrserve_spec_decode_num_drafts_total 4\n\
                    rserve_spec_decode_num_draft_tokens_total 30\n\
                    rserve_spec_decode_num_accepted_tokens_total 21\n";
        assert_eq!(
            parse_spec_counters(text),
            Some(SpecCounters {
                drafts: 4.0,
                draft_tokens: 30.0,
                accepted: 21.0
            })
        );
        assert_eq!(
            parse_spec_counters("llamacpp:tokens_predicted_total 9\n"),
            None
        );
    }

    #[test]
    fn concurrency_and_arrivals() {
        assert_eq!(
            parse_concurrency("1,4,inf").unwrap(),
            vec![Some(1), Some(4), None]
        );
        assert!(parse_concurrency("0").is_err());
        assert_eq!(arrival_offsets(Arrival::AllAtOnce, 3, 0), vec![0.0; 3]);
        let u = arrival_offsets(Arrival::Uniform { rate: 4.0 }, 3, 0);
        assert_eq!(u, vec![0.0, 0.25, 0.5]);
        let g = arrival_offsets(
            Arrival::Gamma {
                rate: 10.0,
                burstiness: 1.0,
            },
            5001,
            1,
        );
        let mean_gap = g[5000] / 5000.0;
        assert!((mean_gap - 0.1).abs() < 0.01, "{mean_gap}");
        let g = arrival_offsets(
            Arrival::Gamma {
                rate: 10.0,
                burstiness: 0.5,
            },
            5001,
            1,
        );
        assert!((g[5000] / 5000.0 - 0.1).abs() < 0.015);
        assert_eq!(utc_now().len(), 15);
    }
}
