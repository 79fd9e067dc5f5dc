//! What an experiment compares: scheduler variants (`eevdf`, `scx:NAME[:ARGS]`,
//! `policy:…`, `cgroup:…`, `affinity:…`, `pinned` / `unpinned`, `numactl:…`, combined with
//! `+`) and the optional background load (`--antagonist`).

use std::fmt;

/// A sched_ext scheduler to load for the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScxSpec {
    /// Binary name (looked up on PATH) or path, e.g. `scx_simple`.
    pub binary: String,
    pub args: Vec<String>,
}

/// A scheduling policy set with `sched_setattr` on the workload (inherited by every
/// thread it creates).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER` at nice N.
    Nice(i32),
    Batch,
    Idle,
    /// `SCHED_FIFO` at real-time priority 1..=99.
    Fifo(u32),
    Rr(u32),
    /// `SCHED_EXT` (falls back to the fair class while no BPF scheduler is loaded).
    Ext,
}

impl Policy {
    /// The kernel's policy number.
    pub fn number(self) -> u32 {
        match self {
            Policy::Nice(_) => 0,
            Policy::Fifo(_) => 1,
            Policy::Rr(_) => 2,
            Policy::Batch => 3,
            Policy::Idle => 5,
            Policy::Ext => 7,
        }
    }

    /// The `prio` `/proc/<pid>/sched` shows for a thread under this policy, where it is
    /// fixed (`SCHED_IDLE` threads keep their nice prio, which we leave at 0).
    pub fn expected_prio(self) -> i32 {
        match self {
            Policy::Nice(n) => 120 + n,
            Policy::Fifo(p) | Policy::Rr(p) => 99 - p as i32,
            Policy::Batch | Policy::Idle | Policy::Ext => 120,
        }
    }

    /// Whether setting it needs privilege (`CAP_SYS_NICE`): real-time policies and
    /// negative nice values.
    pub fn needs_privilege(self) -> bool {
        matches!(self, Policy::Fifo(_) | Policy::Rr(_)) || matches!(self, Policy::Nice(n) if n < 0)
    }
}

/// One setting of the cgroup v2 child the workload runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupSetting {
    /// `cpu.max`: `quota` µs (None = `max`) per `period` µs.
    CpuMax { quota: Option<u64>, period: u64 },
    /// `cpuset.cpus` and optionally `cpuset.mems`.
    Cpuset { cpus: String, mems: Option<String> },
    /// `cpu.weight` (1..=10000).
    Weight(u32),
}

/// One compared configuration: the parts of its label, each applied to the workload.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Variant {
    /// As written (the key in results and reports).
    pub label: String,
    pub scx: Option<ScxSpec>,
    pub policy: Option<Policy>,
    pub cgroup: Vec<CgroupSetting>,
    /// CPUs the workload may run on (`sched_setaffinity`).
    pub affinity: Option<Vec<usize>>,
    /// Our pool's pinning: Some(false) passes `--no-pin`.
    pub pin: Option<bool>,
    /// The workload runs under `numactl ARGS`.
    pub numactl: Option<Vec<String>>,
    /// Our runtime's NUMA thread placement (`numa:distribute|isolate|numactl`), passed as
    /// `RLLAMA_NUMA` (the default of `--numa` in rbench, rserve and rllama).
    pub numa: Option<String>,
    /// Our runtime's weight placement (`weights:first-touch|interleave|replicate`), passed
    /// as `RLLAMA_NUMA_WEIGHTS`.
    pub weights: Option<String>,
}

/// The values of `numa:` and `weights:` parts (the runtime's `--numa` / `--numa-weights`).
pub const NUMA_MODES: [&str; 3] = ["distribute", "isolate", "numactl"];
pub const WEIGHT_PLACEMENTS: [&str; 3] = ["first-touch", "interleave", "replicate"];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("variant '{variant}': {msg}")]
pub struct VariantError {
    pub variant: String,
    pub msg: String,
}

impl Variant {
    /// Parses `eevdf`, `scx:NAME[:ARGS]`, `policy:batch|idle|fifo:P|rr:P|nice:N|ext`,
    /// `cgroup:cpu.max=QUOTA/PERIOD|cpuset=CPUS[:MEMS]|weight=W`, `affinity:CPULIST`,
    /// `pinned`, `unpinned`, `numactl:ARGS`, `numa:MODE`, `weights:PLACEMENT`, or several
    /// of them joined by `+`.
    pub fn parse(s: &str) -> Result<Variant, VariantError> {
        let label = s.trim().to_string();
        let err = |msg: String| VariantError {
            variant: label.clone(),
            msg,
        };
        if label.is_empty() {
            return Err(err("empty variant".into()));
        }
        let mut v = Variant {
            label: label.clone(),
            ..Default::default()
        };
        for part in label.split('+') {
            let (kind, rest) = part.split_once(':').unwrap_or((part, ""));
            match kind {
                "eevdf" | "fair" | "default" if rest.is_empty() => {}
                "pinned" if rest.is_empty() => v.pin = Some(true),
                "unpinned" if rest.is_empty() => v.pin = Some(false),
                "scx" => {
                    if v.scx.is_some() {
                        return Err(err("at most one scx scheduler per variant".into()));
                    }
                    let (bin, args) = rest.split_once(':').unwrap_or((rest, ""));
                    if bin.is_empty() {
                        return Err(err("scx: needs a scheduler binary, e.g. scx:scx_simple".into()));
                    }
                    v.scx = Some(ScxSpec {
                        binary: bin.to_string(),
                        args: args.split_whitespace().map(String::from).collect(),
                    });
                }
                "policy" => {
                    if v.policy.is_some() {
                        return Err(err("at most one policy per variant".into()));
                    }
                    v.policy = Some(parse_policy(rest).map_err(err)?);
                }
                "cgroup" => v.cgroup.push(parse_cgroup(rest).map_err(err)?),
                "affinity" => {
                    v.affinity = Some(parse_cpu_list(rest).map_err(err)?);
                }
                "numa" => {
                    if !NUMA_MODES.contains(&rest) {
                        return Err(err(format!(
                            "numa:{rest}: expected one of {}",
                            NUMA_MODES.join(", ")
                        )));
                    }
                    v.numa = Some(rest.to_string());
                }
                "weights" => {
                    if !WEIGHT_PLACEMENTS.contains(&rest) {
                        return Err(err(format!(
                            "weights:{rest}: expected one of {}",
                            WEIGHT_PLACEMENTS.join(", ")
                        )));
                    }
                    v.weights = Some(rest.to_string());
                }
                "numactl" => {
                    let args: Vec<String> = rest.split_whitespace().map(String::from).collect();
                    if args.is_empty() {
                        return Err(err("numactl: needs arguments, e.g. numactl:--cpunodebind=0".into()));
                    }
                    v.numactl = Some(args);
                }
                _ => {
                    return Err(err(format!(
                        "unknown part '{part}' (eevdf, scx:NAME[:ARGS], policy:batch|idle|fifo:P|rr:P|nice:N|ext, \
                         cgroup:cpu.max=Q/P|cpuset=CPUS[:MEMS]|weight=W, affinity:CPUS, pinned, unpinned, numactl:ARGS, \
                         numa:distribute|isolate|numactl, weights:first-touch|interleave|replicate)"
                    )))
                }
            }
        }
        Ok(v)
    }

    /// True for a variant that runs on the kernel's fair class (no scx part): the proof
    /// then demands that no sched_ext scheduler is loaded during the window.
    pub fn expects_fair_class(&self) -> bool {
        self.scx.is_none()
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label)
    }
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    let (name, arg) = s.split_once(':').unwrap_or((s, ""));
    let num = |lo: i64, hi: i64| -> Result<i64, String> {
        arg.parse::<i64>()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| format!("policy:{name} needs a number in {lo}..={hi}, got '{arg}'"))
    };
    Ok(match name {
        "batch" if arg.is_empty() => Policy::Batch,
        "idle" if arg.is_empty() => Policy::Idle,
        "ext" if arg.is_empty() => Policy::Ext,
        "other" if arg.is_empty() => Policy::Nice(0),
        "nice" => Policy::Nice(num(-20, 19)? as i32),
        "fifo" => Policy::Fifo(num(1, 99)? as u32),
        "rr" => Policy::Rr(num(1, 99)? as u32),
        _ => {
            return Err(format!(
                "unknown policy '{s}' (batch, idle, ext, other, nice:N, fifo:PRIO, rr:PRIO)"
            ))
        }
    })
}

fn parse_cgroup(s: &str) -> Result<CgroupSetting, String> {
    let (key, val) = s
        .split_once('=')
        .ok_or_else(|| format!("cgroup:{s}: expected KEY=VALUE"))?;
    match key {
        "cpu.max" => {
            let (q, p) = val.split_once('/').unwrap_or((val, "100000"));
            let period: u64 = p
                .parse()
                .ok()
                .filter(|&p| (1000..=1_000_000).contains(&p))
                .ok_or_else(|| format!("cgroup:cpu.max: period '{p}' must be 1000..=1000000 µs"))?;
            let quota = if q == "max" {
                None
            } else {
                Some(q.parse().ok().filter(|&q| q >= 1000).ok_or_else(|| {
                    format!("cgroup:cpu.max: quota '{q}' must be 'max' or at least 1000 µs")
                })?)
            };
            Ok(CgroupSetting::CpuMax { quota, period })
        }
        "cpuset" => {
            let (cpus, mems) = match val.split_once(':') {
                Some((c, m)) => (c, Some(m)),
                None => (val, None),
            };
            parse_cpu_list(cpus)?;
            if let Some(m) = mems {
                parse_cpu_list(m)?;
            }
            Ok(CgroupSetting::Cpuset {
                cpus: cpus.to_string(),
                mems: mems.map(String::from),
            })
        }
        "weight" => val
            .parse()
            .ok()
            .filter(|w| (1..=10_000).contains(w))
            .map(CgroupSetting::Weight)
            .ok_or_else(|| format!("cgroup:weight: '{val}' must be 1..=10000")),
        _ => Err(format!(
            "cgroup:{key}: unknown setting (cpu.max, cpuset, weight)"
        )),
    }
}

/// Parses a Linux CPU list (`0-3,8,10-11`) into sorted, distinct ids.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("'{s}' is not a CPU list (e.g. 0-3,8)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b - a > 65_536 {
                    return Err(bad());
                }
                v.extend(a..=b);
            }
            None => v.push(part.parse().map_err(|_| bad())?),
        }
    }
    if v.is_empty() {
        return Err(format!("'{s}' is an empty CPU list"));
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// Background load that runs for the whole window (schedulers differ most under
/// contention).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Antagonist {
    /// N threads spinning on the CPU.
    Spin(usize),
    /// N threads streaming through a buffer far larger than the caches.
    Membw(usize),
    /// A shell command (`sh -c`).
    Cmd(String),
}

impl Antagonist {
    pub fn parse(s: &str) -> Result<Antagonist, String> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let n = || {
            arg.parse::<usize>()
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| format!("antagonist {kind}: needs a thread count, e.g. {kind}:2"))
        };
        match kind {
            "spin" => Ok(Antagonist::Spin(n()?)),
            "membw" => Ok(Antagonist::Membw(n()?)),
            "cmd" if !arg.trim().is_empty() => Ok(Antagonist::Cmd(arg.trim().to_string())),
            _ => Err(format!(
                "unknown antagonist '{s}' (spin:N, membw:N, cmd:\"...\")"
            )),
        }
    }
}

impl fmt::Display for Antagonist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Antagonist::Spin(n) => write!(f, "spin:{n}"),
            Antagonist::Membw(n) => write!(f, "membw:{n}"),
            Antagonist::Cmd(c) => write!(f, "cmd:{c}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind() {
        let v = Variant::parse("eevdf").unwrap();
        assert!(v.expects_fair_class() && v.policy.is_none());
        let v = Variant::parse("scx:scx_rusty:--slice-us 5000 -v").unwrap();
        assert_eq!(
            v.scx,
            Some(ScxSpec {
                binary: "scx_rusty".into(),
                args: vec!["--slice-us".into(), "5000".into(), "-v".into()]
            })
        );
        assert!(!v.expects_fair_class());
        assert_eq!(
            Variant::parse("policy:batch").unwrap().policy,
            Some(Policy::Batch)
        );
        assert_eq!(
            Variant::parse("policy:fifo:10").unwrap().policy,
            Some(Policy::Fifo(10))
        );
        assert_eq!(
            Variant::parse("policy:nice:-5").unwrap().policy,
            Some(Policy::Nice(-5))
        );
        assert_eq!(
            Variant::parse("cgroup:cpu.max=50000/100000")
                .unwrap()
                .cgroup,
            vec![CgroupSetting::CpuMax {
                quota: Some(50000),
                period: 100000
            }]
        );
        assert_eq!(
            Variant::parse("cgroup:cpuset=0-1:0").unwrap().cgroup,
            vec![CgroupSetting::Cpuset {
                cpus: "0-1".into(),
                mems: Some("0".into())
            }]
        );
        assert_eq!(
            Variant::parse("cgroup:weight=50").unwrap().cgroup,
            vec![CgroupSetting::Weight(50)]
        );
        assert_eq!(
            Variant::parse("affinity:0,2-3").unwrap().affinity,
            Some(vec![0, 2, 3])
        );
        assert_eq!(Variant::parse("unpinned").unwrap().pin, Some(false));
        let v = Variant::parse("numa:distribute+weights:replicate+numactl:--membind=1").unwrap();
        assert_eq!(v.numa.as_deref(), Some("distribute"));
        assert_eq!(v.weights.as_deref(), Some("replicate"));
        assert_eq!(v.numactl, Some(vec!["--membind=1".to_string()]));
        assert!(Variant::parse("numa:mirror")
            .unwrap_err()
            .msg
            .contains("distribute"));
        assert!(Variant::parse("weights:spread")
            .unwrap_err()
            .msg
            .contains("replicate"));
        let v = Variant::parse("scx:scx_simple+unpinned+policy:idle").unwrap();
        assert!(v.scx.is_some() && v.pin == Some(false) && v.policy == Some(Policy::Idle));
        assert_eq!(v.to_string(), "scx:scx_simple+unpinned+policy:idle");
        assert_eq!(
            Variant::parse("numactl:--cpunodebind=0 --membind=0")
                .unwrap()
                .numactl,
            Some(vec!["--cpunodebind=0".into(), "--membind=0".into()])
        );
    }

    #[test]
    fn refuses_nonsense_with_the_reason() {
        for (s, want) in [
            ("", "empty"),
            ("scx:", "binary"),
            ("policy:fifo:0", "1..=99"),
            ("policy:fast", "unknown policy"),
            ("cgroup:cpu.max=10/100000", "quota"),
            ("cgroup:weight=0", "1..=10000"),
            ("affinity:3-1", "CPU list"),
            ("scx:a+scx:b", "at most one"),
            ("turbo", "unknown part"),
        ] {
            let e = Variant::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
        assert!(Policy::Fifo(5).needs_privilege() && Policy::Nice(-1).needs_privilege());
        assert!(!Policy::Batch.needs_privilege() && !Policy::Nice(5).needs_privilege());
        assert_eq!(Policy::Fifo(10).expected_prio(), 89);
        assert_eq!(Policy::Nice(5).expected_prio(), 125);
    }

    #[test]
    fn antagonists() {
        assert_eq!(Antagonist::parse("spin:2"), Ok(Antagonist::Spin(2)));
        assert_eq!(Antagonist::parse("membw:1"), Ok(Antagonist::Membw(1)));
        assert_eq!(
            Antagonist::parse("cmd:make -j2"),
            Ok(Antagonist::Cmd("make -j2".into()))
        );
        assert!(Antagonist::parse("spin:0").is_err());
        assert!(Antagonist::parse("fork").is_err());
        assert_eq!(Antagonist::Spin(3).to_string(), "spin:3");
    }
}
