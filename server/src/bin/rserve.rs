//! `rserve`: the OpenAI-compatible server. A thin binary: flags to `ServerConfig`, then
//! `server::start` and wait for SIGINT / SIGTERM (which drains in-flight requests).

use std::time::Duration;

use clap::Parser;
use server::engine::EngineConfig;
use server::ServerConfig;

#[derive(Parser, Debug)]
#[command(
    name = "rserve",
    version,
    about = "Continuous-batching OpenAI-compatible server (completions, chat, SSE streaming)"
)]
struct Args {
    /// Model: a registry name (e.g. smollm2-135m) or a GGUF path. Repeat it to serve
    /// several: the request's `model` chooses (the first when it names none), each loads on
    /// first use and the least recently used are unloaded under --models-memory.
    #[arg(short = 'm', long)]
    model: Vec<String>,
    /// Serve every `.gguf` file of this directory (as several -m, in name order; a model
    /// is named by its file's stem).
    #[arg(long)]
    models_dir: Option<std::path::PathBuf>,
    /// With several models: the most memory (weights + KV cache, e.g. 6G) loaded at once;
    /// loading one more unloads the least recently used that no request is using, and a
    /// request waits (up to --model-load-timeout) while every loaded model is in use.
    #[arg(long, value_parser = parse_size)]
    models_memory: Option<u64>,
    /// With several models: seconds a request waits for its model to load (or for room to
    /// load it) before a 503.
    #[arg(long, default_value_t = 300.0)]
    model_load_timeout: f64,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Compute threads (including the engine thread); default: the CPUs this process may
    /// use.
    #[arg(short = 't', long)]
    threads: Option<usize>,
    #[command(flatten)]
    run: runtime::options::RunArgs,
    #[command(flatten)]
    spec: runtime::speculative::SpecArgs,
    /// Speculative decoding pauses while this many sequences or more are running (a full
    /// batch is compute-bound: drafts would take compute from other sequences' tokens).
    #[arg(long = "spec-max-running", default_value_t = 8)]
    spec_max_running: usize,
    /// Per-sequence context (prompt + generated tokens); default: min(training context, 4096).
    #[arg(short = 'c', long = "ctx-size")]
    ctx_size: Option<usize>,
    /// Most sequences decoded together (also `-np`).
    #[arg(long = "parallel", default_value_t = 8)]
    parallel: usize,
    /// Token budget of one step: decode tokens first, prompt chunks fill the rest.
    #[arg(long, default_value_t = 512)]
    max_batch_tokens: usize,
    /// KV cache size in blocks of 16 tokens (overrides --kv-mem).
    #[arg(long)]
    kv_blocks: Option<usize>,
    /// KV cache memory, e.g. 512M or 2G; default: room for --parallel full contexts,
    /// capped at 40% of available memory.
    #[arg(long, value_parser = parse_size)]
    kv_mem: Option<u64>,
    /// Requests that may wait for admission; beyond this, 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue_size: usize,
    /// Compute each prompt in one step instead of chunks (for comparison).
    #[arg(long)]
    no_chunked_prefill: bool,
    /// Disable sharing of cached prompt prefixes.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Seconds shutdown waits for in-flight requests before ending them.
    #[arg(long, default_value_t = 60)]
    drain_timeout: u64,
    /// Require this API key (`Authorization: Bearer KEY`) on every route but /health and
    /// /metrics. A key on the command line is visible to every local user (in
    /// /proc/PID/cmdline): prefer the RSERVE_API_KEY environment variable or --api-keys.
    #[arg(
        long,
        env = "RSERVE_API_KEY",
        hide_env_values = true,
        conflicts_with = "api_keys"
    )]
    api_key: Option<String>,
    /// A file of API keys, one per line: `LABEL KEY` (or `KEY`); labels use A-Z a-z 0-9
    /// _ . -. Each key is a tenant: tenants never share cached prefix blocks, and /metrics
    /// shows KV use per label. The key labelled `admin` may flush every tenant's prefix
    /// cache and read /metrics.
    #[arg(long, env = "RSERVE_API_KEYS")]
    api_keys: Option<std::path::PathBuf>,
    /// A key for /metrics (`Authorization: Bearer KEY`). With API keys configured,
    /// /metrics needs this key or the admin key; without, /metrics is open unless this is
    /// set. Prefer the RSERVE_METRICS_KEY environment variable (the command line is
    /// visible to other users).
    #[arg(long, env = "RSERVE_METRICS_KEY", hide_env_values = true)]
    metrics_key: Option<String>,
    /// Seconds a client has to send a request's headers; also the longest a kept-alive
    /// connection may stay idle between requests.
    #[arg(long, default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client has to send a request's body.
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Most connections open at once; beyond it a new connection gets a 503 at once. Kept
    /// below the open-file limit (`ulimit -n`) with room for the engine's files.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// A host name a keyless server answers to besides loopback names and IP addresses
    /// (repeatable); other `Host` headers get a 403, against DNS rebinding.
    #[arg(long = "allowed-host")]
    allowed_hosts: Vec<String>,
    /// Responses API: how many responses are kept in memory for `previous_response_id`
    /// (each keeps its whole conversation; the oldest are evicted first, and all of them
    /// together are held to 64 MiB). A request for an evicted response gets a 404. 0 keeps
    /// none.
    #[arg(long, default_value_t = server::http::DEFAULT_RESPONSES_STORE)]
    responses_store: usize,
    /// Keep the prefix cache in this directory across restarts: cached blocks are loaded
    /// at start and written on shutdown and while running (keyed by the model file's
    /// SHA-256 and the KV layout; damaged files are skipped).
    #[arg(long, conflicts_with = "no_prefix_cache")]
    kv_persist: Option<std::path::PathBuf>,
    /// With --kv-persist: write new blocks at least this often (seconds).
    #[arg(long, default_value_t = 30.0)]
    kv_persist_interval: f64,
    /// With --kv-persist: ... or as soon as this many new blocks are cached.
    #[arg(long, default_value_t = 256)]
    kv_persist_blocks: usize,
    /// With --kv-persist: disk budget (e.g. 2G); the oldest files are deleted first.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    kv_persist_max: u64,
    /// A Jinja chat template to use instead of the model's (llama-server's flag); the
    /// model's BOS and EOS texts are still passed to it.
    #[arg(long)]
    chat_template_file: Option<std::path::PathBuf>,
    /// How /v1/embeddings pools an input's hidden states (after the final norm) into one
    /// vector: mean, cls, last or none; the default is the file's `pooling_type`
    /// (embedding models name one; a file without it refuses /v1/embeddings unless this is
    /// given). Vectors are L2-normalized.
    #[arg(long, value_parser = parse_pooling)]
    pooling: Option<runtime::model::Pooling>,
    /// Layers to run on a ggml device (`-ngl`, as llama.cpp): the last N layers, with their
    /// KV cache on the device; above the layer count the output layer too.
    #[arg(long = "n-gpu-layers", default_value_t = 0)]
    n_gpu_layers: usize,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        x if x.ends_with('k') => (x[..x.len() - 1].to_string(), 1u64 << 10),
        x if x.ends_with('m') => (x[..x.len() - 1].to_string(), 1 << 20),
        x if x.ends_with('g') => (x[..x.len() - 1].to_string(), 1 << 30),
        x => (x.to_string(), 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?} (use e.g. 512M or 2G)"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("size must be positive: {s:?}"));
    }
    Ok((v * mult as f64) as u64)
}

fn main() {
    runtime::options::init();
    // llama.cpp spells these flags `-np`, `-ngl`, `-dev` and `-ncmoe`.
    let argv = std::env::args().map(runtime::options::llama_flag_spelling);
    let a = Args::parse_from(argv);
    // Continuous batches change shape every step; ggml-cuda's CUDA-graph replay failed
    // under that load (runtime::offload::cuda_graphs_policy). Applied now, while this is
    // the only thread (it may set an environment variable).
    let _ = runtime::offload::cuda_graphs_policy(false);
    if a.parallel == 0 || a.queue_size == 0 || a.max_batch_tokens == 0 {
        eprintln!("rserve: --parallel, --queue-size and --max-batch-tokens must be at least 1");
        std::process::exit(2);
    }
    let keys = match (&a.api_key, &a.api_keys) {
        (Some(k), _) => Some(server::tenant::ApiKeys::single(k)),
        (None, Some(f)) => Some(server::tenant::ApiKeys::from_file(f)),
        (None, None) => None,
    }
    .transpose()
    .unwrap_or_else(|e| {
        eprintln!("rserve: {e}");
        std::process::exit(2);
    });
    let chat_template = a.chat_template_file.as_ref().map(|p| {
        std::fs::read_to_string(p).unwrap_or_else(|e| {
            eprintln!("rserve: --chat-template-file {}: {e}", p.display());
            std::process::exit(2);
        })
    });
    let mut models = a.model.clone();
    if let Some(dir) = &a.models_dir {
        match server::models::models_in_dir(dir) {
            Ok(v) if !v.is_empty() => {
                models.extend(v.iter().map(|p| p.to_string_lossy().into_owned()))
            }
            Ok(_) => {
                eprintln!("rserve: --models-dir {}: no .gguf files", dir.display());
                std::process::exit(2);
            }
            Err(e) => {
                eprintln!("rserve: --models-dir {}: {e}", dir.display());
                std::process::exit(2);
            }
        }
    }
    if models.is_empty() {
        models.push("smollm2-135m".into());
    }
    let mut ids = std::collections::HashSet::new();
    for m in &models {
        if !ids.insert(server::models::model_id(m)) {
            eprintln!(
                "rserve: two models are named {:?}",
                server::models::model_id(m)
            );
            std::process::exit(2);
        }
    }
    if models.len() > 1 && a.kv_persist.is_some() {
        eprintln!("rserve: --kv-persist serves one model; give one -m with it");
        std::process::exit(2);
    }
    let spec = match a.spec.resolve() {
        Err(e) => {
            eprintln!("rserve: {e}");
            std::process::exit(2);
        }
        Ok((runtime::speculative::SpecMode::Off, _)) => None,
        Ok((_, params)) => Some(server::engine::SpecConfig {
            params,
            draft_model: a.spec.model_draft.clone(),
            max_running: a.spec_max_running,
        }),
    };
    if models.len() > 1 && a.spec.model_draft.is_some() {
        eprintln!("rserve: --model-draft drafts for one model; give one -m with it");
        std::process::exit(2);
    }
    let first = models.remove(0);
    let cfg = ServerConfig {
        host: a.host,
        port: a.port,
        engine: EngineConfig {
            model: first,
            run: a.run.options(
                a.threads.unwrap_or_else(runtime::options::default_threads),
                a.n_gpu_layers,
            ),
            n_ctx: a.ctx_size,
            max_seqs: a.parallel,
            max_batch_tokens: a.max_batch_tokens,
            kv_blocks: a.kv_blocks,
            kv_mem_bytes: a.kv_mem,
            queue_size: a.queue_size,
            chunked_prefill: !a.no_chunked_prefill,
            prefix_caching: !a.no_prefix_cache,
            kv_persist: a.kv_persist.map(|dir| server::persist::PersistConfig {
                dir,
                interval: Duration::from_secs_f64(a.kv_persist_interval.clamp(0.0, 1e9)),
                every_blocks: a.kv_persist_blocks.max(1),
                max_bytes: a.kv_persist_max,
            }),
            chat_template,
            pooling: a.pooling,
            spec,
        },
        max_body_bytes: a.max_body,
        drain_timeout: Duration::from_secs(a.drain_timeout),
        handle_signals: true,
        api_keys: keys.map(std::sync::Arc::new),
        metrics_key: a.metrics_key.filter(|k| !k.trim().is_empty()),
        header_timeout: Duration::from_secs_f64(a.header_timeout.clamp(0.1, 3600.0)),
        body_timeout: Duration::from_secs_f64(a.body_timeout.clamp(0.1, 3600.0)),
        max_connections: Some(a.max_connections.max(1)),
        allowed_hosts: a.allowed_hosts,
        responses_store: a.responses_store,
        models,
        models_memory: a.models_memory,
        model_load_timeout: Duration::from_secs_f64(a.model_load_timeout.clamp(1.0, 86400.0)),
        ..ServerConfig::default()
    };
    let srv = match server::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rserve: {e:#}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "rserve: listening on {} (/health is 503 until the model is loaded)",
        srv.url()
    );
    let failed = srv.wait_ready(Duration::from_secs(3600)).err();
    if let Some(e) = &failed {
        eprintln!("rserve: {e:#}");
        srv.begin_shutdown();
    }
    srv.join();
    if failed.is_some() {
        std::process::exit(1);
    }
}

fn parse_pooling(s: &str) -> Result<runtime::model::Pooling, String> {
    runtime::model::Pooling::parse(s).ok_or_else(|| format!("{s:?}: give mean, cls, last or none"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("lots").is_err());
    }
}
