//! libFuzzer entry of the `openai_request` target: the body is `rllama_fuzz::openai_request::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::openai_request::run(data));
