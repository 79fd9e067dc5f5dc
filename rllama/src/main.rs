//! `rllama`: fetch, inspect, tokenize, run and score GGUF models; write synthetic ones;
//! list offload devices.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use runtime::chat::{ChatMessage, ChatTemplate};
use runtime::gguf::{GgufFile, Value};
use runtime::numa::{self, NumaMode, WeightPlacement};
use runtime::options::{default_threads, RunArgs, RunOptions};
use runtime::pool::ThreadPool;
use runtime::registry;
use runtime::runner::{FinishReason, Runner};
use runtime::sampling::{Sampler, SamplingParams};
use runtime::speculative::SpecArgs;
use runtime::synth;
use runtime::tokenizer::StreamDecoder;
use runtime::{ContextSize, ModelFile};

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
    /// List the ggml backends and devices layers can be offloaded to (`-ngl`), or say why
    /// this machine is CPU only.
    Devices {
        /// Directory holding ggml's libraries (default: $RLLAMA_GGML_DIR, ggml/ beside
        /// this binary, then the build's output).
        #[arg(long)]
        ggml_dir: Option<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also list the devices of these ggml RPC servers (`HOST:PORT,...`).
        #[arg(long, value_delimiter = ',')]
        rpc: Vec<String>,
        /// Allow --rpc servers at public addresses.
        #[arg(long)]
        rpc_allow_public: bool,
    },
    /// Serve this machine's ggml device to other machines' `--rpc` (ggml's RPC server,
    /// llama.cpp's `rpc-server`). The protocol has no authentication: bind a loopback or
    /// private address (the default is loopback).
    RpcServer {
        /// The IPv4 address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(short, long, default_value_t = 50052)]
        port: u16,
        /// Threads of the CPU device (default: the CPUs this process may use).
        #[arg(short, long)]
        threads: Option<usize>,
        /// The ggml device to serve (`rllama devices` lists them).
        #[arg(long, default_value = "CPU")]
        device: String,
        /// Keep tensors clients send by hash in this directory (ggml's `-c`).
        #[arg(long)]
        cache: Option<PathBuf>,
        /// Listen on a public address or on every interface (0.0.0.0) too.
        #[arg(long)]
        allow_public: bool,
    },
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
        /// Show the NUMA topology, where the compute threads run and where the weight
        /// pages are after a short prompt (with --numa-mode, --numa-weights, -t).
        #[arg(long)]
        numa: bool,
        /// Thread placement for --numa: distribute, isolate or numactl.
        #[arg(long, requires = "numa")]
        numa_mode: Option<NumaMode>,
        /// Weight placement for --numa: first-touch, interleave or replicate.
        #[arg(long, requires = "numa", default_value = "first-touch")]
        numa_weights: WeightPlacement,
        /// Compute threads for --numa.
        #[arg(short = 't', long, requires = "numa")]
        threads: Option<usize>,
    },
    /// Tokenize text with the model's own tokenizer (special tokens in the text are parsed).
    Tokenize {
        #[arg(short, long, default_value = registry::DEFAULT_MODEL)]
        model: String,
        #[arg(short, long)]
        prompt: String,
        /// Do not add BOS/EOS even where the model's metadata asks for them.
        #[arg(long)]
        no_special: bool,
        #[arg(long)]
        json: bool,
    },
    /// Generate text from a prompt.
    Run {
        #[arg(short, long, default_value = registry::DEFAULT_MODEL)]
        model: String,
        #[arg(short, long, required_unless_present = "file", conflicts_with = "file")]
        prompt: Option<String>,
        /// Read the prompt from this file (llama.cpp's -f).
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// Tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
        n_predict: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long, default_value_t = 40)]
        top_k: usize,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0.05)]
        min_p: f32,
        #[arg(long, default_value_t = 1.0)]
        repeat_penalty: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Wrap the prompt as a user message in the model's chat template.
        #[arg(long)]
        chat: bool,
        /// System message for --chat.
        #[arg(long)]
        system: Option<String>,
        /// Compute threads; default: the CPUs this process may use.
        #[arg(short = 't', long)]
        threads: Option<usize>,
        /// Layers on a ggml device (`-ngl`, as llama.cpp): the last N; above the layer count
        /// the output layer too. `rllama devices` lists the devices.
        #[arg(long = "n-gpu-layers", default_value_t = 0)]
        n_gpu_layers: usize,
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        spec: SpecArgs,
        #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
        ctx: usize,
        #[arg(long)]
        json: bool,
    },
    /// Write a synthetic model: a real family's shape with random weights and a real
    /// tokenizer. Its text is meaningless; its speed is the real model's.
    Synth {
        /// Model shape: llama3-8b, qwen2.5-7b, qwen3-0.6b, qwen3-4b, qwen3-30b-a3b,
        /// gpt-oss-20b, phi4-mini, gemma2-2b or smollm3-3b.
        #[arg(long)]
        shape: String,
        /// Quantization: q4_k_m (llama.cpp's Q4_K_M mix), q3_k_m and q5_k_m (its Q3_K_M
        /// and Q5_K_M mixes), q4_0,
        /// q8_0, mxfp4_moe (MXFP4 experts, Q8_0 elsewhere), iq4_nl or iq4_xs (llama.cpp's
        /// IQ4_NL and IQ4_XS mixes), f16, bf16 [default: mxfp4_moe for gpt-oss-20b, else
        /// q4_k_m].
        #[arg(long)]
        quant: Option<String>,
        /// Output .gguf file.
        #[arg(short, long)]
        output: PathBuf,
        /// Registry name or GGUF path whose tokenizer (and so vocabulary) is copied
        /// [default: the registry model nearest the family's: qwen2.5-coder-0.5b for the
        /// Qwen, Phi and gpt-oss shapes, gemma3-270m for gemma2-2b, smollm2-135m for the
        /// others].
        #[arg(long)]
        tokenizer_from: Option<String>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Pad the vocabulary with unused [PAD<i>] tokens to the real model's size (its
        /// published config's, e.g. 151936 for qwen3-30b-a3b, 201088 for gpt-oss-20b), so
        /// token_embd and output, and the file, have the real sizes.
        #[arg(long)]
        pad_vocab: bool,
        /// Keep only the first N layers (for tests; the per-layer cost stays real).
        #[arg(long)]
        layers: Option<usize>,
        /// Divide the widths by N (for tests; not a real size).
        #[arg(long, hide = true)]
        scale_down: Option<usize>,
    },
    /// Perplexity over a text file, computed as llama-perplexity does.
    Perplexity {
        #[arg(short, long, default_value = registry::DEFAULT_MODEL)]
        model: String,
        #[arg(short, long)]
        file: PathBuf,
        #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
        ctx: usize,
        /// Stop after this many chunks (0 = all).
        #[arg(long, default_value_t = 0)]
        chunks: usize,
        /// Compute threads; default: the CPUs this process may use.
        #[arg(short = 't', long)]
        threads: Option<usize>,
        /// Layers on a ggml device (`-ngl`, as llama.cpp): the last N; above the layer count
        /// the output layer too. `rllama devices` lists the devices.
        #[arg(long = "n-gpu-layers", default_value_t = 0)]
        n_gpu_layers: usize,
        #[command(flatten)]
        run: RunArgs,
    },
}

fn main() -> ExitCode {
    // The environment's settings (kernel level, caches) before anything else runs.
    runtime::options::init();
    // llama.cpp's multi-letter single-dash spellings.
    let argv = std::env::args().map(runtime::options::llama_flag_spelling);
    let cli = Cli::parse_from(argv);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed pipe (`rllama inspect m | head`) is not an error worth reporting.
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: our library errors already print their source in
/// their own message, which `{:#}` would repeat.
fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.contains(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
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
        Cmd::RpcServer {
            host,
            port,
            threads,
            device,
            cache,
            allow_public,
        } => {
            let threads = threads.unwrap_or_else(runtime::options::default_threads);
            runtime::offload::rpc_serve(
                &host,
                port,
                threads,
                &device,
                cache.as_deref(),
                allow_public,
            )
            .map_err(|e| anyhow::anyhow!(e))?;
        }
        Cmd::Devices {
            ggml_dir,
            json,
            rpc,
            rpc_allow_public,
        } => {
            let mut report = runtime::offload::probe(ggml_dir.as_deref());
            runtime::offload::probe_rpc(&mut report, &rpc, rpc_allow_public);
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                write!(out, "{}", runtime::offload::render(&report))?;
            }
        }
        Cmd::Tokenize {
            model,
            prompt,
            no_special,
            json,
        } => {
            let tok = ModelFile::open(&model)?.tokenizer;
            let ids = tok.encode(&prompt, !no_special, true);
            if json {
                writeln!(out, "{}", serde_json::json!({ "ids": ids }))?;
            } else {
                for id in &ids {
                    let piece =
                        String::from_utf8_lossy(&tok.token_to_piece(*id, true)).into_owned();
                    writeln!(out, "{id:>7} -> {piece:?}")?;
                }
                writeln!(out, "{} tokens", ids.len())?;
            }
        }
        Cmd::Run {
            model,
            prompt,
            file,
            n_predict,
            temp,
            top_k,
            top_p,
            min_p,
            repeat_penalty,
            seed,
            chat,
            system,
            threads,
            n_gpu_layers,
            run,
            spec,
            ctx,
            json,
        } => {
            let prompt = match (prompt, file) {
                (Some(p), _) => p,
                (None, Some(f)) => std::fs::read_to_string(&f)
                    .with_context(|| format!("reading the prompt from {}", f.display()))?,
                (None, None) => anyhow::bail!("give a prompt (-p) or a prompt file (-f)"),
            };
            let (spec_mode, _) = spec.resolve().map_err(anyhow::Error::msg)?;
            let t_load = Instant::now();
            let opts = run.options(threads.unwrap_or_else(default_threads), n_gpu_layers);
            let l = ModelFile::open(&model)?.load_with(&opts, ContextSize::single(ctx))?;
            let mut speculator = spec
                .speculator(&l, &opts, ctx)
                .map_err(anyhow::Error::msg)?;
            let load_ms = t_load.elapsed().as_secs_f64() * 1e3;
            let text = if chat {
                let tmpl = ChatTemplate::from_gguf(&l.file);
                let mut msgs = Vec::new();
                if let Some(sys) = &system {
                    msgs.push(ChatMessage::new("system", sys));
                }
                msgs.push(ChatMessage::new("user", &prompt));
                let mut rendered = tmpl.render(&msgs, true)?;
                // Templates that write the BOS text themselves must not get a second BOS.
                if let Some(bos) = l.tokenizer.bos().filter(|_| l.tokenizer.add_bos()) {
                    let bos_text = l.tokenizer.token_text(bos).to_string();
                    if !bos_text.is_empty() && rendered.starts_with(&bos_text) {
                        rendered = rendered[bos_text.len()..].to_string();
                    }
                }
                rendered
            } else {
                prompt.clone()
            };
            let prompt_ids = l.tokenizer.encode(&text, true, true);
            if prompt_ids.is_empty() {
                anyhow::bail!("the prompt tokenizes to nothing");
            }
            if prompt_ids.len() + n_predict > ctx {
                anyhow::bail!(
                    "prompt ({} tokens) + n_predict ({n_predict}) exceeds the context size {ctx}; raise -c or lower -n",
                    prompt_ids.len()
                );
            }
            let params = SamplingParams {
                temperature: temp,
                top_k,
                top_p,
                min_p,
                repeat_penalty,
                seed,
                ..Default::default()
            };
            params.validate().map_err(anyhow::Error::msg)?;
            let mut runner = Runner::with_pool(l.model.clone(), ThreadPool::for_run(&opts)?, ctx);
            let mut sampler = Sampler::new(params);
            let tok = &l.tokenizer;
            let mut dec = StreamDecoder::new(tok, true);
            let mut generated_text = String::new();
            let mut first_token_at = None;
            let t0 = Instant::now();
            let mut write_err = None;
            let (ids, finish, spec_stats) = runner.generate_with(
                &prompt_ids,
                n_predict,
                &mut sampler,
                &|t| tok.is_eog(t),
                &mut |id| {
                    first_token_at.get_or_insert_with(Instant::now);
                    let piece = dec.push(id);
                    generated_text.push_str(&piece);
                    if !json {
                        if let Err(e) = write!(out, "{piece}").and_then(|_| out.flush()) {
                            write_err = Some(e);
                            return false;
                        }
                    }
                    true
                },
                speculator.as_mut(),
            )?;
            if let Some(e) = write_err {
                return Err(e.into());
            }
            let tail = dec.finish();
            generated_text.push_str(&tail);
            let total = t0.elapsed().as_secs_f64();
            let prompt_s = first_token_at.map_or(total, |t| (t - t0).as_secs_f64());
            let gen_s = total - prompt_s;
            let finish_reason = match finish {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
                FinishReason::Context => "context",
            };
            let decode_tps = if ids.len() > 1 {
                (ids.len() - 1) as f64 / gen_s
            } else {
                0.0
            };
            if json {
                let v = serde_json::json!({
                    "prompt_ids": prompt_ids,
                    "generated_ids": ids,
                    "text": generated_text,
                    "finish_reason": finish_reason,
                    "timings": {
                        "load_ms": load_ms,
                        "prompt_tokens": prompt_ids.len(),
                        "prompt_ms": prompt_s * 1e3,
                        "prompt_tokens_per_s": prompt_ids.len() as f64 / prompt_s,
                        "generated_tokens": ids.len(),
                        "decode_ms": gen_s * 1e3,
                        "decode_tokens_per_s": decode_tps,
                    },
                    "speculative": speculator.as_ref().map(|s| serde_json::json!({
                        "mode": spec_mode.name(),
                        "draft_max": s.params.n_max,
                        "drafted": spec_stats.drafted,
                        "accepted": spec_stats.accepted,
                        "steps": spec_stats.steps,
                        "acceptance": spec_stats.acceptance(),
                    })),
                });
                serde_json::to_writer_pretty(&mut out, &v)?;
                writeln!(out)?;
            } else {
                writeln!(out, "{tail}")?;
                eprintln!(
                    "\n[{} prompt tokens in {:.0} ms ({:.1} t/s), {} generated ({:.1} t/s), finish: {finish_reason}]",
                    prompt_ids.len(),
                    prompt_s * 1e3,
                    prompt_ids.len() as f64 / prompt_s,
                    ids.len(),
                    decode_tps
                );
                if speculator.is_some() {
                    eprintln!(
                        "[speculative: {} drafted, {} accepted ({:.1}%), {} verification steps]",
                        spec_stats.drafted,
                        spec_stats.accepted,
                        100.0 * spec_stats.acceptance(),
                        spec_stats.steps
                    );
                }
            }
        }
        Cmd::Perplexity {
            model,
            file,
            ctx,
            chunks,
            threads,
            n_gpu_layers,
            run,
        } => {
            let opts = run.options(threads.unwrap_or_else(default_threads), n_gpu_layers);
            let l = ModelFile::open(&model)?.load_with(&opts, ContextSize::single(ctx))?;
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let mut tokens = l.tokenizer.encode(&text, true, false);
            let bos = l.tokenizer.bos().filter(|_| l.tokenizer.add_bos());
            if tokens.len() < 2 * ctx {
                anyhow::bail!(
                    "{} tokenizes to {} tokens; perplexity with -c {ctx} needs at least {}",
                    file.display(),
                    tokens.len(),
                    2 * ctx
                );
            }
            if chunks > 0 {
                tokens.truncate(chunks * ctx);
            }
            let mut runner = Runner::with_pool(l.model.clone(), ThreadPool::for_run(&opts)?, ctx);
            eprintln!(
                "perplexity: {} tokens, {} chunks of {ctx}",
                tokens.len(),
                tokens.len() / ctx
            );
            let (ppl, running) = runner.perplexity(&tokens, ctx, bos)?;
            let progress: Vec<String> = running
                .iter()
                .enumerate()
                .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
                .collect();
            writeln!(out, "{}", progress.join(","))?;
            writeln!(out, "PPL = {ppl:.4}")?;
        }
        Cmd::Synth {
            shape,
            quant,
            output,
            tokenizer_from,
            seed,
            pad_vocab,
            layers,
            scale_down,
        } => {
            synth(
                &mut out,
                &shape,
                quant.as_deref(),
                &output,
                tokenizer_from,
                seed,
                pad_vocab,
                layers,
                scale_down,
            )?;
        }
        Cmd::Inspect {
            model,
            json,
            numa: true,
            numa_mode,
            numa_weights,
            threads,
            ..
        } => {
            let threads = threads.unwrap_or_else(default_threads);
            let report = numa_report(&model, numa_mode, numa_weights, threads)?;
            if json {
                serde_json::to_writer_pretty(&mut out, &report)?;
                writeln!(out)?;
            } else {
                numa_text(&mut out, &report)?;
            }
        }
        Cmd::Inspect {
            model, json, full, ..
        } => {
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

#[allow(clippy::too_many_arguments)]
fn synth(
    out: &mut impl Write,
    shape: &str,
    quant: Option<&str>,
    output: &std::path::Path,
    tokenizer_from: Option<String>,
    seed: u64,
    pad_vocab: bool,
    layers: Option<usize>,
    scale_down: Option<usize>,
) -> Result<()> {
    let mut shape = synth::Shape::named(shape)?;
    let quant = match quant {
        Some(q) => synth::SynthQuant::parse(q)?,
        None => shape.default_quant(),
    };
    if let Some(div) = scale_down {
        shape = shape.scaled_down(div);
    }
    if let Some(n) = layers {
        shape = shape.with_layers(n);
    }
    shape.validate(quant)?;
    let tok_name = tokenizer_from.unwrap_or_else(|| shape.tokenizer_from.to_string());
    let tok_path = registry::resolve(&tok_name)?;
    let tok = GgufFile::open(&tok_path)
        .with_context(|| format!("loading the tokenizer source {}", tok_path.display()))?;
    let spec = synth::SynthSpec {
        shape,
        quant,
        seed,
        tokenizer: &tok,
        tokenizer_name: tok_name,
        pad_vocab,
    };
    let (n_vocab, source_vocab) = (spec.n_vocab()?, spec.source_vocab()?);
    let padded = if n_vocab > source_vocab {
        format!(", padded from {source_vocab}")
    } else {
        String::new()
    };
    eprintln!(
        "synth: {} {} (vocabulary {n_vocab} from {}{padded}) -> {}",
        spec.shape.display_name(),
        quant.name(),
        spec.tokenizer_name,
        output.display()
    );
    let mut next_report = 0u64;
    let report = synth::synthesize(&spec, output, |done, total| {
        if done >= next_report || done == total {
            eprint!(
                "\r  {:>5.1}% of {}",
                done as f64 * 100.0 / total as f64,
                human_bytes(total)
            );
            next_report = done + total / 50;
            if done == total {
                eprintln!();
            }
        }
    })?;
    let types: Vec<String> = report
        .type_counts
        .iter()
        .map(|(t, n)| format!("{t}: {n}"))
        .collect();
    writeln!(
        out,
        "wrote {}: {} ({} bytes), {} tensors ({}), {:.2} B parameters, vocabulary {}, in {:.1} s",
        report.path.display(),
        human_bytes(report.file_bytes),
        report.file_bytes,
        report.n_tensors,
        types.join(", "),
        report.n_params as f64 / 1e9,
        report.n_vocab,
        report.elapsed.as_secs_f64()
    )?;
    Ok(())
}

/// `inspect --numa`: the topology, the thread plan and what the threads report, and the
/// weight pages per node after an 8-token prompt ran on those threads.
fn numa_report(
    model: &str,
    mode: Option<NumaMode>,
    weights: WeightPlacement,
    threads: usize,
) -> Result<serde_json::Value> {
    let topo = numa::Topology::read()?;
    let opts = RunOptions {
        threads,
        numa: mode,
        weights,
        ..RunOptions::default()
    };
    let l = ModelFile::open(model)?.load_with(&opts, ContextSize::single(64))?;
    let pool = ThreadPool::for_run(&opts)?;
    let observed = pool.observe();
    let mut runner = Runner::with_pool(l.model.clone(), pool, 64);
    let toks: Vec<u32> = (0..8u32).map(|i| 100 + i).collect();
    runner.feed(&toks, true)?;
    let pages = l.model.weight_pages();
    let nodes: Vec<serde_json::Value> = topo
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "id": n.id, "cpus": numa::format_list(&n.cpus), "distances": n.distances,
                "mem_total_kib": n.mem_total_kib, "mem_free_kib": n.mem_free_kib,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "model": l.path.display().to_string(),
        "nodes": nodes,
        "allowed_cpus": numa::format_list(&topo.allowed_cpus),
        "allowed_mems": numa::format_list(&topo.allowed_mems),
        "policy_mems": topo.policy_mems.as_deref().map(numa::format_list),
        "mode": mode.map(|m| m.name()),
        "weights": weights.name(),
        "threads": threads,
        "thread_plan": runner.pool.thread_plan().map(|p| serde_json::json!({
            "cpus": p.cpus, "nodes": p.nodes,
        })),
        "observed": observed.iter().map(|(c, n)| serde_json::json!({"cpu": c, "node": n})).collect::<Vec<_>>(),
        "weight_bytes": l.model.weight_bytes(),
        "weight_pages": pages.iter().map(|(n, p)| {
            let mut v = p.to_json();
            v["copy_node"] = serde_json::json!(n);
            v["summary"] = serde_json::json!(p.summary());
            v
        }).collect::<Vec<_>>(),
    }))
}

fn numa_text(out: &mut impl Write, r: &serde_json::Value) -> Result<()> {
    writeln!(out, "model:        {}", r["model"].as_str().unwrap_or(""))?;
    writeln!(
        out,
        "allowed:      CPUs {}, memory nodes {}{}",
        r["allowed_cpus"].as_str().unwrap_or(""),
        r["allowed_mems"].as_str().unwrap_or(""),
        r["policy_mems"]
            .as_str()
            .map_or(String::new(), |p| format!(" (memory policy: nodes {p})"))
    )?;
    for n in r["nodes"].as_array().into_iter().flatten() {
        writeln!(
            out,
            "node {}:       CPUs {:<12} distances {}  memory {} MiB ({} MiB free)",
            n["id"],
            n["cpus"].as_str().unwrap_or(""),
            n["distances"],
            n["mem_total_kib"]
                .as_u64()
                .map_or("?".into(), |k| (k >> 10).to_string()),
            n["mem_free_kib"]
                .as_u64()
                .map_or("?".into(), |k| (k >> 10).to_string()),
        )?;
    }
    writeln!(
        out,
        "threads:      {} (--numa {}), plan {}",
        r["threads"],
        r["mode"].as_str().unwrap_or("(none)"),
        r["thread_plan"]
    )?;
    let obs: Vec<String> = r["observed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| format!("cpu {} node {}", o["cpu"], o["node"]))
        .collect();
    writeln!(out, "observed:     {}", obs.join(", "))?;
    writeln!(out, "weights:      {}", r["weights"].as_str().unwrap_or(""))?;
    for p in r["weight_pages"].as_array().into_iter().flatten() {
        let copy = match p["copy_node"].as_u64() {
            Some(n) => format!("copy on node {n}"),
            None => "pages".into(),
        };
        writeln!(out, "  {copy}: {}", p["summary"].as_str().unwrap_or(""))?;
    }
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
        "synthetic": synth::is_synthetic(f),
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
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
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
    if synth::is_synthetic(f) {
        writeln!(
            out,
            "synthetic:    yes, random weights ({} = true): the text is meaningless, the speed is real",
            synth::SYNTHETIC_KEY
        )?;
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
