//! `rbench soak`: a long run of real traffic against one server, watching for leaks.
//!
//! ```text
//! rbench soak --spawn rserve --duration 30m --concurrency 64 --dataset sharegpt \
//!     --result-file soak.json            # also soak.svg; exit status 3 when a check fails
//! rbench soak --url http://127.0.0.1:8080 --pid 4242 --duration 2h ...
//! ```
//!
//! `--concurrency` clients send ShareGPT prompts (picked at random, with replacement, from
//! `--num-prompts` sampled ones, so the run never runs out) back to back; a
//! `--cancel-fraction` of them hang up after a random 1..=`--cancel-max-chunks` streamed
//! chunks; every `--burst-every` a burst of `--burst-size` extra requests (more than the
//! server's queue holds) goes out at once, so some are answered 429. Every
//! `--sample-every` the server's RSS, open fds and threads (`/proc/PID`) and its queue and
//! KV gauges (`/metrics`) are recorded with the client's counts.
//!
//! At the end the load stops, in-flight requests finish, and the server must go idle with
//! `rserve_kv_blocks_used` back at 0. Every request sent is exactly one of completed,
//! rejected (429), cancelled (by us) or failed (anything else, which must not happen), and
//! the server's `rserve_requests_total{outcome}` counters must agree. After `--warmup`,
//! RSS and fds must stay within `--rss-bound-mib` and `--fd-bound`. The settings, the
//! series, the accounting and the verdict go to a JSON file, the series to an SVG next to
//! it, and a summary to stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use datasets::SampledRequest;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use super::client::{self, Endpoint, ErrorKind, RequestOutput};
use super::spawn::{self, ServerFlags, Spawned};
use super::{build_workload, first_model, gguf_counter, tokenizer_name, RequestFlags};
use crate::report::{Mark, Series, XAxis};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rbench soak",
    about = "Soak test: real traffic for a long time against one server, with client \
             disconnects and bursts past its queue; fails on leaks (RSS, fds, KV blocks) and \
             on requests that end in neither a completion, a 429 nor our own cancel"
)]
pub struct SoakArgs {
    /// Server base URL, e.g. http://127.0.0.1:8080 (or start one with --spawn). The server
    /// must serve only this run: its request counters are checked against ours.
    #[arg(long, required_unless_present = "spawn", conflicts_with = "spawn")]
    pub url: Option<String>,
    /// With --url: the server's process id, for RSS, fds and threads from /proc (without
    /// it those are not sampled and the flatness checks are skipped).
    #[arg(long, requires = "url")]
    pub pid: Option<u32>,
    /// Start this server: `rserve` (the binary next to rbench or $RSERVE_BIN, given
    /// --server-* and --queue-size) or NAME="CMD ..." as `rbench serve --spawn` takes it.
    #[arg(long)]
    pub spawn: Option<String>,
    #[command(flatten)]
    pub server: ServerFlags,
    /// The server's admission queue (rserve's --queue-size): passed to a spawned built-in
    /// rserve, otherwise what the server is taken to have. Default: --concurrency, so the
    /// steady load fits (at most concurrency - slots requests wait) and bursts do not.
    #[arg(long)]
    pub queue_size: Option<usize>,
    /// How long to send load: 30m, 120s, 1h30m, or seconds.
    #[arg(long, value_parser = parse_duration, default_value = "30m")]
    pub duration: f64,
    /// Clients sending back to back (each waits for its previous request).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// `sharegpt` (the real ShareGPT V3 file, fetched and cached once), a ShareGPT JSON
    /// file, or any other `rbench serve --dataset`.
    #[arg(long, default_value = "sharegpt")]
    pub dataset: String,
    /// Prompts sampled from the dataset; each request picks one at random (with
    /// replacement), so a run of any length never runs out.
    #[arg(long, default_value_t = 2000)]
    pub num_prompts: usize,
    #[command(flatten)]
    pub req: RequestFlags,
    /// Share of the clients' requests that hang up mid-stream.
    #[arg(long, default_value_t = 0.1)]
    pub cancel_fraction: f64,
    /// A cancelled request hangs up after a random 1..=N content chunks.
    #[arg(long, default_value_t = 8)]
    pub cancel_max_chunks: usize,
    /// Time between bursts (0: none) [default: 180s, or a quarter of --duration when
    /// that is shorter].
    #[arg(long, value_parser = parse_duration)]
    pub burst_every: Option<f64>,
    /// Requests fired at once in a burst [default: queue size + 2 x concurrency, more than
    /// the queue can take however many of the clients' requests are waiting].
    #[arg(long)]
    pub burst_size: Option<usize>,
    /// Time between samples [default: 60s; for runs under 20 minutes, a twentieth of
    /// --duration, at least 1s].
    #[arg(long, value_parser = parse_duration)]
    pub sample_every: Option<f64>,
    /// Samples before this are left out of the flatness checks (caches, pools and the
    /// KV pages fill up first) [default: 5m, or a third of --duration when that is
    /// shorter].
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<f64>,
    /// After warm-up, the server's RSS may move (max - min) by this many MiB. The
    /// allocator's churn at a steady load is a few MiB (7 MiB over 30 minutes here), while
    /// 64 MiB in the 25 minutes after a 5-minute warm-up is a leak of 2.5 MiB a minute
    /// (some 25 KiB per request at the ~2,500 requests such a run sends on two cores); the
    /// slope in MiB/min is reported for anything slower.
    #[arg(long, default_value_t = 64.0)]
    pub rss_bound_mib: f64,
    /// After warm-up, the server's open fds minus its open connections (rserve counts them
    /// in /metrics; other servers: minus the connections rbench holds) may move (max -
    /// min) by this many. What remains (listener, epoll, event fds, files) is constant;
    /// 16 leaves room for connections opened or closed between the two readings, while a
    /// leaked descriptor per burst or per cancel (hundreds over a run) cannot hide under
    /// it. A leaked connection is the `conns closed` check's: once rbench hangs up, the
    /// server must hold none.
    #[arg(long, default_value_t = 16)]
    pub fd_bound: usize,
    /// After the load: how long the server may take to go idle with no KV block used.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub idle_wait: f64,
    /// The JSON result (settings, series, accounting, verdict); rewritten after every
    /// sample while the run lasts.
    #[arg(long, default_value = "soak.json")]
    pub result_file: PathBuf,
    /// The SVG plot of the series [default: the result file with .svg].
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Share of the clients' requests replaced by hostile ones, in turn: a pathological
    /// `response_format` schema with an adverse `logit_bias` (n 3, ignore_eos), a
    /// connection that never finishes its headers, an oversize declared body, and a
    /// request dropped right after it is sent. The load then alternates phases without
    /// and with them (each a tenth of the run, at least 10 s), and the verdict checks that
    /// the honest requests' TPOT p99 in the hostile phases stays within
    /// --hostile-tpot-bound of the phases without, that every slow connection was closed
    /// by the server and every oversize body refused with a 413.
    #[arg(long, default_value_t = 0.0)]
    pub hostile_fraction: f64,
    /// The most the honest TPOT p99 may grow in the hostile phases.
    #[arg(long, default_value_t = 1.5)]
    pub hostile_tpot_bound: f64,
}

/// Seconds from `30m`, `120s`, `1h30m`, `1.5h`, `250ms` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        return if v >= 0.0 && v.is_finite() {
            Ok(v)
        } else {
            Err(format!("not a duration: {s:?}"))
        };
    }
    let mut total = 0.0;
    let mut rest = t;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: a number needs a unit (h, m, s, ms)"))?;
        let v: f64 = rest[..n]
            .parse()
            .map_err(|_| format!("not a duration: {s:?} (use e.g. 30m, 120s, 1h30m)"))?;
        let unit_end = rest[n..]
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .map_or(rest.len(), |u| n + u);
        let scale = match &rest[n..unit_end] {
            "h" => 3600.0,
            "m" | "min" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            u => return Err(format!("{s:?}: unknown unit {u:?} (use h, m, s or ms)")),
        };
        total += v * scale;
        rest = &rest[unit_end..];
    }
    Ok(total)
}

/// The timing of a run, defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Plan {
    pub duration_s: f64,
    pub warmup_s: f64,
    pub sample_every_s: f64,
    /// 0: no bursts.
    pub burst_every_s: f64,
    pub burst_size: usize,
    pub queue_size: usize,
}

impl Plan {
    pub fn of(a: &SoakArgs) -> Plan {
        let d = a.duration;
        let queue_size = a.queue_size.unwrap_or(a.concurrency);
        Plan {
            duration_s: d,
            warmup_s: a.warmup.unwrap_or((d / 3.0).min(300.0)),
            sample_every_s: a.sample_every.unwrap_or(if d >= 1200.0 {
                60.0
            } else {
                (d / 20.0).max(1.0)
            }),
            burst_every_s: a.burst_every.unwrap_or((d / 4.0).min(180.0)),
            burst_size: a.burst_size.unwrap_or(queue_size + 2 * a.concurrency),
            queue_size,
        }
    }

    /// When samples are taken during the load: 0, every interval, and the end.
    pub fn sample_times(&self) -> Vec<f64> {
        let mut ts = vec![0.0];
        let mut k = 1;
        while k as f64 * self.sample_every_s < self.duration_s - 1e-6 {
            ts.push(k as f64 * self.sample_every_s);
            k += 1;
        }
        ts.push(self.duration_s);
        ts
    }

    /// When bursts go out: every interval, each half a sample interval early (at most
    /// half a burst interval), so no burst coincides with a sample and the samples see
    /// bursts at work.
    pub fn burst_times(&self) -> Vec<f64> {
        if self.burst_every_s <= 0.0 || self.burst_size == 0 {
            return Vec::new();
        }
        let early = (self.sample_every_s / 2.0).min(self.burst_every_s / 2.0);
        (1..)
            .map(|k| k as f64 * self.burst_every_s - early)
            .take_while(|&t| t < self.duration_s - 1e-6)
            .collect()
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The stream ran to `[DONE]` (an immediate end of generation, no content, included).
    Completed,
    /// HTTP 429: the server's queue was full.
    Rejected,
    /// We hung up mid-stream on purpose.
    Cancelled,
    /// Anything else: a non-429 status, a broken connection, a timeout, bad SSE.
    Failed(ErrorKind),
}

/// The class of a request's output.
pub fn classify(o: &RequestOutput) -> Class {
    if o.cancelled {
        return Class::Cancelled;
    }
    match &o.error {
        None | Some((ErrorKind::EmptyOutput, _)) => Class::Completed,
        Some((ErrorKind::HttpStatus, _)) if o.status == Some(429) => Class::Rejected,
        Some((k, _)) => Class::Failed(*k),
    }
}

/// The client's counts; every request sent ends in exactly one of the four outcomes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counts {
    pub sent: u64,
    pub completed: u64,
    /// Completions with no content (the model ended at once).
    pub completed_empty: u64,
    pub rejected_429: u64,
    pub cancelled: u64,
    /// Requests picked to hang up mid-stream (`--cancel-fraction`); fewer end cancelled
    /// when the server finishes (or rejects) one before its hang-up point.
    pub cancel_planned: u64,
    pub failed: u64,
    pub failed_by_kind: BTreeMap<String, u64>,
    /// Of the above, the burst requests.
    pub burst_sent: u64,
    pub burst_ended: u64,
    pub burst_rejected_429: u64,
    pub bursts: u64,
    /// Output tokens of completed requests (the server's usage, else counted).
    pub output_tokens: u64,
    /// Hostile actions (not in `sent`): those that send a whole generation request (the
    /// server counts them), and those whose answer was not the one expected (a slow
    /// connection held open, an oversize body not refused with a 413, a constrained
    /// request failing).
    pub hostile_sent: u64,
    pub hostile_requests: u64,
    pub hostile_unexpected: u64,
    pub hostile_by_kind: BTreeMap<String, u64>,
}

impl Counts {
    pub fn ended(&self) -> u64 {
        self.completed + self.rejected_429 + self.cancelled + self.failed
    }

    fn add(&mut self, c: Class, o: &RequestOutput, burst: bool, out_tokens: u64) {
        match c {
            Class::Completed => {
                self.completed += 1;
                self.completed_empty += u64::from(o.error.is_some());
                self.output_tokens += out_tokens;
            }
            Class::Rejected => self.rejected_429 += 1,
            Class::Cancelled => self.cancelled += 1,
            Class::Failed(k) => {
                self.failed += 1;
                *self.failed_by_kind.entry(k.name().into()).or_default() += 1;
            }
        }
        if burst {
            self.burst_ended += 1;
            self.burst_rejected_429 += u64::from(c == Class::Rejected);
        }
    }

    /// The accounting check: `sent = completed + rejected + cancelled + failed`, and no
    /// request failed.
    pub fn check(&self) -> Check {
        let sum = self.ended();
        let detail = format!(
            "sent {} = completed {} + rejected 429 {} + cancelled {} + failed {} (= {sum})",
            self.sent, self.completed, self.rejected_429, self.cancelled, self.failed
        );
        if sum != self.sent {
            return Check::fail("accounting", format!("{detail}: MISMATCH"));
        }
        if self.failed > 0 {
            return Check::fail(
                "accounting",
                format!("{detail}: {} failed {:?}", self.failed, self.failed_by_kind),
            );
        }
        Check::pass("accounting", detail)
    }
}

/// One named check of the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: String,
    /// "pass", "fail" or "skipped".
    pub status: &'static str,
    pub detail: String,
}

impl Check {
    pub fn pass(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, "pass", detail)
    }
    pub fn fail(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, "fail", detail)
    }
    pub fn skipped(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, "skipped", detail)
    }
    fn new(name: &str, status: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            detail: detail.into(),
        }
    }
    pub fn failed(&self) -> bool {
        self.status == "fail"
    }
}

/// What `/proc/PID` says about the server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProcSample {
    pub rss_mib: f64,
    pub threads: u64,
    pub fds: u64,
}

/// VmRSS (as MiB) and Threads from the text of `/proc/PID/status`.
pub fn parse_status(text: &str) -> Option<(f64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")? as f64 / 1024.0, field("Threads:")?))
}

/// Whether `/proc/PID` is a live process (not gone, not a zombie).
fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|t| {
        !t.lines()
            .any(|l| l.starts_with("State:") && (l.contains("Z (") || l.contains("X (")))
    })
}

fn proc_sample(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let (rss_mib, threads) = parse_status(&status)?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(ProcSample {
        rss_mib,
        threads,
        fds,
    })
}

/// One sample in Prometheus text: `name` or `name{labels}` exactly.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The outcomes of `rserve_requests_total`.
pub const OUTCOMES: [&str; 8] = [
    "stop",
    "length",
    "cancelled",
    "rejected_queue_full",
    "unavailable",
    "invalid",
    "unauthorized",
    "error",
];

/// What the server's `/metrics` says.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ServerMetrics {
    pub queued: f64,
    pub waiting: f64,
    pub running: f64,
    pub kv_blocks_used: f64,
    pub kv_blocks_cached: f64,
    pub kv_blocks_total: f64,
    pub received: f64,
    /// `rserve_requests_total` by outcome.
    pub outcomes: BTreeMap<String, f64>,
    /// `rserve_http_connections_open`: the sockets the server holds (the scrape's own
    /// included); absent from servers before it.
    pub connections_open: Option<f64>,
}

impl ServerMetrics {
    /// `None` unless the text has rserve's gauges.
    pub fn parse(text: &str) -> Option<ServerMetrics> {
        let g = |n: &str| metric(text, n);
        Some(ServerMetrics {
            queued: g("rserve_requests_queued")?,
            waiting: g("rserve_requests_waiting")?,
            running: g("rserve_requests_running")?,
            kv_blocks_used: g("rserve_kv_blocks_used")?,
            kv_blocks_cached: g("rserve_kv_blocks_cached")?,
            kv_blocks_total: g("rserve_kv_blocks_total")?,
            received: g("rserve_requests_received_total")?,
            outcomes: OUTCOMES
                .iter()
                .map(|o| {
                    let v = g(&format!("rserve_requests_total{{outcome=\"{o}\"}}"));
                    (o.to_string(), v.unwrap_or(0.0))
                })
                .collect(),
            connections_open: g("rserve_http_connections_open"),
        })
    }

    fn outcome(&self, o: &str) -> f64 {
        self.outcomes.get(o).copied().unwrap_or(0.0)
    }

    /// Nothing running, waiting or holding a KV block, and every request received has its
    /// outcome counted.
    pub fn settled(&self) -> bool {
        self.kv_blocks_used == 0.0
            && self.running == 0.0
            && self.waiting == 0.0
            && self.queued == 0.0
            && self.outcomes.values().sum::<f64>() == self.received
    }
}

/// The server's counters over the run (`end - start`) against the client's counts.
pub fn cross_check(start: &ServerMetrics, end: &ServerMetrics, c: &Counts) -> Vec<Check> {
    let d = |o: &str| (end.outcome(o) - start.outcome(o)).round() as i64;
    let received = (end.received - start.received).round() as i64;
    // Hostile generation requests reach the server too (a dropped one may or may not).
    let extra = c.hostile_requests as i64;
    let within = |x: i64, base: i64| (base..=base + extra).contains(&x);
    let outcomes: i64 = OUTCOMES.iter().map(|o| d(o)).sum();
    let finished = d("stop") + d("length") + d("cancelled");
    let other = d("unavailable") + d("invalid") + d("unauthorized") + d("error");
    let mut v = Vec::new();
    let mut one = |name: &str, ok: bool, detail: String| {
        v.push(if ok {
            Check::pass(name, detail)
        } else {
            Check::fail(name, detail)
        })
    };
    one(
        "server received",
        within(received, c.sent as i64) && outcomes == received,
        format!(
            "rserve_requests_received_total +{received} (sent {}), outcomes +{outcomes}",
            c.sent
        ),
    );
    one(
        "server 429s",
        within(d("rejected_queue_full"), c.rejected_429 as i64),
        format!(
            "outcome rejected_queue_full +{} (429s seen {})",
            d("rejected_queue_full"),
            c.rejected_429
        ),
    );
    one(
        "server finished",
        within(finished, (c.completed + c.cancelled) as i64)
            && d("cancelled") <= c.cancelled as i64 + extra,
        format!(
            "outcomes stop +{} length +{} cancelled +{} = {finished} (completed {} + cancelled {}; \
             the server may finish a request we hung up on before it notices)",
            d("stop"),
            d("length"),
            d("cancelled"),
            c.completed,
            c.cancelled
        ),
    );
    one(
        "server errors",
        within(other, c.failed as i64),
        format!(
            "outcomes unavailable +{} invalid +{} unauthorized +{} error +{} (failed {})",
            d("unavailable"),
            d("invalid"),
            d("unauthorized"),
            d("error"),
            c.failed
        ),
    );
    v
}

/// One point of the series.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sample {
    /// Seconds since the load started.
    pub t_s: f64,
    pub proc: Option<ProcSample>,
    /// Connections rbench held open (idle or busy) at the sample.
    pub client_conns: u64,
    /// The connections the server says it holds (`rserve_http_connections_open`, read
    /// just after the descriptors, so it counts the scrape's own connection they lack).
    pub server_conns: Option<u64>,
    /// The descriptors less the sockets: `fds - server_conns` where the server counts its
    /// connections (hostile clients' and refused ones are then counted exactly), else
    /// `fds - client_conns`. What the flatness check watches.
    pub fds_net: Option<i64>,
    pub metrics: Option<ServerMetrics>,
    pub counts: Counts,
}

/// RSS and fds after warm-up.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Flatness {
    pub warmup_s: f64,
    pub samples: usize,
    pub rss_min_mib: f64,
    pub rss_max_mib: f64,
    pub rss_range_mib: f64,
    /// Least-squares slope of RSS over time, MiB per minute.
    pub rss_slope_mib_per_min: f64,
    pub fds_min: u64,
    pub fds_max: u64,
    pub fds_net_min: i64,
    pub fds_net_max: i64,
    pub fds_net_range: i64,
    /// What was subtracted from the descriptors: "server connections" (every sample after
    /// warm-up had the server's count) or "client connections".
    pub fds_net_less: &'static str,
    pub threads_min: u64,
    pub threads_max: u64,
}

/// Flatness over the samples at or after `warmup_s` that have /proc data; `None` with
/// fewer than 3 of them.
pub fn flatness(samples: &[Sample], warmup_s: f64) -> Option<Flatness> {
    let post: Vec<(f64, ProcSample, i64)> = samples
        .iter()
        .filter(|s| s.t_s >= warmup_s - 1e-6)
        .filter_map(|s| Some((s.t_s, s.proc?, s.fds_net?)))
        .collect();
    if post.len() < 3 {
        return None;
    }
    let fold = |f: &dyn Fn(&(f64, ProcSample, i64)) -> f64| {
        post.iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (rss_min, rss_max) = fold(&|p| p.1.rss_mib);
    let (fd_min, fd_max) = fold(&|p| p.1.fds as f64);
    let (net_min, net_max) = fold(&|p| p.2 as f64);
    let (th_min, th_max) = fold(&|p| p.1.threads as f64);
    let pts: Vec<(f64, f64)> = post.iter().map(|p| (p.0 / 60.0, p.1.rss_mib)).collect();
    let by_server = samples
        .iter()
        .filter(|s| s.t_s >= warmup_s - 1e-6 && s.fds_net.is_some())
        .all(|s| s.server_conns.is_some());
    Some(Flatness {
        warmup_s,
        samples: post.len(),
        rss_min_mib: rss_min,
        rss_max_mib: rss_max,
        rss_range_mib: rss_max - rss_min,
        rss_slope_mib_per_min: crate::stats::linear_fit(&pts).map_or(0.0, |f| f.0),
        fds_min: fd_min as u64,
        fds_max: fd_max as u64,
        fds_net_min: net_min as i64,
        fds_net_max: net_max as i64,
        fds_net_range: (net_max - net_min) as i64,
        fds_net_less: if by_server {
            "server connections"
        } else {
            "client connections"
        },
        threads_min: th_min as u64,
        threads_max: th_max as u64,
    })
}

/// The flatness checks against the bounds.
pub fn flatness_checks(f: Option<&Flatness>, rss_bound_mib: f64, fd_bound: usize) -> Vec<Check> {
    let Some(f) = f else {
        let why = "fewer than 3 samples with /proc data after warm-up (lower --warmup or \
                   --sample-every, or give --pid)";
        return vec![Check::fail("rss flat", why), Check::fail("fds flat", why)];
    };
    let rss = format!(
        "RSS {:.1}..{:.1} MiB, range {:.1} MiB (bound {rss_bound_mib}), slope {:+.3} MiB/min over {} samples",
        f.rss_min_mib, f.rss_max_mib, f.rss_range_mib, f.rss_slope_mib_per_min, f.samples
    );
    let fds = format!(
        "fds - {} {}..{}, range {} (bound {fd_bound}); raw fds {}..{}",
        f.fds_net_less, f.fds_net_min, f.fds_net_max, f.fds_net_range, f.fds_min, f.fds_max
    );
    vec![
        if f.rss_range_mib <= rss_bound_mib {
            Check::pass("rss flat", rss)
        } else {
            Check::fail("rss flat", rss)
        },
        if f.fds_net_range <= fd_bound as i64 {
            Check::pass("fds flat", fds)
        } else {
            Check::fail("fds flat", fds)
        },
    ]
}

/// What the load shares between its tasks.
struct Load {
    ep: Endpoint,
    model: String,
    requests: Vec<SampledRequest>,
    timeout: Duration,
    stop: AtomicBool,
    counts: Mutex<Counts>,
    /// The first few failures, for the report.
    errors: Mutex<Vec<String>>,
    count: super::TokenCounter,
    start: Instant,
    hostile: Option<Hostile>,
    /// Honest completed requests' TPOT (seconds), sent in phases without / with hostile
    /// requests.
    tpot: Mutex<[Vec<f64>; 2]>,
}

/// The hostile share's settings.
struct Hostile {
    fraction: f64,
    phase_s: f64,
    /// The server's header timeout is taken to be under this: a slow connection still
    /// open after it counts as held.
    hold_limit: Duration,
}

/// A request's time per output token after the first: the mean gap between content
/// chunks.
fn tpot_of(o: &RequestOutput) -> Option<f64> {
    (!o.itl.is_empty()).then(|| o.itl.iter().sum::<f64>() / o.itl.len() as f64)
}

/// The value below which a share `q` of `v` lies (nearest rank).
fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

/// The honest TPOT p99 with the hostile share against without it.
pub fn hostile_check(off: &mut [f64], on: &mut [f64], bound: f64) -> Check {
    match (quantile(off, 0.99), quantile(on, 0.99)) {
        (Some(a), Some(b)) if a > 0.0 => {
            let r = b / a;
            let detail = format!(
                "honest TPOT p99 {:.1} ms with hostile requests vs {:.1} ms without ({r:.2}x, \
                 bound {bound}x; {} and {} requests)",
                b * 1e3,
                a * 1e3,
                on.len(),
                off.len()
            );
            if r <= bound {
                Check::pass("hostile tpot", detail)
            } else {
                Check::fail("hostile tpot", detail)
            }
        }
        _ => Check::fail(
            "hostile tpot",
            format!(
                "too few honest completions to compare ({} without, {} with hostile requests)",
                off.len(),
                on.len()
            ),
        ),
    }
}

impl Load {
    /// Whether the load is in a phase with hostile requests.
    fn hostile_phase(&self) -> bool {
        self.hostile
            .as_ref()
            .is_some_and(|h| (self.start.elapsed().as_secs_f64() / h.phase_s) as u64 % 2 == 1)
    }

    fn hostile_done(&self, kind: &str, expected: bool, whole_request: bool) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.hostile_sent += 1;
        c.hostile_requests += u64::from(whole_request);
        *c.hostile_by_kind.entry(kind.into()).or_default() += 1;
        if !expected {
            c.hostile_unexpected += 1;
            drop(c);
            let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            if e.len() < 20 {
                e.push(format!(
                    "t={:.1}s hostile {kind}: not the expected answer",
                    self.start.elapsed().as_secs_f64()
                ));
            }
        }
    }

    fn counts(&self) -> Counts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn sent(&self, burst: bool, cancel_planned: bool) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.sent += 1;
        c.burst_sent += u64::from(burst);
        c.cancel_planned += u64::from(cancel_planned);
    }

    fn record(&self, o: &RequestOutput, burst: bool) -> Class {
        let class = classify(o);
        let tokens = match class {
            Class::Completed => super::result::out_tokens(o, &*self.count) as u64,
            _ => 0,
        };
        if let (Class::Failed(k), Some((_, msg))) = (class, &o.error) {
            let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
            if e.len() < 20 {
                e.push(format!(
                    "t={:.1}s {}{}: {msg}",
                    self.start.elapsed().as_secs_f64(),
                    k.name(),
                    if burst { " (burst)" } else { "" }
                ));
            }
        }
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(class, o, burst, tokens);
        class
    }

    fn pick(&self, rng: &mut impl Rng) -> &SampledRequest {
        &self.requests[rng.gen_range(0..self.requests.len())]
    }
}

/// One client: requests back to back until told to stop; a short pause after a 429 (the
/// server's Retry-After is 1 s) or a failure, so a full queue is not hammered.
async fn client_loop(load: Arc<Load>, seed: u64, cancel_fraction: f64, cancel_max: usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut n_hostile = seed;
    while !load.stop.load(Ordering::Acquire) {
        let phase = load.hostile_phase();
        if let Some(h) = load.hostile.as_ref().filter(|_| phase) {
            if rng.gen::<f64>() < h.fraction {
                n_hostile += 1;
                hostile_action(&load, n_hostile % 4, h.hold_limit).await;
                continue;
            }
        }
        let r = load.pick(&mut rng).clone();
        let cancel_after =
            (rng.gen::<f64>() < cancel_fraction).then(|| rng.gen_range(1..=cancel_max.max(1)));
        load.sent(false, cancel_after.is_some());
        let o = client::send_or_cancel(
            &load.ep,
            &load.model,
            &r.prompt,
            r.prompt_len,
            r.expected_output_len,
            load.timeout,
            cancel_after,
        )
        .await;
        let class = load.record(&o, false);
        if class == Class::Completed {
            if let Some(t) = tpot_of(&o) {
                load.tpot.lock().unwrap_or_else(|e| e.into_inner())[usize::from(phase)].push(t);
            }
        }
        match class {
            Class::Rejected => tokio::time::sleep(Duration::from_millis(500)).await,
            Class::Failed(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            _ => {}
        }
    }
}

/// A raw HTTP exchange: sends `head` (and `body`), then reads until the server closes or
/// `limit` passes. The status (None: no status line) and whether the server closed.
async fn raw_exchange(
    ep: &Endpoint,
    head: String,
    body: &[u8],
    limit: Duration,
    hang_up: bool,
) -> (Option<u16>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(Ok(mut s)) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect((ep.host.as_str(), ep.port)),
    )
    .await
    else {
        return (None, false);
    };
    if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body).await.is_err() {
        return (None, true);
    }
    if hang_up {
        return (None, true);
    }
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let closed = tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .is_ok();
    let status = std::str::from_utf8(&buf[..buf.len().min(64)])
        .ok()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok());
    (status, closed)
}

/// One hostile action (`kind` 0..4, see `--hostile-fraction`), counted apart from the
/// honest requests.
async fn hostile_action(load: &Load, kind: u64, hold_limit: Duration) {
    let ep = &load.ep;
    let host = format!("{}:{}", ep.host, ep.port);
    let post = |len: usize| {
        format!(
            "POST {} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\nConnection: close\r\n\r\n",
            ep.path
        )
    };
    match kind {
        0 => {
            // Grammar-refused tokens pushed up: the constraint must hold without costing
            // the others their speed.
            let bias: serde_json::Map<String, Value> =
                (100..400).map(|t| (t.to_string(), json!(100))).collect();
            let mut body = json!({
                "model": load.model,
                "max_tokens": 64,
                "temperature": 1,
                "n": 3,
                "ignore_eos": true,
                "logit_bias": bias,
                "response_format": {"type": "json_schema", "json_schema": {"schema":
                    {"type": "array", "items": {"type": "object", "required": ["a"],
                     "additionalProperties": {"type": "string"}}}}},
            });
            if ep.chat {
                body["messages"] = json!([{"role": "user", "content": "List things."}]);
            } else {
                body["prompt"] = json!("List things.");
            }
            let b = body.to_string();
            let (st, _) = raw_exchange(ep, post(b.len()), b.as_bytes(), load.timeout, false).await;
            load.hostile_done("constrained", matches!(st, Some(200 | 429)), true);
        }
        1 => {
            let head = format!("POST {} HTTP/1.1\r\nHost: {host}\r\nX-Slow: 1\r\n", ep.path);
            let (_, closed) = raw_exchange(ep, head, b"", hold_limit, false).await;
            load.hostile_done("slow headers", closed, false);
        }
        2 => {
            let head = format!(
                "POST {} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
                 Content-Length: 99999999999\r\n\r\n",
                ep.path
            );
            let (st, _) = raw_exchange(ep, head, b"", Duration::from_secs(10), false).await;
            // rserve counts a refused generation request (an outcome `invalid`).
            load.hostile_done("oversize body", st == Some(413), true);
        }
        _ => {
            let body = json!({"model": load.model, "prompt": "Tell a long story.",
                              "max_tokens": 64, "stream": true});
            let b = body.to_string();
            let _ = raw_exchange(ep, post(b.len()), b.as_bytes(), Duration::ZERO, true).await;
            load.hostile_done("dropped", true, true);
        }
    }
}

/// Bursts at `times` (seconds from the start): `size` requests at once on connections of
/// their own, closed when the burst is over.
async fn bursts(load: Arc<Load>, times: Vec<f64>, size: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xb0b5);
    let mut running = Vec::new();
    for at in times {
        let at = load.start + Duration::from_secs_f64(at);
        while Instant::now() < at && !load.stop.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(200).min(at - Instant::now())).await;
        }
        if load.stop.load(Ordering::Acquire) {
            break;
        }
        load.counts.lock().unwrap_or_else(|e| e.into_inner()).bursts += 1;
        let ep = Endpoint {
            pool: load.ep.pool.fresh(),
            ..load.ep.clone()
        };
        let tasks: Vec<_> = (0..size)
            .map(|_| {
                let (load, ep, r) = (load.clone(), ep.clone(), load.pick(&mut rng).clone());
                load.sent(true, false);
                tokio::spawn(async move {
                    let o = client::send(
                        &ep,
                        &load.model,
                        &r.prompt,
                        r.prompt_len,
                        r.expected_output_len,
                        load.timeout,
                    )
                    .await;
                    load.record(&o, true);
                })
            })
            .collect();
        running.push(tokio::spawn(async move {
            for t in tasks {
                let _ = t.await;
            }
            drop(ep);
        }));
    }
    for t in running {
        let _ = t.await;
    }
}

/// How a run ended: what the verdict needs besides the counts and the samples.
#[derive(Debug, Clone, Default)]
pub struct Ending {
    /// When (seconds into the run) and why the server died.
    pub died: Option<(f64, String)>,
    /// Whether every in-flight request ended after the load stopped, and how long that
    /// took.
    pub drained: bool,
    pub drain_s: f64,
    /// The server's metrics before the load and once it went idle (or the idle wait ran
    /// out).
    pub baseline: Option<ServerMetrics>,
    pub idle: Option<ServerMetrics>,
    /// After rbench closed its connections: the server's open connections (None: no
    /// answer) and how long it was given; None when the server does not count them.
    pub hung_up: Option<(Option<f64>, f64)>,
}

/// Every check of a run. A dead server fails `server alive`; the checks that need it to
/// have lived (idle KV, cancels, bursts, flatness) are then skipped, not piled on.
pub fn verdict(
    a: &SoakArgs,
    plan: &Plan,
    counts: &Counts,
    end: &Ending,
    flat: Option<&Flatness>,
    has_pid: bool,
) -> Vec<Check> {
    let mut checks = vec![match &end.died {
        Some((t, why)) => Check::fail("server alive", format!("died at {t:.0}s: {why}")),
        None => Check::pass("server alive", "running throughout"),
    }];
    checks.push(if end.drained {
        Check::pass(
            "drained",
            format!("in-flight requests ended in {:.1}s", end.drain_s),
        )
    } else {
        Check::fail(
            "drained",
            format!(
                "{} requests still in flight after {:.0}s",
                counts.sent - counts.ended(),
                end.drain_s
            ),
        )
    });
    checks.push(counts.check());
    if end.died.is_some() {
        for name in [
            "kv idle",
            "conns closed",
            "cancels",
            "bursts",
            "rss flat",
            "fds flat",
        ] {
            checks.push(Check::skipped(name, "the server died"));
        }
        return checks;
    }
    match (&end.baseline, &end.idle) {
        (Some(b), Some(e)) => {
            checks.push(if e.settled() {
                Check::pass(
                    "kv idle",
                    format!(
                        "rserve_kv_blocks_used 0 at idle ({} cached of {})",
                        e.kv_blocks_cached, e.kv_blocks_total
                    ),
                )
            } else {
                Check::fail(
                    "kv idle",
                    format!(
                        "after {:.0}s idle: kv_blocks_used {}, running {}, waiting {}, queued {}, \
                         outcomes {} of {} received",
                        a.idle_wait,
                        e.kv_blocks_used,
                        e.running,
                        e.waiting,
                        e.queued,
                        e.outcomes.values().sum::<f64>(),
                        e.received
                    ),
                )
            });
            checks.extend(cross_check(b, e, counts));
        }
        _ => checks.push(Check::fail("kv idle", "no rserve metrics from /metrics")),
    }
    checks.push(match end.hung_up {
        None => Check::skipped(
            "conns closed",
            "the server does not count its connections (rserve_http_connections_open)",
        ),
        Some((Some(open), waited)) if open <= 1.0 => Check::pass(
            "conns closed",
            format!(
                "{waited:.1}s after rbench hung up, the server held no connection but the \
                 scrape's own"
            ),
        ),
        Some((open, waited)) => Check::fail(
            "conns closed",
            match open {
                Some(o) => format!(
                    "{waited:.0}s after rbench closed its connections the server still held \
                     {} of them",
                    o - 1.0
                ),
                None => "no /metrics answer after rbench closed its connections".into(),
            },
        ),
    });
    checks.push(if counts.cancelled > 0 || a.cancel_fraction == 0.0 {
        Check::pass(
            "cancels",
            format!(
                "{} requests hung up on ({} picked to; the rest finished or were rejected first)",
                counts.cancelled, counts.cancel_planned
            ),
        )
    } else {
        Check::fail("cancels", "no request was cancelled mid-stream")
    });
    checks.push(if plan.burst_times().is_empty() {
        Check::skipped("bursts", "no burst in the run")
    } else if counts.burst_rejected_429 > 0 {
        Check::pass(
            "bursts",
            format!(
                "{} bursts of {}: {} of their requests rejected",
                counts.bursts, plan.burst_size, counts.burst_rejected_429
            ),
        )
    } else {
        Check::fail(
            "bursts",
            format!(
                "{} bursts of {} and no 429 among them: the queue was never exceeded \
                 (raise --burst-size)",
                counts.bursts, plan.burst_size
            ),
        )
    });
    if has_pid {
        checks.extend(flatness_checks(flat, a.rss_bound_mib, a.fd_bound));
    } else {
        checks.push(Check::skipped("rss flat", "no --pid"));
        checks.push(Check::skipped("fds flat", "no --pid"));
    }
    checks
}

/// The server under test: started by us, or a process id given.
enum Server {
    Spawned(Box<Spawned>),
    Pid(u32),
    Remote,
}

impl Server {
    fn pid(&self) -> Option<u32> {
        match self {
            Server::Spawned(s) => s.pid(),
            Server::Pid(p) => Some(*p),
            Server::Remote => None,
        }
    }

    /// `Some(why)` once the server has exited.
    fn died(&mut self) -> Option<String> {
        match self {
            Server::Spawned(s) => s.exit_status().map(|st| {
                let (log, tail) = s.log_tail(15);
                format!("exited ({st}); the end of {}:\n{tail}", log.display())
            }),
            Server::Pid(p) => (!pid_alive(*p)).then(|| format!("process {p} is gone")),
            Server::Remote => None,
        }
    }
}

/// Entry point for `rbench soak ARGS…` (`args[0]` is the subcommand name). Exit status 3
/// when a check fails, 1 on errors before the run.
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let a: SoakArgs = match crate::parse_args(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(3),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn validate(a: &SoakArgs) -> Result<()> {
    if a.duration <= 0.0 {
        bail!("--duration must be positive");
    }
    if a.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.cancel_fraction) {
        bail!("--cancel-fraction must be within 0..=1");
    }
    if !(0.0..=1.0).contains(&a.hostile_fraction) {
        bail!("--hostile-fraction must be within 0..=1");
    }
    if a.sample_every.is_some_and(|s| s <= 0.0) {
        bail!("--sample-every must be positive");
    }
    Ok(())
}

/// Starts the server (`--spawn`) or takes the one at `--url`: the server, its URL, and
/// what the result file records about it.
fn start_server(a: &SoakArgs, plan: &Plan, out_dir: &Path) -> Result<(Server, String, Value)> {
    let mut server_info = json!({});
    let (server, url) = match &a.spawn {
        Some(s) => {
            let mut spec = spawn::parse_spawn(s, &a.server.defaults())?;
            if !spec.shell && spec.name == "rserve" {
                spec.argv
                    .extend(["--queue-size".into(), plan.queue_size.to_string()]);
            }
            let version = spawn::version_of(&spec);
            let sp = Spawned::start(&spec, out_dir, Duration::from_secs(600))?;
            let url = sp.url();
            server_info = json!({
                "name": spec.name,
                "cmd": sp.command_line,
                "version": version,
                "log": out_dir.join(format!("{}.log", spec.name)),
            });
            (Server::Spawned(Box::new(sp)), url)
        }
        None => {
            let url = a.url.clone().context("--url or --spawn is required")?;
            match a.pid {
                Some(p) if !pid_alive(p) => bail!("--pid {p}: no such live process"),
                Some(p) => (Server::Pid(p), url),
                None => {
                    eprintln!(
                        "rbench soak: no --pid: RSS, fds and threads are not sampled and the \
                         flatness checks are skipped"
                    );
                    (Server::Remote, url)
                }
            }
        }
    };
    server_info["url"] = json!(url);
    server_info["pid"] = json!(server.pid());
    Ok((server, url, server_info))
}

/// Runs the soak; `Ok(false)` when a check failed.
pub fn run(a: &SoakArgs) -> Result<bool> {
    validate(a)?;
    let plan = Plan::of(a);
    let svg_path = a
        .svg
        .clone()
        .unwrap_or_else(|| a.result_file.with_extension("svg"));
    let out_dir = a
        .result_file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    let (mut server, url, server_info) = start_server(a, &plan, &out_dir)?;
    let ep = a.req.endpoint(&url)?;
    let (host, port) = (ep.host.clone(), ep.port);
    let model = match &a.req.model {
        Some(m) => m.clone(),
        None => rt
            .block_on(first_model(&ep, Duration::from_secs(120)))
            .context("GET /v1/models gave no model id (give --model)")?,
    };
    let scrape = || {
        spawn::http_get(&host, port, "/metrics", true)
            .filter(|(st, _)| *st == 200)
            .and_then(|(_, body)| ServerMetrics::parse(&body))
    };

    // The prompts.
    let tok_name = tokenizer_name(
        a.req.tokenizer_model.as_deref(),
        a.spawn.is_some().then_some(a.server.server_model.as_str()),
        &model,
    );
    let count = gguf_counter(&tok_name)?;
    let w = build_workload(
        &a.req.workload(&a.dataset, a.num_prompts, None, 1.0),
        &*count,
    )?;
    if w.requests.is_empty() {
        bail!("the dataset produced no requests");
    }
    let settings = json!({
        "dataset": w.label,
        "prompts": w.requests.len(),
        "model": model,
        "tokenizer": tok_name,
        "endpoint": ep.path,
        "concurrency": a.concurrency,
        "output_len": a.req.output_len,
        "ignore_eos": a.req.ignore_eos,
        "seed": a.req.seed,
        "timeout_s": a.req.timeout,
        "cancel_fraction": a.cancel_fraction,
        "cancel_max_chunks": a.cancel_max_chunks,
        "plan": plan,
        "rss_bound_mib": a.rss_bound_mib,
        "fd_bound": a.fd_bound,
        "idle_wait_s": a.idle_wait,
        "hostile_fraction": a.hostile_fraction,
        "hostile_tpot_bound": a.hostile_tpot_bound,
    });
    eprintln!(
        "rbench soak: {} for {:.0}s at concurrency {}, dataset {} ({} prompts), cancel {:.0}%, \
         bursts of {} every {:.0}s (queue {}), samples every {:.0}s, warm-up {:.0}s",
        url,
        plan.duration_s,
        a.concurrency,
        w.label,
        w.requests.len(),
        a.cancel_fraction * 100.0,
        plan.burst_size,
        plan.burst_every_s,
        plan.queue_size,
        plan.sample_every_s,
        plan.warmup_s
    );

    let baseline = scrape();
    if baseline.is_none() {
        eprintln!(
            "rbench soak: warning: {url}/metrics has no rserve gauges; the KV and counter \
             checks will fail"
        );
    }
    let load = Arc::new(Load {
        ep,
        model,
        requests: w.requests,
        timeout: Duration::from_secs_f64(a.req.timeout),
        stop: AtomicBool::new(false),
        counts: Mutex::new(Counts::default()),
        errors: Mutex::new(Vec::new()),
        count,
        start: Instant::now(),
        hostile: (a.hostile_fraction > 0.0).then(|| Hostile {
            fraction: a.hostile_fraction,
            phase_s: (plan.duration_s / 10.0).max(10.0),
            hold_limit: Duration::from_secs(60),
        }),
        tpot: Mutex::new([Vec::new(), Vec::new()]),
    });
    let sample = |t_s: f64, server: &Server| {
        // Idle connections the server's keep-alive timeout closed are not ours to count
        // (over 30 minutes they made the server look 15 fds short of what we held).
        load.ep.pool.prune_closed();
        let proc = server.pid().and_then(proc_sample);
        let client_conns = load.ep.pool.open() as u64;
        let metrics = scrape();
        let server_conns = metrics
            .as_ref()
            .and_then(|m| m.connections_open)
            .map(|c| c as u64);
        Sample {
            t_s,
            proc,
            client_conns,
            server_conns,
            fds_net: proc.map(|p| p.fds as i64 - server_conns.unwrap_or(client_conns) as i64),
            metrics,
            counts: load.counts(),
        }
    };
    let mut samples = vec![sample(0.0, &server)];
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = (0..a.concurrency)
        .map(|i| {
            rt.spawn(client_loop(
                load.clone(),
                a.req.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
                a.cancel_fraction,
                a.cancel_max_chunks,
            ))
        })
        .collect();
    let burst_times = plan.burst_times();
    tasks.push(rt.spawn(bursts(
        load.clone(),
        burst_times.clone(),
        plan.burst_size,
        a.req.seed,
    )));

    // The load: sample on schedule, watch the server.
    let mut died: Option<(f64, String)> = None;
    let write_partial = |samples: &[Sample]| {
        let v = json!({
            "kind": "rbench soak",
            "verdict": "running",
            "settings": settings,
            "server": server_info,
            "samples": samples,
        });
        let _ = write_json(&a.result_file, &v);
    };
    for &t in &plan.sample_times()[1..] {
        let at = load.start + Duration::from_secs_f64(t);
        while Instant::now() < at {
            if let Some(why) = server.died() {
                died = Some((load.start.elapsed().as_secs_f64(), why));
                break;
            }
            std::thread::sleep(Duration::from_millis(200).min(at - Instant::now()));
        }
        if died.is_some() {
            break;
        }
        let s = sample(t, &server);
        progress(&s);
        samples.push(s);
        write_partial(&samples);
    }
    let load_s = load.start.elapsed().as_secs_f64();
    load.stop.store(true, Ordering::Release);

    // Drain: every in-flight request ends (each has its own timeout).
    eprintln!("rbench soak: load stopped; waiting for in-flight requests");
    let drain_limit = Duration::from_secs_f64(if died.is_some() {
        30.0
    } else {
        a.req.timeout + 30.0
    });
    let drained = rt.block_on(async {
        tokio::time::timeout(drain_limit, async {
            for t in &mut tasks {
                let _ = t.await;
            }
        })
        .await
        .is_ok()
    });
    if !drained {
        for t in &tasks {
            t.abort();
        }
    }
    let drain_s = load.start.elapsed().as_secs_f64() - load_s;
    if died.is_none() {
        if let Some(why) = server.died() {
            died = Some((load.start.elapsed().as_secs_f64(), why));
        }
    }

    // Idle: the server must settle with no KV block in use.
    let mut idle = json!(null);
    let mut last_metrics = None;
    if died.is_none() {
        let t0 = Instant::now();
        loop {
            last_metrics = scrape();
            if last_metrics.as_ref().is_some_and(ServerMetrics::settled)
                || t0.elapsed().as_secs_f64() >= a.idle_wait
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let s = sample(load.start.elapsed().as_secs_f64(), &server);
        idle = json!({
            "waited_s": t0.elapsed().as_secs_f64(),
            "sample": s,
        });
        if let Some(m) = &s.metrics {
            last_metrics = Some(m.clone());
        }
    }
    // Hung up: once rbench closes its kept-alive connections, the server must hold none
    // but the scrape's own (a connection task that never ends would hold its socket).
    let mut hung_up = None;
    if died.is_none()
        && last_metrics
            .as_ref()
            .is_some_and(|m| m.connections_open.is_some())
    {
        load.ep.pool.clear();
        let t0 = Instant::now();
        let mut open = None;
        while t0.elapsed() < Duration::from_secs(10) {
            open = scrape().and_then(|m| m.connections_open);
            if open.is_some_and(|o| o <= 1.0) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        hung_up = Some((open, t0.elapsed().as_secs_f64()));
    }

    // The verdict.
    let ending = Ending {
        died: died.clone(),
        drained,
        drain_s,
        baseline: baseline.clone(),
        idle: last_metrics.clone(),
        hung_up,
    };
    let counts = load.counts();
    let flat = flatness(&samples, plan.warmup_s);
    let mut checks = verdict(
        a,
        &plan,
        &counts,
        &ending,
        flat.as_ref(),
        server.pid().is_some(),
    );
    let [mut tpot_off, mut tpot_on] =
        std::mem::take(&mut *load.tpot.lock().unwrap_or_else(|e| e.into_inner()));
    if load.hostile.is_some() {
        checks.push(hostile_check(
            &mut tpot_off,
            &mut tpot_on,
            a.hostile_tpot_bound,
        ));
        checks.push(
            if counts.hostile_unexpected == 0 && counts.hostile_sent > 0 {
                Check::pass(
                    "hostile handled",
                    format!(
                        "{} hostile actions {:?}, each answered as expected",
                        counts.hostile_sent, counts.hostile_by_kind
                    ),
                )
            } else {
                Check::fail(
                    "hostile handled",
                    format!(
                        "{} of {} hostile actions not answered as expected {:?}",
                        counts.hostile_unexpected, counts.hostile_sent, counts.hostile_by_kind
                    ),
                )
            },
        );
    }
    let passed = !checks.iter().any(Check::failed);
    let throughput = json!({
        "load_s": load_s,
        "completed_per_s": counts.completed as f64 / load_s.max(1e-9),
        "output_tokens_per_s": counts.output_tokens as f64 / load_s.max(1e-9),
        "sent_per_s": counts.sent as f64 / load_s.max(1e-9),
    });
    let errors = load
        .errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let result = json!({
        "kind": "rbench soak",
        "date": super::utc_now(),
        "verdict": if passed { "pass" } else { "fail" },
        "settings": settings,
        "server": server_info,
        "bursts_at_s": burst_times,
        "samples": samples,
        "idle": idle,
        "accounting": counts,
        "server_start": baseline,
        "server_end": last_metrics,
        "throughput": throughput,
        "flatness": flat,
        "checks": checks,
        "error_examples": errors,
        "server_died": died.as_ref().map(|d| json!({"at_s": d.0, "why": d.1})),
    });
    write_json(&a.result_file, &result)?;
    let svg = svg(&samples, plan.warmup_s, &burst_times, flat.as_ref(), passed);
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
    print!("{}", summary(&result, &checks));
    println!(
        "result: {}\nplot:   {}",
        a.result_file.display(),
        svg_path.display()
    );
    if let Server::Spawned(s) = &mut server {
        s.stop();
    }
    Ok(passed)
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(v)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn progress(s: &Sample) {
    let c = &s.counts;
    let mut line = format!("soak {:>7.1} min", s.t_s / 60.0);
    if let Some(p) = s.proc {
        let _ = write!(
            line,
            "  rss {:.1} MiB  fds {} (net {})  threads {}",
            p.rss_mib,
            p.fds,
            s.fds_net.unwrap_or(0),
            p.threads
        );
    }
    if let Some(m) = &s.metrics {
        let _ = write!(
            line,
            "  kv used {} cached {}  queued {} running {}",
            m.kv_blocks_used, m.kv_blocks_cached, m.queued, m.running
        );
    } else {
        line.push_str("  (no /metrics)");
    }
    let _ = write!(
        line,
        "  sent {} ok {} 429 {} cancelled {} failed {}",
        c.sent, c.completed, c.rejected_429, c.cancelled, c.failed
    );
    eprintln!("{line}");
}

/// The human summary.
fn summary(r: &Value, checks: &[Check]) -> String {
    let mut s = String::new();
    let f = |p: &str| r.pointer(p).cloned().unwrap_or(Value::Null);
    let n = |p: &str| f(p).as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(s, "{:=^72}", " rbench soak ");
    let _ = writeln!(
        s,
        "{:<28}{} {}",
        "server:",
        f("/server/url").as_str().unwrap_or("?"),
        f("/server/cmd").as_str().unwrap_or("")
    );
    let _ = writeln!(
        s,
        "{:<28}{:.0} s, concurrency {}, {}",
        "load:",
        n("/throughput/load_s"),
        f("/settings/concurrency"),
        f("/settings/dataset").as_str().unwrap_or("?")
    );
    for (label, key) in [
        ("requests sent:", "sent"),
        ("  completed:", "completed"),
        ("  rejected (429):", "rejected_429"),
        ("  cancelled by us:", "cancelled"),
        ("    (picked to cancel):", "cancel_planned"),
        ("  failed:", "failed"),
        ("bursts:", "bursts"),
        ("  burst requests:", "burst_sent"),
        ("  burst requests 429:", "burst_rejected_429"),
    ] {
        let _ = writeln!(s, "{label:<28}{}", f(&format!("/accounting/{key}")));
    }
    let _ = writeln!(
        s,
        "{:<28}{:.2} req/s completed, {:.1} output tok/s",
        "throughput:",
        n("/throughput/completed_per_s"),
        n("/throughput/output_tokens_per_s")
    );
    if !f("/flatness").is_null() {
        let _ = writeln!(
            s,
            "{:<28}{:.1} .. {:.1} MiB (range {:.1}), slope {:+.3} MiB/min",
            "RSS after warm-up:",
            n("/flatness/rss_min_mib"),
            n("/flatness/rss_max_mib"),
            n("/flatness/rss_range_mib"),
            n("/flatness/rss_slope_mib_per_min")
        );
        let _ = writeln!(
            s,
            "{:<28}{} .. {} (minus {}: {} .. {})",
            "fds after warm-up:",
            f("/flatness/fds_min"),
            f("/flatness/fds_max"),
            f("/flatness/fds_net_less")
                .as_str()
                .unwrap_or("client connections"),
            f("/flatness/fds_net_min"),
            f("/flatness/fds_net_max")
        );
        let _ = writeln!(
            s,
            "{:<28}{} .. {}",
            "threads after warm-up:",
            f("/flatness/threads_min"),
            f("/flatness/threads_max")
        );
    }
    if f("/idle").is_null() {
        let _ = writeln!(s, "{:<28}not measured", "KV blocks used at idle:");
    } else {
        let _ = writeln!(
            s,
            "{:<28}{} (after {:.1} s)",
            "KV blocks used at idle:",
            f("/server_end/kv_blocks_used"),
            n("/idle/waited_s")
        );
    }
    let _ = writeln!(s, "{:-^72}", " checks ");
    for c in checks {
        let _ = writeln!(
            s,
            "{:<8}{:<16}{}",
            c.status.to_uppercase(),
            c.name,
            c.detail
        );
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| c.failed())
        .map(|c| c.name.as_str())
        .collect();
    let _ = writeln!(
        s,
        "{:<28}{}",
        "verdict:",
        if failed.is_empty() {
            "PASS".to_string()
        } else {
            format!("FAIL ({})", failed.join(", "))
        }
    );
    s
}

/// Small multiples of the series over time (minutes): RSS, fds, threads, KV blocks,
/// queue, client counts; warm-up end and bursts marked.
pub fn svg(
    samples: &[Sample],
    warmup_s: f64,
    bursts_s: &[f64],
    flat: Option<&Flatness>,
    passed: bool,
) -> String {
    let min = |s: &Sample| s.t_s / 60.0;
    let series =
        |name: &str, color: usize, dashed: bool, f: &dyn Fn(&Sample) -> Option<f64>| Series {
            name: name.into(),
            points: samples
                .iter()
                .filter_map(|s| Some((min(s), f(s)?)))
                .collect(),
            dashed,
            color,
        };
    let proc = |f: fn(&ProcSample) -> f64| move |s: &Sample| s.proc.as_ref().map(f);
    let met = |f: fn(&ServerMetrics) -> f64| move |s: &Sample| s.metrics.as_ref().map(f);
    let mut marks = vec![Mark {
        x: warmup_s / 60.0,
        label: "warm-up end".into(),
    }];
    marks.extend(bursts_s.iter().map(|&b| Mark {
        x: b / 60.0,
        label: String::new(),
    }));
    let x = XAxis::Linear("minutes (dashed lines: warm-up end, bursts)");
    let chart =
        |title: &str, y: &str, s: Vec<Series>| crate::report::svg_chart(title, x, y, &s, &marks);
    let (rss_title, fd_title) = match flat {
        Some(f) => (
            format!(
                "Server RSS (after warm-up {:.1}..{:.1} MiB, {:+.2} MiB/min)",
                f.rss_min_mib, f.rss_max_mib, f.rss_slope_mib_per_min
            ),
            format!(
                "Open file descriptors (after warm-up, less {}: {}..{})",
                f.fds_net_less, f.fds_net_min, f.fds_net_max
            ),
        ),
        None => ("Server RSS".into(), "Open file descriptors".into()),
    };
    let panels = [
        chart(
            &rss_title,
            "MiB",
            vec![series("VmRSS", 0, false, &proc(|p| p.rss_mib))],
        ),
        chart(
            &fd_title,
            "fds",
            vec![
                series("server fds", 0, false, &proc(|p| p.fds as f64)),
                series("client connections", 1, true, &|s| {
                    Some(s.client_conns as f64)
                }),
                series("server connections", 3, true, &|s| {
                    s.server_conns.map(|c| c as f64)
                }),
                series("fds - connections", 2, false, &|s| {
                    s.fds_net.map(|v| v.max(0) as f64)
                }),
            ],
        ),
        chart(
            "Server threads",
            "threads",
            vec![series("threads", 0, false, &proc(|p| p.threads as f64))],
        ),
        chart(
            "KV cache blocks",
            "blocks",
            vec![
                series("used", 0, false, &met(|m| m.kv_blocks_used)),
                series("cached (free)", 2, false, &met(|m| m.kv_blocks_cached)),
                series("total", 7, true, &met(|m| m.kv_blocks_total)),
            ],
        ),
        chart(
            "Server queue",
            "requests",
            vec![
                series("queued", 0, false, &met(|m| m.queued)),
                series("waiting", 3, true, &met(|m| m.waiting)),
                series("running", 2, false, &met(|m| m.running)),
            ],
        ),
        chart(
            "Client requests (cumulative)",
            "requests",
            vec![
                series("sent", 7, true, &|s| Some(s.counts.sent as f64)),
                series("completed", 2, false, &|s| Some(s.counts.completed as f64)),
                series("rejected 429", 3, false, &|s| {
                    Some(s.counts.rejected_429 as f64)
                }),
                series("cancelled", 4, false, &|s| Some(s.counts.cancelled as f64)),
                series("failed", 1, false, &|s| Some(s.counts.failed as f64)),
            ],
        ),
    ];
    let (pw, ph, top) = (640.0, 360.0, 40.0);
    let (w, h) = (2.0 * pw, top + 3.0 * ph);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif"><rect width="{w}" height="{h}" fill="white"/><text x="{}" y="26" font-size="18" text-anchor="middle">rbench soak: {} samples over {:.1} min, verdict {}</text>"#,
        w / 2.0,
        samples.len(),
        samples.last().map_or(0.0, min),
        if passed { "PASS" } else { "FAIL" }
    );
    for (i, p) in panels.iter().enumerate() {
        let (col, row) = ((i % 2) as f64, (i / 2) as f64);
        let _ = write!(
            s,
            r#"<g transform="translate({} {})">{p}</g>"#,
            col * pw,
            top + row * ph
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m"), Ok(1800.0));
        assert_eq!(parse_duration("120s"), Ok(120.0));
        assert_eq!(parse_duration("90"), Ok(90.0));
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("1.5h"), Ok(5400.0));
        assert_eq!(parse_duration("2m30s"), Ok(150.0));
        assert_eq!(parse_duration("250ms"), Ok(0.25));
        assert_eq!(parse_duration(" 5min "), Ok(300.0));
        for bad in ["", "m", "30x", "-5", "1h-2m", "abc", "3 m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    fn args(extra: &[&str]) -> SoakArgs {
        let mut v = vec!["rbench soak", "--url", "http://127.0.0.1:1"];
        v.extend_from_slice(extra);
        SoakArgs::try_parse_from(v).unwrap()
    }

    #[test]
    fn defaults_scale_with_the_duration() {
        let p = Plan::of(&args(&[]));
        assert_eq!(
            p,
            Plan {
                duration_s: 1800.0,
                warmup_s: 300.0,
                sample_every_s: 60.0,
                burst_every_s: 180.0,
                burst_size: 64 + 128,
                queue_size: 64,
            }
        );
        assert_eq!(p.sample_times().len(), 31);
        let bursts = p.burst_times();
        assert_eq!(bursts.len(), 10, "{bursts:?}");
        assert_eq!((bursts[0], bursts[9]), (150.0, 1770.0));
        let p = Plan::of(&args(&["--duration", "120s", "--concurrency", "8"]));
        assert_eq!(p.warmup_s, 40.0);
        assert_eq!(p.sample_every_s, 6.0);
        assert_eq!(p.burst_every_s, 30.0);
        assert_eq!(p.burst_times(), vec![27.0, 57.0, 87.0, 117.0]);
        assert_eq!(p.burst_size, 8 + 16);
        let p = Plan::of(&args(&[
            "--duration",
            "100",
            "--sample-every",
            "30s",
            "--burst-every",
            "0",
            "--queue-size",
            "4",
        ]));
        assert_eq!(p.sample_times(), vec![0.0, 30.0, 60.0, 90.0, 100.0]);
        assert!(p.burst_times().is_empty());
        assert_eq!(p.burst_size, 4 + 128);
    }

    fn out(error: Option<ErrorKind>, status: Option<u16>, cancelled: bool) -> RequestOutput {
        RequestOutput {
            error: error.map(|k| (k, "x".to_string())),
            status,
            cancelled,
            ..Default::default()
        }
    }

    #[test]
    fn every_request_lands_in_one_class() {
        assert_eq!(classify(&out(None, Some(200), false)), Class::Completed);
        assert_eq!(
            classify(&out(Some(ErrorKind::EmptyOutput), Some(200), false)),
            Class::Completed
        );
        assert_eq!(classify(&out(None, Some(200), true)), Class::Cancelled);
        assert_eq!(
            classify(&out(Some(ErrorKind::HttpStatus), Some(429), false)),
            Class::Rejected
        );
        assert_eq!(
            classify(&out(Some(ErrorKind::HttpStatus), Some(503), false)),
            Class::Failed(ErrorKind::HttpStatus)
        );
        // An error event inside a 200 stream is a failure, not a rejection.
        assert_eq!(
            classify(&out(Some(ErrorKind::HttpStatus), Some(200), false)),
            Class::Failed(ErrorKind::HttpStatus)
        );
        assert_eq!(
            classify(&out(Some(ErrorKind::Connection), None, false)),
            Class::Failed(ErrorKind::Connection)
        );
    }

    #[test]
    fn accounting_catches_mismatches_and_failures() {
        let mut c = Counts::default();
        for (o, burst) in [
            (out(None, Some(200), false), false),
            (out(None, Some(200), true), false),
            (out(Some(ErrorKind::HttpStatus), Some(429), false), true),
            (out(Some(ErrorKind::EmptyOutput), Some(200), false), false),
        ] {
            c.sent += 1;
            c.add(classify(&o), &o, burst, 3);
        }
        assert_eq!(
            (c.completed, c.completed_empty, c.cancelled, c.rejected_429),
            (2, 1, 1, 1)
        );
        assert_eq!(
            (c.burst_ended, c.burst_rejected_429, c.output_tokens),
            (1, 1, 6)
        );
        assert!(!c.check().failed(), "{:?}", c.check());
        // A request that never ended.
        c.sent += 1;
        assert!(c.check().failed());
        assert!(c.check().detail.contains("MISMATCH"));
        // One that failed.
        let o = out(Some(ErrorKind::Timeout), None, false);
        c.add(classify(&o), &o, false, 0);
        let k = c.check();
        assert!(k.failed() && k.detail.contains("timeout"), "{k:?}");
    }

    fn metrics(received: f64, outcomes: &[(&str, f64)], kv_used: f64) -> ServerMetrics {
        let mut m = ServerMetrics {
            received,
            kv_blocks_used: kv_used,
            outcomes: OUTCOMES.iter().map(|o| (o.to_string(), 0.0)).collect(),
            ..Default::default()
        };
        for &(o, v) in outcomes {
            m.outcomes.insert(o.into(), v);
        }
        m
    }

    #[test]
    fn server_counters_are_checked_against_ours() {
        let c = Counts {
            sent: 10,
            completed: 6,
            rejected_429: 2,
            cancelled: 2,
            ..Default::default()
        };
        let start = metrics(5.0, &[("stop", 5.0)], 0.0);
        // One cancel the server finished first (stop instead of cancelled).
        let end = metrics(
            15.0,
            &[
                ("stop", 10.0),
                ("length", 2.0),
                ("cancelled", 1.0),
                ("rejected_queue_full", 2.0),
            ],
            0.0,
        );
        assert!(end.settled());
        let v = cross_check(&start, &end, &c);
        assert!(v.iter().all(|k| !k.failed()), "{v:#?}");
        // A 429 the server counted that we never saw, and a request with no outcome.
        let mut bad = end.clone();
        bad.outcomes.insert("rejected_queue_full".into(), 3.0);
        bad.received = 16.0;
        let v = cross_check(&start, &bad, &c);
        let failed: Vec<&str> = v
            .iter()
            .filter(|k| k.failed())
            .map(|k| k.name.as_str())
            .collect();
        assert_eq!(failed, ["server received", "server 429s"]);
        // More server-side cancels than we made.
        let mut bad = end.clone();
        bad.outcomes.insert("stop".into(), 8.0);
        bad.outcomes.insert("cancelled".into(), 3.0);
        assert_eq!(bad.outcomes.values().sum::<f64>(), bad.received);
        assert!(cross_check(&start, &bad, &c)[2].failed());
        assert!(!metrics(1.0, &[("stop", 1.0)], 2.0).settled());
        assert!(!metrics(2.0, &[("stop", 1.0)], 0.0).settled());
    }

    #[test]
    fn hostile_tpot_check() {
        let off: Vec<f64> = (1..=100).map(|i| f64::from(i) * 1e-3).collect();
        let mut on: Vec<f64> = off.iter().map(|x| x * 1.4).collect();
        assert_eq!(hostile_check(&mut off.clone(), &mut on, 1.5).status, "pass");
        let mut slow: Vec<f64> = off.iter().map(|x| x * 2.0).collect();
        assert_eq!(
            hostile_check(&mut off.clone(), &mut slow, 1.5).status,
            "fail"
        );
        assert_eq!(hostile_check(&mut [], &mut [1.0], 1.5).status, "fail");
        // Hostile generation requests may add to the server's counts, up to their number.
        let c = Counts {
            sent: 4,
            completed: 4,
            hostile_requests: 2,
            ..Default::default()
        };
        let start = metrics(0.0, &[], 0.0);
        let end = metrics(6.0, &[("stop", 6.0)], 0.0);
        assert!(cross_check(&start, &end, &c).iter().all(|k| !k.failed()));
        let over = metrics(7.0, &[("stop", 7.0)], 0.0);
        assert!(cross_check(&start, &over, &c).iter().any(Check::failed));
    }

    #[test]
    fn verdict_of_a_run() {
        let a = args(&["--duration", "120s"]);
        let plan = Plan::of(&a);
        let counts = Counts {
            sent: 10,
            completed: 6,
            rejected_429: 2,
            burst_rejected_429: 2,
            bursts: 3,
            cancelled: 2,
            ..Default::default()
        };
        let start = metrics(0.0, &[], 0.0);
        let idle = metrics(
            10.0,
            &[
                ("length", 6.0),
                ("cancelled", 2.0),
                ("rejected_queue_full", 2.0),
            ],
            0.0,
        );
        let flat: Vec<Sample> = (0..8)
            .map(|i| sample(i as f64 * 15.0, 300.0, 76, 64))
            .collect();
        let flat = flatness(&flat, plan.warmup_s);
        let good = Ending {
            died: None,
            drained: true,
            drain_s: 3.0,
            baseline: Some(start.clone()),
            idle: Some(idle.clone()),
            hung_up: Some((Some(1.0), 0.2)),
        };
        let status = |v: &[Check]| -> Vec<(String, &'static str)> {
            v.iter().map(|c| (c.name.clone(), c.status)).collect()
        };
        let v = verdict(&a, &plan, &counts, &good, flat.as_ref(), true);
        assert!(v.iter().all(|c| c.status == "pass"), "{v:#?}");
        assert_eq!(v.len(), 13);
        // A connection the server never let go of; a server that does not count them.
        let mut stuck_conn = good.clone();
        stuck_conn.hung_up = Some((Some(3.0), 10.0));
        let v = verdict(&a, &plan, &counts, &stuck_conn, flat.as_ref(), true);
        let k = v.iter().find(|c| c.name == "conns closed").unwrap();
        assert!(k.failed() && k.detail.contains("still held 2"), "{k:?}");
        stuck_conn.hung_up = None;
        let v = verdict(&a, &plan, &counts, &stuck_conn, flat.as_ref(), true);
        let k = v.iter().find(|c| c.name == "conns closed").unwrap();
        assert_eq!(k.status, "skipped");
        // KV still held at idle.
        let mut held = good.clone();
        held.idle.as_mut().unwrap().kv_blocks_used = 3.0;
        let v = verdict(&a, &plan, &counts, &held, flat.as_ref(), true);
        assert_eq!(
            v.iter()
                .filter(|c| c.failed())
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["kv idle"]
        );
        // No 429 from the bursts, no cancel, no /proc.
        let quiet = Counts {
            burst_rejected_429: 0,
            cancelled: 0,
            completed: 8,
            ..counts.clone()
        };
        let mut quiet_end = good.clone();
        quiet_end
            .idle
            .as_mut()
            .unwrap()
            .outcomes
            .insert("cancelled".into(), 0.0);
        quiet_end
            .idle
            .as_mut()
            .unwrap()
            .outcomes
            .insert("length".into(), 8.0);
        let v = verdict(&a, &plan, &quiet, &quiet_end, None, false);
        let s = status(&v);
        assert!(s.contains(&("bursts".into(), "fail")), "{s:?}");
        assert!(s.contains(&("cancels".into(), "fail")), "{s:?}");
        assert!(s.contains(&("rss flat".into(), "skipped")), "{s:?}");
        // A dead server fails the run; what needs it alive is skipped.
        let dead = Ending {
            died: Some((42.0, "exited (signal 9)".into())),
            drained: true,
            drain_s: 0.1,
            baseline: Some(start),
            idle: None,
            hung_up: None,
        };
        let v = verdict(&a, &plan, &counts, &dead, None, true);
        let s = status(&v);
        assert_eq!(s[0], ("server alive".into(), "fail"));
        assert!(v[0].detail.contains("died at 42s"));
        for name in [
            "kv idle",
            "conns closed",
            "cancels",
            "bursts",
            "rss flat",
            "fds flat",
        ] {
            assert!(s.contains(&(name.into(), "skipped")), "{name}: {s:?}");
        }
        // Requests left in flight.
        let stuck = Ending {
            drained: false,
            drain_s: 630.0,
            ..good
        };
        let v = verdict(
            &a,
            &plan,
            &Counts { sent: 11, ..counts },
            &stuck,
            flat.as_ref(),
            true,
        );
        let failed: Vec<&str> = v
            .iter()
            .filter(|c| c.failed())
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(failed, ["drained", "accounting", "server received"]);
    }

    fn sample(t_s: f64, rss_mib: f64, fds: u64, conns: u64) -> Sample {
        Sample {
            t_s,
            proc: Some(ProcSample {
                rss_mib,
                threads: 9,
                fds,
            }),
            client_conns: conns,
            fds_net: Some(fds as i64 - conns as i64),
            ..Default::default()
        }
    }

    #[test]
    fn flatness_after_warmup() {
        // Growth during warm-up is ignored; after it RSS wobbles by 3 MiB and the fds
        // follow the client's connections.
        let s = vec![
            sample(0.0, 100.0, 12, 0),
            sample(60.0, 300.0, 76, 64),
            sample(120.0, 400.0, 70, 58),
            sample(180.0, 403.0, 140, 128),
            sample(240.0, 401.0, 77, 64),
            sample(300.0, 400.0, 76, 64),
        ];
        let f = flatness(&s, 120.0).unwrap();
        assert_eq!(f.samples, 4);
        assert_eq!(
            (f.rss_min_mib, f.rss_max_mib, f.rss_range_mib),
            (400.0, 403.0, 3.0)
        );
        assert_eq!((f.fds_min, f.fds_max), (70, 140));
        assert_eq!((f.fds_net_min, f.fds_net_max, f.fds_net_range), (12, 13, 1));
        // Least squares over (2, 400) (3, 403) (4, 401) (5, 400) minutes: Sxy / Sxx =
        // -1 / 5 MiB/min.
        assert!((f.rss_slope_mib_per_min + 0.2).abs() < 1e-9, "{f:?}");
        assert!(flatness_checks(Some(&f), 64.0, 16)
            .iter()
            .all(|c| !c.failed()));
        let c = flatness_checks(Some(&f), 2.0, 0);
        assert!(c[0].failed() && c[1].failed(), "{c:?}");

        // A leak: 1 MiB and 2 fds per minute.
        let leak: Vec<Sample> = (0..30)
            .map(|m| sample(m as f64 * 60.0, 500.0 + m as f64, 20 + 2 * m, 0))
            .collect();
        let f = flatness(&leak, 300.0).unwrap();
        assert!((f.rss_slope_mib_per_min - 1.0).abs() < 1e-9);
        assert_eq!(f.fds_net_range, 48);
        let c = flatness_checks(Some(&f), 16.0, 16);
        assert!(c.iter().all(Check::failed), "{c:?}");

        // Too few samples after warm-up is a failure, not a pass.
        assert!(flatness(&s, 250.0).is_none());
        assert!(flatness_checks(None, 64.0, 16).iter().all(Check::failed));
    }

    #[test]
    fn proc_status_and_metrics_text() {
        let status = "Name:\trserve\nState:\tS (sleeping)\nVmPeak:\t  999 kB\nVmRSS:\t  204800 kB\nThreads:\t7\n";
        assert_eq!(parse_status(status), Some((200.0, 7)));
        assert_eq!(parse_status("Name: x\n"), None);
        let text = "# HELP rserve_requests_queued x\nrserve_requests_queued 3\nrserve_requests_waiting 4\n\
                    rserve_requests_running 2\nrserve_kv_blocks_used 17\nrserve_kv_blocks_cached 5\n\
                    rserve_kv_blocks_total 100\nrserve_requests_received_total 9\n\
                    rserve_requests_total{outcome=\"stop\"} 6\nrserve_requests_total{outcome=\"rejected_queue_full\"} 1\n";
        let m = ServerMetrics::parse(text).unwrap();
        assert_eq!((m.queued, m.waiting, m.running), (3.0, 4.0, 2.0));
        assert_eq!(
            (m.kv_blocks_used, m.kv_blocks_cached, m.kv_blocks_total),
            (17.0, 5.0, 100.0)
        );
        assert_eq!(m.outcome("stop"), 6.0);
        assert_eq!(m.outcome("rejected_queue_full"), 1.0);
        assert_eq!(m.outcome("error"), 0.0);
        assert!(!m.settled());
        // `rserve_requests_queued` must not match `rserve_requests_queued_x`.
        assert_eq!(metric("a_b 1\na 2\n", "a"), Some(2.0));
        assert!(ServerMetrics::parse("llamacpp:requests_processing 1\n").is_none());
    }

    #[test]
    fn svg_has_every_panel() {
        let s: Vec<Sample> = (0..5)
            .map(|i| sample(i as f64 * 60.0, 300.0, 70, 64))
            .collect();
        let f = flatness(&s, 60.0);
        let svg = svg(&s, 60.0, &[120.0], f.as_ref(), true);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for t in [
            "Server RSS (after warm-up 300.0..300.0 MiB, +0.00 MiB/min)",
            "less client connections: 6..6",
            "Open file descriptors",
            "Server threads",
            "KV cache blocks",
            "Server queue",
            "Client requests (cumulative)",
            "warm-up end",
            "verdict PASS",
        ] {
            assert!(svg.contains(t), "no {t:?}");
        }
        assert_eq!(svg.matches("<svg").count(), 7);
    }
}
