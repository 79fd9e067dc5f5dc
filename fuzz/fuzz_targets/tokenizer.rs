//! libFuzzer entry of the `tokenizer` target: the body is `rllama_fuzz::tokenizer::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::tokenizer::run(data));
