//! `rbench membw`: main-memory read bandwidth, the ceiling of decode speed (every generated
//! token streams all the weights once; the tg roofline note of `rbench -m …` gives the
//! bandwidth a model actually reached).
//!
//! ```text
//! rbench membw [-t N] [--size-mib M] [-r R] [--no-pin] [--numa]
//! ```
//!
//! The threads are our own `runtime::pool::ThreadPool`, pinned as the engine pins them, and
//! they share out the buffer the way the engine shares out matmul rows: small tasks handed
//! out from an atomic counter. Each task sums its slice of one large buffer (far above the
//! caches; written first so every page is resident) with AVX2 loads where the CPU has them.
//! GB = 1e9 bytes.
//!
//! On x86 a second row reads the same buffer with a software prefetch of every cache line
//! 8 KiB ahead of the loads (as the decode kernels read their weights), passes of the two
//! alternated so both meet the same memory state. A plain read can fall short of what a
//! prefetching reader gets (our Zen 5 VM: 3-5% at one and at two threads, slow memory
//! state), and a roofline against the plain read alone would flatter a decode that
//! prefetches.
//!
//! `--numa` adds the node matrix: for every node with CPUs we may use, threads pinned on
//! that node's CPUs read a buffer bound (`mbind`) to each memory node in turn, so the
//! diagonal is local bandwidth and the rest is what crossing the interconnect costs. The
//! buffer's pages are queried afterwards and printed beside each figure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use runtime::pool::{PoolOptions, SharedMut, ThreadPool};

use crate::llama_bench::cli::default_threads;
use crate::llama_bench::report::{load_average, load_note};
use crate::stats;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "rbench membw",
    bin_name = "rbench membw",
    about = "Memory read bandwidth with rllama's thread pool (the decode roofline)"
)]
pub struct MembwArgs {
    /// Threads [default: available cores, as for the engine benchmark]
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Option<usize>,
    /// Buffer size in MiB (shared by all threads; keep it well above the caches)
    #[arg(long = "size-mib", value_name = "M", default_value_t = 1024)]
    pub size_mib: usize,
    /// Timed passes over the buffer
    #[arg(
        short = 'r',
        long = "repetitions",
        value_name = "R",
        default_value_t = 5
    )]
    pub repetitions: usize,
    /// Do not pin the threads to their own CPUs
    #[arg(long = "no-pin")]
    pub no_pin: bool,
    /// Also measure every (CPU node, memory node) pair: the threads on one node's CPUs
    /// read a buffer bound to one node (local on the diagonal, remote off it)
    #[arg(long = "numa")]
    pub numa: bool,
}

/// Bytes per task: large enough that handing out tasks costs nothing next to reading them,
/// small enough that the threads finish together.
const TASK_BYTES: usize = 1 << 20;
const TASK_WORDS: usize = TASK_BYTES / 8;

/// The summing kernel in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Scalar,
    Avx2,
    /// AVX2 loads, each cache line prefetched [`PREFETCH_AHEAD`] bytes before it is read.
    Avx2Prefetch,
}

/// How far ahead [`Kernel::Avx2Prefetch`] asks for the lines it will read.
pub const PREFETCH_AHEAD: usize = 8 << 10;

impl Kernel {
    /// The best kernel this CPU runs.
    pub fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return Kernel::Avx2;
        }
        Kernel::Scalar
    }

    /// The kernels `rbench membw` measures on this CPU: the plain read, then (on x86
    /// with AVX2) the prefetching one.
    pub fn measured() -> Vec<Kernel> {
        match Kernel::detect() {
            Kernel::Scalar => vec![Kernel::Scalar],
            _ => vec![Kernel::Avx2, Kernel::Avx2Prefetch],
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx2Prefetch => "avx2+prefetch",
        }
    }

    /// Wrapping sum of `xs`.
    pub fn sum(self, xs: &[u64]) -> u64 {
        match self {
            Kernel::Scalar => sum_scalar(xs),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: only chosen by `detect` when the CPU has AVX2 (tests do the same).
            Kernel::Avx2 => unsafe { sum_avx2::<false>(xs) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::Avx2Prefetch => unsafe { sum_avx2::<true>(xs) },
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx2 | Kernel::Avx2Prefetch => {
                unreachable!("AVX2 is never detected off x86_64")
            }
        }
    }
}

/// The scalar twin: a plain wrapping sum.
pub fn sum_scalar(xs: &[u64]) -> u64 {
    xs.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// Four independent 256-bit accumulators keep several loads in flight per thread;
/// `PREFETCH`: each 128-byte block first asks for its two cache lines [`PREFETCH_AHEAD`]
/// bytes on (a prefetch never faults, so past the slice's end is fine).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2<const PREFETCH: bool>(xs: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let blocks = xs.chunks_exact(16);
    let rest = blocks.remainder();
    for b in blocks {
        let p = b.as_ptr() as *const __m256i;
        if PREFETCH {
            let ahead = b.as_ptr().cast::<i8>().wrapping_add(PREFETCH_AHEAD);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        }
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: `b` holds 16 u64 = four 32-byte vectors; unaligned loads.
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(p.add(k)));
        }
    }
    let v = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v);
    lanes
        .iter()
        .chain(rest)
        .fold(0u64, |a, &x| a.wrapping_add(x))
}

/// One bandwidth measurement.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub threads: usize,
    pub bytes: u64,
    pub kernel: Kernel,
    /// The CPUs the threads were pinned to, caller first.
    pub pinned: Option<Vec<usize>>,
    /// GB/s of each timed pass.
    pub samples_gbps: Vec<f64>,
}

impl Measurement {
    pub fn median(&self) -> f64 {
        stats::percentile(&self.samples_gbps, 50.0)
    }

    pub fn min(&self) -> f64 {
        self.samples_gbps
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    pub fn max(&self) -> f64 {
        self.samples_gbps
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }
}

/// Reads a `size_mib` buffer `repetitions` times with `threads` pool threads (the plain
/// read).
pub fn measure(
    threads: usize,
    size_mib: usize,
    repetitions: usize,
    pin: bool,
) -> Result<Measurement> {
    let mut m = measure_kernels(threads, size_mib, repetitions, pin, &[Kernel::detect()])?;
    Ok(m.remove(0))
}

/// [`measure`] with each of `kernels` in turn, pass by pass (so all meet the same memory
/// states); one measurement per kernel, in order.
pub fn measure_kernels(
    threads: usize,
    size_mib: usize,
    repetitions: usize,
    pin: bool,
    kernels: &[Kernel],
) -> Result<Vec<Measurement>> {
    if threads == 0 || size_mib == 0 || repetitions == 0 {
        bail!("threads, --size-mib and repetitions must be > 0");
    }
    let bytes = size_mib
        .checked_mul(1 << 20)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| anyhow::anyhow!("--size-mib {size_mib} is too large"))?;
    let words = bytes / 8;
    let pool = ThreadPool::with_options(threads, PoolOptions { pin, numa: None });
    let mut buf = vec![0u64; words];
    let samples = passes(&pool, &mut buf, repetitions, kernels)?;
    Ok(kernels
        .iter()
        .zip(samples)
        .map(|(&kernel, samples_gbps)| Measurement {
            threads,
            bytes: bytes as u64,
            kernel,
            pinned: pool.pinned_cpus(),
            samples_gbps,
        })
        .collect())
}

/// Writes `buf` from the pool (so every page is resident, first touched by a reader), then
/// times `repetitions` read passes per kernel, the kernels taking turns (after one untimed
/// pass each); GB/s per pass, per kernel.
fn passes(
    pool: &ThreadPool,
    buf: &mut [u64],
    repetitions: usize,
    kernels: &[Kernel],
) -> Result<Vec<Vec<f64>>> {
    let words = buf.len();
    let bytes = words * 8;
    let n_tasks = words.div_ceil(TASK_WORDS);
    let task = |t: usize| t * TASK_WORDS..((t + 1) * TASK_WORDS).min(words);
    // Untouched pages would all read the shared zero page: write every word first.
    let out = SharedMut::new(buf);
    pool.run(n_tasks, &|t| {
        let r = task(t);
        // SAFETY: tasks cover disjoint ranges within the buffer.
        let dst = unsafe { out.slice(r.start, r.len()) };
        for (j, w) in r.zip(dst) {
            *w = j as u64;
        }
    });
    let buf: &[u64] = buf;
    // The sum of 0..words, wrapped as the kernels wrap: proves every word was read once.
    let expect = ((words as u128) * (words as u128).saturating_sub(1) / 2) as u64;
    let pass = |kernel: Kernel| -> Result<f64> {
        let total = AtomicU64::new(0);
        let t0 = Instant::now();
        pool.run(n_tasks, &|t| {
            let s = kernel.sum(&buf[task(t)]);
            total.fetch_add(s, Ordering::Relaxed);
        });
        let secs = t0.elapsed().as_secs_f64();
        let got = total.into_inner();
        if got != expect {
            bail!("checksum mismatch: {got} != {expect} (a task was lost or repeated)");
        }
        Ok(bytes as f64 / secs.max(1e-9) / 1e9)
    };
    for &k in kernels {
        pass(k)?; // untimed: wakes the workers and warms the TLB
    }
    let mut out = vec![Vec::with_capacity(repetitions); kernels.len()];
    for _ in 0..repetitions {
        for (samples, &k) in out.iter_mut().zip(kernels) {
            samples.push(pass(k)?);
        }
    }
    Ok(out)
}

/// One cell of the NUMA matrix.
#[derive(Debug, Clone)]
pub struct NodePair {
    pub cpu_node: usize,
    pub mem_node: usize,
    pub m: Measurement,
    /// Where the buffer's pages were (the proof that it sat on `mem_node`).
    pub pages: runtime::numa::PagePlacement,
}

/// Every (CPU node, memory node) pair: up to `threads` threads (default: all of the
/// node's allowed CPUs) pinned on one node's CPUs read a buffer bound to one node.
pub fn numa_matrix(
    threads: Option<usize>,
    size_mib: usize,
    repetitions: usize,
) -> Result<Vec<NodePair>> {
    use runtime::affinity::CpuSet;
    use runtime::numa::{NodeMemory, Policy, Topology};
    let topo = Topology::read().map_err(|e| anyhow::anyhow!("{e}"))?;
    let bytes = size_mib << 20;
    let saved = CpuSet::of_current_thread();
    let mut out = Vec::new();
    let result = (|| -> Result<()> {
        for c in topo.cpu_nodes() {
            let cpus = topo.allowed_cpus_of(c);
            let n = threads.unwrap_or(cpus.len()).clamp(1, cpus.len());
            // Confine the caller (and so the pool's plan) to this node's CPUs.
            let set = CpuSet::from_cpus(&cpus)
                .ok_or_else(|| anyhow::anyhow!("node {c}: CPUs {cpus:?} cannot be set"))?;
            if !set.apply_to_current_thread() {
                bail!("cannot move to node {c}'s CPUs {cpus:?}");
            }
            let pool = ThreadPool::with_options(
                n,
                PoolOptions {
                    pin: true,
                    numa: None,
                },
            );
            for m in topo.usable_mems() {
                let mut mem = NodeMemory::zeroed(bytes, Policy::Bind(m))
                    .map_err(|e| anyhow::anyhow!("node {m}: {e}"))?;
                let raw = mem.bytes_mut();
                // SAFETY: the mapping is page-aligned and `bytes` is a multiple of 8.
                let words: &mut [u64] = unsafe {
                    std::slice::from_raw_parts_mut(raw.as_mut_ptr().cast(), raw.len() / 8)
                };
                let kernel = Kernel::detect();
                let samples_gbps = passes(&pool, words, repetitions, &[kernel])?.remove(0);
                out.push(NodePair {
                    cpu_node: c,
                    mem_node: m,
                    pages: mem.placement(),
                    m: Measurement {
                        threads: n,
                        bytes: bytes as u64,
                        kernel,
                        pinned: pool.pinned_cpus(),
                        samples_gbps,
                    },
                });
            }
        }
        Ok(())
    })();
    if let Some(s) = saved {
        s.apply_to_current_thread();
    }
    result.map(|_| out)
}

/// The NUMA matrix as markdown: median GB/s, CPU nodes down, memory nodes across.
pub fn matrix_markdown(cells: &[NodePair]) -> String {
    let mut mems: Vec<usize> = cells.iter().map(|c| c.mem_node).collect();
    mems.sort_unstable();
    mems.dedup();
    let mut cpus: Vec<usize> = cells.iter().map(|c| c.cpu_node).collect();
    cpus.sort_unstable();
    cpus.dedup();
    let mut s = String::from("| threads on node | threads |");
    for m in &mems {
        s += &format!(" memory on node {m} GB/s |");
    }
    s += "\n|---|---:|";
    for _ in &mems {
        s += "---:|";
    }
    s += "\n";
    for c in &cpus {
        let n = cells
            .iter()
            .find(|x| x.cpu_node == *c)
            .map_or(0, |x| x.m.threads);
        s += &format!("| {c} | {n} |");
        for m in &mems {
            match cells.iter().find(|x| x.cpu_node == *c && x.mem_node == *m) {
                Some(x) => {
                    let on = x.pages.per_node.get(m).copied().unwrap_or(0);
                    let share = 100.0 * on as f64 / x.pages.total().max(1) as f64;
                    s += &format!(" {:.2} ({share:.0}% of pages on {m}) |", x.m.median());
                }
                None => s += " - |",
            }
        }
        s += "\n";
    }
    s
}

/// Several results as one markdown table, a row each.
pub fn markdown_rows(ms: &[Measurement]) -> String {
    const HEADS: [&str; 8] = [
        "threads",
        "pinned CPUs",
        "buffer MiB",
        "kernel",
        "reps",
        "median GB/s",
        "min GB/s",
        "max GB/s",
    ];
    let rows: Vec<[String; 8]> = ms
        .iter()
        .map(|m| {
            let pinned = m.pinned.as_ref().map_or_else(
                || "no".to_string(),
                |c| c.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            );
            [
                m.threads.to_string(),
                pinned,
                (m.bytes >> 20).to_string(),
                m.kernel.name().to_string(),
                m.samples_gbps.len().to_string(),
                format!("{:.2}", m.median()),
                format!("{:.2}", m.min()),
                format!("{:.2}", m.max()),
            ]
        })
        .collect();
    let w: Vec<usize> = (0..HEADS.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].len())
                .fold(HEADS[i].len(), usize::max)
        })
        .collect();
    let row = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut s = row(HEADS
        .iter()
        .zip(&w)
        .map(|(h, &w)| format!("{h:>w$}"))
        .collect());
    s += &row(w
        .iter()
        .map(|&w| format!("{}:", "-".repeat(w - 1)))
        .collect());
    for r in &rows {
        s += &row(r.iter().zip(&w).map(|(v, &w)| format!("{v:>w$}")).collect());
    }
    s
}

/// Entry point for `rbench membw …` (`args[0]` is `membw`).
pub fn main_with_args(args: Vec<String>) -> std::process::ExitCode {
    let a: MembwArgs = match crate::parse_args(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    if let Some(n) = load_note(load_average(), default_threads()) {
        eprintln!("rbench: {n}");
    }
    let threads = a.threads.unwrap_or_else(default_threads);
    let kernels = Kernel::measured();
    match measure_kernels(threads, a.size_mib, a.repetitions, !a.no_pin, &kernels) {
        Ok(ms) => {
            let m = &ms[0];
            print!("{}", markdown_rows(&ms));
            println!(
                "\nread bandwidth: {} MiB summed by {} thread(s) in {} KiB tasks, median of {} \
                 passes; GB = 1e9 bytes. Compare with the tg roofline note of `rbench -m MODEL \
                 -t {}`.",
                m.bytes >> 20,
                m.threads,
                TASK_BYTES >> 10,
                m.samples_gbps.len(),
                m.threads,
            );
            if ms.len() > 1 {
                println!(
                    "{} reads each line after a prefetch {} KiB ahead, as the decode kernels \
                     do; the kernels' passes alternate. The higher row is the ceiling to \
                     compare with.",
                    ms[1].kernel.name(),
                    PREFETCH_AHEAD >> 10
                );
            }
            if a.numa {
                match numa_matrix(a.threads, a.size_mib, a.repetitions) {
                    Ok(cells) => {
                        println!("\n{}", matrix_markdown(&cells));
                        println!(
                            "per node pair: the threads pinned on one node's CPUs, the buffer \
                             bound (mbind) to one node; median GB/s of {} passes.",
                            a.repetitions
                        );
                    }
                    Err(e) => {
                        eprintln!("rbench: error: --numa: {e:#}");
                        return std::process::ExitCode::FAILURE;
                    }
                }
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rbench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn kernels_agree_with_the_scalar_twin() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for len in [0, 1, 15, 16, 17, 63, 64, 1000, 4099] {
            let xs: Vec<u64> = (0..len).map(|_| rng.gen()).collect();
            let want = sum_scalar(&xs);
            for k in Kernel::measured() {
                assert_eq!(k.sum(&xs), want, "{k:?} len {len}");
            }
            // Unaligned starts too.
            if len > 3 {
                assert_eq!(Kernel::detect().sum(&xs[3..]), sum_scalar(&xs[3..]));
            }
        }
    }

    #[test]
    fn kernels_take_turns_and_print_a_row_each() {
        let ms = measure_kernels(1, 8, 2, true, &Kernel::measured()).unwrap();
        assert_eq!(ms.len(), Kernel::measured().len());
        for (m, k) in ms.iter().zip(Kernel::measured()) {
            assert_eq!(m.kernel, k);
            assert_eq!(m.samples_gbps.len(), 2);
            assert!(m.samples_gbps.iter().all(|&g| g.is_finite() && g > 0.0));
        }
        let t = markdown_rows(&ms);
        assert_eq!(t.lines().count(), 2 + ms.len(), "{t}");
        let width = t.lines().next().unwrap().chars().count();
        assert!(t.lines().all(|l| l.chars().count() == width), "{t}");
    }

    #[test]
    fn small_measurement_is_positive_and_checked() {
        let m = measure(2, 8, 2, true).unwrap();
        assert_eq!(m.samples_gbps.len(), 2);
        assert!(m.samples_gbps.iter().all(|&g| g.is_finite() && g > 0.0));
        assert!(m.min() <= m.median() && m.median() <= m.max());
        let t = markdown_rows(std::slice::from_ref(&m));
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(t
            .lines()
            .all(|l| l.chars().count() == t.lines().next().unwrap().chars().count()));
    }

    #[test]
    fn numa_matrix_covers_every_node_pair_with_pages_where_bound() {
        let cells = numa_matrix(Some(1), 8, 1).unwrap();
        let topo = runtime::numa::Topology::read().unwrap();
        assert_eq!(
            cells.len(),
            topo.cpu_nodes().len() * topo.usable_mems().len()
        );
        for c in &cells {
            assert_eq!(
                c.pages.per_node.get(&c.mem_node),
                Some(&((8 << 20) / runtime::numa::page_size() as u64)),
                "{c:?}"
            );
            assert!(c.m.median() > 0.0);
        }
        let t = matrix_markdown(&cells);
        assert!(t.contains("memory on node"), "{t}");
    }
}
