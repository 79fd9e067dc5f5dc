//! A plan: variants × tasks (a workload on an engine: ours, llama.cpp, a server, a command)
//! × repetitions, run window by window in an order that lets drift hit every variant and
//! engine alike (A B B A over variant × task: repetition `r` runs them forward when `r` is
//! even, backward when odd), each window retried a bounded number of times when its
//! proof fails, a fixed cooldown between windows (never "until the numbers recover"), and
//! one JSON line per window appended to the result file as soon as it ends, so an
//! interrupted run resumes with only the missing windows.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::harness::{Harness, HarnessError, WindowOutcome, Workload};
use crate::variant::Variant;

/// The order of windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// A B B A: variants forward on even repetitions, backward on odd ones.
    Abba,
    /// Each repetition a random permutation of the variants (seeded).
    Shuffled(u64),
}

/// One workload on one engine (or server, or `cmd` for a user's command).
#[derive(Clone, Debug)]
pub struct Task {
    pub engine: String,
    pub workload: Workload,
}

/// The engine of a window line that predates engines: ours (rbench) for engine tests,
/// rserve for serving sweeps.
pub fn default_engine(workload: &str) -> &'static str {
    if workload.starts_with("serve:") {
        "rserve"
    } else {
        "rllama"
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub variants: Vec<Variant>,
    pub tasks: Vec<Task>,
    pub reps: usize,
    pub cooldown: Duration,
    /// Extra attempts for a window whose proof failed.
    pub retries: usize,
    pub order: Order,
    pub take_over: bool,
}

/// One window's place in the plan.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WindowKey {
    pub rep: usize,
    pub variant: String,
    pub workload: String,
    pub engine: String,
}

impl Plan {
    /// The windows in run order: (repetition, variant index, task index). Within a
    /// repetition the variants run one after the other, each with every task; odd
    /// repetitions run that whole sequence backward, so each (variant, engine) pair sees
    /// the drift of the others from both sides.
    pub fn schedule(&self) -> Vec<(usize, usize, usize)> {
        let mut out = Vec::new();
        for rep in 0..self.reps {
            let mut vs: Vec<usize> = (0..self.variants.len()).collect();
            let backward = rep % 2 == 1;
            match self.order {
                Order::Abba => {}
                Order::Shuffled(seed) => {
                    // xorshift, seeded per repetition: reproducible, no dependency.
                    let mut s = seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(rep as u64 + 1)) | 1;
                    for i in (1..vs.len()).rev() {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        vs.swap(i, (s % (i as u64 + 1)) as usize);
                    }
                }
            }
            let mut this: Vec<(usize, usize, usize)> = vs
                .iter()
                .flat_map(|&v| (0..self.tasks.len()).map(move |t| (rep, v, t)))
                .collect();
            if backward {
                this.reverse();
            }
            out.extend(this);
        }
        out
    }

    /// The plan as recorded in the result file.
    pub fn to_json(&self) -> Value {
        json!({
            "variants": self.variants.iter().map(|v| v.label.clone()).collect::<Vec<_>>(),
            "workloads": unique(self.tasks.iter().map(|t| t.workload.name())),
            "engines": unique(self.tasks.iter().map(|t| t.engine.as_str())),
            "reps": self.reps,
            "cooldown_s": self.cooldown.as_secs_f64(),
            "retries": self.retries,
            "order": match self.order { Order::Abba => "abba".to_string(), Order::Shuffled(s) => format!("shuffled:{s}") },
        })
    }
}

fn unique<'a>(xs: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for x in xs {
        if !out.iter().any(|o| o == x) {
            out.push(x.to_string());
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error("result file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} holds results of machine {theirs} ({their_label}); this is {ours} ({our_label}): \
         resume on that machine or write a new file"
    )]
    OtherMachine {
        path: PathBuf,
        theirs: String,
        their_label: String,
        ours: String,
        our_label: String,
    },
    #[error("{path}:{line}: not a result line: {msg}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        msg: String,
    },
}

/// What an existing result file already holds.
#[derive(Debug, Default)]
pub struct Existing {
    pub machine: Option<(String, String)>,
    /// Attempts per window, and whether one was valid.
    pub windows: BTreeMap<WindowKey, (usize, bool)>,
}

/// Reads a result file (a missing file is empty).
pub fn read_existing(path: &Path) -> Result<Existing, PlanError> {
    let mut ex = Existing::default();
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ex),
        Err(source) => {
            return Err(PlanError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let lines: Vec<String> = BufReader::new(f)
        .lines()
        .collect::<Result<_, _>>()
        .map_err(|source| PlanError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let n = lines.len();
    for (i, l) in lines.iter().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(l) {
            Ok(v) => v,
            // A last line cut by a kill is ignored; anything else is corruption.
            Err(_) if i + 1 == n => continue,
            Err(e) => {
                return Err(PlanError::Corrupt {
                    path: path.to_path_buf(),
                    line: i + 1,
                    msg: e.to_string(),
                })
            }
        };
        match v["kind"].as_str() {
            Some("sched_run") => {
                let fp = &v["fingerprint"];
                ex.machine = Some((
                    fp["id"].as_str().unwrap_or_default().to_string(),
                    crate::fingerprint::label(fp),
                ));
            }
            Some("sched_window") => {
                let workload = v["workload"].as_str().unwrap_or_default().to_string();
                let key = WindowKey {
                    rep: v["rep"].as_u64().unwrap_or(0) as usize,
                    variant: v["variant"].as_str().unwrap_or_default().to_string(),
                    engine: v["engine"]
                        .as_str()
                        .unwrap_or(default_engine(&workload))
                        .to_string(),
                    workload,
                };
                let e = ex.windows.entry(key).or_insert((0, false));
                e.0 += 1;
                e.1 |= v["valid"].as_bool().unwrap_or(false);
            }
            _ => {
                return Err(PlanError::Corrupt {
                    path: path.to_path_buf(),
                    line: i + 1,
                    msg: "no sched_run / sched_window kind".into(),
                })
            }
        }
    }
    Ok(ex)
}

/// Turns a window's output into its metrics, and reasons to call it invalid (a workload
/// that printed no result, a `pinned` flag that does not match the variant).
pub type MetricsFn<'a> = dyn FnMut(&Variant, &Task, &WindowOutcome) -> (Value, Vec<String>) + 'a;

/// How a run went.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub windows_run: usize,
    pub valid: usize,
    pub invalid: usize,
    /// Windows the result file already had (resume).
    pub skipped: usize,
    /// Windows that stayed invalid after every retry.
    pub exhausted: usize,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn append(file: &mut File, path: &Path, v: &Value) -> Result<(), PlanError> {
    writeln!(file, "{v}")
        .and_then(|_| file.flush())
        .map_err(|source| PlanError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Interruptible sleep.
fn pause(d: Duration, abort: fn() -> bool) -> Result<(), HarnessError> {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        if abort() {
            return Err(HarnessError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50).min(d - t0.elapsed().min(d)));
    }
    Ok(())
}

/// Runs `plan` on `h`, appending to `path` (a run header, then a line per window).
/// `scx_bins` come from [`Harness::preflight`]; `metrics` turns a window's output into its
/// metrics (and reasons to call it invalid); `progress` gets a line per event. Windows
/// the file already has (valid, or out of attempts) are skipped.
pub fn run(
    h: &Harness,
    plan: &Plan,
    scx_bins: &BTreeMap<String, PathBuf>,
    path: &Path,
    fingerprint: &Value,
    metrics: &mut MetricsFn<'_>,
    progress: &mut dyn FnMut(&str),
) -> Result<Summary, PlanError> {
    let existing = read_existing(path)?;
    let ours = fingerprint["id"].as_str().unwrap_or_default().to_string();
    if let Some((theirs, their_label)) = &existing.machine {
        if *theirs != ours {
            return Err(PlanError::OtherMachine {
                path: path.to_path_buf(),
                theirs: theirs.clone(),
                their_label: their_label.clone(),
                ours,
                our_label: crate::fingerprint::label(fingerprint),
            });
        }
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| PlanError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    append(
        &mut file,
        path,
        &json!({
            "kind": "sched_run",
            "started_unix": unix_now(),
            "resumed": !existing.windows.is_empty(),
            "fingerprint": fingerprint,
            "plan": plan.to_json(),
        }),
    )?;
    let schedule = plan.schedule();
    let total = schedule.len();
    let mut sum = Summary::default();
    let mut first = true;
    for (i, &(rep, vi, ti)) in schedule.iter().enumerate() {
        let v = &plan.variants[vi];
        let task = &plan.tasks[ti];
        let w = &task.workload;
        let key = WindowKey {
            rep,
            variant: v.label.clone(),
            workload: w.name().to_string(),
            engine: task.engine.clone(),
        };
        let (mut attempts, done) = existing.windows.get(&key).copied().unwrap_or((0, false));
        if done || attempts > plan.retries {
            sum.skipped += 1;
            continue;
        }
        loop {
            if !first {
                pause(plan.cooldown, h.opts.abort)?;
            }
            first = false;
            attempts += 1;
            progress(&format!(
                "window {}/{total}: rep {} {} {} on {} (attempt {attempts})",
                i + 1,
                rep + 1,
                v.label,
                w.name(),
                task.engine
            ));
            let started = unix_now();
            let o = h.run_window(v, scx_bins.get(&v.label).map(PathBuf::as_path), w)?;
            let (m, extra) = metrics(v, task, &o);
            let mut reasons = o.reasons.clone();
            reasons.extend(extra);
            let valid = reasons.is_empty();
            append(
                &mut file,
                path,
                &json!({
                    "kind": "sched_window",
                    "machine": ours,
                    "variant": v.label,
                    "workload": w.name(),
                    "engine": task.engine,
                    "rep": rep,
                    "attempt": attempts,
                    "valid": valid,
                    "reasons": reasons,
                    "metrics": m,
                    "proof": o.proof,
                    "exit": o.exit,
                    "started_unix": started,
                    "duration_s": o.duration_s,
                }),
            )?;
            sum.windows_run += 1;
            if valid {
                sum.valid += 1;
                progress(&format!("  valid ({:.1} s)", o.duration_s));
                break;
            }
            sum.invalid += 1;
            progress(&format!("  INVALID: {}", reasons.join("; ")));
            if attempts > plan.retries {
                sum.exhausted += 1;
                break;
            }
        }
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(variants: &[&str], reps: usize) -> Plan {
        Plan {
            variants: variants
                .iter()
                .map(|v| Variant::parse(v).unwrap())
                .collect(),
            tasks: vec![Task {
                engine: "rllama".into(),
                workload: Workload::Command {
                    name: "w".into(),
                    argv: vec!["sh".into(), "-c".into(), "echo 1".into()],
                },
            }],
            reps,
            cooldown: Duration::from_millis(1),
            retries: 1,
            order: Order::Abba,
            take_over: false,
        }
    }

    #[test]
    fn abba_and_shuffled_orders() {
        let p = plan(&["eevdf", "policy:batch", "policy:idle"], 4);
        let order: Vec<usize> = p.schedule().iter().map(|&(_, v, _)| v).collect();
        assert_eq!(order, vec![0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0]);
        // Engines alternate too: every (variant, engine) pair runs first and last in turn.
        let mut two = plan(&["eevdf", "policy:batch"], 2);
        let mut llama = two.tasks[0].clone();
        llama.engine = "llamacpp".into();
        two.tasks.push(llama);
        let order: Vec<(usize, &str)> = two
            .schedule()
            .iter()
            .map(|&(_, v, t)| (v, two.tasks[t].engine.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (0, "rllama"),
                (0, "llamacpp"),
                (1, "rllama"),
                (1, "llamacpp"),
                (1, "llamacpp"),
                (1, "rllama"),
                (0, "llamacpp"),
                (0, "rllama")
            ]
        );
        let mut p = p;
        p.order = Order::Shuffled(7);
        let s1 = p.schedule();
        assert_eq!(s1, p.schedule(), "seeded");
        for rep in 0..4 {
            let mut vs: Vec<usize> = s1.iter().filter(|w| w.0 == rep).map(|w| w.1).collect();
            vs.sort_unstable();
            assert_eq!(vs, vec![0, 1, 2], "each repetition runs every variant once");
        }
    }

    fn harness(d: &Path) -> Harness {
        crate::harness::test_harness(d)
    }

    /// Runs `p` with a metrics hook that calls every window `bad` when it is non-empty.
    fn go(
        h: &Harness,
        p: &Plan,
        file: &Path,
        id: &str,
        bad: &[&str],
    ) -> Result<Summary, PlanError> {
        let bad: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
        run(
            h,
            p,
            &BTreeMap::new(),
            file,
            &fp(id),
            &mut |_, _, _| (json!({}), bad.clone()),
            &mut |_| {},
        )
    }

    fn fp(id: &str) -> Value {
        json!({"id": id, "hostname": "h", "cpu_model": "c", "logical_cpus": 2, "kernel_release": "6.12"})
    }

    #[test]
    fn runs_retries_and_resumes() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let file = d.path().join("r.jsonl");
        let p = plan(&["eevdf", "policy:batch"], 2);
        // The metrics hook fails policy:batch rep 1's first attempt.
        let mut calls = 0;
        let mut metrics = |_: &Variant, _: &Task, o: &WindowOutcome| {
            calls += 1;
            let bad = calls == 2;
            (
                json!({"out": o.stdout.trim()}),
                if bad {
                    vec!["made up".to_string()]
                } else {
                    vec![]
                },
            )
        };
        let s = run(
            &h,
            &p,
            &BTreeMap::new(),
            &file,
            &fp("m1"),
            &mut metrics,
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(
            s,
            Summary {
                windows_run: 5,
                valid: 4,
                invalid: 1,
                skipped: 0,
                exhausted: 0
            }
        );
        let ex = read_existing(&file).unwrap();
        assert_eq!(ex.windows.len(), 4);
        assert!(ex.windows.values().all(|&(_, ok)| ok));
        // Resume: nothing left to do.
        let s = go(&h, &p, &file, "m1", &[]).unwrap();
        assert_eq!((s.windows_run, s.skipped), (0, 4));
        // Another machine's file is refused.
        let e = go(&h, &p, &file, "m2", &[]).unwrap_err().to_string();
        assert!(e.contains("machine m1"), "{e}");
        // A longer plan resumed runs only the new windows.
        let p3 = plan(&["eevdf", "policy:batch"], 3);
        let s = go(&h, &p3, &file, "m1", &[]).unwrap();
        assert_eq!((s.windows_run, s.skipped), (2, 4));
    }

    #[test]
    fn exhausted_windows_stay_invalid_and_are_not_rerun() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let file = d.path().join("r.jsonl");
        let p = plan(&["eevdf"], 1);
        let s = go(&h, &p, &file, "m1", &["no"]).unwrap();
        assert_eq!((s.windows_run, s.invalid, s.exhausted), (2, 2, 1));
        let s = go(&h, &p, &file, "m1", &[]).unwrap();
        assert_eq!((s.windows_run, s.skipped), (0, 1));
    }

    #[test]
    fn a_torn_last_line_is_ignored_but_corruption_is_not() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("r.jsonl");
        std::fs::write(&f, "{\"kind\":\"sched_window\",\"rep\":0,\"variant\":\"eevdf\",\"workload\":\"w\",\"valid\":true}\n{\"kind\":\"sched_wi").unwrap();
        assert_eq!(read_existing(&f).unwrap().windows.len(), 1);
        std::fs::write(&f, "garbage\n{\"kind\":\"sched_run\",\"fingerprint\":{}}\n").unwrap();
        assert!(matches!(
            read_existing(&f),
            Err(PlanError::Corrupt { line: 1, .. })
        ));
    }
}
