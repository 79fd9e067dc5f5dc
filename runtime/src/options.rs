//! Run options: the one struct that says how a model runs ([`RunOptions`]: threads, NUMA
//! placement, weight placement, numerics, packing, pinning, offload), and the one place
//! the environment is read ([`Env`]). Library code asks [`Env::get`], never
//! `std::env::var`; the binaries parse their flags (clap's `RunArgs` in `rllama`,
//! `rserve` and `rbench`, feature `cli`) into a `RunOptions`, with the environment's
//! values as defaults.
//!
//! | variable | what it sets |
//! |---|---|
//! | `RLLAMA_NUMA`, `RLLAMA_NUMA_WEIGHTS` | `--numa`, `--numa-weights` defaults |
//! | `RLLAMA_NO_PIN` | worker threads unpinned (`--no-pin`) |
//! | `RLLAMA_NO_PACK` | matrices not repacked (`--no-pack`) |
//! | `RLLAMA_SIMD`, `RLLAMA_FORCE_SCALAR`, `RLLAMA_NO_VNNI` | a lower kernel ISA level |
//! | `RLLAMA_GGML_FLAVOR` | `avx2` / `avx512`: which llama.cpp build's float order to follow |
//! | `RLLAMA_DECODE_PREFETCH` | a fixed decode prefetch distance in bytes (no tuning) |
//! | `RLLAMA_OFFLOAD_FA` | `on`/`off`/`auto`: ggml flash attention on the device |
//! | `RLLAMA_CUDA_GRAPHS`, `GGML_CUDA_DISABLE_GRAPHS` | ggml-cuda's CUDA graphs |
//! | `RLLAMA_OFFLOAD_MEM_LIMIT` | caps the free memory a device reports (tests) |
//! | `RLLAMA_OFFLOAD_FAIL_AT` | the device acts lost from this call on (tests) |
//! | `GGML_VK_VISIBLE_DEVICES` | which Vulkan devices ggml uses (reported) |
//! | `RLLAMA_GGML_DIR` | where ggml's libraries are |
//! | `RLLAMA_MODELS`, `RLLAMA_DATASETS`, `RLLAMA_TOOLS`, `XDG_CACHE_HOME`, `HOME` | caches |
//! | `RLLAMA_SKIP_MODEL_TESTS` | model tests skip instead of fetching |
//! | `RSERVE_BIN`, `LLAMA_SERVER`, `LLAMA_CPP_SRC` | servers `rbench serve --spawn` starts |
//! | `RSERVE_KV_PERSIST_ABORT_AFTER` | the persist writer dies after N blocks (tests) |
//! | `PATH` | where tools are looked up (`llama-server`) |

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::matmul::Numerics;
use crate::numa::{NumaMode, WeightPlacement};
use crate::offload::OffloadSpec;

/// Whether a flag-like variable is on: anything but unset, empty, `0` or `false`.
fn on(v: Option<&OsString>) -> bool {
    v.and_then(|v| v.to_str())
        .is_some_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The process environment as the runtime uses it, read once.
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub numa: Option<String>,
    pub numa_weights: Option<String>,
    pub no_pin: bool,
    pub no_pack: bool,
    pub simd: Option<String>,
    pub force_scalar: bool,
    pub no_vnni: bool,
    pub ggml_flavor: Option<String>,
    pub decode_prefetch: Option<String>,
    pub offload_fa: Option<String>,
    pub cuda_graphs: Option<String>,
    pub cuda_disable_graphs: bool,
    pub offload_mem_limit: Option<String>,
    pub offload_fail_at: Option<String>,
    pub vk_visible_devices: bool,
    pub ggml_dir: Option<PathBuf>,
    pub models_dir: Option<PathBuf>,
    pub datasets_dir: Option<PathBuf>,
    pub tools_dir: Option<PathBuf>,
    pub xdg_cache_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub skip_model_tests: bool,
    pub rserve_bin: Option<PathBuf>,
    pub llama_server: Option<PathBuf>,
    pub llama_cpp_src: Option<PathBuf>,
    pub persist_abort_after: Option<String>,
    /// `PATH`, where tools are looked up (`llama-server`).
    pub path: Option<OsString>,
}

impl Env {
    /// Reads the variables of the table above from `get`.
    pub fn read(get: impl Fn(&str) -> Option<OsString>) -> Env {
        let s = |k: &str| get(k).and_then(|v| v.into_string().ok());
        let p = |k: &str| get(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        Env {
            numa: s("RLLAMA_NUMA"),
            numa_weights: s("RLLAMA_NUMA_WEIGHTS"),
            no_pin: on(get("RLLAMA_NO_PIN").as_ref()),
            no_pack: on(get("RLLAMA_NO_PACK").as_ref()),
            simd: s("RLLAMA_SIMD"),
            force_scalar: on(get("RLLAMA_FORCE_SCALAR").as_ref()),
            no_vnni: on(get("RLLAMA_NO_VNNI").as_ref()),
            ggml_flavor: s("RLLAMA_GGML_FLAVOR"),
            decode_prefetch: s("RLLAMA_DECODE_PREFETCH"),
            offload_fa: s("RLLAMA_OFFLOAD_FA"),
            cuda_graphs: s("RLLAMA_CUDA_GRAPHS"),
            cuda_disable_graphs: get("GGML_CUDA_DISABLE_GRAPHS").is_some(),
            offload_mem_limit: s("RLLAMA_OFFLOAD_MEM_LIMIT"),
            offload_fail_at: s("RLLAMA_OFFLOAD_FAIL_AT"),
            vk_visible_devices: get("GGML_VK_VISIBLE_DEVICES").is_some(),
            ggml_dir: p("RLLAMA_GGML_DIR"),
            models_dir: p("RLLAMA_MODELS"),
            datasets_dir: p("RLLAMA_DATASETS"),
            tools_dir: p("RLLAMA_TOOLS"),
            xdg_cache_home: p("XDG_CACHE_HOME"),
            home: p("HOME"),
            skip_model_tests: get("RLLAMA_SKIP_MODEL_TESTS").is_some(),
            rserve_bin: p("RSERVE_BIN"),
            llama_server: p("LLAMA_SERVER"),
            llama_cpp_src: p("LLAMA_CPP_SRC"),
            persist_abort_after: s("RSERVE_KV_PERSIST_ABORT_AFTER"),
            path: get("PATH"),
        }
    }

    /// This process's environment, read on first use; the kernel settings it holds
    /// (`RLLAMA_SIMD`, `RLLAMA_GGML_FLAVOR`, the ggml directory) are handed to `quant`
    /// and `ggml-sys` then, before their first use.
    pub fn get() -> &'static Env {
        static ENV: OnceLock<Env> = OnceLock::new();
        ENV.get_or_init(|| {
            let e = Env::read(|k| std::env::var_os(k));
            e.configure_lower_crates();
            e
        })
    }

    /// Passes the kernel and library settings to the crates below the runtime, which
    /// read no environment themselves.
    fn configure_lower_crates(&self) {
        let warn = quant::isa::configure(quant::isa::Overrides {
            simd: self.simd.clone(),
            force_scalar: self.force_scalar,
            no_vnni: self.no_vnni,
        });
        if let Some(w) = warn {
            eprintln!("warning: {w}");
        }
        let flavor = match self.ggml_flavor.as_deref() {
            Some("avx2") => Some(quant::order::Flavor::Avx2),
            Some("avx512") => Some(quant::order::Flavor::Avx512),
            _ => None,
        };
        if let Some(f) = flavor {
            if !quant::order::configure_flavor(f) {
                eprintln!("warning: RLLAMA_GGML_FLAVOR came after the kernels chose theirs");
            }
        }
        if let Some(d) = &self.ggml_dir {
            ggml_sys::set_lib_dir(d.clone());
        }
    }
}

/// Reads the environment now (and configures the kernels by it): what each binary does
/// first, so every later use sees the same settings.
pub fn init() {
    let _ = Env::get();
}

/// How a model runs: what `rllama`, `rserve` and `rbench` share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Compute threads (the pool's, including the caller).
    pub threads: usize,
    /// llama.cpp's `--numa` thread placement.
    pub numa: Option<NumaMode>,
    /// Where the weight pages go (`--numa-weights`).
    pub weights: WeightPlacement,
    /// llama.cpp's bit-exact kernel orders or the faster ones (`--numerics`).
    pub numerics: Numerics,
    /// Repack the matrices that have packed kernels (off: `--no-pack`, `RLLAMA_NO_PACK`).
    pub pack: bool,
    /// Pin the worker threads to their CPUs (off: `--no-pin`, `RLLAMA_NO_PIN`).
    pub pin: bool,
    /// Layers on a ggml device (`-ngl`, `--device`, `--n-cpu-moe`).
    pub offload: OffloadSpec,
}

impl Default for RunOptions {
    /// All cores, no NUMA placement, first-touch weights, exact numerics, packed and
    /// pinned (unless the environment says otherwise), nothing offloaded.
    fn default() -> RunOptions {
        let env = Env::get();
        RunOptions {
            threads: default_threads(),
            numa: None,
            weights: WeightPlacement::FirstTouch,
            numerics: Numerics::Exact,
            pack: !env.no_pack,
            pin: !env.no_pin,
            offload: OffloadSpec::default(),
        }
    }
}

/// The one default number of compute threads, for every binary and benchmark: the CPUs
/// this process may run on (its affinity mask and cgroup CPU quota, as
/// `available_parallelism` reads them, so `taskset` and `numactl` limits hold), or 1 when
/// that cannot be read.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The flags every binary that runs a model shares (`#[command(flatten)]` it): the
/// options of [`RunOptions`] that are one value in every binary. Threads and `-ngl` are
/// the binaries' own, since `rbench` sweeps lists of them.
#[cfg(feature = "cli")]
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct RunArgs {
    /// NUMA thread placement, as llama.cpp: distribute, isolate or numactl.
    #[arg(long, env = "RLLAMA_NUMA")]
    pub numa: Option<NumaMode>,
    /// Where the weight pages go: first-touch (read in place from the mapped file),
    /// interleave (a copy spread over the allowed nodes) or replicate (a copy per node).
    #[arg(
        long = "numa-weights",
        default_value = "first-touch",
        env = "RLLAMA_NUMA_WEIGHTS"
    )]
    pub numa_weights: WeightPlacement,
    /// Kernel orders: exact (llama.cpp's, bit-identical to it) or fast (experimental; see
    /// ARCHITECTURE.md, "The fast order"). Batch-invariant either way.
    #[arg(long, default_value = "exact")]
    pub numerics: Numerics,
    /// Multiply the file's rows instead of repacking them at load (same results, slower;
    /// also RLLAMA_NO_PACK=1).
    #[arg(long = "no-pack")]
    pub no_pack: bool,
    /// Do not pin the compute threads to their own CPUs (pinned by default when there is a
    /// CPU for each; also RLLAMA_NO_PIN=1).
    #[arg(long = "no-pin")]
    pub no_pin: bool,
    /// The ggml devices for -ngl, comma-separated (`-dev`; `rllama devices` lists them; CPU
    /// is ggml's CPU backend, alone); default: the --rpc servers' devices, then every GPU.
    #[arg(long = "device")]
    pub device: Option<String>,
    /// With several devices: each one's share of the -ngl layers, in device order
    /// (`-ts 3,1`, llama.cpp's flag and meaning); default: in proportion to their free
    /// memory.
    #[arg(long = "tensor-split")]
    pub tensor_split: Option<crate::offload::TensorSplit>,
    /// With -ngl: keep the experts of the first N layers on the CPU (llama.cpp's
    /// `--n-cpu-moe`), the rest of those layers on the device.
    #[arg(long = "n-cpu-moe", default_value_t = 0)]
    pub n_cpu_moe: usize,
    /// ggml RPC servers for -ngl (`HOST:PORT,...`, llama.cpp's flag; `rllama rpc-server`
    /// runs one): their devices join the local ones, and without --device the layers go
    /// to the first. Loopback and private addresses only, unless --rpc-allow-public.
    #[arg(long = "rpc", value_delimiter = ',')]
    pub rpc: Vec<String>,
    /// Allow --rpc servers at public addresses. ggml's RPC protocol has no authentication
    /// or encryption: whoever reaches a server can use it, and sees the weights and
    /// activations sent to it.
    #[arg(long = "rpc-allow-public")]
    pub rpc_allow_public: bool,
}

#[cfg(feature = "cli")]
impl RunArgs {
    /// The options these flags give, for `threads` threads and `n_gpu_layers` layers.
    pub fn options(&self, threads: usize, n_gpu_layers: usize) -> RunOptions {
        let env = Env::get();
        RunOptions {
            threads: threads.max(1),
            numa: self.numa,
            weights: self.numa_weights,
            numerics: self.numerics,
            pack: !self.no_pack && !env.no_pack,
            pin: !self.no_pin && !env.no_pin,
            offload: OffloadSpec {
                n_cpu_moe: self.n_cpu_moe,
                tensor_split: self.tensor_split.clone().unwrap_or_default(),
                rpc: self.rpc.clone(),
                rpc_allow_public: self.rpc_allow_public,
                ..OffloadSpec::new(n_gpu_layers, self.device.clone())
            },
        }
    }
}

/// The llama.cpp spellings of multi-letter flags (`-ngl`, `-dev`, `-np`, `-ncmoe`, `-ts`, `-md`) in
/// clap's long form, as every binary accepts them.
pub fn llama_flag_spelling(arg: String) -> String {
    match arg.as_str() {
        "-ngl" => "--n-gpu-layers".into(),
        "-dev" => "--device".into(),
        "-np" => "--parallel".into(),
        "-ncmoe" => "--n-cpu-moe".into(),
        "-ts" => "--tensor-split".into(),
        "-md" => "--model-draft".into(),
        _ => arg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_table() {
        let vars = [
            ("RLLAMA_NO_PIN", "1"),
            ("RLLAMA_NO_PACK", "0"),
            ("RLLAMA_SIMD", "avx2"),
            ("RLLAMA_GGML_FLAVOR", "avx2"),
            ("RLLAMA_MODELS", "/m"),
            ("HOME", ""),
        ];
        let e = Env::read(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        });
        assert!(e.no_pin);
        assert!(!e.no_pack, "0 is off");
        assert_eq!(e.simd.as_deref(), Some("avx2"));
        assert_eq!(e.ggml_flavor.as_deref(), Some("avx2"));
        assert_eq!(e.models_dir, Some(PathBuf::from("/m")));
        assert_eq!(e.home, None, "an empty path is unset");
        assert!(!e.force_scalar && e.offload_fa.is_none());
    }
}
