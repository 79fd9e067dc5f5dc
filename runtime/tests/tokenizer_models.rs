//! Tokenizers of the real models: load, round trips, streaming, special tokens, errors.
//! (Exact agreement with llama.cpp is checked in `tokenizer_vs_llamacpp.rs`.)

mod common;

use std::time::Instant;

use runtime::gguf::{writer, Array, GgufFile, Value};
use runtime::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

fn corpus() -> Vec<String> {
    serde_json::from_str(include_str!("../../testdata/tokenizer/corpus.json"))
        .expect("corpus.json is a JSON array of strings")
}

fn load(name: &str) -> Option<Tokenizer> {
    let path = common::model(name)?;
    let f = GgufFile::open(&path).expect("open model");
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let dt = t0.elapsed();
    eprintln!(
        "{name}: {} tokenizer, {} tokens, {} merges, built in {dt:?}",
        tok.kind(),
        tok.n_vocab(),
        tok.n_merges()
    );
    // Generous bound: debug builds are much slower than release (well under 1 s there).
    assert!(dt.as_secs_f64() < 20.0, "{name}: from_gguf took {dt:?}");
    Some(tok)
}

fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> (String, Vec<String>) {
    let mut d = StreamDecoder::new(tok, skip_special);
    let parts: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
    let mut s: String = parts.concat();
    s += &d.finish();
    (s, parts)
}

#[test]
fn model_metadata() {
    if let Some(t) = load("smollm2-135m") {
        assert_eq!(t.kind(), "bpe");
        assert_eq!(t.pre(), Some("smollm"));
        assert_eq!(t.n_vocab(), 49152);
        assert!(!t.add_bos());
        assert_eq!(t.eos(), Some(2));
        assert!(t.is_eog(2));
        let eot = t.token_id("<|endoftext|>").unwrap();
        assert!(t.is_eog(eot) && t.is_control(eot));
    }
    if let Some(t) = load("qwen2.5-coder-0.5b") {
        assert_eq!(t.kind(), "bpe");
        assert_eq!(t.pre(), Some("qwen2"));
        assert!(!t.add_bos());
        for s in ["<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|file_sep|>"] {
            let id = t.token_id(s).unwrap();
            assert!(t.is_eog(id), "{s} ends generation");
        }
        let start = t.token_id("<|im_start|>").unwrap();
        assert!(!t.is_eog(start) && t.is_control(start));
        let ids = t.encode("<|im_start|>user\nhi<|im_end|>", true, true);
        assert_eq!(ids.first(), Some(&start));
        assert_eq!(t.token_text(*ids.last().unwrap()), "<|im_end|>");
        // Without parse_special the markers are plain text.
        let plain = t.encode("<|im_start|>", false, false);
        assert!(plain.len() > 1 && !plain.contains(&start));
    }
    if let Some(t) = load("gemma3-270m") {
        assert_eq!(t.kind(), "spm");
        assert_eq!(t.n_vocab(), 262144);
        assert!(t.add_bos() && !t.add_eos());
        assert_eq!(t.bos(), Some(2));
        assert_eq!(t.eos(), Some(1));
        let eot = t.token_id("<end_of_turn>").unwrap();
        assert!(t.is_eog(eot) && t.is_eog(1));
        let ids = t.encode("<start_of_turn>user\nhi<end_of_turn>", true, true);
        assert_eq!(ids[0], 2);
        assert_eq!(t.token_text(ids[1]), "<start_of_turn>");
        assert_eq!(*ids.last().unwrap(), eot);
        assert_eq!(
            t.token_to_piece(t.token_id("<0x0A>").unwrap(), false),
            b"\n"
        );
    }
}

#[test]
fn round_trips() {
    let corpus = corpus();
    for name in common::MODELS {
        let Some(t) = load(name) else { continue };
        let mut bad = 0;
        for text in &corpus {
            let ids = t.encode(text, false, false);
            let back = t.decode(&ids, false);
            // Neither model prefixes a space (gemma3 has add_space_prefix = false), and
            // neither cleans up spaces, so every text comes back unchanged.
            if &back != text {
                bad += 1;
                eprintln!("{name}: {text:?} -> {ids:?} -> {back:?}");
            }
            // Skipping special tokens changes nothing when there are none.
            let ids_bos = t.encode(text, true, false);
            assert_eq!(t.decode(&ids_bos, true), back, "{name}: {text:?}");
        }
        assert_eq!(bad, 0, "{name}: {bad} round-trip failures");
    }
}

/// Found by the tokenizer fuzz target: smollm2's vocabulary has no byte token for some
/// control characters (0x13 among them), so encoding drops them, exactly as llama.cpp does
/// (`tokenizer_vs_llamacpp.rs` compares ids on such strings). `encodes_losslessly` names
/// that case; everywhere else the round trip holds.
#[test]
fn bytes_without_a_token_are_dropped_and_named() {
    let crash = "\0\0\0\u{13}🏽 nkotni se";
    for name in common::MODELS {
        let Some(t) = load(name) else { continue };
        let ids = t.encode(crash, false, false);
        let back = t.decode(&ids, false);
        assert_eq!(
            back == crash,
            t.encodes_losslessly(crash),
            "{name}: {back:?}"
        );
        for text in corpus() {
            assert!(t.encodes_losslessly(&text), "{name}: {text:?}");
        }
    }
    if let Some(t) = load("gemma3-270m") {
        // SentencePiece's space marker typed literally comes back as a space.
        assert!(!t.encodes_losslessly("a▁b"));
        assert_eq!(t.decode(&t.encode("a▁b", false, false), false), "a b");
    }
    let Some(t) = load("smollm2-135m") else {
        return;
    };
    assert!(!t.encodes_losslessly("a\u{13}b"));
    assert_eq!(t.decode(&t.encode("a\u{13}b", false, false), false), "ab");
}

#[test]
fn stream_decoder_matches_decode() {
    let texts = [
        "Emoji 👨‍👩‍👧‍👦 and flags 🇺🇸🇯🇵 split across byte tokens: 🦀🧬🪐 𒀀𒀁 \u{F0000}\u{10FFFD}",
        "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
        "नमस्ते दुनिया مرحبا بالعالم e\u{301}",
        "<|im_start|>user\n😀<|im_end|><start_of_turn>model\n🙂<end_of_turn>",
    ];
    for name in common::MODELS {
        let Some(t) = load(name) else { continue };
        let mut held_back = 0;
        for text in texts {
            for (parse, skip) in [(false, false), (true, false), (true, true)] {
                let ids = t.encode(text, true, parse);
                let (s, parts) = stream(&t, &ids, skip);
                assert_eq!(s, t.decode(&ids, skip), "{name}: {text:?}");
                // A token whose bytes end inside a character yields nothing yet.
                held_back += ids
                    .iter()
                    .zip(&parts)
                    .filter(|(&id, p)| p.is_empty() && !t.token_to_piece(id, !skip).is_empty())
                    .count();
            }
            if !text.contains('<') {
                assert_eq!(t.decode(&t.encode(text, false, false), false), text);
            }
        }
        eprintln!("{name}: {held_back} tokens held back by the stream decoder");
        assert!(held_back > 0, "{name}: expected some split UTF-8 sequences");
    }
}

fn write_gguf(meta: Vec<(&str, Value)>) -> (tempfile::TempPath, GgufFile) {
    let meta: Vec<(String, Value)> = meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let bytes = writer::to_bytes(&meta, &[]);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, &bytes).unwrap();
    let path = f.into_temp_path();
    let g = GgufFile::open(&path).unwrap();
    (path, g)
}

#[test]
fn unknown_tokenizer_is_an_error() {
    let tokens = Value::Array(Array::String(vec!["a".into(), "b".into()]));
    let (_p, g) = write_gguf(vec![
        ("general.architecture", Value::String("test".into())),
        ("tokenizer.ggml.model", Value::String("t5".into())),
        ("tokenizer.ggml.tokens", tokens.clone()),
    ]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Unsupported(m) if m.contains("`t5`")),
        "{e}"
    );
    assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");

    let (_p, g) = write_gguf(vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("mystery-pre".into())),
        ("tokenizer.ggml.tokens", tokens.clone()),
        (
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["a b".into()])),
        ),
    ]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Unsupported(m) if m.contains("mystery-pre")),
        "{e}"
    );

    let (_p, g) = write_gguf(vec![(
        "tokenizer.ggml.model",
        Value::String("llama".into()),
    )]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Missing(k) if k == "tokenizer.ggml.tokens"),
        "{e}"
    );

    let (_p, g) = write_gguf(vec![
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", tokens),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0]))),
    ]);
    let e = Tokenizer::from_gguf(&g).unwrap_err();
    assert!(
        matches!(&e, TokenizerError::Invalid(m) if m.contains("tokenizer.ggml.scores")),
        "{e}"
    );
}

#[test]
fn encode_throughput() {
    let text: String = corpus().join("\n").repeat(20);
    for name in common::MODELS {
        let Some(t) = load(name) else { continue };
        let t0 = Instant::now();
        let ids = t.encode(&text, true, true);
        let enc = t0.elapsed();
        let t0 = Instant::now();
        let back = t.decode(&ids, false);
        let dec = t0.elapsed();
        eprintln!(
            "{name}: {} KiB -> {} tokens: encode {enc:?} ({:.1} MiB/s), decode {dec:?}",
            text.len() / 1024,
            ids.len(),
            text.len() as f64 / enc.as_secs_f64() / (1 << 20) as f64
        );
        assert!(enc.as_secs_f64() < 30.0 && dec.as_secs_f64() < 30.0);
        assert!(!back.is_empty());
    }
}

/// The real models' chat templates stay well inside the render budget (fuel, output cap)
/// on a long conversation: 200 turns of 2 KiB each, with a system prompt.
#[test]
fn real_chat_templates_render_long_conversations() {
    use runtime::chat::{ChatMessage, ChatTemplate};
    for name in common::MODELS {
        let Some(path) = common::model(name) else {
            continue;
        };
        let f = GgufFile::open(&path).expect("open model");
        let t = ChatTemplate::from_gguf(&f);
        let body = "token ".repeat(340);
        let mut msgs = vec![ChatMessage::new("system", "Be brief.")];
        msgs.extend(
            (0..200)
                .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, &body)),
        );
        let s = t
            .render(&msgs, true)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(s.len() > 200 * body.len(), "{name}");
    }
}
