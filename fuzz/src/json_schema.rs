//! The JSON-schema compiler and the constraint automaton of rserve's `response_format`.
//! The input either is a schema (JSON text) or drives a small schema generator; whatever
//! compiles is then decoded with masks over a small vocabulary (every byte plus JSON
//! pieces, split UTF-8 and escapes), choosing tokens with the rest of the input. Checked:
//! no panic; a compiled schema never dead-ends (the mask is never empty before the value
//! is complete); each mask's work stays within the trie bound; every mask agrees with
//! `accepts` on the token taken; and every finished output parses and validates against
//! the schema under JSON Schema's rules.

use std::sync::OnceLock;

use serde_json::{json, Value};
use server::constrain::{validate, Format, TokenIndex};

#[rustfmt::skip]
const PIECES: &[&str] = &[
    "{\"", "\":", "\": \"", "\", \"", "\"}", "\"]", "[\"", "[1", "],", "]}", "}}", "},", " \"",
    "\n  ", "   ", "true", "false", "null", "12", "0.5", "-3", "e+", "1e", "name", " age",
    "abc", "a", "ab", "\\u00", "\\n", "\\\"", "é", "€", "ab\"", "a\"}", "x\",\"y", "\":1}",
    "\":[", "\":{\"", "\"a\"", ", ", "0", "9999999999", "\"k\"", "{}", "[]", "\"\"",
];

fn vocab() -> &'static (Vec<Option<Vec<u8>>>, TokenIndex) {
    static V: OnceLock<(Vec<Option<Vec<u8>>>, TokenIndex)> = OnceLock::new();
    V.get_or_init(|| {
        let mut v: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        v.extend(PIECES.iter().map(|p| Some(p.as_bytes().to_vec())));
        v.push(Some(vec![0xe2, 0x82]));
        v.push(Some(vec![0x82, 0xac, b'"']));
        v.push(None); // end of generation
        let eog = v.len() as u32 - 1;
        let idx = TokenIndex::new(&v, |t| t == eog);
        (v, idx)
    })
}

/// A byte reader that yields zeros once the input runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

/// A schema from input bytes: types, keywords (some contradictory or misplaced on
/// purpose), nesting.
fn gen(b: &mut Bytes, depth: u32) -> Value {
    let mut s = serde_json::Map::new();
    let kind = b.next() % 10;
    let ty = [
        "object", "array", "string", "integer", "number", "boolean", "null", "", "", "x",
    ][kind as usize];
    if !ty.is_empty() && !b.next().is_multiple_of(4) {
        s.insert("type".into(), json!(ty));
    }
    let flags = b.next();
    let small = |b: &mut Bytes| u64::from(b.next() % 6);
    if flags & 1 != 0 && depth < 40 {
        let mut props = serde_json::Map::new();
        for i in 0..b.next() % 4 {
            props.insert(format!("k{i}"), gen(b, depth + 1));
        }
        s.insert("properties".into(), Value::Object(props));
    }
    if flags & 2 != 0 {
        let names: Vec<Value> = (0..b.next() % 3)
            .map(|i| json!(format!("k{}", i + b.next() % 2)))
            .collect();
        s.insert("required".into(), Value::Array(names));
    }
    if flags & 4 != 0 {
        let v = match b.next() % 3 {
            0 => json!(false),
            1 => json!(true),
            _ if depth < 40 => gen(b, depth + 1),
            _ => json!(true),
        };
        s.insert("additionalProperties".into(), v);
    }
    if flags & 8 != 0 && depth < 40 {
        s.insert("items".into(), gen(b, depth + 1));
    }
    if flags & 16 != 0 {
        s.insert("minItems".into(), json!(small(b)));
        s.insert("maxItems".into(), json!(small(b)));
    }
    if flags & 32 != 0 {
        s.insert("minLength".into(), json!(small(b)));
        if b.next().is_multiple_of(2) {
            s.insert("maxLength".into(), json!(small(b)));
        }
    }
    if flags & 64 != 0 {
        let vals: Vec<Value> = (0..1 + b.next() % 3)
            .map(|_| match b.next() % 5 {
                0 => json!(1),
                1 => json!(""),
                2 => json!("a"),
                3 => json!("abc"),
                _ => json!("é€"),
            })
            .collect();
        s.insert("enum".into(), Value::Array(vals));
    }
    if flags & 128 != 0 {
        s.insert("description".into(), json!("d"));
    }
    Value::Object(s)
}

/// One input: the body of the `json_schema` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (schema, choices) = if mode & 1 == 0 {
        // The input is schema text up to a 0xff, then the choices.
        let (text, tail) = match rest.iter().position(|&b| b == 0xff) {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        let Ok(v) = serde_json::from_slice::<Value>(text) else {
            return;
        };
        (v, tail)
    } else {
        let mut b = Bytes(rest);
        let v = gen(&mut b, 0);
        (v, b.0)
    };
    let Ok(fmt) = Format::json_schema(&schema) else {
        return;
    };
    let (pieces, idx) = vocab();
    let eog = pieces.len() - 1;
    let mut m = fmt.start();
    let mut text = Vec::new();
    let mut mask = Vec::new();
    let mut choices = Bytes(choices);
    for _ in 0..256 {
        let fed = m.mask(idx, true, &mut mask);
        assert!(
            fed <= idx.cost_bound(),
            "mask work {fed} > {}",
            idx.cost_bound()
        );
        let allowed: Vec<usize> = (0..pieces.len())
            .filter(|&t| mask[t / 64] >> (t % 64) & 1 == 1)
            .collect();
        assert!(
            !allowed.is_empty(),
            "{schema}: dead end after {:?}",
            String::from_utf8_lossy(&text)
        );
        let c = choices.next();
        // Bias towards short tokens that close values, so walks finish.
        let t = allowed[(usize::from(c) * 7 + text.len()) % allowed.len()];
        if t == eog {
            assert!(m.can_end());
            break;
        }
        let p = pieces[t].as_deref().expect("allowed tokens have bytes");
        assert!(m.accepts(p), "the mask allowed a token accepts refuses");
        assert!(m.push(p));
        text.extend_from_slice(p);
        if m.is_complete() {
            break;
        }
    }
    if m.is_complete() || m.can_end() {
        let doc: Value = serde_json::from_slice(&text).unwrap_or_else(|e| {
            panic!(
                "{schema}: {:?} does not parse: {e}",
                String::from_utf8_lossy(&text)
            )
        });
        if let Err(e) = validate(&schema, &doc) {
            panic!("{schema}: the output does not validate: {e}");
        }
    }
}
