//! The architectures no registry model carries (Qwen3 dense and MoE, gpt-oss, Phi-3/4,
//! Gemma 2, SmolLM3) against llama.cpp, on `rllama synth` files of each family's shape
//! (cut to a few layers and narrower widths, with a short sliding window where the
//! family slides, so the tests see every feature): llama.cpp must load our writer's file
//! and describe it as that architecture, then over 20 prompts x 32 tokens
//! (`RLLAMA_ARCH_PROMPTS=20`; CI runs 6) the teacher-forced top-1 agreement must be at
//! least 99% and greedy-32 identical for at least 90% of the prompts, the bars. The largest logit difference is printed: 0 where
//! our kernels follow llama.cpp's order operation for operation.
//!
//! The ggml executor (the same file offloaded whole to ggml's CPU device) is compared with
//! llama.cpp run as it runs (its attention, weights not repacked): bit-identical where
//! both link AVX2 builds of the same ggml, else the agreement bars in [`report_and_assert`].
//!
//! `RLLAMA_ARCH_CHECK=/path/to/file.gguf` also runs the comparison on that file (a
//! full-size one from `rllama synth`, or a real model); it is skipped otherwise.

use std::path::Path;
use std::sync::Arc;

use llamacpp_ref::{RefModel, RefOptions};
use runtime::gguf::GgufFile;
use runtime::model::Model;
use runtime::runner::Runner;
use runtime::sampling::{argmax, Sampler, SamplingParams};
use runtime::synth::{self, Shape, SynthQuant, SynthSpec};
use runtime::weights::WeightPlan;

/// One engine at a time: llama.cpp's spinning pool slows down badly when oversubscribed.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const TOKENS: usize = 32;

/// Prompts per architecture: the 20 with `RLLAMA_ARCH_PROMPTS=20` (the evidence
/// run); CI runs 6, every one of which must agree as the bars allow (and in practice all
/// do: the figures are exact where the orders are).
fn n_prompts() -> usize {
    std::env::var("RLLAMA_ARCH_PROMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn prompts() -> Vec<String> {
    include_str!("../../testdata/prompts.txt")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.replace("\\n", "\n"))
        .take(n_prompts())
        .collect()
}

/// What one comparison measured.
struct Agreement {
    top1: usize,
    positions: usize,
    max_diff: f32,
    greedy_same: usize,
    prompts: usize,
    /// The ggml executor (every layer and the output on ggml's CPU device); `None`
    /// without ggml.
    device: Option<DeviceAgreement>,
}

/// The ggml executor against llama.cpp: teacher-forced top-1 over all positions, and over
/// the positions where llama.cpp's best logit leads its second by more than [`DECISIVE`].
#[derive(Default)]
struct DeviceAgreement {
    top1: usize,
    positions: usize,
    decisive_top1: usize,
    decisive: usize,
    max_diff: f32,
}

/// Whether the ggml executor runs the kernels the reference llama.cpp runs: ggml-sys
/// builds ggml's CPU backend as one AVX2 variant on x86, the reference is built for this
/// CPU, so on a CPU without AVX-512 both are AVX2 builds of the same ggml source.
fn same_ggml_kernels() -> bool {
    cfg!(target_arch = "x86_64") && quant::order::flavor() == quant::order::Flavor::Avx2
}

/// A lead that the executors' differing orders (up to 0.07 in a logit on these cuts) do
/// not overturn.
const DECISIVE: f32 = 0.25;

/// llama.cpp's settings for these comparisons (flash attention off: the CPU executor
/// follows llama.cpp's two-product attention).
fn ref_options(n_ctx: usize) -> RefOptions {
    RefOptions {
        n_ctx: n_ctx as u32,
        n_batch: 512,
        n_ubatch: 512,
        n_threads: threads() as i32,
        n_threads_batch: threads() as i32,
        ..Default::default()
    }
}

/// Loads `path` in both engines with a context of `n_ctx` and measures their agreement.
fn compare(path: &Path, n_ctx: usize, expect_arch: &str) -> Agreement {
    let f = Arc::new(GgufFile::open(path).unwrap());
    assert_eq!(f.architecture().unwrap(), expect_arch);
    let mut theirs = RefModel::load(path, &ref_options(n_ctx)).expect("llama.cpp loads the file");
    let desc = theirs.desc();
    assert!(
        desc.starts_with(expect_arch),
        "llama.cpp describes it as {desc:?}"
    );
    let model = Arc::new(
        Model::build(f.clone(), WeightPlan::default(), None, Some(n_ctx)).expect("ours loads"),
    );
    // The same declaration through the ggml graph builder.
    let device = ggml_sys::available_or_skip().then(|| {
        let mut m = Model::build(f, WeightPlan::default(), None, Some(n_ctx)).unwrap();
        let spec = runtime::offload::OffloadSpec::new(m.config.n_layer + 1, Some("CPU".into()));
        let slots = m.kv_layout(n_ctx, 16).n_blocks * 16;
        m.offload(&spec, slots, threads(), &mut |_, _| {})
            .expect("offloads to ggml's CPU device");
        let fa = m.device_layers().is_some_and(|l| l.flash_attn());
        (Runner::new(Arc::new(m), threads(), n_ctx), fa)
    });
    let (mut device, device_fa) = match device {
        Some((d, fa)) => (Some(d), fa),
        None => (None, false),
    };
    // The ggml executor is held to llama.cpp run the way it runs: with ggml's fused flash
    // attention where it uses it (llama.cpp's CPU default), and its weights in ggml's
    // plain layout, not repacked, as a device buffer holds them. Against the CPU
    // executor's reference (no flash attention, repacked) gpt-oss's cut agreed 90.9%,
    // with max |logit diff| 2.41 (flash attention's f16 steps move logits far more than
    // any order of additions, and a MoE router turns such moves into other experts).
    let mut theirs_dev = device.is_some().then(|| {
        RefModel::load(
            path,
            &RefOptions {
                flash_attn: Some(device_fa),
                repack: false,
                ..ref_options(n_ctx)
            },
        )
        .expect("llama.cpp loads the file")
    });
    let nv = model.config.n_vocab;
    assert_eq!(theirs.n_vocab(), nv);
    let mut ours = Runner::new(model, threads(), n_ctx);
    let mut a = Agreement {
        top1: 0,
        positions: 0,
        max_diff: 0.0,
        greedy_same: 0,
        prompts: 0,
        device: device.as_ref().map(|_| DeviceAgreement::default()),
    };
    for prompt in prompts() {
        let ptoks = theirs.tokenize(&prompt, true, true).unwrap();
        let ptoks = &ptoks[..ptoks.len().min(48)];
        // Teacher-forced: the prompt continued by llama.cpp's own greedy tokens.
        let cont = theirs.greedy(ptoks, TOKENS).unwrap();
        let mut seq = ptoks.to_vec();
        seq.extend(&cont);
        let ref_logits = theirs.logits_all(&seq).unwrap();
        let our_logits = ours.logits_all(&seq).unwrap();
        let dev_logits = device.as_mut().map(|d| d.logits_all(&seq).unwrap());
        let ref_dev_logits = theirs_dev.as_mut().map(|t| t.logits_all(&seq).unwrap());
        for p in ptoks.len() - 1..seq.len() {
            let (x, y) = (
                &our_logits[p * nv..(p + 1) * nv],
                &ref_logits[p * nv..(p + 1) * nv],
            );
            assert!(x.iter().all(|v| v.is_finite()), "non-finite logits at {p}");
            a.positions += 1;
            a.top1 += (argmax(x) == argmax(y)) as usize;
            a.max_diff = x
                .iter()
                .zip(y)
                .map(|(u, v)| (u - v).abs())
                .fold(a.max_diff, f32::max);
            if let (Some(dl), Some(d)) = (&dev_logits, &mut a.device) {
                let z = &dl[p * nv..(p + 1) * nv];
                let y = ref_dev_logits
                    .as_ref()
                    .map_or(y, |r| &r[p * nv..(p + 1) * nv]);
                let (best, same) = (argmax(y) as usize, argmax(z) == argmax(y));
                let second = y
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != best)
                    .map(|(_, &v)| v)
                    .fold(f32::NEG_INFINITY, f32::max);
                d.positions += 1;
                d.top1 += same as usize;
                if y[best] - second > DECISIVE {
                    d.decisive += 1;
                    d.decisive_top1 += same as usize;
                }
                d.max_diff = z
                    .iter()
                    .zip(y)
                    .map(|(u, v)| (u - v).abs())
                    .fold(d.max_diff, f32::max);
            }
        }
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let eog = |t: u32| theirs.is_eog(t);
        let (ours_gen, _) = ours
            .generate(ptoks, TOKENS, &mut sampler, &eog, &mut |_| true)
            .unwrap();
        a.prompts += 1;
        a.greedy_same += (ours_gen == cont) as usize;
    }
    a
}

/// Writes `shape` (cut) with `quant`, compares it, and asserts the bars.
fn check(shape: Shape, quant: SynthQuant, n_ctx: usize) {
    check_logits(shape, quant, n_ctx, false);
}

/// [`check`], and (`exact`) every logit bit-identical to llama.cpp's: the dense cuts,
/// where our kernels follow llama.cpp's orders (a wrong order of float additions rarely
/// flips a top-1 choice, so agreement alone would not notice it).
fn check_logits(shape: Shape, quant: SynthQuant, n_ctx: usize, exact: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(tok_path) = runtime::registry::test_model(shape.tokenizer_from) else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", shape.name));
    let arch = shape.arch;
    let name = shape.display_name();
    let spec = SynthSpec {
        tokenizer_name: shape.tokenizer_from.into(),
        shape,
        quant,
        seed: 5,
        tokenizer: &tok,
        pad_vocab: false,
    };
    synth::synthesize(&spec, &path, |_, _| {}).unwrap();
    let a = compare(&path, n_ctx, arch);
    report_and_assert(&name, &a);
    if exact {
        assert_eq!(a.max_diff, 0.0, "{name}: logits differ from llama.cpp's");
    }
}

fn report_and_assert(name: &str, a: &Agreement) {
    let rate = a.top1 as f64 / a.positions as f64;
    eprintln!(
        "{name}: teacher-forced top-1 {}/{} = {:.2}%, max |logit diff| {:.6}, greedy-{TOKENS} identical {}/{}",
        a.top1,
        a.positions,
        rate * 100.0,
        a.max_diff,
        a.greedy_same,
        a.prompts
    );
    if let Some(d) = &a.device {
        eprintln!(
            "{name}: ggml executor (-ngl all on ggml's CPU device): teacher-forced top-1 \
             {}/{} = {:.2}%, where decisive {}/{}, max |logit diff| {:.6}",
            d.top1,
            d.positions,
            100.0 * d.top1 as f64 / d.positions as f64,
            d.decisive_top1,
            d.decisive,
            d.max_diff
        );
    }
    // Both lines are printed before either executor's bars are checked.
    assert!(rate >= 0.99, "{name}: top-1 agreement {rate:.4}");
    if let Some(d) = &a.device {
        if same_ggml_kernels() {
            // The same ggml kernels on both sides, and the graph is llama.cpp's op for op.
            assert_eq!(
                d.max_diff, 0.0,
                "{name}: the ggml executor's logits differ from llama.cpp's (with the \
                 executor's attention, weights not repacked)"
            );
        } else {
            // Other SIMD widths sum in other orders, and random weights leave many
            // near-ties, which a MoE router also turns into other experts. Where
            // llama.cpp's choice is decisive, every one must agree (gpt-oss without its
            // attention sinks: 68% of all positions).
            assert!(
                d.decisive_top1 * 100 >= 99 * d.decisive && d.top1 * 10 >= 9 * d.positions,
                "{name}: the ggml executor's top-1 agreement is too low"
            );
        }
    }
    assert!(
        a.greedy_same * 10 >= 9 * a.prompts,
        "{name}: greedy identical {}/{}",
        a.greedy_same,
        a.prompts
    );
}

/// A few layers at a fraction of the width: every feature of the family, little time.
/// The vocabulary is smollm2's (49152 tokens) whatever the family's: the output layer of
/// a 256k vocabulary is most of a cut model's time and tests nothing of the architecture.
fn cut(shape: Shape, div: usize, layers: usize) -> Shape {
    let mut s = shape.scaled_down(div).with_layers(layers);
    s.tokenizer_from = "smollm2-135m";
    // A window the prompts cross, so sliding layers really slide.
    if s.feat.sliding_window > 0 {
        s.feat.sliding_window = 16;
    }
    s
}

#[test]
fn qwen3_dense() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Q4KM, 256, true);
}

/// IQ4_NL weights (llama.cpp's IQ4_NL mix: its GQA of 2 keeps attn_v IQ4_NL; the first
/// of three layers is no eighth, so ffn_down too): the repacked order where the row count
/// is a multiple of eight, `vec_dot` elsewhere.
#[test]
fn qwen3_dense_iq4_nl() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Iq4Nl, 256, true);
}

/// Q5_K weights (llama.cpp's Q5_K_M mix): ggml's AVX2 `vec_dot` order for the decode
/// tokens, its tiled GEMM's for the prompt (8 tokens and more); Q6_K where the mix puts it.
#[test]
fn qwen3_dense_q5_k_m() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Q5KM, 256, true);
}

/// IQ4_XS weights (llama.cpp's IQ4_XS mix, IQ4_NL's with IQ4_XS as the default type):
/// ggml's AVX2 `vec_dot` order for the decode tokens, the tiled GEMM's for the prompt.
#[test]
fn qwen3_dense_iq4_xs() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Iq4Xs, 256, true);
}

/// Q3_K weights (llama.cpp's Q3_K_M mix: Q4_K and Q5_K where it puts them): ggml's AVX2
/// `vec_dot` order for the decode tokens, the tiled GEMM's for the prompt.
#[test]
fn qwen3_dense_q3_k_m() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Q3KM, 256, true);
}

/// Q4_0 weights (llama.cpp's MOSTLY_Q4_0): matrices whose row count is a multiple of
/// eight are repacked by llama.cpp (`q4_0_8x8_q8_0`), whose gemv and gemm sum alike.
#[test]
fn qwen3_dense_q4_0() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Q4_0, 256, true);
}

/// F16 weights (llama.cpp's MOSTLY_F16): the activations rounded to f16 as llama.cpp's,
/// `ggml_vec_dot_f16`'s order for the decode tokens, tinyBLAS's for the prompt.
#[test]
fn qwen3_dense_f16() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::F16, 256, true);
}

/// BF16 weights (llama.cpp's MOSTLY_BF16): the activations rounded to bf16 as llama.cpp's,
/// `ggml_vec_dot_bf16`'s order for the decode tokens, tinyBLAS's for the prompt, each in
/// the build's form (`vdpbf16ps` where this CPU has AVX512_BF16).
#[test]
fn qwen3_dense_bf16() {
    check_logits(cut(Shape::qwen3_06b(), 4, 3), SynthQuant::Bf16, 256, true);
}

#[test]
fn qwen3_moe() {
    check(cut(Shape::qwen3_30b_a3b(), 8, 2), SynthQuant::Q4KM, 256);
}

#[test]
fn smollm3_nope_layers() {
    // Four layers: the fourth has no RoPE.
    check(cut(Shape::smollm3_3b(), 8, 4), SynthQuant::Q4KM, 256);
}

#[test]
fn gemma2_softcaps_and_window() {
    check(cut(Shape::gemma2_2b(), 9, 3), SynthQuant::Q4KM, 256);
}

#[test]
fn phi3_fused_partial_rotary_short_factors() {
    check(cut(Shape::phi4_mini(), 12, 2), SynthQuant::Q4KM, 256);
}

#[test]
fn phi3_long_factors() {
    // A context past the original 4096 positions: llama.cpp (and we) switch to the long
    // LongRoPE factors.
    check(cut(Shape::phi4_mini(), 12, 2), SynthQuant::Q8_0, 8192);
}

#[test]
fn gpt_oss_mxfp4_sinks_yarn() {
    if !quant::has_vec_dot(quant::GgmlType::MXFP4) {
        eprintln!("skipping: no MXFP4 kernels in this build");
        return;
    }
    check(cut(Shape::gpt_oss_20b(), 4, 2), SynthQuant::Mxfp4Moe, 256);
}

/// A file given by path: `RLLAMA_ARCH_CHECK=~/.cache/rllama/synth/qwen3-4b-q4_k_m.gguf`.
#[test]
fn file_from_env() {
    let Some(path) = std::env::var_os("RLLAMA_ARCH_CHECK") else {
        eprintln!("skipping: RLLAMA_ARCH_CHECK is not set");
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = Path::new(&path);
    let f = GgufFile::open(path).unwrap();
    let arch = f.architecture().unwrap().to_string();
    let a = compare(path, 512, &arch);
    report_and_assert(&path.display().to_string(), &a);
}
