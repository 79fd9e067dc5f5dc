//! Tool calls in a chat answer: which call syntax a model writes (read once from its chat
//! template, [`ToolSyntax::of_template`]) and an incremental splitter that takes the calls
//! out of the answer's content as it streams ([`ToolCallSplitter`]).
//!
//! Syntaxes:
//! - Hermes (Qwen2.5, Qwen3, SmolLM3, Hermes): `<tool_call>{"name": …, "arguments": …}</tool_call>`,
//!   any number of them, text around them is content.
//! - Llama 3.x: the whole answer is one JSON object `{"name": …, "parameters": …}` (or
//!   several joined by `;`), optionally after `<|python_tag|>`.
//! - Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": …, "arguments": …}`.
//! - Harmony (gpt-oss): a message addressed `to=functions.NAME` whose body is the
//!   arguments; the harmony reader of `reasoning.rs`, which already reads the message
//!   headers, takes these out ([`crate::reasoning::Split::calls`]), so content is never
//!   scanned for calls here.
//! - Generic: a template with no call syntax of its own; calls are only made when the
//!   request forces one (`tool_choice` `required` or a named function), as a JSON object
//!   `{"name": …, "arguments": …}` that the constraint engine writes.
//!
//! A model whose template has no tool support never has its text read as a call: text
//! that only looks like one stays content. Where the answer is forced to be a call, the
//! prompt ends with the syntax's opening ([`ToolSyntax::forced_prefill`]) and the answer is
//! exactly the call's JSON ([`ToolCallSplitter::forced`]).

use serde_json::Value;

/// One call the model asked for. `arguments` is JSON text, as OpenAI returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// How a model's answer writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    Hermes,
    Llama3,
    Mistral,
    /// gpt-oss's messages to `functions.NAME`.
    Harmony,
    /// No syntax of the template's own (forced calls only).
    Generic,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";
/// Code fences a bare Hermes call may come in (llama.cpp's Hermes reader takes them too).
const FENCES: [&str; 2] = ["```json\n", "```\n"];

impl ToolSyntax {
    /// The syntax a chat template's model writes its calls in (Generic where the template
    /// names none).
    pub fn of_template(source: &str) -> ToolSyntax {
        if source.contains("<|call|>") && source.contains("to=") {
            ToolSyntax::Harmony
        } else if source.contains(HERMES_OPEN) {
            ToolSyntax::Hermes
        } else if source.contains(MISTRAL_OPEN) {
            ToolSyntax::Mistral
        } else if source.contains(PYTHON_TAG)
            || source.contains("<|eom_id|>")
            // Llama 3.2's template names the ipython role only.
            || (source.contains("<|start_header_id|>") && source.contains("ipython"))
        {
            ToolSyntax::Llama3
        } else {
            ToolSyntax::Generic
        }
    }

    /// The key of a call's arguments in this syntax's JSON.
    pub fn arguments_key(self) -> &'static str {
        match self {
            ToolSyntax::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// What the prompt ends with when the answer must be a call: the syntax's opening, so
    /// that the constrained JSON that follows is what the model was trained to write there.
    pub fn forced_prefill(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "<tool_call>\n",
            ToolSyntax::Mistral => MISTRAL_OPEN,
            // A forced call is written as a JSON object in the final channel (the prompt
            // ends with the template's `<|start|>assistant`).
            ToolSyntax::Harmony => "<|channel|>final<|message|>",
            ToolSyntax::Llama3 | ToolSyntax::Generic => "",
        }
    }

    /// The JSON schema of a forced answer: one call object whose `name` is one of `names`
    /// and whose arguments follow `arguments` (Mistral: an array of one or more of them).
    pub fn forced_schema(self, names: &[&str], arguments: &Value) -> Value {
        let call = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": names},
                (self.arguments_key()): arguments,
            },
            "required": ["name", self.arguments_key()],
            "additionalProperties": false,
        });
        match self {
            ToolSyntax::Mistral => {
                serde_json::json!({"type": "array", "items": call, "minItems": 1})
            }
            _ => call,
        }
    }
}

/// A fresh call id (`call_` and 24 hex digits), as OpenAI's look.
pub fn new_call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0x5DEE_CE66_D1CE_5EED);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = N.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    let mix = (t ^ n).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    format!("call_{:016x}{:08x}", mix, (n >> 32) as u32)
}

/// The calls in one JSON value: an object `{"name", <args key>}` or an array of them.
/// Arguments given as an object are returned as its JSON text; as a string, as written.
fn calls_of(v: &Value, args_key: &str) -> Option<Vec<ToolCall>> {
    let one = |o: &Value| -> Option<ToolCall> {
        let name = o.get("name")?.as_str()?.to_string();
        if name.is_empty() {
            return None;
        }
        let arguments = match o.get(args_key).or_else(|| o.get("arguments")) {
            None | Some(Value::Null) => "{}".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(a) => a.to_string(),
        };
        Some(ToolCall {
            id: new_call_id(),
            name,
            arguments,
        })
    };
    match v {
        Value::Array(a) if !a.is_empty() => a.iter().map(one).collect(),
        Value::Object(_) => one(v).map(|c| vec![c]),
        _ => None,
    }
}

/// One step's output: new content and the calls completed in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolSplit {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet (Llama 3: a JSON answer may begin).
    Begin,
    /// Plain content.
    Text,
    /// Inside a call (Hermes: after `<tool_call>`; Llama 3 and forced answers: the whole
    /// rest; Mistral: after `[TOOL_CALLS]`).
    Call,
}

/// Splits one choice's content into text and tool calls as it streams.
#[derive(Debug)]
pub struct ToolCallSplitter {
    syntax: ToolSyntax,
    state: State,
    /// Text not yet classified (a possible marker's beginning), or the call being read.
    held: String,
    /// The text the current call began with (given back as content if it is no call).
    opening: &'static str,
}

impl ToolCallSplitter {
    /// A splitter for an answer that may hold calls in `syntax` (`Generic`: never does).
    pub fn new(syntax: ToolSyntax) -> ToolCallSplitter {
        ToolCallSplitter {
            syntax,
            state: State::Begin,
            held: String::new(),
            opening: "",
        }
    }

    /// A splitter for an answer forced to be a call: the prompt ended with
    /// [`ToolSyntax::forced_prefill`], so the whole answer is the call's JSON.
    pub fn forced(syntax: ToolSyntax) -> ToolCallSplitter {
        ToolCallSplitter {
            syntax,
            state: State::Call,
            held: String::new(),
            opening: "",
        }
    }

    /// Takes new text; returns what is known to be content, and the calls it completed.
    pub fn push(&mut self, text: &str) -> ToolSplit {
        let mut out = ToolSplit::default();
        if matches!(self.syntax, ToolSyntax::Generic | ToolSyntax::Harmony)
            && self.state != State::Call
        {
            out.content.push_str(text);
            return out;
        }
        self.held.push_str(text);
        loop {
            match self.state {
                State::Begin => {
                    let t = self.held.trim_start();
                    if t.is_empty() {
                        return out;
                    }
                    match self.syntax {
                        // Small models often drop the tags and answer with the bare call
                        // (llama.cpp's Hermes reader takes that too): a whole answer that is
                        // calls' JSON is calls.
                        ToolSyntax::Llama3 | ToolSyntax::Hermes if t.starts_with('{') => {
                            self.held = t.to_string();
                            self.state = State::Call;
                        }
                        // ... or in a code fence.
                        ToolSyntax::Hermes if FENCES.iter().any(|f| f.starts_with(t)) => {
                            return out
                        }
                        ToolSyntax::Hermes => {
                            let fenced = FENCES.iter().find_map(|f| {
                                let rest = t.strip_prefix(f)?.trim_start();
                                Some((*f, rest))
                            });
                            match fenced {
                                Some((_, "")) => return out,
                                Some((f, rest)) if rest.starts_with('{') => {
                                    self.held = rest.to_string();
                                    self.opening = f;
                                    self.state = State::Call;
                                }
                                _ => self.state = State::Text,
                            }
                        }
                        ToolSyntax::Llama3 if PYTHON_TAG.starts_with(t) => return out,
                        ToolSyntax::Llama3 if t.starts_with(PYTHON_TAG) => {
                            self.held = t[PYTHON_TAG.len()..].to_string();
                            self.opening = PYTHON_TAG;
                            self.state = State::Call;
                        }
                        _ => self.state = State::Text,
                    }
                }
                State::Text => {
                    let marker = match self.syntax {
                        ToolSyntax::Hermes => HERMES_OPEN,
                        ToolSyntax::Mistral => MISTRAL_OPEN,
                        // Llama 3 calls are whole answers: text that began as text stays it.
                        _ => {
                            out.content.push_str(&self.held);
                            self.held.clear();
                            return out;
                        }
                    };
                    if let Some(at) = self.held.find(marker) {
                        out.content.push_str(&self.held[..at]);
                        self.held.drain(..at + marker.len());
                        self.opening = marker;
                        self.state = State::Call;
                        continue;
                    }
                    // Keep back a tail that could begin the marker.
                    let keep = partial_suffix(&self.held, marker);
                    let cut = self.held.len() - keep;
                    out.content.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    return out;
                }
                State::Call => {
                    if self.syntax == ToolSyntax::Hermes {
                        if let Some(at) = self.held.find(HERMES_CLOSE) {
                            let body = self.held[..at].to_string();
                            self.held.drain(..at + HERMES_CLOSE.len());
                            self.take_call(&body, HERMES_CLOSE, &mut out);
                            self.state = State::Text;
                            continue;
                        }
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the answer: what is still held is content, or the call it completes.
    pub fn finish(&mut self) -> ToolSplit {
        let mut out = ToolSplit::default();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Call => {
                self.take_call(&held, "", &mut out);
            }
            _ => out.content.push_str(&held),
        }
        self.state = State::Text;
        out
    }

    /// Reads one call's text (Llama 3: several joined by `;`); text that is no call is
    /// content, with the markers that opened and closed it.
    fn take_call(&mut self, body: &str, closing: &str, out: &mut ToolSplit) {
        let key = self.syntax.arguments_key();
        // A fenced call ends with its closing fence.
        let inner = match FENCES.contains(&self.opening) {
            true => body.trim_end().strip_suffix("```").unwrap_or(body),
            false => body,
        };
        let parsed = json_calls(inner, key).or_else(|| {
            (self.syntax == ToolSyntax::Llama3)
                .then(|| {
                    body.split(';')
                        .map(|p| json_calls(p, key))
                        .collect::<Option<Vec<Vec<ToolCall>>>>()
                        .map(|v| v.concat())
                })
                .flatten()
        });
        match parsed {
            Some(calls) => out.calls.extend(calls),
            None => {
                out.content.push_str(self.opening);
                out.content.push_str(body);
                out.content.push_str(closing);
            }
        }
        self.opening = "";
    }
}

/// The calls in `text`: one or more JSON values (each a call or an array of calls)
/// separated by whitespace, and nothing else.
fn json_calls(text: &str, args_key: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    for v in values.by_ref() {
        calls.extend(calls_of(&v.ok()?, args_key)?);
    }
    (!calls.is_empty() && text[values.byte_offset()..].trim().is_empty()).then_some(calls)
}

/// The length of the longest suffix of `s` that is a proper prefix of `marker`.
fn partial_suffix(s: &str, marker: &str) -> usize {
    (1..marker.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && marker.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(mut sp: ToolCallSplitter, pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let (mut content, mut calls) = (String::new(), Vec::new());
        for p in pieces {
            let s = sp.push(p);
            content += &s.content;
            calls.extend(s.calls);
        }
        let s = sp.finish();
        content += &s.content;
        calls.extend(s.calls);
        (
            content,
            calls.into_iter().map(|c| (c.name, c.arguments)).collect(),
        )
    }

    /// Every way of cutting `text` in two and in single characters splits alike.
    fn check(syntax: ToolSyntax, text: &str, content: &str, calls: &[(&str, &str)]) {
        let want: Vec<(String, String)> = calls
            .iter()
            .map(|(n, a)| (n.to_string(), a.to_string()))
            .collect();
        let whole = split_all(ToolCallSplitter::new(syntax), &[text]);
        assert_eq!(whole, (content.to_string(), want.clone()), "{text:?}");
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split_all(ToolCallSplitter::new(syntax), &refs), whole);
        for (i, _) in text.char_indices() {
            let (a, b) = text.split_at(i);
            assert_eq!(
                split_all(ToolCallSplitter::new(syntax), &[a, b]),
                whole,
                "cut at {i}"
            );
        }
    }

    #[test]
    fn hermes_calls_are_taken_out_of_the_text() {
        check(
            ToolSyntax::Hermes,
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "Let me look.\n",
            &[("get_weather", r#"{"city":"Paris"}"#)],
        );
        // Two calls, arguments as a string, and an unclosed last call.
        check(
            ToolSyntax::Hermes,
            "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {}}",
            "\n",
            &[("a", r#"{"x": 1}"#), ("b", "{}")],
        );
        // Not JSON inside the tags: text, with its opening tag.
        check(
            ToolSyntax::Hermes,
            "a <tool_call>oops",
            "a <tool_call>oops",
            &[],
        );
        check(
            ToolSyntax::Hermes,
            "<tool_call>[1]</tool_call> b",
            "<tool_call>[1]</tool_call> b",
            &[],
        );
        // A bare call (no tags), and two of them.
        check(
            ToolSyntax::Hermes,
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "",
            &[("get_weather", r#"{"city":"Paris"}"#)],
        );
        check(
            ToolSyntax::Hermes,
            "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {}}\n",
            "",
            &[("a", "{}"), ("b", "{}")],
        );
        // JSON that is no call stays text.
        check(
            ToolSyntax::Hermes,
            "{\"answer\": 4}",
            "{\"answer\": 4}",
            &[],
        );
        // A lone `<` and a near miss are text.
        check(ToolSyntax::Hermes, "1 < 2 <tool", "1 < 2 <tool", &[]);
        // A bare call in a code fence (qwen2.5-coder-0.5b writes these), and fenced code
        // and fenced JSON that are no call.
        check(
            ToolSyntax::Hermes,
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            "",
            &[("get_weather", r#"{"city":"Paris"}"#)],
        );
        check(
            ToolSyntax::Hermes,
            "```\n{\"name\": \"f\", \"arguments\": {}}```\n",
            "",
            &[("f", "{}")],
        );
        for t in [
            "```python\nprint(1)\n```",
            "```json\n{\"a\": 1}\n```",
            "```json\n[1]```",
            "``` x",
        ] {
            check(ToolSyntax::Hermes, t, t, &[]);
        }
    }

    #[test]
    fn generic_text_is_never_a_call() {
        let t = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>";
        check(ToolSyntax::Generic, t, t, &[]);
    }

    #[test]
    fn llama3_answers_are_calls_only_when_whole() {
        check(
            ToolSyntax::Llama3,
            " {\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}",
            "",
            &[("f", r#"{"q":"x"}"#)],
        );
        check(
            ToolSyntax::Llama3,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\", \"parameters\": {}}",
            "",
            &[("f", "{}"), ("g", "{}")],
        );
        check(
            ToolSyntax::Llama3,
            "Sure: {\"name\": \"f\"}",
            "Sure: {\"name\": \"f\"}",
            &[],
        );
        check(ToolSyntax::Llama3, "{not json", "{not json", &[]);
    }

    #[test]
    fn mistral_calls_follow_the_marker() {
        check(
            ToolSyntax::Mistral,
            "ok[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]",
            "ok",
            &[("f", r#"{"a":1}"#), ("g", "{}")],
        );
    }

    #[test]
    fn forced_answers_are_the_call_json() {
        let mut sp = ToolCallSplitter::forced(ToolSyntax::Hermes);
        assert_eq!(sp.push("{\"name\": \"f\", ").calls.len(), 0);
        let s = sp.push("\"arguments\": {\"a\": [1, 2]}}");
        assert!(s.calls.is_empty() && s.content.is_empty());
        let s = sp.finish();
        assert_eq!(s.calls.len(), 1);
        assert_eq!(
            (s.calls[0].name.as_str(), s.calls[0].arguments.as_str()),
            ("f", r#"{"a":[1,2]}"#)
        );
        assert!(s.calls[0].id.starts_with("call_") && s.calls[0].id.len() == 29);
    }

    #[test]
    fn syntax_from_template_and_forced_schema() {
        assert_eq!(
            ToolSyntax::of_template("{{ '<tool_call>' }}"),
            ToolSyntax::Hermes
        );
        assert_eq!(ToolSyntax::of_template("[TOOL_CALLS]"), ToolSyntax::Mistral);
        assert_eq!(
            ToolSyntax::of_template("<|python_tag|>"),
            ToolSyntax::Llama3
        );
        assert_eq!(ToolSyntax::of_template("<|im_start|>"), ToolSyntax::Generic);
        let s = ToolSyntax::Llama3.forced_schema(&["f"], &serde_json::json!({"type": "object"}));
        assert_eq!(s["required"], serde_json::json!(["name", "parameters"]));
        let s = ToolSyntax::Mistral.forced_schema(&["f"], &serde_json::json!({"type": "object"}));
        assert_eq!(s["type"], "array");
    }
}
