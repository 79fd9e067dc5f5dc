//! A cgroup v2 child for a window: created with its settings (`cpu.max`, `cpuset.cpus`,
//! `cpu.weight`), joined by the workload at start (see `placement`), read for proof
//! (`cgroup.procs`, `cpu.stat`), and removed afterwards, also when the window fails or the
//! harness is interrupted (`Drop`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::variant::CgroupSetting;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cgroup variants need cgroup v2 with the {controller} controller, and this host's \
         unified hierarchy {where_}; boot with systemd.unified_cgroup_hierarchy=1 or run in the lab \
         (shared/lab/run)"
    )]
    Unavailable {
        controller: &'static str,
        where_: String,
    },
    #[error("cgroup variants need root (to create {path}): {source}")]
    NotPermitted {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup {path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup {path} still holds processes {pids:?} after the window; left in place")]
    Busy { path: PathBuf, pids: Vec<u32> },
}

/// The controllers `settings` need.
fn controllers(settings: &[CgroupSetting]) -> Vec<&'static str> {
    let mut c: Vec<&'static str> = settings
        .iter()
        .map(|s| match s {
            CgroupSetting::Cpuset { .. } => "cpuset",
            _ => "cpu",
        })
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// Checks that the cgroup v2 hierarchy at `root` (None: there is none) offers what
/// `settings` need, without changing anything.
pub fn check(root: Option<&Path>, settings: &[CgroupSetting]) -> Result<(), CgroupError> {
    let Some(root) = root else {
        return Err(CgroupError::Unavailable {
            controller: "cpu",
            where_: "is not mounted (cgroup v1 only)".into(),
        });
    };
    let available = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    for c in controllers(settings) {
        if !available.split_whitespace().any(|a| a == c) {
            return Err(CgroupError::Unavailable {
                controller: c,
                where_: format!(
                    "at {} offers only '{}' (the controller is bound to cgroup v1)",
                    root.display(),
                    available.trim()
                ),
            });
        }
    }
    Ok(())
}

/// A cgroup the harness created; removed on drop.
#[derive(Debug)]
pub struct CgroupChild {
    path: PathBuf,
    done: bool,
}

/// Permission problems as [`CgroupError::NotPermitted`], the rest as `Io`.
fn denied_or<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| {
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            CgroupError::NotPermitted {
                path: path.to_path_buf(),
                source,
            }
        } else {
            CgroupError::Io {
                path: path.to_path_buf(),
                what,
                source,
            }
        }
    }
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

impl CgroupChild {
    /// Creates `ROOT/NAME` with `settings` (enabling their controllers in the root's
    /// `cgroup.subtree_control` first).
    pub fn create(
        root: &Path,
        name: &str,
        settings: &[CgroupSetting],
    ) -> Result<CgroupChild, CgroupError> {
        check(Some(root), settings)?;
        let path = root.join(name);
        let ctl: Vec<String> = controllers(settings)
            .iter()
            .map(|c| format!("+{c}"))
            .collect();
        let subtree = root.join("cgroup.subtree_control");
        fs::write(&subtree, ctl.join(" ")).map_err(denied_or(&subtree, "enabling controllers"))?;
        fs::create_dir(&path).map_err(denied_or(&path, "mkdir"))?;
        let child = CgroupChild { path, done: false };
        for s in settings {
            let (file, value) = match s {
                CgroupSetting::CpuMax { quota, period } => (
                    "cpu.max",
                    format!(
                        "{} {period}",
                        quota.map_or("max".to_string(), |q| q.to_string())
                    ),
                ),
                CgroupSetting::Weight(w) => ("cpu.weight", w.to_string()),
                CgroupSetting::Cpuset { cpus, mems } => {
                    if let Some(m) = mems {
                        fs::write(child.path.join("cpuset.mems"), m)
                            .map_err(io(&child.path, "writing cpuset.mems"))?;
                    }
                    ("cpuset.cpus", cpus.clone())
                }
            };
            fs::write(child.path.join(file), value)
                .map_err(io(&child.path, "writing a setting"))?;
        }
        Ok(child)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `cgroup.procs` file a workload writes itself into.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// The processes in the cgroup now.
    pub fn procs(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// `cpu.stat` as numbers (`usage_usec`, `nr_throttled`, `throttled_usec`, ...).
    pub fn cpu_stat(&self) -> BTreeMap<String, u64> {
        parse_flat_keyed(&fs::read_to_string(self.path.join("cpu.stat")).unwrap_or_default())
    }

    /// Removes the cgroup: what is still in it is killed (`cgroup.kill`), then it is
    /// removed once empty (bounded wait).
    pub fn remove(mut self) -> Result<(), CgroupError> {
        self.done = true;
        remove_dir(&self.path)
    }
}

fn remove_dir(path: &Path) -> Result<(), CgroupError> {
    if !path.exists() {
        return Ok(());
    }
    let procs = |p: &Path| -> Vec<u32> {
        fs::read_to_string(p.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    if !procs(path).is_empty() {
        let _ = fs::write(path.join("cgroup.kill"), "1");
    }
    let t0 = Instant::now();
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                if t0.elapsed() > Duration::from_secs(5) {
                    let pids = procs(path);
                    return Err(if pids.is_empty() {
                        CgroupError::Io {
                            path: path.to_path_buf(),
                            what: "rmdir",
                            source: e,
                        }
                    } else {
                        CgroupError::Busy {
                            path: path.to_path_buf(),
                            pids,
                        }
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Drop for CgroupChild {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = remove_dir(&self.path) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// `key value` lines to a map (cgroup's flat-keyed files).
pub fn parse_flat_keyed(s: &str) -> BTreeMap<String, u64> {
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::Variant;

    #[test]
    fn refuses_without_v2_or_controllers() {
        let v = Variant::parse("cgroup:cpu.max=50000/100000").unwrap();
        let e = check(None, &v.cgroup).unwrap_err().to_string();
        assert!(e.contains("cgroup v1 only"), "{e}");
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("cgroup.controllers"), "hugetlb\n").unwrap();
        let e = check(Some(d.path()), &v.cgroup).unwrap_err().to_string();
        assert!(e.contains("cpu controller") && e.contains("hugetlb"), "{e}");
        fs::write(d.path().join("cgroup.controllers"), "cpuset cpu io\n").unwrap();
        check(Some(d.path()), &v.cgroup).unwrap();
    }

    /// On a plain directory standing in for cgroupfs: the settings are written and the
    /// cgroup is removed on drop (the test deletes the setting files first, which cgroupfs
    /// does by itself).
    #[test]
    fn writes_settings_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("cgroup.controllers"), "cpuset cpu\n").unwrap();
        let v = Variant::parse("cgroup:cpu.max=50000/100000+cgroup:weight=200").unwrap();
        let c = CgroupChild::create(d.path(), "w1", &v.cgroup).unwrap();
        assert_eq!(
            fs::read_to_string(c.path().join("cpu.max")).unwrap(),
            "50000 100000"
        );
        assert_eq!(
            fs::read_to_string(c.path().join("cpu.weight")).unwrap(),
            "200"
        );
        assert_eq!(
            fs::read_to_string(d.path().join("cgroup.subtree_control")).unwrap(),
            "+cpu"
        );
        fs::write(c.path().join("cpu.stat"), "usage_usec 10\nnr_throttled 3\n").unwrap();
        assert_eq!(c.cpu_stat()["nr_throttled"], 3);
        // A fake directory keeps its files; remove them as the kernel would.
        for f in ["cpu.max", "cpu.weight", "cpu.stat"] {
            fs::remove_file(c.path().join(f)).unwrap();
        }
        let p = c.path().to_path_buf();
        drop(c);
        assert!(!p.exists(), "removed on drop");
    }
}
