//! Unit tests on tiny vocabularies written as GGUF files.

use super::*;
use crate::gguf::{writer, Value};

fn open(meta: Vec<(&str, Value)>) -> (tempfile::TempPath, GgufFile) {
    let meta: Vec<(String, Value)> = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let bytes = writer::to_bytes(&meta, &[]);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &bytes).unwrap();
    let path = f.into_temp_path();
    let g = GgufFile::open(&path).unwrap();
    (path, g)
}

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

/// A SentencePiece vocabulary: <unk> <s> </s> <start_of_turn> byte tokens, pieces.
fn tiny_spm(add_space_prefix: Option<bool>) -> Tokenizer {
    let mut tokens = vec!["<unk>", "<s>", "</s>", "<start_of_turn>"];
    let mut types = vec![2, 3, 3, 3];
    let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    for b in &bytes {
        tokens.push(b);
        types.push(6);
    }
    let pieces = ["▁", "h", "i", "▁h", "▁hi", "hi", "é", "\n"];
    for p in pieces {
        tokens.push(p);
        types.push(1);
    }
    let mut scores = vec![0.0f32; tokens.len()];
    let base = 4 + 256;
    // Longer pieces score higher.
    for (i, p) in pieces.iter().enumerate() {
        scores[base + i] = -10.0 + p.chars().count() as f32;
    }
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(scores))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
    ];
    if let Some(v) = add_space_prefix {
        meta.push(("tokenizer.ggml.add_space_prefix", Value::Bool(v)));
    }
    let (_p, g) = open(meta);
    Tokenizer::from_gguf(&g).unwrap()
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_id(s).unwrap_or_else(|| panic!("no token {s:?}"))
}

#[test]
fn spm_encode_decode() {
    let t = tiny_spm(None);
    assert_eq!(t.kind(), "spm");
    assert_eq!((t.bos(), t.eos(), t.unk()), (Some(1), Some(2), Some(0)));
    assert!(t.add_bos() && !t.add_eos());
    // A space is prefixed: "▁hi".
    assert_eq!(t.encode("hi", true, false), [1, id(&t, "▁hi")]);
    // Unknown characters fall back to bytes; "é" is a piece.
    assert_eq!(
        t.encode("hé!", false, false),
        [id(&t, "▁h"), id(&t, "é"), id(&t, "<0x21>")]
    );
    // Special tokens only with parse_special; a space is prefixed after them too.
    assert_eq!(
        t.encode("<start_of_turn>hi", false, true),
        [3, id(&t, "▁hi")]
    );
    assert!(t.encode("<start_of_turn>", false, false).len() > 1);
    assert_eq!(t.encode("", true, true), [1]);
    assert_eq!(t.encode("", false, true), Vec::<u32>::new());
    // The prefixed space is removed again, unless the text starts with BOS.
    let ids = t.encode("hi hi", false, false);
    assert_eq!(t.decode(&ids, true), "hi hi");
    let ids = t.encode("hi hi", true, false);
    assert_eq!(t.decode(&ids, true), " hi hi");
    assert_eq!(t.decode(&ids, false), "<s> hi hi");
    assert_eq!(t.token_to_piece(id(&t, "<0x0A>"), false), b"\n");
    assert_eq!(t.token_to_piece(1, false), b"");
    assert_eq!(t.token_to_piece(1, true), b"<s>");
    assert_eq!(t.token_to_piece(id(&t, "▁hi"), false), b" hi");
    assert!(t.is_eog(2) && !t.is_eog(1));
    assert!(t.is_control(3));
}

#[test]
fn spm_without_space_prefix() {
    let t = tiny_spm(Some(false));
    assert_eq!(t.encode("hi", false, false), [id(&t, "hi")]);
    assert_eq!(t.encode(" hi", false, false), [id(&t, "▁hi")]);
    assert_eq!(t.decode(&t.encode(" hi", false, false), true), " hi");
}

#[test]
fn stream_decoder_holds_back_partial_utf8() {
    let t = tiny_spm(Some(false));
    // "€" = E2 82 AC written as three byte tokens.
    let ids = t.encode("h€h", false, false);
    assert_eq!(ids.len(), 5);
    let mut d = StreamDecoder::new(&t, true);
    let parts: Vec<String> = ids.iter().map(|&i| d.push(i)).collect();
    assert_eq!(parts, ["h", "", "", "€", "h"]);
    assert_eq!(d.finish(), "");
    // A sequence that never completes becomes U+FFFD, as in decode().
    let ids = [id(&t, "<0xE2>"), id(&t, "<0x82>")];
    let mut d = StreamDecoder::new(&t, true);
    let mut s: String = ids.iter().map(|&i| d.push(i)).collect();
    s += &d.finish();
    assert_eq!(s, t.decode(&ids, true));
    assert_eq!(s, "\u{FFFD}");
}

/// A byte-level BPE vocabulary with the merges needed for "hello world".
fn tiny_bpe(
    pre: Option<&str>,
    extra_meta: Vec<(&'static str, Value)>,
) -> Result<Tokenizer, TokenizerError> {
    let mut tokens: Vec<String> = unicode::BYTE_TO_CHAR
        .iter()
        .map(|c| c.to_string())
        .collect();
    let merged = [
        "he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld",
    ];
    tokens.extend(merged.iter().map(|s| s.to_string()));
    tokens.push("<|endoftext|>".into());
    tokens.push("<|im_start|>".into());
    let mut types = vec![1; tokens.len()];
    let n = types.len();
    types[n - 2] = 3;
    types[n - 1] = 3;
    let merges = [
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
    ];
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges", strings(&merges)),
        ("tokenizer.ggml.eos_token_id", Value::U32(n as u32 - 2)),
    ];
    if let Some(p) = pre {
        meta.push(("tokenizer.ggml.pre", Value::String(p.into())));
    }
    meta.extend(extra_meta);
    let (_p, g) = open(meta);
    Tokenizer::from_gguf(&g)
}

#[test]
fn bpe_encode_decode() {
    let t = tiny_bpe(Some("qwen2"), vec![]).unwrap();
    assert_eq!(t.kind(), "bpe");
    let ids = t.encode("hello world", false, false);
    assert_eq!(ids, [id(&t, "hello"), id(&t, "Ġworld")]);
    assert_eq!(t.decode(&ids, false), "hello world");
    let eot = id(&t, "<|endoftext|>");
    assert!(t.is_eog(eot) && t.eos() == Some(eot));
    let ims = id(&t, "<|im_start|>");
    assert_eq!(
        t.encode("<|im_start|>hello", false, true),
        [ims, id(&t, "hello")]
    );
    assert_eq!(t.encode("<|im_start|>", false, false).len(), 12);
    // Unmerged bytes.
    assert_eq!(
        t.encode("\n", false, false),
        [u32::from(b'\n')].map(|b| { id(&t, &unicode::BYTE_TO_CHAR[b as usize].to_string()) })
    );
    assert_eq!(
        t.decode(&t.encode("héllo\n\n", false, false), false),
        "héllo\n\n"
    );
    // Default BPE special ids are 11 when the metadata has no BOS.
    assert_eq!(t.bos(), Some(11));
    assert!(!t.add_bos());
}

#[test]
fn bpe_llama3_adds_bos_and_cleans_spaces() {
    let t = tiny_bpe(
        Some("llama-bpe"),
        vec![("tokenizer.ggml.bos_token_id", Value::U32(5))],
    )
    .unwrap();
    assert!(t.add_bos());
    assert_eq!(t.encode("hello", true, false), [5, id(&t, "hello")]);
    let ids = t.encode("hello , world 's", false, false);
    assert_eq!(t.decode(&ids, false), "hello, world's");
    // Streaming gives the same text.
    let mut d = StreamDecoder::new(&t, false);
    let mut s: String = ids.iter().map(|&i| d.push(i)).collect();
    s += &d.finish();
    assert_eq!(s, "hello, world's");
}

#[test]
fn unsupported_models_are_refused() {
    let e = tiny_bpe(Some("no-such-pre"), vec![]).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Unsupported(m) if m.contains("no-such-pre")),
        "{e}"
    );
    let (_p, g) = open(vec![
        ("tokenizer.ggml.model", Value::String("bert".into())),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Unsupported(m) if m.contains("bert")),
        "{e}"
    );
    let (_p, g) = open(vec![("general.architecture", Value::String("x".into()))]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Missing(k) if k == "tokenizer.ggml.model"),
        "{e}"
    );
    let (_p, g) = open(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.merges"), "{e}");
}

#[test]
fn clean_up_spaces_matches_llama_cpp() {
    let clean = |s: &str| {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    };
    assert_eq!(clean("a , b . c ? d !"), "a, b. c? d!");
    assert_eq!(clean("it ' s"), "it's");
    assert_eq!(
        clean("I 'm we 're they 've it 's"),
        "I'm we're they've it's"
    );
    assert_eq!(clean("don 't we 'll I 'd"), "don 't we 'll I 'd");
    assert_eq!(clean(" ' ' '"), "'' '");
    assert_eq!(clean(""), "");
}

#[test]
fn take_utf8_keeps_incomplete_tail() {
    assert_eq!(take_utf8(b"ab\xE2\x82", false), ("ab".to_string(), 2));
    assert_eq!(
        take_utf8(b"ab\xE2\x82", true),
        ("ab\u{FFFD}".to_string(), 4)
    );
    assert_eq!(take_utf8(b"\xFFa", false), ("\u{FFFD}a".to_string(), 2));
}

#[test]
fn stream_decoder_matches_decode_on_random_ids() {
    use rand::{Rng, SeedableRng};
    // llama-bpe cleans up spaces, which the stream decoder has to reproduce piece by piece.
    let t = tiny_bpe(Some("llama-bpe"), vec![]).unwrap();
    assert!(t.clean_spaces);
    let byte = |b: u8| id(&t, &unicode::BYTE_TO_CHAR[b as usize].to_string());
    let mut pool: Vec<u32> = b" '.,?!smrevltdaxy\n".iter().map(|&b| byte(b)).collect();
    // The bytes of "é" and "😀", to split characters across tokens, and a stray byte.
    pool.extend([0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80, 0xFF].map(byte));
    pool.extend([id(&t, "hello"), id(&t, "Ġworld"), id(&t, "<|endoftext|>")]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..40 {
        let n = if round % 4 == 0 {
            3000
        } else {
            rng.gen_range(0..60)
        };
        let ids: Vec<u32> = (0..n).map(|_| pool[rng.gen_range(0..pool.len())]).collect();
        for skip in [false, true] {
            let mut d = StreamDecoder::new(&t, skip);
            let mut s: String = ids.iter().map(|&i| d.push(i)).collect();
            // What is held back stays bounded.
            assert!(d.raw.len() < 600, "{} bytes pending", d.raw.len());
            s += &d.finish();
            assert_eq!(s, t.decode(&ids, skip), "round {round}, skip {skip}");
        }
    }
}
