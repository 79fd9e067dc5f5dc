//! The fuzz targets' bodies (one module each; `fuzz_targets/*.rs` only hands libFuzzer's
//! input to `<target>::run`) and their shared pieces: the real models' tokenizers and chat
//! templates, loaded once per process. `server/tests/fuzz_replay.rs` compiles this file
//! into the workspace's tests too and replays the seeds through every target.
//!
//! The models come from the registry cache (`$RLLAMA_MODELS`, else the user cache);
//! `tools/fuzz.sh` fetches them before it starts any target.

use std::sync::OnceLock;

use runtime::chat::ChatTemplate;
use runtime::gguf::GgufFile;
use runtime::tokenizer::Tokenizer;

pub mod chat_template;
pub mod gguf;
pub mod json_schema;
pub mod openai_request;
pub mod sharegpt;
pub mod tokenizer;

/// A target's body: one input.
pub type Target = fn(&[u8]);

/// Every target, by the name `fuzz/Cargo.toml` gives its binary.
pub const TARGETS: [(&str, Target); 6] = [
    ("gguf", gguf::run),
    ("tokenizer", tokenizer::run),
    ("chat_template", chat_template::run),
    ("sharegpt", sharegpt::run),
    ("openai_request", openai_request::run),
    ("json_schema", json_schema::run),
];

/// The three registry models: byte-level BPE (smollm2, qwen2.5) and SentencePiece (gemma3).
pub const MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"];

pub struct Vocab {
    pub name: &'static str,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

fn load(name: &'static str) -> Vocab {
    let path = runtime::registry::resolve(name)
        .unwrap_or_else(|e| panic!("fuzz setup: cannot get model {name}: {e}"));
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("fuzz setup: {e}"));
    Vocab {
        name,
        tokenizer: Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("fuzz setup: {e}")),
        template: ChatTemplate::from_gguf(&f),
    }
}

/// The tokenizer and template of every registry model.
pub fn vocabs() -> &'static [Vocab] {
    static V: OnceLock<Vec<Vocab>> = OnceLock::new();
    V.get_or_init(|| MODELS.iter().map(|&n| load(n)).collect())
}

/// Splits fuzz input into at most `n` fields on 0xff bytes (which never occur in UTF-8),
/// each turned into a string lossily.
pub fn fields(data: &[u8], n: usize) -> Vec<String> {
    data.splitn(n, |&b| b == 0xff)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect()
}
