//! Constrained decoding for `response_format`: `json_object` (any JSON object) and
//! `json_schema` (a subset of JSON Schema). A byte-level pushdown automaton follows the
//! output; a token is allowed when all its bytes keep the output a prefix of some valid
//! document, so the finished output always parses and validates. Generation ends as soon
//! as the top-level value is complete.
//!
//! Schema keywords understood: `type` (object, array, string, integer, number, boolean,
//! null), `properties`, `required`, `additionalProperties`, `items`, `minItems`,
//! `maxItems`, `enum` (strings), `minLength`, `maxLength`, plus the annotations `title`,
//! `description`, `$schema`, `$comment`, `examples`, `default`. Anything else is refused
//! with a 400 naming the keyword, never silently ignored. An object with `properties`
//! produces only those keys (each at most once), all `required` ones before it closes.
//! Runs of more than three whitespace bytes and numbers longer than 20 bytes are refused
//! so a model cannot stall in formatting or digits; exponents have at most two digits so
//! every number fits an f64 (parsers differ on out-of-range numbers).

use std::sync::Arc;

use serde_json::Value;

const MAX_WS_RUN: u8 = 3;
/// The longest number written, in bytes (a model cannot stall in digits).
const MAX_NUM_BYTES: u8 = 20;
const MAX_PROPS: usize = 64;
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
    /// A free object: any keys, any values.
    AnyObject,
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
            nodes: Arc::new(vec![Node::Any, Node::AnyObject]),
            root: 1,
        }
    }

    /// A format from a JSON Schema document.
    pub fn json_schema(schema: &Value) -> Result<Format, String> {
        let mut nodes = vec![Node::Any];
        let root = parse_node(schema, &mut nodes, "schema")?;
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
            st: State {
                stack: vec![Frame::Value(self.root)],
                ws_run: 0,
                done: false,
            },
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

fn parse_node(v: &Value, nodes: &mut Vec<Node>, at: &str) -> Result<u32, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{at}: a schema must be an object"))?;
    let known = |k: &str| {
        ANNOTATIONS.contains(&k)
            || matches!(
                k,
                "type"
                    | "properties"
                    | "required"
                    | "additionalProperties"
                    | "items"
                    | "minItems"
                    | "maxItems"
                    | "enum"
                    | "minLength"
                    | "maxLength"
            )
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
    let idx = nodes.len() as u32;
    nodes.push(Node::Any); // placeholder, children follow
    let ty = match obj.get("type") {
        None => None,
        Some(Value::String(t)) => Some(t.as_str()),
        Some(_) => {
            return Err(format!(
                "{at}.type must be one type name (lists are not supported)"
            ))
        }
    };
    let node = if let Some(e) = obj.get("enum") {
        let vals = e
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("{at}.enum must be a non-empty array"))?;
        let strs: Option<Vec<Vec<u8>>> = vals
            .iter()
            .map(|x| x.as_str().map(|s| s.as_bytes().to_vec()))
            .collect();
        let strs = strs.ok_or_else(|| format!("{at}.enum: only string values are supported"))?;
        if strs.len() > MAX_PROPS {
            return Err(format!("{at}.enum: at most {MAX_PROPS} values"));
        }
        if strs
            .iter()
            .any(|s| s.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20))
        {
            return Err(format!(
                "{at}.enum: values needing JSON escapes are not supported"
            ));
        }
        Node::String {
            enumv: Some(strs),
            min_len: 0,
            max_len: None,
        }
    } else {
        match ty {
            None => Node::Any,
            Some("object") => match obj.get("properties") {
                None => Node::AnyObject,
                Some(p) => {
                    let p = p
                        .as_object()
                        .ok_or_else(|| format!("{at}.properties must be an object"))?;
                    if p.len() > MAX_PROPS {
                        return Err(format!("{at}: at most {MAX_PROPS} properties"));
                    }
                    let mut props = Vec::new();
                    for (name, sub) in p {
                        if name.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
                            return Err(format!(
                                "{at}: property names needing escapes are not supported"
                            ));
                        }
                        let child = parse_node(sub, nodes, &format!("{at}.properties.{name}"))?;
                        props.push((name.as_bytes().to_vec(), child));
                    }
                    let mut required = 0u64;
                    for r in obj
                        .get("required")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        let r = r
                            .as_str()
                            .ok_or_else(|| format!("{at}.required must list names"))?;
                        let i = props
                            .iter()
                            .position(|(n, _)| n == r.as_bytes())
                            .ok_or_else(|| {
                                format!("{at}.required names '{r}', which is not a property")
                            })?;
                        required |= 1 << i;
                    }
                    Node::Object { props, required }
                }
            },
            Some("array") => {
                let items = match obj.get("items") {
                    Some(i) => parse_node(i, nodes, &format!("{at}.items"))?,
                    None => {
                        nodes.push(Node::Any);
                        nodes.len() as u32 - 1
                    }
                };
                let min = u32_of("minItems")?.unwrap_or(0);
                let max = u32_of("maxItems")?;
                if max.is_some_and(|m| m < min) {
                    return Err(format!("{at}: maxItems < minItems"));
                }
                Node::Array { items, min, max }
            }
            Some("string") => Node::String {
                enumv: None,
                min_len: u32_of("minLength")?.unwrap_or(0),
                max_len: u32_of("maxLength")?,
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
}

/// The automaton's state; the schema nodes are passed in, never copied.
#[derive(Clone, Debug)]
struct State {
    stack: Vec<Frame>,
    ws_run: u8,
    done: bool,
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
    fn ws(&mut self, b: u8) -> bool {
        self.ws_run += 1;
        let _ = b;
        self.ws_run <= MAX_WS_RUN
    }

    /// A value has ended: tell the frame below.
    fn value_done(&mut self) {
        match self.stack.last_mut() {
            None => self.done = true,
            Some(Frame::Obj { phase, .. }) => *phase = ObjPhase::Next,
            Some(Frame::Arr { count, phase, .. }) => {
                *count += 1;
                *phase = ArrPhase::Next;
            }
            Some(_) => unreachable!("only containers hold values"),
        }
    }

    /// Starts a value of node `n` with byte `b`.
    fn start_value(&mut self, nodes: &[Node], n: u32, b: u8) -> bool {
        if is_ws(b) {
            self.stack.push(Frame::Value(n));
            return self.ws(b);
        }
        self.ws_run = 0;
        let node = &nodes[n as usize];
        let any = matches!(node, Node::Any);
        match b {
            b'{' if any || matches!(node, Node::AnyObject | Node::Object { .. }) => {
                let free = any || matches!(node, Node::AnyObject);
                self.stack.push(Frame::Obj {
                    n: if free { FREE } else { n },
                    seen: 0,
                    cur: 0,
                    phase: ObjPhase::Open,
                });
                true
            }
            b'[' if any || matches!(node, Node::Array { .. }) => {
                self.stack.push(Frame::Arr {
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
                self.stack.push(Frame::Str {
                    n: if any { FREE } else { n },
                    len: 0,
                    esc: 0,
                    cand,
                });
                true
            }
            b'-' | b'0'..=b'9' if any || matches!(node, Node::Integer | Node::Number) => {
                self.stack.push(Frame::Num {
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
                self.stack.push(Frame::Lit {
                    word: if b == b't' { 0 } else { 1 },
                    pos: 1,
                });
                true
            }
            b'n' if any || matches!(node, Node::Null) => {
                self.stack.push(Frame::Lit { word: 2, pos: 1 });
                true
            }
            _ => false,
        }
    }

    fn feed(&mut self, nodes: &[Node], b: u8) -> bool {
        if self.done {
            return false;
        }
        let Some(top) = self.stack.pop() else {
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
                    self.stack.push(Frame::Lit { word, pos: pos + 1 });
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
        let room = len < MAX_NUM_BYTES;
        let next = match (phase, b) {
            _ if !room => None,
            (Minus, b'0') => Some(Zero),
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
            self.stack.push(Frame::Num {
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
            self.stack.push(Frame::Str {
                n,
                len: len + 1,
                esc: 0,
                cand: c,
            });
            return true;
        }
        match esc {
            0 => match b {
                b'"' => {
                    if len < min_len {
                        return false;
                    }
                    self.value_done();
                    true
                }
                b'\\' => {
                    self.stack.push(Frame::Str {
                        n,
                        len,
                        esc: 1,
                        cand,
                    });
                    true
                }
                0..=0x1f => false,
                _ => {
                    if max_len.is_some_and(|m| len >= m) {
                        return false;
                    }
                    let Some(esc) = utf8_lead(b) else {
                        return false;
                    };
                    self.stack.push(Frame::Str {
                        n,
                        len: len + 1,
                        esc,
                        cand,
                    });
                    true
                }
            },
            k if k >= UTF8 => {
                // Inside a multi-byte character (counted once, at its lead byte).
                let Some(next) = utf8_next(k, b) else {
                    return false;
                };
                self.stack.push(Frame::Str {
                    n,
                    len,
                    esc: next,
                    cand,
                });
                true
            }
            1 => {
                if max_len.is_some_and(|m| len >= m) {
                    return false;
                }
                let next = match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 0,
                    b'u' => 5,
                    _ => return false,
                };
                self.stack.push(Frame::Str {
                    n,
                    len: len + u32::from(next == 0),
                    esc: next,
                    cand,
                });
                true
            }
            k => {
                if !b.is_ascii_hexdigit() {
                    return false;
                }
                let left = k - 1;
                self.stack.push(Frame::Str {
                    n,
                    len: len + u32::from(left == 1),
                    esc: if left == 1 { 0 } else { left },
                    cand,
                });
                true
            }
        }
    }

    fn feed_arr(&mut self, nodes: &[Node], n: u32, count: u32, phase: ArrPhase, b: u8) -> bool {
        let (items, min, max) = match (n != FREE).then(|| &nodes[n as usize]) {
            Some(Node::Array { items, min, max }) => (Some(*items), *min, *max),
            _ => (None, 0, None),
        };
        if is_ws(b) {
            self.stack.push(Frame::Arr { n, count, phase });
            return self.ws(b);
        }
        self.ws_run = 0;
        let item = items.unwrap_or(ANY);
        let can_close = count >= min;
        let can_add = max.is_none_or(|m| count < m);
        match (phase, b) {
            (ArrPhase::Open | ArrPhase::Next, b']') if can_close => {
                self.value_done();
                true
            }
            (ArrPhase::Next, b',') if can_add => {
                self.stack.push(Frame::Arr {
                    n,
                    count,
                    phase: ArrPhase::Comma,
                });
                true
            }
            (ArrPhase::Open | ArrPhase::Comma, _) if can_add => {
                self.stack.push(Frame::Arr {
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
        let props = match (n != FREE).then(|| &nodes[n as usize]) {
            Some(Node::Object { props, required }) => Some((&props[..], *required)),
            _ => None,
        };
        if let ObjPhase::Key { cand, len, esc } = phase {
            return self.feed_key(nodes, n, seen, props.map(|p| p.0), cand, len, esc, b);
        }
        if is_ws(b) {
            self.stack.push(Frame::Obj {
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
                self.value_done();
                true
            }
            (ObjPhase::Next, b',') if unseen != 0 => {
                self.stack.push(Frame::Obj {
                    n,
                    seen,
                    cur,
                    phase: ObjPhase::Comma,
                });
                true
            }
            (ObjPhase::Open | ObjPhase::Comma, b'"') if unseen != 0 => {
                self.stack.push(Frame::Obj {
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
                self.stack.push(Frame::Obj {
                    n,
                    seen,
                    cur,
                    phase: ObjPhase::Next,
                });
                let value = props.map_or(ANY, |(p, _)| p[cur as usize].1);
                self.stack.push(Frame::Value(value));
                true
            }
            _ => false,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn feed_key(
        &mut self,
        nodes: &[Node],
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
            let mut m = State {
                stack: vec![Frame::Str {
                    n: FREE,
                    len,
                    esc,
                    cand: 0,
                }],
                ws_run: 0,
                done: false,
            };
            if !m.feed(nodes, b) {
                return false;
            }
            let phase = match m.stack.last() {
                Some(&Frame::Str { len, esc, .. }) => ObjPhase::Key { cand, len, esc },
                _ => ObjPhase::Colon, // the closing quote
            };
            self.stack.push(Frame::Obj {
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
            self.stack.push(Frame::Obj {
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
        self.stack.push(Frame::Obj {
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
        assert!(prefix_ok(&f, &"9".repeat(20)));
        assert!(!prefix_ok(&f, &"9".repeat(21)));
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
                json!({"type": "object", "properties": {}, "required": ["x"]}),
                "not a property",
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
}
