//! Our own persistent worker pool. `run(n, f)` calls `f(i)` for every `i < n` across the
//! workers and the calling thread, handing out indices dynamically from an atomic counter,
//! and returns when all are done. Workers live as long as the pool (no per-op spawn).
//!
//! Workers spin briefly on the job generation, then yield, then park on a condvar: the many
//! small ops of one decode step do not pay a futex wake-up each, and a machine with more
//! runnable threads than cores is not starved by spinners (yielding hands the core over).
//! A worker takes part in a job only if it arrives before the caller has seen every task
//! handed out: the caller never waits for a worker that is off its CPU (a shared machine)
//! unless that worker holds a task.
//!
//! By default each worker is pinned to its own CPU (Linux): worker i (the caller being
//! thread 0) gets the i-th CPU the caller is allowed to run on, so `taskset` and `numactl`
//! are honoured, and the caller is left free to run on the remaining allowed CPU 0. The
//! caller itself is never pinned: threads it creates later (llama.cpp's in a side-by-side
//! benchmark, the server's runtime) inherit its mask, and confining them to one CPU would
//! starve them. With more threads than allowed CPUs nothing is pinned (two pinned busy
//! threads must never share a core). Pinning failures are ignored. `RLLAMA_NO_PIN=1` or
//! `PoolOptions { pin: false, .. }` turns pinning off.
//!
//! A NUMA mode (`PoolOptions::numa`, llama.cpp's `--numa distribute|isolate|numactl`)
//! changes the CPU order (see [`numa::plan_threads`]); every pinned worker knows its node
//! ([`numa::current_node`]), which is how `replicate` weight placement finds its copy.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::affinity;
use crate::numa::{self, NumaError, NumaMode, ThreadPlan};

type Task = dyn Fn(usize) + Sync;

struct Job {
    /// Lifetime erased; `run` does not return before every worker that entered the job
    /// has left it, and no worker enters a closed job.
    f: *const Task,
    n: usize,
    next: AtomicUsize,
    /// [`CLOSED`] once the caller has seen every task handed out, plus the number of
    /// workers inside the job.
    state: AtomicUsize,
}

/// The bit of [`Job::state`] that closes a job to workers that have not entered it yet.
const CLOSED: usize = 1 << (usize::BITS - 1);

impl Job {
    /// A worker joins the job, unless the caller has already closed it.
    fn enter(&self) -> bool {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            if s & CLOSED != 0 {
                return false;
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
    }

    /// Workers still inside the job.
    fn inside(&self) -> usize {
        self.state.load(Ordering::Acquire) & !CLOSED
    }
}

struct Shared {
    generation: AtomicU64,
    job: Mutex<Option<Arc<JobHandle>>>,
    wake: Condvar,
    done_lock: Mutex<()>,
    done: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    /// Workers waiting on `wake` (changed under the `job` lock): `run` skips the wake-up
    /// syscall when every worker is still spinning.
    parked: AtomicUsize,
    /// The caller is (about to be) waiting on `done`: the last worker out skips the
    /// notification syscall otherwise.
    caller_waiting: AtomicBool,
    #[cfg(test)]
    arrival_delay_ms: AtomicU64,
}

struct JobHandle(Job);
// SAFETY: the raw task pointer refers to a `Sync` closure that outlives the job (see `run`).
unsafe impl Send for JobHandle {}
unsafe impl Sync for JobHandle {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    /// CPU of each thread (caller first), when every thread was pinned.
    pinned: Option<Vec<usize>>,
    /// The NUMA plan the threads follow (pinned or confined), when there is one.
    plan: Option<ThreadPlan>,
    /// The caller's thread id and mask before a NUMA mode confined it.
    restore_caller: Option<(i32, affinity::CpuSet)>,
}

/// How a pool places its threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Pin each compute thread to its own CPU (when there are enough CPUs). The environment
    /// variable `RLLAMA_NO_PIN` overrides this to off.
    pub pin: bool,
    /// A NUMA thread placement; `None` keeps the allowed CPUs in order.
    pub numa: Option<NumaMode>,
}

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        PoolOptions {
            pin: true,
            numa: None,
        }
    }
}

/// The environment variable that turns pinning off for every pool.
pub const NO_PIN_ENV: &str = "RLLAMA_NO_PIN";

/// Whether a value of `RLLAMA_NO_PIN` turns pinning off: anything but unset, empty or `0`.
pub fn no_pin_requested(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// The CPUs for `n_threads` pinned threads out of the `allowed` ones, or `None` when there
/// are not enough for one each.
fn pin_plan(n_threads: usize, allowed: &[usize]) -> Option<Vec<usize>> {
    (n_threads <= allowed.len()).then(|| allowed[..n_threads].to_vec())
}

/// Busy-wait iterations before yielding, and yields before parking.
const SPIN_ITERS: u32 = 4_000;
const YIELDS: u32 = 64;

/// One step of a spin-yield-park wait; returns false once it is time to park.
#[inline]
fn backoff(step: &mut u32) -> bool {
    *step += 1;
    if *step <= SPIN_ITERS {
        std::hint::spin_loop();
        true
    } else if *step <= SPIN_ITERS + YIELDS {
        std::thread::yield_now();
        true
    } else {
        false
    }
}

impl ThreadPool {
    /// A pool with `n_threads` compute threads in total, the caller included, pinned to
    /// their own CPUs where possible (see the module docs).
    pub fn new(n_threads: usize) -> ThreadPool {
        ThreadPool::with_options(n_threads, PoolOptions::default())
    }

    /// A pool with `n_threads` compute threads in total, the caller included. A NUMA plan
    /// that cannot be made (see [`ThreadPool::try_with_options`]) leaves threads unpinned.
    pub fn with_options(n_threads: usize, options: PoolOptions) -> ThreadPool {
        let plan = ThreadPool::plan(n_threads, options).unwrap_or(None);
        ThreadPool::build(n_threads, options, plan)
    }

    /// The pool `opts` ask for: `opts.threads` threads, pinned and placed as they say (a
    /// NUMA mode that cannot be honoured is an error).
    pub fn for_run(opts: &crate::options::RunOptions) -> Result<ThreadPool, NumaError> {
        ThreadPool::try_with_options(
            opts.threads,
            PoolOptions {
                pin: opts.pin,
                numa: opts.numa,
            },
        )
    }

    /// As [`ThreadPool::with_options`], but a NUMA mode that cannot be honoured (no CPU
    /// on the node to isolate on, an unreadable topology) is an error.
    pub fn try_with_options(
        n_threads: usize,
        options: PoolOptions,
    ) -> Result<ThreadPool, NumaError> {
        let plan = ThreadPool::plan(n_threads, options)?;
        Ok(ThreadPool::build(n_threads, options, plan))
    }

    fn plan(n_threads: usize, options: PoolOptions) -> Result<Option<ThreadPlan>, NumaError> {
        let n_threads = n_threads.max(1);
        let pin = options.pin && !crate::options::Env::get().no_pin;
        if !pin && options.numa.is_none() {
            return Ok(None);
        }
        // Read fresh: the allowed CPUs may have changed since start (`rbench -C`).
        match numa::Topology::read() {
            Ok(topo) => {
                let mut plan =
                    numa::plan_threads(&topo, options.numa, n_threads, numa::current_cpu())?;
                if !pin && plan.cpus.take().is_some() {
                    // Unpinned: a NUMA mode still confines each thread to its node's CPUs.
                    plan.masks = match options.numa {
                        Some(NumaMode::Distribute | NumaMode::Isolate) => plan
                            .nodes
                            .iter()
                            .map(|&n| topo.allowed_cpus_of(n))
                            .collect(),
                        _ => vec![topo.allowed_cpus.clone(); n_threads],
                    };
                }
                Ok(Some(plan))
            }
            Err(e) if options.numa.is_some() => Err(e),
            Err(_) => Ok(affinity::CpuSet::of_current_thread()
                .and_then(|a| pin_plan(n_threads, &a.cpus()))
                .map(|cpus| ThreadPlan {
                    masks: cpus.iter().map(|&c| vec![c]).collect(),
                    nodes: vec![0; cpus.len()],
                    cpus: Some(cpus),
                    caller_mask: None,
                })),
        }
    }

    fn build(n_threads: usize, options: PoolOptions, plan: Option<ThreadPlan>) -> ThreadPool {
        let n_threads = n_threads.max(1);
        // A NUMA mode keeps the caller (which computes too) on its node while the pool
        // lives; its own mask comes back when the pool is dropped.
        let mut restore_caller = None;
        if let Some(m) = plan.as_ref().and_then(|p| p.caller_mask.as_ref()) {
            let saved = affinity::CpuSet::of_current_thread();
            if affinity::CpuSet::from_cpus(m).is_some_and(|s| s.apply_to_current_thread()) {
                numa::set_thread_node(plan.as_ref().map(|p| p.nodes[0]));
                restore_caller = saved.map(|s| (affinity::current_tid(), s));
            }
        }
        // One thread: nothing else to place (the caller is never pinned to one CPU).
        let plan = plan.filter(|_| n_threads > 1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            caller_waiting: AtomicBool::new(false),
            #[cfg(test)]
            arrival_delay_ms: AtomicU64::new(0),
        });
        // Workers place themselves first thing and report whether it took.
        let (pinned_tx, pinned_rx) = std::sync::mpsc::channel::<bool>();
        let workers = (1..n_threads)
            .map(|i| {
                let shared = shared.clone();
                let mask = plan.as_ref().map(|p| p.masks[i].clone());
                // The node is known when every CPU of the mask is on it.
                let node = plan.as_ref().map(|p| p.nodes[i]).filter(|&n| {
                    mask.as_ref().is_some_and(|m| {
                        m.iter()
                            .all(|&c| numa::machine().and_then(|t| t.node_of_cpu(c)) == Some(n))
                    })
                });
                let pinned_tx = pinned_tx.clone();
                std::thread::Builder::new()
                    .name(format!("rllama-worker-{i}"))
                    .spawn(move || {
                        WORKER_INDEX.with(|w| w.set(i));
                        if let Some(mask) = mask {
                            let ok = affinity::CpuSet::from_cpus(&mask)
                                .is_some_and(|s| s.apply_to_current_thread());
                            if ok {
                                numa::set_thread_node(node);
                            }
                            let _ = pinned_tx.send(ok);
                        }
                        drop(pinned_tx);
                        worker(shared)
                    })
                    .expect("spawn worker thread")
            })
            .collect();
        drop(pinned_tx);
        let all_placed =
            plan.is_some() && (1..n_threads).all(|_| pinned_rx.recv().unwrap_or(false));
        let plan = plan.filter(|_| all_placed);
        let _ = options;
        ThreadPool {
            shared,
            workers,
            n_threads,
            pinned: plan.as_ref().and_then(|p| p.cpus.clone()),
            plan,
            restore_caller,
        }
    }

    /// Where each thread really is: runs one task per thread (each waits for the others,
    /// so no thread takes two) and returns, by thread index (0 = the caller, which is
    /// never pinned), the CPU it ran on and its node. Gives up waiting after 2 s; a thread
    /// that took no task then reads `(None, 0)`.
    pub fn observe(&self) -> Vec<(Option<usize>, usize)> {
        let n = self.n_threads;
        let arrived = AtomicUsize::new(0);
        let seen = Mutex::new(Vec::with_capacity(n));
        self.run(n, &|_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let t0 = std::time::Instant::now();
            while arrived.load(Ordering::SeqCst) < n && t0.elapsed().as_secs() < 2 {
                std::thread::yield_now();
            }
            seen.lock().unwrap().push((
                WORKER_INDEX.with(|w| w.get()),
                numa::current_cpu(),
                numa::current_node(),
            ));
        });
        let mut out = vec![(None, 0); n];
        for (i, cpu, node) in seen.into_inner().unwrap() {
            if i < n {
                out[i] = (cpu, node);
            }
        }
        out
    }

    /// The NUMA node of each thread (caller first) when the threads were placed by a plan
    /// (pinned, or confined to a node's CPUs).
    pub fn thread_nodes(&self) -> Option<Vec<usize>> {
        self.plan.as_ref().map(|p| p.nodes.clone())
    }

    /// The placement the threads follow, when they were placed.
    pub fn thread_plan(&self) -> Option<&ThreadPlan> {
        self.plan.as_ref()
    }

    /// The CPU plan when every worker was pinned: element 0 is the CPU left to the (unpinned)
    /// caller, element i the CPU of worker i. `None` when pinning was off, not possible
    /// (one thread, more threads than allowed CPUs, not Linux) or failed for any worker.
    pub fn pinned_cpus(&self) -> Option<Vec<usize>> {
        self.pinned.clone()
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(r0, r1)` over contiguous ranges covering rows `0..n`, in parallel when
    /// there are at least `2 * min_rows` rows (at most four ranges per thread), else as
    /// one call here. For row-wise steps (norms, activations, RoPE) whose results do not
    /// depend on how the rows are split: serial, they left the workers idle for 9% of
    /// gemma3's prompt processing.
    pub fn run_rows(&self, n: usize, min_rows: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let tasks = (n / min_rows.max(1)).min(4 * self.n_threads);
        if tasks <= 1 {
            if n > 0 {
                f(0, n);
            }
            return;
        }
        self.run(tasks, &|k| f(n * k / tasks, n * (k + 1) / tasks));
    }

    /// Runs `f(0..n)` in parallel and waits for completion. Panics in `f` are re-raised here.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.workers.is_empty() || n == 1 {
            (0..n).for_each(f);
            return;
        }
        // SAFETY: erase the closure's lifetime; below we close the job and wait until no
        // worker is inside it, after which no worker calls the closure again.
        let f_static: *const Task = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f as *const _)
        };
        let job = Arc::new(JobHandle(Job {
            f: f_static,
            n,
            next: AtomicUsize::new(0),
            state: AtomicUsize::new(0),
        }));
        {
            // Bumped under the lock a parking worker checks it under: no lost wake-up.
            let mut slot = self.shared.job.lock().unwrap();
            *slot = Some(job.clone());
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        // A worker that saw the old generation counted itself in `parked` under the lock
        // we just held, so this cannot miss one.
        if self.shared.parked.load(Ordering::SeqCst) > 0 {
            self.shared.wake.notify_all();
        }

        let caller = catch_unwind(AssertUnwindSafe(|| work(&job.0)));

        // Every task is handed out (or the caller's task panicked). Workers that have not
        // entered yet are not waited for: on a busy machine a worker that is off its CPU
        // would otherwise hold up a job that is already done, once per operation.
        job.0.state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut step = 0u32;
        while job.0.inside() != 0 {
            if !backoff(&mut step) {
                let g = self.shared.done_lock.lock().unwrap();
                self.shared.caller_waiting.store(true, Ordering::SeqCst);
                if job.0.inside() != 0 {
                    let _g = self
                        .shared
                        .done
                        .wait_timeout(g, std::time::Duration::from_millis(1))
                        .unwrap();
                }
                self.shared.caller_waiting.store(false, Ordering::SeqCst);
            }
        }
        *self.shared.job.lock().unwrap() = None;
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        if self.shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a worker thread panicked while running a pool task");
        }
    }
}

thread_local! {
    /// The pool index of a worker thread (0 on any other thread, as for the caller).
    static WORKER_INDEX: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn work(job: &Job) {
    // SAFETY: the pointer is valid for the duration of the job (see `run`).
    let f = unsafe { &*job.f };
    loop {
        let i = job.next.fetch_add(1, Ordering::Relaxed);
        if i >= job.n {
            break;
        }
        f(i);
    }
}

fn worker(shared: Arc<Shared>) {
    let mut seen = 0u64;
    loop {
        // Spin, then park, waiting for a new generation.
        let mut step = 0u32;
        loop {
            if shared.shutdown.load(Ordering::Acquire) {
                return;
            }
            let g = shared.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            if !backoff(&mut step) {
                let guard = shared.job.lock().unwrap();
                if shared.generation.load(Ordering::Acquire) == seen
                    && !shared.shutdown.load(Ordering::Acquire)
                {
                    shared.parked.fetch_add(1, Ordering::SeqCst);
                    let _guard = shared.wake.wait(guard).unwrap();
                    shared.parked.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        #[cfg(test)]
        tests::late_arrival(&shared);
        let job = shared.job.lock().unwrap().clone();
        let Some(job) = job else { continue };
        if !job.0.enter() {
            continue;
        }
        if catch_unwind(AssertUnwindSafe(|| work(&job.0))).is_err() {
            shared.panicked.store(true, Ordering::SeqCst);
        }
        let before = job.0.state.fetch_sub(1, Ordering::AcqRel);
        if before & !CLOSED == 1 && shared.caller_waiting.load(Ordering::SeqCst) {
            let _g = shared.done_lock.lock().unwrap();
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        if let Some((tid, mask)) = self.restore_caller.take() {
            mask.apply_to_thread(tid);
            if tid == affinity::current_tid() {
                numa::set_thread_node(None);
            }
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.job.lock().unwrap();
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A raw pointer that tasks may share to write disjoint parts of one output buffer.
#[derive(Clone, Copy)]
pub struct SharedMut<T>(pub *mut T);
// SAFETY: users guarantee that concurrent tasks write disjoint elements.
unsafe impl<T> Send for SharedMut<T> {}
unsafe impl<T> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    pub fn new(s: &mut [T]) -> SharedMut<T> {
        SharedMut(s.as_mut_ptr())
    }

    /// # Safety
    /// `start..start+len` must be in bounds and written by no other task concurrently.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker sleeps `arrival_delay_ms` between seeing a job and entering it (a worker
    /// that a busy machine keeps off its CPU), for the test below.
    pub(super) fn late_arrival(shared: &Shared) {
        let ms = shared.arrival_delay_ms.load(Ordering::SeqCst);
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }

    #[test]
    fn caller_does_not_wait_for_a_worker_that_has_not_arrived() {
        let pool = ThreadPool::new(2);
        pool.run(4, &|_| {}); // the worker is up
        std::thread::sleep(std::time::Duration::from_millis(50)); // and parked
        pool.shared.arrival_delay_ms.store(400, Ordering::SeqCst);
        let calls = AtomicUsize::new(0);
        let t0 = std::time::Instant::now();
        pool.run(16, &|_| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        let took = t0.elapsed();
        pool.shared.arrival_delay_ms.store(0, Ordering::SeqCst);
        assert_eq!(calls.load(Ordering::SeqCst), 16);
        assert!(
            took < std::time::Duration::from_millis(300),
            "the caller ran every task itself and returned without the late worker: {took:?}"
        );
        // The late worker finds the job closed and takes nothing from it, nor from the
        // ones after.
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(calls.load(Ordering::SeqCst), 16);
        let total = AtomicUsize::new(0);
        for _ in 0..100 {
            pool.run(8, &|i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 100 * 28);
    }

    #[test]
    fn runs_every_index_once() {
        let pool = ThreadPool::new(3);
        for n in [0, 1, 2, 7, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        }
    }

    #[test]
    fn many_small_jobs_do_not_deadlock() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for _ in 0..20_000 {
            pool.run(4, &|i| {
                total.fetch_add(i, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 20_000 * 6);
    }

    /// The pinning tests expect the default; a developer's `RLLAMA_NO_PIN` turns them off.
    fn pinning_enabled() -> bool {
        !no_pin_requested(std::env::var(NO_PIN_ENV).ok().as_deref())
    }

    fn allowed_cpus() -> Vec<usize> {
        affinity::CpuSet::of_current_thread().map_or_else(Vec::new, |s| s.cpus())
    }

    #[test]
    fn pins_workers_to_distinct_allowed_cpus() {
        let allowed = allowed_cpus();
        let before = affinity::CpuSet::of_current_thread();
        let pool = ThreadPool::new(2);
        if !(cfg!(target_os = "linux") && allowed.len() >= 2 && pinning_enabled()) {
            assert_eq!(pool.pinned_cpus(), None);
            return;
        }
        let cpus = pool.pinned_cpus().expect("2 threads fit this machine");
        assert_eq!(
            cpus,
            &allowed[..2],
            "the first allowed CPUs, caller's first"
        );
        assert_eq!(
            affinity::CpuSet::of_current_thread(),
            before,
            "the caller is never pinned"
        );
        // Both threads take part: the caller's task waits until the worker has one too.
        let started = AtomicUsize::new(0);
        let seen = Mutex::new(Vec::new());
        pool.run(2, &|_| {
            started.fetch_add(1, Ordering::SeqCst);
            while started.load(Ordering::SeqCst) < 2 {
                std::hint::spin_loop();
            }
            let mask = affinity::CpuSet::of_current_thread().unwrap().cpus();
            seen.lock().unwrap().push(mask);
        });
        let seen = seen.into_inner().unwrap();
        assert!(
            seen.contains(&vec![cpus[1]]),
            "the worker runs on its CPU: {seen:?}"
        );
        assert!(
            seen.contains(&allowed),
            "the caller keeps its mask: {seen:?}"
        );
    }

    #[test]
    fn more_threads_than_cpus_are_not_pinned() {
        let before = affinity::CpuSet::of_current_thread();
        let n = allowed_cpus().len() + 1;
        let pool = ThreadPool::new(n);
        assert_eq!(pool.pinned_cpus(), None);
        assert_eq!(
            affinity::CpuSet::of_current_thread(),
            before,
            "caller untouched"
        );
        let total = AtomicUsize::new(0);
        pool.run(1000, &|i| {
            total.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 999 * 1000 / 2);
    }

    #[test]
    fn caller_affinity_is_untouched() {
        let before = affinity::CpuSet::of_current_thread();
        for n in [1, 2] {
            let pool = ThreadPool::new(n);
            assert_eq!(affinity::CpuSet::of_current_thread(), before);
            pool.run(8, &|_| {});
            drop(pool);
            assert_eq!(affinity::CpuSet::of_current_thread(), before);
        }
    }

    #[test]
    fn pinning_can_be_turned_off() {
        let before = affinity::CpuSet::of_current_thread();
        let pool = ThreadPool::with_options(
            1,
            PoolOptions {
                pin: false,
                numa: None,
            },
        );
        assert_eq!(pool.pinned_cpus(), None);
        assert_eq!(affinity::CpuSet::of_current_thread(), before);
        assert!(!no_pin_requested(None));
        assert!(!no_pin_requested(Some("")));
        assert!(!no_pin_requested(Some("0")));
        assert!(no_pin_requested(Some("1")));
        assert!(no_pin_requested(Some("yes")));
        assert_eq!(pin_plan(2, &[3, 5, 7]), Some(vec![3, 5]));
        assert_eq!(pin_plan(3, &[3, 5]), None);
    }

    /// The child half of `env_var_turns_pinning_off`; a no-op unless the variable is set.
    #[test]
    fn env_var_child() {
        if std::env::var_os(NO_PIN_ENV).is_some() {
            assert_eq!(ThreadPool::new(1).pinned_cpus(), None);
        }
    }

    #[test]
    fn env_var_turns_pinning_off() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "pool::tests::env_var_child", "--test-threads=1"])
            .env(NO_PIN_ENV, "1")
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "the child test ran: {stdout}");
    }

    #[test]
    fn worker_panic_is_reported_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|i| {
                if i == 63 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(10, &|_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }
}
