//! libFuzzer entry of the `json_schema` target: the body is `rllama_fuzz::json_schema::run`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| rllama_fuzz::json_schema::run(data));
