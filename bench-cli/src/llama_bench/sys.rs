//! Process settings llama-bench offers: priority (`--prio`), CPU affinity (`-C`) and NUMA
//! (`--numa`). Applied once, before any worker thread exists, so every thread the engines
//! create inherits them.

use anyhow::{bail, Result};
use runtime::numa::WeightPlacement;

use super::cli::{parse_cpu_mask, Params};

/// Applies `--prio`, `-C` and `--numa`, or fails with a clear message; never silently
/// ignores a setting.
pub fn apply(params: &Params) -> Result<()> {
    if params.prio != 0 {
        set_priority(params.prio);
    }
    if let Some(mask) = &params.cpu_mask {
        set_affinity(&parse_cpu_mask(mask)?)?;
    }
    if params.run.numa.is_some() || params.run.numa_weights != WeightPlacement::FirstTouch {
        let topo = runtime::numa::Topology::read()
            .map_err(|e| anyhow::anyhow!("--numa: cannot read the NUMA topology: {e}"))?;
        // Refuse a mode that cannot be honoured before anything is loaded.
        let max_threads = params.threads.iter().copied().max().unwrap_or(1);
        runtime::numa::plan_threads(
            &topo,
            params.run.numa,
            max_threads,
            runtime::numa::current_cpu(),
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        if topo.n_nodes() == 1 {
            eprintln!(
                "rbench: note: this machine has a single NUMA node: --numa {} / --numa-weights \
                 {} place nothing differently here",
                params.run.numa.map_or("(none)", |m| m.name()),
                params.run.numa_weights
            );
        }
    }
    #[cfg(feature = "llamacpp")]
    if let Some(mode) = params.run.numa {
        if params.engines.contains(&super::cli::Engine::LlamaCpp) {
            llamacpp_ref::numa_init(match mode {
                runtime::numa::NumaMode::Distribute => llamacpp_ref::NumaStrategy::Distribute,
                runtime::numa::NumaMode::Isolate => llamacpp_ref::NumaStrategy::Isolate,
                runtime::numa::NumaMode::Numactl => llamacpp_ref::NumaStrategy::Numactl,
            });
        }
    }
    Ok(())
}

/// llama-bench's priority levels as nice values. A failure (raising priority needs
/// privileges) is reported on stderr and the run continues, as llama-bench does.
fn set_priority(prio: i32) {
    let nice = match prio {
        -1 => 5,
        1 => -5,
        2 => -10,
        3 => -20,
        _ => 0,
    };
    #[cfg(unix)]
    {
        // SAFETY: plain syscall on this process; no pointers.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
        if rc != 0 {
            eprintln!(
                "rbench: warning: --prio {prio}: could not set nice {nice}: {} \
                 (running at the default priority)",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(unix))]
    eprintln!("rbench: warning: --prio {prio} (nice {nice}) is not supported on this OS");
}

#[cfg(target_os = "linux")]
fn set_affinity(cpus: &[usize]) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write within it; the syscall reads
    // size_of::<cpu_set_t>() bytes from a valid pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        for &c in cpus {
            if c >= max {
                bail!("-C: CPU {c} is beyond the {max} CPUs this build supports");
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "-C: sched_setaffinity to CPUs {cpus:?} failed: {} (are those CPUs online \
                 and allowed for this process?)",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn set_affinity(_cpus: &[usize]) -> Result<()> {
    bail!("-C (CPU mask) is not supported yet on this OS")
}
