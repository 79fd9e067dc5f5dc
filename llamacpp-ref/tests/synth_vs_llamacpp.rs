//! `rllama synth` files in llama.cpp: the 2-layer, width/8 cuts of each shape that
//! `runtime`'s `synth` tests write (and a padded-vocabulary one) load in llama.cpp with the
//! shape's hyperparameters, give finite logits, and agree with ours (random weights, so
//! agreement is checked on the logits themselves rather than on text).
//!
//! `RLLAMA_SYNTH_CHECK=/path/to/file.gguf` also runs the comparison on that file (a
//! full-size one from `rllama synth`); it is skipped otherwise.

use std::path::Path;
use std::sync::Arc;

use llamacpp_ref::{RefModel, RefOptions};
use runtime::gguf::GgufFile;
use runtime::model::Model;
use runtime::runner::Runner;
use runtime::synth::{self, Shape, SynthQuant, SynthSpec};

/// One engine at a time: llama.cpp's spinning pool slows down badly when oversubscribed.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

const TEXT: &str = "Synthetic models at real sizes: the text is meaningless, the speed is real.";

/// Loads `path` in both engines, runs the same tokens, and checks that every logit is
/// finite in both and that ours follow llama.cpp's: per position, the largest difference
/// is a small fraction of the logits' spread and the argmax is shared at most positions.
fn compare(path: &Path, expect_desc: &str) {
    let f = GgufFile::open(path).unwrap();
    assert!(
        synth::is_synthetic(&f),
        "{} is not synthetic",
        path.display()
    );
    let mut theirs = RefModel::load(
        path,
        &RefOptions {
            n_ctx: 128,
            n_batch: 64,
            n_ubatch: 64,
            n_threads: threads() as i32,
            n_threads_batch: threads() as i32,
            ..Default::default()
        },
    )
    .expect("llama.cpp loads the synthetic model");
    let desc = theirs.desc();
    assert!(
        desc.starts_with(expect_desc),
        "llama.cpp describes it as {desc:?}"
    );
    assert_eq!(
        theirs.meta("general.name").as_deref(),
        f.get_str("general.name").unwrap()
    );
    let model = Arc::new(Model::load(path).unwrap());
    let nv = model.config.n_vocab;
    assert_eq!(theirs.n_vocab(), nv);
    let tokens = theirs.tokenize(TEXT, true, false).unwrap();
    assert!(tokens.len() >= 8, "{tokens:?}");
    let ref_logits = theirs.logits_all(&tokens).unwrap();
    drop(theirs);
    let our_logits = Runner::new(model, threads(), 128)
        .logits_all(&tokens)
        .unwrap();
    for (who, l) in [("llama.cpp", &ref_logits), ("ours", &our_logits)] {
        assert_eq!(l.len(), tokens.len() * nv);
        let bad = l.iter().filter(|v| !v.is_finite()).count();
        assert_eq!(bad, 0, "{who}: {bad} non-finite logits");
    }
    let (mut worst, mut same_top) = (0f64, 0usize);
    for (a, b) in our_logits.chunks(nv).zip(ref_logits.chunks(nv)) {
        let mean = b.iter().map(|&v| v as f64).sum::<f64>() / nv as f64;
        let std = (b.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / nv as f64).sqrt();
        assert!(std > 0.05, "llama.cpp's logits are flat (std {std})");
        let max_diff = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (x - y).abs() as f64)
            .fold(0.0, f64::max);
        worst = worst.max(max_diff / std);
        same_top += (runtime::sampling::argmax(a) == runtime::sampling::argmax(b)) as usize;
    }
    eprintln!(
        "{}: llama.cpp {desc:?}, {} tokens, vocabulary {nv}: max |ours - llama.cpp| = {worst:.2e} logit std, same argmax at {same_top}/{}",
        path.display(),
        tokens.len(),
        tokens.len()
    );
    assert!(
        worst < 0.1,
        "ours differ from llama.cpp by {worst} logit std"
    );
    assert!(
        same_top * 4 >= tokens.len() * 3,
        "argmax agrees at {same_top}"
    );
}

fn check(shape: Shape, pad_vocab: bool, expect_desc: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tok_path) = runtime::registry::test_model(shape.tokenizer_from) else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", shape.name));
    let spec = SynthSpec {
        tokenizer_name: shape.tokenizer_from.into(),
        shape,
        quant: SynthQuant::Q4KM,
        seed: 11,
        tokenizer: &tok,
        pad_vocab,
    };
    synth::synthesize(&spec, &path, |_, _| {}).unwrap();
    compare(&path, expect_desc);
}

#[test]
fn llama3_8b_cut_runs_in_llama_cpp() {
    check(
        Shape::llama3_8b().scaled_down(8).with_layers(2),
        false,
        "llama ",
    );
}

#[test]
fn qwen2_5_7b_cut_runs_in_llama_cpp() {
    check(
        Shape::qwen25_7b().scaled_down(8).with_layers(2),
        false,
        "qwen2 ",
    );
}

#[test]
fn padded_vocabulary_runs_in_llama_cpp() {
    check(
        Shape::llama3_8b().scaled_down(16).with_layers(1),
        true,
        "llama ",
    );
}

/// A full-size file: `RLLAMA_SYNTH_CHECK=~/.cache/rllama/synth/llama3-8b-q4_k_m.gguf`.
#[test]
fn synthetic_file_from_env() {
    let Some(path) = std::env::var_os("RLLAMA_SYNTH_CHECK") else {
        eprintln!("skipping: RLLAMA_SYNTH_CHECK is not set");
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    compare(Path::new(&path), "");
}
