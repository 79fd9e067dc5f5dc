//! The batched forward pass: prompt chunks and decode tokens of several sequences in one
//! call give exactly (bit for bit) the logits each sequence gets alone, and bad input is
//! an error that leaves the cache as it was.

mod common;

use std::sync::Arc;

use runtime::kv::KvCache;
use runtime::model::{Logits, Model, ModelError, SeqBatch, UBatch, Workspace};
use runtime::pool::ThreadPool;

fn alone(model: &Model, pool: &ThreadPool, tokens: &[u32], split: usize) -> Vec<Vec<f32>> {
    // Returns the logits of every position, fed as one prompt chunk then single tokens.
    let mut kv = KvCache::new(model.kv_layout(256, 16));
    let mut ws = Workspace::default();
    let nv = model.config.n_vocab;
    let mut out = Vec::new();
    let n = model
        .forward(
            &[SeqBatch {
                seq: 9,
                tokens: &tokens[..split],
                logits: Logits::All,
                ubatch: UBatch::Call,
            }],
            &mut kv,
            &mut ws,
            pool,
            256,
        )
        .unwrap();
    out.extend(ws.logits.chunks(nv).take(n).map(|c| c.to_vec()));
    for t in &tokens[split..] {
        model
            .forward(
                &[SeqBatch {
                    seq: 9,
                    tokens: std::slice::from_ref(t),
                    logits: Logits::Last,
                    ubatch: UBatch::Call,
                }],
                &mut kv,
                &mut ws,
                pool,
                256,
            )
            .unwrap();
        out.push(ws.logits[..nv].to_vec());
    }
    out
}

fn check_model(name: &str) {
    let Some(path) = common::model(name) else {
        return;
    };
    let model = Arc::new(Model::load(&path).unwrap());
    let pool = ThreadPool::new(2);
    let nv = model.config.n_vocab;
    let a: Vec<u32> = (0..12).map(|i| 100 + i * 7).collect();
    let b: Vec<u32> = (0..5).map(|i| 200 + i * 13).collect();
    let c: Vec<u32> = (0..9).map(|i| 300 + i * 3).collect();
    let ra = alone(&model, &pool, &a, 12);
    let rb = alone(&model, &pool, &b, 3);
    let rc = alone(&model, &pool, &c, 9);

    let whole_c = UBatch::Prompt {
        len: c.len(),
        size: 512,
    };
    // Step 1: A's whole prompt, B's first 3 tokens, C's first 4 (a chunk).
    let mut kv = KvCache::new(model.kv_layout(256, 16));
    let mut ws = Workspace::default();
    let n = model
        .forward(
            &[
                SeqBatch {
                    seq: 1,
                    tokens: &a,
                    logits: Logits::All,
                    ubatch: UBatch::Call,
                },
                SeqBatch {
                    seq: 2,
                    tokens: &b[..3],
                    logits: Logits::Last,
                    ubatch: UBatch::Call,
                },
                // C's prompt is chunked, as a server does: its tokens keep the places
                // they have in llama.cpp's split of the whole prompt.
                SeqBatch {
                    seq: 3,
                    tokens: &c[..4],
                    logits: Logits::None,
                    ubatch: whole_c,
                },
            ],
            &mut kv,
            &mut ws,
            &pool,
            256,
        )
        .unwrap();
    assert_eq!(n, 13);
    for (p, want) in ra.iter().enumerate() {
        assert_eq!(
            &ws.logits[p * nv..(p + 1) * nv],
            &want[..],
            "{name}: seq A pos {p}"
        );
    }
    assert_eq!(
        &ws.logits[12 * nv..13 * nv],
        &rb[2][..],
        "{name}: seq B prompt"
    );
    // Step 2: B decodes one token while C finishes its prompt chunk.
    model
        .forward(
            &[
                SeqBatch {
                    seq: 3,
                    tokens: &c[4..],
                    logits: Logits::Last,
                    ubatch: whole_c,
                },
                SeqBatch {
                    seq: 2,
                    tokens: &b[3..4],
                    logits: Logits::Last,
                    ubatch: UBatch::Call,
                },
            ],
            &mut kv,
            &mut ws,
            &pool,
            256,
        )
        .unwrap();
    assert_eq!(
        &ws.logits[..nv],
        &rc[8][..],
        "{name}: seq C after chunked prefill"
    );
    assert_eq!(&ws.logits[nv..2 * nv], &rb[3][..], "{name}: seq B decode");
    assert_eq!(kv.seq_len(1), 12);
    assert_eq!(kv.seq_len(2), 4);
    assert_eq!(kv.seq_len(3), 9);

    // Bad input: a token outside the vocabulary, and a batch over the context. Both are
    // errors and leave every sequence's length unchanged.
    let bad = [nv as u32];
    let e = model
        .forward(
            &[SeqBatch {
                seq: 2,
                tokens: &bad,
                logits: Logits::Last,
                ubatch: UBatch::Call,
            }],
            &mut kv,
            &mut ws,
            &pool,
            256,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::BadToken { .. }), "{e}");
    let long = vec![5u32; 250];
    let e = model
        .forward(
            &[SeqBatch {
                seq: 1,
                tokens: &long,
                logits: Logits::Last,
                ubatch: UBatch::Call,
            }],
            &mut kv,
            &mut ws,
            &pool,
            256,
        )
        .unwrap_err();
    assert!(e.to_string().contains("context full"), "{e}");
    assert_eq!((kv.seq_len(1), kv.seq_len(2), kv.seq_len(3)), (12, 4, 9));
    kv.clear();
    assert_eq!(kv.used_blocks(), 0);

    // A prompt longer than llama.cpp's micro-batch (4 here): chunks that straddle its
    // micro-batches give the logits of feeding it those micro-batches one by one.
    let mut by_ubatch = Vec::new();
    for chunk in c.chunks(4) {
        model
            .forward(
                &[SeqBatch {
                    seq: 5,
                    tokens: chunk,
                    logits: Logits::Last,
                    ubatch: UBatch::Call,
                }],
                &mut kv,
                &mut ws,
                &pool,
                256,
            )
            .unwrap();
        by_ubatch = ws.logits[..nv].to_vec();
    }
    for (i, chunk) in [&c[..6], &c[6..]].into_iter().enumerate() {
        model
            .forward(
                &[SeqBatch {
                    seq: 6,
                    tokens: chunk,
                    logits: if i == 0 { Logits::None } else { Logits::Last },
                    ubatch: UBatch::Prompt {
                        len: c.len(),
                        size: 4,
                    },
                }],
                &mut kv,
                &mut ws,
                &pool,
                256,
            )
            .unwrap();
    }
    assert_eq!(
        &ws.logits[..nv],
        &by_ubatch[..],
        "{name}: prompt chunks across micro-batches"
    );
}

#[test]
fn smollm2_batches_are_invariant() {
    check_model("smollm2-135m");
}

#[test]
fn gemma3_batches_are_invariant() {
    check_model("gemma3-270m");
}

#[test]
fn qwen2_batches_are_invariant() {
    check_model("qwen2.5-coder-0.5b");
}

#[test]
fn unknown_architecture_and_missing_tensor_are_named() {
    use runtime::gguf::writer::to_bytes;
    use runtime::gguf::Value;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let meta = vec![(
        "general.architecture".to_string(),
        Value::String("mamba9".into()),
    )];
    std::fs::write(&p, to_bytes(&meta, &[])).unwrap();
    let e = Model::load(&p).err().unwrap().to_string();
    assert!(e.contains("mamba9"), "{e}");

    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        ("llama.embedding_length".to_string(), Value::U32(64)),
        ("llama.block_count".to_string(), Value::U32(1)),
        ("llama.feed_forward_length".to_string(), Value::U32(128)),
        ("llama.attention.head_count".to_string(), Value::U32(4)),
        ("llama.vocab_size".to_string(), Value::U32(32)),
    ];
    std::fs::write(&p, to_bytes(&meta, &[])).unwrap();
    let e = Model::load(&p).err().unwrap().to_string();
    assert!(e.contains("token_embd.weight"), "{e}");
}

/// Found by the gguf fuzz target: a block_count of billions made the loader reserve room
/// for that many layers (a 4.5 GB allocation) before looking for their tensors.
#[test]
fn absurd_hyperparameters_are_refused_before_allocating() {
    use runtime::gguf::writer::to_bytes;
    use runtime::gguf::Value;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    for (key, v) in [
        ("llama.block_count", 1u64 << 31),
        ("llama.embedding_length", 1 << 40),
        ("llama.attention.key_length", 1 << 40),
    ] {
        let mut meta = vec![
            (
                "general.architecture".to_string(),
                Value::String("llama".into()),
            ),
            ("llama.embedding_length".to_string(), Value::U64(64)),
            ("llama.block_count".to_string(), Value::U64(1)),
            ("llama.feed_forward_length".to_string(), Value::U64(128)),
            ("llama.attention.head_count".to_string(), Value::U64(4)),
            ("llama.vocab_size".to_string(), Value::U64(32)),
        ];
        meta.retain(|(k, _)| k != key);
        meta.push((key.to_string(), Value::U64(v)));
        std::fs::write(&p, to_bytes(&meta, &[])).unwrap();
        let e = Model::load(&p).err().unwrap().to_string();
        assert!(
            e.contains(key) && e.contains("above the limit"),
            "{key}: {e}"
        );
    }
}
