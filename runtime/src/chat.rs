//! Chat templates: the GGUF `tokenizer.chat_template` (Jinja) rendered with minijinja, with
//! Python string methods (`.strip()`, `.startswith()` ...) that HF templates rely on, and a
//! built-in fallback for models that ship without a template.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;

use crate::gguf::GgufFile;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An earlier assistant turn's reasoning (Qwen3's template replays it for the turns
    /// after the last user message); absent, not empty, when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant turn's tool calls (arguments as JSON text, as OpenAI sends them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallMsg>,
    /// A `tool` turn: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One tool call of an earlier assistant turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ToolCallMsg {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// What a request asks of the template besides its messages, as llama-server passes it.
#[derive(Clone, Debug)]
pub struct RenderArgs {
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// The template variable `enable_thinking` (llama.cpp always defines it, true unless
    /// the request turns it off: Qwen3 and SmolLM3 then close an empty think block).
    pub enable_thinking: bool,
    /// The clock of `strftime_now` and of the `date_string` / `datetime` variables.
    pub now: std::time::SystemTime,
    /// The request's `chat_template_kwargs`: more template variables (they win over the
    /// ones above, as in llama-server).
    pub kwargs: Vec<(String, serde_json::Value)>,
    /// The request's tools, each `{"type": "function", "function": {"name", "description",
    /// "parameters"}}` (the template variable `tools`; undefined when empty).
    pub tools: Vec<serde_json::Value>,
}

impl Default for RenderArgs {
    fn default() -> RenderArgs {
        RenderArgs {
            add_generation_prompt: true,
            enable_thinking: true,
            now: std::time::SystemTime::now(),
            kwargs: Vec::new(),
            tools: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template error: {0}")]
    Template(String),
}

/// Built-in formats for models without a Jinja template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// `<|im_start|>role\n...<|im_end|>\n`
    ChatMl,
    /// `<start_of_turn>user\n...<end_of_turn>\n`, system text folded into the first user turn.
    Gemma,
    /// `User: ...\nAssistant:` for base models.
    Plain,
}

#[derive(Clone, Debug)]
pub enum ChatTemplate {
    Jinja {
        source: String,
        bos_token: String,
        eos_token: String,
    },
    Builtin(Fallback),
}

impl ChatTemplate {
    /// The model's template, or `over` (a Jinja source: llama-server's
    /// `--chat-template-file`) with the model's BOS and EOS texts.
    pub fn from_gguf_or(f: &GgufFile, over: Option<String>) -> ChatTemplate {
        match over {
            Some(source) => {
                let (bos_token, eos_token) = bos_eos_texts(f);
                ChatTemplate::Jinja {
                    source,
                    bos_token,
                    eos_token,
                }
            }
            None => ChatTemplate::from_gguf(f),
        }
    }

    /// The model's template, or a fallback chosen from the vocabulary's special tokens.
    pub fn from_gguf(f: &GgufFile) -> ChatTemplate {
        if let Ok(Some(src)) = f.get_str("tokenizer.chat_template") {
            let (bos_token, eos_token) = bos_eos_texts(f);
            return ChatTemplate::Jinja {
                source: src.to_string(),
                bos_token,
                eos_token,
            };
        }
        let tokens = f.get_array("tokenizer.ggml.tokens").ok().flatten();
        let has = |t: &str| matches!(tokens, Some(crate::gguf::Array::String(v)) if v.iter().any(|x| x == t));
        ChatTemplate::Builtin(if has("<start_of_turn>") {
            Fallback::Gemma
        } else if has("<|im_start|>") {
            Fallback::ChatMl
        } else {
            Fallback::Plain
        })
    }

    /// How the model marks the reasoning in its answers (read from the template).
    pub fn reasoning_format(&self) -> crate::reasoning::ReasoningFormat {
        match self {
            ChatTemplate::Jinja { source, .. } => {
                crate::reasoning::ReasoningFormat::of_template(source)
            }
            ChatTemplate::Builtin(_) => crate::reasoning::ReasoningFormat::None,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            ChatTemplate::Jinja { .. } => "model's Jinja template".into(),
            ChatTemplate::Builtin(f) => format!("built-in {f:?} template"),
        }
    }

    /// Renders `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_with(
            messages,
            &RenderArgs {
                add_generation_prompt,
                ..RenderArgs::default()
            },
        )
    }

    /// What the template does with system turns and tools (a built-in fallback: nothing).
    pub fn caps(&self) -> Option<TemplateCaps> {
        match self {
            ChatTemplate::Jinja {
                source,
                bos_token,
                eos_token,
            } => Some(template_caps(source, bos_token, eos_token)),
            ChatTemplate::Builtin(_) => None,
        }
    }

    /// The call syntax of the template's model where the template describes tools to it;
    /// `Generic` (calls only when forced) otherwise.
    pub fn tool_syntax(&self) -> crate::tools::ToolSyntax {
        match self {
            ChatTemplate::Jinja { source, .. } if self.caps().is_some_and(|c| c.tools) => {
                crate::tools::ToolSyntax::of_template(source)
            }
            _ => crate::tools::ToolSyntax::Generic,
        }
    }

    /// Renders `messages` as llama.cpp's `--jinja` renders them: the template variables
    /// llama-server defines, and its two adjustments of the conversation (a `developer`
    /// turn is a `system` turn except in gpt-oss's harmony template; a template that
    /// ignores or refuses a system turn gets it prepended to the next turn, joined by a
    /// newline).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        args: &RenderArgs,
    ) -> Result<String, ChatError> {
        match self {
            ChatTemplate::Jinja {
                source,
                bos_token,
                eos_token,
            } => {
                let mut msgs = messages.to_vec();
                if !is_harmony(source) {
                    for m in &mut msgs {
                        if m.role == "developer" {
                            m.role = "system".into();
                        }
                    }
                }
                // The probes run only for a conversation they concern (a template's probe
                // renders cost as much as the render itself), and once per template.
                let needs_caps = msgs.first().is_some_and(|m| m.role == "system")
                    || !args.tools.is_empty()
                    || msgs.iter().any(|m| !m.tool_calls.is_empty());
                let caps = needs_caps.then(|| template_caps(source, bos_token, eos_token));
                if msgs.first().is_some_and(|m| m.role == "system")
                    && !caps.is_some_and(|c| c.system_role)
                {
                    let sys = msgs.remove(0);
                    if let Some(next) = msgs.first_mut() {
                        next.content = format!("{}\n{}", sys.content, next.content);
                    }
                }
                let harmony = is_harmony(source);
                let mut out = render_jinja(
                    source,
                    &msgs,
                    args,
                    bos_token,
                    eos_token,
                    caps.is_some_and(|c| c.object_arguments),
                )?;
                // gpt-oss: a conversation that ends with the assistant's turn (no
                // generation prompt) is continued, so its last `<|return|>` (the end of a
                // finished answer) is `<|end|>` (llama.cpp does the same).
                if harmony && !args.add_generation_prompt {
                    if let Some(at) = out.rfind("<|return|>") {
                        out.replace_range(at..at + "<|return|>".len(), "<|end|>");
                    }
                }
                Ok(out)
            }
            ChatTemplate::Builtin(f) => {
                Ok(render_builtin(*f, messages, args.add_generation_prompt))
            }
        }
    }
}

/// What a template does with the parts of a conversation that not every template reads,
/// found (as llama.cpp finds it) by rendering probe conversations and watching whether a
/// probe's text comes out. Decided once per template source and cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateCaps {
    /// It prints a system turn's text (Gemma's refuses one; a refused or dropped system
    /// turn is prepended to the next turn instead).
    pub system_role: bool,
    /// It describes the request's `tools` to the model.
    pub tools: bool,
    /// It prints earlier turns' tool calls.
    pub tool_calls: bool,
    /// It reads a call's arguments as an object (`arguments | tojson`), so they are given
    /// as one rather than as JSON text.
    pub object_arguments: bool,
}

/// The capabilities of template `source` (cached per source: a render per probe).
pub fn template_caps(source: &str, bos: &str, eos: &str) -> TemplateCaps {
    use std::collections::HashMap;
    use std::hash::{Hash, Hasher};
    use std::sync::Mutex;
    /// A hash of (source, BOS text, EOS text) -> what the probes found. Keyed by the hash so
    /// that a lookup (every chat request with tools or a system turn) copies no template.
    static CACHE: Mutex<Option<HashMap<u64, TemplateCaps>>> = Mutex::new(None);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (source, bos, eos).hash(&mut h);
    let key = h.finish();
    if let Some(c) = CACHE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key))
    {
        return *c;
    }
    let caps = probe_caps(source, bos, eos);
    let mut g = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    // A server has one template or a few; a bound keeps a stream of distinct sources
    // (tests, a fuzzer) from growing it without end.
    if m.len() >= 64 {
        m.clear();
    }
    m.insert(key, caps);
    caps
}

fn probe_caps(source: &str, bos: &str, eos: &str) -> TemplateCaps {
    const SYSTEM: &str = "<rllama system probe>";
    const TOOL: &str = "rllama_probe_tool";
    const ARG: &str = "rllama-probe-argument";
    let args = RenderArgs {
        now: std::time::UNIX_EPOCH,
        ..RenderArgs::default()
    };
    let render = |msgs: &[ChatMessage], args: &RenderArgs, object_arguments: bool| {
        render_jinja(source, msgs, args, bos, eos, object_arguments).ok()
    };
    let system_role = render(
        &[
            ChatMessage::new("system", SYSTEM),
            ChatMessage::new("user", "Hi"),
        ],
        &args,
        false,
    )
    .is_some_and(|out| out.contains(SYSTEM));
    let tool_args = RenderArgs {
        tools: vec![serde_json::json!({
            "type": "function",
            "function": {
                "name": TOOL,
                "description": "Tool description",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                    "required": ["arg"],
                },
            },
        })],
        ..args.clone()
    };
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls.push(ToolCallMsg {
        id: "call00001".into(),
        name: "tool1".into(),
        arguments: serde_json::json!({ "arg": ARG }).to_string(),
    });
    let mut answer = ChatMessage::new("tool", "Tool response");
    answer.tool_call_id = Some("call00001".into());
    let conversation = [
        ChatMessage::new("user", "User message"),
        call,
        answer,
        ChatMessage::new("assistant", "The tool response was 'tool response'"),
        ChatMessage::new("user", "User message"),
    ];
    let with_objects = render(&conversation, &tool_args, true);
    let tools = with_objects.as_ref().is_some_and(|o| o.contains(TOOL));
    let object_arguments = with_objects.as_ref().is_some_and(|o| o.contains(ARG));
    let tool_calls = object_arguments
        || render(&conversation, &tool_args, false).is_some_and(|o| o.contains(ARG));
    TemplateCaps {
        system_role,
        tools,
        tool_calls,
        object_arguments,
    }
}

/// The texts of the vocabulary's BOS and EOS tokens (empty where it has none).
fn bos_eos_texts(f: &GgufFile) -> (String, String) {
    let tokens = f.get_array("tokenizer.ggml.tokens").ok().flatten();
    let token_text = |key: &str| -> String {
        let id = f.get_i64(key).ok().flatten();
        match (id, tokens) {
            (Some(id), Some(crate::gguf::Array::String(v))) => {
                v.get(id as usize).cloned().unwrap_or_default()
            }
            _ => String::new(),
        }
    };
    (
        token_text("tokenizer.ggml.bos_token_id"),
        token_text("tokenizer.ggml.eos_token_id"),
    )
}

/// Most template instructions one render may run. Real templates spend a few hundred per
/// message; this bounds what a hostile template from a GGUF file can make a request cost
/// (a loop over `range(10**5)` nested twice runs out instead of hanging the server).
pub const TEMPLATE_FUEL: u64 = 2_000_000;

/// Longest text a render may produce (repeating a list can otherwise print gigabytes).
/// minijinja itself caps string repetition, `range` and recursion. What no cap here
/// stops: a template that doubles a string in a loop (`{% set ns.s = ns.s ~ ns.s %}`)
/// exhausts memory within a few dozen iterations; templates come from the model file
/// the operator chose, and message content cannot do this.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

fn render_jinja(
    source: &str,
    messages: &[ChatMessage],
    args: &RenderArgs,
    bos: &str,
    eos: &str,
    object_arguments: bool,
) -> Result<String, ChatError> {
    let mut env = Environment::new();
    // As Hugging Face compiles chat templates (and llama.cpp renders them): a block tag's
    // newline is dropped, and so is the whitespace before it on its line.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    let now = args.now;
    env.add_function("strftime_now", move |fmt: String| -> String {
        strftime(&fmt, now)
    });
    env.add_filter("tojson", tojson);
    env.add_template("chat", source)
        .map_err(|e| ChatError::Template(format!("{e:#}")))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| ChatError::Template(e.to_string()))?;
    let mut out = Capped {
        buf: Vec::new(),
        full: false,
    };
    let r = tmpl.render_captured_to(
        {
            // gpt-oss's template reads an earlier turn's reasoning as `thinking`.
            let harmony = is_harmony(source);
            let messages: Vec<RenderMessage> = messages
                .iter()
                .map(|m| RenderMessage {
                    role: &m.role,
                    content: &m.content,
                    reasoning_content: m.reasoning_content.as_deref(),
                    thinking: m.reasoning_content.as_deref().filter(|_| harmony),
                    tool_calls: m
                        .tool_calls
                        .iter()
                        .map(|c| render_tool_call(c, object_arguments))
                        .collect(),
                    name: m.name.as_deref(),
                    tool_call_id: m.tool_call_id.as_deref(),
                })
                .collect();
            let tools = match args.tools.is_empty() {
                true => minijinja::Value::UNDEFINED,
                false => minijinja::Value::from_serialize(&args.tools),
            };
            let base = context! {
                messages => messages,
                add_generation_prompt => args.add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
                tools => tools,
                enable_thinking => args.enable_thinking,
                datetime => strftime("%b %d %Y", args.now),
                date_string => strftime("%d %b %Y", args.now),
            };
            match args.kwargs.is_empty() {
                true => base,
                false => {
                    let extra: std::collections::BTreeMap<&str, minijinja::Value> = args
                        .kwargs
                        .iter()
                        .map(|(k, v)| (k.as_str(), minijinja::Value::from_serialize(v)))
                        .collect();
                    context! { ..minijinja::Value::from(extra), ..base }
                }
            }
        },
        &mut out,
    );
    if out.full {
        return Err(ChatError::Template(format!(
            "the rendered prompt exceeds {MAX_RENDERED_BYTES} bytes"
        )));
    }
    r.map(drop)
        .map_err(|e| ChatError::Template(format!("{e:#}")))?;
    String::from_utf8(out.buf).map_err(|e| ChatError::Template(e.to_string()))
}

/// Jinja's `tojson` as llama.cpp's template engine writes it (what HF templates expect of
/// Python's `json.dumps`): `", "` and `": "` separators unless `separators` says otherwise,
/// `indent`, `ensure_ascii`, keys in their given order, strings escaped only where JSON
/// needs it, floats as C++ streams print them.
fn tojson(
    v: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<minijinja::Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    if sort_keys == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: sort_keys is not supported",
        ));
    }
    let indent = indent
        .and_then(|i| i64::try_from(i).ok())
        .map(|i| i.max(0) as usize);
    let seps = separators.unwrap_or_default();
    let item_sep = seps
        .first()
        .cloned()
        .unwrap_or_else(|| if indent.is_some() { "," } else { ", " }.into());
    let key_sep = seps.get(1).cloned().unwrap_or_else(|| ": ".into());
    let mut out = String::new();
    write_json(&mut out, &v, 0, indent, &item_sep, &key_sep);
    if ensure_ascii == Some(true) {
        let mut esc = String::with_capacity(out.len());
        for c in out.chars() {
            if c.is_ascii() {
                esc.push(c);
            } else {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    esc.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        out = esc;
    }
    Ok(minijinja::Value::from_safe_string(out))
}

fn write_json(
    out: &mut String,
    v: &minijinja::Value,
    level: usize,
    indent: Option<usize>,
    item_sep: &str,
    key_sep: &str,
) {
    use minijinja::value::ValueKind;
    let pad = |out: &mut String, lvl: usize| {
        if let Some(n) = indent {
            out.push_str(&" ".repeat(lvl * n));
        }
    };
    let newline = |out: &mut String| {
        if indent.is_some() {
            out.push('\n');
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Ok(i) = i64::try_from(v.clone()) {
                if v.as_i64().is_some() {
                    out.push_str(&i.to_string());
                    return;
                }
            }
            out.push_str(&cpp_float(f64::try_from(v.clone()).unwrap_or(0.0)));
        }
        ValueKind::String => {
            out.push('"');
            for c in v.as_str().unwrap_or_default().chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<minijinja::Value> =
                v.try_iter().map(|i| i.collect()).unwrap_or_default();
            out.push('[');
            if !items.is_empty() {
                newline(out);
                for (i, item) in items.iter().enumerate() {
                    pad(out, level + 1);
                    write_json(out, item, level + 1, indent, item_sep, key_sep);
                    if i + 1 < items.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<minijinja::Value> = v.try_iter().map(|i| i.collect()).unwrap_or_default();
            out.push('{');
            if !keys.is_empty() {
                newline(out);
                for (i, k) in keys.iter().enumerate() {
                    pad(out, level + 1);
                    let name = minijinja::Value::from(k.to_string());
                    write_json(out, &name, level + 1, indent, item_sep, key_sep);
                    out.push_str(key_sep);
                    let val = v.get_item(k).unwrap_or_default();
                    write_json(out, &val, level + 1, indent, item_sep, key_sep);
                    if i + 1 < keys.len() {
                        out.push_str(item_sep);
                    }
                    newline(out);
                }
                pad(out, level);
            }
            out.push('}');
        }
        _ => out.push_str("null"),
    }
}

/// `x` as a C++ stream prints a double by default (`%g`, 6 significant digits).
fn cpp_float(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-5..6).contains(&exp) {
        format!(
            "{}e{}{:02}",
            trim(mant),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{x:.decimals$}"))
    }
}

/// `fmt` at `t` (UTC) for the conversions templates use: `%Y %m %d %e %b %B %a %A %H %M
/// %S %y %j %%`; any other is printed as written.
pub fn strftime(fmt: &str, t: std::time::SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let days = secs.div_euclid(86_400);
    let (y, m, d, hh, mm, ss) = civil_utc(secs);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const BEFORE: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wd = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out += &y.to_string(),
            Some('y') => out += &format!("{:02}", y.rem_euclid(100)),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:2}"),
            Some('j') => out += &format!("{yday:03}"),
            Some('b') => out += &month[..3],
            Some('B') => out += month,
            Some('a') => out += &wd[..3],
            Some('A') => out += wd,
            Some('H') => out += &format!("{hh:02}"),
            Some('M') => out += &format!("{mm:02}"),
            Some('S') => out += &format!("{ss:02}"),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Calendar date and time of day (UTC) for seconds since the epoch:
/// `(year, month, day, hour, minute, second)` (proleptic Gregorian, Howard Hinnant's
/// civil-from-days).
pub fn civil_utc(secs: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, sod / 3600, sod % 3600 / 60, sod % 60)
}

/// Whether a template speaks gpt-oss's harmony format (its adjustments below).
fn is_harmony(source: &str) -> bool {
    crate::reasoning::ReasoningFormat::of_template(source)
        == crate::reasoning::ReasoningFormat::Harmony
}

/// A message as templates see it.
#[derive(Serialize)]
struct RenderMessage<'a> {
    role: &'a str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

/// A tool call as templates see it (llama-server's shape): arguments as an object for the
/// templates that read them as one (most print `arguments | tojson`), else as the text.
fn render_tool_call(c: &ToolCallMsg, object_arguments: bool) -> serde_json::Value {
    let arguments = match object_arguments {
        true => serde_json::from_str(&c.arguments)
            .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone())),
        false => serde_json::Value::String(c.arguments.clone()),
    };
    serde_json::json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": arguments},
    })
}

/// A sink that refuses to grow past [`MAX_RENDERED_BYTES`] (rendering stops with an error).
struct Capped {
    buf: Vec<u8>,
    full: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > MAX_RENDERED_BYTES {
            self.full = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn render_builtin(f: Fallback, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    match f {
        Fallback::ChatMl => {
            for m in messages {
                out.push_str(&format!(
                    "<|im_start|>{}\n{}<|im_end|>\n",
                    m.role, m.content
                ));
            }
            if add_generation_prompt {
                out.push_str("<|im_start|>assistant\n");
            }
        }
        Fallback::Gemma => {
            let mut system = String::new();
            for m in messages {
                if m.role == "system" {
                    system.push_str(&m.content);
                    system.push_str("\n\n");
                    continue;
                }
                let role = if m.role == "assistant" {
                    "model"
                } else {
                    m.role.as_str()
                };
                out.push_str(&format!(
                    "<start_of_turn>{role}\n{}{}<end_of_turn>\n",
                    std::mem::take(&mut system),
                    m.content.trim()
                ));
            }
            if add_generation_prompt {
                out.push_str("<start_of_turn>model\n");
            }
        }
        Fallback::Plain => {
            for m in messages {
                let role = match m.role.as_str() {
                    "system" => "System",
                    "assistant" => "Assistant",
                    _ => "User",
                };
                out.push_str(&format!("{role}: {}\n", m.content));
            }
            if add_generation_prompt {
                out.push_str("Assistant:");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jinja_with_python_methods() {
        let t = ChatTemplate::Jinja {
            source: "{{ bos_token }}{% for m in messages %}[{{ m.role|upper }}]{{ m.content.strip() }}{% endfor %}{% if add_generation_prompt %}[A]{% endif %}".into(),
            bos_token: "<s>".into(),
            eos_token: "</s>".into(),
        };
        let s = t
            .render(&[ChatMessage::new("user", "  hi  ")], true)
            .unwrap();
        assert_eq!(s, "<s>[USER]hi[A]");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::Jinja {
            source: "{{ raise_exception('roles must alternate') }}".into(),
            bos_token: String::new(),
            eos_token: String::new(),
        };
        assert!(t
            .render(&[], false)
            .unwrap_err()
            .to_string()
            .contains("roles must alternate"));
    }

    #[test]
    fn gemma_fallback_folds_system() {
        let s = ChatTemplate::Builtin(Fallback::Gemma)
            .render(
                &[
                    ChatMessage::new("system", "Be brief."),
                    ChatMessage::new("user", "Hi"),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            s,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}

#[cfg(test)]
mod hostile {
    use super::*;

    fn jinja(src: &str) -> ChatTemplate {
        ChatTemplate::Jinja {
            source: src.into(),
            bos_token: String::new(),
            eos_token: String::new(),
        }
    }

    fn err(src: &str) -> String {
        let t0 = std::time::Instant::now();
        let e = jinja(src)
            .render(&[ChatMessage::new("user", "hi")], true)
            .unwrap_err()
            .to_string();
        // Generous: the point is "stops", not a speed goal.
        assert!(
            t0.elapsed().as_secs() < 30,
            "{src}: took {:?}",
            t0.elapsed()
        );
        e
    }

    #[test]
    fn hostile_templates_stop_with_an_error() {
        let nested =
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        assert!(err(nested).contains("fuel"));
        assert!(err("{{ messages * 100000000 }}").contains("exceeds"));
        assert!(err("{{ 'x' * 1000000000 }}").contains("too large"));
        assert!(err("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").contains("recursion"));
        assert!(err("{{ range(1000000000) | list | length }}").contains("too many"));
    }

    #[test]
    fn long_real_conversations_fit_the_budget() {
        // 400 turns of 4 KiB through a ChatML-style template with Python methods.
        let src = "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let body = "word ".repeat(800);
        let msgs: Vec<ChatMessage> = (0..400)
            .map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, &body))
            .collect();
        let s = jinja(src).render(&msgs, true).unwrap();
        assert!(s.len() > 400 * 4000);
    }
}
