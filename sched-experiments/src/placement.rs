//! Starting a workload process under a variant: its scheduling policy, CPU affinity and
//! cgroup are set in the child between `fork` and `exec`, so every thread it ever creates
//! inherits them; `numactl` wraps the command. Each child gets its own process group (a
//! terminal's Ctrl-C reaches only the harness, which then stops everything in order) and
//! dies with the harness (`PR_SET_PDEATHSIG`).

use std::ffi::CString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::variant::Policy;

/// How to start one workload process.
#[derive(Clone, Debug, Default)]
pub struct Placement {
    pub policy: Option<Policy>,
    pub affinity: Option<Vec<usize>>,
    /// `cgroup.procs` of the cgroup to join.
    pub cgroup_procs: Option<std::path::PathBuf>,
    /// Run under `numactl ARGS --`.
    pub numactl: Option<Vec<String>>,
    /// The signal the child receives when the harness dies (SIGTERM by default).
    pub death_signal: Option<i32>,
    /// Environment changes: `Some(value)` sets, `None` removes.
    pub env: Vec<(String, Option<String>)>,
}

/// `struct sched_attr` (first version, 48 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Sets `policy` on the calling thread with `sched_setattr` (async-signal-safe: one
/// syscall).
pub fn set_policy(policy: Policy) -> io::Result<()> {
    let mut attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: policy.number(),
        ..Default::default()
    };
    match policy {
        Policy::Nice(n) => attr.sched_nice = n,
        Policy::Fifo(p) | Policy::Rr(p) => attr.sched_priority = p,
        _ => {}
    }
    // SAFETY: a valid sched_attr for the calling thread (pid 0), flags 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Restricts the calling thread to `cpus`.
pub fn set_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET only writes inside it for ids below its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// Writes `0` (the calling process) to the open `cgroup.procs` path `procs`.
fn join_cgroup(procs: &CString) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; plain open/write/close, async-signal-safe.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = libc::write(fd, b"0".as_ptr().cast(), 1);
        let e = io::Error::last_os_error();
        libc::close(fd);
        if r == 1 {
            Ok(())
        } else {
            Err(e)
        }
    }
}

impl Placement {
    /// A command running `argv` with this placement.
    pub fn command(&self, argv: &[String]) -> Command {
        let mut full: Vec<String> = Vec::new();
        if let Some(args) = &self.numactl {
            full.push("numactl".into());
            full.extend(args.iter().cloned());
            full.push("--".into());
        }
        full.extend(argv.iter().cloned());
        let mut cmd = Command::new(&full[0]);
        cmd.args(&full[1..]);
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let policy = self.policy;
        let affinity = self.affinity.clone();
        let procs = self
            .cgroup_procs
            .as_deref()
            .map(|p| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path"));
        let death = self.death_signal.unwrap_or(libc::SIGTERM);
        // SAFETY: the closure only makes async-signal-safe system calls (no allocation:
        // the path and CPU list were prepared before the fork).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The signals we stop children with must not arrive ignored: a program
                // started in the background without job control (`nohup rbench ... &`)
                // inherits SIGINT as ignored, a shell cannot even trap it then, and a
                // scheduler that keeps it ignored could not be unloaded.
                for sig in [libc::SIGINT, libc::SIGTERM] {
                    if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, death as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(p) = &procs {
                    join_cgroup(p)?;
                }
                if let Some(c) = &affinity {
                    set_affinity(c)?;
                }
                if let Some(p) = policy {
                    set_policy(p)?;
                }
                Ok(())
            });
        }
        cmd
    }
}

/// Whether the current process is root (loading BPF schedulers, real-time policies and
/// cgroups need it, or the matching capabilities).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `PATH` lookup of `name` (a name with a `/` is taken as a path).
pub fn find_binary(name: &str) -> Option<std::path::PathBuf> {
    if name.contains('/') {
        let p = Path::new(name);
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs;

    /// A child started with `policy:batch` and a one-CPU affinity really runs so: read back
    /// from its own /proc files (SCHED_BATCH needs no privilege).
    #[test]
    fn child_gets_policy_and_affinity() {
        let p = Placement {
            policy: Some(Policy::Batch),
            affinity: Some(vec![0]),
            ..Default::default()
        };
        let mut child = p
            .command(&["sleep".into(), "5".into()])
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        let proc = Path::new("/proc");
        let t = procfs::all_thread_sched(proc, pid);
        let (cpus, _) = procfs::allowed_lists(proc, pid).unwrap();
        child.kill().ok();
        child.wait().ok();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].policy, 3, "SCHED_BATCH");
        assert_eq!(cpus, "0");
    }

    #[test]
    fn privilege_errors_surface_at_spawn() {
        if is_root() {
            eprintln!("skipping: running as root, SCHED_FIFO would succeed");
            return;
        }
        let p = Placement {
            policy: Some(Policy::Fifo(10)),
            ..Default::default()
        };
        let e = p.command(&["true".into()]).spawn().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn finds_binaries_on_path() {
        assert!(find_binary("sh").is_some());
        assert!(find_binary("no-such-binary-here").is_none());
        assert!(find_binary("/bin/sh").is_some());
    }
}
