//! One measured window: set the variant up (load a scheduler, create a cgroup), start the
//! background load, run the workload placed under the variant while sampling the proof
//! from the kernel's own files, then take everything down again and judge the proof.
//!
//! Setup failures that would repeat (no sched_ext, not root, a scheduler that exits at
//! once) end the plan with a one-line error; a proof that fails (the scheduler died or
//! was swapped mid-window, a thread not on the expected class or policy, the workload
//! failing) marks the window invalid with its reasons. Whatever happens, the scheduler is
//! stopped, the cgroup removed and every child killed before `run_window` returns, also
//! on Ctrl-C (the `Drop` guards do it on a panic).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cgroup::{self, CgroupChild, CgroupError};
use crate::interrupt;
use crate::placement::{is_root, Placement};
use crate::procfs::{self, ThreadSched};
use crate::roots::Roots;
use crate::sched_ext::{self, ops_matches, SchedExtState, ScxSnapshot};
use crate::scx::{self, ScxError, ScxRunning};
use crate::variant::{parse_cpu_list, Antagonist, Variant};

/// What runs in a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One process, placed under the variant; its stdout is the result.
    Command { name: String, argv: Vec<String> },
    /// A server placed under the variant and a client (not placed) run against it once
    /// `GET health_path` on `addr` answers 200; the client's stdout is the result. The
    /// optional warmup command runs first and is discarded (a failing warmup fails the
    /// window).
    Serve {
        name: String,
        server_argv: Vec<String>,
        addr: String,
        health_path: String,
        warmup_argv: Option<Vec<String>>,
        client_argv: Vec<String>,
    },
}

impl Workload {
    pub fn name(&self) -> &str {
        match self {
            Workload::Command { name, .. } | Workload::Serve { name, .. } => name,
        }
    }
}

/// How the harness behaves.
#[derive(Clone, Debug)]
pub struct HarnessOptions {
    /// Waiting for a scheduler to take over or let go.
    pub scx_timeout: Duration,
    /// The longest a workload may run before it is killed and the window invalid.
    pub window_timeout: Duration,
    /// Waiting for a server's health check.
    pub server_timeout: Duration,
    /// Where scheduler, server and antagonist output go.
    pub log_dir: PathBuf,
    /// Background load for every window.
    pub antagonist: Option<Antagonist>,
    /// The command that runs a spin/membw antagonist: `ARGV... spin N` (rbench's hidden
    /// `antagonist` subcommand).
    pub antagonist_argv: Vec<String>,
    /// How often the proof is sampled while the workload runs.
    pub sample_every: Duration,
    /// Asked between steps and in every wait: true ends the window with
    /// [`HarnessError::Interrupted`] (default: a SIGINT/SIGTERM arrived).
    pub abort: fn() -> bool,
}

impl Default for HarnessOptions {
    fn default() -> HarnessOptions {
        HarnessOptions {
            scx_timeout: Duration::from_secs(20),
            window_timeout: Duration::from_secs(3600),
            server_timeout: Duration::from_secs(300),
            log_dir: std::env::temp_dir(),
            antagonist: None,
            antagonist_argv: Vec::new(),
            sample_every: Duration::from_millis(100),
            abort: interrupt::interrupted,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(transparent)]
    Scx(#[from] ScxError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{variant}: {msg}")]
    Setup { variant: String, msg: String },
    #[error("starting {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("interrupted")]
    Interrupted,
}

impl HarnessError {
    /// A SIGINT/SIGTERM ended the run, whichever step it arrived in (between windows, in a
    /// window, or while a scheduler was starting or stopping).
    pub fn is_interrupted(&self) -> bool {
        matches!(
            self,
            HarnessError::Interrupted | HarnessError::Scx(ScxError::Interrupted)
        )
    }
}

/// The result of one window.
#[derive(Clone, Debug)]
pub struct WindowOutcome {
    pub valid: bool,
    /// Why the proof failed (empty when valid).
    pub reasons: Vec<String>,
    pub proof: Value,
    /// The workload's (or client's) stdout.
    pub stdout: String,
    /// The end of its stderr.
    pub stderr_tail: String,
    pub exit: String,
    pub duration_s: f64,
}

/// Runs windows on one machine.
pub struct Harness {
    pub roots: Roots,
    pub opts: HarnessOptions,
    seq: std::sync::atomic::AtomicUsize,
}

/// Kills a child's whole process group (children run in their own) and reaps it.
fn kill_group(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    // SAFETY: signalling the process group our child leads (setpgid in pre_exec).
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
    let _ = child.kill();
    let _ = child.wait();
}

/// Stops a server: SIGTERM to its group (graceful shutdown), SIGKILL after `grace`.
fn stop_group(child: &mut Child, grace: Duration) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    // SAFETY: as in `kill_group`.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM) };
    let t0 = Instant::now();
    while t0.elapsed() < grace {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_group(child);
}

/// A child killed (with its group) when dropped: no workload, server or antagonist
/// outlives a window, whatever path leaves it.
struct Guarded(Option<Child>);

impl Guarded {
    fn get(&mut self) -> &mut Child {
        self.0.as_mut().expect("child present")
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            kill_group(c);
        }
    }
}

fn read_tail(path: &Path, n: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    let t = s.trim_end();
    let mut i = t.len().saturating_sub(n);
    while !t.is_char_boundary(i) {
        i += 1;
    }
    t[i..].to_string()
}

/// `GET path` on `addr` answered with status 200.
fn healthy(addr: &str, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")
}

/// What sampling saw while the workload ran.
#[derive(Default)]
struct Samples {
    n: usize,
    /// Each thread's last reading.
    threads: BTreeMap<u32, ThreadSched>,
    max_threads: usize,
    /// sched_ext snapshots that differed from the one at the window's start.
    scx_changes: Vec<ScxSnapshot>,
    scheduler_died: bool,
    in_cgroup: bool,
    allowed: Option<(String, String)>,
    /// Every process of the workload's tree seen (the placed process, and whatever it
    /// started: a shell's child, a launcher's server): pid -> comm.
    procs: BTreeMap<u32, String>,
    /// The process of each thread, and its last CPU and memory-node lists.
    thread_pid: BTreeMap<u32, u32>,
    thread_allowed: BTreeMap<u32, (String, String)>,
    /// Processes of the tree seen alive outside the variant's cgroup.
    outside_cgroup: BTreeMap<u32, String>,
}

impl Harness {
    pub fn new(roots: Roots, opts: HarnessOptions) -> Harness {
        Harness {
            roots,
            opts,
            seq: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Checks every variant before anything runs, so a plan that cannot run fails at once
    /// with the fix, not after an hour: sched_ext and root for `scx:`, root for privileged
    /// policies, cgroup v2 with the right controllers, `numactl` on PATH. Returns the
    /// scheduler binaries' paths by variant label.
    pub fn preflight(
        &self,
        variants: &[Variant],
        take_over: bool,
    ) -> Result<BTreeMap<String, PathBuf>, HarnessError> {
        let mut bins = BTreeMap::new();
        for v in variants {
            let setup = |msg: String| HarnessError::Setup {
                variant: v.label.clone(),
                msg,
            };
            if let Some(spec) = &v.scx {
                bins.insert(v.label.clone(), scx::preflight(&self.roots, spec)?);
            }
            if let Some(p) = v.policy {
                if p.needs_privilege() && !is_root() {
                    return Err(setup(
                        "real-time policies and negative nice need root (CAP_SYS_NICE)".into(),
                    ));
                }
            }
            if !v.cgroup.is_empty() {
                cgroup::check(self.roots.cgroup2.as_deref(), &v.cgroup)?;
                if !is_root() {
                    return Err(setup("cgroup variants need root to create a cgroup".into()));
                }
            }
            if v.numactl.is_some() && crate::placement::find_binary("numactl").is_none() {
                return Err(setup(
                    "numactl is not installed (apt-get install numactl)".into(),
                ));
            }
            if let Some(a) = &v.affinity {
                let allowed = procfs::allowed_lists(&self.roots.proc, std::process::id())
                    .and_then(|(c, _)| parse_cpu_list(&c).ok())
                    .unwrap_or_default();
                if let Some(bad) = a.iter().find(|c| !allowed.contains(c)) {
                    return Err(setup(format!(
                        "CPU {bad} is outside this process's allowed CPUs {allowed:?}"
                    )));
                }
            }
        }
        let root = self.roots.sched_ext();
        let state = sched_ext::read(&root).map_err(ScxError::from)?.state;
        if let SchedExtState::Enabled { ops } = state {
            if take_over {
                scx::take_over(&self.roots, self.opts.scx_timeout)?;
                eprintln!("rbench sched: --take-over: stopped the sched_ext scheduler '{ops}' (it is not restarted afterwards)");
            } else {
                return Err(ScxError::AlreadyLoaded { ops }.into());
            }
        }
        Ok(bins)
    }

    fn log_path(&self, what: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.opts
            .log_dir
            .join(format!("sched-{}-{n}-{what}.log", std::process::id()))
    }

    fn start_antagonist(&self) -> Result<Option<Guarded>, HarnessError> {
        let Some(a) = &self.opts.antagonist else {
            return Ok(None);
        };
        let argv: Vec<String> = match a {
            Antagonist::Spin(n) | Antagonist::Membw(n) => {
                let mut v = self.opts.antagonist_argv.clone();
                v.push(
                    if matches!(a, Antagonist::Spin(_)) {
                        "spin"
                    } else {
                        "membw"
                    }
                    .into(),
                );
                v.push(n.to_string());
                v
            }
            Antagonist::Cmd(c) => vec!["sh".into(), "-c".into(), c.clone()],
        };
        let log =
            File::create(self.log_path("antagonist")).map_err(|source| HarnessError::Spawn {
                what: format!("antagonist {a}"),
                source,
            })?;
        let err = log.try_clone().map_err(|source| HarnessError::Spawn {
            what: format!("antagonist {a}"),
            source,
        })?;
        let child = Placement::default()
            .command(&argv)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|source| HarnessError::Spawn {
                what: format!("antagonist {a} ({})", argv.join(" ")),
                source,
            })?;
        Ok(Some(Guarded(Some(child))))
    }

    /// Runs `workload` once under `variant` (`scx_bin`: the scheduler's path from
    /// [`Harness::preflight`]).
    pub fn run_window(
        &self,
        variant: &Variant,
        scx_bin: Option<&Path>,
        workload: &Workload,
    ) -> Result<WindowOutcome, HarnessError> {
        let abort = self.opts.abort;
        let root = self.roots.sched_ext();
        let before = sched_ext::read(&root).map_err(ScxError::from)?;
        let mut reasons: Vec<String> = Vec::new();

        // Scheduler first: everything after runs under it.
        let mut running: Option<ScxRunning> = match (&variant.scx, scx_bin) {
            (Some(spec), Some(bin)) => Some(scx::start(
                &self.roots,
                spec,
                bin,
                &self.log_path("scx"),
                self.opts.scx_timeout,
                &abort,
            )?),
            (Some(spec), None) => {
                return Err(HarnessError::Setup {
                    variant: variant.label.clone(),
                    msg: format!("no path for {} (preflight not run)", spec.binary),
                })
            }
            _ => None,
        };
        let start_snap = match &running {
            Some(r) => r.started.clone(),
            None => before.clone(),
        };
        let cg = if variant.cgroup.is_empty() {
            None
        } else {
            let root = self
                .roots
                .cgroup2
                .as_deref()
                .ok_or(CgroupError::Unavailable {
                    controller: "cpu",
                    where_: "is not mounted (cgroup v1 only)".into(),
                })?;
            let name = format!(
                "rbench-sched-{}-{}",
                std::process::id(),
                self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            Some(CgroupChild::create(root, &name, &variant.cgroup)?)
        };
        let stat_before = cg.as_ref().map(|c| c.cpu_stat());
        let placement = Placement {
            policy: variant.policy,
            affinity: variant.affinity.clone(),
            cgroup_procs: cg.as_ref().map(|c| c.procs_file()),
            numactl: variant.numactl.clone(),
            death_signal: None,
            // Our pool's pinning switch (`RLLAMA_NO_PIN`), read by rbench and rserve.
            env: {
                let mut env = match variant.pin {
                    Some(false) => vec![("RLLAMA_NO_PIN".into(), Some("1".into()))],
                    Some(true) => vec![("RLLAMA_NO_PIN".into(), None)],
                    None => vec![],
                };
                // NUMA placement of our runtime, read by rbench, rserve and rllama.
                if let Some(m) = &variant.numa {
                    env.push(("RLLAMA_NUMA".into(), Some(m.clone())));
                }
                if let Some(w) = &variant.weights {
                    env.push(("RLLAMA_NUMA_WEIGHTS".into(), Some(w.clone())));
                }
                env
            },
        };
        let _antagonist = self.start_antagonist()?;

        let t0 = Instant::now();
        let out_path = self.log_path("stdout");
        let err_path = self.log_path("stderr");
        let files = || -> std::io::Result<(File, File)> {
            Ok((File::create(&out_path)?, File::create(&err_path)?))
        };
        let (out, err) = files().map_err(|source| HarnessError::Spawn {
            what: "workload output files".into(),
            source,
        })?;
        // The placed process (whose threads are proven) and the one whose end ends the
        // window (the same, or the serving client).
        let (mut placed, mut measured, server_log): (Guarded, Option<Guarded>, Option<PathBuf>) =
            match workload {
                Workload::Command { argv, .. } => {
                    let c = placement
                        .command(argv)
                        .stdin(Stdio::null())
                        .stdout(out)
                        .stderr(err)
                        .spawn()
                        .map_err(|source| HarnessError::Spawn {
                            what: format!("workload `{}`", argv.join(" ")),
                            source,
                        })?;
                    (Guarded(Some(c)), None, None)
                }
                Workload::Serve {
                    server_argv,
                    addr,
                    health_path,
                    warmup_argv,
                    client_argv,
                    ..
                } => {
                    let slog = self.log_path("server");
                    let sf = File::create(&slog).map_err(|source| HarnessError::Spawn {
                        what: "server log".into(),
                        source,
                    })?;
                    let sf2 = sf.try_clone().map_err(|source| HarnessError::Spawn {
                        what: "server log".into(),
                        source,
                    })?;
                    let server = placement
                        .command(server_argv)
                        .stdin(Stdio::null())
                        .stdout(sf)
                        .stderr(sf2)
                        .spawn()
                        .map_err(|source| HarnessError::Spawn {
                            what: format!("server `{}`", server_argv.join(" ")),
                            source,
                        })?;
                    let mut server = Guarded(Some(server));
                    let ready = Instant::now();
                    loop {
                        if healthy(addr, health_path) {
                            break;
                        }
                        if let Ok(Some(st)) = server.get().try_wait() {
                            reasons.push(format!(
                                "server exited before it was healthy ({st}): {}",
                                read_tail(&slog, 300).replace('\n', " | ")
                            ));
                            break;
                        }
                        if ready.elapsed() > self.opts.server_timeout {
                            reasons.push(format!(
                                "server not healthy after {:.0} s",
                                self.opts.server_timeout.as_secs_f64()
                            ));
                            break;
                        }
                        if abort() {
                            return Err(HarnessError::Interrupted);
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    if let (true, Some(w)) = (reasons.is_empty(), warmup_argv) {
                        let mut c = Guarded(Some(
                            Placement::default()
                                .command(w)
                                .stdin(Stdio::null())
                                .stdout(Stdio::null())
                                .stderr(Stdio::null())
                                .spawn()
                                .map_err(|source| HarnessError::Spawn {
                                    what: format!("warmup `{}`", w.join(" ")),
                                    source,
                                })?,
                        ));
                        loop {
                            if let Ok(Some(st)) = c.get().try_wait() {
                                if !st.success() {
                                    reasons.push(format!("the warmup request failed ({st})"));
                                }
                                break;
                            }
                            if abort() {
                                return Err(HarnessError::Interrupted);
                            }
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                    let client = if reasons.is_empty() {
                        let c = Placement::default()
                            .command(client_argv)
                            .stdin(Stdio::null())
                            .stdout(out)
                            .stderr(err)
                            .spawn()
                            .map_err(|source| HarnessError::Spawn {
                                what: format!("client `{}`", client_argv.join(" ")),
                                source,
                            })?;
                        Some(Guarded(Some(c)))
                    } else {
                        None
                    };
                    (server, client, Some(slog))
                }
            };
        let pid = placed.get().id();

        // Run and sample.
        let mut s = Samples::default();
        let mut status: Option<ExitStatus> = None;
        let mut timed_out = false;
        loop {
            self.sample(pid, &start_snap, running.as_mut(), cg.as_ref(), &mut s);
            let done = match measured.as_mut() {
                Some(m) => m.get().try_wait().ok().flatten(),
                None => placed.get().try_wait().ok().flatten(),
            };
            if let Some(st) = done {
                status = Some(st);
                break;
            }
            if !reasons.is_empty()
                && measured.is_none()
                && matches!(workload, Workload::Serve { .. })
            {
                break; // the server never became healthy: no client ran
            }
            if measured.is_some() {
                // A server that dies mid-window fails the window.
                if let Ok(Some(st)) = placed.get().try_wait() {
                    reasons.push(format!("server exited mid-window ({st})"));
                }
            }
            if t0.elapsed() > self.opts.window_timeout {
                timed_out = true;
                break;
            }
            if abort() {
                return Err(HarnessError::Interrupted);
            }
            std::thread::sleep(self.opts.sample_every);
        }
        let duration_s = t0.elapsed().as_secs_f64();
        let end_snap = sched_ext::read(&root).map_err(ScxError::from)?;
        let alive_at_end = running.as_mut().map(|r| r.alive());
        let stat_after = cg.as_ref().map(|c| c.cpu_stat());
        let cgroup_path = cg.as_ref().map(|c| c.path().display().to_string());

        // Take down in reverse order.
        if let Some(m) = measured.as_mut() {
            kill_group(m.get());
        }
        if matches!(workload, Workload::Serve { .. }) {
            stop_group(placed.get(), Duration::from_secs(10));
        } else {
            kill_group(placed.get());
        }
        drop(_antagonist);
        if let Some(c) = cg {
            c.remove()?;
        }
        let released = match running.take() {
            Some(r) => Some(r.stop(self.opts.scx_timeout)?),
            None => None,
        };

        // Judge.
        if timed_out {
            reasons.push(format!(
                "workload ran past {:.0} s and was killed",
                self.opts.window_timeout.as_secs_f64()
            ));
        }
        let exit = status.map_or("killed".to_string(), |st| st.to_string());
        if let Some(st) = status {
            if !st.success() {
                reasons.push(format!(
                    "workload exited with {st}: {}",
                    read_tail(&err_path, 300).replace('\n', " | ")
                ));
            }
        }
        self.judge(
            variant,
            &start_snap,
            &end_snap,
            alive_at_end,
            &s,
            &mut reasons,
        );
        if !variant.cgroup.is_empty() && !s.in_cgroup {
            reasons.push("the workload never appeared in its cgroup's cgroup.procs".into());
        }
        if let (Some(want), Some((cpus, _))) = (&variant.affinity, &s.allowed) {
            if parse_cpu_list(cpus).ok().as_ref() != Some(want) {
                reasons.push(format!("Cpus_allowed_list is {cpus}, not {want:?}"));
            }
        }
        if let Some(want) = &variant.affinity {
            // A thread may narrow its mask (a pinned pool, llama.cpp's --cpu-mask) but
            // never leave the variant's CPUs.
            let out: Vec<String> = s
                .thread_allowed
                .iter()
                .filter(|(_, (cpus, _))| {
                    parse_cpu_list(cpus).map_or(true, |c| c.iter().any(|x| !want.contains(x)))
                })
                .map(|(tid, (cpus, _))| {
                    let comm = s.threads.get(tid).map_or("?", |t| t.comm.as_str());
                    format!("{tid} ({comm}) on {cpus}")
                })
                .collect();
            if !out.is_empty() {
                reasons.push(format!(
                    "threads escaped the variant's CPUs {want:?}: {}",
                    out.join(", ")
                ));
            }
        }
        if !s.outside_cgroup.is_empty() {
            reasons.push(format!(
                "processes of the workload ran outside its cgroup: {}",
                s.outside_cgroup
                    .iter()
                    .map(|(p, c)| format!("{p} ({c})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let threads: Vec<Value> = s
            .threads
            .values()
            .map(|t| {
                let a = s.thread_allowed.get(&t.tid);
                json!({"tid": t.tid, "pid": s.thread_pid.get(&t.tid), "comm": t.comm,
                       "policy": t.policy, "prio": t.prio, "ext_enabled": t.ext_enabled,
                       "cpus": a.map(|a| &a.0), "mems": a.map(|a| &a.1)})
            })
            .collect();
        let processes: Vec<Value> = s
            .procs
            .iter()
            .map(|(p, c)| json!({"pid": p, "comm": c}))
            .collect();
        let proof = json!({
            "before": before.to_json(),
            "start": start_snap.to_json(),
            "end": end_snap.to_json(),
            "released": released.as_ref().map(ScxSnapshot::to_json),
            "scheduler_pid_alive_at_end": alive_at_end,
            "scx_changes": s.scx_changes.iter().map(ScxSnapshot::to_json).collect::<Vec<_>>(),
            "samples": s.n,
            "max_threads": s.max_threads,
            "processes": processes,
            "threads": threads,
            "cpus_allowed": s.allowed.as_ref().map(|a| a.0.clone()),
            "mems_allowed": s.allowed.as_ref().map(|a| a.1.clone()),
            "cgroup": cgroup_path.map(|p| json!({
                "path": p,
                "workload_in_procs": s.in_cgroup,
                "cpu_stat_before": stat_before,
                "cpu_stat_after": stat_after,
            })),
            "antagonist": self.opts.antagonist.as_ref().map(|a| a.to_string()),
            "server_log": server_log.map(|p| p.display().to_string()),
        });
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr_tail = read_tail(&err_path, 2000);
        let _ = std::fs::remove_file(&out_path);
        let _ = std::fs::remove_file(&err_path);
        Ok(WindowOutcome {
            valid: reasons.is_empty(),
            reasons,
            proof,
            stdout,
            stderr_tail,
            exit,
            duration_s,
        })
    }

    /// One sampling pass over the placed process and the scheduler.
    fn sample(
        &self,
        pid: u32,
        start: &ScxSnapshot,
        running: Option<&mut ScxRunning>,
        cg: Option<&CgroupChild>,
        s: &mut Samples,
    ) {
        s.n += 1;
        let proc = &self.roots.proc;
        // The whole tree: a foreign engine behind a shell or a launcher is a grandchild,
        // and its threads are the ones the variant must reach.
        let tree = procfs::process_tree(proc, pid);
        let members = cg.map(|c| c.procs());
        let mut n_threads = 0;
        for &p in &tree {
            let ts = procfs::all_thread_sched(proc, p);
            if ts.is_empty() {
                continue; // gone between the scan and now
            }
            n_threads += ts.len();
            let comm = std::fs::read_to_string(proc.join(p.to_string()).join("comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default();
            if let Some(m) = &members {
                if !m.contains(&p) && procfs::alive(proc, p) {
                    s.outside_cgroup.insert(p, comm.clone());
                }
            }
            s.procs.insert(p, comm);
            for t in ts {
                if let Some(a) = procfs::thread_allowed_lists(proc, p, t.tid) {
                    s.thread_allowed.insert(t.tid, a);
                }
                s.thread_pid.insert(t.tid, p);
                s.threads.insert(t.tid, t);
            }
        }
        s.max_threads = s.max_threads.max(n_threads);
        // /proc/PID/status is the main thread's: already read above.
        if let Some(a) = s.thread_allowed.get(&pid) {
            s.allowed = Some(a.clone());
        }
        if let Ok(now) = sched_ext::read(&self.roots.sched_ext()) {
            if &now != start && s.scx_changes.last() != Some(&now) {
                s.scx_changes.push(now);
            }
        }
        if let Some(r) = running {
            if !r.alive() {
                s.scheduler_died = true;
            }
        }
        if members.is_some_and(|m| m.contains(&pid)) {
            s.in_cgroup = true;
        }
    }

    /// The scheduler and thread proofs of a window.
    fn judge(
        &self,
        v: &Variant,
        start: &ScxSnapshot,
        end: &ScxSnapshot,
        alive_at_end: Option<bool>,
        s: &Samples,
        reasons: &mut Vec<String>,
    ) {
        if s.threads.is_empty() {
            reasons.push("no thread of the workload could be read from /proc".into());
        }
        match &v.scx {
            Some(spec) => {
                let name = sched_ext::ops_name_of(&spec.binary);
                for (when, snap) in [("start", start), ("end", end)] {
                    match &snap.state {
                        SchedExtState::Enabled { ops } if ops_matches(ops, &name) => {}
                        other => reasons.push(format!(
                            "sched_ext at the window's {when} was {} {}, not '{name}'",
                            other.name(),
                            match other {
                                SchedExtState::Enabled { ops } => format!("with ops '{ops}'"),
                                _ => String::new(),
                            }
                        )),
                    }
                }
                if start.enable_seq != end.enable_seq {
                    reasons.push(format!(
                        "enable_seq moved from {:?} to {:?}: a scheduler was unloaded and loaded during the window",
                        start.enable_seq, end.enable_seq
                    ));
                }
                if !s.scx_changes.is_empty() {
                    reasons.push(format!(
                        "sched_ext changed during the window: {}",
                        s.scx_changes
                            .iter()
                            .map(|c| c.to_json().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                if s.scheduler_died || alive_at_end == Some(false) {
                    reasons.push(format!("{} exited during the window", spec.binary));
                }
                let off: Vec<u32> = s
                    .threads
                    .values()
                    .filter(|t| t.ext_enabled != Some(true))
                    .map(|t| t.tid)
                    .collect();
                if !off.is_empty() {
                    reasons.push(format!(
                        "threads {off:?} of the workload were not on sched_ext (ext.enabled != 1)"
                    ));
                }
            }
            None => {
                for (when, snap) in [("start", start), ("end", end)] {
                    if let SchedExtState::Enabled { ops } = &snap.state {
                        reasons.push(format!(
                            "a sched_ext scheduler ('{ops}') was loaded at the window's {when}; \
                             this variant runs on the fair class"
                        ));
                    }
                }
                if !s.scx_changes.is_empty() {
                    reasons.push("sched_ext changed during a fair-class window".into());
                }
                let on_ext: Vec<u32> = s
                    .threads
                    .values()
                    .filter(|t| t.ext_enabled == Some(true))
                    .map(|t| t.tid)
                    .collect();
                if !on_ext.is_empty() {
                    reasons.push(format!(
                        "threads {on_ext:?} ran on sched_ext in a fair-class window"
                    ));
                }
            }
        }
        if let Some(p) = v.policy {
            let bad: Vec<String> = s
                .threads
                .values()
                .filter(|t| {
                    t.policy != p.number()
                        || (!matches!(
                            p,
                            crate::variant::Policy::Idle | crate::variant::Policy::Ext
                        ) && t.prio != p.expected_prio())
                })
                .map(|t| format!("{}:{}/{}", t.tid, t.policy, t.prio))
                .collect();
            if !bad.is_empty() {
                reasons.push(format!(
                    "threads not at policy {} prio {} (tid:policy/prio): {}",
                    p.number(),
                    p.expected_prio(),
                    bad.join(" ")
                ));
            }
        }
    }
}

/// A harness on a fake sched_ext tree under `d` (and the real /proc: workloads are real
/// processes), for tests.
#[cfg(test)]
pub(crate) fn test_harness(d: &Path) -> Harness {
    let mut roots = Roots::under(d);
    roots.proc = PathBuf::from("/proc");
    crate::sched_ext::fake::set(&roots.sched_ext(), "disabled", None, Some(1));
    Harness::new(
        roots,
        HarnessOptions {
            log_dir: d.to_path_buf(),
            sample_every: Duration::from_millis(20),
            ..Default::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched_ext::fake;

    fn harness(d: &Path) -> Harness {
        test_harness(d)
    }

    fn sh(name: &str, script: &str) -> Workload {
        Workload::Command {
            name: name.into(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
        }
    }

    #[test]
    fn fair_class_window_with_a_policy_is_proven() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let v = Variant::parse("policy:batch").unwrap();
        let o = h
            .run_window(&v, None, &sh("w", "sleep 0.3; echo '{\"ok\":1}'"))
            .unwrap();
        assert!(o.valid, "{:?}", o.reasons);
        assert_eq!(o.stdout.trim(), "{\"ok\":1}");
        assert!(o.proof["threads"][0]["policy"] == 3, "{}", o.proof);
        assert_eq!(o.proof["start"]["state"], "disabled");
    }

    #[test]
    fn a_loaded_scheduler_invalidates_a_fair_window_and_failures_are_reasons() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let ext = h.roots.sched_ext();
        let v = Variant::parse("eevdf").unwrap();
        // Something loads a scheduler mid-window.
        let script = format!(
            "sleep 0.1; echo enabled > {e}/state; echo simple > {e}/root/ops; sleep 0.2",
            e = ext.display()
        );
        let o = h.run_window(&v, None, &sh("w", &script)).unwrap();
        assert!(!o.valid);
        assert!(
            o.reasons
                .iter()
                .any(|r| r.contains("'simple'") && r.contains("fair class")),
            "{:?}",
            o.reasons
        );
        fake::set(&ext, "disabled", None, Some(1));
        let o = h
            .run_window(&v, None, &sh("w", "echo boom >&2; exit 3"))
            .unwrap();
        assert!(!o.valid);
        assert!(
            o.reasons[0].contains("exit status: 3") && o.reasons[0].contains("boom"),
            "{:?}",
            o.reasons
        );
    }

    #[test]
    fn grandchildren_are_proven_and_their_escapes_caught() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        // The engine behind a launcher: `sh -c` starts a child shell that runs the
        // "engine" (a sleep); its threads are in the proof, with their process.
        let v = Variant::parse("policy:batch").unwrap();
        let o = h
            .run_window(&v, None, &sh("w", "sh -c 'sleep 0.4; true'; true"))
            .unwrap();
        assert!(o.valid, "{:?}", o.reasons);
        let comms: Vec<&str> = o.proof["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["comm"].as_str())
            .collect();
        assert!(comms.contains(&"sleep"), "{comms:?}");
        assert!(
            o.proof["threads"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["policy"] == 3 && t["pid"].is_u64() && t["cpus"].is_string()),
            "{}",
            o.proof
        );
        // A grandchild that leaves the variant's policy invalidates the window.
        if crate::placement::find_binary("chrt").is_some() {
            let o = h
                .run_window(&v, None, &sh("w", "sh -c 'chrt -o 0 sleep 0.4'; true"))
                .unwrap();
            assert!(
                o.reasons.iter().any(|r| r.contains("not at policy 3")),
                "{:?}",
                o.reasons
            );
        }
        // And one that moves itself off the variant's CPUs.
        let cpus = crate::procfs::allowed_lists(Path::new("/proc"), std::process::id())
            .and_then(|(c, _)| parse_cpu_list(&c).ok())
            .unwrap_or_default();
        if cpus.len() >= 2 && crate::placement::find_binary("taskset").is_some() {
            let v = Variant::parse(&format!("affinity:{}", cpus[0])).unwrap();
            let o = h
                .run_window(
                    &v,
                    None,
                    &sh(
                        "w",
                        &format!("sh -c 'taskset -c {} sleep 0.4'; true", cpus[1]),
                    ),
                )
                .unwrap();
            assert!(
                o.reasons
                    .iter()
                    .any(|r| r.contains("escaped the variant's CPUs") && r.contains("sleep")),
                "{:?}",
                o.reasons
            );
        }
    }

    #[test]
    fn a_policy_that_did_not_apply_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        // The workload switches itself back to SCHED_OTHER: the proof must notice.
        let v = Variant::parse("policy:idle").unwrap();
        let o = h
            .run_window(&v, None, &sh("w", "chrt -o -p 0 $$ 2>/dev/null; sleep 0.3"))
            .unwrap();
        if crate::placement::find_binary("chrt").is_some() {
            assert!(!o.valid, "{:?}", o.proof);
            assert!(
                o.reasons.iter().any(|r| r.contains("not at policy 5")),
                "{:?}",
                o.reasons
            );
        }
    }

    #[test]
    fn interrupt_kills_the_workload_and_returns() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let v = Variant::parse("eevdf").unwrap();
        static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let mut h = h;
        h.opts.abort = || STOP.load(std::sync::atomic::Ordering::SeqCst);
        let t = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            STOP.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let t0 = Instant::now();
        let r = h.run_window(&v, None, &sh("w", "sleep 30"));
        t.join().unwrap();
        assert!(matches!(r, Err(HarnessError::Interrupted)));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    fn scx_variant(h: &Harness, d: &Path, ops: &str, behave: &str) -> (Variant, PathBuf) {
        let bin = crate::scx::testutil::fake_scheduler(d, &h.roots.sched_ext(), ops, behave);
        (Variant::parse(&format!("scx:scx_{ops}")).unwrap(), bin)
    }

    /// The scheduler is in charge for the whole window; the only failing proof left on a
    /// host without sched_ext is the threads' `ext.enabled`, which the real kernel
    /// provides (the lab test proves that part).
    #[test]
    fn scx_window_proves_the_scheduler_and_releases_it() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let (v, bin) = scx_variant(&h, d.path(), "simple", "good");
        let o = h.run_window(&v, Some(&bin), &sh("w", "sleep 0.3")).unwrap();
        assert_eq!(o.proof["start"]["ops"], "simple_1.0_x86", "{}", o.proof);
        assert_eq!(o.proof["end"]["ops"], "simple_1.0_x86");
        assert_eq!(o.proof["start"]["enable_seq"], o.proof["end"]["enable_seq"]);
        assert_eq!(o.proof["released"]["state"], "disabled");
        assert_eq!(o.proof["scheduler_pid_alive_at_end"], true);
        assert!(
            o.reasons.iter().all(|r| r.contains("ext.enabled")),
            "only the thread proof may fail here: {:?}",
            o.reasons
        );
        assert_eq!(
            crate::sched_ext::read_state(&h.roots.sched_ext()).unwrap(),
            SchedExtState::Disabled
        );
    }

    /// A SIGINT that lands while the scheduler is still starting comes back as the
    /// scheduler step's own interruption: it must count as one (rbench sched exits 130 for
    /// it, as the lab test checks), and no scheduler may stay behind.
    #[test]
    fn an_interrupt_while_the_scheduler_starts_is_an_interruption() {
        let d = tempfile::tempdir().unwrap();
        let mut h = harness(d.path());
        let (v, bin) = scx_variant(&h, d.path(), "qmap", "idle");
        h.opts.abort = || true;
        let t0 = Instant::now();
        let e = h
            .run_window(&v, Some(&bin), &sh("w", "sleep 30"))
            .unwrap_err();
        assert!(e.is_interrupted(), "{e:?}");
        assert!(
            matches!(e, HarnessError::Scx(ScxError::Interrupted)),
            "{e:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(8), "bounded");
        assert_eq!(
            crate::sched_ext::read_state(&h.roots.sched_ext()).unwrap(),
            SchedExtState::Disabled
        );
    }

    #[test]
    fn a_scheduler_dying_mid_window_invalidates_it() {
        let d = tempfile::tempdir().unwrap();
        let h = harness(d.path());
        let (v, bin) = scx_variant(&h, d.path(), "qmap", "dies_later");
        let o = h.run_window(&v, Some(&bin), &sh("w", "sleep 0.8")).unwrap();
        assert!(!o.valid);
        assert!(
            o.reasons
                .iter()
                .any(|r| r.contains("exited during the window")),
            "{:?}",
            o.reasons
        );
        assert!(
            o.reasons
                .iter()
                .any(|r| r.contains("window's end was disabled")),
            "{:?}",
            o.reasons
        );
    }

    #[test]
    fn an_ops_mismatch_never_counts_as_taking_over() {
        let d = tempfile::tempdir().unwrap();
        let mut h = harness(d.path());
        h.opts.scx_timeout = Duration::from_millis(600);
        let (v, bin) = scx_variant(&h, d.path(), "central", "mismatch");
        let e = h
            .run_window(&v, Some(&bin), &sh("w", "true"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("did not take over") && e.contains("'other'"),
            "{e}"
        );
        // The guard stopped it: the fake sysfs is back to disabled.
        assert_eq!(
            crate::sched_ext::read_state(&h.roots.sched_ext()).unwrap(),
            SchedExtState::Disabled
        );
    }
}
