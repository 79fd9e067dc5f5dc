//! Tool calling on `/v1/chat/completions` with the real models: qwen2.5-coder-0.5b (whose
//! own template describes tools; Hermes-style calls) makes a call with `tool_choice`
//! `auto`, non-streamed and streamed as `tool_calls` deltas, and answers once given the
//! result; smollm2 (whose template has no tool support) calls only when forced
//! (`required` or a named function), its arguments constrained by the function's schema;
//! bad tool fields are refused by name.

mod common;

use common::*;
use serde_json::{json, Value};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
}

fn ask() -> Value {
    json!([{"role": "user", "content": "What is the weather like in Paris right now?"}])
}

fn chat(addr: std::net::SocketAddr, body: &Value) -> Value {
    let r = post(addr, "/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

fn config(model: &str) -> server::engine::EngineConfig {
    server::engine::EngineConfig {
        model: model.into(),
        ..engine_config()
    }
}

/// The streamed chunks' tool calls and finish reason.
fn stream_calls(addr: std::net::SocketAddr, body: &Value) -> (Vec<Value>, String, String) {
    let mut s = Sse::open(
        addr,
        "/v1/chat/completions",
        body,
        std::time::Duration::from_secs(120),
    )
    .unwrap();
    assert_eq!(s.status, 200);
    let (mut calls, mut finish, mut content) = (Vec::new(), String::new(), String::new());
    while let Some(d) = s.next_data().unwrap() {
        let v: Value = serde_json::from_str(&d).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["tool_calls"].as_array() {
            calls.extend(t.iter().cloned());
        }
        if let Some(t) = c["delta"]["content"].as_str() {
            content.push_str(t);
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (calls, finish, content)
}

#[test]
fn qwen_calls_a_tool_and_answers_with_its_result() {
    if !model_available() {
        return;
    }
    let _g = serial();
    runtime::registry::resolve("qwen2.5-coder-0.5b").unwrap();
    let srv = start(config("qwen2.5-coder-0.5b"));
    let a = srv.addr;
    let body =
        json!({"messages": ask(), "tools": [weather_tool()], "temperature": 0, "max_tokens": 64});
    let r = chat(a, &body);
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    assert!(c["message"]["content"].is_null(), "{r}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_"), "{id}");

    // Streamed: the same call as a tool_calls delta (index 0), then finish tool_calls.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (calls, finish, content) = stream_calls(a, &sb);
    assert_eq!(finish, "tool_calls");
    assert_eq!(content, "");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(
        calls[0]["function"]["arguments"],
        call["function"]["arguments"]
    );

    // The second turn: the call and its result go back; the answer is text.
    let mut msgs = ask();
    msgs.as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
    msgs.as_array_mut().unwrap().push(
        json!({"role": "tool", "tool_call_id": id, "content": "{\"temperature_c\": 21, \"sky\": \"sunny\"}"}),
    );
    let r2 = chat(
        a,
        &json!({"messages": msgs, "tools": [weather_tool()], "temperature": 0, "max_tokens": 64}),
    );
    let c2 = &r2["choices"][0];
    assert_ne!(c2["finish_reason"], "tool_calls", "{r2}");
    let text = c2["message"]["content"].as_str().unwrap();
    assert!(
        text.contains("21"),
        "the answer does not use the result: {r2}"
    );
    // The tool turn reached the prompt: it is longer than the first by the call and result.
    assert!(r2["usage"]["prompt_tokens"].as_u64() > r["usage"]["prompt_tokens"].as_u64());

    // tool_choice none: no tools in the prompt, no calls read.
    let none = chat(
        a,
        &json!({"messages": ask(), "tools": [weather_tool()], "tool_choice": "none", "temperature": 0, "max_tokens": 24}),
    );
    assert!(
        none["choices"][0]["message"].get("tool_calls").is_none(),
        "{none}"
    );
    assert!(none["usage"]["prompt_tokens"].as_u64() < r["usage"]["prompt_tokens"].as_u64());
}

#[test]
fn a_model_without_tool_support_calls_only_when_forced() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(engine_config());
    let a = srv.addr;
    let search = json!({"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 40}, "limit": {"type": "integer"}},
        "required": ["query", "limit"]}}});
    // auto: the template cannot describe tools, so the answer is text, never a call.
    let auto = chat(
        a,
        &json!({"messages": ask(), "tools": [weather_tool(), search], "temperature": 0, "max_tokens": 16}),
    );
    assert!(
        auto["choices"][0]["message"].get("tool_calls").is_none(),
        "{auto}"
    );
    assert_eq!(auto["choices"][0]["finish_reason"], "length");

    for (choice, want) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "search"}}),
            Some("search"),
        ),
    ] {
        for stream in [false, true] {
            let body = json!({"messages": ask(), "tools": [weather_tool(), search], "tool_choice": choice,
                              "temperature": 0, "max_tokens": 96, "stream": stream});
            let calls = if stream {
                let (calls, finish, content) = stream_calls(a, &body);
                assert_eq!(
                    (finish.as_str(), content.as_str()),
                    ("tool_calls", ""),
                    "{body}"
                );
                calls
            } else {
                let r = chat(a, &body);
                assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
                r["choices"][0]["message"]["tool_calls"]
                    .as_array()
                    .unwrap()
                    .clone()
            };
            assert_eq!(calls.len(), 1, "{calls:?}");
            let name = calls[0]["function"]["name"].as_str().unwrap();
            assert!(["get_weather", "search"].contains(&name));
            if let Some(w) = want {
                assert_eq!(name, w);
                // The named function's schema held: both required keys, typed.
                let args: Value =
                    serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap())
                        .unwrap();
                assert!(
                    args["query"].as_str().is_some_and(|q| q.len() <= 40),
                    "{args}"
                );
                assert!(args["limit"].is_i64(), "{args}");
            }
        }
    }
}

#[test]
fn bad_tool_fields_are_refused_by_name() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(engine_config());
    let a = srv.addr;
    let cases = [
        (json!({"tools": {"x": 1}}), "tools"),
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0]"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0]",
        ),
        (
            json!({"tools": [weather_tool(), weather_tool()]}),
            "tools[1]",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [weather_tool()], "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"anyOf": []}}}}}],
                "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}]}),
            "messages[0].tool_calls[0]",
        ),
    ];
    // `required` over more tools, or more parameters together, than the call's schema
    // can enumerate (64), and the same with one function named: that one works.
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object"}}}))
        .collect();
    let wide: Vec<Value> = many[..2]
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let mut t = t.clone();
            let props: serde_json::Map<String, Value> = (0..40)
                .map(|i| (format!("q{k}_{i}"), json!({"type": "integer"})))
                .collect();
            t["function"]["parameters"]["properties"] = Value::Object(props);
            t
        })
        .collect();
    let cases = cases.into_iter().chain([
        (
            json!({"tools": many.clone(), "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"tools": wide, "tool_choice": "required"}),
            "tool_choice",
        ),
    ]);
    let named = json!({"messages": ask(), "max_tokens": 8, "tools": many,
        "tool_choice": {"type": "function", "function": {"name": "f64"}}});
    let r = post(a, "/v1/chat/completions", &named);
    assert_eq!(r.status, 200, "{}", r.text());
    for (extra, param) in cases {
        let mut body = json!({"messages": ask(), "max_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(a, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}: {}", r.text());
    }
}
