//! NUMA: the machine's nodes, where compute threads go (`--numa`), where weight pages go
//! (`--numa-weights`), and where pages really are (the proof).
//!
//! Everything the kernel tells us is read through two roots (the sysfs root and a
//! `status` file of procfs) so tests feed fake topologies. What this process may use
//! (`Cpus_allowed_list`, `Mems_allowed_list`: `taskset`, `numactl` and the cgroup cpuset
//! all end up there) is honoured, never widened. Memory policy and page queries use the
//! raw syscalls (`mbind`, `move_pages`), so no libnuma is needed on the machine.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: cannot parse {what} {text:?}", path.display())]
    Parse {
        path: PathBuf,
        what: &'static str,
        text: String,
    },
    #[error("{0}")]
    Plan(String),
    #[error("{0}")]
    Memory(String),
}

/// Parses a kernel CPU or node list (`0-3,8,10-11`; empty means none).
pub fn parse_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// Formats a list the way the kernel does (`0-3,8`).
pub fn format_list(v: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: usize,
    /// Its online CPUs (empty for a memory-only node).
    pub cpus: Vec<usize>,
    /// Distances to every node, in the order of [`Topology::nodes`] (empty when unknown).
    pub distances: Vec<u32>,
    /// Total and free memory in KiB, when the node reports them.
    pub mem_total_kib: Option<u64>,
    pub mem_free_kib: Option<u64>,
}

/// The machine's nodes and what this process may use of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<Node>,
    /// CPUs this process may run on (`Cpus_allowed_list`).
    pub allowed_cpus: Vec<usize>,
    /// Nodes this process may allocate from (`Mems_allowed_list`).
    pub allowed_mems: Vec<usize>,
    /// The nodes of the thread's memory policy when it names some (`numactl --membind`,
    /// `--interleave`, `--preferred`); `None` for the default local policy.
    pub policy_mems: Option<Vec<usize>>,
}

fn read(path: &Path) -> Result<String, NumaError> {
    std::fs::read_to_string(path).map_err(|source| NumaError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    // "Node 0 MemTotal:       16318396 kB"
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .ends_with(key)
            .then(|| v.split_whitespace().next()?.parse().ok())?
    })
}

impl Topology {
    /// This process's view of the machine (`/sys`, `/proc/thread-self/status`).
    pub fn read() -> Result<Topology, NumaError> {
        let mut t = Topology::read_from(Path::new("/sys"), Path::new("/proc/thread-self/status"))?;
        t.policy_mems = thread_policy_nodes();
        Ok(t)
    }

    /// The nodes weights may be placed on: the allowed ones, narrowed to the memory
    /// policy's nodes when `numactl` set one (never widened past what it asked).
    pub fn usable_mems(&self) -> Vec<usize> {
        match &self.policy_mems {
            Some(p) => {
                let v: Vec<usize> = self
                    .allowed_mems
                    .iter()
                    .copied()
                    .filter(|n| p.contains(n))
                    .collect();
                if v.is_empty() {
                    self.allowed_mems.clone()
                } else {
                    v
                }
            }
            None => self.allowed_mems.clone(),
        }
    }

    /// The topology under a sysfs root and a procfs `status` file. A kernel without NUMA
    /// support (no `devices/system/node`) reads as one node holding every allowed CPU.
    pub fn read_from(sys: &Path, status: &Path) -> Result<Topology, NumaError> {
        let status_text = read(status)?;
        let list = |key: &'static str| -> Result<Option<Vec<usize>>, NumaError> {
            status_field(&status_text, key)
                .map(|v| {
                    parse_list(v).ok_or_else(|| NumaError::Parse {
                        path: status.to_path_buf(),
                        what: key,
                        text: v.to_string(),
                    })
                })
                .transpose()
        };
        let allowed_cpus = list("Cpus_allowed_list")?.ok_or_else(|| NumaError::Parse {
            path: status.to_path_buf(),
            what: "Cpus_allowed_list",
            text: String::new(),
        })?;
        let allowed_mems = list("Mems_allowed_list")?.unwrap_or_else(|| vec![0]);
        let node_dir = sys.join("devices/system/node");
        let mut ids: Vec<usize> = match std::fs::read_dir(&node_dir) {
            Ok(d) => d
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix("node")?.parse().ok()
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        ids.sort_unstable();
        if ids.is_empty() {
            return Ok(Topology {
                nodes: vec![Node {
                    id: 0,
                    cpus: allowed_cpus.clone(),
                    distances: vec![10],
                    mem_total_kib: None,
                    mem_free_kib: None,
                }],
                allowed_cpus,
                allowed_mems: vec![0],
                policy_mems: None,
            });
        }
        let mut nodes = Vec::with_capacity(ids.len());
        for &id in &ids {
            let dir = node_dir.join(format!("node{id}"));
            let p = dir.join("cpulist");
            let text = read(&p)?;
            let cpus = parse_list(&text).ok_or_else(|| NumaError::Parse {
                path: p.clone(),
                what: "cpulist",
                text: text.trim().to_string(),
            })?;
            // Distances list every possible node in id order; keep the present ones.
            let distances = std::fs::read_to_string(dir.join("distance"))
                .ok()
                .and_then(|t| {
                    let all: Vec<u32> = t
                        .split_whitespace()
                        .map(|x| x.parse().ok())
                        .collect::<Option<_>>()?;
                    if all.len() == ids.len() {
                        Some(all)
                    } else {
                        ids.iter().map(|&j| all.get(j).copied()).collect()
                    }
                })
                .unwrap_or_default();
            let meminfo = std::fs::read_to_string(dir.join("meminfo")).unwrap_or_default();
            nodes.push(Node {
                id,
                cpus,
                distances,
                mem_total_kib: meminfo_kib(&meminfo, "MemTotal"),
                mem_free_kib: meminfo_kib(&meminfo, "MemFree"),
            });
        }
        Ok(Topology {
            nodes,
            allowed_cpus,
            allowed_mems,
            policy_mems: None,
        })
    }

    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_of_cpu(&self, cpu: usize) -> Option<usize> {
        self.nodes
            .iter()
            .find(|n| n.cpus.binary_search(&cpu).is_ok())
            .map(|n| n.id)
    }

    /// The allowed CPUs of node `id`, ascending.
    pub fn allowed_cpus_of(&self, id: usize) -> Vec<usize> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .map(|n| {
                n.cpus
                    .iter()
                    .copied()
                    .filter(|c| self.allowed_cpus.binary_search(c).is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Nodes holding at least one allowed CPU, ascending.
    pub fn cpu_nodes(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|n| !self.allowed_cpus_of(n.id).is_empty())
            .map(|n| n.id)
            .collect()
    }

    /// Nodes to keep weight copies on for `replicate`: nodes that run our threads and
    /// that we may allocate on.
    pub fn replica_nodes(&self, plan: &ThreadPlan) -> Vec<usize> {
        let mut v: Vec<usize> = plan
            .nodes
            .iter()
            .copied()
            .filter(|n| self.usable_mems().contains(n))
            .collect();
        v.sort_unstable();
        v.dedup();
        if v.is_empty() {
            v.push(*self.usable_mems().first().unwrap_or(&0));
        }
        v
    }
}

/// The thread placement modes, with llama.cpp's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NumaMode {
    /// Spread threads evenly over the nodes, each pinned to a CPU of its node.
    Distribute,
    /// Stay on the node the process started on.
    Isolate,
    /// Use exactly the CPUs `numactl` (or `taskset`, or a cpuset) gave, in order.
    Numactl,
}

impl NumaMode {
    pub const NAMES: [&'static str; 3] = ["distribute", "isolate", "numactl"];

    pub fn name(self) -> &'static str {
        match self {
            NumaMode::Distribute => "distribute",
            NumaMode::Isolate => "isolate",
            NumaMode::Numactl => "numactl",
        }
    }
}

impl std::str::FromStr for NumaMode {
    type Err = String;
    fn from_str(s: &str) -> Result<NumaMode, String> {
        match s {
            "distribute" => Ok(NumaMode::Distribute),
            "isolate" => Ok(NumaMode::Isolate),
            "numactl" => Ok(NumaMode::Numactl),
            _ => Err(format!(
                "unknown NUMA mode {s:?} (expected one of {})",
                NumaMode::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for NumaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the weight pages go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightPlacement {
    /// Read in place from the mapped file: pages land where they are first read (or where
    /// the page cache already holds them).
    #[default]
    FirstTouch,
    /// An anonymous copy whose pages are spread round-robin over the allowed nodes.
    Interleave,
    /// One copy per node running our threads; each thread reads its node's copy.
    Replicate,
}

impl WeightPlacement {
    pub const NAMES: [&'static str; 3] = ["first-touch", "interleave", "replicate"];

    pub fn name(self) -> &'static str {
        match self {
            WeightPlacement::FirstTouch => "first-touch",
            WeightPlacement::Interleave => "interleave",
            WeightPlacement::Replicate => "replicate",
        }
    }
}

impl std::str::FromStr for WeightPlacement {
    type Err = String;
    fn from_str(s: &str) -> Result<WeightPlacement, String> {
        match s {
            "first-touch" => Ok(WeightPlacement::FirstTouch),
            "interleave" => Ok(WeightPlacement::Interleave),
            "replicate" => Ok(WeightPlacement::Replicate),
            _ => Err(format!(
                "unknown weight placement {s:?} (expected one of {})",
                WeightPlacement::NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for WeightPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where each compute thread runs: thread 0 is the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadPlan {
    /// The CPU of each thread, when each gets its own (`None`: not pinned, e.g. more
    /// threads than CPUs; then `masks` still confines them).
    pub cpus: Option<Vec<usize>>,
    /// The CPUs each thread may use (one CPU when pinned).
    pub masks: Vec<Vec<usize>>,
    /// The node of each thread (its CPU's node; for an unpinned thread, the node of the
    /// first CPU of its mask).
    pub nodes: Vec<usize>,
    /// For `distribute` and `isolate`: the CPUs the caller (thread 0, which computes too
    /// but is never pinned) is confined to, its node's allowed CPUs, as llama.cpp places
    /// its main thread. Threads the caller creates later inherit this mask.
    pub caller_mask: Option<Vec<usize>>,
}

/// Plans `n_threads` threads (caller first) on `topo` for `mode` (`None`: today's default,
/// the allowed CPUs in order, as `numactl`). `start_cpu` is the CPU the process runs on
/// now (for `isolate`). With more threads than CPUs nothing is pinned: two pinned busy
/// threads must never share a core.
pub fn plan_threads(
    topo: &Topology,
    mode: Option<NumaMode>,
    n_threads: usize,
    start_cpu: Option<usize>,
) -> Result<ThreadPlan, NumaError> {
    let n = n_threads.max(1);
    let node_of = |c: usize| topo.node_of_cpu(c).unwrap_or(0);
    if topo.allowed_cpus.is_empty() {
        return Err(NumaError::Plan("this process may run on no CPU".into()));
    }
    let order: Vec<usize> = match mode {
        None | Some(NumaMode::Numactl) => topo.allowed_cpus.clone(),
        Some(NumaMode::Isolate) => {
            let node = start_cpu
                .and_then(|c| topo.node_of_cpu(c))
                .or_else(|| topo.cpu_nodes().first().copied())
                .unwrap_or(0);
            let cpus = topo.allowed_cpus_of(node);
            if cpus.is_empty() {
                return Err(NumaError::Plan(format!(
                    "--numa isolate: node {node} has no CPU this process may use"
                )));
            }
            cpus
        }
        Some(NumaMode::Distribute) => {
            // Round-robin over the nodes: thread i on node i mod k, each node's CPUs in
            // order; a node that runs out drops out of the rotation.
            let mut per: Vec<std::collections::VecDeque<usize>> = topo
                .cpu_nodes()
                .into_iter()
                .map(|id| topo.allowed_cpus_of(id).into())
                .collect();
            let mut out = Vec::with_capacity(topo.allowed_cpus.len());
            while per.iter().any(|q| !q.is_empty()) {
                for q in per.iter_mut() {
                    if let Some(c) = q.pop_front() {
                        out.push(c);
                    }
                }
            }
            out
        }
    };
    if n <= order.len() {
        let cpus = order[..n].to_vec();
        let nodes: Vec<usize> = cpus.iter().map(|&c| node_of(c)).collect();
        return Ok(ThreadPlan {
            masks: cpus.iter().map(|&c| vec![c]).collect(),
            caller_mask: caller_mask(topo, mode, nodes[0]),
            nodes,
            cpus: Some(cpus),
        });
    }
    // Oversubscribed: confine, do not pin. Distribute still spreads threads over nodes.
    let masks: Vec<Vec<usize>> = match mode {
        Some(NumaMode::Distribute) => {
            let nodes = topo.cpu_nodes();
            (0..n)
                .map(|i| topo.allowed_cpus_of(nodes[i % nodes.len()]))
                .collect()
        }
        _ => vec![order.clone(); n],
    };
    let nodes: Vec<usize> = masks.iter().map(|m| node_of(m[0])).collect();
    Ok(ThreadPlan {
        cpus: None,
        caller_mask: caller_mask(topo, mode, nodes[0]),
        nodes,
        masks,
    })
}

fn caller_mask(topo: &Topology, mode: Option<NumaMode>, node: usize) -> Option<Vec<usize>> {
    match mode {
        Some(NumaMode::Distribute | NumaMode::Isolate) => {
            Some(topo.allowed_cpus_of(node)).filter(|m| !m.is_empty())
        }
        _ => None,
    }
}

/// The nodes weights go to: the allowed memory nodes for `interleave`, the nodes our
/// `threads` threads run on under `mode` (and may allocate on) for `replicate`, none for
/// `first-touch`.
pub fn weight_nodes(
    topo: &Topology,
    weights: WeightPlacement,
    mode: Option<NumaMode>,
    threads: usize,
) -> Result<Vec<usize>, NumaError> {
    Ok(match weights {
        WeightPlacement::FirstTouch => Vec::new(),
        WeightPlacement::Interleave => topo.usable_mems(),
        WeightPlacement::Replicate => {
            let plan = plan_threads(topo, mode, threads, current_cpu())?;
            topo.replica_nodes(&plan)
        }
    })
}

/// The calling thread's memory policy nodes (`get_mempolicy`), when the policy names
/// nodes (bind, interleave, preferred); `None` for the default policy or off Linux.
pub fn thread_policy_nodes() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        const WORDS: usize = 16;
        let bits = 8 * std::mem::size_of::<libc::c_ulong>();
        let mut mode: libc::c_int = 0;
        let mut mask = [0 as libc::c_ulong; WORDS];
        // SAFETY: mode and mask are valid for writes; maxnode matches the mask's bits; a
        // null address with flags 0 asks for the thread's policy.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut mode as *mut libc::c_int,
                mask.as_mut_ptr(),
                (WORDS * bits) as libc::c_ulong,
                std::ptr::null::<libc::c_void>(),
                0 as libc::c_ulong,
            )
        };
        // Mode flags live in the high bits; 0 is MPOL_DEFAULT, 4 MPOL_LOCAL.
        let mode = mode & 0xff;
        if rc != 0 || mode == 0 || mode == 4 {
            return None;
        }
        let nodes: Vec<usize> = (0..WORDS * bits)
            .filter(|&n| mask[n / bits] & (1 << (n % bits)) != 0)
            .collect();
        (!nodes.is_empty()).then_some(nodes)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The machine's topology, read once per process (`None` where it cannot be read).
pub fn machine() -> Option<&'static Topology> {
    static T: OnceLock<Option<Topology>> = OnceLock::new();
    T.get_or_init(|| Topology::read().ok()).as_ref()
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: no arguments; returns -1 on failure.
        let c = unsafe { libc::sched_getcpu() };
        (c >= 0).then_some(c as usize)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

thread_local! {
    static THREAD_NODE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Records the node of the calling (pinned) thread, for [`current_node`].
pub fn set_thread_node(node: Option<usize>) {
    THREAD_NODE.with(|n| n.set(node));
}

/// The node the calling thread computes on: the one recorded for a pinned pool thread,
/// else the node of the CPU it runs on now (0 when unknown).
pub fn current_node() -> usize {
    if let Some(n) = THREAD_NODE.with(|n| n.get()) {
        return n;
    }
    current_cpu()
        .and_then(|c| machine().and_then(|t| t.node_of_cpu(c)))
        .unwrap_or(0)
}

/// Page counts per node for a range of memory: the proof of placement.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PagePlacement {
    /// Resident pages per node id.
    pub per_node: BTreeMap<usize, u64>,
    /// Pages not resident (never touched, or swapped out).
    pub absent: u64,
    /// Pages the kernel would not report on (other errors).
    pub unknown: u64,
}

impl PagePlacement {
    pub fn total(&self) -> u64 {
        self.per_node.values().sum::<u64>() + self.absent + self.unknown
    }

    pub fn merge(&mut self, o: &PagePlacement) {
        for (k, v) in &o.per_node {
            *self.per_node.entry(*k).or_default() += v;
        }
        self.absent += o.absent;
        self.unknown += o.unknown;
    }

    /// The short form used in tables: `n0=1200 n1=1187` (plus `absent=` when any).
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .per_node
            .iter()
            .map(|(n, c)| format!("n{n}={c}"))
            .collect();
        if self.absent > 0 {
            parts.push(format!("absent={}", self.absent));
        }
        if self.unknown > 0 {
            parts.push(format!("unknown={}", self.unknown));
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(" ")
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "per_node": self.per_node.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
            "absent": self.absent,
            "unknown": self.unknown,
        })
    }
}

pub fn page_size() -> usize {
    #[cfg(unix)]
    {
        // SAFETY: plain query.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            return p as usize;
        }
    }
    4096
}

/// Where the pages of `[ptr, ptr + len)` are, by asking the kernel about each page
/// (`move_pages` with no target nodes only reports). Off Linux: everything `unknown`.
pub fn page_placement(ptr: *const u8, len: usize) -> PagePlacement {
    let ps = page_size();
    let start = (ptr as usize) / ps * ps;
    let end = (ptr as usize + len).div_ceil(ps) * ps;
    let n_pages = (end - start) / ps;
    let mut out = PagePlacement::default();
    #[cfg(target_os = "linux")]
    {
        const CHUNK: usize = 4096;
        let mut pages: Vec<*mut libc::c_void> = Vec::with_capacity(CHUNK);
        let mut status = vec![0i32; CHUNK];
        let mut p = start;
        while p < end {
            pages.clear();
            while p < end && pages.len() < CHUNK {
                pages.push(p as *mut libc::c_void);
                p += ps;
            }
            let k = pages.len();
            // SAFETY: `pages` and `status` hold k entries; a null node array only queries.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0,
                    k as libc::c_ulong,
                    pages.as_ptr(),
                    std::ptr::null::<i32>(),
                    status.as_mut_ptr(),
                    0,
                )
            };
            if rc < 0 {
                out.unknown += k as u64;
                continue;
            }
            for &s in &status[..k] {
                if s >= 0 {
                    *out.per_node.entry(s as usize).or_default() += 1;
                } else if s == -libc::ENOENT || s == -libc::EFAULT {
                    out.absent += 1;
                } else {
                    out.unknown += 1;
                }
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        out.unknown = n_pages as u64;
    }
    let _ = n_pages;
    out
}

/// A memory policy for [`NodeMemory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Pages round-robin over these nodes.
    Interleave(Vec<usize>),
    /// Pages only on this node.
    Bind(usize),
}

#[cfg(target_os = "linux")]
const MPOL_BIND: i32 = 2;
#[cfg(target_os = "linux")]
const MPOL_INTERLEAVE: i32 = 3;

/// Private anonymous memory of `len` bytes (at least one), zero until written, unmapped on
/// drop; a heap buffer off Linux.
pub struct AnonMap {
    ptr: *mut u8,
    len: usize,
    #[cfg(not(target_os = "linux"))]
    _heap: Vec<u8>,
}

// SAFETY: the memory is owned; shared access is read-only (writes need `&mut`).
unsafe impl Send for AnonMap {}
unsafe impl Sync for AnonMap {}

impl AnonMap {
    pub fn new(len: usize) -> std::io::Result<AnonMap> {
        let len = len.max(1);
        #[cfg(target_os = "linux")]
        {
            // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            Ok(AnonMap {
                ptr: ptr.cast(),
                len,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let mut heap = vec![0u8; len];
            Ok(AnonMap {
                ptr: heap.as_mut_ptr(),
                len,
                _heap: heap,
            })
        }
    }

    /// Asks for transparent huge pages (one TLB entry per 2 MiB while the bytes stream);
    /// advice only, without THP the pages stay small.
    pub fn advise_huge_pages(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: advice on our own mapping.
        unsafe {
            libc::madvise(self.ptr.cast(), self.len, libc::MADV_HUGEPAGE);
        }
    }

    /// Asks for small pages only: a huge page is placed whole on one node, which would
    /// make an interleaved copy alternate in 2 MiB steps instead of page by page.
    pub fn advise_small_pages(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: advice on our own mapping.
        unsafe {
            libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes and uniquely borrowed through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for as long as self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: our own mapping, unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Anonymous memory whose pages follow a [`Policy`], filled once from a byte slice. The
/// policy is set before any page is touched, so every page is allocated where it belongs.
pub struct NodeMemory {
    mem: AnonMap,
    pub policy: Policy,
}

impl NodeMemory {
    /// `len` zero bytes placed by `policy` (pages are allocated, under the policy, when
    /// first written).
    pub fn zeroed(len: usize, policy: Policy) -> Result<NodeMemory, NumaError> {
        NodeMemory::with_policy(len, policy, |_| {})
    }

    /// A copy of `src` placed by `policy`. Fails with the kernel's reason (a node without
    /// memory, a node outside `Mems_allowed`, out of memory).
    pub fn copy_of(src: &[u8], policy: Policy) -> Result<NodeMemory, NumaError> {
        NodeMemory::with_policy(src.len(), policy, |dst| {
            dst[..src.len()].copy_from_slice(src)
        })
    }

    /// Maps `len` bytes, sets the policy before any page is touched, then lets `fill`
    /// write them (the first touch, under the policy).
    fn with_policy(
        len: usize,
        policy: Policy,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<NodeMemory, NumaError> {
        let mem = AnonMap::new(len)
            .map_err(|e| NumaError::Memory(format!("cannot map {} MiB: {e}", len.max(1) >> 20)))?;
        let mut mem = NodeMemory { mem, policy };
        #[cfg(target_os = "linux")]
        {
            let policy = &mem.policy;
            let (mode, nodes) = match policy {
                Policy::Interleave(n) => (MPOL_INTERLEAVE, n.clone()),
                Policy::Bind(n) => (MPOL_BIND, vec![*n]),
            };
            let max = nodes.iter().copied().max().unwrap_or(0);
            let bits = 8 * std::mem::size_of::<libc::c_ulong>();
            let mut mask = vec![0 as libc::c_ulong; max / bits + 1];
            for &n in &nodes {
                mask[n / bits] |= 1 << (n % bits);
            }
            // SAFETY: the range is our own mapping; the mask holds mask.len() words and
            // maxnode counts its bits plus one (the kernel's convention).
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mbind,
                    mem.mem.as_ptr(),
                    mem.mem.len() as libc::c_ulong,
                    mode as libc::c_ulong,
                    mask.as_ptr(),
                    (mask.len() * bits + 1) as libc::c_ulong,
                    0 as libc::c_uint,
                )
            };
            if rc != 0 {
                return Err(NumaError::Memory(format!(
                    "mbind({policy:?}) failed: {} (is every node allowed to this process \
                     and does it have memory?)",
                    std::io::Error::last_os_error()
                )));
            }
        }
        // Interleaving is page by page: with transparent huge pages the kernel would
        // place 2 MiB at a time, and a small copy would split unevenly between nodes
        // (seen in the lab: 2467 / 1955 pages of an 18 MB model).
        if matches!(mem.policy, Policy::Interleave(_)) {
            mem.mem.advise_small_pages();
        }
        fill(mem.bytes_mut());
        Ok(mem)
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.mem.bytes_mut()
    }

    pub fn bytes(&self) -> &[u8] {
        self.mem.bytes()
    }

    pub fn placement(&self) -> PagePlacement {
        page_placement(self.mem.as_ptr(), self.mem.len())
    }
}

/// The weights copied out of the file into node memory: one interleaved copy, or one copy
/// per node (`replicate`). Offsets are those of the file's data section.
pub struct WeightCopies {
    /// File offset of the first copied byte.
    pub base: usize,
    /// (node, memory) per copy; for `interleave` one entry with node `usize::MAX`.
    copies: Vec<(usize, NodeMemory)>,
    /// Copy index per node id (nodes without their own copy read copy 0).
    by_node: Vec<usize>,
}

impl WeightCopies {
    /// Copies `src` (the file's bytes from `base` on) as `placement` asks, over the
    /// `nodes` given (the allowed memory nodes for interleave, the replica nodes for
    /// replicate). Replication is refused up front when a node has too little free memory.
    pub fn new(
        src: &[u8],
        base: usize,
        placement: WeightPlacement,
        nodes: &[usize],
        topo: Option<&Topology>,
    ) -> Result<Option<WeightCopies>, NumaError> {
        let copies = match placement {
            WeightPlacement::FirstTouch => return Ok(None),
            WeightPlacement::Interleave => {
                vec![(
                    usize::MAX,
                    NodeMemory::copy_of(src, Policy::Interleave(nodes.to_vec()))?,
                )]
            }
            WeightPlacement::Replicate => {
                if let Some(t) = topo {
                    for &n in nodes {
                        let free = t
                            .nodes
                            .iter()
                            .find(|x| x.id == n)
                            .and_then(|x| x.mem_free_kib);
                        if let Some(free) = free {
                            if (src.len() as u64) > free * 1024 {
                                return Err(NumaError::Memory(format!(
                                    "--numa-weights replicate needs {} MiB on each of nodes {} \
                                     ({} MiB in all), node {n} has {} MiB free",
                                    src.len() >> 20,
                                    format_list(nodes),
                                    (src.len() * nodes.len()) >> 20,
                                    free >> 10
                                )));
                            }
                        }
                    }
                }
                nodes
                    .iter()
                    .map(|&n| NodeMemory::copy_of(src, Policy::Bind(n)).map(|m| (n, m)))
                    .collect::<Result<_, _>>()?
            }
        };
        let max = copies
            .iter()
            .map(|c| c.0)
            .filter(|&n| n != usize::MAX)
            .max();
        let mut by_node = vec![0; max.map_or(0, |m| m + 1)];
        for (i, (n, _)) in copies.iter().enumerate() {
            if *n != usize::MAX {
                by_node[*n] = i;
            }
        }
        Ok(Some(WeightCopies {
            base,
            copies,
            by_node,
        }))
    }

    pub fn len(&self) -> usize {
        self.copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// Bytes `[off, off + len)` of the file (`off` a file offset) in copy `i`.
    pub fn slice(&self, i: usize, off: usize, len: usize) -> &[u8] {
        &self.copies[i].1.bytes()[off - self.base..off - self.base + len]
    }

    /// As [`WeightCopies::slice`], from the calling thread's node's copy.
    #[inline]
    pub fn local(&self, off: usize, len: usize) -> &[u8] {
        let i = self.by_node.get(current_node()).copied().unwrap_or(0);
        self.slice(i, off, len)
    }

    /// Per copy: its node (`None` for an interleaved copy) and where its pages are.
    pub fn placement(&self) -> Vec<(Option<usize>, PagePlacement)> {
        self.copies
            .iter()
            .map(|(n, m)| ((*n != usize::MAX).then_some(*n), m.placement()))
            .collect()
    }

    /// Total bytes held.
    pub fn bytes(&self) -> usize {
        self.copies.iter().map(|c| c.1.mem.len()).sum()
    }
}

/// Reads one byte per page of `bytes` so every page is resident (the first touch of a
/// file mapping); returns a value so the reads are not optimised away.
pub fn touch_pages(bytes: &[u8]) -> u64 {
    let ps = page_size();
    let mut acc = 0u64;
    let mut i = 0;
    while i < bytes.len() {
        // SAFETY: in bounds; volatile so each page is really read.
        acc = acc.wrapping_add(unsafe { std::ptr::read_volatile(bytes.as_ptr().add(i)) } as u64);
        i += ps;
    }
    acc
}

#[cfg(test)]
mod tests;
