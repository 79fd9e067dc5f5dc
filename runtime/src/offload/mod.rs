//! Devices for offload: which ggml backends and devices this machine has.
//!
//! Offloaded layers run as ggml graphs on a ggml backend (CUDA, Vulkan, SYCL, or ggml's
//! own CPU backend standing in for a device in tests), while our runtime keeps the
//! scheduler, the KV manager and the CPU layers. ggml comes from `ggml-sys`: shared
//! libraries found at run time, so the same binary runs with and without a GPU. This
//! module answers `rllama devices`: what was found, and when it is "CPU only", why.

use std::path::{Path, PathBuf};

use ggml_sys::{BackendLoad, DeviceKind, Ggml, OpenError, GPU_BACKENDS};
use serde::Serialize;

#[cfg(ggml)]
mod graph;
#[cfg(ggml)]
pub use graph::DeviceLayers;
#[cfg(ggml)]
pub(crate) use graph::Weight;

/// Which layers go to which devices: llama.cpp's `-ngl` (the last N layers; more than the
/// model has also moves the output layer), `--device` (ggml device names, comma-separated;
/// default every GPU, after the `--rpc` servers' devices) and `--tensor-split` (each
/// device's share of those layers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadSpec {
    pub n_gpu_layers: usize,
    /// The devices named with `--device`, in order (empty: the default devices).
    pub devices: Vec<String>,
    /// Each device's share of the offloaded layers (`--tensor-split 3,1`, llama.cpp's
    /// flag and meaning: proportions in device order, missing ones 0); empty or all zero:
    /// in proportion to each device's free memory, as llama.cpp splits by default.
    pub tensor_split: TensorSplit,
    /// Keep the experts of the first N layers on the CPU (llama.cpp's `--n-cpu-moe`).
    pub n_cpu_moe: usize,
    /// Caps the free memory the device reports (`RLLAMA_OFFLOAD_MEM_LIMIT`): how the
    /// out-of-memory path is tested without a small GPU.
    pub mem_limit: Option<usize>,
    /// The device acts lost from this call on (`RLLAMA_OFFLOAD_FAIL_AT`): for testing what
    /// a lost device does to its callers.
    pub fail_at: Option<usize>,
    /// ggml RPC servers (`--rpc HOST:PORT,...`, llama.cpp's flag) whose devices join the
    /// local ones; without `--device` they come first among the default devices.
    pub rpc: Vec<String>,
    /// Connect to RPC servers at public addresses too (`--rpc-allow-public`; the protocol
    /// has no authentication).
    pub rpc_allow_public: bool,
}

impl OffloadSpec {
    /// `n_gpu_layers` layers on `device` (a ggml device name, or several separated by
    /// commas; `None`: the default devices), the test knobs from the environment.
    pub fn new(n_gpu_layers: usize, device: Option<String>) -> OffloadSpec {
        let env = crate::options::Env::get();
        OffloadSpec {
            n_gpu_layers,
            devices: device
                .iter()
                .flat_map(|d| d.split(','))
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty())
                .collect(),
            tensor_split: TensorSplit::default(),
            n_cpu_moe: 0,
            mem_limit: env.offload_mem_limit.as_deref().and_then(parse_bytes),
            fail_at: env.offload_fail_at.as_deref().and_then(|v| v.parse().ok()),
            rpc: Vec::new(),
            rpc_allow_public: false,
        }
    }

    /// The devices asked for, as a message names them.
    pub fn devices_named(&self) -> String {
        if self.devices.is_empty() {
            "the default devices".into()
        } else {
            self.devices.join(",")
        }
    }
}

/// `--tensor-split`: each device's share of the offloaded layers, in device order.
#[derive(Clone, Debug, Default)]
pub struct TensorSplit(pub Vec<f32>);

impl PartialEq for TensorSplit {
    fn eq(&self, other: &TensorSplit) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for TensorSplit {}

impl TensorSplit {
    /// Whether the split says nothing (empty or all zero): split by free memory.
    pub fn is_default(&self) -> bool {
        self.0.iter().all(|&v| v == 0.0)
    }
}

impl std::str::FromStr for TensorSplit {
    type Err = String;

    /// `3,1` or `0.75/0.25` (llama.cpp takes either separator): non-negative numbers.
    fn from_str(s: &str) -> Result<TensorSplit, String> {
        let parts: Result<Vec<f32>, String> = s
            .split([',', '/'])
            .map(|p| {
                let v: f32 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("--tensor-split {s:?}: {p:?} is not a number"))?;
                if !v.is_finite() || v < 0.0 {
                    return Err(format!(
                        "--tensor-split {s:?}: shares are non-negative numbers, not {p:?}"
                    ));
                }
                Ok(v)
            })
            .collect();
        Ok(TensorSplit(parts?))
    }
}

/// Which of `n_devices` devices each of `n_units` consecutive offloaded units (the layers,
/// then the output layer when it goes too) runs on, as llama.cpp assigns layers: the
/// shares (`weights`, one per device) summed into split points in [0, 1], and unit `j`
/// on the first device whose split point is above `j / n_units`.
pub fn assign_units(weights: &[f64], n_units: usize) -> Vec<usize> {
    let n = weights.len();
    let sum: f64 = weights.iter().sum();
    let mut acc = 0.0;
    let splits: Vec<f64> = weights
        .iter()
        .map(|w| {
            acc += w;
            acc / sum
        })
        .collect();
    (0..n_units)
        .map(|j| {
            let x = j as f64 / n_units as f64;
            splits.iter().position(|&s| s > x).unwrap_or(n - 1)
        })
        .collect()
}

impl Default for OffloadSpec {
    /// Nothing offloaded.
    fn default() -> OffloadSpec {
        OffloadSpec::new(0, None)
    }
}

/// Why layers could not be offloaded, or a device step failed.
#[derive(Debug, thiserror::Error)]
pub enum OffloadError {
    #[error("offload needs ggml: {0}")]
    NoGgml(String),
    #[error("{0}")]
    NoDevice(String),
    #[error(
        "{device}: not enough device memory: {layers} layers{} need {need_mib} MiB with room \
         for the compute buffer, {free_mib} MiB free; {fit} layers would fit (-ngl {fit})",
        if *output { " and the output layer" } else { "" }
    )]
    OutOfMemory {
        device: String,
        need_mib: usize,
        free_mib: usize,
        layers: usize,
        /// The output layer was asked for too.
        output: bool,
        fit: usize,
    },
    #[error(
        "{device}: not enough device memory for its share of the split: {layers} layers{} \
         need {need_mib} MiB with room for the compute buffer, {free_mib} MiB free; {fit} \
         would fit (--tensor-split moves layers between the devices)",
        if *output { " and the output layer" } else { "" }
    )]
    ShareTooLarge {
        device: String,
        need_mib: usize,
        free_mib: usize,
        layers: usize,
        output: bool,
        fit: usize,
    },
    #[error("offload: {0}")]
    Backend(String),
}

/// Whether ggml-cuda may replay its CUDA graphs, decided once per process, before
/// ggml-cuda first computes (it reads `GGML_CUDA_DISABLE_GRAPHS` then): the first call's
/// `default_on` unless `RLLAMA_CUDA_GRAPHS=0` or `=1` says otherwise, and off when
/// `GGML_CUDA_DISABLE_GRAPHS` was set by hand. Later calls return that first answer.
///
/// ggml-cuda captures a graph that repeats with the same shapes into a CUDA graph and
/// replays it. Under serving, where every step's batch (tokens, gathered KV slots, rows
/// out) differs from the last, that replay failed on an H200: `rserve -ngl 99` at
/// concurrency 64 over ShareGPT died of "an illegal instruction was encountered" in
/// `cudaGraphLaunch` (58 of 128 requests lost with the server), while the same run with
/// CUDA graphs off served all 128. Single-sequence runs (`rbench` pp/tg at several
/// shapes, `-ngl 16` and 99, the offload tests) ran correctly with them, and they decode
/// small models much faster (smollm2-135m tg128 on the H200: 683 t/s with, 330 without;
/// an 8B model 193 vs 187). So, until the cause is found, the server asks first with
/// `default_on` false and everything else keeps ggml-cuda's default (on, through
/// `Model::offload`'s call). Other backends read neither variable.
pub fn cuda_graphs_policy(default_on: bool) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let env = crate::options::Env::get();
        let on = match env.cuda_graphs.as_deref() {
            Some("1") => true,
            Some("0") => false,
            _ => default_on,
        };
        match env.cuda_disable_graphs {
            true => false,
            false => {
                if !on {
                    std::env::set_var("GGML_CUDA_DISABLE_GRAPHS", "1");
                }
                on
            }
        }
    })
}

/// The inputs of one device call: the batch as the CPU layers leave it.
pub struct DeviceBatch<'a> {
    /// Hidden state entering the first offloaded layer, `n_tok x n_embd`.
    pub x: &'a [f32],
    /// Each token's position.
    pub pos: &'a [usize],
    /// Each token's sequence (index into `seq_slots`).
    pub seq: &'a [usize],
    /// Each sequence's KV slot per position, for all positions up to the end of this call.
    pub seq_slots: &'a [Vec<usize>],
    /// The rows (tokens) whose result is wanted, in order.
    pub out_rows: &'a [usize],
}

/// Without ggml in the build there are no device layers: this type has no values.
#[cfg(not(ggml))]
pub enum DeviceLayers {}

#[cfg(not(ggml))]
impl DeviceLayers {
    pub fn n_layers(&self) -> usize {
        match *self {}
    }
    pub fn has_output(&self) -> bool {
        match *self {}
    }
    pub fn output_on_cpu(&self) -> Option<&str> {
        match *self {}
    }
    pub fn n_slots(&self) -> usize {
        match *self {}
    }
    pub fn forward(&self, _b: &DeviceBatch<'_>, _out: &mut Vec<f32>) -> Result<(), OffloadError> {
        match *self {}
    }
    pub fn summary(&self) -> String {
        match *self {}
    }
    pub fn graph_stats(&self) -> (usize, usize) {
        match *self {}
    }
    pub fn experts_on_cpu(&self) -> Option<(std::ops::Range<usize>, usize)> {
        match *self {}
    }
    pub fn flash_attn(&self) -> bool {
        match *self {}
    }
    pub fn device(&self) -> &str {
        match *self {}
    }
    pub fn memory(&self) -> DeviceMemory {
        match *self {}
    }
}

/// Device memory in use by offloaded layers (the memory columns per device).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    pub weights: usize,
    pub kv_cache: usize,
    pub compute: usize,
}

/// A byte count, or a number with a `K`/`M`/`G` suffix.
fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1usize << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.trim().parse::<usize>().ok().map(|n| n * mul)
}

/// Everything `rllama devices` reports.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// ggml's version as loaded (`None` when ggml could not be loaded).
    pub ggml_version: Option<String>,
    /// The backend API version this build's ggml expects of backend modules.
    pub backend_api: Option<i32>,
    /// The directory the libraries came from.
    pub lib_dir: Option<PathBuf>,
    /// One entry per backend module file, loaded or refused.
    pub backends: Vec<BackendEntry>,
    /// True when no device other than a CPU was found.
    pub cpu_only: bool,
    /// Why it is CPU only (`None` when a device was found).
    pub cpu_only_reason: Option<String>,
}

/// One backend module and what became of it.
#[derive(Debug, Clone, Serialize)]
pub struct BackendEntry {
    /// The backend as its file names it (`cpu`, `vulkan`, `cuda`).
    pub backend: String,
    pub file: PathBuf,
    /// ggml's name for it once loaded (`CPU`, `Vulkan`).
    pub name: Option<String>,
    pub devices: Vec<Device>,
    /// Why ggml refused the module (`None` when it loaded).
    pub error: Option<String>,
}

/// One device of a backend.
#[derive(Debug, Clone, Serialize)]
pub struct Device {
    pub name: String,
    pub description: String,
    /// `cpu`, `gpu`, `igpu`, `accel`.
    pub kind: String,
    pub memory_free: u64,
    pub memory_total: u64,
}

impl From<&ggml_sys::DeviceInfo> for Device {
    fn from(d: &ggml_sys::DeviceInfo) -> Device {
        Device {
            name: d.name.clone(),
            description: d.description.clone(),
            kind: d.kind.as_str().to_string(),
            memory_free: d.memory_free,
            memory_total: d.memory_total,
        }
    }
}

/// Probes ggml from `dir`, or from the default search path (`$RLLAMA_GGML_DIR`, `ggml/`
/// beside the binary, the build's output) when `dir` is `None`.
pub fn probe(dir: Option<&Path>) -> DeviceReport {
    let owned;
    let ggml: Result<&Ggml, OpenError> = match dir {
        Some(d) => match Ggml::open(d) {
            Ok(g) => {
                owned = g;
                Ok(&owned)
            }
            Err(e) => Err(e),
        },
        None => Ggml::global(),
    };
    match ggml {
        Err(e) => DeviceReport {
            ggml_version: None,
            backend_api: ggml_sys::backend_api(),
            lib_dir: dir.map(Path::to_path_buf),
            backends: Vec::new(),
            cpu_only: true,
            cpu_only_reason: Some(format!("no ggml: {e}")),
        },
        Ok(g) => report(g),
    }
}

fn report(g: &Ggml) -> DeviceReport {
    let backends: Vec<BackendEntry> = g.load_backends().iter().map(entry).collect();
    let has_device = backends
        .iter()
        .flat_map(|b| &b.devices)
        .any(|d| d.kind != DeviceKind::Cpu.as_str());
    let vk_named = crate::options::Env::get().vk_visible_devices;
    let cpu_only_reason = (!has_device).then(|| cpu_only_reason(g.dir(), &backends, vk_named));
    DeviceReport {
        ggml_version: Some(g.loaded_version()),
        backend_api: ggml_sys::backend_api(),
        lib_dir: Some(g.dir().to_path_buf()),
        backends,
        cpu_only: !has_device,
        cpu_only_reason,
    }
}

fn entry(l: &BackendLoad) -> BackendEntry {
    let (name, devices, error) = match &l.outcome {
        Ok(b) => (
            Some(b.name.clone()),
            b.devices.iter().map(Device::from).collect(),
            None,
        ),
        Err(e) => (None, Vec::new(), Some(e.clone())),
    };
    BackendEntry {
        backend: l.backend.clone(),
        file: l.file.clone(),
        name,
        devices,
        error,
    }
}

/// Adds the devices of ggml RPC servers (`rllama devices --rpc`) to a report, one backend
/// entry per server (its error where it cannot be used).
pub fn probe_rpc(r: &mut DeviceReport, endpoints: &[String], allow_public: bool) {
    for ep in endpoints {
        let outcome = match Ggml::global() {
            Err(e) => Err(e.to_string()),
            #[cfg(ggml)]
            Ok(g) => g.add_rpc_server(ep, allow_public),
            #[cfg(not(ggml))]
            Ok(_) => {
                let _ = allow_public;
                Err("this build has no ggml".to_string())
            }
        };
        let (devices, error) = match outcome {
            Ok(d) => (d, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        r.backends.push(BackendEntry {
            backend: "rpc".into(),
            file: PathBuf::from(ep),
            name: Some(format!("RPC[{ep}]")),
            devices: devices.iter().map(Device::from).collect(),
            error,
        });
    }
}

/// `rllama rpc-server`: serves this machine's ggml `device` (`CPU`: ggml's CPU backend
/// with `threads` threads) to other machines' `--rpc`, on `host:port`, until killed.
/// ggml's RPC protocol has no authentication, so the address must be loopback or private
/// (not `0.0.0.0`, which is every interface) unless `allow_public`. `cache`: where tensors
/// sent by hash are kept (ggml's `-c`).
pub fn rpc_serve(
    host: &str,
    port: u16,
    threads: usize,
    device: &str,
    cache: Option<&Path>,
    allow_public: bool,
) -> Result<(), String> {
    let ip: std::net::Ipv4Addr = host.parse().map_err(|_| {
        format!("--host {host:?}: an IPv4 address, please (ggml's RPC server binds one)")
    })?;
    if !allow_public && !ggml_sys::rpc::is_private(ip.into()) {
        return Err(format!(
            "--host {host} is not a loopback or private address: ggml's RPC protocol has no \
             authentication or encryption, so anyone who can reach the port can run graphs \
             on this machine and read what it holds. Bind a private address, or pass \
             --allow-public on a network you trust"
        ));
    }
    let g = Ggml::global().map_err(|e| e.to_string())?;
    #[cfg(ggml)]
    {
        g.rpc_serve(
            &format!("{host}:{port}"),
            cache,
            threads,
            &[device.to_string()],
        )
    }
    #[cfg(not(ggml))]
    {
        let _ = (g, port, threads, device, cache);
        Err("this build has no ggml".into())
    }
}

/// Says, per GPU backend, why it gave no device: no library, a refused library, or a
/// library that found no device (no driver, no GPU). `vk_named`: GGML_VK_VISIBLE_DEVICES
/// is set (otherwise a Vulkan backend without devices gets the hint to set it).
fn cpu_only_reason(dir: &Path, backends: &[BackendEntry], vk_named: bool) -> String {
    let mut reasons = Vec::new();
    let mut missing = Vec::new();
    for name in GPU_BACKENDS {
        match backends.iter().find(|b| b.backend == name) {
            None => missing.push(format!("libggml-{name}.so")),
            Some(b) => match &b.error {
                Some(e) => reasons.push(format!("{name}: {e}")),
                None => {
                    let mut why =
                        format!("{name}: backend loaded, no device found (no driver or no GPU");
                    // ggml-vulkan passes over CPU-type Vulkan devices (Mesa's lavapipe)
                    // unless they are named.
                    if name == "vulkan" && !vk_named {
                        why.push_str(
                            "; a software Vulkan device such as lavapipe is used only when \
                             named: GGML_VK_VISIBLE_DEVICES=0",
                        );
                    }
                    why.push(')');
                    reasons.push(why);
                }
            },
        }
    }
    if !missing.is_empty() {
        reasons.push(format!("no {} in {}", missing.join(", "), dir.display()));
    }
    reasons.join("; ")
}

/// The report as the table `rllama devices` prints.
pub fn render(r: &DeviceReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    match (&r.ggml_version, &r.lib_dir) {
        (Some(v), Some(dir)) => {
            let _ = writeln!(
                s,
                "ggml {v} (backend API {}), libraries in {}",
                r.backend_api
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "?".into()),
                dir.display()
            );
        }
        _ => {
            let _ = writeln!(s, "ggml: not available");
        }
    }
    let rows: Vec<[String; 5]> = r
        .backends
        .iter()
        .flat_map(|b| {
            let backend = b.name.clone().unwrap_or_else(|| b.backend.clone());
            if b.error.is_some() {
                Vec::new()
            } else if b.devices.is_empty() {
                vec![[
                    backend,
                    "-".into(),
                    "-".into(),
                    "no device".into(),
                    "-".into(),
                ]]
            } else {
                b.devices
                    .iter()
                    .map(|d| {
                        [
                            backend.clone(),
                            d.name.clone(),
                            d.kind.clone(),
                            d.description.clone(),
                            format!("{} / {}", gib(d.memory_free), gib(d.memory_total)),
                        ]
                    })
                    .collect()
            }
        })
        .collect();
    if !rows.is_empty() {
        let header = [
            "backend",
            "device",
            "type",
            "description",
            "memory free / total",
        ];
        let mut w = header.map(str::len);
        for row in &rows {
            for (i, c) in row.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: [&str; 5]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(c);
                } else {
                    let _ = write!(l, "{c:<width$}  ", width = w[i]);
                }
            }
            l.trim_end().to_string()
        };
        let _ = writeln!(s, "{}", line(header));
        for row in &rows {
            let _ = writeln!(s, "{}", line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
        }
    }
    for b in &r.backends {
        if let Some(e) = &b.error {
            let file = b.file.file_name().map(|f| f.to_string_lossy().into_owned());
            let _ = writeln!(s, "{}: refused: {e}", file.unwrap_or_default());
        }
    }
    match &r.cpu_only_reason {
        Some(why) => {
            let _ = writeln!(s, "CPU only: {why}");
        }
        None => {
            let n = r
                .backends
                .iter()
                .flat_map(|b| &b.devices)
                .filter(|d| d.kind != "cpu")
                .count();
            let _ = writeln!(
                s,
                "{n} offload device(s): use -ngl N to put N layers on one"
            );
        }
    }
    s
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_split_as_llama_cpp_assigns_layers() {
        // Equal shares: the first device takes units 0..=15 of 31 (j / 31 < 0.5).
        let a = assign_units(&[1.0, 1.0], 31);
        assert_eq!(a.iter().filter(|&&d| d == 0).count(), 16);
        assert!(a.windows(2).all(|w| w[0] <= w[1]), "consecutive runs");
        // 1:3 over 31 units: j / 31 < 0.25 for j <= 7.
        let a = assign_units(&[1.0, 3.0], 31);
        assert_eq!(a.iter().filter(|&&d| d == 0).count(), 8);
        // A zero share gets nothing; one device gets everything.
        assert!(assign_units(&[0.0, 2.0, 0.0], 10).iter().all(|&d| d == 1));
        assert_eq!(assign_units(&[5.0], 4), vec![0; 4]);
        // Three ways, 2:1:1 of 8: 4, 2, 2.
        assert_eq!(
            assign_units(&[2.0, 1.0, 1.0], 8),
            vec![0, 0, 0, 0, 1, 1, 2, 2]
        );
    }

    #[test]
    fn tensor_split_reads_llama_cpp_spellings() {
        let t: TensorSplit = "3,1".parse().unwrap();
        assert_eq!(t, TensorSplit(vec![3.0, 1.0]));
        let t: TensorSplit = "0.75/0.25".parse().unwrap();
        assert_eq!(t, TensorSplit(vec![0.75, 0.25]));
        assert!("0,0".parse::<TensorSplit>().unwrap().is_default());
        for bad in ["1,-1", "a,1", "1,,2", "inf"] {
            assert!(bad.parse::<TensorSplit>().is_err(), "{bad}");
        }
        let s = OffloadSpec::new(99, Some("RPC0, RPC1".into()));
        assert_eq!(s.devices, ["RPC0", "RPC1"]);
        assert_eq!(s.devices_named(), "RPC0,RPC1");
        assert!(OffloadSpec::new(99, None).devices.is_empty());
    }

    fn entry(backend: &str, error: Option<&str>, kinds: &[&str]) -> BackendEntry {
        BackendEntry {
            backend: backend.into(),
            file: PathBuf::from(format!("/x/libggml-{backend}.so")),
            name: error.is_none().then(|| backend.to_uppercase()),
            devices: kinds
                .iter()
                .enumerate()
                .map(|(i, k)| Device {
                    name: format!("{backend}{i}"),
                    description: "d".into(),
                    kind: (*k).into(),
                    memory_free: 1 << 30,
                    memory_total: 2 << 30,
                })
                .collect(),
            error: error.map(Into::into),
        }
    }

    #[test]
    fn cpu_only_reasons_name_each_gpu_backend() {
        let dir = Path::new("/x");
        let r = cpu_only_reason(dir, &[entry("cpu", None, &["cpu"])], false);
        assert_eq!(
            r,
            "no libggml-cuda.so, libggml-vulkan.so, libggml-sycl.so in /x"
        );
        let with_vulkan = [
            entry("cpu", None, &["cpu"]),
            entry("vulkan", None, &[]),
            entry(
                "cuda",
                Some("does not load: libcuda.so.1: cannot open"),
                &[],
            ),
        ];
        let r = cpu_only_reason(dir, &with_vulkan, true);
        assert_eq!(
            r,
            "cuda: does not load: libcuda.so.1: cannot open; vulkan: backend loaded, no \
             device found (no driver or no GPU); no libggml-sycl.so in /x"
        );
        // Without GGML_VK_VISIBLE_DEVICES, the hint that lavapipe must be named.
        let r = cpu_only_reason(dir, &with_vulkan, false);
        assert_eq!(
            r,
            "cuda: does not load: libcuda.so.1: cannot open; vulkan: backend loaded, no \
             device found (no driver or no GPU; a software Vulkan device such as lavapipe is \
             used only when named: GGML_VK_VISIBLE_DEVICES=0); no libggml-sycl.so in /x"
        );
    }

    #[test]
    fn render_lists_devices_and_refusals() {
        let r = DeviceReport {
            ggml_version: Some("0.26.0".into()),
            backend_api: Some(3),
            lib_dir: Some("/x".into()),
            backends: vec![
                entry("cpu", None, &["cpu"]),
                entry("vulkan", None, &["gpu"]),
                entry("sycl", Some("built for another ggml"), &[]),
            ],
            cpu_only: false,
            cpu_only_reason: None,
        };
        let t = render(&r);
        assert!(
            t.starts_with("ggml 0.26.0 (backend API 3), libraries in /x\n"),
            "{t}"
        );
        assert!(t.contains("VULKAN   vulkan0  gpu"), "{t}");
        assert!(
            t.contains("libggml-sycl.so: refused: built for another ggml"),
            "{t}"
        );
        assert!(t.contains("1.0 GiB / 2.0 GiB"), "{t}");
        assert!(
            t.ends_with("1 offload device(s): use -ngl N to put N layers on one\n"),
            "{t}"
        );
    }

    #[test]
    fn a_missing_directory_is_cpu_only_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let r = probe(Some(dir.path()));
        assert!(r.cpu_only);
        let why = r.cpu_only_reason.unwrap();
        assert!(why.starts_with("no ggml: "), "{why}");
        assert!(
            why.contains(&dir.path().display().to_string()) || why.contains("built without"),
            "{why}"
        );
    }
}
