//! Tokenize and detokenize arbitrary text with the real vocabularies (byte-level BPE and
//! SentencePiece). Promises checked: no panic; without special-token parsing the text
//! comes back byte for byte wherever the vocabulary has a token for every character
//! (`encodes_losslessly`; bytes without one are dropped, as llama.cpp does); streaming decode equals whole decode; ids never leave the
//! vocabulary.

use super::vocabs;
use runtime::tokenizer::StreamDecoder;

/// One input: the body of the `tokenizer` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let v = &vocabs()[sel as usize % 3];
    let t = &v.tokenizer;
    let text = String::from_utf8_lossy(rest);
    let add_special = sel & 0x10 != 0;
    let parse_special = sel & 0x20 != 0;
    let ids = t.encode(&text, add_special, parse_special);
    assert!(
        ids.iter().all(|&id| (id as usize) < t.n_vocab()),
        "{}",
        v.name
    );
    if !parse_special && t.encodes_losslessly(&text) {
        let plain = t.encode(&text, false, false);
        let back = t.detokenize(&plain, false, false);
        assert_eq!(back, text.as_bytes(), "{}: round trip of {text:?}", v.name);
    }
    let skip = sel & 0x40 != 0;
    let whole = t.decode(&ids, skip);
    let mut s = StreamDecoder::new(t, skip);
    let mut streamed: String = ids.iter().map(|&id| s.push(id)).collect();
    streamed.push_str(&s.finish());
    assert_eq!(streamed, whole, "{}: streaming decode of {text:?}", v.name);
    // Arbitrary ids (including out-of-range ones) decode to something, never a panic.
    let raw: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) % (t.n_vocab() as u32 + 8))
        .collect();
    let _ = t.detokenize(&raw, sel & 1 != 0, sel & 2 != 0);
}
