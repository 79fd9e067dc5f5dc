//! Scheduler experiments: run a benchmark plan under Linux schedulers (EEVDF, sched_ext
//! `scx_*`), scheduling policies, cgroup limits, CPU affinity and `numactl` placements,
//! and prove for every measured window which scheduler and policy really applied.
//!
//! A published study once reported 21 "different" schedulers that were all the default,
//! because its serving half never started them. Here every window is bracketed and sampled
//! with the kernel's own files (`/sys/kernel/sched_ext/{state,root/ops,enable_seq}`, the
//! `/proc/<pid>/task/<tid>/{sched,status}` of every thread of the workload's process tree,
//! ours or a foreign engine's, `cgroup.procs`, `Cpus_allowed_list`),
//! and a window whose proof fails is kept, marked invalid with the reason, and retried.
//!
//! - [`variant`]: what is compared, parsed from `eevdf`, `scx:NAME[:ARGS]`, `policy:…`,
//!   `cgroup:…`, `affinity:…`, `pinned`/`unpinned`, `numactl:…` (joined with `+`).
//! - [`harness`]: one window, from setup through sampling to teardown and judgement.
//! - [`plan`]: the order of windows (A B B A), retries, cooldown, the JSONL result file
//!   with `--resume`.
//! - [`fingerprint`]: what machine the results came from.
//! - [`scx`], [`cgroup`], [`placement`], [`procfs`], [`sched_ext`]: the kernel
//!   interfaces, each taking its filesystem roots as parameters ([`roots`]) so the state
//!   machine is tested on fake trees.
//! - [`interrupt`]: Ctrl-C / SIGTERM leave the machine as found.

pub mod cgroup;
pub mod fingerprint;
pub mod harness;
pub mod interrupt;
pub mod placement;
pub mod plan;
pub mod procfs;
pub mod roots;
pub mod sched_ext;
pub mod scx;
pub mod variant;

pub use harness::{Harness, HarnessError, HarnessOptions, WindowOutcome, Workload};
pub use roots::Roots;
pub use variant::{Antagonist, Variant};
