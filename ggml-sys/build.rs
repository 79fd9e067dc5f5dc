//! Builds ggml as shared libraries with its backends as run-time modules
//! (`GGML_BACKEND_DL`), from the llama.cpp source that the `llama-cpp-sys-2` package ships
//! (the version our llama.cpp reference links, so both sides run the same ggml), and
//! generates bindings that load those libraries with `dlopen` at run time.
//!
//! The default build has the CPU backend only (one AVX2 variant on x86, so it runs on any
//! machine our binaries run on) and needs no GPU toolkit. `RLLAMA_GGML_BACKENDS=vulkan`
//! (or `cuda`, `sycl`, comma-separated) adds device backends; each becomes
//! `libggml-<name>.so` beside the others and is found at run time, so one binary serves
//! machines with and without a GPU.
//!
//! Where cmake, libclang or the source is missing the crate still builds, without ggml:
//! `ggml_sys::Ggml::open` then says why, and `rllama devices` reports "CPU only" with that
//! reason. `GGML_SYS_REQUIRED=1` (set by `.ci/run`) turns that into a build failure.
//!
//! The libraries are also copied to `<target>/<profile>/ggml/`, next to the binaries, so
//! `target/release/{rllama,rserve,rbench}` plus `target/release/ggml/` can be carried to
//! another machine together.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The llama-cpp-sys-2 release whose llama.cpp tree we build ggml from: the workspace pins
/// the same one for the reference (`llamacpp-ref`).
const LLAMA_SYS: &str = "llama-cpp-sys-2-0.1.161";

fn main() {
    println!("cargo:rerun-if-env-changed=GGML_SRC");
    println!("cargo:rerun-if-env-changed=RLLAMA_GGML_BACKENDS");
    println!("cargo:rerun-if-env-changed=GGML_SYS_REQUIRED");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(ggml_built)");
    let required = env::var("GGML_SYS_REQUIRED").is_ok_and(|v| v == "1");
    match build() {
        Ok(()) => {
            println!("cargo:rustc-cfg=ggml_built");
            // DEP_GGML_DL_BUILT for dependents (runtime compiles its graph code on it).
            println!("cargo:built=1");
        }
        Err(why) => {
            if required {
                panic!("ggml-sys: {why}");
            }
            println!("cargo:warning=ggml-sys: built without ggml: {why}");
            println!("cargo:rustc-env=GGML_SYS_MISSING={why}");
        }
    }
}

fn build() -> Result<(), String> {
    let src = find_source()?;
    let ggml = src.join("ggml");
    which("cmake").ok_or("cmake not found (install cmake to build ggml)")?;
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();

    // One cmake build serves every cargo build of this checkout (the main target, the lab's
    // portable target, the fuzz targets): the libraries are loaded with dlopen, so nothing
    // in them depends on RUSTFLAGS or the cargo profile, and rebuilding ggml per target dir
    // cost CI minutes on two cores.
    let backends = env::var("RLLAMA_GGML_BACKENDS").unwrap_or_default();
    let defines = extra_defines();
    let build_dir = cache_dir(&src, &target_arch, &backends, &defines)?;
    fs::create_dir_all(&build_dir).map_err(|e| format!("{}: {e}", build_dir.display()))?;
    let lock = fs::File::create(build_dir.join(".lock"))
        .map_err(|e| format!("{}: {e}", build_dir.display()))?;
    lock.lock()
        .map_err(|e| format!("lock {}: {e}", build_dir.display()))?;

    let mut cfg = cmake::Config::new(&src);
    cfg.out_dir(&build_dir)
        // The cc crate's flags follow the cargo profile (-g, -O0 in a debug build); cmake's
        // Release flags alone keep the build the same for every profile.
        .no_default_flags(true)
        .profile("Release")
        .build_target("ggml")
        .define("BUILD_SHARED_LIBS", "ON")
        .define("GGML_BACKEND_DL", "ON")
        .define("GGML_CPU", "ON")
        // The RPC backend (a module like the others): layers on other machines' ggml
        // devices (`--rpc`), and the server side (`rllama rpc-server`).
        .define("GGML_RPC", "ON")
        // GGML_NATIVE cannot be combined with GGML_BACKEND_DL: one explicit variant.
        .define("GGML_NATIVE", "OFF")
        .define("GGML_CCACHE", "OFF")
        .define("GGML_BUILD_TESTS", "OFF")
        .define("GGML_BUILD_EXAMPLES", "OFF")
        .define("LLAMA_BUILD_TESTS", "OFF")
        .define("LLAMA_BUILD_EXAMPLES", "OFF")
        .define("LLAMA_BUILD_TOOLS", "OFF")
        .define("LLAMA_BUILD_SERVER", "OFF")
        .define("LLAMA_BUILD_COMMON", "OFF")
        .define("LLAMA_BUILD_APP", "OFF")
        .define("LLAMA_CURL", "OFF")
        // Libraries find each other beside themselves wherever they are copied.
        .define("CMAKE_BUILD_RPATH_USE_ORIGIN", "ON");
    if target_arch == "x86_64" {
        for f in ["SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"] {
            cfg.define(format!("GGML_{f}"), "ON");
        }
    }
    for b in backends.split(',').map(str::trim).filter(|b| !b.is_empty()) {
        match b {
            "vulkan" => cfg.define("GGML_VULKAN", "ON"),
            "cuda" => cfg.define("GGML_CUDA", "ON"),
            "sycl" => cfg.define("GGML_SYCL", "ON"),
            other => {
                return Err(format!(
                    "RLLAMA_GGML_BACKENDS: unknown backend {other:?} (vulkan, cuda, sycl)"
                ))
            }
        };
    }
    // Extra cmake definitions, `K=V` separated by `;` (a newer Vulkan_INCLUDE_DIR than the
    // system's, CMAKE_CUDA_ARCHITECTURES on a GPU machine).
    for kv in &defines {
        let (k, v) = kv
            .split_once('=')
            .ok_or(format!("GGML_SYS_CMAKE_DEFINES: {kv:?} is not K=V"))?;
        cfg.define(k.trim(), v.trim());
    }
    // A failed cmake panics inside the cmake crate; turn that into our own error.
    let dst = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || cfg.build()))
        .map_err(|_| "cmake failed to build ggml (see the build output above)".to_string())?;
    let bin = dst.join("build").join("bin");
    drop(lock);

    let lib = out.join("lib");
    let _ = fs::remove_dir_all(&lib);
    fs::create_dir_all(&lib).map_err(|e| e.to_string())?;
    copy_libs(&bin, &lib)?;
    // Beside the binaries too: target/<profile>/ggml (OUT_DIR is
    // target/<profile>/build/ggml-sys-<hash>/out).
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let beside = profile_dir.join("ggml");
        let _ = fs::remove_dir_all(&beside);
        if fs::create_dir_all(&beside).is_ok() {
            copy_libs(&bin, &beside)?;
        }
    }
    println!("cargo:rustc-env=GGML_SYS_LIB_DIR={}", lib.display());
    println!("cargo:lib_dir={}", lib.display());

    let (version, api) = versions(&ggml)?;
    println!("cargo:rustc-env=GGML_SYS_VERSION={version}");
    println!("cargo:rustc-env=GGML_SYS_RPC_PROTO={}", rpc_proto(&ggml)?);
    println!("cargo:rustc-env=GGML_SYS_BACKEND_API={api}");
    println!("cargo:rustc-env=GGML_SYS_SOURCE={}", src.display());

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_arg(format!("-I{}", ggml.join("include").display()))
        .allowlist_function("ggml_.*")
        .allowlist_function("gguf_.*")
        .allowlist_type("ggml_.*")
        .allowlist_var("GGML_.*")
        .dynamic_library_name("GgmlLib")
        .dynamic_link_require_all(false)
        .layout_tests(false)
        .generate()
        .map_err(|e| format!("bindgen over ggml's headers failed (is libclang installed?): {e}"))?;
    bindings
        .write_to_file(out.join("bindings.rs"))
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn extra_defines() -> Vec<String> {
    println!("cargo:rerun-if-env-changed=GGML_SYS_CMAKE_DEFINES");
    env::var("GGML_SYS_CMAKE_DEFINES")
        .unwrap_or_default()
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Where ggml is built: `$GGML_SYS_CACHE`, else `target/ggml-cache/<key>` at the workspace
/// root, keyed by what changes the build (source tree, architecture, backends, extra
/// cmake definitions).
fn cache_dir(
    src: &Path,
    arch: &str,
    backends: &str,
    defines: &[String],
) -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    println!("cargo:rerun-if-env-changed=GGML_SYS_CACHE");
    let root = match env::var_os("GGML_SYS_CACHE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?)
            .join("..")
            .join("target")
            .join("ggml-cache"),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    ("v1", src, arch, backends, defines).hash(&mut h);
    Ok(root.join(format!("{arch}-{:016x}", h.finish())))
}

/// The llama.cpp tree: `$GGML_SRC`, else the llama-cpp-sys-2 package in cargo's registry
/// sources (present once the workspace's dependencies have been fetched).
fn find_source() -> Result<PathBuf, String> {
    if let Ok(s) = env::var("GGML_SRC") {
        let p = PathBuf::from(s);
        return if p.join("ggml/CMakeLists.txt").is_file() {
            Ok(p)
        } else {
            Err(format!(
                "GGML_SRC={} has no ggml/CMakeLists.txt",
                p.display()
            ))
        };
    }
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registry = home.join("registry").join("src");
    if let Ok(dirs) = fs::read_dir(&registry) {
        for d in dirs.flatten() {
            let p = d.path().join(LLAMA_SYS).join("llama.cpp");
            if p.join("ggml/CMakeLists.txt").is_file() {
                println!(
                    "cargo:rerun-if-changed={}",
                    p.join("ggml/CMakeLists.txt").display()
                );
                return Ok(p);
            }
        }
    }
    Err(format!(
        "the llama.cpp source of {LLAMA_SYS} is not in {} (`cargo fetch` at the workspace \
         root brings it, or set GGML_SRC to a llama.cpp tree)",
        registry.display()
    ))
}

fn copy_libs(from: &Path, to: &Path) -> Result<(), String> {
    let entries = fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("libggml") && name.contains(".so") {
            let dst = to.join(&name);
            // Keep the version links as links (libggml.so -> libggml.so.0 -> ...0.26.0).
            match fs::read_link(e.path()) {
                Ok(link) => std::os::unix::fs::symlink(&link, &dst),
                Err(_) => fs::copy(e.path(), &dst).map(|_| ()),
            }
            .map_err(|err| format!("copy {name}: {err}"))?;
            n += 1;
        }
    }
    if n == 0 {
        return Err(format!("no ggml libraries in {}", from.display()));
    }
    Ok(())
}

/// ggml's version (from its CMakeLists) and the backend API version every backend module
/// must report (`GGML_BACKEND_API_VERSION` in ggml-backend-impl.h).
fn versions(ggml: &Path) -> Result<(String, i32), String> {
    let cm = fs::read_to_string(ggml.join("CMakeLists.txt")).map_err(|e| e.to_string())?;
    let part = |key: &str| {
        cm.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("set({key} ")))
            .and_then(|r| r.trim_end_matches(')').trim().parse::<u32>().ok())
            .ok_or(format!("{key} not found in ggml's CMakeLists.txt"))
    };
    let version = format!(
        "{}.{}.{}",
        part("GGML_VERSION_MAJOR")?,
        part("GGML_VERSION_MINOR")?,
        part("GGML_VERSION_PATCH")?
    );
    let imp =
        fs::read_to_string(ggml.join("src/ggml-backend-impl.h")).map_err(|e| e.to_string())?;
    let api = imp
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define GGML_BACKEND_API_VERSION"))
        .and_then(|v| v.trim().parse::<i32>().ok())
        .ok_or("GGML_BACKEND_API_VERSION not found")?;
    Ok((version, api))
}

/// `RPC_PROTO_{MAJOR,MINOR,PATCH}_VERSION` from ggml-rpc.h, as `M.m.p`.
fn rpc_proto(ggml: &Path) -> Result<String, String> {
    let h = fs::read_to_string(ggml.join("include/ggml-rpc.h")).map_err(|e| e.to_string())?;
    let part = |key: &str| {
        h.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("#define {key}")))
            .and_then(|v| v.trim().parse::<u8>().ok())
            .ok_or(format!("{key} not found in ggml-rpc.h"))
    };
    Ok(format!(
        "{}.{}.{}",
        part("RPC_PROTO_MAJOR_VERSION")?,
        part("RPC_PROTO_MINOR_VERSION")?,
        part("RPC_PROTO_PATCH_VERSION")?
    ))
}

fn which(cmd: &str) -> Option<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
