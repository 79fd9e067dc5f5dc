//! libFuzzer entry of the `gguf` target: the body is `rllama_fuzz::gguf::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::gguf::run(data));
