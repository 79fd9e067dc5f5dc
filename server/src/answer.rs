//! One choice's answer as the APIs see it: the generated text split, as it streams, into
//! reasoning, content and tool calls ([`AnswerSplitter`]), and how it ended ([`End`]).
//! Every API shape (OpenAI chat and completions, Anthropic Messages, OpenAI Responses)
//! reads its answers through this one splitter, so a model's reasoning and call syntax
//! are read the same way whichever API asked.

use runtime::reasoning::{ReasoningFormat, ReasoningSplitter};
use runtime::tools::ToolCall;

use axum::body::Bytes;

use crate::api::ToolPlan;
use crate::engine::{FinishReason, Usage};
use crate::error::ApiError;

/// New pieces of one answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    pub reasoning: String,
    pub content: String,
    /// Whole calls, in order (only the first one when the request disallows parallel
    /// calls).
    pub calls: Vec<ToolCall>,
}

/// How an answer ended.
#[derive(Clone, Debug)]
pub struct End {
    pub finish: FinishReason,
    /// The stop string that ended it, if one did.
    pub stop: Option<String>,
    pub usage: Usage,
    /// Whether the answer made tool calls.
    pub called: bool,
}

/// Splits one choice's text into [`Pieces`] as it arrives.
pub struct AnswerSplitter {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<(runtime::tools::ToolCallSplitter, bool)>,
    calls: usize,
}

impl AnswerSplitter {
    /// `reasoning`: the format and whether the prompt opened it; `tools`: how calls are
    /// read.
    pub fn new(reasoning: Option<(ReasoningFormat, bool)>, tools: Option<ToolPlan>) -> Self {
        AnswerSplitter {
            reasoning: reasoning.map(|(f, opened)| ReasoningSplitter::starting(f, opened)),
            tools: tools.map(|p| (p.splitter(), p.parallel)),
            calls: 0,
        }
    }

    /// How many calls were given out so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// New text; `last`: the answer's end (the splitters give up what they hold back).
    pub fn push(&mut self, text: &str, last: bool) -> Pieces {
        let (reasoning, mut content, harmony_calls) = match self.reasoning.as_mut() {
            Some(sp) => {
                let mut s = sp.push(text);
                if last {
                    let tail = sp.finish();
                    s.reasoning += &tail.reasoning;
                    s.content += &tail.content;
                    s.calls.extend(tail.calls);
                }
                (s.reasoning, s.content, s.calls)
            }
            None => (String::new(), text.to_string(), Vec::new()),
        };
        let mut calls = Vec::new();
        // Harmony's calls come out of its message headers (`to=functions.NAME`); without
        // tools offered, their text stays content.
        for (name, arguments) in harmony_calls {
            match &self.tools {
                Some((_, parallel)) if self.calls == 0 || *parallel => {
                    self.calls += 1;
                    calls.push(ToolCall {
                        id: runtime::tools::new_call_id(),
                        name,
                        arguments,
                    });
                }
                Some(_) => {}
                None => content.push_str(&arguments),
            }
        }
        if let Some((tsp, parallel)) = self.tools.as_mut() {
            let mut t = tsp.push(&content);
            if last {
                let tail = tsp.finish();
                t.content += &tail.content;
                t.calls.extend(tail.calls);
            }
            content = t.content;
            for c in t.calls {
                if self.calls > 0 && !*parallel {
                    break;
                }
                self.calls += 1;
                calls.push(c);
            }
        }
        Pieces {
            reasoning,
            content,
            calls,
        }
    }
}

/// A whole answer, gathered from its pieces.
#[derive(Debug, Default)]
pub struct Answer {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl Answer {
    pub fn add(&mut self, p: Pieces) {
        self.reasoning += &p.reasoning;
        self.content += &p.content;
        self.calls.extend(p.calls);
    }
}

/// A one-choice API's stream: the bytes it sends at the start, for new pieces, at the end
/// and on an error (after which nothing more is sent).
pub trait Encoder: Send + 'static {
    fn start(&mut self) -> Vec<Bytes>;
    fn pieces(&mut self, p: Pieces) -> Vec<Bytes>;
    fn end(&mut self, end: &End) -> Vec<Bytes>;
    fn error(&mut self, e: &ApiError) -> Vec<Bytes>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::tools::ToolSyntax;

    #[test]
    fn harmony_calls_come_out_of_message_headers() {
        let text = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        let plan = ToolPlan {
            syntax: ToolSyntax::Harmony,
            forced: false,
            parallel: true,
        };
        for cut in (0..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let mut sp = AnswerSplitter::new(Some((ReasoningFormat::Harmony, false)), Some(plan));
            let mut a = Answer::default();
            a.add(sp.push(&text[..cut], false));
            a.add(sp.push(&text[cut..], true));
            assert_eq!(a.reasoning, "Weather needed.", "cut {cut}");
            assert_eq!(a.content, "", "cut {cut}");
            assert_eq!(a.calls.len(), 1, "cut {cut}");
            assert_eq!(
                (a.calls[0].name.as_str(), a.calls[0].arguments.as_str()),
                ("get_weather", "{\"city\":\"Paris\"}")
            );
        }
        // No tools offered: the body is content.
        let mut sp = AnswerSplitter::new(Some((ReasoningFormat::Harmony, false)), None);
        let p = sp.push(text, true);
        assert!(
            p.calls.is_empty() && p.content == "{\"city\":\"Paris\"}",
            "{p:?}"
        );
    }

    #[test]
    fn reasoning_content_and_calls_come_apart_at_any_cut() {
        let text = "<think>plan</think>Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call><tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let plan = |parallel| ToolPlan {
            syntax: ToolSyntax::Hermes,
            forced: false,
            parallel,
        };
        for parallel in [true, false] {
            for cut in (0..text.len()).filter(|&c| text.is_char_boundary(c)) {
                let mut sp = AnswerSplitter::new(
                    Some((ReasoningFormat::ThinkTags, false)),
                    Some(plan(parallel)),
                );
                let mut a = Answer::default();
                a.add(sp.push(&text[..cut], false));
                a.add(sp.push(&text[cut..], true));
                assert_eq!(a.reasoning, "plan", "cut {cut}");
                assert_eq!(a.content, "Sure.", "cut {cut}");
                let names: Vec<&str> = a.calls.iter().map(|c| c.name.as_str()).collect();
                assert_eq!(names, if parallel { vec!["f", "g"] } else { vec!["f"] });
                assert_eq!(sp.calls(), names.len());
            }
        }
    }
}
