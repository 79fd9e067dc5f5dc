//! The Anthropic Messages and OpenAI Responses APIs, and the real client libraries.
//!
//! `tools/client_check.py` drives a keyed server with the `openai` and `anthropic` Python
//! packages (chat with tools, Responses with streaming and `previous_response_id`,
//! Messages with streaming, tool use, structured output, count_tokens and errors):
//! qwen2.5-coder-0.5b, whose template has tools, calls under `auto`; smollm2, whose
//! template has none, calls when forced. Without the packages these tests skip, unless
//! `RSERVE_CLIENTS_REQUIRED=1` (CI), where that is a failure.
//!
//! The HTTP tests below check what the libraries do not: the raw event sequences, the
//! error shapes per route, one outcome per request in /metrics, and that a stored
//! response belongs to its key.

mod common;

use common::*;
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
    if tools {
        cmd.arg("--tools");
    }
    let out = cmd.output().expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "client checks failed:\n{text}");
    assert!(text.contains("10/10 checks passed"), "{text}");
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
