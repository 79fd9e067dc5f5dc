//! A whole GGUF image: header, metadata, tensor table, then everything that reads it
//! when a model loads (config, tokenizer, chat template, model) and the dequantization of
//! every tensor, and a short forward pass of any model that loads. Anything may fail with an error; nothing may panic, hang or allocate
//! without bound.

use std::sync::Arc;

use runtime::chat::{ChatMessage, ChatTemplate};
use runtime::gguf::GgufFile;
use runtime::model::Model;
use runtime::runner::Runner;
use runtime::tokenizer::Tokenizer;

/// One input: the body of the `gguf` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    for (k, v) in &f.metadata {
        let _ = (k.len(), v.to_string(), v.to_json());
    }
    let _ = (
        f.architecture(),
        f.file_type_name(),
        f.n_params(),
        f.tensor_bytes(),
    );
    let _ = runtime::model::arch::declare(&f, None);
    if let Ok(t) = Tokenizer::from_gguf(&f) {
        let ids = t.encode("Hello <|im_start|> wörld 🦀\n", true, true);
        let _ = t.decode(&ids, false);
        let _ = t.detokenize(&[0, 1, 2, u32::MAX], false, true);
    }
    let _ = ChatTemplate::from_gguf(&f).render(&[ChatMessage::new("user", "hi")], true);
    for t in &f.tensors {
        if !quant::is_supported(t.ty) {
            continue;
        }
        let data = f.tensor_data(t);
        let row_len = t.row_len() as usize;
        let row_bytes = data.len() / t.n_rows().max(1) as usize;
        let mut out = vec![0f32; row_len];
        for row in data.chunks_exact(row_bytes.max(1)) {
            quant::dequantize_row(t.ty, row, &mut out).expect("a parsed row dequantizes");
        }
    }
    // A model that loads must also run: two tokens through the forward pass.
    if let Ok(m) = Model::from_gguf(Arc::new(f)) {
        let n_vocab = m.config.n_vocab as u32;
        let mut r = Runner::new(Arc::new(m), 1, 8);
        let _ = r.feed(&[0, 1 % n_vocab], false);
    }
}
