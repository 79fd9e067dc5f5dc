//! libFuzzer entry of the `sharegpt` target: the body is `rllama_fuzz::sharegpt::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::sharegpt::run(data));
