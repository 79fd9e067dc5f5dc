//! The reasoning part of a chat answer, split from its content as llama-server and vLLM
//! return it (`reasoning_content` beside `content`), incrementally so that streams carry
//! it too. Which syntax a model writes is read from its chat template once
//! ([`ReasoningFormat::of_template`]):
//!
//! - `<think>…</think>` (Qwen3, SmolLM3, DeepSeek-R1 distills): the text inside the tags is
//!   reasoning, whitespace around it trimmed; after `</think>` the content, its leading
//!   whitespace trimmed. A prompt that already opened the block (the template ended the
//!   generation prompt with `<think>`) starts inside it.
//! - gpt-oss's harmony channels: `<|channel|>analysis<|message|>…<|end|>` is reasoning,
//!   `<|channel|>final<|message|>…` (and any other channel) content; the headers
//!   (`<|start|>assistant`, channel names, `<|end|>`) are neither.
//!
//! Markers split across tokens are held back until they can be told apart from text.

/// How a model's output marks its reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// No reasoning syntax: everything is content.
    None,
    /// `<think>` … `</think>`.
    ThinkTags,
    /// gpt-oss's harmony channels.
    Harmony,
}

impl ReasoningFormat {
    /// The format a chat template's model writes: harmony where the template speaks of
    /// channels, think tags where it mentions `<think>`.
    pub fn of_template(source: &str) -> ReasoningFormat {
        if source.contains("<|channel|>") {
            ReasoningFormat::Harmony
        } else if source.contains("<think>") {
            ReasoningFormat::ThinkTags
        } else {
            ReasoningFormat::None
        }
    }

    /// Whether the output must be decoded with special tokens as text (harmony's markers
    /// are special tokens).
    pub fn needs_special_text(self) -> bool {
        self == ReasoningFormat::Harmony
    }
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const START: &str = "<|start|>";
/// Harmony: the end of a tool call's message (also an end-of-generation token).
const CALL: &str = "<|call|>";
/// Harmony: the recipient of a message addressed to a function.
const TO_FUNCTIONS: &str = "to=functions.";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet (think tags: an opening tag may come).
    Begin,
    /// Inside reasoning; `fresh`: nothing of it sent yet (leading whitespace dropped).
    Reasoning { fresh: bool },
    /// Inside content; `fresh` as above.
    Content { fresh: bool },
    /// Harmony: in a header (`<|start|>role`, `<|channel|>name`), until `<|message|>`.
    Header,
    /// Harmony: in a message addressed to a function (`to=functions.NAME`): a tool call,
    /// its body the arguments.
    Call { fresh: bool },
}

/// Splits one choice's output text into reasoning and content as it streams.
#[derive(Debug)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    state: State,
    /// Harmony: the header's text so far (its channel decides where the message goes).
    header: String,
    /// Text not yet classified: a possible marker's beginning, or reasoning's trailing
    /// whitespace (dropped if the block ends there).
    held: String,
    /// Harmony: the function the current call message goes to, and its body so far.
    call_name: String,
    call_body: String,
}

/// One step's output: new reasoning and new content (either may be empty), and the
/// harmony tool calls completed in it (function name, arguments text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<(String, String)>,
}

impl ReasoningSplitter {
    /// `prompt` is the rendered prompt: a think block it opened and left open makes the
    /// output start inside it.
    pub fn new(format: ReasoningFormat, prompt: &str) -> ReasoningSplitter {
        ReasoningSplitter::starting(format, prompt_opens_reasoning(format, prompt))
    }

    /// As [`ReasoningSplitter::new`], told whether the prompt left a block open.
    pub fn starting(format: ReasoningFormat, opened: bool) -> ReasoningSplitter {
        let state = match format {
            ReasoningFormat::None => State::Content { fresh: false },
            ReasoningFormat::ThinkTags if opened => State::Reasoning { fresh: true },
            _ => State::Begin,
        };
        ReasoningSplitter {
            format,
            state,
            header: String::new(),
            held: String::new(),
            call_name: String::new(),
            call_body: String::new(),
        }
    }

    /// Ends the current call message: its body is the arguments.
    fn end_call(&mut self, out: &mut Split) {
        let name = std::mem::take(&mut self.call_name);
        let body = std::mem::take(&mut self.call_body);
        out.calls.push((name, body.trim().to_string()));
    }

    /// Adds decoded text; returns what can be classified now.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        if self.format == ReasoningFormat::None {
            out.content.push_str(text);
            return out;
        }
        self.held.push_str(text);
        let mut s = std::mem::take(&mut self.held);
        loop {
            let before = s.len();
            s = self.step(s, &mut out, false);
            if s.is_empty() || s.len() == before {
                break;
            }
        }
        self.held = s;
        out
    }

    /// The end of the output: whatever is held goes where it stands.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let mut s = std::mem::take(&mut self.held);
        loop {
            let before = s.len();
            s = self.step(s, &mut out, true);
            if s.is_empty() || s.len() == before {
                break;
            }
        }
        // Whatever remains is text where it stands (reasoning's trailing whitespace is
        // dropped, as when the block closes).
        match self.state {
            State::Reasoning { .. } => out.reasoning.push_str(s.trim_end()),
            State::Content { fresh } => {
                out.content
                    .push_str(if fresh { s.trim_start() } else { &s })
            }
            State::Begin => out.content.push_str(s.trim()),
            State::Header => {}
            State::Call { .. } => {
                self.call_body.push_str(&s);
                self.end_call(&mut out);
                self.state = State::Begin;
            }
        }
        out
    }

    /// Consumes a prefix of `s` in the current state; returns the rest (unchanged when it
    /// must wait for more text).
    fn step(&mut self, s: String, out: &mut Split, last: bool) -> String {
        match self.state {
            State::Begin => {
                let t = s.trim_start();
                if t.is_empty() {
                    return if last { String::new() } else { s };
                }
                let opener = match self.format {
                    ReasoningFormat::Harmony => {
                        // Harmony output opens with a header (`<|channel|>` or `<|start|>`).
                        if t.starts_with(CHANNEL) || t.starts_with(START) {
                            self.state = State::Header;
                            self.header.clear();
                            let skip = if t.starts_with(CHANNEL) {
                                0
                            } else {
                                START.len()
                            };
                            return t[skip..].to_string();
                        }
                        CHANNEL
                    }
                    _ => {
                        if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                            self.state = State::Reasoning { fresh: true };
                            return rest.to_string();
                        }
                        THINK_OPEN
                    }
                };
                let harmony_start = self.format == ReasoningFormat::Harmony && START.starts_with(t);
                if !last && (opener.starts_with(t) || harmony_start) {
                    return s; // may still become the opener
                }
                self.state = State::Content { fresh: true };
                t.to_string()
            }
            State::Header => {
                // Everything up to `<|message|>` is header; the channel name decides.
                match s.find(MESSAGE) {
                    Some(at) => {
                        self.header.push_str(&s[..at]);
                        let channel = self
                            .header
                            .rsplit(CHANNEL)
                            .next()
                            .unwrap_or("")
                            .split_whitespace()
                            .next()
                            .unwrap_or("");
                        // A recipient `to=functions.NAME` (before or after the channel)
                        // makes the message a call.
                        let to = self.header.find(TO_FUNCTIONS).map(|at| {
                            let rest = &self.header[at + TO_FUNCTIONS.len()..];
                            let end = rest
                                .find(|c: char| c.is_whitespace() || c == '<')
                                .unwrap_or(rest.len());
                            rest[..end].to_string()
                        });
                        self.state =
                            match (to, channel == "analysis" && self.header.contains(CHANNEL)) {
                                (Some(name), _) if !name.is_empty() => {
                                    self.call_name = name;
                                    State::Call { fresh: true }
                                }
                                (_, true) => State::Reasoning { fresh: true },
                                (_, false) => State::Content { fresh: false },
                            };
                        self.header.clear();
                        s[at + MESSAGE.len()..].to_string()
                    }
                    None => {
                        let keep = if last { 0 } else { partial(&s, &[MESSAGE]) };
                        self.header.push_str(&s[..s.len() - keep]);
                        s[s.len() - keep..].to_string()
                    }
                }
            }
            State::Reasoning { fresh } | State::Content { fresh } | State::Call { fresh } => {
                let reasoning = matches!(self.state, State::Reasoning { .. });
                let call = matches!(self.state, State::Call { .. });
                let s = match fresh {
                    // A block's leading whitespace is dropped.
                    true => match s.trim_start() {
                        "" => return String::new(),
                        t => t.to_string(),
                    },
                    false => s,
                };
                let ends: &[&str] = match (self.format, reasoning) {
                    (ReasoningFormat::ThinkTags, true) => &[THINK_CLOSE],
                    (ReasoningFormat::ThinkTags, false) => &[THINK_OPEN],
                    _ => &[END, CALL, START, CHANNEL],
                };
                let sink = match (call, reasoning) {
                    (true, _) => &mut self.call_body,
                    (_, true) => &mut out.reasoning,
                    (_, false) => &mut out.content,
                };
                let found = ends
                    .iter()
                    .filter_map(|m| s.find(m).map(|at| (at, *m)))
                    .min_by_key(|&(at, _)| at);
                let Some((at, m)) = found else {
                    // No marker: send what cannot begin one; reasoning's trailing
                    // whitespace waits too (dropped if the block ends there).
                    let mut cut = s.len() - if last { 0 } else { partial(&s, ends) };
                    if reasoning {
                        cut = s[..cut].trim_end().len();
                    }
                    sink.push_str(&s[..cut]);
                    let fresh = fresh && cut == 0;
                    self.state = match (call, reasoning) {
                        (true, _) => State::Call { fresh },
                        (_, true) => State::Reasoning { fresh },
                        (_, false) => State::Content { fresh },
                    };
                    return s[cut..].to_string();
                };
                sink.push_str(match reasoning {
                    true => s[..at].trim_end(),
                    false => &s[..at],
                });
                if call {
                    self.end_call(out);
                }
                self.state = match (self.format, m) {
                    (ReasoningFormat::ThinkTags, THINK_CLOSE) => State::Content { fresh: true },
                    (ReasoningFormat::ThinkTags, _) => State::Reasoning { fresh: true },
                    (_, END | CALL) => State::Begin,
                    _ => {
                        self.header.clear();
                        if m == CHANNEL {
                            self.header.push_str(CHANNEL);
                        }
                        State::Header
                    }
                };
                s[at + m.len()..].to_string()
            }
        }
    }
}

/// Whether `prompt` ends inside a reasoning block the model is to continue.
pub fn prompt_opens_reasoning(format: ReasoningFormat, prompt: &str) -> bool {
    format == ReasoningFormat::ThinkTags && prompt.trim_end().ends_with(THINK_OPEN)
}

/// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
fn partial(s: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .map(|m| {
            let max = s.len().min(m.len().saturating_sub(1));
            (1..=max)
                .rev()
                .find(|&n| s.is_char_boundary(s.len() - n) && m.starts_with(&s[s.len() - n..]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole text at once, and one byte-ish piece (char) at a time: same split.
    fn split(format: ReasoningFormat, prompt: &str, text: &str) -> (String, String) {
        let mut whole = ReasoningSplitter::new(format, prompt);
        let mut a = whole.push(text);
        let f = whole.finish();
        a.reasoning += &f.reasoning;
        a.content += &f.content;
        let mut each = ReasoningSplitter::new(format, prompt);
        let mut b = Split::default();
        for c in text.chars() {
            let s = each.push(&c.to_string());
            b.reasoning += &s.reasoning;
            b.content += &s.content;
        }
        let f = each.finish();
        b.reasoning += &f.reasoning;
        b.content += &f.content;
        assert_eq!(a, b, "streamed split differs from whole split of {text:?}");
        (a.reasoning, a.content)
    }

    #[test]
    fn think_tags() {
        let f = ReasoningFormat::ThinkTags;
        let p = "<|im_start|>assistant\n";
        assert_eq!(
            split(f, p, "<think>\nLet me add.\n2+2=4\n</think>\n\nIt is 4."),
            ("Let me add.\n2+2=4".into(), "It is 4.".into())
        );
        // No block: all content (thinking off renders an empty block in the prompt).
        assert_eq!(
            split(f, "…</think>\n\n", "It is 4.\n"),
            ("".into(), "It is 4.\n".into())
        );
        // Opened by the prompt.
        assert_eq!(
            split(f, "<|im_start|>assistant\n<think>\n", "hmm </think> 4"),
            ("hmm".into(), "4".into())
        );
        // Cut off while thinking: what there is, is reasoning.
        assert_eq!(
            split(f, p, "<think>still going  "),
            ("still going".into(), "".into())
        );
        // Text that only starts like a tag stays text.
        assert_eq!(split(f, p, "<thin>k"), ("".into(), "<thin>k".into()));
        assert_eq!(split(f, p, "a <b> c"), ("".into(), "a <b> c".into()));
        assert_eq!(
            split(f, p, "<think>a < b</think>c"),
            ("a < b".into(), "c".into())
        );
    }

    #[test]
    fn harmony_channels() {
        let f = ReasoningFormat::Harmony;
        let p = "<|start|>assistant";
        let out = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>\
                   <|start|>assistant<|channel|>final<|message|>2+2 = 4.";
        assert_eq!(
            split(f, p, out),
            ("User asks 2+2. Easy.".into(), "2+2 = 4.".into())
        );
        // Straight to the final channel.
        assert_eq!(
            split(f, p, "<|channel|>final<|message|>Hi!"),
            ("".into(), "Hi!".into())
        );
        // Cut off in analysis.
        assert_eq!(
            split(f, p, "<|channel|>analysis<|message|>thinking"),
            ("thinking".into(), "".into())
        );
        // A model that skips the header: content.
        assert_eq!(split(f, p, "plain"), ("".into(), "plain".into()));
    }

    #[test]
    fn harmony_calls_are_messages_to_functions() {
        let f = ReasoningFormat::Harmony;
        // Both places llama.cpp reads a recipient from: after the role, after the channel.
        let texts = [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        ];
        for t in texts {
            let mut whole = ReasoningSplitter::new(f, "<|start|>assistant");
            let mut a = whole.push(t);
            let e = whole.finish();
            a.calls.extend(e.calls);
            a.reasoning += &e.reasoning;
            assert_eq!(a.reasoning, "Need weather.", "{t}");
            assert_eq!(a.content, "", "{t}");
            assert_eq!(
                a.calls,
                [(
                    "get_weather".to_string(),
                    "{\"city\": \"Paris\"}".to_string()
                )]
            );
            // Streamed a character at a time: the same.
            let mut each = ReasoningSplitter::new(f, "<|start|>assistant");
            let mut b = Split::default();
            for c in t.chars() {
                let s = each.push(&c.to_string());
                b.reasoning += &s.reasoning;
                b.content += &s.content;
                b.calls.extend(s.calls);
            }
            let e = each.finish();
            b.reasoning += &e.reasoning;
            b.calls.extend(e.calls);
            assert_eq!(a, b, "{t}");
        }
        // A commentary message to no function is content, as before.
        assert_eq!(
            split(
                f,
                "<|start|>assistant",
                "<|channel|>commentary<|message|>note"
            ),
            ("".into(), "note".into())
        );
    }

    #[test]
    fn no_format_is_all_content() {
        assert_eq!(
            split(ReasoningFormat::None, "", "<think>x</think>y"),
            ("".into(), "<think>x</think>y".into())
        );
    }

    #[test]
    fn formats_come_from_templates() {
        assert_eq!(
            ReasoningFormat::of_template("{{ '<|channel|>final' }}"),
            ReasoningFormat::Harmony
        );
        assert_eq!(
            ReasoningFormat::of_template("{{ '<think>\\n\\n</think>' }}"),
            ReasoningFormat::ThinkTags
        );
        assert_eq!(
            ReasoningFormat::of_template("{{ messages }}"),
            ReasoningFormat::None
        );
    }
}
