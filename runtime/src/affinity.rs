//! Thread CPU affinity, for pinning the pool's compute threads (`pool.rs`).
//!
//! Linux only (`sched_getaffinity` / `sched_setaffinity`); elsewhere every query answers
//! `None` and every change reports failure, so callers simply do not pin. Nothing here
//! panics or returns an error: pinning is an optimization, never a reason to fail.

/// A set of CPUs, as the kernel's fixed-size `cpu_set_t` (1024 CPUs). A machine with more
/// CPUs makes `sched_getaffinity` fail with this size, which reads as "unknown": no pinning.
#[derive(Clone, Copy)]
pub struct CpuSet {
    #[cfg(target_os = "linux")]
    raw: libc::cpu_set_t,
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.cpus()).finish()
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &CpuSet) -> bool {
        self.cpus() == other.cpus()
    }
}

impl Eq for CpuSet {}

#[cfg(target_os = "linux")]
mod imp {
    use super::CpuSet;

    const SET_BYTES: usize = std::mem::size_of::<libc::cpu_set_t>();
    pub(super) const MAX_CPUS: usize = 8 * SET_BYTES;

    pub(super) fn empty() -> CpuSet {
        // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
        CpuSet {
            raw: unsafe { std::mem::zeroed() },
        }
    }

    /// The calling thread's mask (pid 0 names the caller).
    pub(super) fn of_current_thread() -> Option<CpuSet> {
        let mut set = empty();
        // SAFETY: the kernel writes at most SET_BYTES into a valid cpu_set_t.
        let rc = unsafe { libc::sched_getaffinity(0, SET_BYTES, &mut set.raw) };
        (rc == 0).then_some(set)
    }

    /// Sets the mask of thread `tid` (0: the caller).
    pub(super) fn apply_to_thread(set: &CpuSet, tid: i32) -> bool {
        // SAFETY: the kernel reads SET_BYTES from a valid cpu_set_t.
        unsafe { libc::sched_setaffinity(tid, SET_BYTES, &set.raw) == 0 }
    }

    pub(super) fn current_tid() -> i32 {
        // SAFETY: no arguments.
        unsafe { libc::gettid() }
    }

    pub(super) fn insert(set: &mut CpuSet, cpu: usize) {
        assert!(cpu < MAX_CPUS);
        // SAFETY: a bit inside the set (checked above).
        unsafe { libc::CPU_SET(cpu, &mut set.raw) };
    }

    pub(super) fn contains(set: &CpuSet, cpu: usize) -> bool {
        // SAFETY: CPU_ISSET only reads; callers ask for cpu < MAX_CPUS.
        cpu < MAX_CPUS && unsafe { libc::CPU_ISSET(cpu, &set.raw) }
    }
}

impl CpuSet {
    /// The CPUs the calling thread may run on; `None` where that is unknown (not Linux, or
    /// the syscall failed).
    pub fn of_current_thread() -> Option<CpuSet> {
        #[cfg(target_os = "linux")]
        return imp::of_current_thread();
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The set holding just `cpu`; `None` beyond the supported range or off Linux.
    pub fn single(cpu: usize) -> Option<CpuSet> {
        #[cfg(target_os = "linux")]
        {
            if cpu >= imp::MAX_CPUS {
                return None;
            }
            let mut s = imp::empty();
            imp::insert(&mut s, cpu);
            Some(s)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = cpu;
            None
        }
    }

    /// The set of these CPUs; `None` if any is beyond the supported range, the list is
    /// empty, or off Linux.
    pub fn from_cpus(cpus: &[usize]) -> Option<CpuSet> {
        #[cfg(target_os = "linux")]
        {
            if cpus.is_empty() || cpus.iter().any(|&c| c >= imp::MAX_CPUS) {
                return None;
            }
            let mut s = imp::empty();
            for &c in cpus {
                imp::insert(&mut s, c);
            }
            Some(s)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = cpus;
            None
        }
    }

    /// The CPU indices in the set, ascending.
    pub fn cpus(&self) -> Vec<usize> {
        #[cfg(target_os = "linux")]
        return (0..imp::MAX_CPUS)
            .filter(|&c| imp::contains(self, c))
            .collect();
        #[cfg(not(target_os = "linux"))]
        Vec::new()
    }

    /// Restricts the calling thread to this set. Returns whether the kernel accepted it.
    pub fn apply_to_current_thread(&self) -> bool {
        #[cfg(target_os = "linux")]
        return imp::apply_to_thread(self, 0);
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// Restricts thread `tid` of this process (see [`current_tid`]) to this set.
    pub fn apply_to_thread(&self, tid: i32) -> bool {
        #[cfg(target_os = "linux")]
        return imp::apply_to_thread(self, tid);
        #[cfg(not(target_os = "linux"))]
        {
            let _ = tid;
            false
        }
    }
}

/// The calling thread's id (0 off Linux).
pub fn current_tid() -> i32 {
    #[cfg(target_os = "linux")]
    return imp::current_tid();
    #[cfg(not(target_os = "linux"))]
    0
}

/// Pins the calling thread to `cpu`. Returns whether it took.
pub fn pin_current_thread(cpu: usize) -> bool {
    CpuSet::single(cpu).is_some_and(|s| s.apply_to_current_thread())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn pin_on_linux() {
        let allowed = CpuSet::of_current_thread()
            .expect("sched_getaffinity works")
            .cpus();
        assert!(!allowed.is_empty());
        let last = *allowed.last().unwrap();
        // On a fresh thread, so the test thread's own mask is untouched.
        let now = std::thread::spawn(move || {
            assert!(pin_current_thread(last));
            CpuSet::of_current_thread().unwrap().cpus()
        })
        .join()
        .unwrap();
        assert_eq!(now, [last]);
    }

    #[test]
    fn single_sets() {
        if cfg!(target_os = "linux") {
            assert_eq!(CpuSet::single(3).unwrap().cpus(), [3]);
            assert!(CpuSet::single(1 << 20).is_none());
        } else {
            assert!(CpuSet::single(3).is_none());
            assert!(!pin_current_thread(0));
        }
    }
}
