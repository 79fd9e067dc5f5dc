//! Reports of `rbench sched` result files: per machine, workload and engine, each
//! variant's mean ± sd over its valid windows and its ratio to the baseline (the plan's
//! first variant) on the same engine with a 95% confidence interval, marked where the
//! difference is not significant; with several engines, a side-by-side table (engines as
//! columns within each variant, and ours over each other engine per variant); success
//! rates of serving windows per variant × server × concurrency; the proof seen per variant
//! and engine; every invalid window with its reasons (never averaged in). Files from several machines merge
//! into one comparison keyed by the machine fingerprint.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::stats;

/// One machine's identity.
#[derive(Debug, Clone)]
pub struct Machine {
    pub id: String,
    pub label: String,
    pub fingerprint: Value,
}

/// One window line.
#[derive(Debug, Clone)]
pub struct Win {
    pub machine: String,
    pub variant: String,
    pub workload: String,
    /// The engine, server or `cmd` of the window.
    pub engine: String,
    pub rep: u64,
    pub attempt: u64,
    pub valid: bool,
    pub reasons: Vec<String>,
    pub metrics: Value,
    pub proof: Value,
}

#[derive(Debug, Clone, Default)]
pub struct SchedReport {
    pub machines: Vec<Machine>,
    /// In plan order (first seen first): the first is the baseline.
    pub variants: Vec<String>,
    pub workloads: Vec<String>,
    /// Engines and servers, first seen first.
    pub engines: Vec<String>,
    pub windows: Vec<Win>,
}

fn push_unique(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}

/// Whether `path` is an `rbench sched` result file (its first line is a run header or a
/// window).
pub fn is_sched_file(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| {
            let l = t.lines().find(|l| !l.trim().is_empty())?.to_string();
            let v: Value = serde_json::from_str(&l).ok()?;
            Some(matches!(
                v["kind"].as_str(),
                Some("sched_run" | "sched_window")
            ))
        })
        .unwrap_or(false)
}

/// Reads result files (a torn last line, from a killed run, is skipped).
pub fn load(files: &[PathBuf]) -> Result<SchedReport> {
    let mut r = SchedReport::default();
    for f in files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        for (i, l) in lines.iter().enumerate() {
            let v: Value = match serde_json::from_str(l) {
                Ok(v) => v,
                Err(_) if i + 1 == lines.len() => continue,
                Err(e) => bail!("{}:{}: bad JSON line: {e}", f.display(), i + 1),
            };
            match v["kind"].as_str() {
                Some("sched_run") => {
                    let fp = v["fingerprint"].clone();
                    let id = fp["id"].as_str().unwrap_or("?").to_string();
                    if !r.machines.iter().any(|m| m.id == id) {
                        r.machines.push(Machine {
                            label: sched_experiments::fingerprint::label(&fp),
                            id,
                            fingerprint: fp,
                        });
                    }
                    for x in v["plan"]["variants"].as_array().into_iter().flatten() {
                        push_unique(&mut r.variants, x.as_str().unwrap_or_default());
                    }
                    for x in v["plan"]["workloads"].as_array().into_iter().flatten() {
                        push_unique(&mut r.workloads, x.as_str().unwrap_or_default());
                    }
                }
                Some("sched_window") => {
                    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                    push_unique(&mut r.variants, &s("variant"));
                    push_unique(&mut r.workloads, &s("workload"));
                    let engine = v["engine"].as_str().map_or_else(
                        || sched_experiments::plan::default_engine(&s("workload")).to_string(),
                        String::from,
                    );
                    push_unique(&mut r.engines, &engine);
                    r.windows.push(Win {
                        machine: s("machine"),
                        variant: s("variant"),
                        workload: s("workload"),
                        engine,
                        rep: v["rep"].as_u64().unwrap_or(0),
                        attempt: v["attempt"].as_u64().unwrap_or(1),
                        valid: v["valid"].as_bool().unwrap_or(false),
                        reasons: v["reasons"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|x| x.as_str().map(String::from))
                            .collect(),
                        metrics: v["metrics"].clone(),
                        proof: v["proof"].clone(),
                    });
                }
                _ => bail!("{}:{}: not an rbench sched line", f.display(), i + 1),
            }
        }
    }
    if r.windows.is_empty() && r.machines.is_empty() {
        bail!("no rbench sched results in {files:?}");
    }
    Ok(r)
}

/// Two-sided 97.5% Student t quantile for `df` degrees of freedom.
pub fn t975(df: f64) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if !df.is_finite() || df < 1.0 {
        return f64::NAN;
    }
    let d = df.floor() as usize;
    if d <= 30 {
        T[d - 1]
    } else if d <= 60 {
        2.042 - (d - 30) as f64 * (2.042 - 2.000) / 30.0
    } else {
        1.96
    }
}

/// Mean, sample sd and count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Msd {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

pub fn msd(xs: &[f64]) -> Msd {
    Msd {
        mean: stats::mean(xs),
        sd: if xs.len() > 1 { stats::stddev(xs) } else { 0.0 },
        n: xs.len(),
    }
}

/// The ratio `a.mean / b.mean` with a 95% confidence interval from the delta method on
/// the log ratio (Welch–Satterthwaite degrees of freedom). None without two samples on
/// each side.
pub fn ratio_ci(a: Msd, b: Msd) -> Option<(f64, f64, f64)> {
    if a.n < 2 || b.n < 2 || a.mean <= 0.0 || b.mean <= 0.0 {
        return None;
    }
    let va = (a.sd / a.mean).powi(2) / a.n as f64;
    let vb = (b.sd / b.mean).powi(2) / b.n as f64;
    let r = a.mean / b.mean;
    let v = va + vb;
    if v == 0.0 {
        return Some((r, r, r));
    }
    let df = v * v / (va * va / (a.n - 1) as f64 + vb * vb / (b.n - 1) as f64);
    let half = t975(df) * v.sqrt();
    Some((r, r * (-half).exp(), r * half.exp()))
}

fn ratio_cell(a: Msd, base: Option<Msd>, is_base: bool) -> (String, String) {
    if is_base {
        return ("1 (baseline)".into(), String::new());
    }
    let Some(b) = base else {
        return ("–".into(), String::new());
    };
    match ratio_ci(a, b) {
        Some((r, lo, hi)) => (
            format!("{r:.3} [{lo:.3}, {hi:.3}]"),
            if lo > 1.0 || hi < 1.0 {
                "*".into()
            } else {
                "n.s.".into()
            },
        ),
        None if b.mean > 0.0 && a.n > 0 => (format!("{:.3}", a.mean / b.mean), "(n<2)".into()),
        None => ("–".into(), String::new()),
    }
}

/// Where (machine, workload, variant, engine) a figure comes from.
#[derive(Clone, Copy)]
pub struct Cell<'a> {
    pub m: &'a str,
    pub w: &'a str,
    pub v: &'a str,
    pub e: &'a str,
}

impl SchedReport {
    fn all<'a>(&'a self, c: Cell<'a>) -> impl Iterator<Item = &'a Win> + 'a {
        self.windows.iter().filter(move |x| {
            x.machine == c.m && x.workload == c.w && x.variant == c.v && x.engine == c.e
        })
    }

    fn valid<'a>(&'a self, c: Cell<'a>) -> impl Iterator<Item = &'a Win> + 'a {
        self.all(c).filter(|x| x.valid)
    }

    fn count(&self, c: Cell<'_>) -> (usize, usize) {
        (self.valid(c).count(), self.all(c).count())
    }

    fn is_serve(&self, w: &str) -> bool {
        w.starts_with("serve:")
    }

    /// The engines with windows of workload `w` on machine `m`.
    fn engines_of(&self, m: &str, w: &str) -> Vec<String> {
        self.engines
            .iter()
            .filter(|e| {
                self.windows
                    .iter()
                    .any(|x| x.machine == m && x.workload == w && &x.engine == *e)
            })
            .cloned()
            .collect()
    }

    /// The headline figure of the valid windows: tokens/s for engine tests (a command's
    /// own figure for `cmd:` workloads, see its unit).
    pub fn engine(&self, c: Cell<'_>) -> Msd {
        let xs: Vec<f64> = self
            .valid(c)
            .filter_map(|x| {
                x.metrics["avg_ts"]
                    .as_f64()
                    .or(x.metrics["figure"].as_f64())
            })
            .collect();
        msd(&xs)
    }

    /// The unit of a `cmd:` workload's figure, when it is not tokens/s.
    fn unit(&self, c: Cell<'_>) -> Option<String> {
        self.valid(c)
            .find_map(|x| x.metrics["unit"].as_str().map(String::from))
            .filter(|u| u != "t/s")
    }

    /// Serving sweep points `c` of the valid windows: (output tok/s, success rate).
    pub fn serve_point(&self, cell: Cell<'_>, c: &str) -> (Msd, Msd, Vec<Value>) {
        let mut out = Vec::new();
        let mut ok = Vec::new();
        let mut pts = Vec::new();
        for x in self.valid(cell) {
            for p in x.metrics["points"].as_array().into_iter().flatten() {
                let pc = p["max_concurrency"]
                    .as_u64()
                    .map_or("inf".to_string(), |n| n.to_string());
                if pc == c {
                    out.push(p["output_throughput"].as_f64().unwrap_or(f64::NAN));
                    ok.push(100.0 * p["success_rate"].as_f64().unwrap_or(f64::NAN));
                    pts.push(p.clone());
                }
            }
        }
        (msd(&out), msd(&ok), pts)
    }

    fn concurrencies(&self, w: &str) -> Vec<String> {
        w.strip_prefix("serve:c=")
            .map(|c| c.split(',').map(String::from).collect())
            .unwrap_or_default()
    }

    /// Per variant and engine: the sched_ext ops names seen at window starts, the share
    /// of workload threads seen on sched_ext (min over windows), their policies, and the
    /// processes whose threads were proven.
    fn proof_summary(&self, m: &str, v: &str, e: &str) -> (String, String, String, String) {
        let mut ops = Vec::new();
        let mut ext_share = f64::INFINITY;
        let mut policies = Vec::new();
        let mut procs = Vec::new();
        for x in self
            .windows
            .iter()
            .filter(|x| x.machine == m && x.variant == v && x.engine == e)
        {
            for p in x.proof["processes"].as_array().into_iter().flatten() {
                push_unique(&mut procs, p["comm"].as_str().unwrap_or("?"));
            }
            let o = x.proof["start"]["ops"]
                .as_str()
                .unwrap_or("none (fair class)");
            push_unique(&mut ops, o);
            let ts = x.proof["threads"].as_array().cloned().unwrap_or_default();
            if !ts.is_empty() {
                let on = ts.iter().filter(|t| t["ext_enabled"] == true).count();
                ext_share = ext_share.min(on as f64 / ts.len() as f64);
                for t in &ts {
                    push_unique(&mut policies, &format!("{}/{}", t["policy"], t["prio"]));
                }
            }
        }
        (
            ops.join(", "),
            if ext_share.is_finite() {
                format!("{:.0}%", 100.0 * ext_share)
            } else {
                "–".into()
            },
            policies.join(" "),
            if procs.is_empty() {
                "–".into()
            } else {
                procs.join(" ")
            },
        )
    }
}

fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

fn mean_sd(a: Msd, unit: Option<&str>) -> String {
    match (a.n > 0, unit) {
        (false, _) => "no valid window".into(),
        (true, Some(u)) => format!("{:.2} ± {:.2} {u}", a.mean, a.sd),
        (true, None) => format!("{:.2} ± {:.2}", a.mean, a.sd),
    }
}

/// The engine rows of one machine: workload, variant, engine, windows, mean ± sd, ratio
/// to the baseline variant on the same engine, mark.
fn engine_rows(r: &SchedReport, m: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let base_name = r.variants.first().cloned().unwrap_or_default();
    for w in r.workloads.iter().filter(|w| !r.is_serve(w)) {
        for v in &r.variants {
            for e in r.engines_of(m, w) {
                let c = Cell { m, w, v, e: &e };
                let (ok, all) = r.count(c);
                if all == 0 {
                    continue;
                }
                let base = r.engine(Cell { v: &base_name, ..c });
                let a = r.engine(c);
                let (ratio, mark) = ratio_cell(a, (base.n > 0).then_some(base), *v == base_name);
                rows.push(vec![
                    w.clone(),
                    v.clone(),
                    e.clone(),
                    format!("{ok}/{all}"),
                    mean_sd(a, r.unit(c).as_deref()),
                    ratio,
                    mark,
                ]);
            }
        }
    }
    rows
}

/// Engines side by side within each variant (only where a workload ran on several): each
/// engine's mean, and ours (rllama, or the first engine) over each other one with its 95%
/// interval.
fn side_by_side(r: &SchedReport, m: &str) -> Option<(Vec<String>, Vec<Vec<String>>)> {
    let engine_workloads: Vec<&String> = r
        .workloads
        .iter()
        .filter(|w| !r.is_serve(w) && r.engines_of(m, w).len() > 1)
        .collect();
    if engine_workloads.is_empty() {
        return None;
    }
    let mut engines: Vec<String> = Vec::new();
    for w in &engine_workloads {
        for e in r.engines_of(m, w) {
            push_unique(&mut engines, &e);
        }
    }
    let ours = if engines.iter().any(|e| e == "rllama") {
        "rllama".to_string()
    } else {
        engines[0].clone()
    };
    let mut head = vec!["workload".to_string(), "variant".to_string()];
    head.extend(engines.iter().map(|e| format!("{e} mean ± sd")));
    let others: Vec<&String> = engines.iter().filter(|e| **e != ours).collect();
    head.extend(others.iter().map(|e| format!("{ours} / {e} [95% CI]")));
    let mut rows = Vec::new();
    for w in engine_workloads {
        for v in &r.variants {
            if engines.iter().all(|e| r.count(Cell { m, w, v, e }).1 == 0) {
                continue;
            }
            let mut row = vec![w.clone(), v.clone()];
            for e in &engines {
                row.push(mean_sd(r.engine(Cell { m, w, v, e }), None));
            }
            let a = r.engine(Cell { m, w, v, e: &ours });
            for e in &others {
                let b = r.engine(Cell { m, w, v, e });
                row.push(match ratio_cell(a, (b.n > 0).then_some(b), false) {
                    (x, mark) if mark.is_empty() => x,
                    (x, mark) => format!("{x} {mark}"),
                });
            }
            rows.push(row);
        }
    }
    Some((head, rows))
}

fn serve_rows(r: &SchedReport, m: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let base_name = r.variants.first().cloned().unwrap_or_default();
    for w in r.workloads.iter().filter(|w| r.is_serve(w)) {
        for c in r.concurrencies(w) {
            for v in &r.variants {
                for e in r.engines_of(m, w) {
                    let cell = Cell { m, w, v, e: &e };
                    let (ok, all) = r.count(cell);
                    if all == 0 {
                        continue;
                    }
                    let (base, _, _) = r.serve_point(
                        Cell {
                            v: &base_name,
                            ..cell
                        },
                        &c,
                    );
                    let (out, succ, pts) = r.serve_point(cell, &c);
                    let (ratio, mark) =
                        ratio_cell(out, (base.n > 0).then_some(base), *v == base_name);
                    let med = |k: &str| {
                        let xs: Vec<f64> = pts.iter().filter_map(|p| p[k].as_f64()).collect();
                        if xs.is_empty() {
                            "–".to_string()
                        } else {
                            format!("{:.0}", stats::mean(&xs))
                        }
                    };
                    rows.push(vec![
                        w.clone(),
                        v.clone(),
                        e.clone(),
                        c.clone(),
                        format!("{ok}/{all}"),
                        if succ.n > 0 {
                            format!("{:.1}", succ.mean)
                        } else {
                            "–".into()
                        },
                        if out.n > 0 {
                            format!("{:.1} ± {:.1}", out.mean, out.sd)
                        } else {
                            "no valid window".into()
                        },
                        ratio,
                        mark,
                        med("median_ttft_ms"),
                        med("median_tpot_ms"),
                    ]);
                }
            }
        }
    }
    rows
}

fn invalid_rows(r: &SchedReport) -> Vec<Vec<String>> {
    r.windows
        .iter()
        .filter(|w| !w.valid)
        .map(|w| {
            vec![
                r.machines
                    .iter()
                    .find(|m| m.id == w.machine)
                    .map_or(w.machine.clone(), |m| {
                        m.fingerprint["hostname"]
                            .as_str()
                            .unwrap_or("?")
                            .to_string()
                    }),
                w.variant.clone(),
                w.workload.clone(),
                w.engine.clone(),
                (w.rep + 1).to_string(),
                w.attempt.to_string(),
                w.reasons.join("; "),
            ]
        })
        .collect()
}

/// The NUMA facts of a variant's valid windows on one engine: the thread nodes and the weight
/// pages per node seen in each distinct form (usually one).
fn numa_summary(r: &SchedReport, m: &str, v: &str, e: &str) -> String {
    let mut seen: Vec<String> = Vec::new();
    for w in r
        .windows
        .iter()
        .filter(|w| w.machine == m && w.variant == v && w.engine == e && w.valid)
    {
        let d = &w.metrics["numa_detail"];
        if d.is_null() {
            continue;
        }
        let nodes = d["thread_nodes"].as_array().map_or("–".to_string(), |a| {
            a.iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(",")
        });
        let pages: Vec<String> = d["weight_pages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let per: Vec<String> = p["per_node"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, c)| format!("n{k}={c}"))
                    .collect();
                let mut t = per.join(" ");
                if p["absent"].as_u64().unwrap_or(0) > 0 {
                    t.push_str(&format!(" absent={}", p["absent"]));
                }
                match p["copy_node"].as_u64() {
                    Some(n) => format!("@{n}: {t}"),
                    None => t,
                }
            })
            .collect();
        push_unique(
            &mut seen,
            &format!(
                "{} {}; threads on nodes [{nodes}]; pages {}",
                d["mode"].as_str().filter(|s| !s.is_empty()).unwrap_or("-"),
                d["weights"].as_str().unwrap_or("?"),
                pages.join("; ")
            ),
        );
    }
    seen.join(" / ")
}

fn has_numa(r: &SchedReport) -> bool {
    r.windows
        .iter()
        .any(|w| !w.metrics["numa_detail"].is_null())
}

fn proof_rows(r: &SchedReport, m: &str) -> Vec<Vec<String>> {
    let numa = has_numa(r);
    let mut rows = Vec::new();
    for v in &r.variants {
        for e in &r.engines {
            if !r
                .windows
                .iter()
                .any(|w| w.machine == m && &w.variant == v && &w.engine == e)
            {
                continue;
            }
            let (ops, ext, pol, procs) = r.proof_summary(m, v, e);
            let mut row = vec![v.clone(), e.clone(), ops, ext, pol, procs];
            if numa {
                row.push(numa_summary(r, m, v, e));
            }
            rows.push(row);
        }
    }
    rows
}

fn proof_head(r: &SchedReport) -> Vec<&'static str> {
    let mut h = PROOF_HEAD.to_vec();
    if has_numa(r) {
        h.push("NUMA: mode, weights; thread nodes; weight pages per node");
    }
    h
}

const ENGINE_HEAD: [&str; 7] = [
    "workload",
    "variant",
    "engine",
    "valid/windows",
    "t/s mean ± sd",
    "ratio vs baseline [95% CI]",
    "sig.",
];
const SERVE_HEAD: [&str; 11] = [
    "workload",
    "variant",
    "server",
    "concurrency",
    "valid/windows",
    "success %",
    "out tok/s mean ± sd",
    "ratio [95% CI]",
    "sig.",
    "TTFT p50 ms",
    "TPOT p50 ms",
];
const PROOF_HEAD: [&str; 6] = [
    "variant",
    "engine",
    "sched_ext ops at window start",
    "workload threads on sched_ext (min)",
    "policy/prio seen",
    "processes proven",
];
const INVALID_HEAD: [&str; 7] = [
    "machine",
    "variant",
    "workload",
    "engine",
    "rep",
    "attempt",
    "why invalid",
];
const NOTE: &str = "Ratios are variant mean / baseline mean (the plan's first variant) on the same \
engine over valid windows (and, side by side, ours / another engine within a variant), with a 95% confidence interval (delta method on the log ratio, Welch degrees of freedom); \
`*` marks intervals that exclude 1, `n.s.` differences that are not significant. Invalid windows are \
listed with their reasons and never averaged in.";

/// Markdown report.
pub fn markdown(r: &SchedReport) -> String {
    let mut s = String::new();
    for m in &r.machines {
        let _ = writeln!(s, "\n### {}\n", m.label);
        let er = engine_rows(r, &m.id);
        if !er.is_empty() {
            s.push_str(&table(&ENGINE_HEAD, &er));
            s.push('\n');
        }
        if let Some((head, rows)) = side_by_side(r, &m.id) {
            s.push_str("Engines side by side:\n\n");
            let head: Vec<&str> = head.iter().map(String::as_str).collect();
            s.push_str(&table(&head, &rows));
            s.push('\n');
        }
        let sr = serve_rows(r, &m.id);
        if !sr.is_empty() {
            s.push_str(&table(&SERVE_HEAD, &sr));
            s.push('\n');
        }
        s.push_str(&table(&proof_head(r), &proof_rows(r, &m.id)));
    }
    if r.machines.len() > 1 {
        s.push_str("\n### Across machines (ratio vs baseline [95% CI])\n\n");
        let mut head = vec![
            "workload".to_string(),
            "variant".to_string(),
            "engine".to_string(),
        ];
        head.extend(r.machines.iter().map(|m| {
            m.fingerprint["hostname"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        }));
        let mut rows = Vec::new();
        let base_name = r.variants.first().cloned().unwrap_or_default();
        for w in r.workloads.iter().filter(|w| !r.is_serve(w)) {
            for v in &r.variants {
                for e in &r.engines {
                    let mut row = vec![w.clone(), v.clone(), e.clone()];
                    let mut any = false;
                    for m in &r.machines {
                        let c = Cell { m: &m.id, w, v, e };
                        let a = r.engine(c);
                        let b = r.engine(Cell { v: &base_name, ..c });
                        let (ratio, mark) = ratio_cell(a, (b.n > 0).then_some(b), *v == base_name);
                        any |= a.n > 0;
                        row.push(if a.n > 0 {
                            format!(
                                "{:.2} ({ratio}{}{mark})",
                                a.mean,
                                if mark.is_empty() { "" } else { " " }
                            )
                        } else {
                            "–".into()
                        });
                    }
                    if any {
                        rows.push(row);
                    }
                }
            }
        }
        let head: Vec<&str> = head.iter().map(String::as_str).collect();
        s.push_str(&table(&head, &rows));
    }
    let inv = invalid_rows(r);
    if !inv.is_empty() {
        s.push_str("\n### Invalid windows\n\n");
        s.push_str(&table(&INVALID_HEAD, &inv));
    }
    let _ = writeln!(s, "\n{NOTE}");
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn html_table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<table><tr>");
    for h in head {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s.push_str("</tr>\n");
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            let cls = if c == "n.s." {
                " class=\"ns\""
            } else if c == "*" {
                " class=\"sig\""
            } else {
                ""
            };
            let _ = write!(s, "<td{cls}>{}</td>", esc(c));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    s
}

const PALETTE: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

/// A grouped bar chart with ±sd error bars: one group per variant, one bar per series
/// (machine). Bars of variants without a valid window are absent.
pub fn svg_bars(
    title: &str,
    y_label: &str,
    groups: &[String],
    series: &[(String, Vec<Option<Msd>>)],
) -> String {
    let (w, h, l, r, t, b) = (560.0, 300.0, 65.0, 110.0, 30.0, 85.0);
    let pw = w - l - r;
    let ph = h - t - b;
    let ymax = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .map(|m| m.mean + m.sd)
        .fold(0.0f64, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let sy = |y: f64| t + ph - y / ymax * ph;
    let gw = pw / groups.len().max(1) as f64;
    let bw = gw * 0.8 / series.len().max(1) as f64;
    let mut s = super::svg_open(w, h, title, l + pw / 2.0);
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        super::y_grid(&mut s, l, pw, sy(y), &format!("{y:.1}"), "#e5e5e5");
    }
    for (gi, g) in groups.iter().enumerate() {
        let gx = l + gi as f64 * gw;
        if series
            .iter()
            .all(|(_, v)| !matches!(v.get(gi), Some(Some(_))))
        {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#999">no valid window</text>"##,
                gx + gw / 2.0,
                t + ph - 8.0
            );
        }
        for (si, (_, vals)) in series.iter().enumerate() {
            let Some(Some(m)) = vals.get(gi) else {
                continue;
            };
            let x = gx + gw * 0.1 + si as f64 * bw;
            let color = PALETTE[si % PALETTE.len()];
            let _ = write!(
                s,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}" opacity="0.85"/><line x1="{:.1}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#222"/>"##,
                sy(m.mean),
                bw * 0.9,
                (ph + t - sy(m.mean)).max(0.0),
                x + bw * 0.45,
                x + bw * 0.45,
                sy(m.mean + m.sd),
                sy((m.mean - m.sd).max(0.0)),
            );
        }
        let _ = write!(
            s,
            r#"<text transform="translate({:.1} {}) rotate(-30)" text-anchor="end">{}</text>"#,
            gx + gw / 2.0,
            t + ph + 14.0,
            esc(&g.chars().take(28).collect::<String>())
        );
    }
    for (si, (name, _)) in series.iter().enumerate() {
        let y = t + 10.0 + 16.0 * si as f64;
        let _ = write!(
            s,
            r##"<rect x="{}" y="{}" width="12" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"##,
            l + pw + 10.0,
            y - 8.0,
            PALETTE[si % PALETTE.len()],
            l + pw + 27.0,
            y + 1.0,
            esc(&name.chars().take(22).collect::<String>())
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#333"/><text transform="translate(15 {}) rotate(-90)" text-anchor="middle">{}</text></svg>"##,
        t + ph / 2.0,
        esc(y_label)
    );
    s
}

/// The self-contained HTML report.
pub fn html(r: &SchedReport) -> String {
    let mut s = String::from(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>rbench sched report</title><style>body{font-family:sans-serif;margin:20px;max-width:1200px}table{border-collapse:collapse;font-size:13px;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f3f3f3}td.ns{color:#888}td.sig{color:#b00;font-weight:bold}.plots svg{margin:6px;border:1px solid #eee}</style></head><body>\n<h1>rbench sched report</h1>\n",
    );
    let _ = writeln!(s, "<p>{}</p>", esc(NOTE));
    let hostnames: Vec<String> = r
        .machines
        .iter()
        .map(|m| {
            m.fingerprint["hostname"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    s.push_str("<div class=\"plots\">\n");
    for w in &r.workloads {
        // One series per machine and engine (named by the host alone when one engine ran).
        let several = r.engines.len() > 1;
        let series: Vec<(String, Vec<Option<Msd>>)> = r
            .machines
            .iter()
            .zip(&hostnames)
            .flat_map(|(m, hn)| {
                r.engines_of(&m.id, w).into_iter().map(move |e| {
                    let vals = r
                        .variants
                        .iter()
                        .map(|v| {
                            let cell = Cell {
                                m: &m.id,
                                w,
                                v,
                                e: &e,
                            };
                            let x = if r.is_serve(w) {
                                let c = r.concurrencies(w).last().cloned().unwrap_or_default();
                                r.serve_point(cell, &c).0
                            } else {
                                r.engine(cell)
                            };
                            (x.n > 0).then_some(x)
                        })
                        .collect();
                    let label = if several {
                        format!("{hn} {e}")
                    } else {
                        hn.clone()
                    };
                    (label, vals)
                })
            })
            .collect();
        let (title, unit) = if r.is_serve(w) {
            (
                format!(
                    "{w}: output throughput at c={}",
                    r.concurrencies(w).last().cloned().unwrap_or_default()
                ),
                "output tokens/s",
            )
        } else {
            (format!("{w}: tokens/s per variant"), "tokens/s (mean ± sd)")
        };
        s.push_str(&svg_bars(&title, unit, &r.variants, &series));
        s.push('\n');
    }
    s.push_str("</div>\n");
    for m in &r.machines {
        let _ = writeln!(s, "<h2>{}</h2>", esc(&m.label));
        let er = engine_rows(r, &m.id);
        if !er.is_empty() {
            s.push_str(&html_table(&ENGINE_HEAD, &er));
        }
        if let Some((head, rows)) = side_by_side(r, &m.id) {
            s.push_str("<h3>Engines side by side</h3>\n");
            let head: Vec<&str> = head.iter().map(String::as_str).collect();
            s.push_str(&html_table(&head, &rows));
        }
        let sr = serve_rows(r, &m.id);
        if !sr.is_empty() {
            s.push_str("<h3>Serving</h3>\n");
            s.push_str(&html_table(&SERVE_HEAD, &sr));
        }
        s.push_str("<h3>Proof</h3>\n");
        s.push_str(&html_table(&proof_head(r), &proof_rows(r, &m.id)));
        let fp = &m.fingerprint;
        let _ = writeln!(
            s,
            "<p><small>machine {}: {} logical CPUs ({} cores, {} per core), NUMA nodes {}, {:.1} GiB, kernel {}, sched_ext {}, governor {}, THP {}, cgroup {}</small></p>",
            esc(fp["id"].as_str().unwrap_or("?")),
            fp["logical_cpus"],
            fp["cores"],
            fp["threads_per_core"],
            fp["numa_nodes"].as_array().map_or(0, Vec::len),
            fp["mem_total_kib"].as_f64().unwrap_or(0.0) / 1048576.0,
            esc(fp["kernel_release"].as_str().unwrap_or("?")),
            if fp["sched_ext_sysfs"] == true { "yes" } else { "no" },
            esc(fp["cpufreq_governor"].as_str().unwrap_or("none")),
            esc(fp["thp"].as_str().unwrap_or("?")),
            esc(fp["cgroup"].as_str().unwrap_or("?")),
        );
    }
    let inv = invalid_rows(r);
    if !inv.is_empty() {
        s.push_str("<h2>Invalid windows</h2>\n");
        s.push_str(&html_table(&INVALID_HEAD, &inv));
    }
    s.push_str("</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_intervals() {
        let a = msd(&[10.0, 10.2, 9.8, 10.1, 9.9]);
        let b = msd(&[10.0, 10.1, 9.9, 10.05, 9.95]);
        let (r, lo, hi) = ratio_ci(a, b).unwrap();
        assert!(
            (r - 1.0).abs() < 0.01 && lo < 1.0 && hi > 1.0,
            "{r} {lo} {hi}"
        );
        let c = msd(&[12.0, 12.1, 11.9, 12.05, 11.95]);
        let (r, lo, _) = ratio_ci(c, b).unwrap();
        assert!(r > 1.19 && lo > 1.1);
        assert!(ratio_ci(msd(&[1.0]), b).is_none());
        assert_eq!(t975(1.0), 12.706);
        assert_eq!(t975(200.0), 1.96);
    }

    fn line(
        machine: &str,
        variant: &str,
        workload: &str,
        rep: u64,
        valid: bool,
        ts: f64,
    ) -> String {
        serde_json::json!({
            "kind": "sched_window", "machine": machine, "variant": variant, "workload": workload,
            "rep": rep, "attempt": 1, "valid": valid,
            "reasons": if valid { vec![] } else { vec!["scx_simple exited during the window"] },
            "metrics": {"avg_ts": ts},
            "proof": {"start": {"ops": if variant == "eevdf" { Value::Null } else { "simple".into() }},
                      "threads": [{"policy": 0, "prio": 120, "ext_enabled": variant != "eevdf"}]},
        })
        .to_string()
    }

    fn run_line(id: &str, host: &str) -> String {
        serde_json::json!({"kind": "sched_run", "fingerprint": {"id": id, "hostname": host,
            "cpu_model": "cpu", "logical_cpus": 2, "kernel_release": "6.12"},
            "plan": {"variants": ["eevdf", "scx:scx_simple"], "workloads": ["pp64"]}})
        .to_string()
    }

    #[test]
    fn numa_windows_show_thread_nodes_and_pages_per_node() {
        let d = tempfile::tempdir().unwrap();
        let mut lines = vec![run_line("m1", "lab")];
        for rep in 0..2 {
            let mut w: Value =
                serde_json::from_str(&line("m1", "eevdf", "pp64", rep, true, 5.0)).unwrap();
            w["variant"] = "numa:distribute+weights:replicate".into();
            w["metrics"]["numa_detail"] = serde_json::json!({
                "mode": "distribute", "weights": "replicate", "thread_nodes": [0, 1],
                "weight_pages": [
                    {"copy_node": 0, "per_node": {"0": 100}, "absent": 0},
                    {"copy_node": 1, "per_node": {"1": 100}, "absent": 0}]});
            lines.push(w.to_string());
        }
        let f = d.path().join("n.jsonl");
        std::fs::write(&f, lines.join("\n")).unwrap();
        let md = markdown(&load(&[f]).unwrap());
        assert!(md.contains("weight pages per node"), "{md}");
        assert!(
            md.contains(
                "distribute replicate; threads on nodes [0,1]; pages @0: n0=100; @1: n1=100"
            ),
            "{md}"
        );
        // Files without NUMA details keep the old proof table.
        let f2 = d.path().join("plain.jsonl");
        std::fs::write(
            &f2,
            [
                run_line("m1", "lab"),
                line("m1", "eevdf", "pp64", 0, true, 1.0),
            ]
            .join("\n"),
        )
        .unwrap();
        assert!(!markdown(&load(&[f2]).unwrap()).contains("weight pages"));
    }

    #[test]
    fn engines_are_columns_within_each_variant() {
        let d = tempfile::tempdir().unwrap();
        let mut lines = vec![run_line("m1", "lab")];
        for rep in 0..3 {
            for (v, f) in [("eevdf", 1.0), ("scx:scx_simple", 0.9)] {
                for (e, ts) in [("rllama", 20.0), ("llamacpp", 10.0)] {
                    let mut w: Value = serde_json::from_str(&line(
                        "m1",
                        v,
                        "pp64",
                        rep,
                        true,
                        ts * f + rep as f64 * 0.1,
                    ))
                    .unwrap();
                    w["engine"] = e.into();
                    w["proof"]["processes"] = serde_json::json!([{"pid": 1, "comm": if e == "rllama" { "rbench" } else { "llama-bench" }}]);
                    lines.push(w.to_string());
                }
            }
        }
        let f = d.path().join("e.jsonl");
        std::fs::write(&f, lines.join("\n")).unwrap();
        let r = load(&[f]).unwrap();
        assert_eq!(r.engines, ["rllama", "llamacpp"]);
        let md = markdown(&r);
        assert!(
            md.contains("| workload | variant | rllama mean ± sd | llamacpp mean ± sd | rllama / llamacpp [95% CI] |"),
            "{md}"
        );
        assert!(
            md.contains("| pp64 | eevdf | 20.10 ± 0.10 | 10.10 ± 0.10 | 1.99"),
            "{md}"
        );
        // Each engine's ratio to the baseline variant is its own.
        assert!(
            md.contains("| pp64 | scx:scx_simple | llamacpp | 3/3 | 9.10 ± 0.10 | 0.90"),
            "{md}"
        );
        assert!(
            md.contains("| scx:scx_simple | llamacpp | simple | 100% | 0/120 | llama-bench |"),
            "{md}"
        );
    }

    #[test]
    fn tables_keep_invalid_windows_out_and_merge_machines() {
        let d = tempfile::tempdir().unwrap();
        let mut a = vec![run_line("m1", "lab")];
        for (rep, ts) in [(0, 10.0), (1, 10.2), (2, 9.8)] {
            a.push(line("m1", "eevdf", "pp64", rep, true, ts));
            a.push(line("m1", "scx:scx_simple", "pp64", rep, true, ts * 1.2));
        }
        a.push(line("m1", "scx:scx_simple", "pp64", 3, false, 999.0));
        let b = [
            run_line("m2", "laptop"),
            line("m2", "eevdf", "pp64", 0, true, 50.0),
            line("m2", "eevdf", "pp64", 1, true, 51.0),
        ];
        let (fa, fb) = (d.path().join("a.jsonl"), d.path().join("b.jsonl"));
        std::fs::write(&fa, a.join("\n")).unwrap();
        std::fs::write(&fb, b.join("\n")).unwrap();
        assert!(is_sched_file(&fa));
        let r = load(&[fa, fb]).unwrap();
        assert_eq!(r.machines.len(), 2);
        assert_eq!(r.variants, ["eevdf", "scx:scx_simple"]);
        let m = r.engine(Cell {
            m: "m1",
            w: "pp64",
            v: "scx:scx_simple",
            e: "rllama",
        });
        assert_eq!(m.n, 3, "the invalid 999 t/s window is not averaged in");
        assert!((m.mean - 12.0).abs() < 1e-9);
        let md = markdown(&r);
        assert!(
            md.contains("| pp64 | scx:scx_simple | rllama | 3/4 | 12.00 ± 0.24 | 1.200 ["),
            "{md}"
        );
        assert!(md.contains("| * |"), "{md}");
        assert!(
            md.contains("### Invalid windows") && md.contains("scx_simple exited"),
            "{md}"
        );
        assert!(md.contains("### Across machines"), "{md}");
        assert!(
            md.contains("| scx:scx_simple | rllama | simple | 100% |"),
            "{md}"
        );
        assert!(!md.contains("Engines side by side"), "one engine: {md}");
        let html = html(&r);
        assert!(html.contains("<svg") && html.contains("laptop") && html.contains("class=\"sig\""));
    }
}
