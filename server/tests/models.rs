//! Several models in one server: three real models under a memory budget that holds two
//! of them, requests interleaved across all three at concurrency 8: every request
//! succeeds (a model unloaded while in use would end its requests with an error), models
//! are loaded and unloaded (counted in /metrics), /v1/models lists each with its state,
//! and an unknown model is OpenAI's 404 `model_not_found`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

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
