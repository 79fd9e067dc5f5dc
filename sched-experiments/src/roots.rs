//! Where the kernel's files are. Every reader in this crate takes its roots as parameters
//! so the whole state machine can be tested on a fake sysfs/procfs tree.

use std::path::{Path, PathBuf};

/// The filesystem roots the harness reads and writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// sysfs, normally `/sys`.
    pub sys: PathBuf,
    /// procfs, normally `/proc`.
    pub proc: PathBuf,
    /// Where cgroup v2 is mounted, when it is (`/sys/fs/cgroup` on a pure v2 host,
    /// `/sys/fs/cgroup/unified` on a hybrid one); found from `/proc/self/mounts`.
    pub cgroup2: Option<PathBuf>,
}

impl Roots {
    /// The running machine's roots.
    pub fn host() -> Roots {
        let proc = PathBuf::from("/proc");
        let cgroup2 = cgroup2_mount(&proc);
        Roots {
            sys: PathBuf::from("/sys"),
            proc,
            cgroup2,
        }
    }

    /// Roots under one directory (`DIR/sys`, `DIR/proc`, `DIR/cgroup`), for tests.
    pub fn under(dir: &Path) -> Roots {
        Roots {
            sys: dir.join("sys"),
            proc: dir.join("proc"),
            cgroup2: Some(dir.join("cgroup")),
        }
    }

    /// `/sys/kernel/sched_ext`.
    pub fn sched_ext(&self) -> PathBuf {
        self.sys.join("kernel/sched_ext")
    }
}

/// The first cgroup2 mount point listed in `PROC/self/mounts`.
pub fn cgroup2_mount(proc: &Path) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string(proc.join("self/mounts")).ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(dir))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("self")).unwrap();
        std::fs::write(
            d.path().join("self/mounts"),
            "proc /proc proc rw 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n\
             cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",
        )
        .unwrap();
        assert_eq!(
            cgroup2_mount(d.path()),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        std::fs::write(d.path().join("self/mounts"), "proc /proc proc rw 0 0\n").unwrap();
        assert_eq!(cgroup2_mount(d.path()), None);
    }
}
