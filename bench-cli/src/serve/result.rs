//! Per-sweep-point metrics with vLLM's definitions and result keys, the printed summary
//! block, and the append-only result file with resume.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::client::{ErrorKind, RequestOutput};
use crate::stats::{mean, percentile};

/// Settings that identify a sweep point (used for resume matching).
#[derive(Debug, Clone, PartialEq)]
pub struct PointSettings {
    pub backend: String,
    pub base_url: String,
    pub model_id: String,
    pub endpoint: String,
    pub dataset: String,
    pub num_prompts: usize,
    pub seed: u64,
    /// `None` = all at once (`inf`).
    pub request_rate: Option<f64>,
    /// Gamma shape; infinite for uniform (fixed-gap) arrivals, written as "inf".
    pub burstiness: f64,
    /// `None` = unlimited.
    pub max_concurrency: Option<usize>,
    pub output_len: Option<usize>,
    /// Requests asked the server to ignore end-of-generation (fixed output lengths).
    pub ignore_eos: bool,
}

impl PointSettings {
    fn fields(&self) -> Vec<(&'static str, Value)> {
        vec![
            ("backend", json!(self.backend)),
            ("base_url", json!(self.base_url)),
            ("model_id", json!(self.model_id)),
            ("endpoint", json!(self.endpoint)),
            ("dataset", json!(self.dataset)),
            ("num_prompts", json!(self.num_prompts)),
            ("seed", json!(self.seed)),
            (
                "request_rate",
                self.request_rate.map_or(json!("inf"), |r| json!(r)),
            ),
            (
                "burstiness",
                if self.burstiness.is_finite() {
                    json!(self.burstiness)
                } else {
                    json!("inf")
                },
            ),
            ("max_concurrency", json!(self.max_concurrency)),
            ("concurrency", json!(self.max_concurrency)),
            ("output_len", json!(self.output_len)),
            ("ignore_eos", json!(self.ignore_eos)),
        ]
    }

    /// Whether a result line was produced with these settings.
    pub fn matches(&self, line: &Value) -> bool {
        self.fields().iter().all(|(k, v)| {
            // Lines from before a field existed carry its default.
            let got = match line.get(*k) {
                None if *k == "ignore_eos" => &Value::Bool(false),
                g => g.unwrap_or(&Value::Null),
            };
            match (got.as_f64(), v.as_f64()) {
                (Some(a), Some(b)) => (a - b).abs() < 1e-9,
                _ => got == v,
            }
        })
    }
}

/// SLOs for goodput (`--goodput ttft:MS tpot:MS e2el:MS`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Goodput {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Goodput {
    pub fn parse(items: &[String]) -> anyhow::Result<Goodput> {
        let mut g = Goodput::default();
        for it in items {
            let (k, v) = it
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--goodput wants KEY:MS, got {it:?}"))?;
            let v: f64 = v.parse()?;
            match k {
                "ttft" => g.ttft_ms = Some(v),
                "tpot" => g.tpot_ms = Some(v),
                "e2el" => g.e2el_ms = Some(v),
                _ => anyhow::bail!("--goodput key must be ttft, tpot or e2el, got {k:?}"),
            }
        }
        Ok(g)
    }

    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }
}

/// Population standard deviation (numpy's `np.std`, ddof = 0), as vLLM reports `std_*_ms`.
pub fn pstd(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt()
}

/// Output tokens of one request: the server's `usage`, else the fallback count (vLLM
/// re-tokenizes the text when usage is missing; we count that in `usage_missing`).
pub(crate) fn out_tokens(r: &RequestOutput, fallback: &dyn Fn(&str) -> usize) -> usize {
    r.usage_output_tokens
        .unwrap_or_else(|| fallback(&r.generated_text))
}

/// Metrics of one sweep point as a JSON object with vLLM's keys plus ours.
pub fn summarize(
    s: &PointSettings,
    outputs: &[RequestOutput],
    duration: f64,
    percentiles: &[f64],
    goodput: &Goodput,
    date: &str,
    count: &dyn Fn(&str) -> usize,
) -> Map<String, Value> {
    let ok: Vec<&RequestOutput> = outputs.iter().filter(|r| r.success()).collect();
    let completed = ok.len();
    let failed = outputs.len() - completed;
    let total_input: usize = ok.iter().map(|r| r.prompt_len).sum();
    let outs: Vec<usize> = ok.iter().map(|r| out_tokens(r, count)).collect();
    let total_output: usize = outs.iter().sum();
    let ttfts: Vec<f64> = ok.iter().map(|r| r.ttft).collect();
    let e2els: Vec<f64> = ok.iter().map(|r| r.latency).collect();
    let itls: Vec<f64> = ok.iter().flat_map(|r| r.itl.iter().copied()).collect();
    let mut tpots = Vec::new();
    let mut good = 0usize;
    for (r, &n) in ok.iter().zip(&outs) {
        let tpot = if n > 1 {
            (r.latency - r.ttft) / (n - 1) as f64
        } else {
            0.0
        };
        if n > 1 {
            tpots.push(tpot);
        }
        let within = |v: f64, slo: Option<f64>| match slo {
            Some(ms) => v * 1000.0 <= ms,
            None => true,
        };
        if within(r.ttft, goodput.ttft_ms)
            && within(tpot, goodput.tpot_ms)
            && within(r.latency, goodput.e2el_ms)
        {
            good += 1;
        }
    }
    let ttft_from_start: Vec<f64> = ok.iter().map(|r| r.send_offset + r.ttft).collect();
    let queue: Vec<f64> = outputs.iter().map(|r| r.queue_time).collect();
    let dur = duration.max(1e-9);

    let mut m = Map::new();
    m.insert("date".into(), json!(date));
    for (k, v) in s.fields() {
        m.insert(k.into(), v);
    }
    m.insert("duration".into(), json!(duration));
    m.insert("completed".into(), json!(completed));
    m.insert("failed".into(), json!(failed));
    m.insert(
        "success_rate".into(),
        json!(if outputs.is_empty() {
            0.0
        } else {
            completed as f64 / outputs.len() as f64
        }),
    );
    m.insert("total_input_tokens".into(), json!(total_input));
    m.insert("total_output_tokens".into(), json!(total_output));
    m.insert("request_throughput".into(), json!(completed as f64 / dur));
    m.insert(
        "request_goodput".into(),
        if goodput.is_empty() {
            Value::Null
        } else {
            json!(good as f64 / dur)
        },
    );
    m.insert("output_throughput".into(), json!(total_output as f64 / dur));
    m.insert(
        "total_token_throughput".into(),
        json!((total_input + total_output) as f64 / dur),
    );
    for (name, xs) in [
        ("ttft", &ttfts),
        ("tpot", &tpots),
        ("itl", &itls),
        ("e2el", &e2els),
        ("ttft_from_start", &ttft_from_start),
    ] {
        let ms: Vec<f64> = xs.iter().map(|x| x * 1000.0).collect();
        m.insert(format!("mean_{name}_ms"), json!(mean(&ms)));
        m.insert(format!("median_{name}_ms"), json!(percentile(&ms, 50.0)));
        m.insert(format!("std_{name}_ms"), json!(pstd(&ms)));
        for &p in percentiles {
            m.insert(
                format!("p{}_{name}_ms", fmt_p(p)),
                json!(percentile(&ms, p)),
            );
        }
    }
    let qms: Vec<f64> = queue.iter().map(|x| x * 1000.0).collect();
    m.insert("mean_queue_ms".into(), json!(mean(&qms)));
    m.insert("p99_queue_ms".into(), json!(percentile(&qms, 99.0)));
    let mut counts = BTreeMap::new();
    for k in ErrorKind::ALL {
        counts.insert(k.name().to_string(), 0usize);
    }
    for r in outputs {
        if let Some((k, _)) = &r.error {
            *counts.get_mut(k.name()).unwrap() += 1;
        }
    }
    m.insert("error_counts".into(), json!(counts));
    let examples: Vec<String> = outputs
        .iter()
        .filter_map(|r| {
            r.error
                .as_ref()
                .map(|(k, msg)| format!("{}: {msg}", k.name()))
        })
        .take(10)
        .collect();
    m.insert("error_examples".into(), json!(examples));
    m.insert(
        "usage_missing".into(),
        json!(ok
            .iter()
            .filter(|r| r.usage_output_tokens.is_none())
            .count()),
    );
    let early_eos = ok
        .iter()
        .zip(&outs)
        .filter(|(r, _)| r.finish_reason.as_deref() == Some("stop"))
        .count();
    m.insert("finished_stop".into(), json!(early_eos));
    m
}

/// Per-request arrays for `--save-detailed` (vLLM's names where it has them).
pub fn detailed(outputs: &[RequestOutput], count: &dyn Fn(&str) -> usize) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert(
        "input_lens".into(),
        json!(outputs.iter().map(|r| r.prompt_len).collect::<Vec<_>>()),
    );
    m.insert(
        "output_lens".into(),
        json!(outputs
            .iter()
            .map(|r| if r.success() { out_tokens(r, count) } else { 0 })
            .collect::<Vec<_>>()),
    );
    m.insert(
        "ttfts".into(),
        json!(outputs.iter().map(|r| r.ttft).collect::<Vec<_>>()),
    );
    m.insert(
        "itls".into(),
        json!(outputs.iter().map(|r| r.itl.clone()).collect::<Vec<_>>()),
    );
    m.insert(
        "latencies".into(),
        json!(outputs.iter().map(|r| r.latency).collect::<Vec<_>>()),
    );
    m.insert(
        "send_offsets".into(),
        json!(outputs.iter().map(|r| r.send_offset).collect::<Vec<_>>()),
    );
    m.insert(
        "queue_times".into(),
        json!(outputs.iter().map(|r| r.queue_time).collect::<Vec<_>>()),
    );
    m.insert(
        "finish_reasons".into(),
        json!(outputs
            .iter()
            .map(|r| r.finish_reason.clone())
            .collect::<Vec<_>>()),
    );
    m.insert(
        "generated_texts".into(),
        json!(outputs
            .iter()
            .map(|r| r.generated_text.clone())
            .collect::<Vec<_>>()),
    );
    m.insert(
        "errors".into(),
        json!(outputs
            .iter()
            .map(|r| r
                .error
                .as_ref()
                .map_or(String::new(), |(k, e)| format!("{}: {e}", k.name())))
            .collect::<Vec<_>>()),
    );
    m
}

fn fmt_p(p: f64) -> String {
    if p.fract() == 0.0 {
        format!("{}", p as i64)
    } else {
        format!("{p}")
    }
}

/// vLLM-style summary block.
pub fn summary_text(m: &Map<String, Value>, percentiles: &[f64], staggered: bool) -> String {
    let f = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<40}{v:<10}\n"));
    s.push_str(&format!("{:=^50}\n", " Serving Benchmark Result "));
    line(
        &mut s,
        "Dataset:",
        m["dataset"].as_str().unwrap_or("").to_string(),
    );
    line(
        &mut s,
        "Max concurrency:",
        m["max_concurrency"]
            .as_u64()
            .map_or("unlimited".into(), |c| c.to_string()),
    );
    line(
        &mut s,
        "Request rate (req/s):",
        m["request_rate"].to_string().trim_matches('"').to_string(),
    );
    line(
        &mut s,
        "Successful requests:",
        format!("{}", m["completed"]),
    );
    line(&mut s, "Failed requests:", format!("{}", m["failed"]));
    line(
        &mut s,
        "Success rate (%):",
        format!("{:.2}", 100.0 * f("success_rate")),
    );
    if let Some(Value::Object(c)) = m.get("error_counts") {
        for (k, v) in c {
            if v.as_u64().unwrap_or(0) > 0 {
                line(&mut s, &format!("  failed ({k}):"), v.to_string());
            }
        }
    }
    line(
        &mut s,
        "Benchmark duration (s):",
        format!("{:.2}", f("duration")),
    );
    line(
        &mut s,
        "Total input tokens:",
        format!("{}", m["total_input_tokens"]),
    );
    line(
        &mut s,
        "Total generated tokens:",
        format!("{}", m["total_output_tokens"]),
    );
    line(
        &mut s,
        "Request throughput (req/s):",
        format!("{:.2}", f("request_throughput")),
    );
    if !m["request_goodput"].is_null() {
        line(
            &mut s,
            "Request goodput (req/s):",
            format!("{:.2}", f("request_goodput")),
        );
    }
    line(
        &mut s,
        "Output token throughput (tok/s):",
        format!("{:.2}", f("output_throughput")),
    );
    line(
        &mut s,
        "Total Token throughput (tok/s):",
        format!("{:.2}", f("total_token_throughput")),
    );
    line(
        &mut s,
        "Mean client queueing time (ms):",
        format!("{:.2}", f("mean_queue_ms")),
    );
    line(
        &mut s,
        "Finished by EOS/stop:",
        format!("{}", m["finished_stop"]),
    );
    let mut metrics = vec![
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    ];
    if staggered {
        metrics.insert(
            1,
            (
                "ttft_from_start",
                "TTFT from experiment start",
                "TTFT@start",
            ),
        );
    }
    for (k, title, short) in metrics {
        s.push_str(&format!("{:-^50}\n", format!(" {title} ")));
        line(
            &mut s,
            &format!("Mean {short} (ms):"),
            format!("{:.2}", f(&format!("mean_{k}_ms"))),
        );
        line(
            &mut s,
            &format!("Median {short} (ms):"),
            format!("{:.2}", f(&format!("median_{k}_ms"))),
        );
        for &p in percentiles {
            line(
                &mut s,
                &format!("P{} {short} (ms):", fmt_p(p)),
                format!("{:.2}", f(&format!("p{}_{k}_ms", fmt_p(p)))),
            );
        }
    }
    s.push_str(&"=".repeat(50));
    s.push('\n');
    s
}

/// Result lines already in `path` (unparseable lines are skipped with a warning).
pub fn read_lines(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!(
                    "warning: {}: skipping unreadable result line: {e}",
                    path.display()
                );
                None
            }
        })
        .collect()
}

/// Whether a finished line with these settings is among `done` (for `--resume`).
pub fn already_done(done: &[Value], s: &PointSettings) -> bool {
    done.iter().any(|l| s.matches(l))
}

/// Append one JSON line and flush, so an interrupted sweep keeps its finished points.
pub fn append_line(path: &Path, m: &Map<String, Value>) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{}", Value::Object(m.clone()))?;
    f.sync_data()
}
