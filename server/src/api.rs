//! OpenAI request validation and response shapes, independent of HTTP: a request body
//! becomes prompt tokens and [`GenParams`] or an [`ApiError`] that names the bad field;
//! engine events become `text_completion` / `chat.completion` objects and their streaming
//! chunks.

use serde::Deserialize;
use serde_json::{json, Value};

use runtime::chat::{ChatMessage, ChatTemplate, RenderArgs, ToolCallMsg};
use runtime::reasoning::ReasoningFormat;
use runtime::sampling::SamplingParams;
use runtime::tokenizer::Tokenizer;
use runtime::tools::{ToolCall, ToolCallSplitter, ToolSyntax};

use crate::engine::{FinishReason, GenParams, TokenLogprobs, TopLogprob, Usage};
use crate::error::{ApiError, ApiErrorKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Completion,
    Chat,
}

/// The fields both endpoints share. Loosely typed where OpenAI allows several shapes, so
/// that errors can name the field; unknown fields are ignored, as OpenAI clients send
/// extras.
#[derive(Deserialize, Debug, Default)]
pub struct RawRequest {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub messages: Option<Value>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<Value>,
    pub stop: Option<Value>,
    pub n: Option<i64>,
    pub best_of: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub ignore_eos: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    /// vLLM's prefix-cache isolation salt: requests with different salts never share
    /// cached blocks.
    pub cache_salt: Option<Value>,
    /// `{"token id": bias}`, bias in [-100, 100], added to the logits before sampling.
    pub logit_bias: Option<Value>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<Value>,
    /// llama-server's: `none` returns the raw text; `auto` (the default) and `deepseek`
    /// return the reasoning apart, in `reasoning_content`.
    pub reasoning_format: Option<Value>,
    /// More template variables (`{"enable_thinking": false}`), as llama-server and vLLM.
    pub chat_template_kwargs: Option<Value>,
    /// Chat: `[{"type": "function", "function": {"name", "description", "parameters"}}]`.
    pub tools: Option<Value>,
    /// Chat: `none`, `auto` (the default with tools), `required`, or
    /// `{"type": "function", "function": {"name": …}}`.
    pub tool_choice: Option<Value>,
    /// Chat: whether one answer may make several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Speculative decoding for this request, where the server has it on (`--spec`):
    /// `false` turns it off, `{"n_max": N}` caps the draft length (0: off).
    pub speculative: Option<Value>,
    /// llama-server's spelling of the cap: `"speculative.n_max": N`.
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<Value>,
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// A validated generation request.
#[derive(Debug)]
pub struct Parsed {
    pub kind: Kind,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub stream: bool,
    pub include_usage: bool,
    pub cache_salt: Option<String>,
    /// How many choices to generate for the prompt (OpenAI's `n`).
    pub n: usize,
    /// Chat: how the answer marks its reasoning, and whether the prompt opened it (the
    /// text is split per choice into `reasoning_content` and `content`).
    pub reasoning: Option<(ReasoningFormat, bool)>,
    /// Chat with tools: how the answer's calls are read.
    pub tools: Option<ToolPlan>,
}

/// How a chat answer's tool calls are taken out of its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolPlan {
    pub syntax: ToolSyntax,
    /// The answer is forced to be one call (`tool_choice` `required` or a named function):
    /// the prompt ends with the syntax's opening and the answer is the call's JSON.
    pub forced: bool,
    /// More than one call may be returned (`parallel_tool_calls`).
    pub parallel: bool,
}

impl ToolPlan {
    pub fn splitter(&self) -> ToolCallSplitter {
        match self.forced {
            true => ToolCallSplitter::forced(self.syntax),
            false => ToolCallSplitter::new(self.syntax),
        }
    }
}

/// The most tools one request may describe.
const MAX_TOOLS: usize = 128;

/// A request's tools in the shape templates read (llama-server's: `name`, `description`,
/// `parameters`, in that order; a missing description is empty, missing parameters an
/// empty object).
fn parse_tools(v: &Option<Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("tools", "tools must be an array")),
    };
    if list.len() > MAX_TOOLS {
        return Err(bad(
            "tools",
            format!("at most {MAX_TOOLS} tools, got {}", list.len()),
        ));
    }
    let mut names = std::collections::HashSet::new();
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let param = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad(&param, "only tools of type \"function\" are supported"));
            }
            let f = t
                .get("function")
                .filter(|f| f.is_object())
                .ok_or_else(|| bad(&param, "a tool needs a function object"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| {
                    (1..=64).contains(&n.len())
                        && n.bytes().all(|b| {
                            b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
                        })
                })
                .ok_or_else(|| {
                    bad(
                        &param,
                        "function.name must be 1 to 64 letters, digits, '_', '-' or '.'",
                    )
                })?;
            if !names.insert(name.to_string()) {
                return Err(bad(&param, format!("two tools are named {name:?}")));
            }
            let description = match f.get("description") {
                None | Some(Value::Null) => "",
                Some(Value::String(d)) => d.as_str(),
                Some(_) => return Err(bad(&param, "function.description must be a string")),
            };
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => json!({}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => return Err(bad(&param, "function.parameters must be an object")),
            };
            Ok(json!({
                "type": "function",
                "function": {"name": name, "description": description, "parameters": parameters},
            }))
        })
        .collect()
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

fn tool_choice(v: &Option<Value>, tools: &[Value]) -> Result<ToolChoice, ApiError> {
    let c = match v {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "tool_choice must be none, auto, required or a function, got {other:?}"
                    ),
                ))
            }
        },
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    bad(
                        "tool_choice",
                        "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !tools.iter().any(|t| t["function"]["name"] == name) {
                return Err(bad(
                    "tool_choice",
                    format!("tool_choice names {name:?}, which is not among the tools"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "tool_choice must be a string or an object",
            ))
        }
    };
    if tools.is_empty() && matches!(c, ToolChoice::Required | ToolChoice::Named(_)) {
        return Err(bad("tool_choice", "tool_choice needs tools"));
    }
    Ok(c)
}

/// The system text that describes tools to a model whose template does not (its calls are
/// forced and constrained, so the text only has to say what to write).
fn generic_tools_text(tools: &[Value]) -> String {
    let mut s =
        String::from("You can call the functions described below, as JSON, one per line:\n");
    for t in tools {
        s.push_str(&t["function"].to_string());
        s.push('\n');
    }
    s.push_str(
        "To call one, answer with only a JSON object {\"name\": <the function's name>, \
         \"arguments\": <an object of its arguments>}.",
    );
    s
}

const MAX_STOPS: usize = 16;
const MAX_LOGPROBS: usize = 20;
/// The most choices one request may ask for.
pub const MAX_N: usize = 16;

/// OpenAI's `finish_reason`: a full context is reported as `length`, as OpenAI and
/// llama-server do.
fn openai_finish(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length | FinishReason::Context => "length",
    }
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// Parses a JSON body, turning serde's complaints into a 400 that names the problem.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::new(ApiErrorKind::InvalidRequest, format!("{what}: {e}"))
    })
}

/// Seed for requests that give none: different per request, so sampling varies as users
/// expect, while requests that give one are reproducible.
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
}

fn sampling(r: &RawRequest) -> Result<SamplingParams, ApiError> {
    let f = |name: &str, v: Option<f64>, lo: f64, hi: f64, default: f64| -> Result<f32, ApiError> {
        match v {
            None => Ok(default as f32),
            Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(x as f32),
            Some(x) => Err(bad(
                name,
                format!("{name} must be in [{lo}, {hi}], got {x}"),
            )),
        }
    };
    let temperature = f("temperature", r.temperature, 0.0, 2.0, 1.0)?;
    let top_p = f("top_p", r.top_p, 0.0, 1.0, 1.0)?;
    if top_p == 0.0 {
        return Err(bad("top_p", "top_p must be in (0, 1], got 0"));
    }
    let min_p = f("min_p", r.min_p, 0.0, 1.0, 0.0)?;
    let repeat = r.repeat_penalty.or(r.repetition_penalty);
    let repeat_penalty = f("repeat_penalty", repeat, 0.01, 10.0, 1.0)?;
    let presence_penalty = f("presence_penalty", r.presence_penalty, -2.0, 2.0, 0.0)?;
    let frequency_penalty = f("frequency_penalty", r.frequency_penalty, -2.0, 2.0, 0.0)?;
    let top_k = match r.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if (1..=1_000_000).contains(&k) => k as usize,
        Some(k) => {
            return Err(bad(
                "top_k",
                format!("top_k must be -1 or 0 (off) or in [1, 1000000], got {k}"),
            ))
        }
    };
    let seed = match &r.seed {
        None | Some(Value::Null) => fresh_seed(),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u,
            (None, Some(i)) => i as u64,
            _ => return Err(bad("seed", "seed must be an integer")),
        },
        Some(_) => return Err(bad("seed", "seed must be an integer")),
    };
    let p = SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repeat_penalty,
        penalty_last_n: 64,
        presence_penalty,
        frequency_penalty,
        seed,
    };
    p.validate()
        .map_err(|m| ApiError::new(ApiErrorKind::InvalidRequest, m))?;
    Ok(p)
}

fn stops(v: &Option<Value>) -> Result<Vec<String>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("stop", "stop must be a string or an array of strings"))?,
        Some(_) => return Err(bad("stop", "stop must be a string or an array of strings")),
    };
    if list.len() > MAX_STOPS {
        return Err(bad(
            "stop",
            format!("at most {MAX_STOPS} stop strings, got {}", list.len()),
        ));
    }
    if list.iter().any(|s| s.is_empty() || s.len() > 1024) {
        return Err(bad("stop", "stop strings must be 1 to 1024 bytes long"));
    }
    Ok(list)
}

fn prompt_tokens(v: &Option<Value>, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let n_vocab = tok.n_vocab();
    let as_ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| match x.as_u64() {
                Some(id) if (id as usize) < n_vocab => Ok(id as u32),
                _ => Err(bad(
                    "prompt",
                    format!("token ids must be integers in [0, {n_vocab}), got {x}"),
                )),
            })
            .collect()
    };
    let one_text = |s: &str| tok.encode(s, true, true);
    match v {
        None | Some(Value::Null) => Err(bad("prompt", "prompt is required")),
        Some(Value::String(s)) => Ok(one_text(s)),
        Some(Value::Array(a)) if a.is_empty() => Err(bad("prompt", "prompt is empty")),
        Some(Value::Array(a)) => match &a[0] {
            Value::String(_) if a.len() == 1 => Ok(one_text(a[0].as_str().unwrap_or(""))),
            Value::Number(_) => as_ids(a),
            Value::Array(inner) if a.len() == 1 => as_ids(inner),
            Value::String(_) | Value::Array(_) => Err(bad(
                "prompt",
                "only one prompt per request is supported (batch prompts: send one request each)",
            )),
            _ => Err(bad(
                "prompt",
                "prompt must be a string, an array of token ids, or an array of one of these",
            )),
        },
        Some(_) => Err(bad(
            "prompt",
            "prompt must be a string, an array of token ids, or an array of one of these",
        )),
    }
}

/// Chat messages from the request, with content given as a string or as text parts.
pub fn chat_messages(v: &Option<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(Value::Array(a)) = v else {
        return Err(bad("messages", "messages must be a non-empty array"));
    };
    if a.is_empty() {
        return Err(bad("messages", "messages must be a non-empty array"));
    }
    a.iter()
        .enumerate()
        .map(|(i, m)| {
            let param = format!("messages[{i}]");
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(&param, "each message needs a string role"))?;
            if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(bad(&param, format!("unknown role {role:?}")));
            }
            let content = match m.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.get("type").and_then(Value::as_str), p.get("text")) {
                            (Some("text"), Some(Value::String(t))) => s.push_str(t),
                            _ => {
                                return Err(bad(
                                    &param,
                                    "only text content parts ({\"type\":\"text\",\"text\":...}) are supported",
                                ))
                            }
                        }
                    }
                    s
                }
                Some(_) => return Err(bad(&param, "content must be a string or an array of parts")),
            };
            let role = if role == "developer" { "system" } else { role };
            let mut msg = ChatMessage::new(role, &content);
            match m.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(calls)) if role == "assistant" => {
                    for (k, c) in calls.iter().enumerate() {
                        let f = c.get("function");
                        let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                        let arguments = match f.and_then(|f| f.get("arguments")) {
                            None | Some(Value::Null) => Some("{}".to_string()),
                            Some(Value::String(a)) => Some(a.clone()),
                            Some(a @ Value::Object(_)) => Some(a.to_string()),
                            Some(_) => None,
                        };
                        let (Some(name), Some(arguments)) = (name, arguments) else {
                            return Err(bad(
                                &format!("{param}.tool_calls[{k}]"),
                                "a tool call needs function.name and function.arguments (a JSON string)",
                            ));
                        };
                        msg.tool_calls.push(ToolCallMsg {
                            id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                            name: name.to_string(),
                            arguments,
                        });
                    }
                }
                Some(_) => {
                    return Err(bad(
                        &param,
                        "tool_calls must be an array, on an assistant message",
                    ))
                }
            }
            if role == "tool" {
                msg.tool_call_id = m.get("tool_call_id").and_then(Value::as_str).map(str::to_string);
            }
            msg.name = m.get("name").and_then(Value::as_str).map(str::to_string);
            Ok(msg)
        })
        .collect()
}

/// Renders chat messages with the model's template and tokenizes them. The template's
/// BOS text is dropped when the tokenizer adds BOS itself, so it is not doubled. Returns
/// the tokens and the rendered text.
pub fn chat_prompt(
    msgs: &[ChatMessage],
    args: &RenderArgs,
    template: &ChatTemplate,
    tok: &Tokenizer,
) -> Result<(Vec<u32>, String), ApiError> {
    chat_prompt_with(msgs, args, template, tok, "")
}

/// [`chat_prompt`] with `prefill` appended to the rendered text (the opening of a forced
/// tool call).
fn chat_prompt_with(
    msgs: &[ChatMessage],
    args: &RenderArgs,
    template: &ChatTemplate,
    tok: &Tokenizer,
    prefill: &str,
) -> Result<(Vec<u32>, String), ApiError> {
    let mut text = template
        .render_with(msgs, args)
        .map_err(|e| bad("messages", format!("cannot apply the chat template: {e}")))?;
    text.push_str(prefill);
    if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
        let bos_text = tok.token_text(bos);
        if !bos_text.is_empty() && text.starts_with(bos_text) {
            text = text[bos_text.len()..].to_string();
        }
    }
    Ok((tok.encode(&text, true, true), text))
}

/// The template variables and reasoning split a chat request asks for.
fn chat_args(r: &RawRequest) -> Result<(RenderArgs, bool), ApiError> {
    let mut args = RenderArgs {
        add_generation_prompt: r.add_generation_prompt.unwrap_or(true),
        ..RenderArgs::default()
    };
    match &r.chat_template_kwargs {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            if m.len() > 64 {
                return Err(bad("chat_template_kwargs", "at most 64 template variables"));
            }
            for (k, v) in m {
                if k == "enable_thinking" {
                    args.enable_thinking = v.as_bool().ok_or_else(|| {
                        bad("chat_template_kwargs", "enable_thinking must be a boolean")
                    })?;
                }
                args.kwargs.push((k.clone(), v.clone()));
            }
        }
        Some(_) => return Err(bad("chat_template_kwargs", "must be an object")),
    }
    let split = match &r.reasoning_format {
        None | Some(Value::Null) => true,
        Some(Value::String(f)) => match f.as_str() {
            "none" => false,
            "auto" | "deepseek" | "deepseek-legacy" => true,
            other => {
                return Err(bad(
                    "reasoning_format",
                    format!("reasoning_format must be none, auto or deepseek, got {other:?}"),
                ))
            }
        },
        Some(_) => return Err(bad("reasoning_format", "must be a string")),
    };
    Ok((args, split))
}

/// A chat request's prompt and how its answer is read.
pub struct ChatRequest {
    pub prompt: Vec<u32>,
    pub reasoning: Option<(ReasoningFormat, bool)>,
    pub tools: Option<ToolPlan>,
    /// The constraint of a forced tool call.
    pub forced_format: Option<crate::constrain::Format>,
}

/// Renders a chat request's messages and tools with the model's template and tokenizes
/// them (also what `count_tokens` counts).
pub fn chat_request(
    r: &RawRequest,
    tok: &Tokenizer,
    template: &ChatTemplate,
) -> Result<ChatRequest, ApiError> {
    let mut forced_format = None;
    let mut msgs = chat_messages(&r.messages)?;
    let (mut args, split) = chat_args(r)?;
    let tools = parse_tools(&r.tools)?;
    let choice = tool_choice(&r.tool_choice, &tools)?;
    // The template's probes run only for a request with tools to offer.
    let offering = !tools.is_empty() && choice != ToolChoice::None;
    let reads_tools = offering && template.caps().is_some_and(|c| c.tools);
    let syntax = match offering {
        true => template.tool_syntax(),
        false => ToolSyntax::Generic,
    };
    let parallel = r.parallel_tool_calls.unwrap_or(true);
    let mut prefill = "";
    let plan = match &choice {
        _ if tools.is_empty() => None,
        ToolChoice::None => None,
        // A template without tool support is not told of the tools, and its
        // model's text is never read as calls.
        ToolChoice::Auto if !reads_tools || syntax == ToolSyntax::Generic => None,
        ToolChoice::Auto => {
            args.tools = tools.clone();
            Some(ToolPlan {
                syntax,
                forced: false,
                parallel,
            })
        }
        ToolChoice::Required | ToolChoice::Named(_) => {
            if r.response_format.as_ref().is_some_and(|v| !v.is_null()) {
                return Err(bad(
                    "response_format",
                    "response_format cannot be combined with a required or named tool_choice",
                ));
            }
            let offered: Vec<&Value> = match &choice {
                ToolChoice::Named(n) => tools
                    .iter()
                    .filter(|t| t["function"]["name"] == n.as_str())
                    .collect(),
                _ => tools.iter().collect(),
            };
            let names: Vec<&str> = offered
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect();
            // The call's schema enumerates the names and, for several functions, their
            // parameters together: both within what the constraint engine enforces.
            if names.len() > crate::constrain::MAX_PROPS {
                return Err(bad(
                    "tool_choice",
                    format!(
                        "a required call chooses among at most {} tools, got {}: name one function, or offer fewer",
                        crate::constrain::MAX_PROPS,
                        names.len()
                    ),
                ));
            }
            // One function: its parameters' schema. Several: an object of their
            // parameters together, each at most once and none other (one schema
            // cannot tie the arguments to the name chosen; this bounds them).
            let arguments = match offered.as_slice() {
                [one] => {
                    let p = &one["function"]["parameters"];
                    if p.as_object().is_some_and(|o| o.is_empty()) {
                        json!({"type": "object"})
                    } else {
                        p.clone()
                    }
                }
                several => {
                    let mut props = serde_json::Map::new();
                    for t in several {
                        let own = t["function"]["parameters"]["properties"].as_object();
                        for (k, v) in own.into_iter().flatten() {
                            props.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    }
                    if props.len() > crate::constrain::MAX_PROPS {
                        return Err(bad(
                            "tool_choice",
                            format!(
                                "a required call over several tools takes their parameters together, at most {} of them, got {}: name one function, or offer fewer",
                                crate::constrain::MAX_PROPS,
                                props.len()
                            ),
                        ));
                    }
                    json!({"type": "object", "properties": props, "additionalProperties": false})
                }
            };
            if reads_tools {
                args.tools = tools.clone();
            } else {
                let text = generic_tools_text(&tools);
                match msgs.first_mut().filter(|m| m.role == "system") {
                    Some(sys) => sys.content = format!("{}\n\n{text}", sys.content),
                    None => msgs.insert(0, ChatMessage::new("system", &text)),
                }
            }
            let schema = syntax.forced_schema(&names, &arguments);
            let rf = json!({"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}});
            forced_format = crate::constrain::Format::from_response_format(&rf).map_err(|e| {
                bad(
                    "tools",
                    format!("the function's parameters cannot constrain a forced call: {e}"),
                )
            })?;
            prefill = syntax.forced_prefill();
            Some(ToolPlan {
                syntax,
                forced: true,
                parallel,
            })
        }
    };
    let (ids, text) = chat_prompt_with(&msgs, &args, template, tok, prefill)?;
    let format = template.reasoning_format();
    let forced = plan.is_some_and(|p| p.forced);
    let reasoning = (split && !forced && format != ReasoningFormat::None).then(|| {
        (
            format,
            runtime::reasoning::prompt_opens_reasoning(format, &text),
        )
    });
    Ok(ChatRequest {
        prompt: ids,
        reasoning,
        tools: plan,
        forced_format,
    })
}

/// Validates a request against the model's tokenizer, template and context.
pub fn parse_request(
    kind: Kind,
    r: &RawRequest,
    tok: &Tokenizer,
    template: &ChatTemplate,
    n_ctx: usize,
) -> Result<Parsed, ApiError> {
    let n = match r.n {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(bad("n", format!("n must be in 1..={MAX_N}, got {n}"))),
    };
    if r.best_of.is_some_and(|b| b != 1) {
        return Err(bad("best_of", "only best_of = 1 is supported"));
    }
    if r.echo == Some(true) {
        return Err(bad("echo", "echo is not supported"));
    }
    let sampling = sampling(r)?;
    let stop = stops(&r.stop)?;
    let logprobs = match kind {
        Kind::Completion => match &r.logprobs {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => match n.as_u64() {
                Some(k) if k as usize <= MAX_LOGPROBS => Some(k as usize),
                _ => {
                    return Err(bad(
                        "logprobs",
                        format!("logprobs must be an integer in [0, {MAX_LOGPROBS}]"),
                    ))
                }
            },
            Some(_) => {
                return Err(bad(
                    "logprobs",
                    format!("logprobs must be an integer in [0, {MAX_LOGPROBS}]"),
                ))
            }
        },
        Kind::Chat => {
            let on = match &r.logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("logprobs", "logprobs must be a boolean")),
            };
            match r.top_logprobs {
                None => on.then_some(0),
                Some(k) if !(0..=MAX_LOGPROBS as i64).contains(&k) => {
                    return Err(bad(
                        "top_logprobs",
                        format!("top_logprobs must be in [0, {MAX_LOGPROBS}], got {k}"),
                    ))
                }
                Some(_) if !on => {
                    return Err(bad("top_logprobs", "top_logprobs needs logprobs: true"))
                }
                Some(k) => Some(k as usize),
            }
        }
    };
    let forced_format;
    let (prompt, reasoning, tools) = match kind {
        Kind::Completion => {
            if r.tools.is_some() || r.tool_choice.is_some() {
                return Err(bad("tools", "tools are a chat completions field"));
            }
            forced_format = None;
            (prompt_tokens(&r.prompt, tok)?, None, None)
        }
        Kind::Chat => {
            let c = chat_request(r, tok, template)?;
            forced_format = c.forced_format;
            (c.prompt, c.reasoning, c.tools)
        }
    };
    if prompt.is_empty() {
        return Err(bad("prompt", "the prompt is empty (0 tokens)"));
    }
    let p = prompt.len();
    let (max_param, max_tokens) = match kind {
        Kind::Chat if r.max_completion_tokens.is_some() => {
            ("max_completion_tokens", r.max_completion_tokens)
        }
        _ => ("max_tokens", r.max_tokens),
    };
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(bad(
                max_param,
                format!("{max_param} must be at least 1, got {m}"),
            ))
        }
        Some(m) => {
            let m = m as u64;
            if p as u64 + m > n_ctx as u64 {
                return Err(bad(
                    max_param,
                    format!(
                        "this model's context is {n_ctx} tokens, but the prompt ({p} tokens) plus \
                         {max_param} ({m}) is {} tokens; shorten the prompt or lower {max_param}",
                        p as u64 + m
                    ),
                ));
            }
            m as usize
        }
        None => {
            if p >= n_ctx {
                return Err(bad(
                    "prompt",
                    format!(
                        "this model's context is {n_ctx} tokens, but the prompt alone is {p} \
                         tokens, leaving no room to generate"
                    ),
                ));
            }
            n_ctx - p
        }
    };
    let logit_bias = match &r.logit_bias {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(m)) => {
            let mut v = Vec::with_capacity(m.len());
            for (k, b) in m {
                let id: u32 = k
                    .parse()
                    .ok()
                    .filter(|&id| (id as usize) < tok.n_vocab())
                    .ok_or_else(|| {
                        bad(
                            "logit_bias",
                            format!(
                                "'{k}' is not a token id of this model (0..{})",
                                tok.n_vocab()
                            ),
                        )
                    })?;
                let b = b
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| {
                        bad(
                            "logit_bias",
                            format!("the bias of {k} must be a number in [-100, 100]"),
                        )
                    })?;
                v.push((id, b as f32));
            }
            v
        }
        Some(_) => {
            return Err(bad(
                "logit_bias",
                "logit_bias must be an object of token id -> bias",
            ))
        }
    };
    let format = match &r.response_format {
        _ if forced_format.is_some() => forced_format,
        None | Some(Value::Null) => None,
        Some(v) => crate::constrain::Format::from_response_format(v)
            .map_err(|e| bad("response_format", e))?,
    };
    let cap = |v: &Value, field: &str| {
        v.as_u64()
            .filter(|&n| n <= 1 << 16)
            .map(|n| n as usize)
            .ok_or_else(|| {
                // Numbers are echoed; anything else only by its kind (a client's value may
                // be as large as the body).
                let got = match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(_) => "a string".into(),
                    Value::Array(_) => "an array".into(),
                    Value::Object(_) => "an object".into(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => "null".into(),
                };
                bad(
                    field,
                    format!("{field} must be a whole number up to 65536, got {got}"),
                )
            })
    };
    let spec_max = match (&r.speculative, &r.speculative_n_max) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "speculative",
                "give speculative or speculative.n_max, not both",
            ))
        }
        (None | Some(Value::Null), None) => None,
        (Some(Value::Bool(on)), None) => (!on).then_some(0),
        (Some(Value::Object(o)), None) => match o.get("n_max") {
            None | Some(Value::Null) => None,
            Some(v) => Some(cap(v, "speculative.n_max")?),
        },
        (Some(_), None) => {
            return Err(bad(
                "speculative",
                "speculative must be true, false or {\"n_max\": N}",
            ))
        }
        (_, Some(v)) => Some(cap(v, "speculative.n_max")?),
    };
    Ok(Parsed {
        kind,
        prompt,
        params: GenParams {
            max_tokens,
            sampling,
            stop,
            logprobs,
            ignore_eos: r.ignore_eos.unwrap_or(false),
            logit_bias,
            format,
            special_text: reasoning.is_some_and(|(f, _)| f.needs_special_text()),
            embed: None,
            spec_max,
        },
        stream: r.stream.unwrap_or(false),
        include_usage: r
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        n,
        reasoning,
        tools,
        cache_salt: match &r.cache_salt {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 1024 => Some(s.clone()),
            Some(_) => {
                return Err(bad(
                    "cache_salt",
                    "cache_salt must be a non-empty string of at most 1024 bytes",
                ))
            }
        },
    })
}

pub fn new_id(kind: Kind) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    format!(
        "{prefix}-{:08x}{:08x}",
        fresh_seed() as u32,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn top_json(t: &TopLogprob) -> Value {
    json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes})
}

/// Logprobs of some tokens in the response's format, with the text offset of the first.
pub fn logprobs_json(kind: Kind, lps: &[TokenLogprobs], text_offset: usize) -> Value {
    match kind {
        Kind::Chat => json!({
            "content": lps.iter().map(|l| {
                let mut v = top_json(&l.chosen);
                v["top_logprobs"] = Value::Array(l.top.iter().map(top_json).collect());
                v
            }).collect::<Vec<_>>()
        }),
        Kind::Completion => {
            let mut offsets = Vec::with_capacity(lps.len());
            let mut off = text_offset;
            for l in lps {
                offsets.push(off);
                off += l.chosen.token.len();
            }
            json!({
                "tokens": lps.iter().map(|l| l.chosen.token.clone()).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|l| l.chosen.logprob).collect::<Vec<_>>(),
                "top_logprobs": lps.iter().map(|l| {
                    l.top.iter().map(|t| (t.token.clone(), json!(t.logprob))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// Everything needed to render responses of one request.
pub struct ResponseMeta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Chat: the reasoning split of [`Parsed::reasoning`].
    pub reasoning: Option<(ReasoningFormat, bool)>,
    /// Chat: how tool calls are read ([`Parsed::tools`]).
    pub tools: Option<ToolPlan>,
}

/// A tool call as OpenAI returns it (`index`: its place in a stream's delta).
pub fn tool_call_json(c: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// One finished choice of a non-streaming response.
pub struct Choice<'a> {
    pub text: &'a str,
    /// Chat: the reasoning split from the text (`reasoning_content`), if any.
    pub reasoning: Option<&'a str>,
    pub finish: FinishReason,
    pub logprobs: Option<&'a [TokenLogprobs]>,
    /// Chat: the tool calls taken out of the text.
    pub tool_calls: &'a [ToolCall],
}

impl ResponseMeta {
    /// The non-streaming response: one entry of `choices` per generated choice, in order.
    pub fn full(&self, choices: &[Choice], usage: &Usage) -> Value {
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let lp = c
                    .logprobs
                    .map_or(Value::Null, |l| logprobs_json(self.kind, l, 0));
                match self.kind {
                    Kind::Completion => json!({
                        "index": i, "text": c.text, "logprobs": lp,
                        "finish_reason": openai_finish(c.finish),
                    }),
                    Kind::Chat => {
                        let mut message = json!({"role": "assistant", "content": c.text});
                        if let Some(r) = c.reasoning.filter(|r| !r.is_empty()) {
                            message["reasoning_content"] = json!(r);
                        }
                        let mut finish = openai_finish(c.finish);
                        if !c.tool_calls.is_empty() {
                            if c.text.is_empty() {
                                message["content"] = Value::Null;
                            }
                            message["tool_calls"] = c
                                .tool_calls
                                .iter()
                                .map(|t| tool_call_json(t, None))
                                .collect();
                            finish = "tool_calls";
                        }
                        json!({
                            "index": i,
                            "message": message,
                            "logprobs": lp,
                            "finish_reason": finish,
                        })
                    }
                }
            })
            .collect();
        json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage_json(usage),
        })
    }

    fn chunk(&self, choices: Value, usage: Option<&Usage>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": match self.kind { Kind::Completion => "text_completion", Kind::Chat => "chat.completion.chunk" },
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = usage_json(u);
        }
        v
    }

    /// The opening chunk of choice `index` (chat: the assistant role), if the format has
    /// one.
    pub fn first_chunk(&self, index: usize) -> Option<Value> {
        match self.kind {
            Kind::Chat => Some(self.chunk(
                json!([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                None,
            )),
            Kind::Completion => None,
        }
    }

    /// A chunk of choice `index` with new text, and/or the finish reason for its last one.
    pub fn text_chunk(
        &self,
        index: usize,
        text: &str,
        logprobs: Option<Value>,
        finish: Option<FinishReason>,
    ) -> Value {
        let fr = finish.map_or(Value::Null, |f| json!(openai_finish(f)));
        let lp = logprobs.unwrap_or(Value::Null);
        let choice = match self.kind {
            Kind::Completion => {
                json!({"index": index, "text": text, "logprobs": lp, "finish_reason": fr})
            }
            Kind::Chat => {
                let delta = if text.is_empty() && finish.is_some() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": fr})
            }
        };
        self.chunk(json!([choice]), None)
    }

    /// A chunk of choice `index` with its `k`-th tool call, whole.
    pub fn tool_call_chunk(&self, index: usize, k: usize, call: &ToolCall) -> Value {
        self.chunk(
            json!([{"index": index, "delta": {"tool_calls": [tool_call_json(call, Some(k))]}, "logprobs": null, "finish_reason": null}]),
            None,
        )
    }

    /// The last chunk of choice `index` when it made tool calls.
    pub fn tool_calls_finish_chunk(&self, index: usize) -> Value {
        self.chunk(
            json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"}]),
            None,
        )
    }

    /// A chunk of choice `index` with new reasoning (`delta.reasoning_content`).
    pub fn reasoning_chunk(&self, index: usize, text: &str, logprobs: Option<Value>) -> Value {
        let lp = logprobs.unwrap_or(Value::Null);
        self.chunk(
            json!([{"index": index, "delta": {"reasoning_content": text}, "logprobs": lp, "finish_reason": null}]),
            None,
        )
    }

    /// A new splitter for one choice's text.
    pub fn answer_splitter(&self) -> crate::answer::AnswerSplitter {
        crate::answer::AnswerSplitter::new(self.reasoning, self.tools)
    }

    /// The usage chunk of `stream_options.include_usage` (no choices).
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        self.chunk(json!([]), Some(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> RawRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn sampling_ranges_are_checked_by_name() {
        let e = sampling(&raw(json!({"temperature": 3.5}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = sampling(&raw(json!({"top_k": -7}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_k"));
        let e = sampling(&raw(json!({"top_p": 0.0}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_p"));
        let e = sampling(&raw(json!({"seed": "x"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("seed"));
        let p = sampling(&raw(
            json!({"temperature": 0, "top_k": -1, "seed": 18446744073709551615u64}),
        ))
        .unwrap();
        assert_eq!((p.temperature, p.top_k, p.seed), (0.0, 0, u64::MAX));
    }

    #[test]
    fn stops_accept_a_string_or_a_list() {
        assert_eq!(stops(&Some(json!("x"))).unwrap(), vec!["x"]);
        assert_eq!(stops(&Some(json!(["a", "b"]))).unwrap(), vec!["a", "b"]);
        assert!(stops(&Some(json!([1]))).is_err());
        assert!(stops(&Some(json!([""]))).is_err());
        assert!(stops(&Some(json!(7))).is_err());
    }

    #[test]
    fn wrong_types_and_bad_json_are_400s() {
        let e = parse_json::<RawRequest>(br#"{"max_tokens": "ten"}"#).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.message.contains("invalid type"), "{}", e.message);
        let e = parse_json::<RawRequest>(b"{\"prompt\": ").unwrap_err();
        assert!(e.message.starts_with("malformed JSON"), "{}", e.message);
        let e = parse_json::<RawRequest>(b"[1,2]").unwrap_err();
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn chat_content_parts_and_roles() {
        let m = chat_messages(&Some(json!([
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
        ])))
        .unwrap();
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "hi there");
        assert!(chat_messages(&Some(json!([{"role": "wizard", "content": "x"}]))).is_err());
        assert!(chat_messages(&Some(json!([]))).is_err());
        assert!(chat_messages(&Some(
            json!([{"role": "user", "content": [{"type": "image_url"}]}])
        ))
        .is_err());
    }

    #[test]
    fn usage_reports_cached_tokens() {
        let u = usage_json(&Usage {
            prompt_tokens: 30,
            completion_tokens: 5,
            cached_tokens: 16,
        });
        assert_eq!(u["total_tokens"], 35);
        assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 16);
    }
}
