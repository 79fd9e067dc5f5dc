//! What machine a result came from, written into every result file so runs on a laptop
//! and a server (or the lab guest) merge into one comparison keyed by machine: CPU model
//! and ISA flags, cores / threads / SMT, NUMA nodes and distances, memory, kernel release
//! and its sched_ext support, the scheduler binaries (hashes), cpufreq governor, THP and
//! the cgroup version.

use std::fs;
use std::path::Path;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::roots::Roots;

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The ISA flags users compare machines by.
const FLAGS: [&str; 10] = [
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "asimd",
    "asimddp",
];

/// Reads the fingerprint from `roots` (sysfs, procfs) and hashes `scx_bins`.
pub fn collect(roots: &Roots, scx_bins: &[(String, std::path::PathBuf)]) -> Value {
    let cpuinfo = read(&roots.proc.join("cpuinfo")).unwrap_or_default();
    let field = |k: &str| {
        cpuinfo.lines().find_map(|l| {
            let (a, b) = l.split_once(':')?;
            (a.trim() == k).then(|| b.trim().to_string())
        })
    };
    let model = field("model name")
        .or_else(|| field("Model"))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let flags_line = field("flags")
        .or_else(|| field("Features"))
        .unwrap_or_default();
    let flags: Vec<&str> = FLAGS
        .iter()
        .copied()
        .filter(|f| flags_line.split_whitespace().any(|x| x == *f))
        .collect();
    // Topology: logical CPUs, distinct (package, core) pairs.
    let cpu_dir = roots.sys.join("devices/system/cpu");
    let mut logical = 0usize;
    let mut cores = std::collections::BTreeSet::new();
    let mut packages = std::collections::BTreeSet::new();
    if let Ok(rd) = fs::read_dir(&cpu_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("cpu") || name[3..].parse::<u32>().is_err() {
                continue;
            }
            let topo = e.path().join("topology");
            let pkg = read(&topo.join("physical_package_id")).unwrap_or_default();
            let core = read(&topo.join("core_id")).unwrap_or_else(|| name.clone());
            logical += 1;
            packages.insert(pkg.clone());
            cores.insert((pkg, core));
        }
    }
    let threads_per_core = if cores.is_empty() {
        1
    } else {
        logical.div_ceil(cores.len())
    };
    // NUMA nodes.
    let mut nodes = Vec::new();
    let node_dir = roots.sys.join("devices/system/node");
    if let Ok(rd) = fs::read_dir(&node_dir) {
        let mut ids: Vec<u32> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
            .collect();
        ids.sort_unstable();
        for id in ids {
            let d = node_dir.join(format!("node{id}"));
            nodes.push(json!({
                "id": id,
                "cpus": read(&d.join("cpulist")).unwrap_or_default(),
                "distance": read(&d.join("distance")).unwrap_or_default(),
            }));
        }
    }
    let meminfo = read(&roots.proc.join("meminfo")).unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let release = read(&roots.proc.join("sys/kernel/osrelease")).unwrap_or_default();
    let kconfig = read(&Path::new("/boot").join(format!("config-{release}"))).and_then(|c| {
        c.lines()
            .find(|l| {
                l.starts_with("CONFIG_SCHED_CLASS_EXT")
                    || l.contains("CONFIG_SCHED_CLASS_EXT is not set")
            })
            .map(String::from)
    });
    let bracketed = |p: &Path| {
        read(p).and_then(|s| {
            let a = s.find('[')?;
            let b = s[a..].find(']')? + a;
            Some(s[a + 1..b].to_string())
        })
    };
    let cgroup = if roots.sys.join("fs/cgroup/cgroup.controllers").exists() {
        "v2"
    } else if roots.cgroup2.is_some() {
        "hybrid (v1 controllers, v2 unified tree)"
    } else {
        "v1"
    };
    let schedulers: Vec<Value> = scx_bins
        .iter()
        .map(|(name, path)| {
            let bytes = fs::read(path).unwrap_or_default();
            let h = Sha256::digest(&bytes);
            json!({
                "name": name,
                "path": path.display().to_string(),
                "size": bytes.len(),
                "sha256": h.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            })
        })
        .collect();
    let hostname = read(&roots.proc.join("sys/kernel/hostname")).unwrap_or_default();
    let id_src = format!(
        "{model}|{logical}|{}|{release}|{hostname}",
        mem_kib / (1024 * 1024)
    );
    let id: String = Sha256::digest(id_src.as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    json!({
        "id": id,
        "hostname": hostname,
        "cpu_model": model,
        "isa_flags": flags,
        "logical_cpus": logical,
        "cores": cores.len(),
        "packages": packages.len(),
        "threads_per_core": threads_per_core,
        "numa_nodes": nodes,
        "mem_total_kib": mem_kib,
        "kernel_release": release,
        "sched_ext_sysfs": roots.sched_ext().is_dir(),
        "kernel_config_sched_class_ext": kconfig,
        "schedulers": schedulers,
        "cpufreq_governor": read(&cpu_dir.join("cpu0/cpufreq/scaling_governor")),
        "thp": bracketed(&roots.sys.join("kernel/mm/transparent_hugepage/enabled")),
        "cgroup": cgroup,
    })
}

/// A short human label for a fingerprint: `host (cpu, N CPUs, kernel)`.
pub fn label(fp: &Value) -> String {
    format!(
        "{} ({}, {} CPUs, {})",
        fp["hostname"].as_str().unwrap_or("?"),
        fp["cpu_model"].as_str().unwrap_or("?"),
        fp["logical_cpus"],
        fp["kernel_release"].as_str().unwrap_or("?")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine() {
        let fp = collect(&Roots::host(), &[]);
        assert!(fp["logical_cpus"].as_u64().unwrap() >= 1, "{fp}");
        assert!(fp["mem_total_kib"].as_u64().unwrap() > 0);
        assert_eq!(fp["id"].as_str().unwrap().len(), 12);
        assert!(!fp["kernel_release"].as_str().unwrap().is_empty());
        assert!(label(&fp).contains("CPUs"));
        // Stable across calls.
        assert_eq!(collect(&Roots::host(), &[])["id"], fp["id"]);
    }
}
