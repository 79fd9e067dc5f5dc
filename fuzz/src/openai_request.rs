//! The OpenAI request path of rserve: body bytes -> JSON -> validated generation request
//! (sampling ranges, stops, logprobs, logit_bias, chat messages through the real chat
//! template and tokenizer, response_format), then the JSON-constraint machine driven with
//! the tail of the input. Every bad body must be an error, never a panic.

use super::vocabs;
use server::api::{parse_json, parse_request, Kind, RawRequest};

/// One input: the body of the `openai_request` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    // The body ends at the first 0xff; what follows feeds the constraint machine.
    let (body, tail) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(raw) = parse_json::<RawRequest>(body) else {
        return;
    };
    let v = &vocabs()[sel as usize % 3];
    let kind = if sel & 0x10 != 0 {
        Kind::Chat
    } else {
        Kind::Completion
    };
    let Ok(p) = parse_request(kind, &raw, &v.tokenizer, &v.template, 2048) else {
        return;
    };
    assert!(!p.prompt.is_empty() && p.prompt.len() + p.params.max_tokens <= 2048);
    if let Some(fmt) = &p.params.format {
        let mut m = fmt.start();
        for chunk in tail.chunks(3) {
            let ok = m.accepts(chunk);
            assert_eq!(ok, m.push(chunk), "accepts and push disagree on {chunk:?}");
            if !ok {
                break;
            }
        }
        let _ = (m.is_complete(), m.can_end());
    }
}
