//! `rllama synth` files: a 2-layer, width/8 cut of each shape (tens of MB) is written,
//! read back by our loader with the tensor types of the Q4_K_M mix and the shape's
//! hyperparameters, and runs a forward pass with finite, non-degenerate logits.
//! (`llamacpp-ref`'s `synth_vs_llamacpp` loads the same files in llama.cpp.)

mod common;

use std::sync::Arc;

use quant::GgmlType;
use runtime::gguf::GgufFile;
use runtime::runner::Runner;
use runtime::synth::{self, Shape, SynthQuant, SynthSpec};
use runtime::ModelFile;

/// The small cut used in the tests: real head dim, GQA, biases, RoPE and norm settings,
/// two layers (one with the Q4_K_M mix's Q6_K promotions, one without).
fn small(shape: Shape) -> Shape {
    shape.scaled_down(8).with_layers(2)
}

fn check_shape(shape: Shape) {
    let Some(tok_path) = common::model(shape.tokenizer_from) else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let n_vocab = tok
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .unwrap()
        .len();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", shape.name));
    let shape = small(shape);
    let spec = SynthSpec {
        shape: shape.clone(),
        quant: SynthQuant::Q4KM,
        seed: 42,
        tokenizer: &tok,
        tokenizer_name: shape.tokenizer_from.into(),
        pad_vocab: false,
    };
    let t0 = std::time::Instant::now();
    let mut last = (0, 0);
    let report = synth::synthesize(&spec, &path, |d, t| last = (d, t)).unwrap();
    eprintln!(
        "{}: {} bytes in {:.2} s",
        shape.name,
        report.file_bytes,
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(last.0, last.1, "progress reaches the total");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        report.file_bytes,
        "the report's size is the file's"
    );
    assert!(!path.with_extension("gguf.part").exists());

    // The file: labelled synthetic, the tensor table is the plan with the mix's types.
    let f = GgufFile::open(&path).unwrap();
    assert!(synth::is_synthetic(&f));
    let name = f.get_str("general.name").unwrap().unwrap();
    assert!(
        name.starts_with(&format!("synthetic {}", shape.name)),
        "{name}"
    );
    assert!(name.contains("random weights"), "{name}");
    assert_eq!(f.architecture().unwrap(), shape.arch);
    assert_eq!(f.get_i64("general.file_type").unwrap(), Some(15));
    assert_eq!(
        f.get_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        tok.get_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        "the vocabulary is the source's"
    );
    let plan = synth::plan(&shape, SynthQuant::Q4KM, n_vocab);
    assert_eq!(f.tensors.len(), plan.len());
    for (t, p) in f.tensors.iter().zip(&plan) {
        assert_eq!(t.name, p.spec.name);
        assert_eq!(t.shape, p.spec.shape, "{}", t.name);
        assert_eq!(t.ty, p.spec.ty, "{}", t.name);
    }
    let ty = |n: &str| f.tensor(n).unwrap_or_else(|| panic!("{n} missing")).ty;
    assert_eq!(ty("token_embd.weight"), GgmlType::Q4_K);
    assert_eq!(ty("output.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4_K);
    // use_more_bits(i, 2): layer 1 is the last eighth, layer 0 is not promoted.
    assert_eq!(ty("blk.0.attn_v.weight"), GgmlType::Q4_K);
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q4_K);
    assert_eq!(ty("blk.1.attn_v.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q6_K);
    assert_eq!(ty("blk.1.ffn_norm.weight"), GgmlType::F32);
    assert_eq!(
        f.tensor("blk.0.attn_q.bias").map(|t| t.ty),
        shape.qkv_bias.then_some(GgmlType::F32)
    );

    // Dequantized weights have the intended spread.
    let t = f.tensor("blk.0.ffn_up.weight").unwrap();
    let mut x = vec![0f32; t.n_elements() as usize];
    quant::dequantize_row(t.ty, f.tensor_data(t), &mut x).unwrap();
    let std = (x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64).sqrt();
    assert!((0.017..0.023).contains(&std), "ffn_up std {std}");

    // Our loader: hyperparameters as the shape says, then a forward pass.
    let mf = ModelFile::open_path(&path).unwrap();
    let model = Arc::new(mf.model().unwrap());
    let c = &model.config;
    assert_eq!(c.n_vocab, n_vocab);
    let l0 = &model.spec.layers[0];
    let runtime::model::FfnSpec::Dense { n_ff, .. } = l0.ffn else {
        panic!("a dense shape declares dense layers")
    };
    assert_eq!(
        (c.n_embd, c.n_layer, c.n_head, c.n_head_kv, n_ff),
        (
            shape.n_embd,
            shape.n_layer,
            shape.n_head,
            shape.n_head_kv,
            shape.n_ff
        )
    );
    assert_eq!(c.head_dim_k, 128);
    assert_eq!(
        l0.attn.rope.as_ref().map(|r| r.freq_base),
        Some(shape.rope_theta)
    );
    assert_eq!(c.rms_eps, shape.rms_eps);
    assert_eq!(c.n_ctx_train, shape.n_ctx);
    let tokens = mf
        .tokenizer
        .encode("The quick brown fox jumps over", true, false);
    assert!(tokens.len() >= 4, "{tokens:?}");
    let mut runner = Runner::new(model, 2, 64);
    let logits = runner.logits_all(&tokens).unwrap();
    assert_eq!(logits.len(), tokens.len() * n_vocab);
    let bad = logits.iter().filter(|v| !v.is_finite()).count();
    assert_eq!(bad, 0, "{bad} non-finite logits");
    for row in logits.chunks(n_vocab) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n_vocab as f64;
        let std =
            (row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n_vocab as f64).sqrt();
        // Random weights: logits spread around O(1), neither collapsed nor exploding.
        assert!((0.05..100.0).contains(&std), "logit std {std}");
    }
}

#[test]
fn llama3_8b_cut_loads_and_runs() {
    check_shape(Shape::llama3_8b());
}

#[test]
fn qwen2_5_7b_cut_loads_and_runs() {
    check_shape(Shape::qwen25_7b());
}

/// The same seed writes the same bytes; another seed does not.
#[test]
fn synthesis_is_deterministic() {
    let Some(tok_path) = common::model("smollm2-135m") else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let shape = Shape::llama3_8b().scaled_down(16).with_layers(1);
    let write = |seed| {
        let spec = SynthSpec {
            shape: shape.clone(),
            quant: SynthQuant::Q4_0,
            seed,
            tokenizer: &tok,
            tokenizer_name: "smollm2-135m".into(),
            pad_vocab: false,
        };
        synth::write_to(&spec, Vec::new(), |_, _| {}).unwrap().0
    };
    let a = write(1);
    assert_eq!(a, write(1));
    assert_ne!(a, write(2));
    let f = GgufFile::from_bytes("q4_0", a).unwrap();
    assert_eq!(f.tensor("blk.0.ffn_up.weight").unwrap().ty, GgmlType::Q4_0);
    assert_eq!(f.tensor("output.weight").unwrap().ty, GgmlType::Q6_K);
}

/// `pad_vocab`: the vocabulary is the real model's size, the added tokens are unused
/// `[PAD<i>]` entries, text tokenizes as with the source, and the model runs.
#[test]
fn padded_vocabulary_has_the_real_size() {
    let Some(tok_path) = common::model("smollm2-135m") else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let shape = Shape::llama3_8b().scaled_down(16).with_layers(1);
    let spec = SynthSpec {
        shape: shape.clone(),
        quant: SynthQuant::Q4KM,
        seed: 5,
        tokenizer: &tok,
        tokenizer_name: "smollm2-135m".into(),
        pad_vocab: true,
    };
    assert_eq!(spec.n_vocab().unwrap(), 128_256);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("padded.gguf");
    synth::synthesize(&spec, &path, |_, _| {}).unwrap();
    let mf = ModelFile::open_path(&path).unwrap();
    let f = &mf.file;
    let tokens = f.get_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 128_256);
    let types = f.get_array("tokenizer.ggml.token_type").unwrap().unwrap();
    let types = types.to_i64_vec().unwrap();
    assert_eq!(types.len(), 128_256);
    assert!(types[49_152..].iter().all(|&t| t == 5));
    assert_eq!(
        f.get_i64("rllama.synthetic.vocab_padded_from").unwrap(),
        Some(49_152)
    );
    assert_eq!(f.tensor("output.weight").unwrap().shape, [256, 128_256]);
    let source = ModelFile::open_path(&tok_path).unwrap();
    let text = "Synthetic models at real sizes: 4096 wide, 32 layers.";
    let ids = mf.tokenizer.encode(text, true, false);
    assert_eq!(ids, source.tokenizer.encode(text, true, false));
    let model = Arc::new(mf.model().unwrap());
    assert_eq!(model.config.n_vocab, 128_256);
    let logits = Runner::new(model, 2, 64).logits_all(&ids).unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
}
