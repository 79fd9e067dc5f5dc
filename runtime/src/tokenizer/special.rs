//! Splitting text at special tokens written in it, as llama.cpp's
//! `tokenizer_st_partition`: the special tokens are tried longest first, and every
//! occurrence of one that lies entirely in text not yet taken becomes that token.

use std::collections::BTreeMap;
use std::ops::Range;

/// A piece of the input: plain text to tokenize, or a special token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// One special token as the partitioner sees it.
#[derive(Clone, Debug)]
pub(crate) struct SpecialToken {
    pub id: u32,
    /// Only matched when special tokens are parsed (control and unknown tokens);
    /// user-defined tokens are always matched.
    pub parse_only: bool,
    /// Whitespace before the token is dropped.
    pub lstrip: bool,
    /// Whitespace after the token is dropped.
    pub rstrip: bool,
}

#[derive(Clone, Debug, Default)]
struct Node {
    /// Sorted by byte.
    children: Vec<(u8, u32)>,
    /// Index into `SpecialMatcher::tokens` of the token ending here.
    token: Option<u32>,
}

/// All special tokens, in a byte trie for finding their occurrences.
#[derive(Clone, Debug)]
pub(crate) struct SpecialMatcher {
    /// In priority order (longest text first, then lowest id).
    tokens: Vec<SpecialToken>,
    nodes: Vec<Node>,
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl SpecialMatcher {
    /// `tokens` are `(text, token)`; texts must be non-empty.
    pub fn new(mut tokens: Vec<(&str, SpecialToken)>) -> SpecialMatcher {
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.id.cmp(&b.1.id)));
        let mut nodes = vec![Node::default()];
        for (i, (text, _)) in tokens.iter().enumerate() {
            let mut cur = 0usize;
            for &b in text.as_bytes() {
                let pos = nodes[cur].children.binary_search_by_key(&b, |c| c.0);
                cur = match pos {
                    Ok(p) => nodes[cur].children[p].1 as usize,
                    Err(p) => {
                        let n = nodes.len();
                        nodes.push(Node::default());
                        nodes[cur].children.insert(p, (b, n as u32));
                        n
                    }
                };
            }
            // Texts are unique keys of the vocabulary, so no slot is taken twice.
            nodes[cur].token.get_or_insert(i as u32);
        }
        SpecialMatcher {
            tokens: tokens.into_iter().map(|t| t.1).collect(),
            nodes,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Splits `text` into fragments. `parse_special` also recognises control and
    /// unknown tokens.
    pub fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        // Every occurrence: (priority, start, end).
        let mut occ: Vec<(u32, usize, usize)> = Vec::new();
        if !self.is_empty() {
            for start in 0..bytes.len() {
                let mut cur = 0usize;
                for (k, &b) in bytes[start..].iter().enumerate() {
                    let node = &self.nodes[cur];
                    match node.children.binary_search_by_key(&b, |c| c.0) {
                        Ok(p) => cur = node.children[p].1 as usize,
                        Err(_) => break,
                    }
                    if let Some(t) = self.nodes[cur].token {
                        if parse_special || !self.tokens[t as usize].parse_only {
                            occ.push((t, start, start + k + 1));
                        }
                    }
                }
            }
        }
        if occ.is_empty() {
            return vec![Fragment::Text(0..bytes.len())];
        }
        occ.sort_unstable();
        // Taken ranges: start -> (end, token or None for stripped whitespace).
        let mut taken: BTreeMap<usize, (usize, Option<u32>)> = BTreeMap::new();
        for (t, start, end) in occ {
            // The free region around the occurrence: from the end of the taken range
            // before it to the start of the one after it.
            let before = taken.range(..end).next_back().map(|(_, v)| v.0);
            if before.is_some_and(|e| e > start) {
                continue; // overlaps text already taken
            }
            let left = before.unwrap_or(0);
            let right = taken.range(end..).next().map_or(bytes.len(), |(&s, _)| s);
            let tok = &self.tokens[t as usize];
            if tok.lstrip {
                let mut s = start;
                while s > left && is_c_space(bytes[s - 1]) {
                    s -= 1;
                }
                if s < start {
                    taken.insert(s, (start, None));
                }
            }
            if tok.rstrip {
                let mut e = end;
                while e < right && is_c_space(bytes[e]) {
                    e += 1;
                }
                if e > end {
                    taken.insert(end, (e, None));
                }
            }
            taken.insert(start, (end, Some(tok.id)));
        }
        let mut out = Vec::with_capacity(taken.len() * 2 + 1);
        let mut pos = 0;
        for (start, (end, tok)) in taken {
            if start > pos {
                out.push(Fragment::Text(pos..start));
            }
            if let Some(id) = tok {
                out.push(Fragment::Token(id));
            }
            pos = end;
        }
        if pos < bytes.len() {
            out.push(Fragment::Text(pos..bytes.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u32, parse_only: bool) -> SpecialToken {
        SpecialToken {
            id,
            parse_only,
            lstrip: false,
            rstrip: false,
        }
    }

    #[test]
    fn partitions_longest_first() {
        let m = SpecialMatcher::new(vec![
            ("<|im_start|>", tok(1, true)),
            ("<|im_end|>", tok(2, true)),
            ("ab", tok(3, false)),
            ("bcd", tok(4, false)),
        ]);
        let text = "<|im_start|>user\nhi<|im_end|>";
        assert_eq!(
            m.partition(text, true),
            [
                Fragment::Token(1),
                Fragment::Text(12..19),
                Fragment::Token(2)
            ]
        );
        // Control tokens are plain text without parse_special.
        assert_eq!(m.partition(text, false), [Fragment::Text(0..text.len())]);
        // "bcd" is longer, so it wins over the leftmost "ab".
        assert_eq!(
            m.partition("abcd ab", false),
            [
                Fragment::Text(0..1),
                Fragment::Token(4),
                Fragment::Text(4..5),
                Fragment::Token(3)
            ]
        );
        assert_eq!(m.partition("", true), []);
    }

    #[test]
    fn strips_whitespace() {
        let m = SpecialMatcher::new(vec![(
            "<mask>",
            SpecialToken {
                id: 7,
                parse_only: false,
                lstrip: true,
                rstrip: true,
            },
        )]);
        assert_eq!(
            m.partition("a  <mask>  b", true),
            [
                Fragment::Text(0..1),
                Fragment::Token(7),
                Fragment::Text(11..12)
            ]
        );
        assert_eq!(m.partition("  <mask>", true), [Fragment::Token(7)]);
    }
}
