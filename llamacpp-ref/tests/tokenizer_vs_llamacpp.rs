//! Our tokenizers against llama.cpp's on the same GGUF files: token ids for a varied corpus
//! (testdata/tokenizer/corpus.json) plus seeded random strings, every token's piece,
//! detokenization, and the special-token properties.

use llamacpp_ref::{RefModel, RefOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runtime::gguf::{writer, Array, GgufFile, Value};
use runtime::tokenizer::{StreamDecoder, Tokenizer};

fn corpus() -> Vec<String> {
    serde_json::from_str(include_str!("../../testdata/tokenizer/corpus.json"))
        .expect("corpus.json is a JSON array of strings")
}

/// Random strings from pieces that stress the pre-tokenizers and special-token matching.
fn random_cases(n: usize, seed: u64) -> Vec<String> {
    const ATOMS: &[&str] = &[
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\n\n",
        "\u{a0}",
        "\u{3000}",
        "a",
        "Z",
        "é",
        "ß",
        "中",
        "日本",
        "한",
        "ع",
        "न",
        "्",
        "\u{301}",
        "😀",
        // Control characters: byte-level vocabularies lack some of their byte tokens
        // (smollm2 has none for 0x13), and such bytes are dropped, as llama.cpp does.
        "\u{13}",
        "\u{0}",
        "\u{7f}",
        "\u{1b}[0m",
        "👍🏽",
        "\u{200d}",
        "🇯🇵",
        "\u{fe0f}",
        "0",
        "7",
        "42",
        "1234",
        "٣",
        "²",
        "½",
        "'",
        "'s",
        "'T",
        "'re",
        "'LL",
        "\"",
        ".",
        ",",
        "!",
        "?",
        "...",
        "-",
        "_",
        "$",
        "+",
        "<",
        ">",
        "=",
        "|",
        "^",
        "~",
        "`",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        "#",
        "@",
        "%",
        "&",
        "*",
        "/",
        "\\",
        ";",
        ":",
        "the",
        "The",
        "world",
        "don",
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<bos>",
        "<eos>",
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
        "<|",
        "|>",
        "<0x0A>",
        "▁",
        "▁▁",
        "\u{FFFD}",
        "\u{10FFFD}",
        "𒀀",
        "fn",
        "def",
        "    ",
        "\t\t",
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let len = rng.gen_range(1..24);
            (0..len)
                .map(|_| ATOMS[rng.gen_range(0..ATOMS.len())])
                .collect()
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    checks: usize,
    mismatches: usize,
}

impl Tally {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            self.mismatches += 1;
            if self.mismatches <= 20 {
                eprintln!("MISMATCH {}", what());
            }
        }
    }
}

fn compare_model(name: &str) -> Option<(usize, usize)> {
    let path = runtime::registry::test_model(name)?;
    Some(compare_file(name, &path, 300))
}

/// Compares on the model at `path`, with the corpus and `n_random` random strings.
fn compare_file(name: &str, path: &std::path::Path, n_random: usize) -> (usize, usize) {
    let f = GgufFile::open(path).expect("open");
    let ours = Tokenizer::from_gguf(&f).expect("our tokenizer");
    let opts = RefOptions {
        n_ctx: 64,
        n_batch: 64,
        n_ubatch: 64,
        n_threads: 1,
        n_threads_batch: 1,
        ..RefOptions::default()
    };
    let theirs = RefModel::load(path, &opts).expect("llama.cpp");
    let mut t = Tally::default();

    // Vocabulary-wide properties.
    t.check(ours.n_vocab() == theirs.n_vocab(), || {
        format!("{name}: n_vocab {} vs {}", ours.n_vocab(), theirs.n_vocab())
    });
    t.check(ours.bos() == theirs.bos(), || {
        format!("{name}: bos {:?} vs {:?}", ours.bos(), theirs.bos())
    });
    t.check(ours.eos() == theirs.eos(), || {
        format!("{name}: eos {:?} vs {:?}", ours.eos(), theirs.eos())
    });
    t.check(ours.add_bos() == theirs.add_bos(), || {
        format!("{name}: add_bos {} vs {}", ours.add_bos(), theirs.add_bos())
    });
    for id in 0..ours.n_vocab() as u32 {
        t.check(ours.is_eog(id) == theirs.is_eog(id), || {
            format!("{name}: is_eog({id} {:?})", ours.token_text(id))
        });
        for special in [false, true] {
            let (a, b) = (
                ours.token_to_piece(id, special),
                theirs.token_to_piece(id, special),
            );
            t.check(a == b, || {
                format!("{name}: piece({id}, {special}): {a:?} vs {b:?}")
            });
        }
    }

    // Tokenization and detokenization.
    let mut cases = corpus();
    cases.extend(random_cases(n_random, 0x5eed ^ name.len() as u64));
    for text in &cases {
        for (add, parse) in [(true, true), (false, false), (true, false), (false, true)] {
            let a = ours.encode(text, add, parse);
            let b = theirs.tokenize(text, add, parse).expect("llama_tokenize");
            t.check(a == b, || {
                format!("{name}: encode({text:?}, {add}, {parse}):\n  ours   {a:?}\n  theirs {b:?}")
            });
            for (remove, unparse) in [(false, false), (true, false), (false, true), (true, true)] {
                let x = ours.detokenize(&b, remove, unparse);
                let y = theirs
                    .detokenize_bytes(&b, remove, unparse)
                    .expect("llama_detokenize");
                t.check(x == y, || {
                    format!(
                        "{name}: detokenize({b:?}, {remove}, {unparse}): {:?} vs {:?}",
                        String::from_utf8_lossy(&x),
                        String::from_utf8_lossy(&y)
                    )
                });
            }
            // decode() is llama_detokenize(skip, !skip) made text; the stream decoder
            // gives the same text piece by piece.
            for skip in [false, true] {
                let x = ours.decode(&b, skip);
                let y = theirs
                    .detokenize(&b, skip, !skip)
                    .expect("llama_detokenize");
                t.check(x == y, || {
                    format!("{name}: decode({b:?}, {skip}): {x:?} vs {y:?}")
                });
                let mut d = StreamDecoder::new(&ours, skip);
                let mut z: String = b.iter().map(|&id| d.push(id)).collect();
                z += &d.finish();
                t.check(z == y, || {
                    format!("{name}: stream({b:?}, {skip}): {z:?} vs {y:?}")
                });
            }
        }
    }
    eprintln!(
        "{name}: {} cases, {} checks, {} mismatches",
        cases.len(),
        t.checks,
        t.mismatches
    );
    (t.checks, t.mismatches)
}

/// A metadata key and its new value (`None` removes the key).
type Edit<'a> = (&'a str, Option<Value>);

/// A copy of the model at `path` with metadata keys changed.
fn variant(path: &std::path::Path, edits: &[Edit]) -> tempfile::TempPath {
    let f = GgufFile::open(path).expect("open");
    let mut meta: Vec<(String, Value)> = f
        .metadata
        .iter()
        .filter(|(k, _)| !edits.iter().any(|(e, _)| e == k))
        .cloned()
        .collect();
    for (k, v) in edits {
        if let Some(v) = v {
            meta.push((k.to_string(), v.clone()));
        }
    }
    let tensors: Vec<writer::WriteTensor<'_>> = f
        .tensors
        .iter()
        .map(|t| writer::WriteTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: t.ty,
            data: f.tensor_data(t),
        })
        .collect();
    let mut tmp = tempfile::NamedTempFile::new().expect("temp file");
    writer::write(&mut tmp, &meta, &tensors).expect("write variant");
    tmp.into_temp_path()
}

fn s(v: &str) -> Option<Value> {
    Some(Value::String(v.into()))
}

/// The other pre-tokenizers (and flags) on SmolLM2's vocabulary: llama.cpp loads the same
/// file with `tokenizer.ggml.pre` (etc.) rewritten.
#[test]
fn bpe_variants_match_llamacpp() {
    let Some(path) = runtime::registry::test_model("smollm2-135m") else {
        return;
    };
    let pre = "tokenizer.ggml.pre";
    let renamed = {
        let f = GgufFile::open(&path).expect("open");
        let Some(Array::String(mut tokens)) =
            f.get_array("tokenizer.ggml.tokens").unwrap().cloned()
        else {
            panic!("no tokens")
        };
        for (i, t) in ["</s>", "<s>", "<unk>"].iter().enumerate() {
            tokens[4 + i] = t.to_string();
        }
        Value::Array(Array::String(tokens))
    };
    let variants: Vec<(&str, Vec<Edit>)> = vec![
        ("pre absent", vec![(pre, None)]),
        ("default", vec![(pre, s("default"))]),
        ("llama-bpe", vec![(pre, s("llama-bpe"))]),
        ("gpt-2", vec![(pre, s("gpt-2"))]),
        ("starcoder", vec![(pre, s("starcoder"))]),
        ("falcon", vec![(pre, s("falcon"))]),
        ("stablelm2", vec![(pre, s("stablelm2"))]),
        ("laguna", vec![(pre, s("laguna"))]),
        ("chatglm-bpe", vec![(pre, s("chatglm-bpe"))]),
        (
            "space prefix, bos and eos",
            vec![
                ("tokenizer.ggml.add_space_prefix", Some(Value::Bool(true))),
                ("tokenizer.ggml.add_bos_token", Some(Value::Bool(true))),
                ("tokenizer.ggml.add_eos_token", Some(Value::Bool(true))),
            ],
        ),
        (
            // llama.cpp requires these texts for Phi-3: give them to three special tokens.
            "phi-3 rstrip",
            vec![
                ("general.name", s("Phi-3 mini")),
                (pre, s("gpt-2")),
                ("tokenizer.ggml.tokens", Some(renamed)),
            ],
        ),
    ];
    let mut bad = 0;
    for (label, edits) in variants {
        let tmp = variant(&path, &edits);
        let (_, m) = compare_file(&format!("smollm2 [{label}]"), &tmp, 100);
        bad += m;
    }
    assert_eq!(bad, 0, "{bad} mismatches with llama.cpp on BPE variants");
}

/// SentencePiece with the default space prefix and EOS, on Gemma 3's vocabulary.
#[test]
fn spm_variants_match_llamacpp() {
    let Some(path) = runtime::registry::test_model("gemma3-270m") else {
        return;
    };
    let tmp = variant(
        &path,
        &[
            ("tokenizer.ggml.add_space_prefix", None),
            ("tokenizer.ggml.add_eos_token", Some(Value::Bool(true))),
        ],
    );
    let (_, bad) = compare_file("gemma3 [space prefix, eos]", &tmp, 100);
    assert_eq!(bad, 0, "{bad} mismatches with llama.cpp on the SPM variant");
}

#[test]
fn smollm2_matches_llamacpp() {
    if let Some((_, bad)) = compare_model("smollm2-135m") {
        assert_eq!(bad, 0, "smollm2-135m: {bad} mismatches with llama.cpp");
    }
}

#[test]
fn qwen25_coder_matches_llamacpp() {
    if let Some((_, bad)) = compare_model("qwen2.5-coder-0.5b") {
        assert_eq!(
            bad, 0,
            "qwen2.5-coder-0.5b: {bad} mismatches with llama.cpp"
        );
    }
}

#[test]
fn gemma3_matches_llamacpp() {
    if let Some((_, bad)) = compare_model("gemma3-270m") {
        assert_eq!(bad, 0, "gemma3-270m: {bad} mismatches with llama.cpp");
    }
}
