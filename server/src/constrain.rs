//! Constrained decoding for `response_format`: `json_object` (any JSON object) and
//! `json_schema` (a subset of JSON Schema). A byte-level pushdown automaton follows the
//! output; a token is allowed when all its bytes keep the output a prefix of some valid
//! document, so the finished output always parses and validates. Generation ends as soon
//! as the top-level value is complete.
//!
//! Which tokens may come next is computed as a mask over the whole vocabulary before
//! sampling ([`JsonMachine::mask`]), never by sampling and retrying: a token trie
//! ([`TokenIndex`]) is walked once from the current state, each trie node costing one
//! automaton byte undone by a log (no copy of the stack), and subtrees the automaton
//! refuses are skipped whole. Inside a string, plain string-content tokens are allowed by
//! character count from a precomputed list and only the other tokens are walked. So the
//! work per step is at most the trie's node count, whatever the schema, the output so far
//! or the request's `logit_bias`.
//!
//! Schema keywords understood: `type` (object, array, string, integer, number, boolean,
//! null), `properties`, `required`, `additionalProperties` (a boolean or a schema),
//! `items`, `minItems`, `maxItems`, `enum` (strings), `minLength`, `maxLength`, plus the
//! annotations `title`, `description`, `$schema`, `$comment`, `examples`, `default`.
//! Every keyword is enforced or the schema is refused with an error naming it: an unknown
//! keyword, a keyword of another type than `type` names (without `type`, the keywords
//! name it), and a contradiction (`minLength` above `maxLength`, an `enum` value of the
//! wrong type or length, a `required` name that `additionalProperties: false` forbids).
//! Every schema that compiles can be completed from every state the automaton reaches,
//! so decoding never dead-ends. An object produces its `properties` (each at most once,
//! all `required` ones before it closes); `required` names missing from `properties`
//! are produced with the `additionalProperties` schema; an object without properties
//! produces free keys with `additionalProperties` values (nothing for `false`). Objects
//! and arrays nest at most [`MAX_DEPTH`] deep. Runs of more than three whitespace bytes
//! and numbers longer than 20 bytes (integers: 18, so they fit 64 bits) are refused so a
//! model cannot stall in formatting or digits; exponents have at most two digits so every number fits an f64 (parsers differ
//! on out-of-range numbers).

use std::sync::Arc;

use serde_json::Value;

const MAX_WS_RUN: u8 = 3;
/// The longest number written, in bytes (a model cannot stall in digits).
const MAX_NUM_BYTES: u8 = 20;
/// The longest `integer` written: 18 bytes, so it fits a signed 64-bit integer (parsers
/// read longer ones as floats, which a validator rejects as integers).
const MAX_INT_BYTES: u8 = 18;
pub const MAX_PROPS: usize = 64;
/// The most objects and arrays open at once: every output stays within common parsers'
/// nesting limits (serde_json's is 128) and the automaton's stack stays small.
pub const MAX_DEPTH: u8 = 32;
/// The most nodes a compiled schema may have.
const MAX_NODES: usize = 2048;
/// Node 0 of every format: any JSON value (what free objects and arrays hold).
const ANY: u32 = 0;
/// The schema index of a free object, array or string (no constraints).
const FREE: u32 = u32::MAX;

/// The low `n` bits set.
fn mask(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// One node of a parsed schema (an arena index is a `u32`).
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Any,
    /// An object with free keys (plain strings), every value of node `value`.
    Map {
        value: u32,
    },
    Object {
        props: Vec<(Vec<u8>, u32)>,
        required: u64,
    },
    Array {
        items: u32,
        min: u32,
        max: Option<u32>,
    },
    String {
        enumv: Option<Vec<Vec<u8>>>,
        min_len: u32,
        max_len: Option<u32>,
    },
    Integer,
    Number,
    Boolean,
    Null,
}

/// A parsed `response_format`.
#[derive(Clone, Debug)]
pub struct Format {
    nodes: Arc<Vec<Node>>,
    root: u32,
}

impl Format {
    /// `{"type": "json_object"}`.
    pub fn json_object() -> Format {
        Format {
            nodes: Arc::new(vec![Node::Any, Node::Map { value: ANY }]),
            root: 1,
        }
    }

    /// A format from a JSON Schema document; the error names the offending keyword.
    pub fn json_schema(schema: &Value) -> Result<Format, String> {
        let mut nodes = vec![Node::Any];
        let root = parse_node(schema, &mut nodes, "schema", 0)?;
        Ok(Format {
            nodes: Arc::new(nodes),
            root,
        })
    }

    /// Parses OpenAI's `response_format` object: None for `{"type": "text"}`.
    pub fn from_response_format(v: &Value) -> Result<Option<Format>, String> {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or("response_format needs a \"type\"")?;
        match ty {
            "text" => Ok(None),
            "json_object" => Ok(Some(Format::json_object())),
            "json_schema" => {
                let js = v
                    .get("json_schema")
                    .ok_or("response_format json_schema needs a \"json_schema\" object")?;
                let schema = js
                    .get("schema")
                    .ok_or("response_format json_schema needs json_schema.schema")?;
                Format::json_schema(schema).map(Some)
            }
            other => Err(format!(
                "response_format type '{other}' is not supported (text, json_object, json_schema)"
            )),
        }
    }

    /// A machine at the start of the output.
    pub fn start(&self) -> JsonMachine {
        JsonMachine {
            nodes: self.nodes.clone(),
            st: State::new(self.root),
            marks: Vec::new(),
        }
    }
}

const ANNOTATIONS: [&str; 6] = [
    "title",
    "description",
    "$schema",
    "$comment",
    "examples",
    "default",
];

/// The type a keyword constrains (None: it applies to any type).
fn keyword_type(k: &str) -> Option<&'static str> {
    match k {
        "properties" | "required" | "additionalProperties" => Some("object"),
        "items" | "minItems" | "maxItems" => Some("array"),
        "minLength" | "maxLength" => Some("string"),
        _ => None,
    }
}

fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

/// Compiles one schema object; `depth` objects and arrays enclose it.
fn parse_node(v: &Value, nodes: &mut Vec<Node>, at: &str, depth: u32) -> Result<u32, String> {
    if nodes.len() >= MAX_NODES {
        return Err(format!("{at}: the schema has more than {MAX_NODES} parts"));
    }
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{at}: a schema must be an object"))?;
    let known = |k: &str| {
        ANNOTATIONS.contains(&k) || keyword_type(k).is_some() || k == "type" || k == "enum"
    };
    if let Some(k) = obj.keys().find(|k| !known(k)) {
        return Err(format!("{at}: the keyword '{k}' is not supported"));
    }
    let u32_of = |k: &str| -> Result<Option<u32>, String> {
        match obj.get(k) {
            None => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| format!("{at}.{k} must be a non-negative integer")),
        }
    };
    let explicit = match obj.get("type") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(_) => {
            return Err(format!(
                "{at}.type must be one type name (lists are not supported)"
            ))
        }
    };
    if let Some(t) = explicit {
        if !matches!(
            t,
            "object" | "array" | "string" | "integer" | "number" | "boolean" | "null"
        ) {
            return Err(format!("{at}.type '{t}' is not a JSON type"));
        }
    }
    // Every type keyword must apply to the type; without `type`, they name it.
    let typed: Vec<(&str, &str)> = obj
        .keys()
        .filter_map(|k| keyword_type(k).map(|t| (k.as_str(), t)))
        .collect();
    let ty = match explicit {
        Some(t) => {
            if let Some((k, kt)) = typed.iter().find(|(_, kt)| *kt != t) {
                return Err(format!(
                    "{at}: the keyword '{k}' applies to type {kt}, not to type '{t}'"
                ));
            }
            Some(t)
        }
        None => {
            let mut kinds: Vec<&str> = typed.iter().map(|x| x.1).collect();
            kinds.sort_unstable();
            kinds.dedup();
            match kinds[..] {
                [] => None,
                [one] => Some(one),
                _ => {
                    let kws: Vec<&str> = typed.iter().map(|x| x.0).collect();
                    return Err(format!(
                        "{at}: the keywords {} constrain different types; give a \"type\"",
                        kws.join(", ")
                    ));
                }
            }
        }
    };
    let min_len = u32_of("minLength")?.unwrap_or(0);
    let max_len = u32_of("maxLength")?;
    if let Some(m) = max_len.filter(|&m| m < min_len) {
        return Err(format!(
            "{at}: minLength {min_len} is above maxLength {m}: no string satisfies both"
        ));
    }
    let idx = nodes.len() as u32;
    nodes.push(Node::Any); // placeholder, children follow
    let node = if let Some(e) = obj.get("enum") {
        let vals = e
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("{at}.enum must be a non-empty array"))?;
        if let Some(t) = ty.filter(|&t| t != "string") {
            return Err(format!(
                "{at}.enum: {} is not of type {t} (enum values must match the type; only string \
                 values are supported)",
                vals[0]
            ));
        }
        let strs: Option<Vec<&str>> = vals.iter().map(Value::as_str).collect();
        let strs = strs.ok_or_else(|| format!("{at}.enum: only string values are supported"))?;
        if strs.len() > MAX_PROPS {
            return Err(format!("{at}.enum: at most {MAX_PROPS} values"));
        }
        if strs.iter().any(|s| needs_escape(s)) {
            return Err(format!(
                "{at}.enum: values needing JSON escapes are not supported"
            ));
        }
        let kept: Vec<Vec<u8>> = strs
            .iter()
            .filter(|s| {
                let n = s.chars().count() as u64;
                n >= u64::from(min_len) && max_len.is_none_or(|m| n <= u64::from(m))
            })
            .map(|s| s.as_bytes().to_vec())
            .collect();
        if kept.is_empty() {
            return Err(format!(
                "{at}.enum: no value satisfies minLength / maxLength"
            ));
        }
        Node::String {
            enumv: Some(kept),
            min_len: 0,
            max_len: None,
        }
    } else {
        match ty {
            None => Node::Any,
            Some("object") => parse_object(obj, nodes, at, depth)?,
            Some("array") => {
                if depth >= u32::from(MAX_DEPTH) {
                    return Err(format!(
                        "{at}: objects and arrays nest more than {MAX_DEPTH} deep"
                    ));
                }
                let items = match obj.get("items") {
                    None => ANY,
                    Some(i @ Value::Object(_)) => {
                        parse_node(i, nodes, &format!("{at}.items"), depth + 1)?
                    }
                    Some(_) => return Err(format!("{at}.items must be one schema object")),
                };
                let min = u32_of("minItems")?.unwrap_or(0);
                let max = u32_of("maxItems")?;
                if let Some(m) = max.filter(|&m| m < min) {
                    return Err(format!(
                        "{at}: minItems {min} is above maxItems {m}: no array satisfies both"
                    ));
                }
                Node::Array { items, min, max }
            }
            Some("string") => Node::String {
                enumv: None,
                min_len,
                max_len,
            },
            Some("integer") => Node::Integer,
            Some("number") => Node::Number,
            Some("boolean") => Node::Boolean,
            Some("null") => Node::Null,
            Some(t) => return Err(format!("{at}.type '{t}' is not a JSON type")),
        }
    };
    nodes[idx as usize] = node;
    Ok(idx)
}

fn parse_object(
    obj: &serde_json::Map<String, Value>,
    nodes: &mut Vec<Node>,
    at: &str,
    depth: u32,
) -> Result<Node, String> {
    if depth >= u32::from(MAX_DEPTH) {
        return Err(format!(
            "{at}: objects and arrays nest more than {MAX_DEPTH} deep"
        ));
    }
    let declared = match obj.get("properties") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(format!("{at}.properties must be an object")),
    };
    let required: Vec<&str> = match obj.get("required") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|r| r.as_str())
            .collect::<Option<_>>()
            .ok_or_else(|| format!("{at}.required must be an array of property names"))?,
        Some(_) => return Err(format!("{at}.required must be an array of property names")),
    };
    let mut props: Vec<(Vec<u8>, u32)> = Vec::new();
    for (name, sub) in declared.into_iter().flatten() {
        if needs_escape(name) {
            return Err(format!(
                "{at}.properties: names needing JSON escapes are not supported"
            ));
        }
        let child = parse_node(sub, nodes, &format!("{at}.properties.{name}"), depth + 1)?;
        props.push((name.as_bytes().to_vec(), child));
    }
    // Values of keys outside `properties`: None when none may appear.
    let extra = match obj.get("additionalProperties") {
        None | Some(Value::Bool(true)) => Some(ANY),
        Some(Value::Bool(false)) => None,
        Some(s @ Value::Object(_)) => Some(parse_node(
            s,
            nodes,
            &format!("{at}.additionalProperties"),
            depth + 1,
        )?),
        Some(_) => {
            return Err(format!(
                "{at}.additionalProperties must be a boolean or a schema"
            ))
        }
    };
    let mut req = 0u64;
    for r in required {
        let i = match props.iter().position(|(n, _)| n == r.as_bytes()) {
            Some(i) => i,
            None => {
                let Some(value) = extra else {
                    return Err(format!(
                        "{at}.required names '{r}', which is not in properties while \
                         additionalProperties is false"
                    ));
                };
                if needs_escape(r) {
                    return Err(format!(
                        "{at}.required: names needing JSON escapes are not supported"
                    ));
                }
                props.push((r.as_bytes().to_vec(), value));
                props.len() - 1
            }
        };
        if i >= MAX_PROPS {
            break;
        }
        req |= 1 << i;
    }
    if props.len() > MAX_PROPS {
        return Err(format!("{at}: at most {MAX_PROPS} properties"));
    }
    Ok(if !props.is_empty() {
        // Declared keys only (extra keys are allowed by the schema but never produced).
        Node::Object {
            props,
            required: req,
        }
    } else {
        match extra {
            Some(value) => Node::Map { value },
            None => Node::Object { props, required: 0 },
        }
    })
}

/// String escape states at and above this one are inside a UTF-8 character: the next
/// byte must be a continuation in a range (so the output is always valid UTF-8, without
/// overlong forms or surrogates).
const UTF8: u8 = 16;
/// (lowest, highest) allowed byte and the state after it, for each UTF-8 state.
const UTF8_STATES: [(u8, u8, u8); 7] = [
    (0x80, 0xbf, 0),        // 16: one continuation left
    (0x80, 0xbf, UTF8),     // 17: two left
    (0x80, 0xbf, UTF8 + 1), // 18: three left
    (0xa0, 0xbf, UTF8),     // 19: after E0
    (0x80, 0x9f, UTF8),     // 20: after ED (no surrogates)
    (0x90, 0xbf, UTF8 + 1), // 21: after F0
    (0x80, 0x8f, UTF8 + 1), // 22: after F4 (at most U+10FFFF)
];

/// The escape state after a string byte >= 0x20 outside any escape: 0 for ASCII, a UTF-8
/// state for a lead byte, None for a byte that cannot start a character.
fn utf8_lead(b: u8) -> Option<u8> {
    Some(match b {
        0x20..=0x7f => 0,
        0xc2..=0xdf => UTF8,
        0xe0 => UTF8 + 3,
        0xed => UTF8 + 4,
        0xe1..=0xef => UTF8 + 1,
        0xf0 => UTF8 + 5,
        0xf1..=0xf3 => UTF8 + 2,
        0xf4 => UTF8 + 6,
        _ => return None,
    })
}

fn utf8_next(state: u8, b: u8) -> Option<u8> {
    let (lo, hi, next) = UTF8_STATES[(state - UTF8) as usize];
    (lo..=hi).contains(&b).then_some(next)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ObjPhase {
    /// After `{`: a key or `}`.
    Open,
    /// After `,`: a key.
    Comma,
    /// Inside a key: candidates (declared objects) and bytes so far.
    Key { cand: u64, len: u32, esc: u8 },
    /// After the key's closing quote: `:`.
    Colon,
    /// After a value: `,` or `}`.
    Next,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ArrPhase {
    Open,
    Comma,
    Next,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NumPhase {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    /// One exponent digit written.
    ExpDigits,
    /// Two: the most allowed, so every number fits an f64.
    ExpDigits2,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Frame {
    /// A value of schema node `n` is expected next.
    Value(u32),
    Obj {
        n: u32,
        seen: u64,
        /// The property whose value is being written.
        cur: u32,
        phase: ObjPhase,
    },
    Arr {
        n: u32,
        count: u32,
        phase: ArrPhase,
    },
    /// Inside a string: bytes written (escapes count once), escape state (0 none, 1
    /// after `\`, 2..=5 hex digits left + 1), enum candidates.
    Str {
        n: u32,
        len: u32,
        esc: u8,
        cand: u64,
    },
    Num {
        integer: bool,
        phase: NumPhase,
        len: u8,
    },
    /// `true` / `false` / `null`: which word and bytes matched.
    Lit {
        word: u8,
        pos: u8,
    },
}

const WORDS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// Follows an output byte by byte (see the module docs).
#[derive(Clone, Debug)]
pub struct JsonMachine {
    nodes: Arc<Vec<Node>>,
    st: State,
    /// Scratch for [`mask`](Self::mask): the state after each byte of the trie path.
    marks: Vec<Mark>,
}

/// One undoable change of the stack (see [`State::logging`]).
#[derive(Clone, Copy, Debug)]
enum Undo {
    Pushed,
    Popped(Frame),
    Set(u32, Frame),
}

/// The automaton's state; the schema nodes are passed in, never copied.
#[derive(Clone, Debug)]
struct State {
    stack: Vec<Frame>,
    ws_run: u8,
    done: bool,
    /// Objects and arrays open (at most [`MAX_DEPTH`]).
    depth: u8,
    /// While set, every stack change is logged so a trie walk can undo it: feeding one
    /// byte changes O(1) frames, so the walk costs O(1) per trie node, never a copy of
    /// the stack.
    logging: bool,
    log: Vec<Undo>,
}

/// A point [`State::reset`] can return to.
#[derive(Clone, Copy, Debug)]
struct Mark {
    log: usize,
    ws_run: u8,
    done: bool,
    depth: u8,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl JsonMachine {
    /// Whether the top-level value is complete.
    pub fn is_complete(&self) -> bool {
        self.st.done
    }

    /// Whether the output may end here: the value is complete, or a top-level number
    /// could stop now.
    pub fn can_end(&self) -> bool {
        self.st.done
            || matches!(
                self.st.stack.as_slice(),
                [Frame::Num {
                    phase: NumPhase::Zero
                        | NumPhase::Int
                        | NumPhase::Frac
                        | NumPhase::ExpDigits
                        | NumPhase::ExpDigits2,
                    ..
                }]
            )
    }

    /// Whether `bytes` may come next (the machine is not changed).
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        if bytes.is_empty() || self.st.done {
            return false;
        }
        let mut st = self.st.clone();
        st.logging = false;
        bytes.iter().all(|&b| st.feed(&self.nodes, b))
    }

    /// Consumes `bytes`; false (and a machine in an unspecified state) when they break
    /// the format.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        let nodes = &self.nodes;
        bytes.iter().all(|&b| self.st.feed(nodes, b))
    }
}

impl State {
    fn new(root: u32) -> State {
        State {
            stack: vec![Frame::Value(root)],
            ws_run: 0,
            done: false,
            depth: 0,
            logging: false,
            log: Vec::new(),
        }
    }

    fn push(&mut self, f: Frame) {
        self.stack.push(f);
        if self.logging {
            self.log.push(Undo::Pushed);
        }
    }

    fn pop(&mut self) -> Option<Frame> {
        let f = self.stack.pop()?;
        if self.logging {
            self.log.push(Undo::Popped(f));
        }
        Some(f)
    }

    fn set_top(&mut self, f: Frame) {
        let i = self.stack.len() - 1;
        if self.logging {
            self.log.push(Undo::Set(i as u32, self.stack[i]));
        }
        self.stack[i] = f;
    }

    fn mark(&self) -> Mark {
        Mark {
            log: self.log.len(),
            ws_run: self.ws_run,
            done: self.done,
            depth: self.depth,
        }
    }

    /// Undoes every change since `m` (which must come from this logging session).
    fn reset(&mut self, m: Mark) {
        while self.log.len() > m.log {
            match self.log.pop() {
                Some(Undo::Pushed) => {
                    self.stack.pop();
                }
                Some(Undo::Popped(f)) => self.stack.push(f),
                Some(Undo::Set(i, f)) => self.stack[i as usize] = f,
                None => break,
            }
        }
        self.ws_run = m.ws_run;
        self.done = m.done;
        self.depth = m.depth;
    }

    fn ws(&mut self, b: u8) -> bool {
        self.ws_run += 1;
        let _ = b;
        self.ws_run <= MAX_WS_RUN
    }

    /// A value has ended: tell the frame below.
    fn value_done(&mut self) {
        match self.stack.last().copied() {
            None => self.done = true,
            Some(Frame::Obj { n, seen, cur, .. }) => self.set_top(Frame::Obj {
                n,
                seen,
                cur,
                phase: ObjPhase::Next,
            }),
            Some(Frame::Arr { n, count, .. }) => self.set_top(Frame::Arr {
                n,
                count: count + 1,
                phase: ArrPhase::Next,
            }),
            Some(_) => unreachable!("only containers hold values"),
        }
    }

    /// Closes the innermost object or array.
    fn close_container(&mut self) {
        self.depth -= 1;
        self.value_done();
    }

    /// Starts a value of node `n` with byte `b`.
    fn start_value(&mut self, nodes: &[Node], n: u32, b: u8) -> bool {
        if is_ws(b) {
            self.push(Frame::Value(n));
            return self.ws(b);
        }
        self.ws_run = 0;
        let node = &nodes[n as usize];
        let any = matches!(node, Node::Any);
        match b {
            b'{' if (any || matches!(node, Node::Map { .. } | Node::Object { .. }))
                && self.depth < MAX_DEPTH =>
            {
                self.depth += 1;
                self.push(Frame::Obj {
                    n: if any { FREE } else { n },
                    seen: 0,
                    cur: 0,
                    phase: ObjPhase::Open,
                });
                true
            }
            b'[' if (any || matches!(node, Node::Array { .. })) && self.depth < MAX_DEPTH => {
                self.depth += 1;
                self.push(Frame::Arr {
                    n: if any { FREE } else { n },
                    count: 0,
                    phase: ArrPhase::Open,
                });
                true
            }
            b'"' if any || matches!(node, Node::String { .. }) => {
                let cand = match node {
                    Node::String { enumv: Some(e), .. } => mask(e.len()),
                    _ => 0,
                };
                self.push(Frame::Str {
                    n: if any { FREE } else { n },
                    len: 0,
                    esc: 0,
                    cand,
                });
                true
            }
            b'-' | b'0'..=b'9' if any || matches!(node, Node::Integer | Node::Number) => {
                self.push(Frame::Num {
                    integer: matches!(node, Node::Integer),
                    phase: match b {
                        b'-' => NumPhase::Minus,
                        b'0' => NumPhase::Zero,
                        _ => NumPhase::Int,
                    },
                    len: 1,
                });
                true
            }
            b't' | b'f' if any || matches!(node, Node::Boolean) => {
                self.push(Frame::Lit {
                    word: if b == b't' { 0 } else { 1 },
                    pos: 1,
                });
                true
            }
            b'n' if any || matches!(node, Node::Null) => {
                self.push(Frame::Lit { word: 2, pos: 1 });
                true
            }
            _ => false,
        }
    }

    fn feed(&mut self, nodes: &[Node], b: u8) -> bool {
        if self.done {
            return false;
        }
        let Some(top) = self.pop() else {
            return false;
        };
        match top {
            Frame::Value(n) => self.start_value(nodes, n, b),
            Frame::Lit { word, pos } => {
                let w = WORDS[word as usize];
                if w[pos as usize] != b {
                    return false;
                }
                if pos as usize + 1 == w.len() {
                    self.value_done();
                } else {
                    self.push(Frame::Lit { word, pos: pos + 1 });
                }
                true
            }
            Frame::Num {
                integer,
                phase,
                len,
            } => self.feed_num(nodes, integer, phase, len, b),
            Frame::Str { n, len, esc, cand } => self.feed_str(nodes, n, len, esc, cand, b),
            Frame::Arr { n, count, phase } => self.feed_arr(nodes, n, count, phase, b),
            Frame::Obj {
                n,
                seen,
                cur,
                phase,
            } => self.feed_obj(nodes, n, seen, cur, phase, b),
        }
    }

    fn feed_num(&mut self, nodes: &[Node], integer: bool, phase: NumPhase, len: u8, b: u8) -> bool {
        use NumPhase::*;
        let max = if integer {
            MAX_INT_BYTES
        } else {
            MAX_NUM_BYTES
        };
        let room = len < max;
        // A byte after which a digit must follow (`.`, `e`, a sign) needs room for it too,
        // so a number can always be finished.
        let room2 = len + 1 < max;
        let next = match (phase, b) {
            _ if !room => None,
            (Zero | Int | Frac, b'.' | b'e' | b'E') | (Exp, b'+' | b'-') if !room2 => None,
            // `-0` parses as a float in some parsers: an integer never starts so.
            (Minus, b'0') if !integer => Some(Zero),
            (Minus, b'1'..=b'9') => Some(Int),
            (Int, b'0'..=b'9') => Some(Int),
            (Zero | Int, b'.') if !integer => Some(Dot),
            (Zero | Int | Frac, b'e' | b'E') if !integer => Some(Exp),
            (Dot | Frac, b'0'..=b'9') => Some(Frac),
            (Exp, b'+' | b'-') => Some(ExpSign),
            (Exp | ExpSign, b'0'..=b'9') => Some(ExpDigits),
            (ExpDigits, b'0'..=b'9') => Some(ExpDigits2),
            _ => None,
        };
        if let Some(p) = next {
            self.push(Frame::Num {
                integer,
                phase: p,
                len: len + 1,
            });
            return true;
        }
        // The number ends here if it can: the byte belongs to what follows.
        if matches!(phase, Zero | Int | Frac | ExpDigits | ExpDigits2) {
            self.value_done();
            self.feed(nodes, b)
        } else {
            false
        }
    }

    fn feed_str(&mut self, nodes: &[Node], n: u32, len: u32, esc: u8, cand: u64, b: u8) -> bool {
        let (enumv, min_len, max_len) = match (n != FREE).then(|| &nodes[n as usize]) {
            Some(Node::String {
                enumv,
                min_len,
                max_len,
            }) => (enumv.as_ref(), *min_len, *max_len),
            _ => (None, 0, None),
        };
        if let Some(e) = enumv {
            // Enum values have no escapes: bytes must continue a candidate.
            if b == b'"' {
                let ok = (0..e.len()).any(|i| cand >> i & 1 == 1 && e[i].len() == len as usize);
                if ok {
                    self.value_done();
                }
                return ok;
            }
            let mut c = 0u64;
            for (i, v) in e.iter().enumerate() {
                if cand >> i & 1 == 1 && v.get(len as usize) == Some(&b) {
                    c |= 1 << i;
                }
            }
            if c == 0 {
                return false;
            }
            self.push(Frame::Str {
                n,
                len: len + 1,
                esc: 0,
                cand: c,
            });
            return true;
        }
        match str_step(len, esc, min_len, max_len, b) {
            StrStep::Go { len, esc } => {
                self.push(Frame::Str { n, len, esc, cand });
                true
            }
            StrStep::Close => {
                self.value_done();
                true
            }
            StrStep::Reject => false,
        }
    }

    fn feed_arr(&mut self, nodes: &[Node], n: u32, count: u32, phase: ArrPhase, b: u8) -> bool {
        let (items, min, max) = match (n != FREE).then(|| &nodes[n as usize]) {
            Some(Node::Array { items, min, max }) => (Some(*items), *min, *max),
            _ => (None, 0, None),
        };
        if is_ws(b) {
            self.push(Frame::Arr { n, count, phase });
            return self.ws(b);
        }
        self.ws_run = 0;
        let item = items.unwrap_or(ANY);
        let can_close = count >= min;
        let can_add = max.is_none_or(|m| count < m);
        match (phase, b) {
            (ArrPhase::Open | ArrPhase::Next, b']') if can_close => {
                self.close_container();
                true
            }
            (ArrPhase::Next, b',') if can_add => {
                self.push(Frame::Arr {
                    n,
                    count,
                    phase: ArrPhase::Comma,
                });
                true
            }
            (ArrPhase::Open | ArrPhase::Comma, _) if can_add => {
                self.push(Frame::Arr {
                    n,
                    count,
                    phase: ArrPhase::Next,
                });
                self.start_value(nodes, item, b)
            }
            _ => false,
        }
    }

    fn feed_obj(
        &mut self,
        nodes: &[Node],
        n: u32,
        seen: u64,
        cur: u32,
        phase: ObjPhase,
        b: u8,
    ) -> bool {
        let (props, free_value) = match (n != FREE).then(|| &nodes[n as usize]) {
            Some(Node::Object { props, required }) => (Some((&props[..], *required)), ANY),
            Some(Node::Map { value }) => (None, *value),
            _ => (None, ANY),
        };
        if let ObjPhase::Key { cand, len, esc } = phase {
            return self.feed_key(nodes, n, seen, props.map(|p| p.0), cand, len, esc, b);
        }
        if is_ws(b) {
            self.push(Frame::Obj {
                n,
                seen,
                cur,
                phase,
            });
            return self.ws(b);
        }
        self.ws_run = 0;
        let all_required = props.is_none_or(|(_, req)| seen & req == req);
        let unseen = props
            .map(|(p, _)| mask(p.len()) & !seen)
            .unwrap_or(u64::MAX);
        match (phase, b) {
            (ObjPhase::Open | ObjPhase::Next, b'}') if all_required => {
                self.close_container();
                true
            }
            (ObjPhase::Next, b',') if unseen != 0 => {
                self.push(Frame::Obj {
                    n,
                    seen,
                    cur,
                    phase: ObjPhase::Comma,
                });
                true
            }
            (ObjPhase::Open | ObjPhase::Comma, b'"') if unseen != 0 => {
                self.push(Frame::Obj {
                    n,
                    seen,
                    cur,
                    phase: ObjPhase::Key {
                        cand: unseen,
                        len: 0,
                        esc: 0,
                    },
                });
                true
            }
            (ObjPhase::Colon, b':') => {
                self.push(Frame::Obj {
                    n,
                    seen,
                    cur,
                    phase: ObjPhase::Next,
                });
                let value = props.map_or(free_value, |(p, _)| p[cur as usize].1);
                self.push(Frame::Value(value));
                true
            }
            _ => false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn feed_key(
        &mut self,
        _nodes: &[Node],
        n: u32,
        seen: u64,
        props: Option<&[(Vec<u8>, u32)]>,
        cand: u64,
        len: u32,
        esc: u8,
        b: u8,
    ) -> bool {
        let Some(props) = props else {
            // A free key: a plain JSON string.
            let phase = match str_step(len, esc, 0, None, b) {
                StrStep::Go { len, esc } => ObjPhase::Key { cand, len, esc },
                StrStep::Close => ObjPhase::Colon,
                StrStep::Reject => return false,
            };
            self.push(Frame::Obj {
                n,
                seen,
                cur: 0,
                phase,
            });
            return true;
        };
        if b == b'"' {
            let Some(i) =
                (0..props.len()).find(|&i| cand >> i & 1 == 1 && props[i].0.len() == len as usize)
            else {
                return false;
            };
            self.push(Frame::Obj {
                n,
                seen: seen | 1 << i,
                cur: i as u32,
                phase: ObjPhase::Colon,
            });
            return true;
        }
        let mut c = 0u64;
        for (i, (name, _)) in props.iter().enumerate() {
            if cand >> i & 1 == 1 && name.get(len as usize) == Some(&b) {
                c |= 1 << i;
            }
        }
        if c == 0 {
            return false;
        }
        self.push(Frame::Obj {
            n,
            seen,
            cur: 0,
            phase: ObjPhase::Key {
                cand: c,
                len: len + 1,
                esc: 0,
            },
        });
        true
    }
}

/// What one byte does to a string without enum values.
enum StrStep {
    /// Still inside: characters so far and the escape state.
    Go {
        len: u32,
        esc: u8,
    },
    /// The closing quote.
    Close,
    Reject,
}

/// One byte of a string holding `len` characters (escapes and multi-byte characters count
/// once) in escape state `esc` (0 none, 1 after `\`, 2..=5 hex digits left + 1, UTF-8
/// states from [`UTF8`]), with `min_len` / `max_len` characters.
fn str_step(len: u32, esc: u8, min_len: u32, max_len: Option<u32>, b: u8) -> StrStep {
    let full = max_len.is_some_and(|m| len >= m);
    match esc {
        0 => match b {
            b'"' if len < min_len => StrStep::Reject,
            b'"' => StrStep::Close,
            b'\\' if full => StrStep::Reject,
            b'\\' => StrStep::Go { len, esc: 1 },
            0..=0x1f => StrStep::Reject,
            _ if full => StrStep::Reject,
            _ => match utf8_lead(b) {
                Some(esc) => StrStep::Go { len: len + 1, esc },
                None => StrStep::Reject,
            },
        },
        // Inside a multi-byte character (counted once, at its lead byte).
        k if k >= UTF8 => match utf8_next(k, b) {
            Some(esc) => StrStep::Go { len, esc },
            None => StrStep::Reject,
        },
        1 => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => StrStep::Go {
                len: len + 1,
                esc: 0,
            },
            b'u' => StrStep::Go { len, esc: 5 },
            _ => StrStep::Reject,
        },
        k => {
            if !b.is_ascii_hexdigit() {
                return StrStep::Reject;
            }
            let left = k - 1;
            StrStep::Go {
                len: len + u32::from(left == 1),
                esc: if left == 1 { 0 } else { left },
            }
        }
    }
}

/// The characters of a token read as string content from outside any escape, when every
/// byte is plain content (no quote, backslash or control byte; well-formed UTF-8 from a
/// character boundary, possibly ending inside a character). Such a token is allowed
/// inside a string exactly when that many more characters fit.
fn content_chars(bytes: &[u8]) -> Option<u32> {
    let mut esc = 0u8;
    let mut n = 0u32;
    for &b in bytes {
        if esc >= UTF8 {
            esc = utf8_next(esc, b)?;
        } else {
            if b == b'"' || b == b'\\' || b < 0x20 {
                return None;
            }
            esc = utf8_lead(b)?;
            n += 1;
        }
    }
    Some(n)
}

/// A byte trie over token pieces in preorder: node `i` is reached by `byte[i]` from its
/// parent at depth `depth[i] - 1`, its subtree ends before `end[i]`, and the tokens whose
/// piece ends there are `toks[first[i]..first[i + 1]]`.
#[derive(Debug, Default)]
struct Trie {
    byte: Vec<u8>,
    depth: Vec<u32>,
    end: Vec<u32>,
    first: Vec<u32>,
    toks: Vec<u32>,
}

impl Trie {
    fn build(mut items: Vec<(&[u8], u32)>) -> Trie {
        items.sort_unstable();
        let mut t = Trie::default();
        let mut path: Vec<usize> = Vec::new();
        let mut prev: &[u8] = &[];
        for (bytes, id) in items {
            let lcp = prev
                .iter()
                .zip(bytes)
                .take_while(|(a, b)| a == b)
                .count()
                .min(path.len());
            while path.len() > lcp {
                let n = path.pop().expect("non-empty path");
                t.end[n] = t.byte.len() as u32;
            }
            for (k, &b) in bytes.iter().enumerate().skip(lcp) {
                path.push(t.byte.len());
                t.byte.push(b);
                t.depth.push(k as u32);
                t.end.push(0);
                t.first.push(t.toks.len() as u32);
            }
            t.toks.push(id);
            prev = bytes;
        }
        while let Some(n) = path.pop() {
            t.end[n] = t.byte.len() as u32;
        }
        t.first.push(t.toks.len() as u32);
        t
    }

    fn len(&self) -> usize {
        self.byte.len()
    }

    fn tokens(&self, i: usize) -> &[u32] {
        &self.toks[self.first[i] as usize..self.first[i + 1] as usize]
    }
}

fn set_bit(out: &mut [u64], t: u32) {
    out[t as usize / 64] |= 1 << (t % 64);
}

/// A model's vocabulary prepared for constraint masks: built once per model, shared by
/// every constrained request.
#[derive(Debug)]
pub struct TokenIndex {
    n_vocab: usize,
    /// Every token with a non-empty piece (end-of-generation tokens aside).
    full: Trie,
    /// The tokens that are not plain string content (see [`content_chars`]).
    special: Trie,
    /// Plain string-content tokens by character count: `content[..content_upto[k]]` have
    /// at most `k` characters (the last entry covers them all).
    content: Vec<u32>,
    content_upto: Vec<u32>,
    content_all: Vec<u64>,
    eog: Vec<u32>,
}

impl TokenIndex {
    /// From each token's bytes (None for control tokens, which are never allowed) and
    /// which tokens end generation (allowed once the output may end).
    pub fn new(pieces: &[Option<Vec<u8>>], is_eog: impl Fn(u32) -> bool) -> TokenIndex {
        let n_vocab = pieces.len();
        let mut all = Vec::new();
        let mut special = Vec::new();
        let mut content: Vec<(u32, u32)> = Vec::new();
        let mut eog = Vec::new();
        for (t, p) in pieces.iter().enumerate() {
            let t = t as u32;
            if is_eog(t) {
                eog.push(t);
                continue;
            }
            let Some(p) = p.as_deref().filter(|p| !p.is_empty()) else {
                continue;
            };
            all.push((p, t));
            match content_chars(p) {
                Some(n) => content.push((n, t)),
                None => special.push((p, t)),
            }
        }
        content.sort_unstable();
        let max_chars = content.last().map_or(0, |c| c.0) as usize;
        let mut content_upto = vec![0u32; max_chars + 1];
        for (i, &(n, _)) in content.iter().enumerate() {
            content_upto[n as usize] = i as u32 + 1;
        }
        for k in 1..content_upto.len() {
            content_upto[k] = content_upto[k].max(content_upto[k - 1]);
        }
        let mut content_all = vec![0u64; n_vocab.div_ceil(64)];
        for &(_, t) in &content {
            set_bit(&mut content_all, t);
        }
        TokenIndex {
            n_vocab,
            full: Trie::build(all),
            special: Trie::build(special),
            content: content.into_iter().map(|c| c.1).collect(),
            content_upto,
            content_all,
            eog,
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The most automaton bytes one [`JsonMachine::mask`] may feed: every trie node once.
    /// A property of the vocabulary, independent of any request.
    pub fn cost_bound(&self) -> usize {
        self.full.len()
    }

    /// Nodes of the trie walked inside strings (the tokens that are not plain content).
    pub fn special_nodes(&self) -> usize {
        self.special.len()
    }
}

impl JsonMachine {
    /// The characters that still fit when the output is inside a string (or a free
    /// object key) outside any escape, where plain content tokens depend only on that
    /// count: `Some(None)` for no limit; None elsewhere.
    fn content_room(&self) -> Option<Option<u32>> {
        match self.st.stack.last()? {
            Frame::Str { n, len, esc: 0, .. } => {
                if *n == FREE {
                    return Some(None);
                }
                match &self.nodes[*n as usize] {
                    Node::String {
                        enumv: None,
                        max_len,
                        ..
                    } => Some(max_len.map(|m| m.saturating_sub(*len))),
                    _ => None,
                }
            }
            Frame::Obj {
                n,
                phase: ObjPhase::Key { esc: 0, .. },
                ..
            } if *n == FREE || matches!(self.nodes[*n as usize], Node::Map { .. }) => Some(None),
            _ => None,
        }
    }

    /// Every token that may come next, as a bitset over the vocabulary in `out`: tokens
    /// whose bytes all keep the output a valid prefix, and the end-of-generation tokens
    /// when `allow_eog` and the output may end here. Returns the automaton bytes fed,
    /// never more than [`TokenIndex::cost_bound`]. The machine is left as it was.
    pub fn mask(&mut self, idx: &TokenIndex, allow_eog: bool, out: &mut Vec<u64>) -> usize {
        out.clear();
        out.resize(idx.n_vocab.div_ceil(64), 0);
        if self.st.done {
            return 0;
        }
        let fed = match self.content_room() {
            Some(room) => {
                match room {
                    None => {
                        for (o, c) in out.iter_mut().zip(&idx.content_all) {
                            *o |= c;
                        }
                    }
                    Some(r) => {
                        let k = (r as usize).min(idx.content_upto.len() - 1);
                        for &t in &idx.content[..idx.content_upto[k] as usize] {
                            set_bit(out, t);
                        }
                    }
                }
                self.walk(&idx.special, out)
            }
            None => self.walk(&idx.full, out),
        };
        if allow_eog && self.can_end() {
            for &t in &idx.eog {
                set_bit(out, t);
            }
        }
        fed
    }

    /// Walks `trie` from the current state, setting the bits of every token it accepts;
    /// a refused node skips its subtree. Returns the bytes fed.
    fn walk(&mut self, trie: &Trie, out: &mut [u64]) -> usize {
        let nodes = &*self.nodes;
        let st = &mut self.st;
        let marks = &mut self.marks;
        st.logging = true;
        st.log.clear();
        let base = st.mark();
        marks.clear();
        marks.push(base);
        let mut fed = 0;
        let mut i = 0;
        while i < trie.len() {
            let d = trie.depth[i] as usize;
            st.reset(marks[d]);
            fed += 1;
            if st.feed(nodes, trie.byte[i]) {
                for &t in trie.tokens(i) {
                    set_bit(out, t);
                }
                marks.truncate(d + 1);
                marks.push(st.mark());
                i += 1;
            } else {
                i = trie.end[i] as usize;
            }
        }
        st.reset(base);
        st.logging = false;
        st.log.clear();
        fed
    }
}

/// An independent check that `doc` satisfies `schema` under JSON Schema's rules, for the
/// keywords [`Format::json_schema`] accepts (for tests and fuzzing: the automaton must
/// only ever produce documents this accepts).
pub fn validate(schema: &Value, doc: &Value) -> Result<(), String> {
    let s = schema.as_object().ok_or("a schema must be an object")?;
    let fail = |why: String| Err(format!("{doc}: {why}"));
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(doc) {
            return fail(format!("not one of {}", Value::Array(e.clone())));
        }
    }
    if let Some(t) = s.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => doc.is_object(),
            "array" => doc.is_array(),
            "string" => doc.is_string(),
            "integer" => doc.is_i64() || doc.is_u64(),
            "number" => doc.is_number(),
            "boolean" => doc.is_boolean(),
            "null" => doc.is_null(),
            _ => false,
        };
        if !ok {
            return fail(format!("not of type {t}"));
        }
    }
    let num = |k: &str| s.get(k).and_then(Value::as_u64);
    match doc {
        Value::String(x) => {
            let n = x.chars().count() as u64;
            if num("minLength").is_some_and(|m| n < m) || num("maxLength").is_some_and(|m| n > m) {
                return fail("length out of range".into());
            }
        }
        Value::Array(a) => {
            let n = a.len() as u64;
            if num("minItems").is_some_and(|m| n < m) || num("maxItems").is_some_and(|m| n > m) {
                return fail("item count out of range".into());
            }
            if let Some(items) = s.get("items") {
                for x in a {
                    validate(items, x)?;
                }
            }
        }
        Value::Object(o) => {
            for r in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if !r.as_str().is_some_and(|r| o.contains_key(r)) {
                    return fail(format!("required {r} missing"));
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            for (k, v) in o {
                match props.and_then(|p| p.get(k)) {
                    Some(ps) => validate(ps, v)?,
                    None => match s.get("additionalProperties") {
                        Some(Value::Bool(false)) => return fail(format!("extra key {k}")),
                        Some(a @ Value::Object(_)) => validate(a, v)?,
                        _ => {}
                    },
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(f: &Format, s: &str) -> bool {
        let mut m = f.start();
        m.push(s.as_bytes()) && m.is_complete()
    }

    fn prefix_ok(f: &Format, s: &str) -> bool {
        f.start().push(s.as_bytes())
    }

    #[test]
    fn json_object_accepts_objects_only() {
        let f = Format::json_object();
        assert!(ok(
            &f,
            r#"{"a": [1, 2.5e-3, "x\n\u00e9", {"b": null}], "c": true}"#
        ));
        assert!(ok(&f, "{}"));
        assert!(!prefix_ok(&f, "[1]"));
        assert!(!prefix_ok(&f, "{\"a\" 1"));
        assert!(!prefix_ok(&f, "{\"a\": 01"));
        assert!(!prefix_ok(&f, "{\"a\": tru}"));
        assert!(
            !prefix_ok(&f, "{     \"a\":1}"),
            "whitespace runs are bounded"
        );
        assert!(prefix_ok(&f, "{\"a\": \"unfinished"));
        let mut m = f.start();
        assert!(m.push(b"{\"a\":1}"));
        assert!(m.is_complete());
        assert!(!m.accepts(b" "), "nothing after the value");
    }

    #[test]
    fn schemas_constrain_keys_types_and_counts() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 5},
                "age": {"type": "integer"},
                "mood": {"enum": ["happy", "sad"]},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}
            },
            "required": ["name", "age"]
        });
        let f = Format::json_schema(&schema).unwrap();
        assert!(ok(&f, r#"{"name": "Ann", "age": 31}"#));
        assert!(ok(
            &f,
            r#"{"age": -4, "name": "", "mood": "sad", "tags": ["a", "b"]}"#
        ));
        assert!(!prefix_ok(&f, r#"{"name": "Ann"}"#), "required age missing");
        assert!(!prefix_ok(&f, r#"{"nick""#), "undeclared key");
        assert!(!prefix_ok(&f, r#"{"name": "Ann", "name""#), "duplicate key");
        assert!(!prefix_ok(&f, r#"{"age": 3.5"#), "integer");
        assert!(!prefix_ok(&f, r#"{"name": "Annabel"#), "maxLength");
        assert!(!prefix_ok(&f, r#"{"mood": "ok"#), "enum");
        assert!(!prefix_ok(&f, r#"{"tags": []"#), "minItems");
        assert!(!prefix_ok(&f, r#"{"tags": ["a","b","c""#), "maxItems");
        assert!(prefix_ok(&f, r#"{"mood": "ha"#));
    }

    #[test]
    fn numbers_are_bounded() {
        let f = Format::json_schema(&json!({"type": "integer"})).unwrap();
        assert!(prefix_ok(&f, &"9".repeat(18)));
        assert!(!prefix_ok(&f, &"9".repeat(19)));
        assert!(!prefix_ok(&f, &format!("-{}", "9".repeat(18))));
        let n = Format::json_schema(&json!({"type": "number"})).unwrap();
        assert!(prefix_ok(&n, &"9".repeat(20)));
        assert!(!prefix_ok(&n, &"9".repeat(21)));
        let mut m = f.start();
        assert!(m.push(b"-12") && !m.is_complete() && m.can_end());
    }

    /// A small deterministic generator of JSON values.
    fn random_value(seed: &mut u64, depth: u32) -> Value {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (*seed >> 33) as u32
        };
        let pick = if depth >= 3 { next() % 5 } else { next() % 7 };
        match pick {
            0 => Value::Null,
            1 => json!(next() % 2 == 0),
            2 => json!(next() as i64 - (1 << 31)),
            3 => json!((next() % 100_000) as f64 / 64.0 - 700.0),
            4 => {
                let chars = ['a', 'Z', ' ', '"', '\\', '\n', 'é', '€', '\u{1}'];
                let n = next() % 6;
                json!((0..n)
                    .map(|_| chars[(next() % 9) as usize])
                    .collect::<String>())
            }
            5 => Value::Array(
                (0..next() % 4)
                    .map(|_| random_value(seed, depth + 1))
                    .collect(),
            ),
            _ => {
                let mut m = serde_json::Map::new();
                for i in 0..next() % 4 {
                    m.insert(format!("k{i}"), random_value(seed, depth + 1));
                }
                Value::Object(m)
            }
        }
    }

    /// Against serde_json as the reference: every serialized object is accepted (and
    /// only complete at its end), and whatever the machine accepts after a random byte
    /// edit still parses.
    #[test]
    fn json_object_agrees_with_serde_json_on_random_documents() {
        let f = Format::json_object();
        let mut seed = 7u64;
        for case in 0..400 {
            let mut m = serde_json::Map::new();
            m.insert("v".into(), random_value(&mut seed, 0));
            let doc = Value::Object(m).to_string();
            let b = doc.as_bytes();
            let mut mach = f.start();
            for (i, &c) in b.iter().enumerate() {
                assert!(!mach.is_complete(), "{doc}: complete early at {i}");
                assert!(mach.push(&[c]), "case {case}: {doc} refused at byte {i}");
            }
            assert!(mach.is_complete(), "{doc}");
            for k in 0..8u64 {
                let mut e = b.to_vec();
                let at = ((seed >> 7) as usize + k as usize * 13) % e.len();
                let bytes = b"{}[],:\" 0123456789.-eE+tfnul\\x";
                e[at] = bytes[((seed >> 17) as usize + k as usize) % bytes.len()];
                seed = seed.wrapping_mul(31).wrapping_add(k);
                let mut mach = f.start();
                if mach.push(&e) && mach.is_complete() {
                    let parsed: Result<Value, _> = serde_json::from_slice(&e);
                    assert!(
                        parsed.is_ok_and(|v| v.is_object()),
                        "accepted an invalid document: {}",
                        String::from_utf8_lossy(&e)
                    );
                }
            }
        }
    }

    #[test]
    fn unsupported_schemas_are_refused_by_keyword() {
        for (s, want) in [
            (json!({"type": "string", "pattern": "a+"}), "'pattern'"),
            (json!({"anyOf": []}), "'anyOf'"),
            (json!({"type": ["string", "null"]}), "one type name"),
            (
                json!({"type": "object", "properties": {"a": {"type": "int"}}}),
                "'int'",
            ),
            (
                json!({"type": "object", "required": ["x"], "additionalProperties": false}),
                "required",
            ),
            (json!({"type": "string", "minItems": 1}), "'minItems'"),
            (json!({"minLength": 1, "items": {}}), "give a \"type\""),
            (json!({"type": "integer", "enum": ["abc"]}), "enum"),
            (json!({"enum": ["ab"], "maxLength": 1}), "enum"),
            (
                json!({"type": "string", "minLength": 5, "maxLength": 1}),
                "minLength",
            ),
            (
                json!({"type": "array", "minItems": 2, "maxItems": 1}),
                "minItems",
            ),
            (json!({"type": "object", "required": "x"}), "required"),
            (json!({"type": "array", "items": [{}]}), "items"),
            (
                json!({"type": "object", "additionalProperties": 1}),
                "additionalProperties",
            ),
            (json!({"enum": [1, 2]}), "only string"),
        ] {
            let e = Format::json_schema(&s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
        assert!(Format::from_response_format(&json!({"type": "text"}))
            .unwrap()
            .is_none());
        assert!(Format::from_response_format(&json!({"type": "xml"})).is_err());
    }

    /// A small vocabulary: every single byte (so every document is reachable) and
    /// multi-byte pieces of JSON, words, UTF-8 (whole and split) and escapes.
    fn vocab() -> Vec<Option<Vec<u8>>> {
        let mut v: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        for p in [
            "{\"",
            "\":",
            "\": \"",
            "\", \"",
            "\"}",
            "\"]",
            "[\"",
            "[1",
            "],",
            "]}",
            "}}",
            "},",
            " \"",
            "\n  ",
            "   ",
            "    ",
            "true",
            "false",
            "null",
            "12",
            "0.5",
            "-3",
            "e+",
            "1e",
            "name",
            " age",
            "abc",
            "hello world",
            "\\u00",
            "\\n",
            "\\\"",
            "é",
            "€",
            "ab\"",
            "a\"}",
            "x\",\"y",
            "\":1}",
            "\":[",
            "\":{\"",
            "\"a\"",
            ", ",
            "0",
            "00",
            "9999999999",
        ] {
            v.push(Some(p.as_bytes().to_vec()));
        }
        v.push(Some(vec![0xe2, 0x82])); // a split euro sign
        v.push(Some(vec![0x82, 0xac, b'a']));
        v.push(Some(vec![0xff, b'a'])); // never valid
        v.push(None); // a control token
        v.push(None); // end of generation
        v
    }

    fn index() -> (TokenIndex, Vec<Option<Vec<u8>>>, u32) {
        let v = vocab();
        let eog = v.len() as u32 - 1;
        (TokenIndex::new(&v, |t| t == eog), v, eog)
    }

    fn bit(m: &[u64], t: usize) -> bool {
        m[t / 64] >> (t % 64) & 1 == 1
    }

    fn next(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    /// Random walks over masks: the mask is exactly the set of tokens `accepts` allows
    /// (plus end of generation when the output may end), it is never empty before the
    /// value is complete, the work stays within the trie bound, and every finished
    /// output parses and validates against the schema.
    fn walk_schema(schema: &Value, walks: usize, seed: &mut u64) {
        let (idx, v, eog) = index();
        let f = Format::json_schema(schema).unwrap_or_else(|e| panic!("{schema}: {e}"));
        let mut out = Vec::new();
        for _ in 0..walks {
            let mut m = f.start();
            let mut text = Vec::new();
            for _step in 0..200 {
                let fed = m.mask(&idx, true, &mut out);
                assert!(fed <= idx.cost_bound(), "{fed} > {}", idx.cost_bound());
                let mut allowed = Vec::new();
                for (t, p) in v.iter().enumerate() {
                    let want = if t as u32 == eog {
                        m.can_end()
                    } else {
                        p.as_deref().is_some_and(|p| m.accepts(p))
                    };
                    assert_eq!(
                        bit(&out, t),
                        want,
                        "{schema}: token {t} {p:?} after {:?}",
                        String::from_utf8_lossy(&text)
                    );
                    if want {
                        allowed.push(t);
                    }
                }
                assert!(
                    !allowed.is_empty(),
                    "{schema}: dead end after {:?}",
                    String::from_utf8_lossy(&text)
                );
                // Prefer closing tokens now and then so walks finish.
                let pick = allowed[next(seed) as usize % allowed.len()];
                if pick as u32 == eog {
                    break;
                }
                let p = v[pick].as_deref().unwrap();
                assert!(m.push(p));
                text.extend_from_slice(p);
                if m.is_complete() {
                    break;
                }
            }
            if m.is_complete() || m.can_end() {
                let doc: Value = serde_json::from_slice(&text).unwrap_or_else(|e| {
                    panic!("{schema}: {:?}: {e}", String::from_utf8_lossy(&text))
                });
                validate(schema, &doc).unwrap_or_else(|e| panic!("{schema}: {e}"));
            }
        }
    }

    #[test]
    fn masks_are_exact_and_finished_outputs_validate() {
        let mut seed = 11;
        for schema in [
            json!({"type": "object"}),
            json!({"type": "array"}),
            json!({"type": "string", "minLength": 2, "maxLength": 4}),
            json!({"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}}),
            json!({"type": "object", "additionalProperties": {"type": "array", "maxItems": 2}}),
            json!({"type": "object", "additionalProperties": false}),
            json!({"properties": {"name": {"type": "string", "maxLength": 3},
                   "tags": {"type": "array", "items": {"enum": ["a", "abc"]}, "minItems": 1}},
                   "required": ["tags"]}),
            json!({"type": "number"}),
            json!({}),
        ] {
            walk_schema(&schema, 40, &mut seed);
        }
    }

    #[test]
    fn keywords_are_enforced() {
        let f = |s: Value| Format::json_schema(&s).unwrap();
        // `required` without properties: the key must appear before the object closes.
        let r = f(json!({"type": "object", "required": ["k"]}));
        assert!(!prefix_ok(&r, "{}"));
        assert!(ok(&r, r#"{"k": [1]}"#));
        // Object keywords without `type` make an object.
        let o = f(json!({"properties": {"a": {"type": "integer"}}, "required": ["a"]}));
        assert!(!prefix_ok(&o, "1"));
        assert!(ok(&o, r#"{"a": 5}"#));
        // additionalProperties false: nothing but {}; a schema: every value follows it.
        let none = f(json!({"type": "object", "additionalProperties": false}));
        assert!(ok(&none, "{}"));
        assert!(!prefix_ok(&none, "{\""));
        let ints = f(json!({"type": "object", "additionalProperties": {"type": "integer"}}));
        assert!(ok(&ints, r#"{"x": 1, "y": -2}"#));
        assert!(!prefix_ok(&ints, r#"{"x": "s"#));
        // enum with lengths keeps the values that fit.
        let e = f(json!({"enum": ["a", "abc", "abcdef"], "maxLength": 3}));
        assert!(ok(&e, "\"abc\""));
        assert!(!prefix_ok(&e, "\"abcd"));
        // Nesting is bounded: free arrays cannot open a 33rd level.
        let any = f(json!({}));
        let deep = "[".repeat(MAX_DEPTH as usize);
        assert!(prefix_ok(&any, &deep));
        assert!(!prefix_ok(&any, &format!("{deep}[")));
        let mut nested = json!({"type": "array"});
        for _ in 0..MAX_DEPTH {
            nested = json!({"type": "array", "items": nested});
        }
        assert!(Format::json_schema(&nested).unwrap_err().contains("nest"));
    }

    /// The work of one mask is bounded by the trie whatever the state: strings walk only
    /// the tokens that are not plain content.
    #[test]
    fn mask_work_is_bounded_by_the_trie() {
        let (idx, _, _) = index();
        let f =
            Format::json_schema(&json!({"type": "array", "items": {"type": "string"}})).unwrap();
        let mut m = f.start();
        assert!(m.push(b"[\"some text"));
        let mut out = Vec::new();
        let fed = m.mask(&idx, true, &mut out);
        assert!(
            fed <= idx.special_nodes(),
            "{fed} > {}",
            idx.special_nodes()
        );
        assert!(idx.special_nodes() < idx.cost_bound());
        assert!(bit(&out, b'a' as usize) && bit(&out, b'"' as usize) && !bit(&out, 0x01));
    }
}
