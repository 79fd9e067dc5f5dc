//! Records which x86 CPU features the llama.cpp of this build was compiled for, so that a
//! binary copied to a CPU without them refuses to run llama.cpp with a message instead of
//! dying of SIGILL (our own code is portable; the reference is built for the machine it
//! benchmarks, as a native llama-bench is).
//!
//! llama-cpp-sys-2 builds llama.cpp with GGML_NATIVE (every feature of the build machine)
//! when the first `target-cpu=` in the rustflags is `native`, and otherwise for the target
//! features rustc is given. This mirrors that choice.

use std::env;

/// The features the runtime check knows; rustc's names.
const KNOWN: &[&str] = &[
    "sse3",
    "ssse3",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx512f",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512vnni",
    "avx512vbmi",
    "avx512bf16",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_CHAT").is_some() {
        chat_render();
    }
    let target_arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let first_cpu = env::var("CARGO_ENCODED_RUSTFLAGS").ok().and_then(|f| {
        f.split('\x1f')
            .find(|f| f.contains("target-cpu="))
            .and_then(|f| f.split("target-cpu=").nth(1))
            .map(str::to_string)
    });
    let host_is_target = env::var("HOST").ok() == env::var("TARGET").ok();
    let mut features: Vec<&str> = Vec::new();
    if target_arch == "x86_64" {
        if first_cpu.as_deref() == Some("native") && host_is_target {
            features = host_features();
        } else {
            let enabled = env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
            let enabled: Vec<&str> = enabled.split(',').collect();
            features = KNOWN
                .iter()
                .copied()
                .filter(|f| enabled.contains(f))
                .collect();
        }
    }
    println!(
        "cargo:rustc-env=LLAMACPP_BUILD_CPU_FEATURES={}",
        features.join(",")
    );
    println!(
        "cargo:rustc-env=LLAMACPP_BUILD_NATIVE={}",
        u8::from(first_cpu.as_deref() == Some("native"))
    );
}

#[cfg(target_arch = "x86_64")]
fn host_features() -> Vec<&'static str> {
    use std::arch::is_x86_feature_detected as has;
    let all = [
        ("sse3", has!("sse3")),
        ("ssse3", has!("ssse3")),
        ("avx", has!("avx")),
        ("avx2", has!("avx2")),
        ("fma", has!("fma")),
        ("f16c", has!("f16c")),
        ("bmi2", has!("bmi2")),
        ("avx512f", has!("avx512f")),
        ("avx512bw", has!("avx512bw")),
        ("avx512dq", has!("avx512dq")),
        ("avx512vl", has!("avx512vl")),
        ("avx512vnni", has!("avx512vnni")),
        ("avx512vbmi", has!("avx512vbmi")),
        ("avx512bf16", has!("avx512bf16")),
    ];
    debug_assert_eq!(all.len(), KNOWN.len());
    all.into_iter()
        .filter(|(_, h)| *h)
        .map(|(n, _)| n)
        .collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn host_features() -> Vec<&'static str> {
    Vec::new()
}

/// Compiles `cpp/chat_render.cpp` (llama.cpp's chat-template rendering behind a C function)
/// against the llama.cpp source llama-cpp-sys-2 built: its cmake cache names the source
/// directory, and its `common` library (the `chat` feature turns on llama-cpp-sys-2's
/// `common`) is linked after ours.
fn chat_render() {
    println!("cargo:rerun-if-changed=cpp/chat_render.cpp");
    let cmake_dir = env::var("DEP_LLAMA_GGML_CMAKE_DIR")
        .expect("llama-cpp-sys-2 reports where it installed ggml (DEP_LLAMA_GGML_CMAKE_DIR)");
    // <out>/lib/cmake -> <out>/build/CMakeCache.txt
    let out = std::path::Path::new(&cmake_dir)
        .parent()
        .and_then(|p| p.parent())
        .expect("<out>/lib/cmake");
    let cache = std::fs::read_to_string(out.join("build/CMakeCache.txt"))
        .expect("llama-cpp-sys-2's CMakeCache.txt");
    let src = cache
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .expect("the llama.cpp source directory in CMakeCache.txt");
    let src = std::path::Path::new(src);
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("cpp/chat_render.cpp")
        .include(src.join("common"))
        .include(src.join("include"))
        .include(src.join("ggml/include"))
        .include(src.join("vendor"))
        .warnings(false)
        .compile("rref_chat_render");
}
