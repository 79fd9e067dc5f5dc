//! Chat templates rendered with hostile messages: the real models' Jinja templates and the
//! built-in fallbacks, with arbitrary roles and content, then tokenized as the server does
//! (special tokens parsed). A template may refuse (raise_exception) but never panic or
//! hang. (Hostile template sources are unit tests in runtime/src/chat.rs: fuel, output
//! cap, recursion and range limits. A source that doubles a string in a loop can still
//! exhaust memory, so it is not fuzzed: see the note in that file.) The rendered text is
//! also split as a model's answer would be (`runtime::reasoning`, every format): fed whole
//! or a piece at a time, the split must be the same and lose no non-marker text.

use super::{fields, vocabs};
use runtime::chat::{ChatMessage, ChatTemplate, Fallback};

/// One input: the body of the `chat_template` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let f = fields(rest, 32);
    let vocab = &vocabs()[(sel >> 4) as usize % 3];
    let template = match sel & 7 {
        1 => ChatTemplate::Builtin(Fallback::ChatMl),
        2 => ChatTemplate::Builtin(Fallback::Gemma),
        3 => ChatTemplate::Builtin(Fallback::Plain),
        _ => vocab.template.clone(),
    };
    let msgs: Vec<ChatMessage> = f
        .chunks(2)
        .map(|p| ChatMessage::new(&p[0], p.get(1).map_or("", String::as_str)))
        .collect();
    if let Ok(text) = template.render(&msgs, sel & 8 != 0) {
        let ids = vocab.tokenizer.encode(&text, true, true);
        let _ = vocab.tokenizer.decode(&ids, false);
        split_both_ways(&text, sel);
    }
}

fn split_both_ways(text: &str, sel: u8) {
    use runtime::reasoning::{ReasoningFormat as F, ReasoningSplitter};
    let format = [F::None, F::ThinkTags, F::Harmony][(sel as usize >> 6) % 3];
    let opened = sel & 32 != 0;
    let run = |pieces: &mut dyn Iterator<Item = &str>| {
        let mut sp = ReasoningSplitter::starting(format, opened);
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let s = sp.push(p);
            r += &s.reasoning;
            c += &s.content;
        }
        let s = sp.finish();
        (r + &s.reasoning, c + &s.content)
    };
    let whole = run(&mut std::iter::once(text));
    let step = 1 + (sel as usize & 3);
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .step_by(step)
        .chain(std::iter::once(text.len()))
        .collect();
    let pieces = bounds.windows(2).map(|w| &text[w[0]..w[1]]);
    let streamed = run(&mut pieces.into_iter());
    assert_eq!(whole, streamed, "split of {text:?} depends on the pieces");
    if format == F::None {
        assert_eq!(whole.1, text);
    }
}
