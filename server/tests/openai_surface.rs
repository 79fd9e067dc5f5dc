//! The OpenAI request fields beyond the basics, on the real model: `response_format`
//! (constrained JSON that always parses and validates), `logit_bias`, and `n` > 1.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn completion(addr: SocketAddr, body: &Value) -> Value {
    let r = post(addr, "/v1/completions", body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

fn text0(v: &Value) -> String {
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Runs requests over a few client threads, answers in request order.
fn all(addr: SocketAddr, bodies: Vec<Value>) -> Vec<Value> {
    let n = bodies.len();
    let bodies = std::sync::Arc::new(bodies);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (bodies, next) = (bodies.clone(), next.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= bodies.len() {
                        return out;
                    }
                    out.push((i, completion(addr, &bodies[i])));
                }
            })
        })
        .collect();
    let mut res: Vec<Option<Value>> = vec![None; n];
    for h in handles {
        for (i, v) in h.join().unwrap() {
            res[i] = Some(v);
        }
    }
    res.into_iter().map(Option::unwrap).collect()
}

/// An independent check of a document against the schema subset the tests use.
fn validate(v: &Value, s: &Value, at: &str) -> Result<(), String> {
    if let Some(e) = s.get("enum") {
        return e
            .as_array()
            .unwrap()
            .contains(v)
            .then_some(())
            .ok_or(format!("{at}: {v} not in {e}"));
    }
    let ty = s["type"].as_str().unwrap_or("any");
    let fail = || Err(format!("{at}: {v} is not a {ty}"));
    match ty {
        "object" => {
            let Some(o) = v.as_object() else {
                return fail();
            };
            let props = s["properties"].as_object().unwrap();
            for (k, x) in o {
                let sub = props.get(k).ok_or(format!("{at}: undeclared key {k}"))?;
                validate(x, sub, &format!("{at}.{k}"))?;
            }
            for r in s["required"].as_array().into_iter().flatten() {
                if !o.contains_key(r.as_str().unwrap()) {
                    return Err(format!("{at}: required {r} missing"));
                }
            }
        }
        "array" => {
            let Some(a) = v.as_array() else { return fail() };
            let (lo, hi) = (s["minItems"].as_u64(), s["maxItems"].as_u64());
            if lo.is_some_and(|m| (a.len() as u64) < m) || hi.is_some_and(|m| a.len() as u64 > m) {
                return Err(format!("{at}: {} items", a.len()));
            }
            for (i, x) in a.iter().enumerate() {
                validate(x, &s["items"], &format!("{at}[{i}]"))?;
            }
        }
        "string" => {
            let Some(t) = v.as_str() else { return fail() };
            let n = t.chars().count() as u64;
            if s["maxLength"].as_u64().is_some_and(|m| n > m)
                || s["minLength"].as_u64().is_some_and(|m| n < m)
            {
                return Err(format!("{at}: length {n}"));
            }
        }
        "integer" if !(v.is_i64() || v.is_u64()) => return fail(),
        "number" if !v.is_number() => return fail(),
        "boolean" if !v.is_boolean() => return fail(),
        _ => {}
    }
    Ok(())
}

/// 50 requests (greedy and sampled, different prompts) under a JSON schema: every output
/// parses, validates and stops on its own; json_object gives objects; a bad schema is a
/// 400 naming the keyword; and asking for plain text changes nothing.
#[test]
fn constrained_outputs_always_parse_and_validate() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 24},
            "age": {"type": "integer"},
            "city": {"enum": ["Paris", "Lima", "Oslo", "Tokyo"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
            "score": {"type": "number"},
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "city"]
    });
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    let subjects = [
        "a baker",
        "a pilot",
        "a child",
        "a painter",
        "a farmer",
        "a sailor",
        "a teacher",
        "a nurse",
        "a poet",
        "a miner",
        "a judge",
        "a cook",
        "a runner",
        "a king",
        "a monk",
        "a thief",
        "a scientist",
        "a singer",
        "a clerk",
        "a hunter",
        "a weaver",
        "a doctor",
        "a driver",
        "a student",
        "a soldier",
    ];
    let mut bodies = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        let prompt = format!("Describe {s} as a JSON record with name, age and city.\n");
        bodies.push(
            json!({"prompt": prompt, "max_tokens": 256, "temperature": 0,
                           "response_format": fmt}),
        );
        bodies.push(
            json!({"prompt": prompt, "max_tokens": 256, "temperature": 1.0,
                           "seed": 1000 + i, "response_format": fmt}),
        );
    }
    assert_eq!(bodies.len(), 50);
    let outs = all(a, bodies);
    let mut distinct = std::collections::HashSet::new();
    for (i, o) in outs.iter().enumerate() {
        let t = text0(o);
        let v: Value = serde_json::from_str(&t)
            .unwrap_or_else(|e| panic!("request {i}: output does not parse ({e}): {t:?}"));
        validate(&v, &schema, "$").unwrap_or_else(|e| panic!("request {i}: {e}: {t}"));
        assert_eq!(o["choices"][0]["finish_reason"], "stop", "request {i}: {t}");
        distinct.insert(t);
    }
    assert!(
        distinct.len() > 10,
        "outputs follow their prompts: {distinct:?}"
    );
    eprintln!("50 schema outputs valid, {} distinct", distinct.len());

    // json_object: a JSON object, nothing after it.
    for seed in 0..3 {
        let o = completion(
            a,
            &json!({"prompt": "Return the settings as JSON.\n", "max_tokens": 200,
                    "temperature": 0.7, "seed": seed,
                    "response_format": {"type": "json_object"}}),
        );
        let t = text0(&o);
        if o["choices"][0]["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{e}: {t:?}"));
            assert!(v.is_object(), "{t}");
        } else {
            // Cut by max_tokens: still a prefix of an object.
            assert!(t.trim_start().starts_with('{'), "{t}");
        }
    }

    // Unsupported schemas and formats are refused by name.
    for (rf, want) in [
        (
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "x"}}}),
            "pattern",
        ),
        (json!({"type": "xml"}), "xml"),
        (json!({"type": "json_schema"}), "json_schema"),
    ] {
        let r = post(
            a,
            "/v1/completions",
            &json!({"prompt": "x", "response_format": rf}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json();
        assert_eq!(e["error"]["param"], "response_format");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(want),
            "{e}"
        );
    }

    // No format, "text", and an empty logit_bias: the same greedy text.
    let p = words(40, 3);
    let base = text0(&completion(
        a,
        &json!({"prompt": p, "max_tokens": 24, "temperature": 0}),
    ));
    for extra in [
        json!({"response_format": {"type": "text"}}),
        json!({"logit_bias": {}}),
    ] {
        let mut b = json!({"prompt": p, "max_tokens": 24, "temperature": 0});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        assert_eq!(text0(&completion(a, &b)), base, "{extra}");
    }
    srv.shutdown();
}

fn token_ids(a: SocketAddr, text: &str) -> Vec<u64> {
    post(
        a,
        "/tokenize",
        &json!({"prompt": text, "add_special": false}),
    )
    .json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// `logit_bias` moves greedy decoding: -100 on the greedy first token removes it, +100 on
/// another token makes it the choice; bad biases are 400s.
#[test]
fn logit_bias_steers_sampling() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let p = "The capital of France is";
    let greedy = |bias: Value| {
        completion(
            a,
            &json!({"prompt": p, "max_tokens": 6, "temperature": 0, "logit_bias": bias}),
        )
    };
    let base = text0(&greedy(json!({})));
    let first = token_ids(a, &base)[0];
    let banned = text0(&greedy(json!({ first.to_string(): -100 })));
    assert_ne!(
        token_ids(a, &banned).first(),
        Some(&first),
        "{base:?} / {banned:?}"
    );
    let banana = token_ids(a, " banana");
    assert_eq!(banana.len(), 1, "one token");
    let forced = text0(&greedy(json!({ banana[0].to_string(): 100 })));
    assert!(forced.starts_with(" banana"), "{forced:?}");
    // Sampled too: a +100 token dominates any temperature.
    let o = completion(
        a,
        &json!({"prompt": p, "max_tokens": 3, "temperature": 1.5, "seed": 9,
                "logit_bias": { banana[0].to_string(): 100 }}),
    );
    assert_eq!(text0(&o), " banana banana banana");
    for bad in [
        json!({"abc": 1}),
        json!({"1": 101}),
        json!({"99999999": 1}),
        json!([1]),
    ] {
        let r = post(
            a,
            "/v1/completions",
            &json!({"prompt": p, "logit_bias": bad}),
        );
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], "logit_bias");
    }
    srv.shutdown();
}

/// `n` choices: indexed 0..n, greedy ones equal to the single greedy answer, sampled ones
/// differ, completion tokens summed, the prompt computed once and its blocks shared (the
/// prefix cache counts the other choices' prompt positions as hits), streaming carries
/// every index, and n out of range is a 400.
#[test]
fn n_choices_share_the_prompt() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    let p = words(120, 21);
    let one = completion(a, &json!({"prompt": p, "max_tokens": 12, "temperature": 0}));
    post(a, "/reset_prefix_cache", &json!({}));
    let greedy = completion(
        a,
        &json!({"prompt": p, "max_tokens": 12, "temperature": 0, "n": 3}),
    );
    let ch = greedy["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3);
    for (i, c) in ch.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], one["choices"][0]["text"], "choice {i}");
    }
    let prompt_tokens = one["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(greedy["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(
        greedy["usage"]["completion_tokens"].as_u64().unwrap(),
        3 * one["usage"]["completion_tokens"].as_u64().unwrap()
    );

    // A new prompt, 4 sampled choices: the other 3 attach the first one's prompt blocks.
    let p2 = words(120, 22);
    let hits0 = metric(a, "rserve_prefix_cache_hits_total");
    let s = completion(
        a,
        &json!({"prompt": p2, "max_tokens": 16, "temperature": 1.0, "seed": 5, "n": 4}),
    );
    let hits = metric(a, "rserve_prefix_cache_hits_total") - hits0;
    let pt = s["usage"]["prompt_tokens"].as_u64().unwrap() as f64;
    let shared_per_choice = ((pt - 1.0) / 16.0).floor() * 16.0;
    assert!(
        hits >= 3.0 * shared_per_choice,
        "prefix hits {hits}, want >= 3 x {shared_per_choice} (prompt {pt})"
    );
    let texts: std::collections::HashSet<String> = s["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    assert!(texts.len() > 1, "sampled choices differ: {texts:?}");

    // Streaming: every index's text and finish, one [DONE].
    let mut sse = Sse::open(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8,
                "temperature": 0.8, "seed": 1, "n": 2, "stream": true,
                "stream_options": {"include_usage": true}}),
        Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(sse.status, 200);
    let mut finished = [false; 2];
    let mut roles = [false; 2];
    let mut usage = None;
    while let Some(d) = sse.next_data().unwrap() {
        let v: Value = serde_json::from_str(&d).unwrap();
        assert!(v.get("error").is_none(), "{v}");
        if v["usage"].is_object() {
            usage = Some(v["usage"].clone());
        }
        for c in v["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            roles[i] |= c["delta"]["role"] == "assistant";
            finished[i] |= c["finish_reason"].is_string();
        }
    }
    assert_eq!((roles, finished), ([true; 2], [true; 2]));
    assert!(usage.unwrap()["completion_tokens"].as_u64().unwrap() >= 2);

    for n in [0, 17, -1] {
        let r = post(a, "/v1/completions", &json!({"prompt": "x", "n": n}));
        assert_eq!(r.status, 400, "{n}");
        assert_eq!(r.json()["error"]["param"], "n");
    }
    srv.shutdown();
}
