//! Number formats, timestamps, the SIMD guard and the engine checks (no model needed).

use bench_cli::llama_bench::cli::Params;
use bench_cli::llama_bench::report::{format_params, format_size, load_note, tg_read_gbps};
use bench_cli::llama_bench::run::{
    check_supported, format_utc, missing_reference_simd, model_type, size_label,
};

#[test]
fn llama_bench_number_formats() {
    assert_eq!(format_size(96_574_464), "92.10 MiB");
    assert_eq!(format_size(4_677_120_000), "4.36 GiB");
    assert_eq!(format_params(134_515_008), "134.52 M");
    assert_eq!(format_params(7_615_616_512), "7.62 B");
    assert_eq!(size_label(134_515_008), "135M");
    assert_eq!(size_label(1_543_714_304), "1.5B");
    assert_eq!(size_label(13_015_864_320), "13B");
}

#[test]
fn utc_timestamps() {
    assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_utc(1_745_495_829), "2025-04-24T11:57:09Z");
    assert_eq!(format_utc(951_825_600), "2000-02-29T12:00:00Z");
}

#[test]
fn ratio_refused_when_reference_lacks_host_simd() {
    let host = [("AVX2", "AVX2 = 1"), ("AVX-512F", "AVX512 = 1")];
    let full = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 |";
    assert!(missing_reference_simd(full, &host).is_empty());
    let no512 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 |";
    assert_eq!(missing_reference_simd(no512, &host), ["AVX-512F"]);
    assert_eq!(
        missing_reference_simd("CPU : SSE3 = 1 |", &host),
        ["AVX2", "AVX-512F"]
    );
    // A host without AVX-512 does not need it in the reference.
    assert!(missing_reference_simd(no512, &host[..1]).is_empty());
}

#[test]
fn llamacpp_engine_checks() {
    let p = |args: &[&str]| {
        let mut v = vec!["rbench"];
        v.extend_from_slice(args);
        Params::parse_from(v).unwrap()
    };
    assert!(check_supported(&p(&["-d", "64"])).is_ok());
    let depth_pp = check_supported(&p(&["--engine", "rllama,llamacpp", "-d", "64"]));
    let depth_tg = check_supported(&p(&["--engine", "llamacpp", "-p", "0", "-d", "64"]));
    if cfg!(feature = "llamacpp") {
        // Prompts at depth continue after the depth tokens, as llama-bench's `-d` runs them.
        assert!(depth_pp.is_ok());
        assert!(depth_tg.is_ok());
    } else {
        for r in [depth_pp, depth_tg] {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("--features llamacpp"), "{e}");
        }
    }
}

#[test]
fn busy_machine_is_flagged() {
    assert_eq!(load_note(None, 2), None);
    assert_eq!(load_note(Some(0.2), 2), None);
    let n = load_note(Some(3.5), 2).unwrap();
    assert!(n.contains("3.50 on 2 CPUs") && n.contains("noisy"), "{n}");
}

#[test]
fn tg_roofline_is_weights_times_tokens_per_second() {
    // 100 MiB of weights read 50 times a second.
    let g = tg_read_gbps(100 << 20, 50.0);
    assert!((g - 5.242_88).abs() < 1e-9, "{g}");
    assert_eq!(tg_read_gbps(0, 50.0), 0.0);
}

/// A row measured on an `rllama synth` file says so after the model; a real file does not.
#[test]
fn synthetic_models_are_marked() {
    use runtime::gguf::{writer, Array, GgufFile, Value};
    use runtime::synth::{self, Shape, SynthQuant, SynthSpec};
    // A stand-in tokenizer source: 64 tokens are all the writer copies.
    let tokens: Vec<String> = (0..64).map(|i| format!("t{i}")).collect();
    let meta = vec![
        (
            "general.architecture".to_string(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::String(tokens)),
        ),
    ];
    let tok = GgufFile::from_bytes("tok", writer::to_bytes(&meta, &[])).unwrap();
    let spec = SynthSpec {
        shape: Shape::llama3_8b().scaled_down(16).with_layers(1),
        quant: SynthQuant::Q4KM,
        seed: 0,
        tokenizer: &tok,
        tokenizer_name: "test".into(),
        pad_vocab: false,
    };
    let (bytes, _) = synth::write_to(&spec, Vec::new(), |_, _| {}).unwrap();
    let f = GgufFile::from_bytes("synth", bytes).unwrap();
    assert_eq!(model_type(&f), "llama 1M Q4_K - Medium (synthetic)");
    assert_eq!(model_type(&tok), "llama 0M ?");
}
