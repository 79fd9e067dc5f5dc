//! rserve against hostile clients (issue 48), on the real model: constrained decoding as a
//! denial-of-service lever, slow and oversize requests, schema keywords that must be
//! enforced or refused, one tenant flushing another's cache, outcome counters with `n` >
//! 1, and label injection into /metrics.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// A neighbour's 32-token greedy request, timed.
fn neighbour(a: SocketAddr) -> f64 {
    let t0 = Instant::now();
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": "The history of the river town", "max_tokens": 32,
                "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    t0.elapsed().as_secs_f64()
}

/// The issue's hostile request: an array schema, a logit_bias that pushes hundreds of
/// tokens the grammar refuses outside strings, temperature 1, n 3, no end of generation.
fn hostile_body(bias_ids: &[u64]) -> Value {
    let bias: serde_json::Map<String, Value> = bias_ids
        .iter()
        .map(|id| (id.to_string(), json!(100)))
        .collect();
    json!({
        "prompt": "Write a list.",
        "max_tokens": 200,
        "temperature": 1,
        "n": 3,
        "ignore_eos": true,
        "logit_bias": bias,
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "array"}}},
    })
}

/// Defect 1: one client's constrained request must not slow a neighbour's tokens by much:
/// constraint masks come from a token trie walked once per step, never from sampling
/// and retrying against a biased distribution.
#[test]
fn a_hostile_constrained_request_barely_slows_a_neighbour() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let mut cfg = engine_config();
    cfg.run.threads = 1;
    let srv = start(cfg);
    let a = srv.addr;
    let toks = post(
        a,
        "/tokenize",
        &json!({"prompt": words(400, 3), "add_special": false}),
    );
    let mut ids: Vec<u64> = toks.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    neighbour(a);
    let alone = (0..3).map(|_| neighbour(a)).fold(f64::MAX, f64::min);
    // The neighbour beside a request: its time, and the request's status and time.
    let beside = |body: Value| {
        let other = std::thread::spawn(move || {
            let t0 = Instant::now();
            let r = post(a, "/v1/completions", &body);
            (r.status, t0.elapsed().as_secs_f64(), r.text())
        });
        std::thread::sleep(Duration::from_millis(300));
        let t = neighbour(a);
        let (status, secs, text) = other.join().unwrap();
        assert_eq!(status, 200, "{text}");
        (t, secs)
    };
    // The same request without the constraint and the bias: what three more sequences at
    // temperature 1 cost anyway (batching, sampling).
    let mut twin = hostile_body(&ids);
    twin.as_object_mut().unwrap().remove("response_format");
    twin.as_object_mut().unwrap().remove("logit_bias");
    let (with_twin, twin_s) = beside(twin);
    let (with, hostile_s) = beside(hostile_body(&ids));
    let ratio = with / with_twin;
    eprintln!(
        "neighbour 32 tokens: alone {alone:.3}s; beside the unconstrained twin {with_twin:.3}s \
         (twin {twin_s:.2}s); beside the hostile request {with:.3}s (hostile {hostile_s:.2}s): \
         {ratio:.2}x the twin's, {:.2}x alone",
        with / alone
    );
    assert!(
        ratio < 1.5,
        "the neighbour took {ratio:.2}x longer beside a hostile constrained request than \
         beside the same request unconstrained"
    );
    // Every step's constraint cost stayed under the fixed bound: the trie's node count
    // (a property of the vocabulary, not of the request).
    let bound = metric(a, "rserve_constraint_trie_nodes");
    let worst = metric(a, "rserve_constraint_mask_bytes_max");
    let worst_s = metric(a, "rserve_constraint_mask_seconds_max");
    eprintln!(
        "constraint masks: at most {worst} automaton bytes (bound {bound}), at most {:.2} ms",
        worst_s * 1e3
    );
    assert!(worst > 0.0 && worst <= bound, "{worst} > {bound}");
    srv.shutdown();
}

/// Defect 7: every schema keyword is enforced or refused with a 400 naming it, and a
/// contradictory schema is a 400 before any token (streaming too).
#[test]
fn schema_keywords_are_enforced_or_refused() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let fmt = |schema: Value| {
        json!({"prompt": "Describe a person as JSON:", "max_tokens": 120, "temperature": 0,
               "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    };
    let gen = |schema: Value| -> Value {
        let r = post(a, "/v1/completions", &fmt(schema.clone()));
        assert_eq!(r.status, 200, "{schema}: {}", r.text());
        let v = r.json();
        let text = v["choices"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{schema}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{schema}: {text:?}: {e}"))
    };
    // (Values kept short so the model finishes within max_tokens.)
    let v = gen(json!({"type": "object", "required": ["name"],
                       "additionalProperties": {"type": "string", "maxLength": 12}}));
    assert!(v.get("name").is_some(), "required without properties: {v}");
    let v = gen(json!({"properties": {"age": {"type": "integer"}}, "required": ["age"]}));
    assert!(v["age"].is_i64(), "properties without type: {v}");
    let v = gen(json!({"type": "object", "additionalProperties": false}));
    assert_eq!(v, json!({}), "additionalProperties false");
    for (schema, keyword) in [
        (json!({"type": "integer", "enum": ["abc"]}), "enum"),
        (
            json!({"type": "string", "minLength": 5, "maxLength": 1}),
            "minLength",
        ),
        (
            json!({"type": "array", "minItems": 3, "maxItems": 1}),
            "minItems",
        ),
        (json!({"type": "string", "minItems": 2}), "minItems"),
        (json!({"enum": ["ab", "cd"], "minLength": 3}), "enum"),
        (
            json!({"type": "object", "required": ["x"], "additionalProperties": false}),
            "required",
        ),
    ] {
        let r = post(a, "/v1/completions", &fmt(schema.clone()));
        assert_eq!(r.status, 400, "{schema}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains(keyword), "{schema}: {msg}");
        let mut body = fmt(schema.clone());
        body["stream"] = json!(true);
        let s = Sse::open(a, "/v1/completions", &body, Duration::from_secs(60)).unwrap();
        assert_eq!(s.status, 400, "{schema} streaming");
    }
    srv.shutdown();
}

/// Defect 6: a connection that never finishes its headers is closed; a keyless POST that
/// announces a big body is answered 401 without the body; an oversize Content-Length is a
/// 413 at once.
#[test]
fn slow_and_oversize_requests_are_cut_short() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let keys = d.path().join("keys");
    std::fs::write(&keys, "alice sk-alice-123\nadmin sk-admin-789\n").unwrap();
    let srv = start_with_keys(
        engine_config(),
        Some(server::tenant::ApiKeys::from_file(&keys).unwrap()),
    );
    let a = srv.addr;
    let raw = |head: &str, wait: Duration| -> (String, f64) {
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(wait)).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let t0 = Instant::now();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(_) => return ("(no answer)".into(), t0.elapsed().as_secs_f64()),
            }
        }
        (
            String::from_utf8_lossy(&buf).into_owned(),
            t0.elapsed().as_secs_f64(),
        )
    };
    let host = format!("Host: {a}\r\n");
    // Partial headers: closed (or answered 408) by the header timeout, not held open.
    let (ans, secs) = raw(
        &format!("POST /v1/completions HTTP/1.1\r\n{host}X-Slow: 1\r\n"),
        Duration::from_secs(40),
    );
    assert!(
        ans != "(no answer)" && secs < 30.0,
        "{ans:?} after {secs:.1}s"
    );
    // No key, a big body announced and never sent: 401 at once.
    let (ans, secs) = raw(
        &format!(
            "POST /v1/completions HTTP/1.1\r\n{host}Content-Type: application/json\r\n\
             Content-Length: 500000\r\n\r\n"
        ),
        Duration::from_secs(15),
    );
    assert!(ans.starts_with("HTTP/1.1 401"), "{ans:?} after {secs:.1}s");
    assert!(secs < 5.0, "401 after {secs:.1}s");
    // An oversize Content-Length, with a key: 413 at once.
    let (ans, secs) = raw(
        &format!(
            "POST /v1/completions HTTP/1.1\r\n{host}Authorization: Bearer sk-alice-123\r\n\
             Content-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n"
        ),
        Duration::from_secs(15),
    );
    assert!(ans.starts_with("HTTP/1.1 413"), "{ans:?} after {secs:.1}s");
    assert!(secs < 5.0, "413 after {secs:.1}s");
    // A client that goes away mid-body, or right after sending a long prompt (while it is
    // tokenized), still ends its request in one outcome.
    let prompt = json!({"prompt": words(60_000, 5), "max_tokens": 1}).to_string();
    for whole in [false, true, true, true] {
        let mut s = TcpStream::connect(a).unwrap();
        let body = if whole { &prompt[..] } else { &prompt[..100] };
        s.write_all(
            format!(
                "POST /v1/completions HTTP/1.1\r\n{host}Authorization: Bearer sk-alice-123\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                prompt.len()
            )
            .as_bytes(),
        )
        .unwrap();
        drop(s);
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled = || {
        let r = request_with(
            a,
            "GET",
            "/metrics",
            None,
            &[("Authorization", "Bearer sk-admin-789")],
            Duration::from_secs(30),
        )
        .unwrap();
        let m = r.text();
        let received = server::metrics::parse_sample(&m, "rserve_requests_received_total").unwrap();
        let outcomes: f64 = m
            .lines()
            .filter(|l| l.starts_with("rserve_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        received > 0.0 && received == outcomes
    };
    assert!(
        eventually(Duration::from_secs(10), settled),
        "a request received without an outcome"
    );
    srv.shutdown();
}

/// Defects 8 and 9: one tenant's /reset_prefix_cache flushes only its own cache (the
/// admin key flushes all), and a request with `n` > 1 counts one outcome.
#[test]
fn tenant_scoped_reset_and_one_outcome_per_request() {
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
    let call = |key: &str, path: &str, body: &Value| {
        let auth = format!("Bearer {key}");
        request_with(
            a,
            "POST",
            path,
            Some(body.to_string().as_bytes()),
            &[("Authorization", auth.as_str())],
            Duration::from_secs(300),
        )
        .unwrap()
    };
    let cached = |r: &Resp| {
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let body = json!({"prompt": words(150, 12), "max_tokens": 2, "temperature": 0});
    call("sk-alice-123", "/v1/completions", &body);
    assert!(cached(&call("sk-alice-123", "/v1/completions", &body)) > 0);
    assert_eq!(
        call("sk-bob-456", "/reset_prefix_cache", &json!({})).status,
        200
    );
    let after = call("sk-alice-123", "/v1/completions", &body);
    assert!(cached(&after) > 0, "bob's reset flushed alice's cache");
    assert_eq!(
        call("sk-admin-789", "/reset_prefix_cache", &json!({})).status,
        200
    );
    let after = call("sk-alice-123", "/v1/completions", &body);
    assert_eq!(cached(&after), 0, "the admin key flushes every tenant");

    let metrics = || {
        let r = request_with(
            a,
            "GET",
            "/metrics",
            None,
            &[("Authorization", "Bearer sk-admin-789")],
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(r.status, 200);
        r.text()
    };
    let outcomes = |m: &str| -> f64 {
        ["stop", "length", "cancelled", "error"]
            .iter()
            .map(|o| {
                server::metrics::parse_sample(
                    m,
                    &format!("rserve_requests_total{{outcome=\"{o}\"}}"),
                )
                .unwrap_or(0.0)
            })
            .sum()
    };
    let before = outcomes(&metrics());
    let n4 = json!({"prompt": "Count:", "max_tokens": 2, "temperature": 1, "n": 4});
    for _ in 0..3 {
        let r = call("sk-alice-123", "/v1/completions", &n4);
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["choices"].as_array().unwrap().len(), 4);
    }
    let m = metrics();
    assert_eq!(outcomes(&m) - before, 3.0, "one outcome per request:\n{m}");
    srv.shutdown();
}

/// Defect 4: a tenant label can never add a line (or a sample) to /metrics: every label
/// value is escaped as Prometheus' text format requires.
#[test]
fn tenant_labels_cannot_inject_metrics() {
    let mut m = server::metrics::Metrics::default();
    m.tenants.insert(
        "x\"} 1\nrserve_injected 1\n#".into(),
        server::metrics::TenantKv {
            blocks_used: 1,
            tokens_used: 2,
            blocks_cached: 3,
        },
    );
    let text = m.render();
    for line in text.lines() {
        assert!(!line.starts_with("rserve_injected"), "{text}");
        if !line.starts_with('#') && !line.is_empty() {
            // name{labels} value: exactly one sample per line.
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line:?}");
        }
    }
}

/// The "also seen" items: a keyless server refuses foreign `Host` names (DNS rebinding)
/// and non-JSON bodies, and an unknown `model` is a 404 `model_not_found`.
#[test]
fn rebinding_and_unknown_models_are_refused() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let send = |head: String, body: &str| -> String {
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(
            format!(
                "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let body = r#"{"prompt": "Hi", "max_tokens": 1}"#;
    let ans = send(
        "POST /v1/completions HTTP/1.1\r\nHost: attacker.example:8080\r\nContent-Type: application/json\r\n".into(),
        body,
    );
    assert!(ans.starts_with("HTTP/1.1 403"), "{ans}");
    let ans = send(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: localhost:{}\r\nContent-Type: text/plain\r\n",
            a.port()
        ),
        body,
    );
    assert!(ans.starts_with("HTTP/1.1 415"), "{ans}");
    let ans = send(
        format!("POST /v1/completions HTTP/1.1\r\nHost: localhost:{}\r\nContent-Type: application/json\r\n", a.port()),
        body,
    );
    assert!(ans.starts_with("HTTP/1.1 200"), "{ans}");
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": "gpt-4o", "prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = post(
        a,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    srv.shutdown();
}

/// On the real vocabulary, the mask from the token trie is exactly the set of tokens
/// whose bytes the automaton accepts, at points inside strings, keys, numbers and
/// structure, and no mask feeds more bytes than the trie has nodes.
#[test]
fn masks_match_the_automaton_on_the_real_vocabulary() {
    if !model_available() {
        return;
    }
    let path = runtime::registry::resolve(MODEL).unwrap();
    let f = runtime::gguf::GgufFile::open(&path).unwrap();
    let tok = runtime::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let pieces: Vec<Option<Vec<u8>>> = (0..tok.n_vocab() as u32)
        .map(|t| (!tok.is_control(t)).then(|| tok.token_to_piece(t, false)))
        .collect();
    let idx = server::constrain::TokenIndex::new(&pieces, |t| tok.is_eog(t));
    let schema = json!({"type": "object", "required": ["name"],
                        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 3}}}});
    let fmt = server::constrain::Format::json_schema(&schema).unwrap();
    let mut out = Vec::new();
    for prefix in [
        "",
        "{\n  \"name\": \"John Do",
        "{\"name\": [1, 2.5",
        "{\"na",
        "{\"tags\": [\"ab",
        "{\"name\": {\"k\": \"\\u00",
        "{\"name\": \"\u{e9}",
    ] {
        let mut m = fmt.start();
        assert!(m.push(prefix.as_bytes()), "{prefix}");
        let fed = m.mask(&idx, true, &mut out);
        assert!(fed <= idx.cost_bound());
        for (t, p) in pieces.iter().enumerate() {
            let want = if tok.is_eog(t as u32) {
                m.can_end()
            } else {
                p.as_deref().is_some_and(|p| m.accepts(p))
            };
            let got = out[t / 64] >> (t % 64) & 1 == 1;
            assert_eq!(
                got,
                want,
                "after {prefix:?}: token {t} {:?}",
                p.as_deref().map(String::from_utf8_lossy)
            );
        }
    }
}
