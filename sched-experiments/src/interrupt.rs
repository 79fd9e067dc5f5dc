//! Ctrl-C and SIGTERM: the handler only raises a flag; the harness checks it between steps
//! and in every wait, then stops the scheduler, removes the cgroup and kills the workload
//! in order before exiting. A second signal while cleaning up is ignored.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT and SIGTERM handlers (idempotent).
pub fn install() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let h = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, h);
        libc::signal(libc::SIGTERM, h);
    }
}

/// Whether a signal asked the harness to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Raises the flag as a signal would (tests, and a workload that must abort the plan).
pub fn request() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}
