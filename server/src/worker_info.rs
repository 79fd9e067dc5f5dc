//! What a router asks a worker before and while it routes to it: SGLang's worker protocol
//! as `sglang-router` speaks it (`/server_info` and `/model_info` when it registers a
//! worker, falling back to the older `/get_server_info` and `/get_model_info`; `/get_load`
//! every few seconds for its load-based policies; `POST /flush_cache`). The bodies carry
//! the fields a router reads and the truth about this server; none is invented to look
//! like an SGLang server.
//!
//! `model_path` is the GGUF file's absolute path, never a bare name: a router that cannot
//! read the file's tokenizer says so and routes on text, where a bare name would send it
//! to fetch a tokenizer from a model hub. A worker serves one model to a router: with
//! several `-m`, these describe the first.

use serde_json::{json, Value};

use crate::engine::{EngineConfig, ServedModel, BLOCK_SIZE};
use crate::metrics::Metrics;

/// The model file's absolute path (a relative `-m` is resolved against the working
/// directory, as the server opened it).
fn model_path(m: &ServedModel) -> std::path::PathBuf {
    std::path::absolute(&m.path).unwrap_or_else(|_| m.path.clone())
}

/// `/server_info`: the model and how this server is sized.
pub fn server_info(m: &ServedModel, cfg: &EngineConfig) -> Value {
    json!({
        "model_path": model_path(m),
        "served_model_name": m.id,
        "engine": "rserve",
        "version": env!("CARGO_PKG_VERSION"),
        "dp_size": 1,
        "tp_size": 1,
        "context_length": m.n_ctx,
        "max_running_requests": m.sizing.max_seqs,
        "max_total_num_tokens": m.sizing.kv_tokens,
        "chunked_prefill_size": if cfg.chunked_prefill { cfg.max_batch_tokens as i64 } else { -1 },
        "page_size": BLOCK_SIZE,
        "disable_radix_cache": !cfg.prefix_caching,
        "max_queued_requests": cfg.queue_size,
    })
}

/// `/model_info`: what the model is.
pub fn model_info(m: &ServedModel) -> Value {
    json!({
        "model_path": model_path(m),
        "served_model_name": m.id,
        "is_generation": true,
        "context_length": m.n_ctx,
        "vocab_size": m.n_vocab,
        "hidden_size": m.n_embd,
    })
}

/// `/get_load`: one entry (one data-parallel rank), counted as SGLang counts: the
/// requests running or waiting (admitted and not, as `--queue-size` bounds them), those
/// waiting, and the tokens the KV cache holds for them. `queued`: accepted and not yet
/// admitted (the engine's count, which the metrics snapshot does not hold).
pub fn load(m: &Metrics, queued: usize) -> Value {
    let waiting = m.waiting + queued;
    json!([{
        "dp_rank": 0,
        "num_reqs": m.running + waiting,
        "num_waiting_reqs": waiting,
        "num_tokens": m.kv_blocks_used * BLOCK_SIZE,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_counts_waiting_and_queued_requests() {
        let m = Metrics {
            running: 3,
            waiting: 2,
            kv_blocks_used: 10,
            ..Metrics::default()
        };
        let v = load(&m, 4);
        assert_eq!(v[0]["num_reqs"], 9);
        assert_eq!(v[0]["num_waiting_reqs"], 6);
        assert_eq!(v[0]["num_tokens"], 10 * BLOCK_SIZE);
        assert_eq!(v[0]["dp_rank"], 0);
    }
}
