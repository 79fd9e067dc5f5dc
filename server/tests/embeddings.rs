//! `/v1/embeddings` against llama.cpp's own pooled embeddings (`llama_get_embeddings_seq`
//! on a context with `embeddings` on, the same pooling), L2-normalized as llama-server
//! returns them: cosine >= 0.999 for every input, per model and pooling: smollm2 mean,
//! qwen2.5-coder-0.5b last token (as Qwen3-Embedding pools) read from the file's own
//! `pooling_type` (a copy of the file with the key added), gemma3 CLS. The inputs run
//! batched: all of them in one request, beside a generation request.

mod common;

use common::*;
use runtime::gguf::{GgufFile, Value as GVal};
use serde_json::{json, Value};

const TEXTS: [&str; 6] = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "fn main() { println!(\"hello\"); }",
    "Embeddings map text to vectors so that similar texts lie close together.",
    "零点五",
    "a",
];

/// A copy of `src` with `{arch}.pooling_type` set to `pooling`.
fn with_pooling(src: &std::path::Path, dir: &std::path::Path, pooling: u32) -> std::path::PathBuf {
    let f = GgufFile::open(src).unwrap();
    let arch = match f.get_str("general.architecture").unwrap() {
        Some(a) => a.to_string(),
        None => panic!("no architecture"),
    };
    let mut meta = f.metadata.clone();
    meta.push((format!("{arch}.pooling_type"), GVal::U32(pooling)));
    let tensors: Vec<runtime::gguf::writer::WriteTensor> = f
        .tensors
        .iter()
        .map(|t| runtime::gguf::writer::WriteTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: t.ty,
            data: f.tensor_data(t),
        })
        .collect();
    let out = dir.join("embed.gguf");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
    runtime::gguf::writer::write(&mut w, &meta, &tensors).unwrap();
    out
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Serves `model` (pooling from the file unless `pooling` is given), embeds TEXTS in one
/// request while a generation runs beside it, and compares with llama.cpp.
fn compare(
    name: &str,
    model: &std::path::Path,
    pooling: Option<runtime::model::Pooling>,
    llama_id: i32,
) {
    let srv = start(server::engine::EngineConfig {
        model: model.to_str().unwrap().into(),
        pooling,
        ..engine_config()
    });
    let a = srv.addr;
    let gen = std::thread::spawn(move || {
        post(
            a,
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}),
        )
    });
    let r = post(a, "/v1/embeddings", &json!({"input": TEXTS}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(gen.join().unwrap().status, 200);
    let tok = runtime::tokenizer::Tokenizer::from_gguf(&GgufFile::open(model).unwrap()).unwrap();
    let mut reference = llamacpp_ref::RefModel::load_embedding(
        model,
        &llamacpp_ref::RefOptions {
            n_ctx: 512,
            n_batch: 512,
            n_ubatch: 512,
            n_threads: 2,
            ..Default::default()
        },
        llama_id,
    )
    .unwrap();
    let mut prompt_tokens = 0;
    for (i, text) in TEXTS.iter().enumerate() {
        let ids = tok.encode(text, true, true);
        prompt_tokens += ids.len();
        let ours: Vec<f32> = v["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let theirs = reference.embed(&ids).unwrap();
        assert_eq!(ours.len(), theirs.len());
        let c = cosine(&ours, &theirs);
        let norm: f64 = ours
            .iter()
            .map(|&x| x as f64 * x as f64)
            .sum::<f64>()
            .sqrt();
        eprintln!(
            "{name}: input {i} ({} tokens): cosine {c:.9}, norm {norm:.6}",
            ids.len()
        );
        assert!(c >= 0.999, "{name}: input {i}: cosine {c}");
        assert!((norm - 1.0).abs() < 1e-4, "L2-normalized: {norm}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    // Mean and last-token vectors tell the inputs apart (a CLS vector of a causal model is
    // its first token's, the same BOS row for every input, in llama.cpp too).
    if llama_id != 2 {
        let e = |i: usize| -> Vec<f32> {
            v["data"][i]["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        for i in 1..TEXTS.len() {
            assert!(
                cosine(&e(0), &e(i)) < 0.99,
                "{name}: inputs 0 and {i} embed alike"
            );
        }
    }
    // base64: the same floats, little-endian.
    let b = post(
        a,
        "/v1/embeddings",
        &json!({"input": TEXTS[0], "encoding_format": "base64"}),
    )
    .json();
    assert!(
        b["data"][0]["embedding"].as_str().unwrap().len() > 100,
        "{b}"
    );
}

#[test]
fn embeddings_agree_with_llamacpp() {
    if !model_available() {
        return;
    }
    let _g = serial();
    use runtime::model::Pooling;
    let dir = tempfile::tempdir().unwrap();
    let smol = runtime::registry::resolve(MODEL).unwrap();
    compare("smollm2 mean", &smol, Some(Pooling::Mean), 1);
    let qwen = runtime::registry::resolve("qwen2.5-coder-0.5b").unwrap();
    compare(
        "qwen2.5 last (file)",
        &with_pooling(&qwen, dir.path(), 3),
        None,
        3,
    );
    let gemma = runtime::registry::resolve("gemma3-270m").unwrap();
    compare("gemma3 cls", &gemma, Some(Pooling::Cls), 2);
}

#[test]
fn embeddings_refuse_what_they_cannot_do() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(engine_config());
    let a = srv.addr;
    // smollm2's file names no pooling: the endpoint says how to get one.
    let r = post(a, "/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(r.status, 400);
    assert!(r.text().contains("--pooling"), "{}", r.text());
    drop(srv);
    let srv = start(server::engine::EngineConfig {
        pooling: Some(runtime::model::Pooling::Last),
        ..engine_config()
    });
    let a = srv.addr;
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [[1, 2], 7]}), "input[1]"),
        (json!({"input": [[1, 999999]]}), "input[0]"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
        (json!({"input": "hello ".repeat(2500)}), "input[0]"),
    ] {
        let r = post(a, "/v1/embeddings", &body);
        let v: Value = r.json();
        let shown: String = format!("{body}: {v}").chars().take(300).collect();
        assert_eq!(
            (r.status, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{shown}"
        );
    }
    let r = post(a, "/v1/embeddings", &json!({"input": "x", "model": "nope"}));
    assert_eq!(r.status, 404);
    // Token-id inputs give the same vector as their text.
    let tok = post(a, "/tokenize", &json!({"prompt": "hello there"})).json();
    let by_ids = post(a, "/v1/embeddings", &json!({"input": tok["tokens"]})).json();
    let by_text = post(a, "/v1/embeddings", &json!({"input": "hello there"})).json();
    assert_eq!(
        by_ids["data"][0]["embedding"],
        by_text["data"][0]["embedding"]
    );
}
