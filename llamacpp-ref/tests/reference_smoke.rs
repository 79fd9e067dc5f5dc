//! Smoke tests for the llama.cpp reference engine (`runtime::reference`).
//!
//! Run with: cargo test -p llamacpp-ref --test reference_smoke
//! Models are looked up in `$RLLAMA_MODELS` (default `$HOME/.cache/rllama/models`); a test
//! whose model is absent prints a message and passes.

use llamacpp_ref::{cpu_mismatch, system_info, RefError, RefModel, RefOptions, BUILD_CPU_FEATURES};
use std::path::PathBuf;

fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RLLAMA_MODELS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/rllama/models")
}

fn model_path(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(format!("{name}.gguf"));
    if p.is_file() {
        Some(p)
    } else {
        eprintln!("skipping: model {} not found", p.display());
        None
    }
}

fn opts() -> RefOptions {
    RefOptions {
        n_ctx: 512,
        n_batch: 64,
        n_ubatch: 64,
        // One thread each: the tests run in parallel, and ggml's spinning thread pool
        // degrades badly when the cores are oversubscribed.
        n_threads: 1,
        ..RefOptions::default()
    }
}

fn load(name: &str) -> Option<RefModel> {
    let p = model_path(name)?;
    Some(RefModel::load(&p, &opts()).unwrap_or_else(|e| panic!("loading {}: {e}", p.display())))
}

fn assert_send<T: Send>() {}

/// The reference must be built the way a native llama-bench is: every SIMD extension this
/// CPU has, OpenMP, an optimised (Release) build. A build that quietly loses one of them
/// makes every ratio `rbench` prints flatter us, so this fails loudly instead.
#[test]
fn system_info_reports_cpu_features() {
    let info = system_info();
    println!("system_info: {info}");
    assert!(info.contains("CPU"), "unexpected system info: {info}");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let expected = [
            ("SSE3", has!("sse3")),
            ("SSSE3", has!("ssse3")),
            ("AVX", has!("avx")),
            ("AVX2", has!("avx2")),
            ("F16C", has!("f16c")),
            ("FMA", has!("fma")),
            ("BMI2", has!("bmi2")),
            ("AVX512", has!("avx512f")),
            ("AVX512_VBMI", has!("avx512vbmi")),
            ("AVX512_VNNI", has!("avx512vnni")),
            ("AVX512_BF16", has!("avx512bf16")),
        ];
        for (name, cpu_has) in expected {
            if cpu_has {
                assert!(
                    info.contains(&format!(" {name} = 1")),
                    "llama.cpp built without {name}, which this CPU has: {info}"
                );
            }
        }
    }
    for default_on in ["OPENMP", "LLAMAFILE", "REPACK"] {
        assert!(
            info.contains(&format!(" {default_on} = 1")),
            "llama.cpp built without {default_on} (on in its CMake defaults): {info}"
        );
    }
    assert_eq!(
        option_env!("LLAMA_LIB_PROFILE"),
        Some("Release"),
        "llama.cpp must be built as Release (-O3) like a native llama-bench; \
         .cargo/config.toml sets LLAMA_LIB_PROFILE"
    );
}

/// The build records what llama.cpp was compiled for; built here, it runs here.
/// (`BUILD_NATIVE` is a constant of the build, checked at run time so that a non-native
/// build fails this test with a message instead of refusing to compile.)
#[test]
#[allow(clippy::assertions_on_constants)]
fn build_cpu_features_are_recorded_and_present() {
    println!(
        "llama.cpp built for: {BUILD_CPU_FEATURES} (native: {})",
        llamacpp_ref::BUILD_NATIVE
    );
    assert_eq!(cpu_mismatch(), None);
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            llamacpp_ref::BUILD_NATIVE,
            "the reference must be a native build"
        );
        assert!(BUILD_CPU_FEATURES.split(',').any(|f| f == "avx2"));
        if std::arch::is_x86_feature_detected!("avx512f") {
            assert!(BUILD_CPU_FEATURES.split(',').any(|f| f == "avx512f"));
        }
    }
}

#[test]
fn smollm2_smoke() {
    assert_send::<RefModel>();
    let Some(mut m) = load("smollm2-135m") else {
        return;
    };
    println!(
        "{}: n_vocab {} n_ctx {} n_batch {} threads {:?} bos {:?} eos {:?} add_bos {}",
        m.desc(),
        m.n_vocab(),
        m.n_ctx(),
        m.n_batch(),
        m.threads(),
        m.bos(),
        m.eos(),
        m.add_bos()
    );
    assert_eq!(m.n_ctx(), 512);
    assert_eq!(m.threads(), (1, 1));
    m.set_threads(2, 2);
    assert_eq!(m.threads(), (2, 2));
    m.set_threads(1, 1);
    assert!(m.n_vocab() > 1000);
    assert_eq!(m.meta("general.architecture").as_deref(), Some("llama"));
    assert!(m.meta("no.such.key").is_none());

    // Tokenize / detokenize round trip.
    let ids = m.tokenize("Hello world", false, false).unwrap();
    println!("'Hello world' -> {ids:?}");
    assert!(!ids.is_empty());
    assert_eq!(m.detokenize(&ids, false, false).unwrap(), "Hello world");
    let pieces: Vec<u8> = ids
        .iter()
        .flat_map(|&t| m.token_to_piece(t, false))
        .collect();
    assert_eq!(pieces, b"Hello world");
    assert!(m.token_to_piece(u32::MAX, true).is_empty());
    assert!(m.tokenize("", false, false).unwrap().is_empty());
    if let Some(eos) = m.eos() {
        assert!(m.is_eog(eos));
        // Special tokens are parsed only when asked to.
        let text = String::from_utf8(m.token_to_piece(eos, true)).unwrap();
        assert_eq!(m.tokenize(&text, false, true).unwrap(), vec![eos]);
        assert_ne!(m.tokenize(&text, false, false).unwrap(), vec![eos]);
    }

    // Logits of every position.
    let prompt = m.tokenize("The capital of France is", true, false).unwrap();
    let logits = m.logits_all(&prompt).unwrap();
    assert_eq!(logits.len(), prompt.len() * m.n_vocab());
    assert!(logits.iter().all(|x| x.is_finite()));
    // The last row equals what a last-only evaluation gives.
    let last = m.logits_last(&prompt).unwrap();
    let row = &logits[(prompt.len() - 1) * m.n_vocab()..];
    let max_diff = row
        .iter()
        .zip(&last)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "last row differs by {max_diff}");

    // Chunked evaluation (more tokens than n_batch) keeps positions consistent.
    let long: Vec<u32> = prompt.iter().copied().cycle().take(150).collect();
    let all = m.logits_all(&long).unwrap();
    assert_eq!(all.len(), 150 * m.n_vocab());
    assert!(all.iter().all(|x| x.is_finite()));
    let short = m.logits_all(&long[..100]).unwrap();
    let d = all[..short.len()]
        .iter()
        .zip(&short)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(d < 0.05, "prefix logits differ by {d}");

    // Greedy decoding is deterministic.
    let a = m.greedy(&prompt, 8).unwrap();
    let b = m.greedy(&prompt, 8).unwrap();
    let text = m.detokenize(&a, false, false).unwrap();
    println!("greedy: {a:?} {text:?}");
    assert_eq!(a, b);
    assert!(!a.is_empty() && a.len() <= 8);
    assert!(m.greedy(&prompt, 0).unwrap().is_empty());
    // The first greedy token is the argmax of the last logits row.
    let best =
        last.iter().enumerate().fold(
            (0, f32::NEG_INFINITY),
            |acc, (i, &v)| if v > acc.1 { (i, v) } else { acc },
        );
    assert_eq!(a[0] as usize, best.0);

    // Benchmark timers.
    let pp = m.time_prompt(&long).unwrap();
    assert_eq!(m.pos(), long.len());
    let tg = m.time_generate(a[0], 4).unwrap();
    assert_eq!(m.pos(), long.len() + 4);
    println!(
        "time_prompt({}) = {:.2} ms, time_generate(4) = {:.2} ms",
        long.len(),
        pp as f64 / 1e6,
        tg as f64 / 1e6
    );
    assert!(pp > 0 && tg > 0);
    // A prompt at depth continues after what the cache holds.
    let pp_at_depth = m.time_prompt_after(&long).unwrap();
    assert!(pp_at_depth > 0);
    assert_eq!(m.pos(), 2 * long.len() + 4);
    assert!(matches!(
        m.time_prompt_after(&vec![prompt[0]; 600]),
        Err(RefError::ContextFull { .. })
    ));
    assert_eq!(m.pos(), 2 * long.len() + 4);
    m.clear_kv();
    assert_eq!(m.pos(), 0);

    // Errors, not crashes.
    assert!(matches!(
        m.logits_all(&[u32::MAX]),
        Err(RefError::BadToken { .. })
    ));
    let too_long = vec![prompt[0]; 600];
    assert!(matches!(
        m.logits_all(&too_long),
        Err(RefError::ContextFull { .. })
    ));
    assert!(m.greedy(&[], 4).is_err());
    assert!(m.detokenize(&[u32::MAX], false, false).is_err());

    // Chat template (smollm2 ships a ChatML template).
    let msgs = vec![
        ("system".to_string(), "You are helpful.".to_string()),
        ("user".to_string(), "Hi!".to_string()),
    ];
    match m.apply_chat_template(&msgs, true) {
        Ok(s) => {
            println!("chat: {s:?}");
            assert!(s.contains("Hi!") && s.contains("You are helpful."));
            assert!(s.contains("<|im_start|>assistant"));
        }
        Err(e) => println!("chat template unavailable: {e}"),
    }
}

#[test]
fn other_models_load_and_agree_with_themselves() {
    for name in ["gemma3-270m", "qwen2.5-coder-0.5b"] {
        let Some(mut m) = load(name) else { continue };
        let prompt = m.tokenize("fn main() {", true, false).unwrap();
        let logits = m.logits_all(&prompt).unwrap();
        assert_eq!(logits.len(), prompt.len() * m.n_vocab());
        assert!(
            logits.iter().all(|x| x.is_finite()),
            "{name}: non-finite logits"
        );
        let a = m.greedy(&prompt, 6).unwrap();
        let b = m.greedy(&prompt, 6).unwrap();
        assert_eq!(a, b, "{name}: greedy not deterministic");
        println!(
            "{name} ({}): {:?} -> {:?}",
            m.desc(),
            a,
            m.detokenize(&a, false, false).unwrap()
        );
        let chat = m.apply_chat_template(&[("user".to_string(), "Hello".to_string())], true);
        println!("{name} chat: {chat:?}");
    }
}

#[test]
fn bad_files_are_errors() {
    let missing = std::env::temp_dir().join("rllama-ref-does-not-exist.gguf");
    let e = RefModel::load(&missing, &opts())
        .err()
        .expect("missing file must fail");
    assert!(matches!(e, RefError::Load(_)), "{e}");

    let dir = std::env::temp_dir().join(format!("rllama-ref-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"this is definitely not a gguf model file").unwrap();
    assert!(matches!(
        RefModel::load(&garbage, &opts()),
        Err(RefError::Load(_))
    ));
    // Correct magic, garbage afterwards: llama.cpp itself has to reject it.
    let fake = dir.join("fake.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&[0xff; 64]);
    std::fs::write(&fake, &bytes).unwrap();
    let e = RefModel::load(&fake, &opts())
        .err()
        .expect("garbage after magic must fail");
    println!("fake gguf: {e}");
    // A truncated real model.
    if let Some(p) = model_path("smollm2-135m") {
        let data = std::fs::read(&p).unwrap();
        let trunc = dir.join("truncated.gguf");
        std::fs::write(&trunc, &data[..data.len().min(1 << 20)]).unwrap();
        let e = RefModel::load(&trunc, &opts())
            .err()
            .expect("truncated model must fail");
        println!("truncated: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
