//! `--n-cpu-moe` with ggml's CPU backend as the device (the stand-in of `offload.rs`): on a
//! cut of each MoE family's `rllama synth` shape, the first layers' expert stacks stay in
//! host memory and ggml's scheduler runs them there. The device then holds exactly those
//! experts' bytes less, the summary says which layers, and the logits are those of the
//! all-device run bit for bit (on the stand-in, both backends run the same kernels). The
//! ggml executor's agreement with llama.cpp on every family is `llamacpp-ref`'s
//! `arch_vs_llamacpp`.

use std::path::Path;
use std::sync::Arc;

use runtime::gguf::GgufFile;
use runtime::model::Model;
use runtime::offload::OffloadSpec;
use runtime::runner::Runner;
use runtime::sampling::{Sampler, SamplingParams};
use runtime::synth::{self, Shape, SynthQuant, SynthSpec};

const N_CTX: usize = 256;
const THREADS: usize = 2;
const TOKENS: usize = 8;

fn flavor() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        assert!(quant::order::configure_flavor(quant::order::Flavor::Avx2));
    });
}

fn cut(shape: Shape, div: usize, layers: usize) -> Shape {
    let mut s = shape.scaled_down(div).with_layers(layers);
    s.tokenizer_from = "smollm2-135m";
    if s.feat.sliding_window > 0 {
        s.feat.sliding_window = 16;
    }
    s
}

fn load(path: &Path, ngl: usize, n_cpu_moe: usize) -> Model {
    flavor();
    let f = runtime::ModelFile::open(path.to_str().unwrap()).unwrap();
    let mut m = f.model().unwrap();
    if ngl > 0 {
        let spec = OffloadSpec {
            n_cpu_moe,
            ..OffloadSpec::new(ngl, Some("CPU".into()))
        };
        m.offload(
            &spec,
            m.kv_layout(N_CTX, 16).n_blocks * 16,
            THREADS,
            &mut |_, _| {},
        )
        .unwrap();
    }
    m
}

fn prompts() -> Vec<Vec<u32>> {
    // Token ids from a fixed pattern: the tokenizer is not what is under test.
    (0..3u32)
        .map(|p| (0..24).map(|i| (p * 7919 + i * 131 + 11) % 40000).collect())
        .collect()
}

/// All-position logits of each prompt continued by `conts`.
fn logits(m: Model, conts: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let mut r = Runner::new(Arc::new(m), THREADS, N_CTX);
    prompts()
        .iter()
        .zip(conts)
        .map(|(p, c)| {
            let mut ids = p.clone();
            ids.extend(c);
            r.logits_all(&ids).unwrap()
        })
        .collect()
}

fn check(shape: Shape, quant: SynthQuant) {
    if !ggml_sys::available_or_skip() {
        return;
    }
    let Some(tok_path) = runtime::registry::test_model(shape.tokenizer_from) else {
        return;
    };
    let tok = GgufFile::open(&tok_path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.gguf", shape.name));
    let name = shape.display_name();
    let spec = SynthSpec {
        tokenizer_name: shape.tokenizer_from.into(),
        shape,
        quant,
        seed: 9,
        tokenizer: &tok,
        pad_vocab: false,
    };
    synth::synthesize(&spec, &path, |_, _| {}).unwrap();

    let cpu = load(&path, 0, 0);
    let n_layer = cpu.config.n_layer;
    assert!(cpu
        .spec
        .layers
        .iter()
        .all(|l| matches!(l.ffn, runtime::model::FfnSpec::Moe(_))));
    let mut r = Runner::new(Arc::new(cpu), THREADS, N_CTX);
    let conts: Vec<Vec<u32>> = prompts()
        .iter()
        .map(|p| {
            let mut s = Sampler::new(SamplingParams::greedy());
            r.generate(p, TOKENS, &mut s, &|_| false, &mut |_| true)
                .unwrap()
                .0
        })
        .collect();
    let dev_model = load(&path, n_layer + 1, 0);
    let dev = dev_model.device_layers().expect("offloaded");
    assert!(dev.experts_on_cpu().is_none());
    let all_weights = dev.memory().weights;
    let on_dev = logits(dev_model, &conts);

    // --n-cpu-moe 1: layer 0's experts in host memory, everything else on the device.
    let m = load(&path, n_layer + 1, 1);
    let dev = m.device_layers().expect("offloaded");
    let (layers, host_bytes) = dev.experts_on_cpu().expect("experts kept on the CPU");
    assert_eq!(layers, 0..1);
    eprintln!("{name} --n-cpu-moe 1: {}", dev.summary());
    assert!(dev.summary().contains("--n-cpu-moe"));
    let f = GgufFile::open(&path).unwrap();
    let want: u64 = f
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.0.ffn_") && t.name.ends_with("_exps.weight"))
        .map(|t| t.size)
        .sum();
    assert!(want > 0);
    assert!(host_bytes as u64 >= want, "{host_bytes} < {want}");
    let saved = all_weights - dev.memory().weights;
    assert!(
        saved as u64 >= want && (saved as u64) < want + (1 << 20),
        "the device holds {saved} bytes less; layer 0's experts are {want}"
    );
    let split = logits(m, &conts);
    assert!(
        split == on_dev,
        "{name}: --n-cpu-moe 1 changed the logits on the CPU stand-in device"
    );
    // Beyond the offloaded layers' count it keeps every layer's experts on the CPU.
    let m = load(&path, n_layer + 1, 99);
    let (layers, _) = m.device_layers().unwrap().experts_on_cpu().unwrap();
    assert_eq!(layers, 0..n_layer);
    assert!(logits(m, &conts) == on_dev);
    // With -ngl below the layer count, N counts from the model's first layer, as in
    // llama.cpp: `-ngl 1 --n-cpu-moe 2` keeps the experts of the one offloaded layer.
    let part = logits(load(&path, 1, 0), &conts);
    let m = load(&path, 1, n_layer);
    let (layers, _) = m.device_layers().unwrap().experts_on_cpu().unwrap();
    assert_eq!(layers, n_layer - 1..n_layer);
    assert!(logits(m, &conts) == part);
    let m = load(&path, 1, n_layer - 1);
    assert!(m.device_layers().unwrap().experts_on_cpu().is_none());
}

#[test]
fn qwen3_moe_and_n_cpu_moe() {
    check(cut(Shape::qwen3_30b_a3b(), 8, 2), SynthQuant::Q4KM);
}

#[test]
fn gpt_oss_and_n_cpu_moe() {
    if !quant::has_vec_dot(quant::GgmlType::MXFP4) {
        eprintln!("skipping: no MXFP4 kernels in this build");
        return;
    }
    check(cut(Shape::gpt_oss_20b(), 4, 2), SynthQuant::Mxfp4Moe);
}
