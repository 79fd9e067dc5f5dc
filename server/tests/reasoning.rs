//! The reasoning split on the real model: with a chat template whose generation prompt
//! opens a `<think>` block (as QwQ's and DeepSeek-R1's do), the answer comes back in
//! `reasoning_content`, streamed as `delta.reasoning_content` chunks that add up to the
//! same text; `reasoning_format: "none"` returns the raw text instead;
//! `chat_template_kwargs: {"enable_thinking": false}` reaches the template (which then
//! closes the block itself, so the answer is content); bad values are refused by name.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A ChatML template of our own that opens a think block unless thinking is off.
const THINK_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

fn chat(addr: std::net::SocketAddr, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

#[test]
fn reasoning_is_returned_apart() {
    if !model_available() {
        return;
    }
    let _g = serial();
    let srv = start(server::engine::EngineConfig {
        chat_template: Some(THINK_TEMPLATE.into()),
        ..engine_config()
    });
    let a = srv.addr;

    let split = chat(a, json!({}));
    let msg = &split["choices"][0]["message"];
    let reasoning = msg["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("no reasoning_content in {split}"));
    assert!(!reasoning.is_empty());
    // The model does not close the block in 12 tokens: everything is reasoning.
    let raw = chat(a, json!({"reasoning_format": "none"}));
    let raw_text = raw["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(raw["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
    assert!(!raw_text.contains("</think>"), "{raw_text:?}");
    assert_eq!(reasoning, raw_text.trim(), "{split} vs {raw}");
    assert_eq!(msg["content"], "", "{split}");

    // Streamed: reasoning chunks that add up to the same text, no content.
    let body = json!({
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 12, "temperature": 0, "stream": true,
    });
    let mut s = Sse::open(a, "/v1/chat/completions", &body, Duration::from_secs(60)).unwrap();
    assert_eq!(s.status, 200);
    let (mut streamed_reasoning, mut streamed_content, mut n_reasoning) =
        (String::new(), String::new(), 0);
    while let Some(d) = s.next_data().unwrap() {
        let v: Value = serde_json::from_str(&d).unwrap();
        let delta = &v["choices"][0]["delta"];
        if let Some(r) = delta["reasoning_content"].as_str() {
            streamed_reasoning += r;
            n_reasoning += 1;
        }
        if let Some(c) = delta["content"].as_str() {
            streamed_content += c;
        }
    }
    assert_eq!(streamed_reasoning, reasoning);
    assert_eq!(streamed_content, "");
    assert!(n_reasoning > 1, "reasoning came in {n_reasoning} chunk(s)");

    // Thinking off: the template closes the block, the answer is content.
    let off = chat(
        a,
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    );
    let m = &off["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{off}");
    assert!(!m["content"].as_str().unwrap().is_empty(), "{off}");
    // ... and the prompt differs from the thinking one (the kwarg reached the template).
    assert_ne!(m["content"].as_str().unwrap(), reasoning);

    for (body, param) in [
        (json!({"reasoning_format": "sideways"}), "reasoning_format"),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "no"}}),
            "chat_template_kwargs",
        ),
        (json!({"chat_template_kwargs": [1]}), "chat_template_kwargs"),
    ] {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = post(a, "/v1/chat/completions", &b);
        assert_eq!(r.status, 400, "{b}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
    srv.shutdown();
}
