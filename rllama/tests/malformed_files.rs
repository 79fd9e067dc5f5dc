//! Malformed files through the real binary: each gives one clear error line and a
//! non-zero exit that is not a panic (101), within a deadline.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{model, rllama, run_with_timeout};
use rand::{RngCore, SeedableRng};

fn assert_clean_failure(path: &Path, must_mention: &str) {
    let out = run_with_timeout(rllama().arg("inspect").arg(path), Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    assert!(
        code.is_some() && code != Some(0) && code != Some(101),
        "exit {code:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        lines[0].contains(must_mention),
        "expected {must_mention:?} in: {stderr}"
    );
}

#[test]
fn truncated_corrupt_huge_and_random_files_fail_cleanly() {
    let Some(src) = model("smollm2-135m") else {
        return;
    };
    let bytes = std::fs::read(&src).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let parsed = runtime::gguf::parse_header(&bytes).unwrap();

    // Truncated inside the tensor data, and inside the header.
    let p = dir.path().join("truncated.gguf");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(&p, "outside the");
    // Cut inside the merges list: either the array no longer fits or a string is cut.
    std::fs::write(&p, &bytes[..parsed.data_offset as usize - 1000]).unwrap();
    assert_clean_failure(&p, "byte offset");
    std::fs::write(&p, &bytes[..1000]).unwrap();
    assert_clean_failure(&p, "cannot fit");

    // The last tensor's offset field pointed far beyond the end of the file. Offsets are
    // the 8 bytes just before the next tensor's name length; for the last tensor, just
    // before the padding to the data section. Find it by searching for the value.
    let last = parsed.tensors.last().unwrap();
    let needle = last.offset.to_le_bytes();
    let header_end = parsed.data_offset as usize;
    let at = bytes[..header_end]
        .windows(8)
        .rposition(|w| w == needle)
        .expect("offset bytes in header");
    let mut bad = bytes.clone();
    bad[at..at + 8].copy_from_slice(&(last.offset + (1 << 34)).to_le_bytes());
    let p = dir.path().join("bad_offset.gguf");
    std::fs::write(&p, &bad).unwrap();
    assert_clean_failure(&p, &last.name);

    // A huge array length: the vocabulary's element count.
    let key = b"tokenizer.ggml.tokens";
    let kpos = bytes.windows(key.len()).position(|w| w == key).unwrap();
    let len_at = kpos + key.len() + 4 + 4;
    let mut huge = bytes.clone();
    huge[len_at..len_at + 8].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    let p = dir.path().join("huge_array.gguf");
    std::fs::write(&p, &huge).unwrap();
    assert_clean_failure(&p, "array length");

    // Random bytes, with and without a valid magic.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut junk = vec![0u8; 1 << 16];
    rng.fill_bytes(&mut junk);
    let p = dir.path().join("random.gguf");
    std::fs::write(&p, &junk).unwrap();
    assert_clean_failure(&p, "not a GGUF file");
    junk[..8].copy_from_slice(b"GGUF\x03\0\0\0");
    std::fs::write(&p, &junk).unwrap();
    assert_clean_failure(&p, "offset");

    // Empty file, a directory, a missing file, an unknown name.
    let p = dir.path().join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    assert_clean_failure(&p, "truncated");
    assert_clean_failure(dir.path(), "not a regular file");
    assert_clean_failure(&dir.path().join("missing.gguf"), "no such file");
    let out = run_with_timeout(
        rllama().args(["inspect", "no-such-model"]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("smollm2-135m"));
}
