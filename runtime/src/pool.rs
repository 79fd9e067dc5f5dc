//! Our own persistent worker pool. `run(n, f)` calls `f(i)` for every `i < n` across the
//! workers and the calling thread, handing out indices dynamically from an atomic counter,
//! and returns when all are done. Workers live as long as the pool (no per-op spawn).
//!
//! Workers spin briefly on the job generation, then yield, then park on a condvar: the many
//! small ops of one decode step do not pay a futex wake-up each, and a machine with more
//! runnable threads than cores is not starved by spinners (yielding hands the core over).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Task = dyn Fn(usize) + Sync;

struct Job {
    /// Lifetime erased; `run` does not return before every worker has left the job.
    f: *const Task,
    n: usize,
    next: AtomicUsize,
}

struct Shared {
    generation: AtomicU64,
    job: Mutex<Option<Arc<JobHandle>>>,
    wake: Condvar,
    /// Workers still inside the current job.
    busy: AtomicUsize,
    done_lock: Mutex<()>,
    done: Condvar,
    shutdown: AtomicBool,
    panicked: AtomicBool,
}

struct JobHandle(Job);
// SAFETY: the raw task pointer refers to a `Sync` closure that outlives the job (see `run`).
unsafe impl Send for JobHandle {}
unsafe impl Sync for JobHandle {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
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
    /// A pool with `n_threads` compute threads in total, the caller included.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            busy: AtomicUsize::new(0),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("rllama-worker-{i}"))
                    .spawn(move || worker(shared))
                    .expect("spawn worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            n_threads,
        }
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
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
        // SAFETY: erase the closure's lifetime; we wait below until `busy` is zero, after
        // which no worker touches the job again.
        let f_static: *const Task = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const Task>(f as *const _)
        };
        let job = Arc::new(JobHandle(Job {
            f: f_static,
            n,
            next: AtomicUsize::new(0),
        }));
        self.shared.busy.store(self.workers.len(), Ordering::SeqCst);
        {
            // Bumped under the lock a parking worker checks it under: no lost wake-up.
            let mut slot = self.shared.job.lock().unwrap();
            *slot = Some(job.clone());
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();

        let caller = catch_unwind(AssertUnwindSafe(|| work(&job.0)));

        let mut step = 0u32;
        while self.shared.busy.load(Ordering::Acquire) != 0 {
            if !backoff(&mut step) {
                let g = self.shared.done_lock.lock().unwrap();
                if self.shared.busy.load(Ordering::Acquire) != 0 {
                    let _g = self
                        .shared
                        .done
                        .wait_timeout(g, std::time::Duration::from_millis(1))
                        .unwrap();
                }
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
                    let _guard = shared.wake.wait(guard).unwrap();
                }
            }
        }
        let job = shared.job.lock().unwrap().clone();
        if let Some(job) = job {
            if catch_unwind(AssertUnwindSafe(|| work(&job.0))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
        }
        if shared.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _g = shared.done_lock.lock().unwrap();
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
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
