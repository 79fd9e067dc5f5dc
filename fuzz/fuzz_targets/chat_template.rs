//! Chat templates rendered with hostile messages: the real models' Jinja templates and the
//! built-in fallbacks, with arbitrary roles and content, then tokenized as the server does
//! (special tokens parsed). A template may refuse (raise_exception) but never panic or
//! hang. (Hostile template sources are unit tests in runtime/src/chat.rs: fuel, output
//! cap, recursion and range limits. A source that doubles a string in a loop can still
//! exhaust memory, so it is not fuzzed: see the note in that file.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use rllama_fuzz::{fields, vocabs};
use runtime::chat::{ChatMessage, ChatTemplate, Fallback};

fuzz_target!(|data: &[u8]| {
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
    }
});
