//! What `/proc` says about a process and its threads: scheduling class and priority per
//! thread (the proof that a policy or a sched_ext scheduler applies to the benchmark's own
//! threads), allowed CPUs and memory nodes, and whether a process is alive.

use std::fs;
use std::path::Path;

/// Scheduling facts of one thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadSched {
    pub tid: u32,
    pub comm: String,
    /// The policy number (`SCHED_OTHER` 0, `FIFO` 1, `RR` 2, `BATCH` 3, `IDLE` 5,
    /// `EXT` 7).
    pub policy: u32,
    /// The kernel's priority (`120 + nice` for the fair class, `99 - rt_priority` for
    /// real-time ones).
    pub prio: i32,
    /// `ext.enabled` from the thread's `sched` file: whether sched_ext schedules it (None
    /// when the kernel has no such line).
    pub ext_enabled: Option<bool>,
}

/// The thread ids of `pid` (empty when it has exited).
pub fn threads(proc: &Path, pid: u32) -> Vec<u32> {
    let Ok(rd) = fs::read_dir(proc.join(pid.to_string()).join("task")) else {
        return Vec::new();
    };
    let mut v: Vec<u32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// The scheduling facts of thread `tid` of `pid`, from its `sched` file (policy, prio,
/// ext.enabled) with `stat` as the fallback where `sched` is missing; None once the
/// thread is gone.
pub fn thread_sched(proc: &Path, pid: u32, tid: u32) -> Option<ThreadSched> {
    let dir = proc
        .join(pid.to_string())
        .join("task")
        .join(tid.to_string());
    let comm = fs::read_to_string(dir.join("comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if let Ok(s) = fs::read_to_string(dir.join("sched")) {
        let field = |key: &str| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        if let (Some(policy), Some(prio)) = (field("policy"), field("prio")) {
            return Some(ThreadSched {
                tid,
                comm,
                policy: policy.parse().ok()?,
                prio: prio.parse().ok()?,
                ext_enabled: field("ext.enabled").map(|v| v == "1"),
            });
        }
    }
    // `stat`: fields after the parenthesised comm; priority is field 18, policy 41.
    let stat = fs::read_to_string(dir.join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let prio: i32 = f.get(18 - 3)?.parse().ok()?;
    let policy: u32 = f.get(41 - 3)?.parse().ok()?;
    Some(ThreadSched {
        tid,
        comm,
        policy,
        // stat's priority is `prio - 100` for the fair class.
        prio: prio + 100,
        ext_enabled: None,
    })
}

/// Every thread of `pid` that can still be read.
pub fn all_thread_sched(proc: &Path, pid: u32) -> Vec<ThreadSched> {
    threads(proc, pid)
        .into_iter()
        .filter_map(|t| thread_sched(proc, pid, t))
        .collect()
}

/// `Cpus_allowed_list` and `Mems_allowed_list` of `pid`.
pub fn allowed_lists(proc: &Path, pid: u32) -> Option<(String, String)> {
    let s = fs::read_to_string(proc.join(pid.to_string()).join("status")).ok()?;
    let get = |key: &str| {
        s.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == key).then(|| v.trim().to_string())
        })
    };
    Some((get("Cpus_allowed_list")?, get("Mems_allowed_list")?))
}

/// `Cpus_allowed_list` and `Mems_allowed_list` of thread `tid` of `pid` (threads can be
/// pinned apart from their process: llama.cpp's `--cpu-mask`, our own pool).
pub fn thread_allowed_lists(proc: &Path, pid: u32, tid: u32) -> Option<(String, String)> {
    allowed_lists(&proc.join(pid.to_string()).join("task"), tid)
}

/// The parent of `pid` (field 4 of its `stat`), None once it is gone.
pub fn parent(proc: &Path, pid: u32) -> Option<u32> {
    let s = fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `pid` and every process descended from it (children, their children, ...), by one scan
/// of `/proc`: a workload that runs its benchmark through a shell or a launcher script
/// places the benchmark as a grandchild, and that is the process the proof is about.
pub fn process_tree(proc: &Path, pid: u32) -> Vec<u32> {
    let mut children: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    if let Ok(rd) = fs::read_dir(proc) {
        for e in rd.filter_map(Result::ok) {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(pp) = parent(proc, p) {
                children.entry(pp).or_default().push(p);
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        if let Some(c) = children.get(&out[i]) {
            for &k in c {
                if !out.contains(&k) {
                    out.push(k);
                }
            }
        }
        i += 1;
    }
    out
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(proc: &Path, pid: u32) -> bool {
    let Ok(s) = fs::read_to_string(proc.join(pid.to_string()).join("stat")) else {
        return false;
    };
    s.rfind(')')
        .and_then(|i| s[i + 1..].split_whitespace().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

#[cfg(test)]
pub(crate) mod fake {
    use std::fs;
    use std::path::Path;

    /// A thread with a `sched` file.
    pub fn thread(proc: &Path, pid: u32, tid: u32, policy: u32, prio: i32, ext: Option<bool>) {
        child_thread(proc, 1, pid, tid, policy, prio, ext)
    }

    /// A thread of a process whose parent is `ppid`.
    pub fn child_thread(
        proc: &Path,
        ppid: u32,
        pid: u32,
        tid: u32,
        policy: u32,
        prio: i32,
        ext: Option<bool>,
    ) {
        let d = proc.join(format!("{pid}/task/{tid}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("comm"), "worker\n").unwrap();
        let mut s = format!(
            "worker ({tid}, #threads: 3)\n---\nse.exec_start  :  1.0\npolicy   :   {policy}\nprio  :  {prio}\n"
        );
        if let Some(e) = ext {
            s.push_str(&format!("ext.enabled    :    {}\n", u8::from(e)));
        }
        fs::write(d.join("sched"), s).unwrap();
        fs::write(
            proc.join(format!("{pid}/stat")),
            format!("{pid} (rbench) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 3 0\n"),
        )
        .unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sched_files_and_the_stat_fallback() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fake::thread(p, 42, 42, 3, 120, Some(true));
        fake::thread(p, 42, 43, 0, 125, None);
        let t = all_thread_sched(p, 42);
        assert_eq!(threads(p, 42), vec![42, 43]);
        assert_eq!(
            (t[0].policy, t[0].prio, t[0].ext_enabled),
            (3, 120, Some(true))
        );
        assert_eq!((t[1].policy, t[1].prio, t[1].ext_enabled), (0, 125, None));
        assert!(alive(p, 42));
        assert!(!alive(p, 7));
        // Without a sched file: stat fields 18 (priority - 100) and 41 (policy).
        let t = p.join("9/task/9");
        fs::create_dir_all(&t).unwrap();
        let mut fields: Vec<String> = (3..=44).map(|i| i.to_string()).collect();
        fields[18 - 3] = "19".into();
        fields[41 - 3] = "5".into();
        fs::write(t.join("stat"), format!("9 (a b) {}\n", fields.join(" "))).unwrap();
        let s = thread_sched(p, 9, 9).unwrap();
        assert_eq!((s.policy, s.prio, s.ext_enabled), (5, 119, None));
    }

    #[test]
    fn process_trees_follow_parents() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        fake::child_thread(p, 1, 10, 10, 0, 120, None);
        fake::child_thread(p, 10, 11, 11, 0, 120, None);
        fake::child_thread(p, 11, 12, 12, 0, 120, None);
        fake::child_thread(p, 1, 20, 20, 0, 120, None);
        assert_eq!(process_tree(p, 10), vec![10, 11, 12]);
        assert_eq!(process_tree(p, 20), vec![20]);
        assert_eq!(parent(p, 12), Some(11));
    }

    #[test]
    fn reads_this_process() {
        let proc = Path::new("/proc");
        let me = std::process::id();
        assert!(alive(proc, me));
        let t = all_thread_sched(proc, me);
        assert!(!t.is_empty());
        let (cpus, mems) = allowed_lists(proc, me).unwrap();
        assert!(!cpus.is_empty() && !mems.is_empty());
        assert_eq!(
            thread_allowed_lists(proc, me, t[0].tid).map(|a| a.0),
            Some(cpus)
        );
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let tree = process_tree(proc, me);
        assert!(tree.contains(&child.id()), "{tree:?}");
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
}
