//! OpenAI's Responses API (`POST /v1/responses`) over the chat generation path: `input`
//! (text or items: messages, `function_call`, `function_call_output`), `instructions`,
//! function tools, `text.format` and the sampling fields become an OpenAI chat request
//! ([`parse`]); the answer's pieces ([`crate::answer`]) become output items (`reasoning`,
//! `message`, `function_call`), streamed as `response.*` events.
//!
//! `previous_response_id` continues a stored conversation: each stored response keeps its
//! whole conversation (earlier turns, its input and its output; never its
//! `instructions`, which OpenAI does not carry over) in a bounded in-memory [`Store`],
//! evicted oldest first. A stored response belongs to the API key that made it; another
//! key's id is not found.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use serde_json::{json, Map, Value};

use crate::answer::{Answer, End, Pieces};
use crate::api::RawRequest;
use crate::engine::FinishReason;
use crate::error::{ApiError, ApiErrorKind};

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// Stored conversations for `previous_response_id`, oldest evicted first once there are
/// more than `max_entries` or their JSON passes `max_bytes`.
pub struct Store {
    max_entries: usize,
    max_bytes: usize,
    inner: Mutex<Stored>,
}

#[derive(Default)]
struct Stored {
    order: VecDeque<String>,
    map: HashMap<String, Entry>,
    bytes: usize,
}

struct Entry {
    owner: Option<String>,
    messages: Arc<Vec<Value>>,
    bytes: usize,
}

/// The default bound on the bytes of stored conversations.
pub const DEFAULT_STORE_BYTES: usize = 64 << 20;

impl Store {
    pub fn new(max_entries: usize, max_bytes: usize) -> Store {
        Store {
            max_entries,
            max_bytes,
            inner: Mutex::new(Stored::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The conversation of response `id`, if it is stored and `owner`'s.
    pub fn get(&self, id: &str, owner: Option<&str>) -> Option<Arc<Vec<Value>>> {
        let s = self.lock();
        s.map
            .get(id)
            .filter(|e| e.owner.as_deref() == owner)
            .map(|e| e.messages.clone())
    }

    /// Stores a conversation; one larger than the whole bound is not kept.
    pub fn put(&self, id: String, owner: Option<String>, messages: Vec<Value>) {
        let bytes: usize = messages.iter().map(|m| m.to_string().len()).sum();
        if self.max_entries == 0 || bytes > self.max_bytes {
            return;
        }
        let mut s = self.lock();
        while !s.order.is_empty()
            && (s.order.len() >= self.max_entries || s.bytes + bytes > self.max_bytes)
        {
            if let Some(old) = s.order.pop_front() {
                if let Some(e) = s.map.remove(&old) {
                    s.bytes -= e.bytes;
                }
            }
        }
        s.bytes += bytes;
        s.order.push_back(id.clone());
        s.map.insert(
            id,
            Entry {
                owner,
                messages: Arc::new(messages),
                bytes,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Everything a response needs besides the answer: its id, the request fields it echoes,
/// and the conversation to store.
pub struct Context {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    echo: Map<String, Value>,
    /// The conversation so far (earlier turns and this input), without instructions.
    history: Vec<Value>,
    /// Where to keep the conversation once answered (None: `store: false`).
    store: Option<(Arc<Store>, Option<String>)>,
}

/// The text of a message's content: a string or text parts.
fn content_text(v: &Value, param: &str) -> Result<String, ApiError> {
    match v {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut s = String::new();
            for (k, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str).unwrap_or_default();
                match (ty, p.get("text")) {
                    ("input_text" | "output_text" | "text", Some(Value::String(t))) => {
                        s.push_str(t)
                    }
                    _ => {
                        return Err(bad(
                            &format!("{param}[{k}]"),
                            format!("only text parts are supported, got {ty:?}"),
                        ))
                    }
                }
            }
            Ok(s)
        }
        _ => Err(bad(param, "content must be a string or an array of parts")),
    }
}

/// `input` as chat messages.
fn input_messages(v: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match v {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(a) if !a.is_empty() => a,
        _ => {
            return Err(bad(
                "input",
                "input must be a string or a non-empty array of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let param = format!("input[{i}]");
        let ty = it.get("type").and_then(Value::as_str);
        match ty {
            None | Some("message") => {
                let role = it.get("role").and_then(Value::as_str).unwrap_or_default();
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(bad(
                        &param,
                        "a message's role must be user, system, developer or assistant",
                    ));
                }
                let text = content_text(
                    it.get("content").unwrap_or(&Value::Null),
                    &format!("{param}.content"),
                )?;
                out.push(json!({"role": role, "content": text}));
            }
            Some("function_call") => {
                let call_id = it.get("call_id").and_then(Value::as_str);
                let name = it.get("name").and_then(Value::as_str);
                let args = it.get("arguments").and_then(Value::as_str);
                let (Some(call_id), Some(name), Some(args)) = (call_id, name, args) else {
                    return Err(bad(
                        &param,
                        "a function_call item needs call_id, name and arguments (a JSON string)",
                    ));
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}});
                // Calls of one answer join its assistant turn.
                match out.last_mut().filter(|m| m["role"] == "assistant") {
                    Some(m) => match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                        Some(calls) => calls.push(call),
                        None => m["tool_calls"] = json!([call]),
                    },
                    None => out.push(
                        json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                    ),
                }
            }
            Some("function_call_output") => {
                let call_id = it
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(&param, "a function_call_output item needs a call_id"))?;
                let output = content_text(
                    it.get("output").unwrap_or(&Value::Null),
                    &format!("{param}.output"),
                )?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            // Earlier reasoning is not shown to the model again.
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    &param,
                    format!("input items of type {other:?} are not supported (message, function_call, function_call_output, reasoning)"),
                ))
            }
        }
    }
    Ok(out)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex_id(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &runtime::tools::new_call_id()["call_".len()..]
    )
}

/// A Responses request as the chat request it runs as, and its context. `owner`: the
/// API key's label (whose stored responses it may continue).
pub fn parse(
    body: &[u8],
    store: &Arc<Store>,
    owner: Option<&str>,
) -> Result<(RawRequest, Context), ApiError> {
    let v: Value = crate::api::parse_json(body)?;
    let Some(o) = v.as_object() else {
        return Err(ApiError::new(
            ApiErrorKind::InvalidRequest,
            "the request body must be a JSON object",
        ));
    };
    let mut chat = Map::new();
    let mut echo = Map::new();
    if let Some(m) = o.get("model").filter(|m| !m.is_null()) {
        chat.insert("model".into(), m.clone());
    }
    let mut history: Vec<Value> = Vec::new();
    match o.get("previous_response_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => match store.get(id, owner) {
            Some(prev) => {
                history.extend(prev.iter().cloned());
                echo.insert("previous_response_id".into(), json!(id));
            }
            None => {
                return Err(ApiError {
                    kind: ApiErrorKind::NotFound,
                    message: format!(
                        "previous response with id '{id}' not found (it may have been evicted: the store keeps the most recent responses only)"
                    ),
                    param: Some("previous_response_id".into()),
                })
            }
        },
        Some(_) => {
            return Err(bad(
                "previous_response_id",
                "previous_response_id must be a string",
            ))
        }
    }
    history.extend(input_messages(o.get("input").unwrap_or(&Value::Null))?);
    let mut msgs = Vec::with_capacity(history.len() + 1);
    match o.get("instructions") {
        None | Some(Value::Null) => {
            echo.insert("instructions".into(), Value::Null);
        }
        Some(Value::String(s)) => {
            msgs.push(json!({"role": "system", "content": s}));
            echo.insert("instructions".into(), json!(s));
        }
        Some(_) => return Err(bad("instructions", "instructions must be a string")),
    }
    msgs.extend(history.iter().cloned());
    chat.insert("messages".into(), Value::Array(msgs));
    match o.get("tools") {
        None | Some(Value::Null) => {
            echo.insert("tools".into(), json!([]));
        }
        Some(Value::Array(tools)) => {
            let mut out = Vec::with_capacity(tools.len());
            for (i, t) in tools.iter().enumerate() {
                let param = format!("tools[{i}]");
                match t.get("type").and_then(Value::as_str) {
                    Some("function") => {}
                    other => {
                        return Err(bad(
                            &param,
                            format!(
                                "only function tools are available here, got {}",
                                other.unwrap_or("a tool without a type")
                            ),
                        ))
                    }
                }
                let mut f = Map::new();
                for k in ["name", "description", "parameters"] {
                    if let Some(x) = t.get(k) {
                        f.insert(k.into(), x.clone());
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            chat.insert("tools".into(), Value::Array(out));
            echo.insert("tools".into(), Value::Array(tools.clone()));
        }
        Some(_) => return Err(bad("tools", "tools must be an array")),
    }
    match o.get("tool_choice") {
        None | Some(Value::Null) => {
            echo.insert("tool_choice".into(), json!("auto"));
        }
        Some(c @ Value::String(_)) => {
            chat.insert("tool_choice".into(), c.clone());
            echo.insert("tool_choice".into(), c.clone());
        }
        Some(c @ Value::Object(_)) => {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .filter(|_| c.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "a named tool_choice is {\"type\": \"function\", \"name\": ...}",
                    )
                })?;
            chat.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
            echo.insert("tool_choice".into(), c.clone());
        }
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "tool_choice must be a string or an object",
            ))
        }
    }
    match o.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => {
            echo.insert("text".into(), json!({"format": {"type": "text"}}));
        }
        Some(f) => {
            let rf = match f.get("type").and_then(Value::as_str) {
                Some("text") => None,
                Some("json_object") => Some(json!({"type": "json_object"})),
                Some("json_schema") => {
                    let mut js = Map::new();
                    for k in ["name", "schema", "strict"] {
                        if let Some(x) = f.get(k) {
                            js.insert(k.into(), x.clone());
                        }
                    }
                    Some(json!({"type": "json_schema", "json_schema": js}))
                }
                _ => {
                    return Err(bad(
                        "text.format",
                        "text.format.type must be text, json_object or json_schema",
                    ))
                }
            };
            if let Some(rf) = rf {
                chat.insert("response_format".into(), rf);
            }
            echo.insert("text".into(), json!({"format": f}));
        }
    }
    let pass = [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("stream", "stream"),
    ];
    for (from, to) in pass {
        let x = o.get(from).cloned().unwrap_or(Value::Null);
        if !x.is_null() {
            chat.insert(to.into(), x.clone());
        }
        if from != "stream" {
            echo.insert(from.into(), x);
        }
    }
    if o.get("stream").and_then(Value::as_bool) == Some(true) {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let keep = match o.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("store", "store must be a boolean")),
    };
    echo.insert("store".into(), json!(keep));
    echo.insert(
        "metadata".into(),
        o.get("metadata")
            .filter(|m| m.is_object())
            .cloned()
            .unwrap_or_else(|| json!({})),
    );
    let raw: RawRequest = serde_json::from_value(Value::Object(chat)).map_err(|e| {
        ApiError::new(
            ApiErrorKind::InvalidRequest,
            format!("invalid request: {e}"),
        )
    })?;
    let ctx = Context {
        id: hex_id("resp"),
        created_at: now(),
        model: String::new(),
        echo,
        history,
        store: keep.then(|| (store.clone(), owner.map(str::to_string))),
    };
    Ok((raw, ctx))
}

fn usage(end: &End) -> Value {
    let u = &end.usage;
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn incomplete(end: &End) -> bool {
    !end.called && matches!(end.finish, FinishReason::Length | FinishReason::Context)
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = match status {
        "in_progress" => json!([]),
        _ => json!([text_part(text)]),
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, c: &runtime::tools::ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": c.id, "name": c.name,
        "arguments": arguments, "status": status})
}

impl Context {
    /// The response object: `output` so far, `end` once it ended.
    fn object(&self, output: &[Value], end: Option<&End>) -> Value {
        let (status, details) = match end {
            None => ("in_progress", Value::Null),
            Some(e) if incomplete(e) => ("incomplete", json!({"reason": "max_output_tokens"})),
            Some(_) => ("completed", Value::Null),
        };
        let mut v = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "model": self.model, "output": output,
            "error": null, "incomplete_details": details,
            "usage": end.map_or(Value::Null, usage),
        });
        if let Some(o) = v.as_object_mut() {
            for (k, x) in &self.echo {
                o.insert(k.clone(), x.clone());
            }
            o.entry("previous_response_id").or_insert(Value::Null);
        }
        v
    }

    /// Keeps the conversation with its answer, where the request asked to store it.
    fn keep(&mut self, a: &Answer) {
        if let Some((store, owner)) = self.store.take() {
            let mut msgs = std::mem::take(&mut self.history);
            let mut turn = json!({"role": "assistant", "content": a.content});
            if !a.calls.is_empty() {
                turn["tool_calls"] = a
                    .calls
                    .iter()
                    .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                    .collect();
            }
            msgs.push(turn);
            store.put(self.id.clone(), owner, msgs);
        }
    }

    /// The non-streamed response; the conversation is stored.
    pub fn full(&mut self, a: &Answer, end: &End) -> Value {
        let mut output = Vec::new();
        if !a.reasoning.is_empty() {
            output.push(reasoning_item(&hex_id("rs"), &a.reasoning, "completed"));
        }
        if !a.content.is_empty() || a.calls.is_empty() {
            output.push(message_item(&hex_id("msg"), &a.content, "completed"));
        }
        for c in &a.calls {
            output.push(call_item(&hex_id("fc"), c, &c.arguments, "completed"));
        }
        self.keep(a);
        self.object(&output, Some(end))
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Open {
    None,
    Reasoning,
    Message,
}

/// The streamed events of one response.
pub struct Stream {
    ctx: Context,
    seq: u64,
    output: Vec<Value>,
    open: Open,
    /// The open item's id and text so far.
    item_id: String,
    item_text: String,
    answer: Answer,
}

impl Stream {
    pub fn new(ctx: Context) -> Stream {
        Stream {
            ctx,
            seq: 0,
            output: Vec::new(),
            open: Open::None,
            item_id: String::new(),
            item_text: String::new(),
            answer: Answer::default(),
        }
    }

    fn event(&mut self, ty: &str, mut data: Value) -> Bytes {
        data["type"] = json!(ty);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        Bytes::from(format!("event: {ty}\ndata: {data}\n\n"))
    }

    fn close(&mut self, out: &mut Vec<Bytes>) {
        let idx = self.output.len();
        let (id, text) = (self.item_id.clone(), std::mem::take(&mut self.item_text));
        match self.open {
            Open::None => return,
            Open::Reasoning => {
                let e = self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text}),
                );
                out.push(e);
                let item = reasoning_item(&id, &text, "completed");
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": idx, "item": item}),
                );
                out.push(e);
                self.output.push(item);
            }
            Open::Message => {
                let e = self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "text": text, "logprobs": []}),
                );
                out.push(e);
                let e = self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "part": text_part(&text)}),
                );
                out.push(e);
                let item = message_item(&id, &text, "completed");
                let e = self.event(
                    "response.output_item.done",
                    json!({"output_index": idx, "item": item}),
                );
                out.push(e);
                self.output.push(item);
            }
        }
        self.open = Open::None;
    }

    fn delta(&mut self, kind: Open, text: &str, out: &mut Vec<Bytes>) {
        if text.is_empty() {
            return;
        }
        if self.open != kind {
            self.close(out);
            let idx = self.output.len();
            let id = match kind {
                Open::Reasoning => hex_id("rs"),
                _ => hex_id("msg"),
            };
            let item = match kind {
                Open::Reasoning => {
                    json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"})
                }
                _ => message_item(&id, "", "in_progress"),
            };
            let e = self.event(
                "response.output_item.added",
                json!({"output_index": idx, "item": item}),
            );
            out.push(e);
            if kind == Open::Message {
                let e = self.event(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": idx, "content_index": 0, "part": text_part("")}),
                );
                out.push(e);
            }
            self.item_id = id;
            self.open = kind;
        }
        // The open item is not in `output` until it is done.
        let idx = self.output.len();
        self.item_text.push_str(text);
        let id = self.item_id.clone();
        let e = match kind {
            Open::Reasoning => self.event(
                "response.reasoning_text.delta",
                json!({"item_id": id, "output_index": idx, "content_index": 0, "delta": text}),
            ),
            _ => self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": idx, "content_index": 0, "delta": text, "logprobs": []}),
            ),
        };
        out.push(e);
    }
}

impl crate::answer::Encoder for Stream {
    fn start(&mut self) -> Vec<Bytes> {
        let r = self.ctx.object(&[], None);
        let a = self.event("response.created", json!({"response": r}));
        let b = self.event("response.in_progress", json!({"response": r}));
        vec![a, b]
    }

    fn pieces(&mut self, p: Pieces) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.delta(Open::Reasoning, &p.reasoning, &mut out);
        self.delta(Open::Message, &p.content, &mut out);
        self.answer.reasoning += &p.reasoning;
        self.answer.content += &p.content;
        for c in p.calls {
            self.close(&mut out);
            let idx = self.output.len();
            let id = hex_id("fc");
            let e = self.event(
                "response.output_item.added",
                json!({"output_index": idx, "item": call_item(&id, &c, "", "in_progress")}),
            );
            out.push(e);
            let e = self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": id, "output_index": idx, "delta": c.arguments}),
            );
            out.push(e);
            let e = self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": idx, "name": c.name, "arguments": c.arguments}),
            );
            out.push(e);
            let item = call_item(&id, &c, &c.arguments, "completed");
            let e = self.event(
                "response.output_item.done",
                json!({"output_index": idx, "item": item}),
            );
            out.push(e);
            self.output.push(item);
            self.answer.calls.push(c);
        }
        out
    }

    fn end(&mut self, end: &End) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.output.is_empty() && self.open == Open::None {
            // An empty answer is still one (empty) message, as the full response has.
            let id = hex_id("msg");
            let e = self.event(
                "response.output_item.added",
                json!({"output_index": 0, "item": message_item(&id, "", "in_progress")}),
            );
            out.push(e);
            let e = self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": 0, "content_index": 0, "part": text_part("")}),
            );
            out.push(e);
            self.item_id = id;
            self.open = Open::Message;
        }
        self.close(&mut out);
        let answer = std::mem::take(&mut self.answer);
        self.ctx.keep(&answer);
        let r = self.ctx.object(&self.output, Some(end));
        let ty = match incomplete(end) {
            true => "response.incomplete",
            false => "response.completed",
        };
        out.push(self.event(ty, json!({"response": r})));
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Bytes> {
        let v: Value = serde_json::from_str(&e.body_json()).unwrap_or(Value::Null);
        let err = &v["error"];
        let mut r = self.ctx.object(&self.output, None);
        r["status"] = json!("failed");
        r["error"] = json!({"code": err["code"].as_str().unwrap_or(err["type"].as_str().unwrap_or("server_error")), "message": e.message});
        let a = self.event(
            "error",
            json!({"code": err["code"], "message": e.message, "param": e.param}),
        );
        let b = self.event("response.failed", json!({"response": r}));
        vec![a, b]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Arc<Store> {
        Arc::new(Store::new(3, 1 << 20))
    }

    #[test]
    fn items_become_chat_turns() {
        let body = json!({
            "model": "m", "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "w", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "21"},
                {"type": "reasoning", "id": "rs_1", "summary": []}],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "max_output_tokens": 20, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        });
        let (raw, ctx) = parse(body.to_string().as_bytes(), &store(), None).unwrap();
        let m = raw.messages.unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "call_1", "content": "21"})
        );
        assert_eq!(m.as_array().unwrap().len(), 4);
        assert_eq!(raw.max_tokens, Some(20));
        assert_eq!(raw.tool_choice.unwrap()["function"]["name"], "w");
        assert_eq!(raw.response_format.unwrap()["json_schema"]["name"], "x");
        // The instructions are not part of the stored history.
        assert_eq!(ctx.history.len(), 3);
    }

    #[test]
    fn the_store_is_bounded_and_per_owner() {
        let s = store();
        for i in 0..5 {
            s.put(format!("r{i}"), Some("a".into()), vec![json!({"i": i})]);
        }
        assert_eq!(s.len(), 3);
        assert!(s.get("r1", Some("a")).is_none(), "the oldest go first");
        assert!(s.get("r4", Some("a")).is_some());
        assert!(s.get("r4", Some("b")).is_none(), "another key's response");
        assert!(s.get("r4", None).is_none());
        let tiny = Store::new(10, 40);
        tiny.put("x".into(), None, vec![json!({"t": "a".repeat(30)})]);
        tiny.put("y".into(), None, vec![json!({"t": "b".repeat(30)})]);
        assert!(tiny.get("x", None).is_none() && tiny.get("y", None).is_some());
        tiny.put("z".into(), None, vec![json!({"t": "c".repeat(100)})]);
        assert!(tiny.get("z", None).is_none(), "larger than the whole bound");
        let e = parse(
            json!({"input": "hi", "previous_response_id": "r4"})
                .to_string()
                .as_bytes(),
            &s,
            Some("b"),
        )
        .err()
        .unwrap();
        assert_eq!(
            (e.status(), e.param.as_deref()),
            (404, Some("previous_response_id"))
        );
        let (raw, _) = parse(
            json!({"input": "more", "previous_response_id": "r4"})
                .to_string()
                .as_bytes(),
            &s,
            Some("a"),
        )
        .unwrap();
        assert_eq!(raw.messages.unwrap().as_array().unwrap().len(), 2);
    }

    #[test]
    fn unsupported_items_and_tools_are_named() {
        let s = store();
        let e = |b: Value| parse(b.to_string().as_bytes(), &s, None).err().unwrap();
        let x = e(json!({"input": [{"type": "item_reference", "id": "x"}]}));
        assert_eq!(x.param.as_deref(), Some("input[0]"));
        let x = e(json!({"input": "hi", "tools": [{"type": "web_search"}]}));
        assert_eq!(x.param.as_deref(), Some("tools[0]"));
        let x = e(
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
        );
        assert_eq!(x.param.as_deref(), Some("input[0].content[0]"));
        let x = e(json!({"input": 5}));
        assert_eq!(x.param.as_deref(), Some("input"));
    }
}
