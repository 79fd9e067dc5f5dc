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
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
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
    /// The model's template, or a fallback chosen from the vocabulary's special tokens.
    pub fn from_gguf(f: &GgufFile) -> ChatTemplate {
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
        if let Ok(Some(src)) = f.get_str("tokenizer.chat_template") {
            return ChatTemplate::Jinja {
                source: src.to_string(),
                bos_token: token_text("tokenizer.ggml.bos_token_id"),
                eos_token: token_text("tokenizer.ggml.eos_token_id"),
            };
        }
        let has = |t: &str| matches!(tokens, Some(crate::gguf::Array::String(v)) if v.iter().any(|x| x == t));
        ChatTemplate::Builtin(if has("<start_of_turn>") {
            Fallback::Gemma
        } else if has("<|im_start|>") {
            Fallback::ChatMl
        } else {
            Fallback::Plain
        })
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
        match self {
            ChatTemplate::Jinja {
                source,
                bos_token,
                eos_token,
            } => render_jinja(
                source,
                messages,
                add_generation_prompt,
                bos_token,
                eos_token,
            ),
            ChatTemplate::Builtin(f) => Ok(render_builtin(*f, messages, add_generation_prompt)),
        }
    }
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
    add_generation_prompt: bool,
    bos: &str,
    eos: &str,
) -> Result<String, ChatError> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> String {
        // Templates use this for "today's date" lines; a fixed date keeps prompts
        // reproducible across runs and engines.
        let _ = fmt;
        "26 Jul 2024".to_string()
    });
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
        context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos,
            eos_token => eos,
            tools => minijinja::Value::UNDEFINED,
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
