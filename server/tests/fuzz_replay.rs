//! The fuzz targets (`fuzz/`) without libFuzzer: every target's body runs over its seed
//! corpus (written by `tools/fuzz_seeds.py`), over whatever corpus and crash artifacts a
//! local `tools/fuzz.sh` run left in `fuzz/corpus` and `fuzz/artifacts`, and over a fixed
//! set of mutations of each seed (bit flips, cuts, byte runs, splices of two seeds).
//!
//! This is the CI's short form of the fuzzers: it proves the targets still compile against
//! the crates and that no seed or known crash input fails an invariant, in seconds and
//! with the build the tests already share. Coverage-guided fuzzing with AddressSanitizer
//! is `tools/fuzz.sh` (a million executions per target for an issue's evidence).

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod rllama_fuzz;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Mutations per target, spread evenly over its seeds.
const MUTATIONS: usize = 2000;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn python_has_gguf() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Files directly under `dir`, sorted by name (a stable order for the splices).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(String, Vec<u8>)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let data = std::fs::read(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), data))
        })
        .collect();
    v.sort();
    v
}

/// xorshift64*: the same mutations on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn mutate(seed: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(6) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = [0, 0xff, 0x7f, 0x80, b'"', b'{', b'\\'][rng.below(7)];
            }
            2 => d.truncate(rng.below(d.len() + 1)),
            3 => {
                let i = rng.below(d.len() + 1);
                let run = vec![rng.below(256) as u8; 1 + rng.below(16)];
                d.splice(i..i, run);
            }
            4 if !d.is_empty() => {
                let i = rng.below(d.len());
                let j = (i + 1 + rng.below(16)).min(d.len());
                d.drain(i..j);
            }
            _ => {
                let cut = rng.below(d.len() + 1);
                let from = rng.below(other.len() + 1);
                d.truncate(cut);
                d.extend_from_slice(&other[from..]);
            }
        }
    }
    d
}

fn run_one(name: &str, f: fn(&[u8]), what: &str, data: &[u8]) -> Result<(), String> {
    catch_unwind(AssertUnwindSafe(|| f(data)))
        .map_err(|_| format!("{name}: {what} ({} bytes) fails the target", data.len()))
}

#[test]
fn fuzz_targets_hold_on_seeds_known_inputs_and_mutations() {
    if !python_has_gguf() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install the gguf Python package (fuzz seeds)"
        );
        eprintln!("SKIPPED: python3 with gguf and numpy is needed to write the fuzz seeds");
        return;
    }
    let root = repo();
    let seeds = tempfile::tempdir().unwrap();
    let sharegpt =
        runtime::registry::dataset_cache_dir().join("ShareGPT_V3_unfiltered_cleaned_split.json");
    let out = Command::new("python3")
        .arg(root.join("tools/fuzz_seeds.py"))
        .arg(seeds.path())
        .arg(&sharegpt)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "fuzz_seeds.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The vocabularies load (and the models are fetched) before any input runs.
    assert_eq!(rllama_fuzz::vocabs().len(), rllama_fuzz::MODELS.len());

    let mut failures = Vec::new();
    for (name, f) in rllama_fuzz::TARGETS {
        let seed_files = files(&seeds.path().join(name));
        assert!(
            !seed_files.is_empty(),
            "{name}: fuzz_seeds.py wrote no seeds"
        );
        let mut known = 0;
        for dir in ["corpus", "artifacts"] {
            for (file, data) in files(&root.join("fuzz").join(dir).join(name)) {
                known += 1;
                if let Err(e) = run_one(name, f, &format!("fuzz/{dir}/{name}/{file}"), &data) {
                    failures.push(e);
                }
            }
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ name.len() as u64);
        let mut mutated = 0;
        for (i, (file, data)) in seed_files.iter().enumerate() {
            if let Err(e) = run_one(name, f, &format!("seed {file}"), data) {
                failures.push(e);
            }
            let other = &seed_files[(i + 1) % seed_files.len()].1;
            let per_seed = MUTATIONS.div_ceil(seed_files.len());
            for k in 0..per_seed {
                let m = mutate(data, other, &mut rng);
                mutated += 1;
                if let Err(e) = run_one(name, f, &format!("mutation {k} of seed {file}"), &m) {
                    failures.push(e);
                }
            }
        }
        eprintln!(
            "{name}: {} seeds, {known} corpus/artifact files, {mutated} mutations",
            seed_files.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
