//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) over
//! the same generation path as OpenAI chat: a request is translated into an OpenAI chat
//! request ([`to_chat`]: `system` becomes a system turn, `tool_use` blocks assistant tool
//! calls, `tool_result` blocks `tool` turns, `tools` / `tool_choice` their OpenAI forms),
//! so templates, tool syntaxes, constraints and sampling have one home; the answer's
//! pieces ([`crate::answer`]) become Anthropic content blocks, and a stream the event
//! sequence `message_start`, per block `content_block_start` / `_delta` / `_stop`, then
//! `message_delta` (stop reason and usage) and `message_stop`. Errors take Anthropic's
//! shape, `{"type": "error", "error": {"type", "message"}}`.

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::answer::{Answer, End, Pieces};
use crate::api::RawRequest;
use crate::engine::FinishReason;
use crate::error::{ApiError, ApiErrorKind};

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// The text of a `system` value or a `tool_result`'s content: a string or text blocks.
fn text_of(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut s = String::new();
            for (k, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => s.push_str(t),
                    (ty, _) => {
                        return Err(bad(
                            &format!("{param}[{k}]"),
                            format!(
                                "only text blocks are supported here, got {}",
                                ty.unwrap_or("a block without a type")
                            ),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(bad(param, "must be a string or an array of text blocks")),
    }
}

/// One Anthropic message as OpenAI chat messages (a user turn's `tool_result` blocks are
/// `tool` turns of their own, before its text).
fn message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    if !matches!(role, "user" | "assistant") {
        return Err(bad(&param, "role must be \"user\" or \"assistant\""));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(
                &param,
                "content must be a string or an array of content blocks",
            ))
        }
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let bp = format!("{param}.content[{k}]");
        let ty = b.get("type").and_then(Value::as_str).unwrap_or_default();
        match (ty, role) {
            ("text", _) => match b.get("text") {
                Some(Value::String(t)) => text.push_str(t),
                _ => return Err(bad(&bp, "a text block needs a string text")),
            },
            ("tool_use", "assistant") => {
                let id = b.get("id").and_then(Value::as_str);
                let name = b.get("name").and_then(Value::as_str);
                let input = b.get("input").filter(|v| v.is_object());
                let (Some(id), Some(name), Some(input)) = (id, name, input) else {
                    return Err(bad(
                        &bp,
                        "a tool_use block needs an id, a name and an object input",
                    ));
                };
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("tool_result", "user") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(&bp, "a tool_result block needs a tool_use_id"))?;
                let mut content = text_of(
                    b.get("content").unwrap_or(&Value::Null),
                    &format!("{bp}.content"),
                )?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            // The model's earlier reasoning is not shown to it again, as chat templates
            // drop earlier turns' reasoning.
            ("thinking" | "redacted_thinking", "assistant") => {}
            (other, _) => {
                return Err(bad(
                    &bp,
                    format!(
                        "a {role} message cannot carry a {:?} block here (text{} only)",
                        other,
                        if role == "user" {
                            " and tool_result"
                        } else {
                            ", tool_use and thinking"
                        }
                    ),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// The most tools one request may describe (the chat path's own limit applies too).
const MAX_TOOLS: usize = 128;

/// An Anthropic request as an OpenAI chat request. `generating`: a Messages request
/// (`max_tokens` required); otherwise `count_tokens`'s (sampling fields not read).
pub fn to_chat(v: &Value, generating: bool) -> Result<Value, ApiError> {
    let Some(o) = v.as_object() else {
        return Err(ApiError::new(
            ApiErrorKind::InvalidRequest,
            "the request body must be a JSON object",
        ));
    };
    let mut chat = Map::new();
    match o.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) => {
            chat.insert("model".into(), json!(m));
        }
        Some(_) => return Err(bad("model", "model must be a string")),
    }
    let mut msgs = Vec::new();
    match o.get("system") {
        None | Some(Value::Null) => {}
        Some(s) => msgs.push(json!({"role": "system", "content": text_of(s, "system")?})),
    }
    let Some(Value::Array(list)) = o.get("messages") else {
        return Err(bad("messages", "messages must be an array"));
    };
    if list.is_empty() {
        return Err(bad("messages", "messages must not be empty"));
    }
    for (i, m) in list.iter().enumerate() {
        message(m, i, &mut msgs)?;
    }
    chat.insert("messages".into(), Value::Array(msgs));
    match o.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            if tools.len() > MAX_TOOLS {
                return Err(bad("tools", format!("at most {MAX_TOOLS} tools")));
            }
            let mut out = Vec::with_capacity(tools.len());
            for (i, t) in tools.iter().enumerate() {
                let param = format!("tools[{i}]");
                if let Some(ty) = t.get("type").and_then(Value::as_str) {
                    if ty != "custom" {
                        return Err(bad(
                            &param,
                            format!("server tools ({ty:?}) are not available here; give client tools (name, description, input_schema)"),
                        ));
                    }
                }
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(&param, "a tool needs a name"))?;
                let schema = t
                    .get("input_schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| bad(&param, "a tool needs an input_schema object"))?;
                let mut f = json!({"name": name, "parameters": schema});
                if let Some(d) = t.get("description") {
                    f["description"] = d.clone();
                }
                out.push(json!({"type": "function", "function": f}));
            }
            chat.insert("tools".into(), Value::Array(out));
        }
        Some(_) => return Err(bad("tools", "tools must be an array")),
    }
    match o.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(c) => {
            let ty = c.get("type").and_then(Value::as_str).unwrap_or_default();
            let choice = match ty {
                "auto" => json!("auto"),
                "any" => json!("required"),
                "none" => json!("none"),
                "tool" => match c.get("name").and_then(Value::as_str) {
                    Some(n) => json!({"type": "function", "function": {"name": n}}),
                    None => return Err(bad("tool_choice", "a tool tool_choice needs a name")),
                },
                _ => {
                    return Err(bad(
                        "tool_choice",
                        "tool_choice.type must be auto, any, tool or none",
                    ))
                }
            };
            chat.insert("tool_choice".into(), choice);
            if let Some(d) = c.get("disable_parallel_tool_use").and_then(Value::as_bool) {
                chat.insert("parallel_tool_calls".into(), json!(!d));
            }
        }
    }
    match o.get("thinking") {
        None | Some(Value::Null) => {}
        Some(t) => {
            let on = match t.get("type").and_then(Value::as_str) {
                Some("enabled" | "adaptive") => true,
                Some("disabled") => false,
                _ => {
                    return Err(bad(
                        "thinking",
                        "thinking.type must be enabled, adaptive or disabled",
                    ))
                }
            };
            chat.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": on}),
            );
        }
    }
    if !generating {
        return Ok(Value::Object(chat));
    }
    // Structured output: `output_config.format` is a JSON schema for the whole answer
    // (`effort` has no meaning for these models and is not read).
    match o.get("output_config").and_then(|c| c.get("format")) {
        None | Some(Value::Null) => {}
        Some(f) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
            let schema = f.get("schema").cloned().unwrap_or(Value::Null);
            chat.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
            );
        }
        Some(_) => {
            return Err(bad(
                "output_config.format",
                "output_config.format must be {\"type\": \"json_schema\", \"schema\": ...}",
            ))
        }
    }
    match o.get("max_tokens") {
        Some(Value::Number(n)) if n.as_i64().is_some() => {
            chat.insert("max_tokens".into(), json!(n));
        }
        Some(_) => return Err(bad("max_tokens", "max_tokens must be an integer")),
        None => return Err(bad("max_tokens", "max_tokens: field required")),
    }
    match o.get("temperature") {
        None | Some(Value::Null) => {}
        Some(t) => match t.as_f64() {
            // Anthropic's range is [0, 1]; it maps onto the same sampler.
            Some(x) if (0.0..=1.0).contains(&x) => {
                chat.insert("temperature".into(), t.clone());
            }
            _ => return Err(bad("temperature", "temperature must be a number in [0, 1]")),
        },
    }
    for k in ["top_p", "top_k", "stream"] {
        if let Some(x) = o.get(k).filter(|x| !x.is_null()) {
            chat.insert(k.into(), x.clone());
        }
    }
    match o.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(s @ Value::Array(_)) => {
            chat.insert("stop".into(), s.clone());
        }
        Some(_) => {
            return Err(bad(
                "stop_sequences",
                "stop_sequences must be an array of strings",
            ))
        }
    }
    if o.get("stream").is_some_and(|s| s.as_bool() == Some(true)) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(chat))
}

/// A Messages request body as the OpenAI chat request it runs as.
pub fn parse(body: &[u8], generating: bool) -> Result<RawRequest, ApiError> {
    let v: Value = crate::api::parse_json(body)?;
    let chat = to_chat(&v, generating)?;
    serde_json::from_value(chat).map_err(|e| {
        ApiError::new(
            ApiErrorKind::InvalidRequest,
            format!("invalid request: {e}"),
        )
    })
}

/// An error in Anthropic's shape, the field named in its message.
pub fn error_body(e: &ApiError) -> Value {
    let ty = match e.kind {
        ApiErrorKind::InvalidRequest
        | ApiErrorKind::Timeout
        | ApiErrorKind::UnsupportedMediaType => "invalid_request_error",
        ApiErrorKind::Unauthorized => "authentication_error",
        ApiErrorKind::Forbidden => "permission_error",
        ApiErrorKind::NotFound | ApiErrorKind::ModelNotFound => "not_found_error",
        ApiErrorKind::PayloadTooLarge => "request_too_large",
        ApiErrorKind::Overloaded { .. } => "rate_limit_error",
        ApiErrorKind::Unavailable { .. } => "overloaded_error",
        ApiErrorKind::Internal => "api_error",
    };
    let message = match &e.param {
        Some(p) if !e.message.starts_with(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": ty, "message": message}})
}

/// [`error_body`] with the error's status and headers.
pub fn error_response(e: ApiError) -> Response {
    use axum::http::{header, HeaderValue, StatusCode};
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        error_body(&e).to_string(),
    )
        .into_response();
    if let Some(s) = e.retry_after() {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// An Anthropic message id.
pub fn new_id() -> String {
    format!("msg_{}", &runtime::tools::new_call_id()["call_".len()..])
}

/// A call id in Anthropic's form (`toolu_…`).
fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// A call's arguments as the object Anthropic's `input` is (`{}` where the model's text
/// was not an object).
fn input_of(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

fn stop_reason(end: &End) -> (&'static str, Value) {
    if end.called {
        return ("tool_use", Value::Null);
    }
    match (end.finish, &end.stop) {
        (FinishReason::Stop, Some(s)) => ("stop_sequence", json!(s)),
        (FinishReason::Stop, None) => ("end_turn", Value::Null),
        (FinishReason::Length | FinishReason::Context, _) => ("max_tokens", Value::Null),
    }
}

fn usage(end: &End) -> Value {
    let u = &end.usage;
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens.min(u.prompt_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
        "output_tokens": u.completion_tokens,
    })
}

/// The non-streamed message.
pub fn full(id: &str, model: &str, a: &Answer, end: &End) -> Value {
    let mut content = Vec::new();
    if !a.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": a.reasoning, "signature": ""}));
    }
    if !a.content.is_empty() || a.calls.is_empty() {
        content.push(json!({"type": "text", "text": a.content}));
    }
    for c in &a.calls {
        content.push(json!({"type": "tool_use", "id": tool_use_id(&c.id), "name": c.name, "input": input_of(&c.arguments)}));
    }
    let (reason, seq) = stop_reason(end);
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": seq,
        "usage": usage(end),
    })
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// The streamed event sequence of one message.
pub struct Stream {
    id: String,
    model: String,
    prompt_tokens: usize,
    open: Open,
    /// The index of the next content block.
    next: usize,
}

impl Stream {
    pub fn new(id: String, model: String, prompt_tokens: usize) -> Stream {
        Stream {
            id,
            model,
            prompt_tokens,
            open: Open::None,
            next: 0,
        }
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        if self.open != Open::None {
            if self.open == Open::Thinking {
                out.push(event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": self.next - 1,
                        "delta": {"type": "signature_delta", "signature": ""}}),
                ));
            }
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.next - 1}),
            ));
            self.open = Open::None;
        }
    }

    /// Text of a thinking or text block, opening the block first where needed.
    fn delta(&mut self, kind: Open, text: &str, out: &mut Vec<Bytes>) {
        if text.is_empty() {
            return;
        }
        if self.open != kind {
            self.close(out);
            let block = match kind {
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": self.next, "content_block": block}),
            ));
            self.open = kind;
            self.next += 1;
        }
        let delta = match kind {
            Open::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        };
        out.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta}),
        ));
    }
}

impl crate::answer::Encoder for Stream {
    fn start(&mut self) -> Vec<Bytes> {
        let msg = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0, "output_tokens": 0},
        });
        vec![
            event(
                "message_start",
                &json!({"type": "message_start", "message": msg}),
            ),
            event("ping", &json!({"type": "ping"})),
        ]
    }

    fn pieces(&mut self, p: Pieces) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.delta(Open::Thinking, &p.reasoning, &mut out);
        self.delta(Open::Text, &p.content, &mut out);
        for c in p.calls {
            self.close(&mut out);
            let i = self.next;
            self.next += 1;
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": i,
                    "content_block": {"type": "tool_use", "id": tool_use_id(&c.id), "name": c.name, "input": {}}}),
            ));
            out.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": i,
                    "delta": {"type": "input_json_delta", "partial_json": input_of(&c.arguments).to_string()}}),
            ));
            out.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
        out
    }

    fn end(&mut self, end: &End) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.next == 0 {
            // An empty answer is still one (empty) text block, as the full message has.
            out.push(event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            self.open = Open::Text;
            self.next = 1;
        }
        self.close(&mut out);
        let (reason, seq) = stop_reason(end);
        out.push(event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage(end)}),
        ));
        out.push(event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Bytes> {
        vec![event("error", &error_body(e))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_loop_translates_to_chat_turns() {
        let v = json!({
            "model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                    {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "temperature": 0.5, "stream": true,
        });
        let c = to_chat(&v, true).unwrap();
        let m = c["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "Thanks"}));
        assert_eq!(c["tool_choice"], "required");
        assert_eq!(c["parallel_tool_calls"], false);
        assert_eq!(
            c["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(c["stop"], json!(["END"]));
        assert_eq!(c["stream_options"]["include_usage"], true);
        let raw: RawRequest = serde_json::from_value(c).unwrap();
        assert_eq!(raw.max_tokens, Some(50));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let base = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            to_chat(&b, true).unwrap_err()
        };
        assert_eq!(
            with("temperature", json!(1.5)).param.as_deref(),
            Some("temperature")
        );
        assert_eq!(
            with("messages", json!([{"role": "system", "content": "x"}]))
                .param
                .as_deref(),
            Some("messages[0]")
        );
        let img = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert_eq!(
            with("messages", img).param.as_deref(),
            Some("messages[0].content[0]")
        );
        let e = with(
            "tools",
            json!([{"type": "web_search_20250305", "name": "web_search"}]),
        );
        assert_eq!(e.param.as_deref(), Some("tools[0]"));
        let mut no_max = base.clone();
        no_max.as_object_mut().unwrap().remove("max_tokens");
        assert_eq!(
            to_chat(&no_max, true).unwrap_err().param.as_deref(),
            Some("max_tokens")
        );
        assert!(to_chat(&no_max, false).is_ok());
        let body = error_body(&with("messages", json!([{"role": "user"}])));
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let m = body["error"]["message"].as_str().unwrap();
        assert!(m.starts_with("messages[0]: content must be"), "{m}");
    }
}
