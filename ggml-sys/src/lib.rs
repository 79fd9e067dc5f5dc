//! ggml, loaded at run time.
//!
//! `build.rs` builds ggml from the llama.cpp source of the `llama-cpp-sys-2` package as
//! shared libraries with run-time backend modules (`libggml-base.so`, `libggml.so`,
//! `libggml-cpu.so`, and `libggml-vulkan.so` / `-cuda` / `-sycl` where asked for), and
//! bindgen writes bindings that resolve every ggml function from those libraries with
//! `dlopen` (`sys::GgmlLib`). Nothing links ggml at build time: a binary runs where the
//! libraries are missing (it says so), and it never collides with the statically linked
//! llama.cpp of the reference engine (`rbench --features llamacpp`), whose symbols stay
//! its own (RTLD_LOCAL).
//!
//! [`Ggml::open`] loads the core libraries from one directory; [`Ggml::load_backends`]
//! loads each backend module found there through ggml's own loader, keeping ggml's reason
//! when it refuses one (wrong backend API version, missing driver library), and lists the
//! devices each backend found.

use std::ffi::{c_char, CStr};
#[cfg(ggml_built)]
use std::ffi::{c_void, CString};
use std::fmt;
use std::path::{Path, PathBuf};
#[cfg(ggml_built)]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(ggml_built)]
use std::sync::Mutex;
use std::sync::OnceLock;

#[cfg(ggml_built)]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all,
    clippy::pedantic
)]
pub mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub mod rpc;

/// The device backends a user may have a library for.
pub const GPU_BACKENDS: [&str; 3] = ["cuda", "vulkan", "sycl"];

/// The ggml version these bindings were built from, when ggml was built.
pub fn version() -> Option<&'static str> {
    option_env!("GGML_SYS_VERSION")
}

/// The backend API version every backend module must report (`GGML_BACKEND_API_VERSION`).
pub fn backend_api() -> Option<i32> {
    option_env!("GGML_SYS_BACKEND_API").and_then(|v| v.parse().ok())
}

/// Where the build put the libraries (inside cargo's OUT_DIR), when ggml was built.
pub fn build_lib_dir() -> Option<&'static str> {
    option_env!("GGML_SYS_LIB_DIR")
}

/// Why ggml cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    /// This binary was built without ggml (cmake, libclang or the source was missing).
    NotBuilt(String),
    /// No directory holds `libggml.so`.
    NotFound { searched: Vec<PathBuf> },
    /// `libggml.so` (or `libggml-base.so`) is there but does not load.
    Load { path: PathBuf, reason: String },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::NotBuilt(why) => write!(f, "this binary was built without ggml: {why}"),
            OpenError::NotFound { searched } => {
                write!(f, "no libggml.so found (searched ")?;
                for (i, p) in searched.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, p.display())?;
                }
                write!(
                    f,
                    "; set RLLAMA_GGML_DIR to the directory holding ggml's libraries)"
                )
            }
            OpenError::Load { path, reason } => write!(f, "{}: {reason}", path.display()),
        }
    }
}

impl std::error::Error for OpenError {}

/// The kind of a ggml device (`ggml_backend_dev_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accelerator,
    Other(u32),
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::IntegratedGpu => "igpu",
            DeviceKind::Accelerator => "accel",
            DeviceKind::Other(_) => "other",
        }
    }
}

/// One device of a loaded backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// ggml's device name (`CPU`, `Vulkan0`, `CUDA0`).
    pub name: String,
    pub description: String,
    pub kind: DeviceKind,
    pub memory_free: u64,
    pub memory_total: u64,
}

/// What became of one backend module file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendLoad {
    pub file: PathBuf,
    /// The backend's name as its file says (`cpu`, `vulkan`).
    pub backend: String,
    pub outcome: Result<LoadedBackend, String>,
}

/// A backend ggml accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedBackend {
    /// ggml's registry name (`CPU`, `Vulkan`).
    pub name: String,
    pub devices: Vec<DeviceInfo>,
}

/// The core ggml libraries of one directory, loaded.
pub struct Ggml {
    dir: PathBuf,
    #[cfg(ggml_built)]
    lib: sys::GgmlLib,
    #[cfg(ggml_built)]
    _base: libloading::Library,
    backends: OnceLock<Vec<BackendLoad>>,
}

impl fmt::Debug for Ggml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ggml").field("dir", &self.dir).finish()
    }
}

static LIB_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// A directory to search before the others (the runtime passes `RLLAMA_GGML_DIR`; this
/// crate reads no environment): set before ggml is first opened.
pub fn set_lib_dir(dir: PathBuf) {
    let _ = LIB_DIR.set(dir);
}

/// The directories searched for ggml's libraries, in order: the one [`set_lib_dir`]
/// gave (`RLLAMA_GGML_DIR`), `ggml/` beside the running binary (where the build copies
/// them), the build's own output.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = LIB_DIR.get() {
        dirs.push(d.clone());
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(parent) = exe.parent() {
            dirs.push(parent.join("ggml"));
            // Test and example binaries live one level down (target/<profile>/deps).
            if let Some(up) = parent.parent() {
                dirs.push(up.join("ggml"));
            }
        }
    }
    if let Some(d) = build_lib_dir() {
        dirs.push(PathBuf::from(d));
    }
    dirs
}

/// ggml's log lines, captured while a backend library loads (ggml prints its loader's
/// reasons there rather than returning them).
#[cfg(ggml_built)]
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether [`LOG`] collects: only around `ggml_backend_load`. At other times warnings and
/// errors go to stderr as they come (a device's own error, such as a CUDA kernel fault
/// just before ggml aborts the process, is the only account of it there is), and debug
/// and info lines are dropped (ggml-cuda logs one per CUDA graph capture, which a
/// long-running server must not keep).
#[cfg(ggml_built)]
static CAPTURING: AtomicBool = AtomicBool::new(false);

/// Whether the last line that was not a continuation went to stderr (its continuation
/// lines follow it).
#[cfg(ggml_built)]
static SHOWING: AtomicBool = AtomicBool::new(false);

/// What the log callback does with a line of `level` outside a capture: shown or not
/// (a continuation as the line it continues).
#[cfg(ggml_built)]
fn shown(level: u32, previous_shown: bool) -> bool {
    match level {
        3 | 4 => true,       // GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
        5 => previous_shown, // GGML_LOG_LEVEL_CONT
        _ => false,
    }
}

#[cfg(ggml_built)]
extern "C" {
    fn _exit(status: i32) -> !;
}

/// Where ggml stops the process (`GGML_ABORT`, for errors its API cannot return): said in
/// words, instead of ggml's own message and the debugger backtrace it starts. Its RPC
/// client has no error path for a server lost mid-run (killed, restarted, the network
/// gone), so such a loss ends the process with status 1 and says what was lost and what
/// to do; anything else is a defect, and ggml's `abort()` follows as usual.
#[cfg(ggml_built)]
unsafe extern "C" fn on_abort(message: *const c_char) {
    use std::io::Write;
    let m = if message.is_null() {
        String::new()
    } else {
        CStr::from_ptr(message).to_string_lossy().into_owned()
    };
    let mut err = std::io::stderr().lock();
    if m.contains("RPC") || m.contains("rpc") {
        let _ = writeln!(
            err,
            "error: an RPC server of the offloaded layers was lost ({m}). ggml's RPC client \
             cannot go on without it, so this process stops: the work in flight is lost. \
             Restart it once the server is back."
        );
        let _ = err.flush();
        _exit(1);
    }
    let _ = writeln!(err, "error: ggml stopped the process: {m}");
    let _ = err.flush();
}

#[cfg(ggml_built)]
unsafe extern "C" fn capture_log(
    level: sys::ggml_log_level,
    text: *const c_char,
    _ud: *mut c_void,
) {
    if text.is_null() {
        return;
    }
    let line = CStr::from_ptr(text).to_string_lossy().into_owned();
    if CAPTURING.load(Ordering::Acquire) {
        if let Ok(mut log) = LOG.lock() {
            log.push(line);
        }
        return;
    }
    // bindgen gives ggml_log_level as u32 on Linux (i32 where C enums are signed).
    #[allow(clippy::unnecessary_cast)]
    let level = level as u32;
    let show = shown(level, SHOWING.load(Ordering::Relaxed));
    if level != 5 {
        SHOWING.store(show, Ordering::Relaxed);
    }
    if show {
        // ggml's lines carry their own newline; a continuation carries on the line before.
        if level == 5 {
            eprint!("{line}");
        } else {
            eprint!("ggml: {line}");
        }
    }
}

impl Ggml {
    /// The first directory of [`search_dirs`] that holds `libggml.so`, loaded once per
    /// process (ggml's backend registry is global).
    pub fn global() -> Result<&'static Ggml, OpenError> {
        static GLOBAL: OnceLock<Result<Ggml, OpenError>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let dirs = search_dirs();
                match dirs.iter().find(|d| d.join("libggml.so").is_file()) {
                    Some(d) => Ggml::open(d),
                    None => Err(match option_env!("GGML_SYS_MISSING") {
                        Some(why) => OpenError::NotBuilt(why.to_string()),
                        None => OpenError::NotFound { searched: dirs },
                    }),
                }
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Loads `libggml-base.so` and `libggml.so` from `dir`.
    pub fn open(dir: &Path) -> Result<Ggml, OpenError> {
        #[cfg(not(ggml_built))]
        {
            let _ = dir;
            Err(OpenError::NotBuilt(
                option_env!("GGML_SYS_MISSING")
                    .unwrap_or("unknown reason")
                    .to_string(),
            ))
        }
        #[cfg(ggml_built)]
        {
            let core = dir.join("libggml.so");
            if !core.is_file() {
                return Err(OpenError::NotFound {
                    searched: vec![dir.to_path_buf()],
                });
            }
            // Base first, by path, so libggml.so's need for it is met whatever the
            // library search path says.
            let base_path = dir.join("libggml-base.so");
            // SAFETY: loading ggml's base library runs its (trivial) initialisers only.
            let base =
                unsafe { libloading::Library::new(&base_path) }.map_err(|e| OpenError::Load {
                    path: base_path.clone(),
                    reason: e.to_string(),
                })?;
            // SAFETY: as above; symbols are resolved lazily through the returned table.
            let lib = unsafe { sys::GgmlLib::new(&core) }.map_err(|e| OpenError::Load {
                path: core.clone(),
                reason: e.to_string(),
            })?;
            // SAFETY: ggml_log_set only stores the callback; ours is thread-safe.
            unsafe { lib.ggml_log_set(Some(capture_log), std::ptr::null_mut()) };
            // SAFETY: ggml_set_abort_callback only stores the callback.
            unsafe { lib.ggml_set_abort_callback(Some(on_abort)) };
            Ok(Ggml {
                dir: dir.to_path_buf(),
                lib,
                _base: base,
                backends: OnceLock::new(),
            })
        }
    }

    /// The directory the libraries were loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The raw function table.
    #[cfg(ggml_built)]
    pub fn raw(&self) -> &sys::GgmlLib {
        &self.lib
    }

    /// ggml's version as the loaded library reports it.
    pub fn loaded_version(&self) -> String {
        #[cfg(ggml_built)]
        {
            // SAFETY: ggml_version returns NULL or a static string.
            let v = unsafe { cstr(self.lib.ggml_version()) };
            if !v.is_empty() {
                return v;
            }
        }
        "unknown".to_string()
    }

    /// Loads every backend module in the directory (`libggml-<name>*.so` other than the
    /// core libraries; of several CPU variants the one that scores best on this CPU), once
    /// per `Ggml`, and returns what became of each.
    pub fn load_backends(&self) -> &[BackendLoad] {
        self.backends.get_or_init(|| self.load_backends_now())
    }

    fn load_backends_now(&self) -> Vec<BackendLoad> {
        let mut files: Vec<(String, PathBuf)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(backend) = backend_of_file(&name) {
                    files.push((backend, e.path()));
                }
            }
        }
        files.sort();
        let files = best_variants(files);
        files
            .into_iter()
            .map(|(backend, file)| {
                let outcome = self.load_one(&file);
                BackendLoad {
                    file,
                    backend,
                    outcome,
                }
            })
            .collect()
    }

    #[cfg(not(ggml_built))]
    fn load_one(&self, _file: &Path) -> Result<LoadedBackend, String> {
        Err("ggml not built".into())
    }

    #[cfg(ggml_built)]
    fn load_one(&self, file: &Path) -> Result<LoadedBackend, String> {
        let c = CString::new(file.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        if let Ok(mut log) = LOG.lock() {
            log.clear();
        }
        CAPTURING.store(true, Ordering::Release);
        // SAFETY: ggml_backend_load takes a NUL-terminated path and returns NULL on failure.
        let reg = unsafe { self.lib.ggml_backend_load(c.as_ptr()) };
        CAPTURING.store(false, Ordering::Release);
        let log = LOG
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default();
        if reg.is_null() {
            return Err(refusal_reason(&log));
        }
        // SAFETY: reg is a live registry entry; names are static strings owned by ggml.
        let name = unsafe { cstr(self.lib.ggml_backend_reg_name(reg)) };
        let n = unsafe { self.lib.ggml_backend_reg_dev_count(reg) };
        let devices = (0..n)
            // SAFETY: i < dev_count; the device outlives the registry entry.
            .map(|i| self.device_info(unsafe { self.lib.ggml_backend_reg_dev_get(reg, i) }))
            .collect();
        Ok(LoadedBackend { name, devices })
    }

    /// What ggml says of one device.
    #[cfg(ggml_built)]
    fn device_info(&self, dev: sys::ggml_backend_dev_t) -> DeviceInfo {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: dev is valid; the out-pointers point at locals.
        unsafe { self.lib.ggml_backend_dev_memory(dev, &mut free, &mut total) };
        let kind = match unsafe { self.lib.ggml_backend_dev_type(dev) } {
            sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
            sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
            sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
            sys::ggml_backend_dev_type_GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accelerator,
            other => DeviceKind::Other(other),
        };
        DeviceInfo {
            // SAFETY: dev is valid; its strings are owned by ggml.
            name: unsafe { cstr(self.lib.ggml_backend_dev_name(dev)) },
            description: unsafe { cstr(self.lib.ggml_backend_dev_description(dev)) },
            kind,
            memory_free: free as u64,
            memory_total: total as u64,
        }
    }

    /// A function the RPC backend module exports through its registry entry.
    #[cfg(ggml_built)]
    fn rpc_proc(&self, name: &str) -> Result<*mut c_void, String> {
        let _ = self.load_backends();
        let rpc = CString::new("RPC").unwrap();
        // SAFETY: a NUL-terminated name; NULL when no such backend is registered.
        let reg = unsafe { self.lib.ggml_backend_reg_by_name(rpc.as_ptr()) };
        if reg.is_null() {
            return Err(format!(
                "this ggml ({}) has no RPC backend (libggml-rpc.so)",
                self.dir.display()
            ));
        }
        let c = CString::new(name).unwrap();
        // SAFETY: reg is live; the name is NUL-terminated.
        let f = unsafe { self.lib.ggml_backend_reg_get_proc_address(reg, c.as_ptr()) };
        if f.is_null() {
            return Err(format!("ggml's RPC backend does not export {name}"));
        }
        Ok(f)
    }

    /// Registers a ggml RPC server's devices (named `RPC0`, `RPC1`, ... in the order
    /// servers are added; described by their endpoint) and returns them. The endpoint is
    /// checked first ([`rpc::check_endpoint`]): ggml aborts the process on a server it
    /// cannot reach. Adding one endpoint twice returns its devices again.
    #[cfg(ggml_built)]
    pub fn add_rpc_server(
        &self,
        endpoint: &str,
        allow_public: bool,
    ) -> Result<Vec<DeviceInfo>, String> {
        static ADDED: Mutex<Vec<(String, Vec<DeviceInfo>)>> = Mutex::new(Vec::new());
        let mut added = ADDED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = added.iter().find(|(e, _)| e == endpoint) {
            return Ok(d.clone());
        }
        rpc::check_endpoint(endpoint, allow_public, std::time::Duration::from_secs(10))?;
        let f = self.rpc_proc("ggml_backend_rpc_add_server")?;
        // SAFETY: ggml_backend_rpc_add_server has this signature (ggml-rpc.h).
        let add: unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t =
            unsafe { std::mem::transmute(f) };
        let c = CString::new(endpoint).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated endpoint, checked reachable above.
        let reg = unsafe { add(c.as_ptr()) };
        if reg.is_null() {
            return Err(format!("RPC server {endpoint:?} reports no device"));
        }
        // SAFETY: reg is the live registry entry ggml made for this endpoint; registering
        // it makes its devices visible to ggml_backend_dev_by_name and friends.
        unsafe { self.lib.ggml_backend_register(reg) };
        let n = unsafe { self.lib.ggml_backend_reg_dev_count(reg) };
        let devices: Vec<DeviceInfo> = (0..n)
            // SAFETY: i < dev_count.
            .map(|i| self.device_info(unsafe { self.lib.ggml_backend_reg_dev_get(reg, i) }))
            .collect();
        added.push((endpoint.to_string(), devices.clone()));
        Ok(devices)
    }

    /// Serves `devices` (ggml device names; e.g. `CPU`) to ggml RPC clients on `endpoint`
    /// (`HOST:PORT`), with `threads` for a CPU device and `cache_dir` for tensors clients
    /// send by hash. Returns only when the server could not start (ggml prints why).
    #[cfg(ggml_built)]
    pub fn rpc_serve(
        &self,
        endpoint: &str,
        cache_dir: Option<&Path>,
        threads: usize,
        devices: &[String],
    ) -> Result<(), String> {
        let _ = self.load_backends();
        let mut devs = Vec::with_capacity(devices.len());
        for d in devices {
            let c = CString::new(d.as_str()).map_err(|e| e.to_string())?;
            // SAFETY: a NUL-terminated name; NULL when there is no such device.
            let dev = unsafe { self.lib.ggml_backend_dev_by_name(c.as_ptr()) };
            if dev.is_null() {
                return Err(format!("no ggml device {d:?} (rllama devices lists them)"));
            }
            devs.push(dev);
        }
        let f = self.rpc_proc("ggml_backend_rpc_start_server")?;
        // SAFETY: ggml_backend_rpc_start_server has this signature (ggml-rpc.h).
        let start: unsafe extern "C" fn(
            *const c_char,
            *const c_char,
            usize,
            usize,
            *mut sys::ggml_backend_dev_t,
        ) = unsafe { std::mem::transmute(f) };
        let ep = CString::new(endpoint).map_err(|e| e.to_string())?;
        let cache = cache_dir
            .map(|p| CString::new(p.as_os_str().as_encoded_bytes()))
            .transpose()
            .map_err(|e| e.to_string())?;
        // SAFETY: NUL-terminated strings and a device array that outlive the call.
        unsafe {
            start(
                ep.as_ptr(),
                cache.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                threads,
                devs.len(),
                devs.as_mut_ptr(),
            )
        };
        Err(format!(
            "the RPC server on {endpoint} stopped (could it bind there? ggml printed why above)"
        ))
    }
}

/// A C string owned by ggml as a `String` (empty for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// For tests that need ggml: true when it loads; otherwise prints why and returns false
/// (the test skips), unless the build required ggml (`GGML_SYS_REQUIRED=1`, as CI sets
/// it), where a missing ggml fails.
pub fn available_or_skip() -> bool {
    match Ggml::global() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                option_env!("GGML_SYS_REQUIRED") != Some("1"),
                "GGML_SYS_REQUIRED=1 but ggml is not available: {e}"
            );
            eprintln!("SKIPPED: no ggml: {e}");
            false
        }
    }
}

/// `libggml-vulkan.so` -> `vulkan`; `libggml-cpu-haswell.so` -> `cpu`; the core libraries
/// (`libggml.so`, `libggml-base.so*`) and versioned links -> None.
pub fn backend_of_file(name: &str) -> Option<String> {
    let stem = name.strip_prefix("libggml-")?.strip_suffix(".so")?;
    if stem.starts_with("base") || stem.is_empty() {
        return None;
    }
    Some(stem.split('-').next().unwrap_or(stem).to_string())
}

/// Several variants of one backend (`libggml-cpu-haswell.so`, `libggml-cpu-zen4.so`): keep
/// the one ggml's score rates highest on this machine (a variant the CPU cannot run scores
/// 0), as ggml's own loader does. Backends with one file pass through.
fn best_variants(files: Vec<(String, PathBuf)>) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = Vec::new();
    for (backend, file) in files {
        if let Some(prev) = out.iter_mut().find(|(b, _)| *b == backend) {
            if score(&file) > score(&prev.1) {
                prev.1 = file;
            }
        } else {
            out.push((backend, file));
        }
    }
    out
}

/// `ggml_backend_score()` of a module (1 when it exports none, as ggml assumes).
fn score(file: &Path) -> i32 {
    // SAFETY: loading a backend module runs its initialisers, as ggml's loader does.
    let Ok(lib) = (unsafe { libloading::Library::new(file) }) else {
        return -1;
    };
    // SAFETY: ggml_backend_score has this signature in every backend module.
    match unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"ggml_backend_score\0") } {
        Ok(f) => unsafe { f() },
        Err(_) => 1,
    }
}

/// Turns ggml's loader log into one reason naming what is wrong. The API version check is
/// the one ggml makes on every module: a module built from another ggml release reports
/// another `GGML_BACKEND_API_VERSION` and is refused with both numbers.
pub fn refusal_reason(log: &[String]) -> String {
    let text = log.concat();
    if let Some(i) = text.find("incompatible API version (backend: ") {
        let rest = &text[i + "incompatible API version (backend: ".len()..];
        let theirs: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let ours = backend_api()
            .map(|v| v.to_string())
            .unwrap_or_else(|| "?".into());
        return format!(
            "built for another ggml: backend API version {theirs}, this build's ggml {} uses {ours}",
            version().unwrap_or("?")
        );
    }
    if let Some(i) = text.find("failed to load ") {
        let line = text[i..].lines().next().unwrap_or("");
        // "failed to load PATH: libcuda.so.1: cannot open shared object file ..."
        let why = line.split_once(": ").map_or(line, |x| x.1);
        return format!("does not load: {why} (a driver or runtime library is missing)");
    }
    if text.contains("not supported on this system") || text.contains("score") {
        return "not supported on this system".into();
    }
    let text = text.trim();
    if text.is_empty() {
        "ggml refused it without a reason".into()
    } else {
        text.replace('\n', "; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(ggml_built)]
    #[test]
    fn warnings_and_errors_reach_stderr_debug_and_info_do_not() {
        assert!(shown(3, false) && shown(4, false));
        assert!(!shown(1, true) && !shown(2, true) && !shown(0, true));
        // A continuation follows the line it continues.
        assert!(shown(5, true));
        assert!(!shown(5, false));
    }

    #[test]
    fn backend_names_from_files() {
        assert_eq!(backend_of_file("libggml-cpu.so").as_deref(), Some("cpu"));
        assert_eq!(
            backend_of_file("libggml-cpu-haswell.so").as_deref(),
            Some("cpu")
        );
        assert_eq!(
            backend_of_file("libggml-vulkan.so").as_deref(),
            Some("vulkan")
        );
        assert_eq!(backend_of_file("libggml.so"), None);
        assert_eq!(backend_of_file("libggml-base.so"), None);
        assert_eq!(backend_of_file("libggml-base.so.0"), None);
        assert_eq!(backend_of_file("libggml.so.0.26.0"), None);
        assert_eq!(backend_of_file("libfoo.so"), None);
    }

    #[test]
    fn refusal_reasons_name_the_versions_and_the_missing_library() {
        let r = refusal_reason(&[
            "ggml_backend_load: failed to initialize backend from /x/libggml-vulkan.so: incompatible API version (backend: 2, current: 3)\n".into(),
        ]);
        assert!(r.contains("backend API version 2"), "{r}");
        assert!(
            r.contains(&format!(
                "uses {}",
                backend_api().map(|v| v.to_string()).unwrap_or("?".into())
            )),
            "{r}"
        );
        let r = refusal_reason(&[
            "ggml_backend_load: failed to load /x/libggml-cuda.so: libcuda.so.1: cannot open shared object file: No such file or directory\n".into(),
        ]);
        assert!(r.starts_with("does not load: libcuda.so.1"), "{r}");
        assert_eq!(refusal_reason(&[]), "ggml refused it without a reason");
    }

    #[cfg(ggml_built)]
    #[test]
    fn the_built_cpu_backend_loads_and_lists_a_cpu_device() {
        let g = Ggml::global().expect("ggml built but not found");
        assert_eq!(g.loaded_version(), version().unwrap());
        let loads = g.load_backends();
        let cpu = loads
            .iter()
            .find(|l| l.backend == "cpu")
            .expect("no cpu module");
        let b = cpu.outcome.as_ref().expect("cpu backend refused");
        assert_eq!(b.name, "CPU");
        assert_eq!(b.devices.len(), 1);
        assert_eq!(b.devices[0].kind, DeviceKind::Cpu);
        assert!(b.devices[0].memory_total > 0);
    }
}
