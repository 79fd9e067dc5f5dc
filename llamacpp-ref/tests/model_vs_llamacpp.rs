//! Our forward pass against llama.cpp on the same GGUF files: teacher-forced top-1
//! agreement over 128-token sequences, greedy generation of 32 tokens, and perplexity.
//! Token ids come from llama.cpp's tokenizer so this test isolates the model.

use std::sync::Arc;

use llamacpp_ref::{RefModel, RefOptions};
use runtime::model::Model;
use runtime::runner::Runner;
use runtime::sampling::{argmax, Sampler, SamplingParams};
use runtime::Numerics;

const SEQ_LEN: usize = 128;
const GREEDY: usize = 32;

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn prompts() -> Vec<String> {
    include_str!("../../testdata/prompts.txt")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.replace("\\n", "\n"))
        .collect()
}

fn reference(path: &std::path::Path) -> RefModel {
    RefModel::load(
        path,
        &RefOptions {
            n_ctx: 1024,
            n_batch: 512,
            n_ubatch: 512,
            n_threads: threads() as i32,
            n_threads_batch: threads() as i32,
            ..Default::default()
        },
    )
    .expect("llama.cpp loads the model")
}

/// llama-perplexity's number over `tokens` computed from `theirs`' logits.
fn ref_perplexity(theirs: &mut RefModel, tokens: &[u32], n_ctx: usize, bos: Option<u32>) -> f64 {
    let nv = theirs.n_vocab();
    let (mut nll, mut count) = (0.0f64, 0usize);
    for i in 0..tokens.len() / n_ctx {
        let mut chunk = tokens[i * n_ctx..(i + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let logits = theirs.logits_all(&chunk).unwrap();
        for j in n_ctx / 2..n_ctx - 1 {
            nll -= runtime::runner::log_softmax_at(
                &logits[j * nv..(j + 1) * nv],
                tokens[i * n_ctx + j + 1] as usize,
            );
            count += 1;
        }
    }
    (nll / count as f64).exp()
}

/// Perplexity over the Apache-2.0 text with context 256, ours vs llama.cpp's default
/// configuration (flash attention auto = on for CPU, what llama-perplexity reports) through
/// the same chunking; must agree within 1%. The FA-off value is printed beside it: the two
/// llama.cpp paths themselves differ by up to ~0.7% on these small models.
///
/// In the short form (`RLLAMA_TEST_PROMPTS` below 20, as CI runs it) the text is cut to its
/// first 4 chunks and the FA-off figure, which no bar uses, is not computed.
fn compare_perplexity(
    name: &str,
    ours: &mut Runner,
    theirs_default: &mut RefModel,
    theirs_fa_off: &mut RefModel,
    max_rel: f64,
) {
    let text = include_str!("../../testdata/apache-2.0.txt");
    let mut tokens = theirs_default.tokenize(text, true, false).unwrap();
    let bos = theirs_default.bos().filter(|_| theirs_default.add_bos());
    let n_ctx = 256;
    let short = prompt_limit() < 20;
    if short {
        tokens.truncate(4 * n_ctx);
    }
    let (our_ppl, _) = ours.perplexity(&tokens, n_ctx, bos).unwrap();
    let ref_ppl = ref_perplexity(theirs_default, &tokens, n_ctx, bos);
    let rel = (our_ppl - ref_ppl).abs() / ref_ppl;
    let off = if short {
        "not computed (short form)".to_string()
    } else {
        let off_ppl = ref_perplexity(theirs_fa_off, &tokens, n_ctx, bos);
        let off_rel = (off_ppl - ref_ppl).abs() / ref_ppl;
        format!("{off_ppl:.4} (diff {:.3}%)", off_rel * 100.0)
    };
    eprintln!(
        "{name}: perplexity (c=256, {} chunks) ours {our_ppl:.4}, llama.cpp default {ref_ppl:.4} (diff {:.3}%), llama.cpp flash-attn off {off}",
        tokens.len() / n_ctx,
        rel * 100.0,
    );
    assert!(
        rel < max_rel,
        "{name}: perplexity differs by {:.3}%",
        rel * 100.0
    );
}

/// `RLLAMA_TEST_PROMPTS`: how many of the 20 prompts to compare (all by default).
fn prompt_limit() -> usize {
    std::env::var("RLLAMA_TEST_PROMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

/// The three comparisons run one at a time: each already uses every core, and llama.cpp's
/// spinning thread pool slows down badly when oversubscribed.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn compare_model(name: &str) {
    compare_model_with(name, Numerics::Exact);
}

/// `numerics`: with `Exact` the bars of the exact mode are asserted (our kernels follow
/// llama.cpp's operation for operation); with `Fast` the same figures are measured and
/// printed beside llama.cpp's own flash-attention on-vs-off figures, and only gross
/// breakage fails (the fidelity bar is a decision for the default, not a unit test).
fn compare_model_with(name: &str, numerics: Numerics) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(path) = runtime::registry::test_model(name) else {
        return;
    };
    let mut model = Model::load(&path).unwrap();
    model.set_numerics(numerics);
    let model = Arc::new(model);
    let exact = numerics == Numerics::Exact;
    let name = &format!("{name} ({numerics})");
    let nv = model.config.n_vocab;
    let mut ours = Runner::new(model, threads(), 1024);
    let mut theirs = reference(&path);
    assert_eq!(theirs.n_vocab(), nv);
    // llama.cpp against itself with flash attention on: the noise floor of the comparison.
    let mut theirs_fa = RefModel::load(
        &path,
        &RefOptions {
            n_ctx: 1024,
            n_threads: threads() as i32,
            n_threads_batch: threads() as i32,
            flash_attn: None,
            ..Default::default()
        },
    )
    .unwrap();
    compare_perplexity(
        name,
        &mut ours,
        &mut theirs_fa,
        &mut theirs,
        if exact { 0.01 } else { 0.03 },
    );
    let (mut self_agree, mut self_max_diff) = (0usize, 0f32);
    // llama.cpp's flash-attention on-vs-off figures per prompt are the yardstick of the fast
    // order; the exact mode's bars do not use them, so CI (exact) skips their cost unless
    // RLLAMA_TEST_NOISE_FLOOR=1 asks for them.
    let noise_floor = !exact || std::env::var("RLLAMA_TEST_NOISE_FLOOR").is_ok_and(|v| v == "1");

    let limit = prompt_limit();
    let (mut agree, mut total, mut max_diff) = (0usize, 0usize, 0f32);
    let (mut greedy_same, mut n_prompts, mut self_greedy_same) = (0usize, 0usize, 0usize);
    for prompt in prompts().into_iter().take(limit) {
        let ptoks = theirs.tokenize(&prompt, true, true).unwrap();
        // A 128-token sequence: the prompt continued by llama.cpp's own greedy text.
        let cont = theirs
            .greedy(&ptoks, SEQ_LEN.saturating_sub(ptoks.len()))
            .unwrap();
        let mut seq = ptoks.clone();
        seq.extend(&cont);
        let ref_logits = theirs.logits_all(&seq).unwrap();
        let our_logits = ours.logits_all(&seq).unwrap();
        if noise_floor {
            let fa_logits = theirs_fa.logits_all(&seq).unwrap();
            for p in 0..seq.len() {
                let (a, b) = (
                    &fa_logits[p * nv..(p + 1) * nv],
                    &ref_logits[p * nv..(p + 1) * nv],
                );
                self_agree += (argmax(a) == argmax(b)) as usize;
                self_max_diff = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(self_max_diff, f32::max);
            }
        }
        assert_eq!(ref_logits.len(), our_logits.len());
        for p in 0..seq.len() {
            let (a, b) = (
                &our_logits[p * nv..(p + 1) * nv],
                &ref_logits[p * nv..(p + 1) * nv],
            );
            assert!(
                a.iter().all(|v| v.is_finite()),
                "{name}: non-finite logits at {p}"
            );
            total += 1;
            agree += (argmax(a) == argmax(b)) as usize;
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            max_diff = max_diff.max(d);
        }
        // Greedy generation, each engine on its own.
        // llama.cpp's greedy text is deterministic and stops at the same end-of-generation
        // token however far it is asked to go, so its first GREEDY tokens are a prefix of
        // `cont` (the continuation above) whenever that was asked for at least as many.
        let ref_gen = if SEQ_LEN.saturating_sub(ptoks.len()) >= GREEDY {
            cont[..cont.len().min(GREEDY)].to_vec()
        } else {
            theirs.greedy(&ptoks, GREEDY).unwrap()
        };
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let eog = |t: u32| theirs.is_eog(t);
        let (our_gen, _) = ours
            .generate(&ptoks, GREEDY, &mut sampler, &eog, &mut |_| true)
            .unwrap();
        n_prompts += 1;
        if noise_floor {
            self_greedy_same += (theirs_fa.greedy(&ptoks, GREEDY).unwrap() == ref_gen) as usize;
        }
        if our_gen == ref_gen {
            greedy_same += 1;
        } else {
            let first = our_gen.iter().zip(&ref_gen).position(|(a, b)| a != b);
            eprintln!("{name}: greedy differs at {first:?} for {prompt:?}");
        }
    }
    let rate = agree as f64 / total as f64;
    let self_rate = self_agree as f64 / total as f64;
    let floor = |v: String| {
        if noise_floor {
            format!(" (llama.cpp vs itself {v})")
        } else {
            String::new()
        }
    };
    if noise_floor {
        eprintln!(
        "{name}: llama.cpp flash-attn on vs off (its own noise floor): top-1 agreement {self_agree}/{total} = {:.2}%, max |logit diff| {self_max_diff:.4}, greedy-{GREEDY} identical {self_greedy_same}/{n_prompts}",
        self_rate * 100.0
    );
    }
    eprintln!(
        "{name}: teacher-forced top-1 agreement {agree}/{total} = {:.2}%, max |logit diff| {max_diff:.4}, greedy-{GREEDY} identical {greedy_same}/{n_prompts}",
        rate * 100.0
    );
    // The bar of the issue: 99% top-1 agreement and 90% identical greedy continuations.
    // Our kernels follow llama.cpp's x86 ones operation for operation (flash attention
    // off), so on these machines the agreement is exact; llama.cpp's own two attention
    // paths (printed above) stay below that bar on these models.
    if !exact {
        assert!(rate >= 0.9, "{name}: top-1 agreement {rate:.4}");
        return;
    }
    assert!(
        rate >= 0.99,
        "{name}: top-1 agreement {rate:.4}{}",
        floor(format!("{self_rate:.4}"))
    );
    assert!(
        greedy_same * 10 >= 9 * n_prompts,
        "{name}: greedy identical {greedy_same}/{n_prompts}{}",
        floor(self_greedy_same.to_string())
    );
}

/// The fidelity of the fast kernel orders against llama.cpp, measured the same way
/// (a few minutes on two cores, so not in CI):
/// `cargo test --release -p llamacpp-ref --test model_vs_llamacpp fast_numerics -- --ignored --nocapture`.
#[test]
#[ignore]
fn fast_numerics_fidelity() {
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"] {
        compare_model_with(name, Numerics::Fast);
    }
}

#[test]
fn smollm2_matches_llamacpp() {
    compare_model("smollm2-135m");
}

#[test]
fn gemma3_matches_llamacpp() {
    compare_model("gemma3-270m");
}

#[test]
fn qwen2_matches_llamacpp() {
    compare_model("qwen2.5-coder-0.5b");
}

/// Any GGUF files measured the same way, one after the other (the per-type evidence on
/// requantized models): `RLLAMA_COMPARE_FILES=a.gguf,b.gguf cargo test --release -p
/// llamacpp-ref --test model_vs_llamacpp compare_files -- --ignored --nocapture`.
#[test]
#[ignore]
fn compare_files() {
    let files = std::env::var("RLLAMA_COMPARE_FILES")
        .expect("RLLAMA_COMPARE_FILES: comma-separated GGUF paths");
    for file in files.split(',').filter(|f| !f.is_empty()) {
        compare_model(file);
    }
}
