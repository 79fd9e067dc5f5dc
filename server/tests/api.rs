//! The HTTP API on the real model: endpoint shapes, streaming, stop strings, logprobs,
//! bad input (400/413, never a panic), empty output reported as such, failed loading, and
//! graceful shutdown draining in-flight requests.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn completion(addr: std::net::SocketAddr, body: Value) -> Value {
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn endpoints_streaming_stop_strings_and_logprobs() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;

    assert_eq!(get(a, "/health").json()["status"], "ok");
    let m = get(a, "/v1/models").json();
    assert_eq!(m["data"][0]["id"], MODEL);
    assert_eq!(m["data"][0]["max_model_len"], 2048);

    // Tokenize / detokenize round trip.
    let t = post(
        a,
        "/tokenize",
        &json!({"prompt": "Hello world, this is rserve."}),
    )
    .json();
    let ids = t["tokens"].clone();
    assert_eq!(t["count"], ids.as_array().unwrap().len());
    let d = post(a, "/detokenize", &json!({"tokens": ids})).json();
    assert_eq!(d["prompt"], "Hello world, this is rserve.");

    // Non-streaming completion: shape and usage.
    let prompt = "The three primary colors are";
    let v = completion(
        a,
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let n_prompt = t_count(a, prompt);
    assert_eq!(v["usage"]["prompt_tokens"], n_prompt);
    assert_eq!(v["usage"]["total_tokens"], n_prompt + 12);
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());

    // Streaming gives the same text, then the finish chunk, usage, and [DONE].
    let s = stream_completion(
        a,
        &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(s.text, text);
    assert_eq!(s.finish.as_deref(), Some("length"));
    assert_eq!(s.usage.as_ref().unwrap()["completion_tokens"], 12);

    // Stop strings: the text ends right before the stop string, which never appears,
    // whether streamed or not.
    let cut = text.char_indices().nth(text.chars().count() / 2).unwrap().0;
    let stop: String = text[cut..].chars().take(3).collect();
    let want = &text[..text.find(&stop).unwrap()];
    let v = completion(
        a,
        json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": [stop.clone(), "\u{1F600}"]}),
    );
    assert_eq!(v["choices"][0]["text"], want, "stop {stop:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let s = stream_completion(
        a,
        &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stop": stop, "stream": true}),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!((s.text.as_str(), s.finish.as_deref()), (want, Some("stop")));

    // Logprobs: the chosen token is the greedy top-1, alternatives sorted.
    let v = completion(
        a,
        json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "logprobs": 3}),
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 3);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3);
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-6 && chosen <= 0.0);
    }

    // Chat, non-streaming and streaming (role first, then content, finish, usage).
    let msgs = json!([{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "Name a fruit."}]);
    let r = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let chat_text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let content_lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!content_lp.is_empty() && content_lp[0]["top_logprobs"].as_array().unwrap().len() == 2);
    let mut sse = Sse::open(
        a,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 8, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(sse.status, 200);
    let mut events = Vec::new();
    while let Some(d) = sse.next_data().unwrap() {
        events.push(serde_json::from_str::<Value>(&d).unwrap());
    }
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = events
        .iter()
        .filter_map(|e| e["choices"].get(0)?["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, chat_text);
    let last = events.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(
        last["usage"]["completion_tokens"],
        v["usage"]["completion_tokens"]
    );
    assert!(events.iter().any(|e| e["choices"]
        .get(0)
        .is_some_and(|c| c["finish_reason"].is_string())));

    // Token-id prompts work too, and a repeated prompt reports cached tokens.
    let long = words(120, 3);
    let v1 = completion(
        a,
        json!({"prompt": long, "max_tokens": 2, "temperature": 0}),
    );
    let v2 = completion(
        a,
        json!({"prompt": long, "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(v1["choices"][0]["text"], v2["choices"][0]["text"]);
    let p = v2["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        (p - 1) / 16 * 16,
        "all full blocks but the last token's"
    );
    let ids = post(a, "/tokenize", &json!({"prompt": long})).json()["tokens"].clone();
    let v3 = completion(a, json!({"prompt": ids, "max_tokens": 2, "temperature": 0}));
    assert_eq!(v3["choices"][0]["text"], v1["choices"][0]["text"]);
    srv.shutdown();
}

fn t_count(a: std::net::SocketAddr, prompt: &str) -> u64 {
    post(a, "/tokenize", &json!({"prompt": prompt})).json()["count"]
        .as_u64()
        .unwrap()
}

#[test]
fn bad_input_gets_a_clear_400_or_413_and_the_server_stays_healthy() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let mut cfg = engine_config();
    cfg.n_ctx = Some(512);
    let srv = start(cfg);
    let a = srv.addr;
    let raw = |path: &str, body: &[u8]| {
        request(a, "POST", path, Some(body), Duration::from_secs(60)).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/completions",
            b"{\"prompt\": ".to_vec(),
            400,
            "malformed JSON",
        ),
        (
            "/v1/completions",
            b"not json".to_vec(),
            400,
            "malformed JSON",
        ),
        ("/v1/completions", b"[1, 2]".to_vec(), 400, "invalid"),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": "ten"}"#.to_vec(),
            400,
            "invalid type",
        ),
        (
            "/v1/completions",
            br#"{"prompt": 42}"#.to_vec(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            br#"{}"#.to_vec(),
            400,
            "prompt is required",
        ),
        (
            "/v1/completions",
            br#"{"prompt": ""}"#.to_vec(),
            400,
            "empty",
        ),
        (
            "/v1/completions",
            br#"{"prompt": [99999999]}"#.to_vec(),
            400,
            "token ids",
        ),
        (
            "/v1/completions",
            br#"{"prompt": [-1]}"#.to_vec(),
            400,
            "token ids",
        ),
        (
            "/v1/completions",
            br#"{"prompt": ["a", "b"]}"#.to_vec(),
            400,
            "one prompt",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": -5}"#.to_vec(),
            400,
            "at least 1",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": 0}"#.to_vec(),
            400,
            "at least 1",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": 1e300}"#.to_vec(),
            400,
            "invalid type",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": 9223372036854775807}"#.to_vec(),
            400,
            "context is 512",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "n": 20}"#.to_vec(),
            400,
            "1..=16",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "temperature": -1}"#.to_vec(),
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "temperature": 1e9}"#.to_vec(),
            400,
            "temperature",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "top_p": 1.5}"#.to_vec(),
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "top_k": -3}"#.to_vec(),
            400,
            "top_k",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "presence_penalty": 9}"#.to_vec(),
            400,
            "presence_penalty",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "seed": "abc"}"#.to_vec(),
            400,
            "seed",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "stop": [1, 2]}"#.to_vec(),
            400,
            "stop",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "logprobs": 50}"#.to_vec(),
            400,
            "logprobs",
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "stream": "yes"}"#.to_vec(),
            400,
            "invalid type",
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": "hi"}"#.to_vec(),
            400,
            "messages",
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user"}], "top_logprobs": 3}"#.to_vec(),
            400,
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"content": "x"}]}"#.to_vec(),
            400,
            "role",
        ),
        (
            "/detokenize",
            br#"{"tokens": [-4]}"#.to_vec(),
            400,
            "vocabulary",
        ),
        (
            "/tokenize",
            br#"{"prompt": 5}"#.to_vec(),
            400,
            "invalid type",
        ),
    ];
    for (path, body, status, needle) in &cases {
        let r = raw(path, body);
        assert_eq!(
            r.status,
            *status,
            "{path} {:?}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        let v = r.json();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains(needle)
                || v["error"]["param"]
                    .as_str()
                    .is_some_and(|p| p.contains(needle)),
            "{:?}: message {msg:?} lacks {needle:?}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    // Prompt + max_tokens over the context: both numbers are in the message.
    let prompt = words(300, 1);
    let n = t_count(a, &prompt);
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 400}),
    );
    assert_eq!(r.status, 400);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!("({n} tokens)")) && msg.contains("(400)") && msg.contains("512"),
        "{msg}"
    );
    // A prompt alone over the context.
    let r = post(a, "/v1/completions", &json!({"prompt": words(700, 2)}));
    assert_eq!(r.status, 400);
    assert!(r.text().contains("leaving no room"), "{}", r.text());

    // Oversized body: 413 in the same JSON shape.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(2 << 20));
    let r = raw("/v1/completions", big.as_bytes());
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "payload_too_large");

    // Unknown route and wrong method.
    assert_eq!(get(a, "/v2/nothing").status, 404);
    assert_eq!(get(a, "/v1/completions").status, 405);

    // Still healthy and serving; every rejected generation request was counted.
    assert_eq!(get(a, "/health").status, 200);
    let v = completion(
        a,
        json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let gen_cases = cases.iter().filter(|c| c.0.starts_with("/v1/")).count() as f64;
    assert_eq!(
        metric(a, "rserve_requests_total{outcome=\"invalid\"}"),
        gen_cases + 3.0
    );
    srv.shutdown();
}

#[test]
fn empty_output_is_a_reported_stop_not_a_silent_blank() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let prompt = "The capital of France is";
    let v = completion(
        a,
        json!({"prompt": prompt, "max_tokens": 1, "temperature": 0}),
    );
    let first = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!first.is_empty());
    // A stop string that matches the very first token: empty text, finish "stop".
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": 5, "temperature": 0, "stop": first, "stream": stream});
        if stream {
            let s = stream_completion(a, &body, Duration::from_secs(60)).unwrap();
            assert_eq!((s.text.as_str(), s.finish.as_deref()), ("", Some("stop")));
        } else {
            let v = completion(a, body);
            assert_eq!(v["choices"][0]["text"], "");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            assert_eq!(v["usage"]["completion_tokens"], 1);
        }
    }
    // An end-of-generation token as the very first token (this prompt ends an assistant
    // turn): a legitimate empty answer, reported as finish_reason "stop".
    for stream in [false, true] {
        let body = json!({"prompt": "<|im_start|>assistant\nDone.", "max_tokens": 4,
                          "temperature": 0, "stream": stream, "stream_options": {"include_usage": true}});
        if stream {
            let s = stream_completion(a, &body, Duration::from_secs(60)).unwrap();
            assert_eq!((s.text.as_str(), s.finish.as_deref()), ("", Some("stop")));
            assert_eq!(s.usage.unwrap()["completion_tokens"], 1);
        } else {
            let v = completion(a, body);
            assert_eq!(v["choices"][0]["text"], "");
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
            assert_eq!(v["usage"]["completion_tokens"], 1);
        }
    }
    srv.shutdown();
}

#[test]
fn failed_load_is_503_not_a_hang() {
    let _g = serial();
    let mut cfg = engine_config();
    cfg.model = "/nonexistent/model.gguf".into();
    let srv = server::start(server::ServerConfig {
        port: 0,
        engine: cfg,
        ..server::ServerConfig::default()
    })
    .unwrap();
    assert!(srv.wait_ready(Duration::from_secs(30)).is_err());
    let h = get(srv.addr, "/health");
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "failed");
    let r = post(srv.addr, "/v1/completions", &json!({"prompt": "x"}));
    assert_eq!(r.status, 503);
    assert!(r.header("retry-after").is_some());
    srv.shutdown();
}

#[test]
fn shutdown_drains_in_flight_streams_and_refuses_new_work() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let mut s = Sse::open(
        a,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "stream": true}),
        Duration::from_secs(120),
    )
    .unwrap();
    assert!(s.next_data().unwrap().is_some(), "first token");
    let t0 = Instant::now();
    srv.begin_shutdown();
    // New work is refused (connection refused once the listener closes, or 503).
    std::thread::sleep(Duration::from_millis(200));
    if let Ok(r) = request(
        a,
        "POST",
        "/v1/completions",
        Some(br#"{"prompt":"x"}"#),
        Duration::from_secs(10),
    ) {
        assert_eq!(r.status, 503);
    }
    // The in-flight stream still finishes normally.
    let mut finish = None;
    let mut n = 1;
    while let Some(d) = s.next_data().unwrap() {
        let v: Value = serde_json::from_str(&d).unwrap();
        n += 1;
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    assert_eq!(finish.as_deref(), Some("length"));
    assert!(n >= 10, "{n} chunks");
    srv.join();
    eprintln!("drained in {:?}", t0.elapsed());
}

fn cached_of(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// Tenants never share cached blocks: the same long prompt under another `cache_salt` (or
/// another API key) computes everything again, while the same tenant twice hits the cache;
/// greedy text is the same either way, and /metrics shows each tenant's blocks.
#[test]
fn tenants_are_isolated_in_the_prefix_cache() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let keys = d.path().join("keys");
    std::fs::write(
        &keys,
        "alice sk-alice-123\nbob sk-bob-456\nadmin sk-admin-789\n",
    )
    .unwrap();
    let srv = start_with_keys(
        engine_config(),
        Some(server::tenant::ApiKeys::from_file(&keys).unwrap()),
    );
    let a = srv.addr;
    let call = |key: Option<&str>, body: &Value| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let h: Vec<(&str, &str)> = auth.iter().map(|v| ("Authorization", v.as_str())).collect();
        request_with(
            a,
            "POST",
            "/v1/completions",
            Some(body.to_string().as_bytes()),
            &h,
            Duration::from_secs(300),
        )
        .unwrap()
    };
    // Keys: 401 without or with a wrong one, OpenAI-shaped; /health stays open.
    let long = words(150, 11);
    let body = json!({"prompt": long, "max_tokens": 4, "temperature": 0});
    for k in [None, Some("sk-wrong"), Some("")] {
        let r = call(k, &body);
        assert_eq!(r.status, 401, "{k:?}: {}", r.text());
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(get(a, "/health").status, 200);
    let r = request_with(
        a,
        "GET",
        "/v1/models",
        None,
        &[("x-api-key", "sk-bob-456")],
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    // Same tenant twice: cached. Another key, same prompt: nothing cached.
    let a1 = call(Some("sk-alice-123"), &body).json();
    let a2 = call(Some("sk-alice-123"), &body).json();
    let b1 = call(Some("sk-bob-456"), &body).json();
    assert_eq!(cached_of(&a1), 0);
    assert!(cached_of(&a2) > 0, "{a2}");
    assert_eq!(cached_of(&b1), 0, "bob must not hit alice's blocks: {b1}");
    assert_eq!(a1["choices"][0]["text"], b1["choices"][0]["text"]);
    assert_eq!(a1["choices"][0]["text"], a2["choices"][0]["text"]);
    // cache_salt splits one key's requests the same way.
    let salted = json!({"prompt": long, "max_tokens": 4, "temperature": 0, "cache_salt": "s1"});
    let s1 = call(Some("sk-alice-123"), &salted).json();
    let s2 = call(Some("sk-alice-123"), &salted).json();
    assert_eq!(cached_of(&s1), 0, "a new salt starts cold");
    assert!(cached_of(&s2) > 0);
    let bad = json!({"prompt": "x", "cache_salt": 5});
    assert_eq!(call(Some("sk-alice-123"), &bad).status, 400);

    // /metrics on a keyed server: the admin key (or --metrics-key) only.
    let metrics_with = |key: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let h: Vec<(&str, &str)> = auth.iter().map(|v| ("Authorization", v.as_str())).collect();
        request_with(a, "GET", "/metrics", None, &h, Duration::from_secs(30)).unwrap()
    };
    let m = metrics_with(Some("sk-admin-789")).text();
    for tenant in ["alice", "bob"] {
        let v = server::metrics::parse_sample(
            &m,
            &format!("rserve_tenant_kv_blocks_cached{{tenant=\"{tenant}\"}}"),
        )
        .unwrap_or_else(|| panic!("no cached-block gauge for {tenant}:\n{m}"));
        assert!(v > 0.0, "{tenant}: {v}");
    }
    assert!(m.contains("tenant=\"alice/salt-"), "{m}");
    assert!(
        !m.contains("sk-alice") && !m.contains("\"s1\""),
        "keys and salts never appear"
    );
    assert!(
        server::metrics::parse_sample(&m, "rserve_requests_total{outcome=\"unauthorized\"}")
            == Some(3.0),
        "{m}"
    );
    // A tenant's key, or none, cannot read every tenant's labels.
    assert_eq!(metrics_with(Some("sk-alice-123")).status, 401);
    assert_eq!(metrics_with(None).status, 401);
    srv.shutdown();
}
