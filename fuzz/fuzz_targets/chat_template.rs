//! libFuzzer entry of the `chat_template` target: the body is `rllama_fuzz::chat_template::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::chat_template::run(data));
