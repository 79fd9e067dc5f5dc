//! The APIs beyond OpenAI chat and completions, and the real client libraries.
//!
//! - `tools/client_check.py` drives a keyed server with the `openai` and `anthropic` Python
//!   packages (chat with tools, Responses with streaming and `previous_response_id`,
//!   Messages with streaming, tool use, structured output, count_tokens and errors):
//!   qwen2.5-coder-0.5b, whose template has tools, calls under `auto`; smollm2, whose
//!   template has none, calls when forced (its run is the tool checks only). Without the
//!   packages these tests skip, unless `RSERVE_CLIENTS_REQUIRED=1` (CI), where that is a
//!   failure. The HTTP test checks what the libraries do not: the raw event sequences,
//!   the error shapes per route, one count per request in /metrics, and that a stored
//!   response belongs to its key.
//! - `/v1/embeddings` against llama.cpp's own pooled embeddings (`llama_get_embeddings_seq`
//!   on a context with `embeddings` on, the same pooling), L2-normalized as llama-server
//!   returns them: cosine >= 0.999 for every input, per model and pooling: smollm2 mean,
//!   qwen2.5-coder-0.5b last token (as Qwen3-Embedding pools) read from the file's own
//!   `pooling_type` (a copy of the file with the key added), gemma3 CLS; all inputs in
//!   one request, beside a generation request.
//! - Several models in one server: three real models under a memory budget that holds
//!   two, requests interleaved across all three at concurrency 8: every request succeeds
//!   (a model unloaded while in use would end its requests with an error), models are
//!   loaded and unloaded (counted in /metrics), /v1/models lists each with its state, and
//!   an unknown model is OpenAI's 404 `model_not_found`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use runtime::gguf::{GgufFile, Value as GVal};
use serde_json::{json, Value};

fn clients_available() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("RSERVE_CLIENTS_REQUIRED").as_deref() != Ok("1"),
            "RSERVE_CLIENTS_REQUIRED=1 but python3 cannot import openai and anthropic"
        );
        eprintln!("skipping: python3 cannot import openai and anthropic");
    }
    ok
}

fn keys(dir: &std::path::Path) -> server::tenant::ApiKeys {
    let f = dir.join("keys");
    std::fs::write(&f, "alice sk-alice\nbob sk-bob\nadmin sk-admin\n").unwrap();
    server::tenant::ApiKeys::from_file(&f).unwrap()
}

fn run_script(model: &str, tools: bool) {
    if !model_available() || !clients_available() {
        return;
    }
    let _g = serial();
    runtime::registry::resolve(model).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let srv = start_with_keys(
        server::engine::EngineConfig {
            model: model.into(),
            ..engine_config()
        },
        Some(keys(dir.path())),
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/client_check.py");
    let mut cmd = std::process::Command::new("python3");
    cmd.args([
        script,
        "--url",
        &srv.url(),
        "--key",
        "sk-alice",
        "--model",
        model,
    ]);
    // The model without tools in its template runs the checks that make (forced) calls;
    // the others do not depend on the model.
    cmd.arg(if tools { "--tools" } else { "--tool-checks" });
    let out = cmd.output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "client checks failed:\n{text}");
    let want = if tools {
        "10/10 checks passed"
    } else {
        "4/4 checks passed"
    };
    assert!(text.contains(want), "{text}");
}

#[test]
fn real_clients_against_qwen_with_its_tool_template() {
    run_script("qwen2.5-coder-0.5b", true);
}

#[test]
fn real_clients_against_smollm2_with_forced_calls() {
    run_script(MODEL, false);
}

/// The `event:` names of an SSE response, and each event's data.
fn events(r: &Resp) -> Vec<(String, Value)> {
    let text = r.text();
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let name = b
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or_default();
            let data = b.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn post_key(addr: std::net::SocketAddr, path: &str, key: &str, body: &Value) -> Resp {
    raw(
        addr,
        path,
        key,
        "application/json",
        body.to_string().as_bytes(),
    )
}

fn raw(addr: std::net::SocketAddr, path: &str, key: &str, ty: &str, body: &[u8]) -> Resp {
    let h = [("x-api-key", key), ("Content-Type", ty)];
    request_with(
        addr,
        "POST",
        path,
        Some(body),
        &h,
        std::time::Duration::from_secs(120),
    )
    .unwrap()
}

fn received(addr: std::net::SocketAddr) -> f64 {
    let h = [("x-api-key", "sk-admin")];
    let m = request_with(
        addr,
        "GET",
        "/metrics",
        None,
        &h,
        std::time::Duration::from_secs(10),
    )
    .unwrap()
    .text();
    server::metrics::parse_sample(&m, "rserve_requests_received_total").unwrap()
}

#[test]
fn messages_and_responses_over_http() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let srv = start_with_keys(engine_config(), Some(keys(dir.path())));
    let a = srv.addr;
    let before = received(a);

    // Anthropic, streamed: message_start, ping, one text block, message_delta with the stop
    // reason and usage, message_stop; the named stop sequence ends it.
    let body = json!({"model": MODEL, "max_tokens": 40, "stream": true, "temperature": 0,
        "messages": [{"role": "user", "content": "Count from 1 to 9, separated by spaces."}]});
    let r = post_key(a, "/v1/messages", "sk-alice", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let ev = events(&r);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"],
        "{names:?}"
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    for (n, d) in &ev {
        assert_eq!(d["type"], n.as_str(), "each event's data names its type");
    }
    let text: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    let delta = &ev[ev.len() - 2].1;
    assert!(
        delta["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{delta}"
    );
    // Two characters from the middle of that answer end the same request early.
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 6, "{text:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let stop = stop.as_str();
    let mut b2 = body.clone();
    b2["stream"] = json!(false);
    b2["stop_sequences"] = json!([stop]);
    let r = post_key(a, "/v1/messages", "sk-alice", &b2).json();
    assert_eq!(r["stop_reason"], "stop_sequence", "{r}");
    assert_eq!(r["stop_sequence"], stop);
    assert!(
        !r["content"][0]["text"].as_str().unwrap().contains(stop),
        "{r}"
    );

    // Errors in Anthropic's shape on its routes (also the ones refused before routing),
    // OpenAI's on the others.
    let e = post_key(a, "/v1/messages", "sk-alice", &json!({"messages": []}));
    assert_eq!(e.status, 400);
    assert_eq!(e.json()["type"], "error");
    assert_eq!(e.json()["error"]["type"], "invalid_request_error");
    let e = post_key(a, "/v1/messages/count_tokens", "nope", &json!({}));
    assert_eq!(
        (e.status, e.json()["error"]["type"].clone()),
        (401, json!("authentication_error"))
    );
    let e = raw(a, "/v1/messages", "sk-alice", "text/plain", b"{}");
    assert_eq!(
        (e.status, e.json()["error"]["type"].clone()),
        (415, json!("invalid_request_error"))
    );
    let e = post_key(a, "/v1/responses", "sk-alice", &json!({"input": 7}));
    assert_eq!(
        (e.status, e.json()["error"]["param"].clone()),
        (400, json!("input"))
    );
    let n = post_key(
        a,
        "/v1/messages/count_tokens",
        "sk-alice",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert!(
        n.json()["input_tokens"].as_u64().unwrap() > 1,
        "{}",
        n.text()
    );

    // Responses, streamed: sequence numbers in order, created first, completed or
    // incomplete last, the text deltas adding up to the final output text.
    let r = post_key(
        a,
        "/v1/responses",
        "sk-alice",
        &json!({"input": "Say hello.", "max_output_tokens": 12, "stream": true, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ev = events(&r);
    for (k, (n, d)) in ev.iter().enumerate() {
        assert_eq!(d["sequence_number"], k, "{n}");
        assert_eq!(d["type"], n.as_str());
    }
    assert_eq!(ev[0].0, "response.created");
    let (last, fin) = ev.last().unwrap();
    assert!(
        last == "response.completed" || last == "response.incomplete",
        "{last}"
    );
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let id = fin["response"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        fin["response"]["output"][0]["content"][0]["text"],
        deltas.as_str()
    );

    // The stored response continues for its own key only.
    let more = json!({"input": "And again.", "previous_response_id": id, "max_output_tokens": 4});
    assert_eq!(post_key(a, "/v1/responses", "sk-alice", &more).status, 200);
    let e = post_key(a, "/v1/responses", "sk-bob", &more);
    assert_eq!(
        (e.status, e.json()["error"]["param"].clone()),
        (404, json!("previous_response_id"))
    );

    // Every generation request counted, whatever its API (count_tokens is none): 4
    // answered here, 4 refused.
    assert_eq!(received(a) - before, 8.0);
}

const TEXTS: [&str; 6] = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "fn main() { println!(\"hello\"); }",
    "Embeddings map text to vectors so that similar texts lie close together.",
    "零点五",
    "a",
];

/// A copy of `src` with `{arch}.pooling_type` set to `pooling`.
fn with_pooling(src: &std::path::Path, dir: &std::path::Path, pooling: u32) -> std::path::PathBuf {
    let f = GgufFile::open(src).unwrap();
    let arch = match f.get_str("general.architecture").unwrap() {
        Some(a) => a.to_string(),
        None => panic!("no architecture"),
    };
    let mut meta = f.metadata.clone();
    meta.push((format!("{arch}.pooling_type"), GVal::U32(pooling)));
    let tensors: Vec<runtime::gguf::writer::WriteTensor> = f
        .tensors
        .iter()
        .map(|t| runtime::gguf::writer::WriteTensor {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ty: t.ty,
            data: f.tensor_data(t),
        })
        .collect();
    let out = dir.join("embed.gguf");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
    runtime::gguf::writer::write(&mut w, &meta, &tensors).unwrap();
    out
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let n = |v: &[f32]| v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Serves `model` (pooling from the file unless `pooling` is given), embeds TEXTS in one
/// request while a generation runs beside it, and compares with llama.cpp.
fn compare(
    name: &str,
    model: &std::path::Path,
    pooling: Option<runtime::model::Pooling>,
    llama_id: i32,
) {
    let srv = start(server::engine::EngineConfig {
        model: model.to_str().unwrap().into(),
        pooling,
        ..engine_config()
    });
    let a = srv.addr;
    let gen = std::thread::spawn(move || {
        post(
            a,
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0}),
        )
    });
    let r = post(a, "/v1/embeddings", &json!({"input": TEXTS}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(gen.join().unwrap().status, 200);
    let tok = runtime::tokenizer::Tokenizer::from_gguf(&GgufFile::open(model).unwrap()).unwrap();
    let mut reference = llamacpp_ref::RefModel::load_embedding(
        model,
        &llamacpp_ref::RefOptions {
            n_ctx: 512,
            n_batch: 512,
            n_ubatch: 512,
            n_threads: 2,
            ..Default::default()
        },
        llama_id,
    )
    .unwrap();
    let mut prompt_tokens = 0;
    for (i, text) in TEXTS.iter().enumerate() {
        let ids = tok.encode(text, true, true);
        prompt_tokens += ids.len();
        let ours: Vec<f32> = v["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let theirs = reference.embed(&ids).unwrap();
        assert_eq!(ours.len(), theirs.len());
        let c = cosine(&ours, &theirs);
        let norm: f64 = ours
            .iter()
            .map(|&x| x as f64 * x as f64)
            .sum::<f64>()
            .sqrt();
        eprintln!(
            "{name}: input {i} ({} tokens): cosine {c:.9}, norm {norm:.6}",
            ids.len()
        );
        assert!(c >= 0.999, "{name}: input {i}: cosine {c}");
        assert!((norm - 1.0).abs() < 1e-4, "L2-normalized: {norm}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    // Mean and last-token vectors tell the inputs apart (a CLS vector of a causal model is
    // its first token's, the same BOS row for every input, in llama.cpp too).
    if llama_id != 2 {
        let e = |i: usize| -> Vec<f32> {
            v["data"][i]["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        for i in 1..TEXTS.len() {
            assert!(
                cosine(&e(0), &e(i)) < 0.99,
                "{name}: inputs 0 and {i} embed alike"
            );
        }
    }
    // base64: the same floats, little-endian.
    let b = post(
        a,
        "/v1/embeddings",
        &json!({"input": TEXTS[0], "encoding_format": "base64"}),
    )
    .json();
    assert!(
        b["data"][0]["embedding"].as_str().unwrap().len() > 100,
        "{b}"
    );
}

#[test]
fn embeddings_agree_with_llamacpp() {
    if !model_available() {
        return;
    }
    let _g = serial();
    use runtime::model::Pooling;
    let dir = tempfile::tempdir().unwrap();
    let smol = runtime::registry::resolve(MODEL).unwrap();
    compare("smollm2 mean", &smol, Some(Pooling::Mean), 1);
    let qwen = runtime::registry::resolve("qwen2.5-coder-0.5b").unwrap();
    compare(
        "qwen2.5 last (file)",
        &with_pooling(&qwen, dir.path(), 3),
        None,
        3,
    );
    let gemma = runtime::registry::resolve("gemma3-270m").unwrap();
    compare("gemma3 cls", &gemma, Some(Pooling::Cls), 2);
}

#[test]
fn embeddings_refuse_what_they_cannot_do() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(engine_config());
    let a = srv.addr;
    // smollm2's file names no pooling: the endpoint says how to get one.
    let r = post(a, "/v1/embeddings", &json!({"input": "x"}));
    assert_eq!(r.status, 400);
    assert!(r.text().contains("--pooling"), "{}", r.text());
    drop(srv);
    let srv = start(server::engine::EngineConfig {
        pooling: Some(runtime::model::Pooling::Last),
        ..engine_config()
    });
    let a = srv.addr;
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [[1, 2], 7]}), "input[1]"),
        (json!({"input": [[1, 999999]]}), "input[0]"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 3}), "dimensions"),
        (json!({"input": "hello ".repeat(2500)}), "input[0]"),
        // More inputs than the queue (64 here) holds: a 400, not a 429 forever.
        (json!({"input": vec!["x"; 65]}), "input"),
    ] {
        let r = post(a, "/v1/embeddings", &body);
        let v: Value = r.json();
        let shown: String = format!("{body}: {v}").chars().take(300).collect();
        assert_eq!(
            (r.status, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{shown}"
        );
    }
    let r = post(a, "/v1/embeddings", &json!({"input": "x", "model": "nope"}));
    assert_eq!(r.status, 404);
    // Token-id inputs give the same vector as their text.
    let tok = post(a, "/tokenize", &json!({"prompt": "hello there"})).json();
    let by_ids = post(a, "/v1/embeddings", &json!({"input": tok["tokens"]})).json();
    let by_text = post(a, "/v1/embeddings", &json!({"input": "hello there"})).json();
    assert_eq!(
        by_ids["data"][0]["embedding"],
        by_text["data"][0]["embedding"]
    );
}

const MODELS: [&str; 3] = [MODEL, "qwen2.5-coder-0.5b", "gemma3-270m"];

fn start_three(budget: u64) -> server::RunningServer {
    let srv = server::start(server::ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        engine: server::engine::EngineConfig {
            n_ctx: Some(1024),
            kv_blocks: Some(128),
            ..engine_config()
        },
        models: MODELS[1..].iter().map(|m| m.to_string()).collect(),
        models_memory: Some(budget),
        model_load_timeout: Duration::from_secs(240),
        ..server::ServerConfig::default()
    })
    .expect("server starts");
    srv.wait_ready(Duration::from_secs(10)).unwrap();
    srv
}

#[test]
fn three_models_under_a_budget_for_two() {
    if !model_available() {
        return;
    }
    let _g = serial();
    for m in MODELS {
        runtime::registry::resolve(m).unwrap();
    }
    // With 128 KV blocks each: smollm2 137 MiB, qwen2.5 487 MiB, gemma3 271 MiB (weights
    // + KV cache). Any two fit in 800 MiB (at most 758), all three (895) do not.
    let srv = start_three(800 << 20);
    let a = srv.addr;
    let h = get(a, "/health");
    assert_eq!(h.status, 200, "{}", h.text());
    let listed = get(a, "/v1/models").json();
    let states: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["unloaded"; 3], "{listed}");

    let sent = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let per_client = 6;
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (sent, ok) = (sent.clone(), ok.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for k in 0..per_client {
                    let model = MODELS[(c + k) % 3];
                    sent.fetch_add(1, Ordering::Relaxed);
                    let body = json!({"model": model, "prompt": format!("Story {c}-{k}:"), "max_tokens": 8, "temperature": 0});
                    let r = request_with(
                        a,
                        "POST",
                        "/v1/completions",
                        Some(body.to_string().as_bytes()),
                        &[("Content-Type", "application/json")],
                        Duration::from_secs(300),
                    );
                    match r {
                        Ok(r) if r.status == 200 && r.json()["model"] == model => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => failures.push(format!("{model}: {} {}", r.status, r.text())),
                        Err(e) => failures.push(format!("{model}: {e}")),
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(ok.load(Ordering::Relaxed), 8 * per_client);

    let m = get(a, "/metrics").text();
    let sample = |name: &str, model: &str| {
        server::metrics::parse_sample(&m, &format!("{name}{{model=\"{model}\"}}"))
            .unwrap_or_else(|| panic!("no {name} for {model} in\n{m}"))
    };
    let loads: f64 = MODELS
        .iter()
        .map(|x| sample("rserve_model_loads_total", x))
        .sum();
    let evictions: f64 = MODELS
        .iter()
        .map(|x| sample("rserve_model_evictions_total", x))
        .sum();
    let loaded: f64 = MODELS
        .iter()
        .map(|x| sample("rserve_model_loaded", x))
        .sum();
    eprintln!("48 requests over 3 models: {loads} loads, {evictions} unloads, {loaded} loaded now");
    assert!(loads >= 3.0 && evictions >= 1.0, "{m}");
    assert_eq!(loads - evictions, loaded);
    assert!(loaded <= 2.0, "never three at once under the budget");
    for x in MODELS {
        assert_eq!(sample("rserve_model_requests_in_use", x), 0.0);
    }
    // The loaded models' own metrics carry their name; every request counted once.
    assert!(m.contains("rserve_requests_total{model="), "{m}");

    // Unknown: 404 model_not_found, naming what is served.
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status, 404);
    let v: Value = r.json();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gemma3-270m"),
        "{v}"
    );
    let m = get(a, "/metrics").text();
    assert_eq!(
        server::metrics::parse_sample(&m, "rserve_requests_unrouted_total"),
        Some(1.0)
    );
}

#[test]
fn more_sequences_than_the_queue_holds_is_a_400() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(server::engine::EngineConfig {
        queue_size: 4,
        ..engine_config()
    });
    let a = srv.addr;
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Hi", "n": 8, "max_tokens": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("--queue-size"), "{}", r.text());
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "Hi", "n": 4, "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
