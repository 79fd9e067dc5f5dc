//! `rllama`: fetch, inspect, tokenize, run and score GGUF models.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use runtime::gguf::{GgufFile, Value};
use runtime::registry;

#[derive(Parser)]
#[command(name = "rllama", version, about = "CPU GGUF inference runtime")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Download, assemble and verify a registry model; prints its local path last.
    Fetch {
        /// Registry name (see `rllama models`).
        name: String,
    },
    /// List the registry models and whether they are cached.
    Models,
    /// Show a GGUF file's metadata and tensor table.
    Inspect {
        /// Registry name or path to a .gguf file.
        model: String,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Print long arrays (vocabularies, merges) in full instead of summarising them.
        #[arg(long)]
        full: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`rllama inspect m | head`) is not an error worth reporting.
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut out = io::stdout().lock();
    match cli.cmd {
        Cmd::Fetch { name } => {
            let spec =
                registry::find(&name).ok_or_else(|| registry::FetchError::Unknown(name.clone()))?;
            let path = registry::fetch(spec)?;
            writeln!(out, "{}", path.display())?;
        }
        Cmd::Models => {
            for m in registry::MODELS {
                let p = registry::cached_path(m);
                let state = if p.is_file() {
                    p.display().to_string()
                } else {
                    "not fetched".into()
                };
                writeln!(out, "{:<20} {:<55} {}", m.name, m.description, state)?;
            }
        }
        Cmd::Inspect { model, json, full } => {
            let path = registry::resolve(&model)?;
            let f = GgufFile::open(&path).with_context(|| format!("loading {}", path.display()))?;
            if json {
                serde_json::to_writer_pretty(&mut out, &inspect_json(&f, full))?;
                writeln!(out)?;
            } else {
                inspect_text(&mut out, &f, path, full)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

const SUMMARY_ARRAY_LEN: usize = 32;

fn inspect_json(f: &GgufFile, full: bool) -> serde_json::Value {
    use serde_json::json;
    let metadata: serde_json::Map<String, serde_json::Value> = f
        .metadata
        .iter()
        .map(|(k, v)| {
            let jv = match v {
                Value::Array(a) if !full && a.len() > SUMMARY_ARRAY_LEN => json!({
                    "array_of": a.elem_type().name(),
                    "len": a.len(),
                }),
                v => v.to_json(),
            };
            (k.clone(), jv)
        })
        .collect();
    let tensors: Vec<_> = f
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.shape,
                "n_elements": t.n_elements(),
                "bytes": t.size,
                "offset": f.data_offset + t.offset,
            })
        })
        .collect();
    json!({
        "path": f.path(),
        "gguf_version": f.version,
        "architecture": f.architecture().ok(),
        "name": f.get_str("general.name").ok().flatten(),
        "file_type": f.file_type_name(),
        "file_size": f.file_size(),
        "n_params": f.n_params(),
        "tensor_bytes": f.tensor_bytes(),
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "n_tensors": f.tensors.len(),
        "tensor_types": type_counts(f),
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn type_counts(f: &GgufFile) -> serde_json::Map<String, serde_json::Value> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in &f.tensors {
        match counts.iter_mut().find(|(n, _)| n == t.ty.name()) {
            Some((_, c)) => *c += 1,
            None => counts.push((t.ty.name().to_string(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1));
    counts.into_iter().map(|(k, v)| (k, v.into())).collect()
}

fn human_bytes(b: u64) -> String {
    let mib = b as f64 / (1024.0 * 1024.0);
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.2} MiB")
    }
}

fn inspect_text(out: &mut impl Write, f: &GgufFile, path: PathBuf, full: bool) -> Result<()> {
    writeln!(out, "file:         {}", path.display())?;
    writeln!(out, "gguf version: {}", f.version)?;
    writeln!(
        out,
        "architecture: {}",
        f.architecture().unwrap_or("(missing)")
    )?;
    if let Ok(Some(name)) = f.get_str("general.name") {
        writeln!(out, "name:         {name}")?;
    }
    writeln!(
        out,
        "file type:    {}",
        f.file_type_name().unwrap_or_else(|| "(unknown)".into())
    )?;
    writeln!(
        out,
        "parameters:   {} ({:.2} M)",
        f.n_params(),
        f.n_params() as f64 / 1e6
    )?;
    writeln!(
        out,
        "size:         {} (tensor data {})",
        human_bytes(f.file_size()),
        human_bytes(f.tensor_bytes())
    )?;
    let types: Vec<String> = type_counts(f)
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    writeln!(
        out,
        "tensors:      {} ({})",
        f.tensors.len(),
        types.join(", ")
    )?;
    writeln!(out, "\nmetadata ({} keys):", f.metadata.len())?;
    for (k, v) in &f.metadata {
        match v {
            Value::Array(a) if full || a.len() <= SUMMARY_ARRAY_LEN => {
                writeln!(out, "  {k:<45} = {}", v.to_json())?
            }
            _ => writeln!(out, "  {k:<45} = {v}")?,
        }
    }
    writeln!(
        out,
        "\n{:<5} {:<40} {:<7} {:<22} {:>12}",
        "#", "name", "type", "shape", "bytes"
    )?;
    for (i, t) in f.tensors.iter().enumerate() {
        let shape = t
            .shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(" x ");
        writeln!(
            out,
            "{i:<5} {:<40} {:<7} {:<22} {:>12}",
            t.name,
            t.ty.name(),
            shape,
            t.size
        )?;
    }
    Ok(())
}
