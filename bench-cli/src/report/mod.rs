//! `rbench report FILE… [--html OUT | --md]`: comparison tables and hand-rendered SVG plots
//! (one self-contained HTML page, no JS, no external assets) from `rbench serve` result
//! files (JSON lines; a file holding one JSON object, like vLLM's, also works) or from
//! `rbench sched` result files ([`sched`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde_json::Value;

pub mod sched;

#[derive(Parser, Debug)]
#[command(
    name = "rbench report",
    about = "Tables and SVG plots from rbench serve or rbench sched result files"
)]
pub struct ReportArgs {
    /// Result files (JSON lines).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write a self-contained HTML page here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Print markdown tables (the default when --html is not given).
    #[arg(long)]
    pub md: bool,
}

/// One sweep point of one file.
#[derive(Debug, Clone)]
pub struct Row {
    pub file: String,
    pub v: Value,
}

impl Row {
    fn f(&self, k: &str) -> f64 {
        self.v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
    }
    /// Max concurrency; unlimited = num_prompts.
    pub fn concurrency(&self) -> f64 {
        self.v
            .get("max_concurrency")
            .and_then(Value::as_f64)
            .or_else(|| self.v.get("num_prompts").and_then(Value::as_f64))
            .unwrap_or(f64::NAN)
    }
    fn conc_label(&self) -> String {
        match self.v.get("max_concurrency").and_then(Value::as_u64) {
            Some(c) => c.to_string(),
            None => "inf".into(),
        }
    }
    fn success_rate(&self) -> f64 {
        let sr = self.f("success_rate");
        if sr.is_nan() {
            let (c, n) = (self.f("completed"), self.f("failed"));
            c / (c + n)
        } else {
            sr
        }
    }
    /// The spawned server's name (`rbench serve --spawn`), if any.
    fn server(&self) -> Option<&str> {
        self.v.get("server_cmd")?;
        self.v.get("backend").and_then(Value::as_str)
    }

    fn series(&self) -> String {
        let ds = self.v.get("dataset").and_then(Value::as_str).unwrap_or("");
        let who = self.server().unwrap_or(&self.file);
        if ds.is_empty() {
            who.to_string()
        } else {
            format!("{who} [{ds}]")
        }
    }
}

/// Read result rows from files.
pub fn load(files: &[PathBuf]) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let vals: Vec<Value> = match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(a)) => a,
            Ok(v @ Value::Object(_)) => vec![v],
            _ => text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    serde_json::from_str(l)
                        .with_context(|| format!("{}: bad JSON line", f.display()))
                })
                .collect::<Result<_>>()?,
        };
        rows.extend(vals.into_iter().map(|v| Row {
            file: name.clone(),
            v,
        }));
    }
    rows.sort_by(|a, b| {
        a.file
            .cmp(&b.file)
            .then(a.concurrency().total_cmp(&b.concurrency()))
    });
    Ok(rows)
}

const COLS: [&str; 14] = [
    "file",
    "dataset",
    "concurrency",
    "rate",
    "ok/total",
    "success %",
    "req/s",
    "out tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "E2E p50 / p99 ms",
    "spec draft / accept",
];

fn cells(r: &Row) -> Vec<String> {
    let completed = r.f("completed");
    let failed = r.f("failed");
    vec![
        r.server()
            .map_or_else(|| r.file.clone(), |n| format!("{} · {n}", r.file)),
        r.v.get("dataset")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        r.conc_label(),
        match r.v.get("request_rate") {
            Some(Value::Number(n)) => format!("{n}/s"),
            _ => "inf".into(),
        },
        format!("{}/{}", completed, completed + failed),
        format!("{:.1}", 100.0 * r.success_rate()),
        format!("{:.2}", r.f("request_throughput")),
        format!("{:.1}", r.f("output_throughput")),
        format!("{:.1}", r.f("median_ttft_ms")),
        format!("{:.1}", r.f("p99_ttft_ms")),
        format!("{:.1}", r.f("median_itl_ms")),
        format!("{:.1}", r.f("p99_itl_ms")),
        format!("{:.0} / {:.0}", r.f("median_e2el_ms"), r.f("p99_e2el_ms")),
        // Speculative decoding, where the server counted drafts: mean draft length and
        // the share of draft tokens accepted.
        match r.v.get("spec_mean_draft_len").and_then(Value::as_f64) {
            Some(len) => format!("{len:.1} / {:.0}%", 100.0 * r.f("spec_acceptance_rate")),
            None => "-".into(),
        },
    ]
}

/// Per concurrency point, the spawned servers side by side: each server's runs pooled
/// (requests summed, rates and latencies the median over its runs), then the ratios of
/// every other server to the first.
pub struct Sided {
    /// Servers in first-seen order, with version and command line.
    pub servers: Vec<(String, String, String)>,
    /// (dataset, concurrency label, concurrency) then per server: Option<aggregate>.
    pub points: Vec<(String, String, f64, Vec<Option<Agg>>)>,
}

#[derive(Debug, Clone, Copy)]
pub struct Agg {
    pub runs: usize,
    pub completed: f64,
    pub total: f64,
    pub out_tps: f64,
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    pub tpot_p50: f64,
    pub tpot_p99: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The side-by-side view, when the rows come from `--spawn` runs of two or more servers.
pub fn side_by_side(rows: &[Row]) -> Option<Sided> {
    let spawned: Vec<&Row> = rows.iter().filter(|r| r.server().is_some()).collect();
    let mut servers: Vec<(String, String, String)> = Vec::new();
    for r in &spawned {
        let n = r.server().unwrap_or("").to_string();
        if !servers.iter().any(|s| s.0 == n) {
            let get = |k: &str| r.v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            servers.push((n, get("server_version"), get("server_cmd")));
        }
    }
    if servers.len() < 2 {
        return None;
    }
    let mut keys: Vec<(String, String, f64)> = Vec::new();
    for r in &spawned {
        let ds =
            r.v.get("dataset")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
        let k = (ds, r.conc_label(), r.concurrency());
        if !keys.iter().any(|x| x.0 == k.0 && x.1 == k.1) {
            keys.push(k);
        }
    }
    keys.sort_by(|a, b| a.0.cmp(&b.0).then(a.2.total_cmp(&b.2)));
    let points = keys
        .into_iter()
        .map(|(ds, cl, c)| {
            let per = servers
                .iter()
                .map(|(name, _, _)| {
                    let rs: Vec<&&Row> = spawned
                        .iter()
                        .filter(|r| {
                            r.server() == Some(name.as_str())
                                && r.conc_label() == cl
                                && r.v.get("dataset").and_then(Value::as_str).unwrap_or("") == ds
                        })
                        .collect();
                    if rs.is_empty() {
                        return None;
                    }
                    let m = |k: &str| median(rs.iter().map(|r| r.f(k)).collect());
                    let completed: f64 = rs.iter().map(|r| r.f("completed")).sum();
                    let failed: f64 = rs.iter().map(|r| r.f("failed")).sum();
                    Some(Agg {
                        runs: rs.len(),
                        completed,
                        total: completed + failed,
                        out_tps: m("output_throughput"),
                        ttft_p50: m("median_ttft_ms"),
                        ttft_p99: m("p99_ttft_ms"),
                        tpot_p50: m("median_tpot_ms"),
                        tpot_p99: m("p99_tpot_ms"),
                    })
                })
                .collect();
            (ds, cl, c, per)
        })
        .collect();
    Some(Sided { servers, points })
}

impl Sided {
    /// Header and cells of the side-by-side table.
    pub fn table(&self) -> (Vec<String>, Vec<Vec<String>>) {
        let mut head = vec!["dataset".to_string(), "concurrency".to_string()];
        for (n, _, _) in &self.servers {
            head.push(format!("{n} success %"));
        }
        for (n, _, _) in &self.servers {
            for k in ["out tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms"] {
                head.push(format!("{n} {k}"));
            }
        }
        let first = &self.servers[0].0;
        for (n, _, _) in &self.servers[1..] {
            head.push(format!("{n}/{first} out tok/s"));
            head.push(format!("{n}/{first} TTFT p50"));
        }
        let rows = self
            .points
            .iter()
            .map(|(ds, cl, _, per)| {
                let mut r = vec![ds.clone(), cl.clone()];
                for a in per {
                    r.push(a.map_or("–".into(), |a| {
                        format!(
                            "{:.1} ({:.0}/{:.0})",
                            100.0 * a.completed / a.total,
                            a.completed,
                            a.total
                        )
                    }));
                }
                for a in per {
                    match a {
                        None => r.extend(["–".to_string(), "–".into(), "–".into()]),
                        Some(a) => {
                            r.push(format!("{:.1}", a.out_tps));
                            r.push(format!("{:.0} / {:.0}", a.ttft_p50, a.ttft_p99));
                            r.push(format!("{:.1} / {:.1}", a.tpot_p50, a.tpot_p99));
                        }
                    }
                }
                for a in &per[1..] {
                    match (per[0], a) {
                        (Some(b), Some(a)) => {
                            r.push(format!("{:.2}×", a.out_tps / b.out_tps));
                            r.push(format!("{:.2}×", a.ttft_p50 / b.ttft_p50));
                        }
                        _ => r.extend(["–".to_string(), "–".into()]),
                    }
                }
                r
            })
            .collect();
        (head, rows)
    }

    pub fn markdown(&self) -> String {
        let mut s =
            String::from("Servers side by side (each point's runs interleaved A B B A):\n\n");
        for (n, v, c) in &self.servers {
            let _ = writeln!(s, "- **{n}**: {v} — `{c}`");
        }
        let (head, rows) = self.table();
        let _ = write!(
            s,
            "\n| {} |\n|{}\n",
            head.join(" | "),
            "---|".repeat(head.len())
        );
        for r in rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }

    pub fn html(&self) -> String {
        let mut s = String::from("<h2>Servers side by side</h2>\n<ul>");
        for (n, v, c) in &self.servers {
            let _ = write!(
                s,
                "<li><b>{}</b>: {} — <code>{}</code></li>",
                esc(n),
                esc(v),
                esc(c)
            );
        }
        s.push_str("</ul>\n<p>Success rate first: a server that drops requests is not faster. Runs of each point are interleaved between the servers (A B, B A, …) so drift hits all alike; with several runs per point, rates and latencies are medians over the runs and requests are summed.</p>\n<table><tr>");
        let (head, rows) = self.table();
        for h in head {
            let _ = write!(s, "<th>{}</th>", esc(&h));
        }
        s.push_str("</tr>\n");
        for r in rows {
            s.push_str("<tr>");
            for c in r {
                let _ = write!(s, "<td>{}</td>", esc(&c));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</table>\n");
        s
    }
}

/// Markdown comparison table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = side_by_side(rows).map_or_else(String::new, |sd| sd.markdown() + "\nAll runs:\n\n");
    let _ = write!(
        s,
        "| {} |\n|{}\n",
        COLS.join(" | "),
        "---|".repeat(COLS.len())
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", cells(r).join(" | "));
    }
    s
}

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line series for a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
    pub color: usize,
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `v` (1 for none).
pub(crate) fn nice_max(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if v <= m * e {
            return m * e;
        }
    }
    10.0 * e
}

/// The x axis of a chart.
#[derive(Debug, Clone, Copy)]
pub enum XAxis<'a> {
    /// log2 scale with a tick at every power of two (concurrency); x must be positive.
    Log2(&'a str),
    /// Linear from the smallest x to the largest, with round ticks.
    Linear(&'a str),
}

/// A vertical line across a chart at `x` (an event: a warm-up's end, a burst), labelled
/// at the top when `label` is not empty.
pub struct Mark {
    pub x: f64,
    pub label: String,
}

/// A line chart as inline SVG: log2 x axis (concurrency), linear y axis from 0.
pub fn svg_plot(title: &str, y_label: &str, series: &[Series]) -> String {
    svg_chart(
        title,
        XAxis::Log2("concurrency (log scale)"),
        y_label,
        series,
        &[],
    )
}

/// A line chart as inline SVG (640 x 360, legend on the right): the given x axis, a linear
/// y axis from 0, and vertical marks.
pub fn svg_chart(
    title: &str,
    x_axis: XAxis,
    y_label: &str,
    series: &[Series],
    marks: &[Mark],
) -> String {
    let (w, h, l, r, t, b) = (640.0, 360.0, 70.0, 190.0, 30.0, 45.0);
    let (log, x_label) = match x_axis {
        XAxis::Log2(label) => (true, label),
        XAxis::Linear(label) => (false, label),
    };
    let tx = |x: f64| if log { x.log2() } else { x };
    let usable = |p: &&(f64, f64)| (!log || p.0 > 0.0) && p.0.is_finite() && p.1.is_finite();
    let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in series.iter().flat_map(|s| s.points.iter()).filter(usable) {
        xmin = xmin.min(tx(x));
        xmax = xmax.max(tx(x));
        ymax = ymax.max(y);
    }
    if !xmin.is_finite() {
        (xmin, xmax) = (0.0, 1.0);
    }
    if xmax - xmin < 1e-9 {
        xmax = xmin + 1.0;
    }
    let ymax = nice_max(ymax);
    let pw = w - l - r;
    let ph = h - t - b;
    let sx = |x: f64| l + (tx(x) - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| t + ph - y / ymax * ph;
    let mut s = svg_open(w, h, title, l + pw / 2.0);
    for i in 0..=5 {
        let y = ymax * i as f64 / 5.0;
        y_grid(&mut s, l, pw, sy(y), &fmt_tick(y), "#ddd");
    }
    // Ticks: every power of two on a log axis, else multiples of a round step.
    let ticks: Vec<f64> = if log {
        (xmin.ceil() as i64..=(xmax + 1e-9).floor() as i64)
            .map(|e| 2f64.powi(e as i32))
            .collect()
    } else {
        let step = nice_max((xmax - xmin) / 8.0);
        let first = (xmin / step).ceil() as i64;
        (first..=((xmax + 1e-9) / step).floor() as i64)
            .map(|i| i as f64 * step)
            .collect()
    };
    for x in ticks {
        let _ = write!(
            s,
            r##"<line x1="{:.1}" x2="{:.1}" y1="{t}" y2="{}" stroke="#eee"/><text x="{:.1}" y="{}" text-anchor="middle">{}</text>"##,
            sx(x),
            sx(x),
            t + ph,
            sx(x),
            t + ph + 15.0,
            fmt_tick(x)
        );
    }
    for m in marks
        .iter()
        .filter(|m| (!log || m.x > 0.0) && m.x.is_finite())
    {
        let x = sx(m.x).clamp(l, l + pw);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{t}" y2="{}" stroke="#999" stroke-dasharray="3 3"/>"##,
            t + ph
        );
        if !m.label.is_empty() {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{}" fill="#666">{}</text>"##,
                x + 3.0,
                t + 11.0,
                esc(&m.label)
            );
        }
    }
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#333"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(15 {}) rotate(-90)" text-anchor="middle">{}</text>"##,
        l + pw / 2.0,
        h - 8.0,
        esc(x_label),
        t + ph / 2.0,
        esc(y_label)
    );
    for (i, se) in series.iter().enumerate() {
        let color = PALETTE[se.color % PALETTE.len()];
        let dash = if se.dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let path: Vec<String> = se
            .points
            .iter()
            .filter(usable)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for p in &path {
            let (x, y) = p.split_once(',').unwrap();
            let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"#);
        }
        let ly = t + 10.0 + 16.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            l + pw + 10.0,
            l + pw + 30.0,
            l + pw + 35.0,
            ly + 4.0,
            esc(&se.name.chars().take(26).collect::<String>())
        );
    }
    s.push_str("</svg>");
    s
}

/// The opening of an SVG chart: size, white background, the title centred at `title_x`.
pub(crate) fn svg_open(w: f64, h: f64, title: &str, title_x: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11"><title>{t}</title><rect width="{w}" height="{h}" fill="white"/><text x="{title_x}" y="18" font-size="14" text-anchor="middle">{t}</text>"#,
        t = esc(title)
    )
}

/// A horizontal grid line at pixel `y` across the plot (from `l`, `pw` wide), labelled on
/// the y axis.
pub(crate) fn y_grid(s: &mut String, l: f64, pw: f64, y: f64, label: &str, color: &str) {
    let _ = write!(
        s,
        r#"<line x1="{l}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{color}"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
        l + pw,
        l - 5.0,
        y + 4.0,
        esc(label)
    );
}

fn fmt_tick(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn series_of(
    rows: &[Row],
    keys: &[(&str, &str, bool)],
    f: &dyn Fn(&Row, &str) -> f64,
) -> Vec<Series> {
    // One series per name, in order of first appearance (rows of servers run side by
    // side interleave, A B B A, so equal names are not adjacent).
    let mut names: Vec<String> = Vec::new();
    for n in rows.iter().map(Row::series) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let mut out = Vec::new();
    for (i, n) in names.iter().enumerate() {
        for &(k, suffix, dashed) in keys {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| &r.series() == n)
                .map(|r| (r.concurrency(), f(r, k)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            out.push(Series {
                name: format!("{n}{suffix}"),
                points,
                dashed,
                color: i,
            });
        }
    }
    out
}

/// The self-contained HTML report.
pub fn html(rows: &[Row]) -> String {
    let get = |r: &Row, k: &str| r.f(k);
    let plots = [
        svg_plot(
            "Output throughput vs concurrency",
            "output tokens/s",
            &series_of(rows, &[("output_throughput", "", false)], &get),
        ),
        svg_plot(
            "TTFT vs concurrency",
            "TTFT ms (solid p50, dashed p99)",
            &series_of(
                rows,
                &[
                    ("median_ttft_ms", " p50", false),
                    ("p99_ttft_ms", " p99", true),
                ],
                &get,
            ),
        ),
        svg_plot(
            "ITL vs concurrency",
            "ITL ms (solid p50, dashed p99)",
            &series_of(
                rows,
                &[
                    ("median_itl_ms", " p50", false),
                    ("p99_itl_ms", " p99", true),
                ],
                &get,
            ),
        ),
        svg_plot(
            "Success rate vs concurrency",
            "success %",
            &series_of(rows, &[("", "", false)], &|r, _| 100.0 * r.success_rate()),
        ),
    ];
    let mut s = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rbench serve report</title><style>body{font-family:sans-serif;margin:20px}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}td:first-child,td:nth-child(2){text-align:left}.plots svg{margin:6px;border:1px solid #eee}</style></head><body>\n<h1>rbench serve report</h1>\n",
    );
    if let Some(sd) = side_by_side(rows) {
        s.push_str(&sd.html());
        s.push_str("<h2>All runs</h2>\n");
    }
    s.push_str("<p>TTFT/TPOT/ITL/E2E as vLLM's <code>bench serve</code> defines them; one row per file × concurrency. Datasets labelled <code>sharegpt-synthetic</code> are generated stand-ins, not ShareGPT.</p>\n<table><tr>");
    for c in COLS {
        let _ = write!(s, "<th>{}</th>", esc(c));
    }
    s.push_str("</tr>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in cells(r) {
            let _ = write!(s, "<td>{}</td>", esc(&c));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n<div class=\"plots\">\n");
    for p in plots {
        s.push_str(&p);
        s.push('\n');
    }
    s.push_str("</div>\n</body></html>\n");
    s
}

/// Entry point for `rbench report ARGS…` (`args[0]` is the subcommand name).
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let a: ReportArgs = match crate::parse_args(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

pub fn run(a: &ReportArgs) -> Result<()> {
    let n_sched = a.files.iter().filter(|f| sched::is_sched_file(f)).count();
    if n_sched > 0 {
        if n_sched < a.files.len() {
            bail!("mixing rbench sched result files with serve result files in one report");
        }
        let r = sched::load(&a.files)?;
        if let Some(out) = &a.html {
            write_file(out, &sched::html(&r))?;
            eprintln!("wrote {}", out.display());
        }
        if a.md || a.html.is_none() {
            print!("{}", sched::markdown(&r));
        }
        return Ok(());
    }
    let rows = load(&a.files)?;
    if let Some(out) = &a.html {
        write_file(out, &html(&rows))?;
        eprintln!("wrote {}", out.display());
    }
    if a.md || a.html.is_none() {
        print!("{}", markdown(&rows));
    }
    Ok(())
}

fn write_file(p: &Path, s: &str) -> Result<()> {
    std::fs::write(p, s).with_context(|| format!("writing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_servers_make_one_series_each_sorted_by_concurrency() {
        let row = |backend: &str, c: u64, tps: f64| Row {
            file: "sbs.jsonl".into(),
            v: serde_json::json!({
                "backend": backend, "server_cmd": "x", "dataset": "d",
                "max_concurrency": c, "output_throughput": tps,
            }),
        };
        // A B B A, as `rbench serve --spawn` writes them.
        let rows = [
            row("a", 1, 1.0),
            row("b", 1, 2.0),
            row("b", 4, 3.0),
            row("a", 4, 4.0),
            row("a", 16, 5.0),
            row("b", 16, 6.0),
        ];
        let s = series_of(&rows, &[("output_throughput", "", false)], &|r, k| r.f(k));
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "a [d]");
        assert_eq!(s[0].points, [(1.0, 1.0), (4.0, 4.0), (16.0, 5.0)]);
        assert_eq!(s[1].points, [(1.0, 2.0), (4.0, 3.0), (16.0, 6.0)]);
        assert_ne!(s[0].color, s[1].color);
    }
}
