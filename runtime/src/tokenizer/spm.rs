//! SentencePiece (BPE variant) tokenization, as llama.cpp's `llm_tokenizer_spm`: start
//! from single characters and repeatedly merge the adjacent pair whose concatenation is
//! the highest-scoring token; whatever does not end up as a token is written as bytes.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: u32,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: u32,
    prev: i32,
    next: i32,
}

#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    // Highest score first; among equal scores the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| Reverse(self.left).cmp(&Reverse(other.left)))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What the SPM algorithm needs from the vocabulary.
pub(crate) trait SpmVocab {
    /// Id of the token with exactly this text.
    fn token_id(&self, text: &str) -> Option<u32>;
    fn score(&self, id: u32) -> f32;
    /// The token for a raw byte (`<0xNN>`, else the one-character token), if any.
    fn byte_token(&self, b: u8) -> Option<u32>;
}

/// Scratch space reused across calls.
#[derive(Default)]
pub(crate) struct SpmSession {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl SpmSession {
    /// Tokenizes `text` (spaces already escaped as `▁`) and appends the ids to `out`.
    pub fn encode(&mut self, vocab: &impl SpmVocab, text: &str, out: &mut Vec<u32>) {
        self.symbols.clear();
        self.queue.clear();
        let n_chars = text.chars().count();
        for (i, (start, c)) in text.char_indices().enumerate() {
            self.symbols.push(Symbol {
                start: start as u32,
                len: c.len_utf8() as u32,
                prev: i as i32 - 1,
                next: if i + 1 == n_chars { -1 } else { i as i32 + 1 },
            });
        }
        for i in 1..self.symbols.len() {
            self.try_add_bigram(vocab, text, i as i32 - 1, i as i32);
        }
        while let Some(b) = self.queue.pop() {
            let (l, r) = (
                self.symbols[b.left as usize],
                self.symbols[b.right as usize],
            );
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            let ls = &mut self.symbols[b.left as usize];
            ls.len += r.len;
            ls.next = r.next;
            self.symbols[b.right as usize].len = 0;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = b.left as i32;
            }
            self.try_add_bigram(vocab, text, l.prev, b.left as i32);
            self.try_add_bigram(vocab, text, b.left as i32, r.next);
        }
        if self.symbols.is_empty() {
            return;
        }
        let mut i = 0i32;
        while i >= 0 {
            let s = self.symbols[i as usize];
            let piece = &text[s.start as usize..(s.start + s.len) as usize];
            match vocab.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| vocab.byte_token(b))),
            }
            i = s.next;
        }
    }

    fn try_add_bigram(&mut self, vocab: &impl SpmVocab, text: &str, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let size = l.len + r.len;
        let piece = &text[l.start as usize..(l.start + size) as usize];
        if let Some(id) = vocab.token_id(piece) {
            self.queue.push(Bigram {
                score: vocab.score(id),
                left: left as u32,
                right: right as u32,
                size,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Tiny {
        ids: HashMap<&'static str, u32>,
        scores: Vec<f32>,
    }

    impl Tiny {
        fn new(tokens: &[(&'static str, f32)]) -> Tiny {
            Tiny {
                ids: tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.0, i as u32))
                    .collect(),
                scores: tokens.iter().map(|t| t.1).collect(),
            }
        }
    }

    impl SpmVocab for Tiny {
        fn token_id(&self, text: &str) -> Option<u32> {
            self.ids.get(text).copied()
        }
        fn score(&self, id: u32) -> f32 {
            self.scores[id as usize]
        }
        fn byte_token(&self, b: u8) -> Option<u32> {
            self.token_id(&format!("<0x{b:02X}>"))
        }
    }

    fn encode(v: &Tiny, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        SpmSession::default().encode(v, text, &mut out);
        out
    }

    #[test]
    fn merges_by_score() {
        let v = Tiny::new(&[
            ("<unk>", 0.0),
            ("▁", -1.0),
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -3.0),
            ("bc", -2.0),
            ("▁a", -5.0),
            ("abc", -4.0),
            ("<0xC3>", 0.0),
            ("<0xA9>", 0.0),
        ]);
        // "bc" scores higher than "ab": a + bc, then "abc" from (a, bc).
        assert_eq!(encode(&v, "abc"), [8]);
        // ▁a (-5) vs ab (-3): ab first, then no "▁ab" token.
        assert_eq!(encode(&v, "▁ab"), [1, 5]);
        // Unknown character: byte fallback.
        assert_eq!(encode(&v, "é"), [9, 10]);
        assert_eq!(encode(&v, ""), Vec::<u32>::new());
    }

    #[test]
    fn ties_prefer_leftmost() {
        let v = Tiny::new(&[("a", -1.0), ("aa", -1.0)]);
        assert_eq!(encode(&v, "aaa"), [1, 0]);
    }
}
