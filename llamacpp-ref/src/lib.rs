//! llama.cpp as a reference: the oracle our engine is checked against and the second
//! contestant of `rbench --engine rllama,llamacpp`.
//!
//! The tests of this crate compare our runtime with llama.cpp on the same GGUF files
//! (tokenization, logits, greedy generations, perplexity: `tests/`), `rbench` (feature
//! `llamacpp` of bench-cli) times it side by side with ours, and [`GgmlKernel`] exposes
//! ggml's own CPU dot-product kernels for the kernel micro-benchmarks
//! (`benches/kernels.rs`); [`mxfp4`] reaches ggml's MXFP4 functions beyond the type
//! traits (reference quantizer, repacked gemv/gemm) for `tests/mxfp4_vs_ggml.rs` and
//! `benches/mxfp4.rs`. `examples/trace_diff.rs` compares every intermediate tensor.
//! All FFI with llama.cpp and ggml lives in this crate, which nothing in production
//! depends on unless a feature asks for it.
//!
//! llama.cpp is built from source by `llama-cpp-sys-2`, native (`GGML_NATIVE`, the build
//! machine's SIMD) in the default build and in the portable one (`.cargo/config.toml`);
//! [`cpu_mismatch`] keeps a binary copied to a CPU without those features from running it.
//!
//! The engine runs on the CPU only (no layers offloaded, the model is memory-mapped).
//! llama.cpp's logging is dropped unless the environment variable `RLLAMA_REF_LOG=1` is set.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io::Read;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Once;
use std::time::Instant;

use llama_cpp_sys_2 as sys;
use quant::GgmlType;

#[cfg(feature = "chat")]
pub mod chat;
pub mod iq4_nl;
pub mod iq4_xs;
pub mod mxfp4;

/// Errors from the reference engine.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    /// The model file could not be opened or llama.cpp refused it, or the context could not
    /// be created.
    #[error("llama.cpp: failed to load model: {0}")]
    Load(String),
    /// Text could not be tokenized.
    #[error("llama.cpp: tokenization failed: {0}")]
    Tokenize(String),
    /// Token ids could not be turned back into text.
    #[error("llama.cpp: detokenization failed: {0}")]
    Detokenize(String),
    /// `llama_decode` failed, or its outputs were missing.
    #[error("llama.cpp: decode failed: {0}")]
    Decode(String),
    /// The evaluation needs more positions than the context holds.
    #[error("llama.cpp: context too small: {needed} positions needed, n_ctx is {n_ctx}")]
    ContextFull {
        /// Positions the request needs.
        needed: usize,
        /// Size of the context.
        n_ctx: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("llama.cpp: token id {id} is out of range (n_vocab = {n_vocab})")]
    BadToken {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The chat template is missing or not supported by `llama_chat_apply_template`.
    #[error("llama.cpp: chat template: {0}")]
    Template(String),
    /// An argument was rejected before reaching llama.cpp.
    #[error("llama.cpp: invalid argument: {0}")]
    InvalidArgument(String),
    /// This llama.cpp was compiled for CPU features this CPU lacks (see [`cpu_mismatch`]).
    #[error("llama.cpp: {0}")]
    Cpu(String),
}

/// The x86 features this build's llama.cpp was compiled for (rustc's names, from the
/// build script: the build machine's own with GGML_NATIVE, else rustc's target features).
pub const BUILD_CPU_FEATURES: &str = env!("LLAMACPP_BUILD_CPU_FEATURES");

/// Whether this build's llama.cpp was compiled with GGML_NATIVE.
pub const BUILD_NATIVE: bool = matches!(env!("LLAMACPP_BUILD_NATIVE").as_bytes(), b"1");

/// `Some(why)` when this CPU lacks a feature the linked llama.cpp was compiled for: it
/// would die of SIGILL, so nothing calls into llama.cpp then. Our own code is portable;
/// the reference is built for the machine it runs on (rebuild there).
pub fn cpu_mismatch() -> Option<String> {
    let missing: Vec<&str> = BUILD_CPU_FEATURES
        .split(',')
        .filter(|f| !f.is_empty() && !cpu_has(f))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "this binary's llama.cpp was built {} and needs {}, which this CPU lacks; \
             build rbench with the `llamacpp` feature on this machine to compare with \
             llama.cpp here",
            if BUILD_NATIVE {
                "for the build machine's CPU (GGML_NATIVE)"
            } else {
                "for rustc's target features"
            },
            missing.join(", ")
        )
    })
}

#[cfg(target_arch = "x86_64")]
fn cpu_has(f: &str) -> bool {
    use std::arch::is_x86_feature_detected as has;
    match f {
        "sse3" => has!("sse3"),
        "ssse3" => has!("ssse3"),
        "avx" => has!("avx"),
        "avx2" => has!("avx2"),
        "fma" => has!("fma"),
        "f16c" => has!("f16c"),
        "bmi2" => has!("bmi2"),
        "avx512f" => has!("avx512f"),
        "avx512bw" => has!("avx512bw"),
        "avx512dq" => has!("avx512dq"),
        "avx512vl" => has!("avx512vl"),
        "avx512vnni" => has!("avx512vnni"),
        "avx512vbmi" => has!("avx512vbmi"),
        "avx512bf16" => has!("avx512bf16"),
        _ => false,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has(_: &str) -> bool {
    false
}

/// [`cpu_mismatch`] as an error, checked before every entry into llama.cpp.
fn check_cpu() -> Result<(), RefError> {
    cpu_mismatch().map_or(Ok(()), |why| Err(RefError::Cpu(why)))
}

/// How to create the reference model and its context.
#[derive(Debug, Clone, PartialEq)]
pub struct RefOptions {
    /// Context size in tokens (KV cache positions). 0 = the model's training context,
    /// which can be very large (and allocate a large KV cache).
    pub n_ctx: u32,
    /// Logical batch size: the most tokens handed to one `llama_decode` call. Prompts are
    /// evaluated in chunks of this size. llama.cpp clamps it to `n_ctx`.
    pub n_batch: u32,
    /// Physical (micro-)batch size. 0 = same as `n_batch`. llama.cpp's own default is 512.
    pub n_ubatch: u32,
    /// Threads for single-token generation. <= 0 = all available cores.
    pub n_threads: i32,
    /// Threads for batch (prompt) processing. <= 0 = same as `n_threads`.
    pub n_threads_batch: i32,
    /// Flash attention: `None` = llama.cpp's automatic choice (on for CPU), `Some(on)`
    /// forces it. Defaults to `Some(false)`: llama.cpp's CPU flash-attention kernel
    /// accumulates in f16 and takes different paths for different batch sizes, so the same
    /// positions evaluated with a different batch split can differ by ~1 logit. Benchmarks
    /// that want llama.cpp's CLI default should use `None`.
    pub flash_attn: Option<bool>,
    /// Store the KV cache as f32 instead of llama.cpp's default f16 (closer numerics for
    /// correctness comparisons; slower and not what llama.cpp users run).
    pub kv_f32: bool,
    /// Record every f32/f16 tensor llama.cpp computes (through its graph evaluation
    /// callback), for [`RefModel::take_trace`]. Slow: each node is evaluated on its own.
    /// For debugging numerical differences only.
    pub trace: bool,
    /// Let llama.cpp repack weights for its CPU kernels (its default: "extra buffer
    /// types", which change some products' summation order). Off keeps them in ggml's
    /// plain layout, as a ggml device buffer holds them, so the products run `vec_dot`;
    /// `RLLAMA_REF_NO_REPACK` turns it off everywhere (a debugging aid).
    pub repack: bool,
}

/// One intermediate tensor recorded by a tracing [`RefModel`], as f32 in ggml's element
/// order (`ne[0]` fastest).
#[derive(Debug, Clone)]
pub struct RefTensor {
    /// ggml's name, such as `attn_norm-0` or `result_output`.
    pub name: String,
    /// Shape, `ne[0]` first.
    pub ne: [usize; 4],
    pub data: Vec<f32>,
}

impl Default for RefOptions {
    fn default() -> Self {
        RefOptions {
            n_ctx: 2048,
            n_batch: 512,
            n_ubatch: 512,
            n_threads: 0,
            n_threads_batch: 0,
            flash_attn: Some(false),
            kv_f32: false,
            trace: false,
            repack: true,
        }
    }
}

fn default_threads() -> i32 {
    std::thread::available_parallelism()
        .map(|n| i32::try_from(n.get()).unwrap_or(i32::MAX))
        .unwrap_or(1)
}

/// Index of the largest value; the first one wins ties (as llama.cpp's greedy sampler) and
/// NaNs are never chosen unless every value is NaN.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

static INIT: Once = Once::new();

/// Drops llama.cpp/ggml log messages unless `RLLAMA_REF_LOG=1`, in which case they go
/// to stderr. Never panics (it is called from C).
unsafe extern "C" fn log_callback(
    _level: sys::ggml_log_level,
    text: *const c_char,
    user_data: *mut c_void,
) {
    // user_data is non-null exactly when logging was enabled at init time.
    if user_data.is_null() || text.is_null() {
        return;
    }
    use std::io::Write;
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    let _ = std::io::stderr().write_all(bytes);
}

/// Installs the log callback and initialises the llama.cpp backend, once per process.
fn init() {
    INIT.call_once(|| {
        let enabled = std::env::var("RLLAMA_REF_LOG").is_ok_and(|v| v == "1");
        // Any non-null pointer works as the "enabled" flag; it is never dereferenced.
        let flag: *mut c_void = if enabled {
            NonNull::<u8>::dangling().as_ptr().cast()
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the callback is a plain function valid for the program's lifetime.
        unsafe {
            sys::llama_log_set(Some(log_callback), flag);
            sys::llama_backend_init();
        }
    });
}

/// llama.cpp's NUMA strategies (`--numa`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NumaStrategy {
    Distribute,
    Isolate,
    Numactl,
}

/// `llama_numa_init`, as llama.cpp's tools call it after the backend's init: ggml's CPU
/// threads then follow the strategy. Once per process; later calls are ignored (ggml
/// keeps the first).
pub fn numa_init(s: NumaStrategy) {
    if cpu_mismatch().is_some() {
        // Loading a model reports it; nothing here may run llama.cpp code.
        return;
    }
    init();
    let v = match s {
        NumaStrategy::Distribute => sys::GGML_NUMA_STRATEGY_DISTRIBUTE,
        NumaStrategy::Isolate => sys::GGML_NUMA_STRATEGY_ISOLATE,
        NumaStrategy::Numactl => sys::GGML_NUMA_STRATEGY_NUMACTL,
    };
    // SAFETY: plain call with an enum value ggml defines.
    unsafe { sys::llama_numa_init(v) };
}

/// llama.cpp's description of the CPU features it was compiled with and detected, e.g.
/// `"CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | ..."`.
pub fn system_info() -> String {
    if let Some(why) = cpu_mismatch() {
        return format!("CPU : not run ({why})");
    }
    init();
    // SAFETY: returns a pointer to a static (thread-local) string, or null.
    let p = unsafe { sys::llama_print_system_info() };
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated.
    unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string()
}

/// ggml's own CPU kernels for one weight type: the `vec_dot` of its
/// `ggml_get_type_traits_cpu` entry, and the `from_float` of its `vec_dot_type`'s entry
/// (how ggml quantizes activations before a matrix product). For kernel benchmarks and
/// cross-checks of `quant` against ggml, one row at a time.
#[derive(Clone, Copy)]
pub struct GgmlKernel {
    ty: GgmlType,
    vec_dot_type: GgmlType,
    /// log2 of the block size, shared by the weight and activation types.
    block_shift: u32,
    type_size: usize,
    vec_dot_type_size: usize,
    vec_dot: VecDotFn,
    from_float: FromFloatFn,
}

type VecDotFn =
    unsafe extern "C" fn(c_int, *mut f32, usize, *const c_void, usize, *const c_void, usize, c_int);
type FromFloatFn = unsafe extern "C" fn(*const f32, *mut c_void, i64);

/// `ty`'s block size and bytes per block as ggml sees them, checked against `quant`'s
/// table (the wrapper bounds-checks rows with `quant`'s numbers).
fn ggml_geometry(ty: GgmlType) -> Result<(usize, usize), RefError> {
    // SAFETY: every `GgmlType` id is a valid `ggml_type` (< GGML_TYPE_COUNT).
    let (blck, size) = unsafe {
        (
            sys::ggml_blck_size(ty as sys::ggml_type),
            sys::ggml_type_size(ty as sys::ggml_type),
        )
    };
    if usize::try_from(blck) != Ok(ty.block_size()) || size != ty.type_size() {
        return Err(RefError::InvalidArgument(format!(
            "{ty}: ggml's block geometry ({blck} elements, {size} bytes) differs from quant's"
        )));
    }
    Ok((ty.block_size(), size))
}

impl GgmlKernel {
    /// ggml's kernels for weights of type `ty`; fails when ggml has no CPU `vec_dot` for
    /// it or its block geometry differs from `quant`'s.
    pub fn new(ty: GgmlType) -> Result<GgmlKernel, RefError> {
        check_cpu()?;
        init();
        let unsupported = || RefError::InvalidArgument(format!("ggml has no CPU vec_dot for {ty}"));
        // SAFETY: sets up ggml-cpu's lookup tables; idempotent and thread-safe.
        unsafe { sys::ggml_cpu_init() };
        // SAFETY: valid type id (see `ggml_geometry`); the table is static.
        let traits = unsafe { sys::ggml_get_type_traits_cpu(ty as sys::ggml_type).as_ref() }
            .ok_or_else(unsupported)?;
        let vec_dot = traits.vec_dot.ok_or_else(unsupported)?;
        let vec_dot_type = GgmlType::from_u32(traits.vec_dot_type).ok_or_else(unsupported)?;
        // SAFETY: as above.
        let from_float =
            unsafe { sys::ggml_get_type_traits_cpu(vec_dot_type as sys::ggml_type).as_ref() }
                .and_then(|t| t.from_float)
                .ok_or_else(unsupported)?;
        let (block, type_size) = ggml_geometry(ty)?;
        let (vblock, vec_dot_type_size) = ggml_geometry(vec_dot_type)?;
        if block != vblock || !block.is_power_of_two() {
            return Err(unsupported());
        }
        Ok(GgmlKernel {
            ty,
            vec_dot_type,
            block_shift: block.trailing_zeros(),
            type_size,
            vec_dot_type_size,
            vec_dot,
            from_float,
        })
    }

    /// The weight type.
    pub fn weight_type(&self) -> GgmlType {
        self.ty
    }

    /// The type ggml quantizes activations to for this weight type.
    pub fn vec_dot_type(&self) -> GgmlType {
        self.vec_dot_type
    }

    /// Number of blocks in `n` elements, if `n` is a whole number of blocks that fits a
    /// C `int`.
    fn blocks(&self, n: usize) -> Option<usize> {
        let whole = n & ((1 << self.block_shift) - 1) == 0;
        (whole && n <= c_int::MAX as usize).then_some(n >> self.block_shift)
    }

    fn size_error(&self, what: &str, n: usize, len: usize) -> RefError {
        RefError::InvalidArgument(format!(
            "ggml {}: {len} bytes of {what} do not hold {n} elements",
            self.ty
        ))
    }

    /// Quantizes `x` into `out` (exactly `x.len()` elements of [`Self::vec_dot_type`])
    /// with ggml's CPU quantizer.
    pub fn quantize_activations(&self, x: &[f32], out: &mut [u8]) -> Result<(), RefError> {
        let n = x.len();
        match self.blocks(n) {
            Some(nb) if nb * self.vec_dot_type_size == out.len() => {}
            _ => return Err(self.size_error("activations", n, out.len())),
        }
        // SAFETY: `out` holds exactly the blocks for `n` floats (checked above).
        unsafe { (self.from_float)(x.as_ptr(), out.as_mut_ptr().cast(), n as i64) };
        Ok(())
    }

    /// Dot product of weight row `w` and activation row `a`, `n` elements each, with
    /// ggml's CPU kernel.
    #[inline]
    pub fn vec_dot(&self, n: usize, w: &[u8], a: &[u8]) -> Result<f32, RefError> {
        let nb = self
            .blocks(n)
            .ok_or_else(|| self.size_error("weights", n, w.len()))?;
        if nb * self.type_size != w.len() {
            return Err(self.size_error("weights", n, w.len()));
        }
        if nb * self.vec_dot_type_size != a.len() {
            return Err(self.size_error("activations", n, a.len()));
        }
        let mut s = 0f32;
        // SAFETY: both rows hold exactly `n` elements of their types (checked above);
        // one row (nrc = 1), so the strides are unused.
        unsafe {
            (self.vec_dot)(
                n as c_int,
                &mut s,
                0,
                w.as_ptr().cast(),
                0,
                a.as_ptr().cast(),
                0,
                1,
            )
        };
        Ok(s)
    }
}

/// Reusable storage behind a `llama_batch` (single sequence, id 0).
struct Batch {
    tokens: Vec<sys::llama_token>,
    pos: Vec<sys::llama_pos>,
    n_seq_id: Vec<i32>,
    seq_ids: Vec<*mut sys::llama_seq_id>,
    logits: Vec<i8>,
    /// The one sequence id every token belongs to; boxed so its address is stable.
    seq0: Box<sys::llama_seq_id>,
}

impl Batch {
    fn new() -> Self {
        Batch {
            tokens: Vec::new(),
            pos: Vec::new(),
            n_seq_id: Vec::new(),
            seq_ids: Vec::new(),
            logits: Vec::new(),
            seq0: Box::new(0),
        }
    }

    /// Fills the batch with `tokens` at positions `pos0..`; `all_outputs` asks for the
    /// logits of every token, otherwise only the last one's.
    fn fill(&mut self, tokens: &[u32], pos0: i32, all_outputs: bool) {
        let n = tokens.len();
        self.tokens.clear();
        self.tokens
            .extend(tokens.iter().map(|&t| t as sys::llama_token));
        self.pos.clear();
        self.pos.extend((0..n).map(|i| pos0 + i as i32));
        self.n_seq_id.clear();
        self.n_seq_id.resize(n, 1);
        let seq0: *mut sys::llama_seq_id = &mut *self.seq0;
        self.seq_ids.clear();
        self.seq_ids.resize(n, seq0);
        self.logits.clear();
        self.logits.resize(n, i8::from(all_outputs));
        if let Some(last) = self.logits.last_mut() {
            *last = 1;
        }
    }

    /// A `llama_batch` view of the current contents. Valid until the next `fill`.
    fn as_raw(&mut self) -> sys::llama_batch {
        sys::llama_batch {
            n_tokens: self.tokens.len() as i32,
            token: self.tokens.as_mut_ptr(),
            embd: std::ptr::null_mut(),
            pos: self.pos.as_mut_ptr(),
            n_seq_id: self.n_seq_id.as_mut_ptr(),
            seq_id: self.seq_ids.as_mut_ptr(),
            logits: self.logits.as_mut_ptr(),
        }
    }
}

/// A GGUF model loaded by llama.cpp together with one inference context (CPU only).
pub struct RefModel {
    model: NonNull<sys::llama_model>,
    ctx: NonNull<sys::llama_context>,
    vocab: NonNull<sys::llama_vocab>,
    n_vocab: usize,
    n_ctx: usize,
    n_batch: usize,
    /// Next position to evaluate (number of positions in the KV cache).
    pos: usize,
    batch: Batch,
    /// Tensors recorded by the evaluation callback (boxed: its address is the
    /// callback's user data and must not move with the RefModel).
    #[allow(clippy::box_collection)]
    trace: Option<Box<Vec<RefTensor>>>,
}

// SAFETY: the llama_model / llama_context are heap objects with no thread affinity
// (no thread-local state is tied to them); llama.cpp only requires that a context is
// not used by two threads at once. RefModel owns both exclusively, every method that
// touches the context takes `&mut self`, and it is not `Sync`, so moving it to another
// thread is sound. The raw pointers in `Batch` point into its own allocations.
unsafe impl Send for RefModel {}

/// ggml's evaluation callback: asks for every f32/f16 node, then copies it out.
unsafe extern "C" fn trace_cb(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user_data: *mut std::os::raw::c_void,
) -> bool {
    // SAFETY: ggml passes a valid tensor; user_data is the Box<Vec<RefTensor>> owned by
    // the RefModel whose decode call is running (on this thread).
    let t = unsafe { &*t };
    let wanted = t.type_ == sys::GGML_TYPE_F32 || t.type_ == sys::GGML_TYPE_F16;
    if ask {
        return wanted;
    }
    if !wanted {
        return true;
    }
    let out = unsafe { &mut *user_data.cast::<Vec<RefTensor>>() };
    let nbytes = unsafe { sys::ggml_nbytes(t) };
    let mut raw = vec![0u8; nbytes];
    // SAFETY: reads nbytes from the tensor's own storage into our buffer.
    unsafe { sys::ggml_backend_tensor_get(t, raw.as_mut_ptr().cast(), 0, nbytes) };
    let ne = t.ne.map(|n| n.max(0) as usize);
    let mut data = Vec::with_capacity(ne.iter().product());
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let off = i0 * t.nb[0] + i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
                    data.push(if t.type_ == sys::GGML_TYPE_F32 {
                        f32::from_le_bytes(raw[off..off + 4].try_into().unwrap())
                    } else {
                        half::f16::from_le_bytes(raw[off..off + 2].try_into().unwrap()).to_f32()
                    });
                }
            }
        }
    }
    let name = unsafe { std::ffi::CStr::from_ptr(t.name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    out.push(RefTensor { name, ne, data });
    true
}

impl Drop for RefModel {
    fn drop(&mut self) {
        // SAFETY: both pointers came from llama.cpp, are owned by us and freed once;
        // the context is freed before the model it refers to.
        unsafe {
            sys::llama_free(self.ctx.as_ptr());
            sys::llama_model_free(self.model.as_ptr());
        }
    }
}

fn path_to_cstring(path: &Path) -> Result<CString, RefError> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| RefError::Load(format!("{}: path is not UTF-8", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes)
        .map_err(|_| RefError::Load(format!("{}: path contains a NUL byte", path.display())))
}

/// Rejects obviously bad files before llama.cpp sees them.
fn precheck_file(path: &Path) -> Result<(), RefError> {
    let mut f = std::fs::File::open(path)
        .map_err(|e| RefError::Load(format!("{}: {e}", path.display())))?;
    let mut magic = [0u8; 4];
    f.read_exact(&mut magic)
        .map_err(|e| RefError::Load(format!("{}: cannot read GGUF header: {e}", path.display())))?;
    if &magic != b"GGUF" {
        return Err(RefError::Load(format!(
            "{}: not a GGUF file (magic {:02x?})",
            path.display(),
            magic
        )));
    }
    Ok(())
}

/// Calls `f(buf_ptr, buf_len)` with a growing buffer until the result fits. `f` follows
/// llama.cpp's conventions: it returns the number of bytes written or, if negative, the
/// negated size needed, or (for APIs that truncate) a length larger than the buffer.
fn with_buffer(initial: usize, mut f: impl FnMut(*mut c_char, i32) -> i32) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; initial.max(8)];
    for _ in 0..4 {
        let len = i32::try_from(buf.len()).unwrap_or(i32::MAX);
        let n = f(buf.as_mut_ptr().cast(), len);
        if n == i32::MIN {
            return Err(n);
        }
        if n < 0 {
            buf.resize((-n) as usize, 0);
            continue;
        }
        let n = n as usize;
        if n > buf.len() {
            // Some APIs return the full length and truncate; retry with enough room.
            buf.resize(n, 0);
            continue;
        }
        buf.truncate(n);
        return Ok(buf);
    }
    Err(-1)
}

impl RefModel {
    /// Loads `path` with llama.cpp (CPU, memory-mapped) and creates a context.
    pub fn load(path: &Path, opts: &RefOptions) -> Result<RefModel, RefError> {
        Self::load_inner(path, opts, None)
    }

    /// [`RefModel::load`] with a context that computes embeddings pooled with
    /// `pooling` (llama.cpp's `LLAMA_POOLING_TYPE_*`: 1 mean, 2 CLS, 3 last), for
    /// [`RefModel::embed`].
    pub fn load_embedding(
        path: &Path,
        opts: &RefOptions,
        pooling: i32,
    ) -> Result<RefModel, RefError> {
        Self::load_inner(path, opts, Some(pooling))
    }

    fn load_inner(
        path: &Path,
        opts: &RefOptions,
        pooling: Option<i32>,
    ) -> Result<RefModel, RefError> {
        if opts.n_batch == 0 {
            return Err(RefError::InvalidArgument("n_batch must be > 0".into()));
        }
        precheck_file(path)?;
        let cpath = path_to_cstring(path)?;
        check_cpu()?;
        init();

        // SAFETY: plain value-returning calls.
        let mut mparams = unsafe { sys::llama_model_default_params() };
        mparams.n_gpu_layers = 0;
        mparams.load_mode = sys::LLAMA_LOAD_MODE_MMAP;
        if !opts.repack || std::env::var_os("RLLAMA_REF_NO_REPACK").is_some() {
            mparams.use_extra_bufts = false;
        }

        // SAFETY: cpath is NUL-terminated and outlives the call; params are by value.
        let model = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), mparams) };
        let model = NonNull::new(model).ok_or_else(|| {
            RefError::Load(format!(
                "{}: llama.cpp could not load the model (set RLLAMA_REF_LOG=1 for its log)",
                path.display()
            ))
        })?;

        let n_threads = if opts.n_threads > 0 {
            opts.n_threads
        } else {
            default_threads()
        };
        let n_threads_batch = if opts.n_threads_batch > 0 {
            opts.n_threads_batch
        } else {
            n_threads
        };

        // SAFETY: plain value-returning call.
        let mut cparams = unsafe { sys::llama_context_default_params() };
        cparams.n_ctx = opts.n_ctx;
        cparams.n_batch = opts.n_batch;
        cparams.n_ubatch = if opts.n_ubatch == 0 {
            opts.n_batch
        } else {
            opts.n_ubatch
        };
        cparams.n_seq_max = 1;
        // Room for an output (logits row) for every token of a batch.
        cparams.n_outputs_max = 0;
        cparams.n_threads = n_threads;
        cparams.n_threads_batch = n_threads_batch;
        cparams.flash_attn_type = match opts.flash_attn {
            None => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
            Some(true) => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            Some(false) => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        if opts.kv_f32 {
            cparams.type_k = sys::GGML_TYPE_F32;
            cparams.type_v = sys::GGML_TYPE_F32;
        }
        cparams.embeddings = pooling.is_some();
        if let Some(p) = pooling {
            cparams.pooling_type = p as sys::llama_pooling_type;
        }
        cparams.no_perf = true;
        let mut trace = opts.trace.then(|| Box::new(Vec::<RefTensor>::new()));
        if let Some(t) = trace.as_mut() {
            cparams.cb_eval = Some(trace_cb);
            cparams.cb_eval_user_data = (&mut **t as *mut Vec<RefTensor>).cast();
        }

        // SAFETY: model is a valid loaded model.
        let ctx = unsafe { sys::llama_init_from_model(model.as_ptr(), cparams) };
        let Some(ctx) = NonNull::new(ctx) else {
            // SAFETY: model is valid and not referenced by anything else.
            unsafe { sys::llama_model_free(model.as_ptr()) };
            return Err(RefError::Load(format!(
                "{}: llama.cpp could not create a context (n_ctx {}, n_batch {}; \
                 set RLLAMA_REF_LOG=1 for its log)",
                path.display(),
                opts.n_ctx,
                opts.n_batch
            )));
        };

        // SAFETY: model and ctx are valid.
        let (vocab, n_vocab, n_ctx, n_batch) = unsafe {
            (
                sys::llama_model_get_vocab(model.as_ptr()),
                sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model.as_ptr())),
                sys::llama_n_ctx(ctx.as_ptr()),
                sys::llama_n_batch(ctx.as_ptr()),
            )
        };
        let fail = |msg: String| {
            // SAFETY: both valid, freed once, context first.
            unsafe {
                sys::llama_free(ctx.as_ptr());
                sys::llama_model_free(model.as_ptr());
            }
            Err(RefError::Load(format!("{}: {msg}", path.display())))
        };
        let Some(vocab) = NonNull::new(vocab.cast_mut()) else {
            return fail("model has no vocabulary".into());
        };
        if n_vocab <= 0 || n_ctx == 0 || n_batch == 0 {
            return fail(format!(
                "unexpected sizes: n_vocab {n_vocab}, n_ctx {n_ctx}, n_batch {n_batch}"
            ));
        }
        // SAFETY: model is valid.
        if unsafe { sys::llama_model_has_encoder(model.as_ptr()) } {
            return fail("encoder-decoder models are not supported by the reference".into());
        }

        Ok(RefModel {
            model,
            ctx,
            vocab,
            n_vocab: n_vocab as usize,
            n_ctx: n_ctx as usize,
            n_batch: n_batch as usize,
            pos: 0,
            batch: Batch::new(),
            trace,
        })
    }

    /// The tensors recorded since the last call (empty unless loaded with
    /// [`RefOptions::trace`]), in evaluation order.
    pub fn take_trace(&mut self) -> Vec<RefTensor> {
        self.trace
            .as_mut()
            .map(|t| std::mem::take(&mut **t))
            .unwrap_or_default()
    }

    /// Vocabulary size (also the length of one logits row).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Context size in tokens, as created.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Logical batch size, as created (after llama.cpp's clamping).
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Number of positions currently in the KV cache (where the next token goes).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Changes the thread counts (generation, batch). Values <= 0 mean all cores.
    pub fn set_threads(&mut self, n_threads: i32, n_threads_batch: i32) {
        let n = if n_threads > 0 {
            n_threads
        } else {
            default_threads()
        };
        let nb = if n_threads_batch > 0 {
            n_threads_batch
        } else {
            n
        };
        // SAFETY: ctx is valid and exclusively borrowed.
        unsafe { sys::llama_set_n_threads(self.ctx.as_ptr(), n, nb) };
    }

    /// Current (generation, batch) thread counts.
    pub fn threads(&self) -> (i32, i32) {
        // SAFETY: ctx is valid; these only read fields.
        unsafe {
            (
                sys::llama_n_threads(self.ctx.as_ptr()),
                sys::llama_n_threads_batch(self.ctx.as_ptr()),
            )
        }
    }

    /// llama.cpp's one-line model description, e.g. `"llama 135M Q8_0"`.
    pub fn desc(&self) -> String {
        let mut buf = [0u8; 256];
        // SAFETY: buf has buf.len() bytes; model is valid; the result is NUL-terminated
        // (snprintf semantics, truncated if needed).
        let n = unsafe {
            sys::llama_model_desc(self.model.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
        };
        if n < 0 {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// Total size of the model's tensors in bytes.
    pub fn model_size(&self) -> u64 {
        // SAFETY: model is valid.
        unsafe { sys::llama_model_size(self.model.as_ptr()) }
    }

    /// Number of parameters.
    pub fn n_params(&self) -> u64 {
        // SAFETY: model is valid.
        unsafe { sys::llama_model_n_params(self.model.as_ptr()) }
    }

    fn check_token(&self, id: u32) -> Result<(), RefError> {
        if (id as usize) < self.n_vocab {
            Ok(())
        } else {
            Err(RefError::BadToken {
                id,
                n_vocab: self.n_vocab,
            })
        }
    }

    fn check_tokens(&self, ids: &[u32]) -> Result<(), RefError> {
        ids.iter().try_for_each(|&id| self.check_token(id))
    }

    /// Tokenizes `text`. `add_special` adds BOS/EOS if the model is configured to;
    /// `parse_special` recognises special/control tokens written in the text.
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, RefError> {
        let text_len = i32::try_from(text.len())
            .map_err(|_| RefError::Tokenize("text longer than i32::MAX bytes".into()))?;
        let mut out: Vec<sys::llama_token> = vec![0; text.len() + 8];
        for _ in 0..3 {
            let cap = i32::try_from(out.len()).unwrap_or(i32::MAX);
            // SAFETY: text points to text_len bytes (no NUL needed); out has cap slots.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab.as_ptr(),
                    text.as_ptr().cast(),
                    text_len,
                    out.as_mut_ptr(),
                    cap,
                    add_special,
                    parse_special,
                )
            };
            if n == i32::MIN {
                return Err(RefError::Tokenize("token count overflows i32".into()));
            }
            if n < 0 {
                out.resize((-n) as usize, 0);
                continue;
            }
            out.truncate(n as usize);
            return out
                .into_iter()
                .map(|t| {
                    u32::try_from(t)
                        .map_err(|_| RefError::Tokenize(format!("negative token id {t}")))
                })
                .collect();
        }
        Err(RefError::Tokenize("buffer size negotiation failed".into()))
    }

    /// The bytes of one token (may be a partial UTF-8 sequence). `special` renders
    /// special/control tokens; otherwise they come out empty. Out-of-range ids give an
    /// empty vector.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        if self.check_token(id).is_err() {
            return Vec::new();
        }
        with_buffer(32, |buf, len| {
            // SAFETY: buf has len bytes; id is in range; vocab is valid.
            unsafe {
                sys::llama_token_to_piece(
                    self.vocab.as_ptr(),
                    id as sys::llama_token,
                    buf,
                    len,
                    0,
                    special,
                )
            }
        })
        .unwrap_or_default()
    }

    /// Detokenizes `ids` to raw bytes. `remove_special` strips BOS/EOS if the model adds
    /// them; `unparse_special` renders special tokens as text.
    pub fn detokenize_bytes(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>, RefError> {
        self.check_tokens(ids)
            .map_err(|e| RefError::Detokenize(e.to_string()))?;
        let n_tokens =
            i32::try_from(ids.len()).map_err(|_| RefError::Detokenize("too many tokens".into()))?;
        let toks: Vec<sys::llama_token> = ids.iter().map(|&t| t as sys::llama_token).collect();
        with_buffer(ids.len() * 8 + 16, |buf, len| {
            // SAFETY: toks has n_tokens valid ids; buf has len bytes; vocab is valid.
            unsafe {
                sys::llama_detokenize(
                    self.vocab.as_ptr(),
                    toks.as_ptr(),
                    n_tokens,
                    buf,
                    len,
                    remove_special,
                    unparse_special,
                )
            }
        })
        .map_err(|n| RefError::Detokenize(format!("llama_detokenize returned {n}")))
    }

    /// Detokenizes `ids` to a string (invalid UTF-8 is replaced with U+FFFD; use
    /// [`RefModel::detokenize_bytes`] for the exact bytes).
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<String, RefError> {
        let bytes = self.detokenize_bytes(ids, remove_special, unparse_special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn special(&self, t: sys::llama_token) -> Option<u32> {
        u32::try_from(t)
            .ok()
            .filter(|&t| (t as usize) < self.n_vocab)
    }

    /// Beginning-of-sequence token, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        // SAFETY: vocab is valid.
        self.special(unsafe { sys::llama_vocab_bos(self.vocab.as_ptr()) })
    }

    /// End-of-sequence token, if the vocabulary has one.
    pub fn eos(&self) -> Option<u32> {
        // SAFETY: vocab is valid.
        self.special(unsafe { sys::llama_vocab_eos(self.vocab.as_ptr()) })
    }

    /// End-of-turn token, if the vocabulary has one.
    pub fn eot(&self) -> Option<u32> {
        // SAFETY: vocab is valid.
        self.special(unsafe { sys::llama_vocab_eot(self.vocab.as_ptr()) })
    }

    /// Whether the tokenizer prepends BOS when `add_special` is set.
    pub fn add_bos(&self) -> bool {
        // SAFETY: vocab is valid.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab.as_ptr()) }
    }

    /// Whether `id` ends generation (EOS, EOT, ... as llama.cpp decides).
    pub fn is_eog(&self, id: u32) -> bool {
        // SAFETY: vocab is valid; the id is range-checked first.
        self.check_token(id).is_ok()
            && unsafe { sys::llama_vocab_is_eog(self.vocab.as_ptr(), id as sys::llama_token) }
    }

    /// Empties the KV cache; the next evaluation starts at position 0.
    pub fn clear_kv(&mut self) {
        // SAFETY: ctx is valid; the memory handle belongs to it.
        unsafe {
            let mem = sys::llama_get_memory(self.ctx.as_ptr());
            if !mem.is_null() {
                sys::llama_memory_clear(mem, true);
            }
        }
        self.pos = 0;
    }

    fn check_room(&self, extra: usize) -> Result<(), RefError> {
        let needed = self.pos + extra;
        if needed > self.n_ctx {
            Err(RefError::ContextFull {
                needed,
                n_ctx: self.n_ctx,
            })
        } else {
            Ok(())
        }
    }

    /// Evaluates `tokens` (at most n_batch) at the current position. With
    /// `all_outputs` the logits of every token are kept, otherwise only the last.
    /// Tokens must have been range-checked and room checked.
    fn decode_chunk(&mut self, tokens: &[u32], all_outputs: bool) -> Result<(), RefError> {
        debug_assert!(!tokens.is_empty() && tokens.len() <= self.n_batch);
        self.batch.fill(tokens, self.pos as i32, all_outputs);
        let raw = self.batch.as_raw();
        // SAFETY: the batch arrays hold n_tokens entries each and live until the call
        // returns; token ids and positions were validated; ctx is valid and exclusive.
        let ret = unsafe { sys::llama_decode(self.ctx.as_ptr(), raw) };
        if ret != 0 {
            let what = match ret {
                1 => "no KV cache slot for the batch",
                2 => "aborted",
                -1 => "invalid input batch",
                _ => "fatal error",
            };
            // The KV cache may hold part of the batch now: reset to a known state.
            self.clear_kv();
            return Err(RefError::Decode(format!(
                "llama_decode returned {ret} ({what})"
            )));
        }
        self.pos += tokens.len();
        Ok(())
    }

    /// Logits row `i` of the last decode.
    fn logits_row(&mut self, i: i32) -> Result<&[f32], RefError> {
        // SAFETY: ctx is valid; the returned pointer (if non-null) addresses n_vocab
        // floats owned by the context, valid until the next decode, which the borrow
        // of `self` prevents.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ctx.as_ptr(), i);
            if p.is_null() {
                return Err(RefError::Decode(format!("no logits for output {i}")));
            }
            Ok(std::slice::from_raw_parts(p, self.n_vocab))
        }
    }

    /// Clears the KV cache, evaluates `tokens` from position 0 (in chunks of n_batch) and
    /// returns the logits of every position, row-major (`tokens.len() x n_vocab`).
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RefError> {
        self.check_tokens(tokens)?;
        self.clear_kv();
        self.check_room(tokens.len())?;
        let mut out = Vec::with_capacity(tokens.len() * self.n_vocab);
        for chunk in tokens.chunks(self.n_batch) {
            self.decode_chunk(chunk, true)?;
            for i in 0..chunk.len() {
                let row = self.logits_row(i as i32)?;
                out.extend_from_slice(row);
            }
        }
        Ok(out)
    }

    /// Clears the KV cache, evaluates `tokens` in one batch (they must fit `n_batch`, as
    /// llama-embedding requires) and returns their pooled embedding, as llama.cpp leaves
    /// it (not normalized). Needs a model from [`RefModel::load_embedding`].
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RefError> {
        if tokens.is_empty() || tokens.len() > self.n_batch {
            return Err(RefError::InvalidArgument(format!(
                "an input of {} tokens (1..={} fit one batch)",
                tokens.len(),
                self.n_batch
            )));
        }
        self.check_tokens(tokens)?;
        self.clear_kv();
        self.check_room(tokens.len())?;
        self.decode_chunk(tokens, true)?;
        // SAFETY: model and ctx are valid; the pointer (if non-null) addresses n_embd
        // floats owned by the context until the next decode, copied out at once.
        unsafe {
            let n = sys::llama_model_n_embd(self.model.as_ptr()) as usize;
            let p = sys::llama_get_embeddings_seq(self.ctx.as_ptr(), 0);
            if p.is_null() {
                return Err(RefError::Decode(
                    "no pooled embedding (was the model loaded with load_embedding?)".into(),
                ));
            }
            Ok(std::slice::from_raw_parts(p, n).to_vec())
        }
    }

    /// Clears the KV cache, evaluates `tokens` (with only the last position's logits)
    /// and returns the last logits row.
    pub fn logits_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, RefError> {
        if tokens.is_empty() {
            return Err(RefError::InvalidArgument("empty token list".into()));
        }
        self.check_tokens(tokens)?;
        self.clear_kv();
        self.check_room(tokens.len())?;
        for chunk in tokens.chunks(self.n_batch) {
            self.decode_chunk(chunk, false)?;
        }
        Ok(self.logits_row(-1)?.to_vec())
    }

    /// Clears the KV cache, evaluates the prompt, then greedy-decodes up to `n` tokens
    /// (argmax, lowest id wins ties). Generation stops early when an end-of-generation
    /// token is produced; that token is *not* included, so a result shorter than `n`
    /// means generation ended.
    pub fn greedy(&mut self, prompt: &[u32], n: usize) -> Result<Vec<u32>, RefError> {
        if prompt.is_empty() {
            return Err(RefError::InvalidArgument(
                "greedy needs a non-empty prompt".into(),
            ));
        }
        self.check_tokens(prompt)?;
        self.clear_kv();
        // The last generated token is never evaluated.
        self.check_room(prompt.len() + n.saturating_sub(1))?;
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return Ok(out);
        }
        for chunk in prompt.chunks(self.n_batch) {
            self.decode_chunk(chunk, false)?;
        }
        loop {
            let next = argmax(self.logits_row(-1)?) as u32;
            if self.is_eog(next) {
                break;
            }
            out.push(next);
            if out.len() == n {
                break;
            }
            self.decode_chunk(&[next], false)?;
        }
        Ok(out)
    }

    /// Benchmark: clears the KV cache and evaluates `tokens` in n_batch chunks (only the
    /// last token's logits are computed, like llama-bench). Returns the elapsed
    /// nanoseconds. The KV cache keeps the prompt, so [`RefModel::time_generate`] can
    /// continue after it.
    pub fn time_prompt(&mut self, tokens: &[u32]) -> Result<u64, RefError> {
        self.clear_kv();
        self.time_prompt_after(tokens)
    }

    /// Benchmark: evaluates `tokens` in n_batch chunks after what the KV cache holds (a
    /// prompt at depth, as llama-bench's `-d` runs it), only the last token's logits
    /// computed. Returns the elapsed nanoseconds.
    pub fn time_prompt_after(&mut self, tokens: &[u32]) -> Result<u64, RefError> {
        self.check_tokens(tokens)?;
        self.check_room(tokens.len())?;
        let t0 = Instant::now();
        for chunk in tokens.chunks(self.n_batch) {
            self.decode_chunk(chunk, false)?;
        }
        // SAFETY: ctx is valid.
        unsafe { sys::llama_synchronize(self.ctx.as_ptr()) };
        Ok(t0.elapsed().as_nanos() as u64)
    }

    /// Benchmark: `n` single-token decodes continuing at the current position, the first
    /// with token `first` and each following one with the argmax of the previous logits.
    /// Returns the nanoseconds spent in decoding only (the argmax is not timed).
    pub fn time_generate(&mut self, first: u32, n: usize) -> Result<u64, RefError> {
        self.check_token(first)?;
        self.check_room(n)?;
        let mut tok = first;
        let mut total = 0u64;
        for i in 0..n {
            let t0 = Instant::now();
            self.decode_chunk(&[tok], false)?;
            // SAFETY: ctx is valid.
            unsafe { sys::llama_synchronize(self.ctx.as_ptr()) };
            total += t0.elapsed().as_nanos() as u64;
            if i + 1 < n {
                tok = argmax(self.logits_row(-1)?) as u32;
            }
        }
        Ok(total)
    }

    /// Formats a chat with the model's built-in template via
    /// `llama_chat_apply_template` (which supports a fixed list of well-known templates,
    /// not arbitrary Jinja). `messages` are `(role, content)` pairs; `add_assistant`
    /// appends the prefix of an assistant turn.
    pub fn apply_chat_template(
        &self,
        messages: &[(String, String)],
        add_assistant: bool,
    ) -> Result<String, RefError> {
        // SAFETY: model is valid; a null name asks for the default template.
        let tmpl = unsafe { sys::llama_model_chat_template(self.model.as_ptr(), std::ptr::null()) };
        if tmpl.is_null() {
            return Err(RefError::Template(
                "the model has no built-in chat template".into(),
            ));
        }
        let mut owned = Vec::with_capacity(messages.len());
        for (role, content) in messages {
            let r = CString::new(role.as_str())
                .map_err(|_| RefError::Template("role contains a NUL byte".into()))?;
            let c = CString::new(content.as_str())
                .map_err(|_| RefError::Template("content contains a NUL byte".into()))?;
            owned.push((r, c));
        }
        let msgs: Vec<sys::llama_chat_message> = owned
            .iter()
            .map(|(r, c)| sys::llama_chat_message {
                role: r.as_ptr(),
                content: c.as_ptr(),
            })
            .collect();
        let total: usize = messages.iter().map(|(r, c)| r.len() + c.len()).sum();
        let bytes = with_buffer(2 * total + 256, |buf, len| {
            // SAFETY: tmpl is a NUL-terminated string owned by the model; msgs point to
            // CStrings alive for the call; buf has len bytes.
            unsafe {
                sys::llama_chat_apply_template(
                    tmpl,
                    msgs.as_ptr(),
                    msgs.len(),
                    add_assistant,
                    buf,
                    len,
                )
            }
        })
        .map_err(|_| {
            // SAFETY: tmpl is non-null and NUL-terminated.
            let t = unsafe { CStr::from_ptr(tmpl) }.to_string_lossy();
            let head: String = t.chars().take(80).collect();
            RefError::Template(format!(
                "template not supported by llama_chat_apply_template: {head:?}..."
            ))
        })?;
        String::from_utf8(bytes)
            .map_err(|_| RefError::Template("formatted chat is not valid UTF-8".into()))
    }

    /// A GGUF metadata value rendered as a string (scalars only; arrays are not
    /// supported by llama.cpp's API), or `None` if the key is absent.
    pub fn meta(&self, key: &str) -> Option<String> {
        let ckey = CString::new(key).ok()?;
        let mut buf = vec![0u8; 256];
        for _ in 0..2 {
            // SAFETY: ckey is NUL-terminated; buf has buf.len() bytes; model is valid.
            let n = unsafe {
                sys::llama_model_meta_val_str(
                    self.model.as_ptr(),
                    ckey.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if n < buf.len() {
                buf.truncate(n);
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            buf.resize(n + 1, 0);
        }
        None
    }
}

/// Convenience: [`RefModel::load`] with default options.
pub fn load_default(path: &Path) -> Result<RefModel, RefError> {
    RefModel::load(path, &RefOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_first_max_wins_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn missing_file_is_an_error() {
        let e = RefModel::load(Path::new("/nonexistent/model.gguf"), &RefOptions::default());
        assert!(e.is_err());
    }

    /// ggml's kernels and ours agree on the same bytes (to float summation order), and
    /// the wrapper rejects rows of the wrong size instead of letting C read past them.
    #[test]
    fn ggml_kernel_matches_quant() {
        use quant::GgmlType as T;
        let n = 512;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let y: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 30.0)
            .collect();
        for ty in [T::Q4_0, T::Q4_1, T::Q5_0, T::Q8_0, T::Q4_K, T::Q6_K] {
            let g = GgmlKernel::new(ty).unwrap();
            let at = quant::vec_dot_type(ty);
            assert_eq!(g.vec_dot_type(), at, "{ty}");
            let mut w = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            quant::quantize_row(ty, &x, &mut w).unwrap();
            let mut a = vec![0u8; at.row_bytes(n as u64).unwrap() as usize];
            g.quantize_activations(&y, &mut a).unwrap();
            let ours = quant::vec_dot(ty, n, &w, &a).unwrap();
            let theirs = g.vec_dot(n, &w, &a).unwrap();
            assert!(
                (ours - theirs).abs() <= 1e-3 * ours.abs().max(1.0),
                "{ty}: {ours} vs {theirs}"
            );
            assert!(g.vec_dot(n, &w[1..], &a).is_err());
            assert!(g.vec_dot(n, &w, &a[1..]).is_err());
            assert!(g.vec_dot(n + 1, &w, &a).is_err());
            assert!(g.quantize_activations(&y[1..], &mut a).is_err());
        }
        assert!(
            GgmlKernel::new(T::Q8_K).is_err(),
            "Q8_K is an activation type only"
        );
    }
}
