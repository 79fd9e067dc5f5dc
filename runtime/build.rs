//! `cfg(ggml)` where ggml-sys built ggml (it can build without it when cmake or libclang
//! is missing): the offload graph code needs ggml's function table.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(ggml)");
    println!("cargo:rerun-if-env-changed=DEP_GGML_DL_BUILT");
    if std::env::var_os("DEP_GGML_DL_BUILT").is_some() {
        println!("cargo:rustc-cfg=ggml");
    }
}
