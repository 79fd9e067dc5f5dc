//! Running the tests: model loading, the timed loops of both engines, warmup, alternation
//! of repetitions between engines, and the per-test results.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use datasets::fixed::{random_tokens, TokenSpace};
use runtime::gguf::GgufFile;
use runtime::load::ModelFile;
use runtime::model::Model;
use runtime::numa::{self, NumaMode, WeightPlacement};
use runtime::pool::{PoolOptions, ThreadPool};
use runtime::runner::Runner;
use runtime::tokenizer::Tokenizer;

use super::cli::{Engine, Params, TestSpec};
#[cfg(feature = "llamacpp")]
use super::reference::RefInstance;
use crate::stats;

/// What a result row says about the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDesc {
    /// The resolved file path.
    pub filename: String,
    /// llama-bench's `model_type`, e.g. `llama 135M Q4_1`.
    pub model_type: String,
    /// Bytes of all weight tensors (llama-bench's `model_size`).
    pub size: u64,
    pub n_params: u64,
}

/// One test's measurements on one engine.
#[derive(Debug, Clone)]
pub struct TestResult {
    pub spec: TestSpec,
    pub engine: Engine,
    pub info: ModelDesc,
    /// Memory held by the model weights.
    pub model_bytes: u64,
    /// Weight bytes one decoded token reads: all of a dense model, and of a MoE model only
    /// the experts a token selects (the decode roofline's numerator).
    pub active_bytes: u64,
    /// KV cache memory allocated for the test (f16 K and V).
    pub kv_bytes: Option<u64>,
    /// KV cache capacity in tokens.
    pub kv_tokens: Option<u64>,
    /// llama-bench's `flash_attn` value: -1 = auto (llama.cpp's default), 0 = off.
    pub flash_attn: i32,
    /// UTC time the test started, `YYYY-MM-DDTHH:MM:SSZ`.
    pub test_time: String,
    /// Timed nanoseconds per repetition.
    pub samples_ns: Vec<u64>,
    /// Whether every compute thread was pinned to its own CPU (llama.cpp: never, its
    /// default `cpu_strict` is off).
    pub pinned: bool,
    /// The instruction sets the engine's kernels used: ours per matrix type
    /// (`Q4_K=avx2,Q8_0=avx2-vnni`), llama.cpp's from its build (`avx512`).
    pub isa: String,
    /// NUMA: the thread mode, the weight placement, and what was observed.
    pub numa: NumaRow,
    /// llama-bench's `backends`: `CPU`, or `CPU,<ggml device>` with layers offloaded.
    pub backend: String,
    /// Device memory of the offloaded layers (weights, KV cache, compute buffer).
    pub device_memory: Option<(String, runtime::offload::DeviceMemory)>,
}

/// A row's NUMA facts: the settings and the proof (page counts after the test).
#[derive(Debug, Clone, Default)]
pub struct NumaRow {
    /// `distribute`, `isolate`, `numactl`, or empty for none.
    pub mode: String,
    /// `first-touch`, `interleave` or `replicate` (llama.cpp: `first-touch`, its mmap).
    pub weights: String,
    /// NUMA nodes of the machine.
    pub nodes: usize,
    /// The node of each compute thread (caller first), when the threads were placed.
    pub thread_nodes: Option<Vec<usize>>,
    /// The CPU of each compute thread, when pinned.
    pub thread_cpus: Option<Vec<usize>>,
    /// Per weight copy: its node (`None`: the file mapping or an interleaved copy) and
    /// where its pages were after the test (ours only).
    pub pages: Vec<(Option<usize>, runtime::numa::PagePlacement)>,
}

impl NumaRow {
    /// `n0=1200 n1=1187`, or per replica `@0: n0=2387; @1: n1=2387`.
    pub fn pages_summary(&self) -> String {
        if self.pages.is_empty() {
            return "-".into();
        }
        self.pages
            .iter()
            .map(|(n, p)| match n {
                Some(n) => format!("@{n}: {}", p.summary()),
                None => p.summary(),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": self.mode,
            "weights": self.weights,
            "nodes": self.nodes,
            "thread_nodes": self.thread_nodes,
            "thread_cpus": self.thread_cpus,
            "weight_pages": self.pages.iter().map(|(n, p)| {
                let mut v = p.to_json();
                v["copy_node"] = serde_json::json!(n);
                v
            }).collect::<Vec<_>>(),
        })
    }
}

impl TestResult {
    /// Per-repetition tokens per second: (n_prompt + n_gen) / seconds.
    pub fn samples_ts(&self) -> Vec<f64> {
        let n = self.spec.n_tokens() as f64;
        self.samples_ns
            .iter()
            .map(|&ns| n * 1e9 / ns.max(1) as f64)
            .collect()
    }

    pub fn avg_ts(&self) -> f64 {
        stats::mean(&self.samples_ts())
    }

    /// Sample standard deviation (n - 1) of the per-repetition t/s.
    pub fn stddev_ts(&self) -> f64 {
        stats::stddev(&self.samples_ts())
    }

    fn ns_f64(&self) -> Vec<f64> {
        self.samples_ns.iter().map(|&n| n as f64).collect()
    }

    pub fn avg_ns(&self) -> u64 {
        stats::mean(&self.ns_f64()).round() as u64
    }

    pub fn stddev_ns(&self) -> u64 {
        stats::stddev(&self.ns_f64()).round() as u64
    }
}

/// Random prompt tokens as llama-bench draws them (never control tokens; BOS first when
/// the model adds one), reproducible from a seed so both engines see the same tokens.
#[derive(Debug, Clone)]
pub struct TokenSource {
    n_vocab: u32,
    excluded: Vec<u32>,
    /// BOS, when the model adds one.
    bos: Option<u32>,
}

impl TokenSource {
    pub fn from_tokenizer(tok: &Tokenizer) -> TokenSource {
        let n_vocab = tok.n_vocab() as u32;
        let mut excluded: Vec<u32> = (0..n_vocab).filter(|&id| tok.is_control(id)).collect();
        excluded.extend(tok.bos());
        excluded.extend(tok.eos());
        excluded.extend(tok.eog_ids());
        excluded.sort_unstable();
        excluded.dedup();
        TokenSource {
            n_vocab,
            excluded,
            bos: tok.bos().filter(|_| tok.add_bos()),
        }
    }

    /// `n` tokens, BOS first when the model adds one.
    pub fn tokens(&self, n: usize, seed: u64) -> Vec<u32> {
        let space = TokenSpace {
            n_vocab: self.n_vocab,
            excluded: &self.excluded,
        };
        random_tokens(&space, n, self.bos, seed)
    }
}

/// The tokens of one repetition, shared by the engines.
pub(super) struct RepTokens {
    pub(super) depth: Vec<u32>,
    pub(super) prompt: Vec<u32>,
    pub(super) gen: Vec<u32>,
}

fn rep_tokens(src: &TokenSource, spec: &TestSpec, test_idx: usize, rep: usize) -> RepTokens {
    let seed = 0x5eed_0000_0000 ^ ((test_idx as u64) << 20) ^ ((rep as u64) << 4);
    RepTokens {
        depth: src.tokens(spec.n_depth, seed ^ 1),
        prompt: src.tokens(spec.n_prompt, seed ^ 2),
        gen: src.tokens(spec.n_gen, seed ^ 3),
    }
}

/// Our engine set up for one test: a runner with the test's threads and context.
struct OursInstance {
    runner: Runner,
}

impl OursInstance {
    fn new(
        model: Arc<Model>,
        spec: &TestSpec,
        pin: bool,
        numa: Option<NumaMode>,
    ) -> Result<OursInstance> {
        let pool = ThreadPool::try_with_options(spec.threads, PoolOptions { pin, numa })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut runner = Runner::with_pool(model, pool, spec.n_ctx());
        runner.n_batch = spec.our_chunk();
        Ok(OursInstance { runner })
    }

    fn pinned(&self) -> bool {
        self.runner.pool.pinned_cpus().is_some()
    }

    fn warmup(&mut self, t: &RepTokens) -> Result<()> {
        self.runner.clear();
        if !t.prompt.is_empty() {
            self.runner.feed(&t.prompt, false)?;
        }
        if let Some(&first) = t.gen.first() {
            self.runner.feed(&[first], false)?;
        }
        self.runner.clear();
        Ok(())
    }

    fn rep(&mut self, t: &RepTokens) -> Result<u64> {
        self.fill_depth(t)?;
        let t0 = Instant::now();
        if !t.prompt.is_empty() {
            self.runner.feed(&t.prompt, false)?;
        }
        for &tok in &t.gen {
            self.runner.feed(&[tok], false)?;
        }
        Ok(t0.elapsed().as_nanos() as u64)
    }

    /// Clears the cache and fills it with the depth tokens (not timed): the start of a
    /// repetition, whole or generated in turns ([`OursInstance::gen_tokens`]).
    fn fill_depth(&mut self, t: &RepTokens) -> Result<()> {
        self.runner.clear();
        if !t.depth.is_empty() {
            self.runner.feed(&t.depth, false)?;
        }
        Ok(())
    }

    /// Decodes `toks` one at a time, continuing at the current position; nanoseconds.
    fn gen_tokens(&mut self, toks: &[u32]) -> Result<u64> {
        let t0 = Instant::now();
        for &tok in toks {
            self.runner.feed(&[tok], false)?;
        }
        Ok(t0.elapsed().as_nanos() as u64)
    }

    fn kv(&self) -> (u64, u64) {
        let l = self.runner.kv.layout();
        (l.total_bytes() as u64, l.capacity_tokens() as u64)
    }
}

/// A model file opened for the run: our model (when it loads) and what the rows say.
pub struct LoadedModel {
    pub path: PathBuf,
    pub ours: Option<Arc<Model>>,
    /// Why our runtime could not load it (only fatal when rllama is benchmarked).
    pub ours_error: Option<String>,
    pub info: ModelDesc,
    pub tokens: TokenSource,
    /// Written by `rllama synth` (random weights): every row's model says so.
    pub synthetic: bool,
}

impl LoadedModel {
    pub fn open(path: &Path) -> Result<LoadedModel> {
        LoadedModel::open_with(
            path,
            &runtime::RunOptions::default(),
            runtime::ContextSize::default(),
        )
    }

    /// Opens `path` and places our weights as `--numa-weights` asks, for the thread
    /// plan of the run's largest thread count.
    pub fn open_placed(path: &Path, params: &Params) -> Result<LoadedModel> {
        LoadedModel::open_offloaded(path, params, 0)
    }

    /// As [`LoadedModel::open_placed`], with the last `n_gpu_layers` layers on the
    /// `--device` (a device cache as large as the longest test needs).
    pub fn open_offloaded(
        path: &Path,
        params: &Params,
        n_gpu_layers: usize,
    ) -> Result<LoadedModel> {
        let threads = params.threads.iter().copied().max().unwrap_or(1);
        let slots = params.max_kv_slots();
        let ctx = runtime::ContextSize {
            n_ctx: Some(slots),
            kv_slots: slots,
        };
        LoadedModel::open_with(path, &params.run_options(threads, n_gpu_layers), ctx)
    }

    fn open_with(
        path: &Path,
        opts: &runtime::RunOptions,
        ctx: runtime::ContextSize,
    ) -> Result<LoadedModel> {
        let mf = ModelFile::open_path(path)?;
        let file = &mf.file;
        let info = ModelDesc {
            filename: path.display().to_string(),
            model_type: model_type(file),
            size: file.tensor_bytes(),
            n_params: file.n_params(),
        };
        let (ours, ours_error) = match mf.model_with(opts, ctx) {
            Ok(m) => (Some(Arc::new(m)), None),
            // Placement and offload failures are the user's request failing, not a
            // format we lack.
            Err(e @ (runtime::LoadError::Numa { .. } | runtime::LoadError::Offload { .. })) => {
                return Err(e.into())
            }
            Err(e) => (None, Some(e.to_string())),
        };
        Ok(LoadedModel {
            path: path.to_path_buf(),
            ours,
            ours_error,
            info,
            tokens: TokenSource::from_tokenizer(&mf.tokenizer),
            synthetic: runtime::synth::is_synthetic(file),
        })
    }

    fn ours(&self) -> Result<Arc<Model>> {
        match &self.ours {
            Some(m) => Ok(m.clone()),
            None => bail!(
                "rllama cannot load {}: {}",
                self.path.display(),
                self.ours_error.as_deref().unwrap_or("unknown error")
            ),
        }
    }
}

/// `model_type` for our rows: `<arch> <size label> <file type>`, like llama.cpp's
/// `llama_model_desc` (which prints e.g. `llama 7B Q4_0`), with [`SYNTHETIC_MARK`] after
/// it for a synthetic model.
pub fn model_type(f: &GgufFile) -> String {
    let arch = f.architecture().unwrap_or("unknown").to_string();
    let size = match f.get_str("general.size_label") {
        Ok(Some(s)) if !s.is_empty() => s.to_string(),
        _ => size_label(f.n_params()),
    };
    let ftype = f.file_type_name().unwrap_or_else(|| "?".into());
    mark_synthetic(
        format!("{arch} {size} {ftype}"),
        runtime::synth::is_synthetic(f),
    )
}

/// Appended to the model of every row measured on a `rllama synth` file.
pub const SYNTHETIC_MARK: &str = " (synthetic)";

/// `desc` with [`SYNTHETIC_MARK`] when `synthetic`.
pub fn mark_synthetic(desc: String, synthetic: bool) -> String {
    if synthetic {
        desc + SYNTHETIC_MARK
    } else {
        desc
    }
}

/// `135M`, `1.5B`, ... from a parameter count.
pub fn size_label(n_params: u64) -> String {
    let n = n_params as f64;
    if n >= 1e9 {
        let b = n / 1e9;
        if b >= 10.0 {
            format!("{b:.0}B")
        } else {
            format!("{b:.1}B")
        }
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

/// Why `--engine llamacpp` cannot run in a build without the `llamacpp` feature.
pub(crate) const NOT_BUILT: &str =
    "--engine llamacpp: this rbench was built without llama.cpp; rebuild \
     with `cargo build --release -p bench-cli --features llamacpp`";

/// Refuses configurations an engine cannot run, before anything is timed.
pub fn check_supported(params: &Params) -> Result<()> {
    if params.engines.contains(&Engine::LlamaCpp) && !cfg!(feature = "llamacpp") {
        bail!(NOT_BUILT);
    }
    Ok(())
}

/// Our kernels' instruction set per matrix type of `m`: `Q4_K=avx2,Q8_0=avx2-vnni`, the
/// fast order's marked `/fast`, `/fast+packed` where its weights were repacked at load,
/// the exact orders' `/packed` where theirs were.
pub fn kernel_isas(m: &Model) -> String {
    m.kernel_isas()
        .iter()
        .map(|(t, i, o)| match o {
            runtime::DotOrder::Fast if m.packed_type(*t) => format!("{t}={i}/fast+packed"),
            runtime::DotOrder::Fast => format!("{t}={i}/fast"),
            _ if m.packed_type(*t) => format!("{t}={i}/packed"),
            _ => format!("{t}={i}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A note for runs whose element-wise and attention order (the ggml flavor, which the
/// exact numerics follow) is not the one a CPU at the kernels' level would run: on an
/// AVX-512 machine `RLLAMA_SIMD=avx2` lowers the kernels but keeps the AVX-512 flavor,
/// so it does not measure what an AVX2-only CPU runs unless `RLLAMA_GGML_FLAVOR=avx2` is
/// set too. `None` where the two agree.
pub fn flavor_note() -> Option<String> {
    flavor_mismatch(runtime::kernel_isa(), runtime::ggml_flavor())
}

fn flavor_mismatch(isa: runtime::Isa, flavor: runtime::Flavor) -> Option<String> {
    use runtime::{Flavor, Isa};
    let wide = isa.includes(Isa::Avx512);
    match (flavor, isa) {
        (_, Isa::Scalar | Isa::Neon | Isa::NeonDotprod) => None,
        (Flavor::Avx512, _) if !wide => Some(format!(
            "note: rllama kernels at {isa}, but element-wise and attention arithmetic in \
             llama.cpp's avx512 order (this CPU's); an AVX2-only CPU runs the avx2 order: \
             add RLLAMA_GGML_FLAVOR=avx2 to measure it"
        )),
        (Flavor::Avx2, _) if wide => Some(
            "note: rllama kernels at avx512, but element-wise and attention arithmetic in \
             llama.cpp's avx2 order (RLLAMA_GGML_FLAVOR=avx2)"
                .to_string(),
        ),
        _ => None,
    }
}

/// The widest x86 SIMD level llama.cpp's `system_info` says its CPU backend was built
/// with (it picks its kernels at compile time): `avx512`, `avx2` or `scalar`, with
/// `-vnni` when its VNNI paths are compiled in.
pub fn llamacpp_isa(system_info: &str) -> String {
    let base = if system_info.contains("AVX512 = 1") {
        "avx512"
    } else if system_info.contains("AVX2 = 1") {
        "avx2"
    } else {
        "scalar"
    };
    let vnni = system_info.contains("AVX512_VNNI = 1") || system_info.contains("AVX_VNNI = 1");
    format!("{base}{}", if vnni { "-vnni" } else { "" })
}

/// Whether the llama.cpp build uses the SIMD the host has. A ratio against a reference
/// built without AVX2/AVX-512 on a machine that has them would flatter us.
pub fn check_reference_simd(system_info: &str) -> Result<()> {
    let missing = missing_reference_simd(system_info, &host_simd());
    if missing.is_empty() {
        Ok(())
    } else {
        bail!(
            "refusing to report an rllama/llama.cpp ratio: this CPU has {} but the linked \
             llama.cpp was built without it (system_info: {system_info}); rebuild \
             llama-cpp-sys-2 for this CPU (e.g. RUSTFLAGS=\"-C target-cpu=native\") or \
             benchmark the engines separately",
            missing.join(" and ")
        )
    }
}

/// Host SIMD levels that llama.cpp's system_info reports: `(name, system_info marker)`.
pub fn host_simd() -> Vec<(&'static str, &'static str)> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            v.push(("AVX2", "AVX2 = 1"));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            v.push(("AVX-512F", "AVX512 = 1"));
        }
    }
    v
}

/// The host features whose marker is absent from `system_info`.
pub fn missing_reference_simd(
    system_info: &str,
    host: &[(&'static str, &'static str)],
) -> Vec<&'static str> {
    host.iter()
        .filter(|(_, marker)| !system_info.contains(marker))
        .map(|(name, _)| *name)
        .collect()
}

/// Progress lines on stderr: rewritten in place on a terminal, one per event otherwise.
pub struct Progress {
    enabled: bool,
    tty: bool,
    dirty: bool,
}

impl Progress {
    pub fn new(enabled: bool) -> Progress {
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
            dirty: false,
        }
    }

    pub fn update(&mut self, msg: &str) {
        if !self.enabled {
            return;
        }
        let mut e = std::io::stderr().lock();
        if self.tty {
            let _ = write!(e, "\r\x1b[Krbench: {msg}");
            self.dirty = true;
        } else {
            let _ = writeln!(e, "rbench: {msg}");
        }
        let _ = e.flush();
    }

    /// Ends an in-place line so other stderr output starts on a fresh line.
    pub fn finish_line(&mut self) {
        if self.dirty {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K");
            let _ = e.flush();
            self.dirty = false;
        }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for now (UTC).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Calendar date and time of day (UTC), shared by both timestamp formats.
pub use runtime::chat::civil_utc;

/// Formats seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn format_utc(secs: u64) -> String {
    let (y, m, d, h, mi, s) = civil_utc(secs as i64);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// How every test of a run is carried out.
#[derive(Debug, Clone)]
pub struct BenchOptions<'a> {
    pub engines: &'a [Engine],
    pub repetitions: usize,
    pub warmup: bool,
    /// Pin rllama's compute threads to their own CPUs.
    pub pin: bool,
    pub numa: Option<NumaMode>,
    /// tg tests alternate engines every this many tokens (0: per repetition).
    pub interleave: usize,
}

impl<'a> BenchOptions<'a> {
    pub fn from_params(params: &'a Params) -> BenchOptions<'a> {
        let run = params.run_options(1, 0);
        BenchOptions {
            engines: &params.engines,
            repetitions: params.repetitions,
            warmup: params.warmup,
            pin: run.pin,
            numa: run.numa,
            interleave: params.interleave,
        }
    }
}

/// Runs one test on every engine: warmup on each, then the repetitions alternating
/// between engines (rllama rep 1, llama.cpp rep 1, rllama rep 2, ...) so that machine
/// drift affects both alike. Returns one result per engine, in `engines` order.
pub fn run_test(
    spec: &TestSpec,
    test_idx: usize,
    n_tests: usize,
    model: &LoadedModel,
    opts: &BenchOptions<'_>,
    progress: &mut Progress,
) -> Result<Vec<TestResult>> {
    let BenchOptions {
        engines,
        repetitions,
        warmup,
        pin,
        numa,
        interleave,
    } = *opts;
    let name = spec.name();
    let test_time = utc_now();
    let label = format!("test {}/{n_tests} {name} t={}", test_idx + 1, spec.threads);

    enum Inst {
        Ours(Box<OursInstance>),
        #[cfg(feature = "llamacpp")]
        Ref(RefInstance),
    }
    let mut insts = Vec::with_capacity(engines.len());
    for &e in engines {
        progress.update(&format!("{label} [{e}] loading"));
        insts.push(match e {
            Engine::Rllama => {
                Inst::Ours(Box::new(OursInstance::new(model.ours()?, spec, pin, numa)?))
            }
            #[cfg(feature = "llamacpp")]
            Engine::LlamaCpp => Inst::Ref(
                RefInstance::new(&model.path, spec)
                    .with_context(|| format!("llama.cpp: {}", model.path.display()))?,
            ),
            #[cfg(not(feature = "llamacpp"))]
            Engine::LlamaCpp => bail!(NOT_BUILT),
        });
    }

    if warmup {
        let t = rep_tokens(&model.tokens, spec, test_idx, usize::MAX);
        for (inst, &e) in insts.iter_mut().zip(engines) {
            progress.update(&format!("{label} [{e}] warmup"));
            match inst {
                Inst::Ours(o) => o.warmup(&t),
                #[cfg(feature = "llamacpp")]
                Inst::Ref(r) => r.warmup(&t),
            }
            .with_context(|| format!("{name} warmup on {e}"))?;
        }
    }

    let mut samples: Vec<Vec<u64>> = vec![Vec::with_capacity(repetitions); engines.len()];
    // `--interleave N` on a tg test: the engines take turns every N tokens (after each
    // fills its depth, untimed), so drift in the machine's state reaches both alike.
    let interleaved = interleave > 0 && insts.len() > 1 && spec.n_prompt == 0 && spec.n_gen > 0;
    for rep in 0..repetitions {
        let t = rep_tokens(&model.tokens, spec, test_idx, rep);
        if interleaved {
            for (inst, &e) in insts.iter_mut().zip(engines) {
                progress.update(&format!(
                    "{label} [{e}] rep {}/{repetitions} depth",
                    rep + 1
                ));
                match inst {
                    Inst::Ours(o) => o.fill_depth(&t),
                    #[cfg(feature = "llamacpp")]
                    Inst::Ref(r) => r.fill_depth(&t),
                }
                .with_context(|| format!("{name} repetition {} on {e}", rep + 1))?;
            }
            progress.update(&format!(
                "{label} [interleaved every {interleave} tokens] rep {}/{repetitions}",
                rep + 1
            ));
            let n = insts.len();
            let mut ns = vec![0u64; n];
            let mut i = 0;
            while i < t.gen.len() {
                let toks = &t.gen[i..(i + interleave).min(t.gen.len())];
                for k in (0..n).map(|k| (k + rep) % n) {
                    // The other engine's threads spin for a while after its turn
                    // (llama.cpp's OpenMP workers for milliseconds): let them settle,
                    // untimed, so a turn never shares its cores with the previous one's
                    // spinners (smollm2 tg128, t=2, 8-token turns: ours/llama.cpp 1.48
                    // without, 1.63 with 20 ms, 1.64 alternating whole repetitions).
                    std::thread::sleep(TURN_SETTLE);
                    ns[k] += match &mut insts[k] {
                        Inst::Ours(o) => o.gen_tokens(toks),
                        #[cfg(feature = "llamacpp")]
                        Inst::Ref(r) => r.gen_tokens(toks),
                    }
                    .with_context(|| format!("{name} repetition {} on {}", rep + 1, engines[k]))?;
                }
                i += toks.len();
            }
            for (s, ns) in samples.iter_mut().zip(ns) {
                s.push(ns);
            }
            continue;
        }
        for (i, (inst, &e)) in insts.iter_mut().zip(engines).enumerate() {
            progress.update(&format!("{label} [{e}] rep {}/{repetitions}", rep + 1));
            let ns = match inst {
                Inst::Ours(o) => o.rep(&t),
                #[cfg(feature = "llamacpp")]
                Inst::Ref(r) => r.rep(&t),
            }
            .with_context(|| format!("{name} repetition {} on {e}", rep + 1))?;
            samples[i].push(ns);
        }
    }
    progress.finish_line();

    let n_nodes = numa::machine().map_or(1, |t| t.n_nodes());
    let mut out = Vec::with_capacity(engines.len());
    for ((inst, &engine), samples_ns) in insts.iter().zip(engines).zip(samples) {
        let numa_row = match inst {
            Inst::Ours(o) => NumaRow {
                mode: numa.map_or(String::new(), |m| m.name().to_string()),
                weights: model
                    .ours
                    .as_ref()
                    .map_or(WeightPlacement::FirstTouch, |m| m.weight_placement_mode())
                    .name()
                    .to_string(),
                nodes: n_nodes,
                thread_nodes: o.runner.pool.thread_nodes(),
                thread_cpus: o.runner.pool.pinned_cpus(),
                pages: model.ours.as_ref().map_or(Vec::new(), |m| m.weight_pages()),
            },
            #[cfg(feature = "llamacpp")]
            Inst::Ref(_) => NumaRow {
                mode: numa.map_or(String::new(), |m| m.name().to_string()),
                weights: WeightPlacement::FirstTouch.name().to_string(),
                nodes: n_nodes,
                ..NumaRow::default()
            },
        };
        let (info, model_bytes, kv_bytes, kv_tokens, flash_attn, pinned, isa) = match inst {
            Inst::Ours(o) => {
                let (b, t) = o.kv();
                let w = model
                    .ours
                    .as_ref()
                    .map_or(model.info.size, |m| m.weight_bytes());
                let isa = model
                    .ours
                    .as_ref()
                    .map_or(String::new(), |m| kernel_isas(m));
                (model.info.clone(), w, Some(b), Some(t), 0, o.pinned(), isa)
            }
            #[cfg(feature = "llamacpp")]
            Inst::Ref(r) => {
                let (info, kv_bytes, kv_tokens) = r.describe(model);
                let isa = llamacpp_isa(&llamacpp_ref::system_info());
                (
                    info,
                    r.m.model_size(),
                    kv_bytes,
                    Some(kv_tokens),
                    -1,
                    false,
                    isa,
                )
            }
        };
        // The same for both engines: what the architecture makes a token read (a MoE
        // token reads its experts only; a dense one, the whole model).
        let active_bytes = match &model.ours {
            Some(m) if m.is_moe() => m.active_weight_bytes().min(model_bytes),
            _ => model_bytes,
        };
        let dev = match inst {
            Inst::Ours(_) => model.ours.as_ref().and_then(|m| m.device_layers()),
            #[cfg(feature = "llamacpp")]
            Inst::Ref(_) => None,
        };
        let backend = dev.map_or("CPU".to_string(), |d| format!("CPU,{}", d.device()));
        let device_memory = dev.map(|d| (d.device().to_string(), d.memory()));
        out.push(TestResult {
            backend,
            device_memory,
            spec: spec.clone(),
            engine,
            info,
            model_bytes,
            active_bytes,
            kv_bytes,
            kv_tokens,
            flash_attn,
            test_time: test_time.clone(),
            samples_ns,
            pinned,
            isa,
            numa: numa_row,
        });
    }
    Ok(out)
}

/// The untimed pause before each engine's turn of an interleaved tg test.
const TURN_SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// Sleeps `--delay` seconds (between tests, not before the first).
pub fn delay(seconds: f64) {
    if seconds > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(seconds));
    }
}

#[cfg(test)]
mod tests {
    use super::flavor_mismatch;
    use runtime::{Flavor, Isa};

    #[test]
    fn flavor_note_only_where_kernels_and_order_disagree() {
        // What a CPU at each level runs by itself: no note.
        assert_eq!(flavor_mismatch(Isa::Avx512, Flavor::Avx512), None);
        assert_eq!(flavor_mismatch(Isa::Avx2, Flavor::Avx2), None);
        assert_eq!(flavor_mismatch(Isa::AvxVnni, Flavor::Avx2), None);
        assert_eq!(flavor_mismatch(Isa::Scalar, Flavor::Avx512), None);
        assert_eq!(flavor_mismatch(Isa::NeonDotprod, Flavor::Avx2), None);
        // RLLAMA_SIMD lowered on an AVX-512 machine, flavor left alone.
        for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx2Vnni] {
            let n = flavor_mismatch(isa, Flavor::Avx512).expect("a note");
            assert!(
                n.contains(isa.name()) && n.contains("RLLAMA_GGML_FLAVOR=avx2"),
                "{n}"
            );
        }
        let n = flavor_mismatch(Isa::Avx512, Flavor::Avx2).expect("a note");
        assert!(n.contains("avx2 order"), "{n}");
    }
}
