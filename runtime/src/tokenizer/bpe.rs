//! Byte-level BPE (GPT-2 style), as llama.cpp's `llm_tokenizer_bpe`.
//!
//! Merges are ranked pairs of strings. Rather than comparing strings while merging, every
//! string that takes part in a merge gets a "piece id" once, at load time: its token id
//! when it is a token, otherwise an id past the vocabulary. A merge then maps a pair of
//! piece ids to its rank and the piece id of the merged string.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::unicode::BYTE_TO_CHAR;

/// No piece: a string that neither is a token nor takes part in a merge.
const NO_PIECE: u32 = u32::MAX;

#[derive(Debug)]
pub(crate) struct BpeModel {
    /// `(left piece, right piece)` -> `(rank, merged piece)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Piece id of the byte-level character of each byte.
    byte_piece: [u32; 256],
    /// Token of each single ASCII character (the fallback for a word piece that is not a
    /// token), `NO_PIECE` if none.
    ascii_token: [u32; 128],
    n_vocab: u32,
    /// Skip the merges for a word that is a token as a whole (llama3).
    pub ignore_merges: bool,
}

impl BpeModel {
    /// Builds the merge table. `token_id` maps a token's text to its id.
    pub fn new(
        merges: &[String],
        n_vocab: u32,
        token_id: impl Fn(&str) -> Option<u32>,
        ignore_merges: bool,
    ) -> BpeModel {
        let mut extra: HashMap<String, u32> = HashMap::new();
        let intern = |s: &str, extra: &mut HashMap<String, u32>| -> u32 {
            if let Some(id) = token_id(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.insert(s.to_owned(), id);
            id
        };
        let mut table = HashMap::with_capacity(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte; a line without
            // one is the pair ("", "").
            let space = m.bytes().skip(1).position(|b| b == b' ');
            let (a, b) = match space {
                Some(i) => (&m[..i + 1], &m[i + 2..]),
                None => ("", ""),
            };
            let pa = intern(a, &mut extra);
            let pb = intern(b, &mut extra);
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let pj = intern(&joined, &mut extra);
            // The first occurrence of a pair keeps its rank.
            table.entry((pa, pb)).or_insert((rank as u32, pj));
        }
        let mut byte_piece = [NO_PIECE; 256];
        let mut buf = [0u8; 4];
        for (b, slot) in byte_piece.iter_mut().enumerate() {
            let s = BYTE_TO_CHAR[b].encode_utf8(&mut buf);
            *slot = token_id(s)
                .or_else(|| extra.get(&*s).copied())
                .unwrap_or(NO_PIECE);
        }
        let mut ascii_token = [NO_PIECE; 128];
        for (b, slot) in ascii_token.iter_mut().enumerate() {
            let s = (b as u8 as char).encode_utf8(&mut buf);
            *slot = token_id(s).unwrap_or(NO_PIECE);
        }
        BpeModel {
            merges: table,
            byte_piece,
            ascii_token,
            n_vocab,
            ignore_merges,
        }
    }

    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    /// Byte offset in the word.
    start: u32,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: u32,
    piece: u32,
    prev: i32,
    next: i32,
}

/// Scratch space reused across the words of one `encode` call.
#[derive(Default)]
pub(crate) struct BpeSession {
    symbols: Vec<Symbol>,
    /// `(rank, left, right, size)`, smallest rank (then leftmost) first.
    queue: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
    encoded: String,
}

impl BpeSession {
    /// Tokenizes one pre-tokenized word (raw bytes) and appends the ids to `out`.
    pub fn encode_word(
        &mut self,
        model: &BpeModel,
        word: &[u8],
        token_id: impl Fn(&str) -> Option<u32>,
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if model.ignore_merges {
            self.encoded.clear();
            self.encoded
                .extend(word.iter().map(|&b| BYTE_TO_CHAR[b as usize]));
            if let Some(id) = token_id(&self.encoded) {
                out.push(id);
                return;
            }
        }
        self.symbols.clear();
        self.queue.clear();
        let n = word.len();
        for (i, &b) in word.iter().enumerate() {
            self.symbols.push(Symbol {
                start: i as u32,
                len: 1,
                piece: model.byte_piece[b as usize],
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
            });
        }
        for i in 1..n {
            self.add_bigram(model, i as i32 - 1, i as i32);
        }
        while let Some(Reverse((_, left, right, size))) = self.queue.pop() {
            let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
            // Stale: one side was merged away or has grown since the pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != size {
                continue;
            }
            let (_, merged) = model.merges[&(l.piece, r.piece)];
            let ls = &mut self.symbols[left as usize];
            ls.len += r.len;
            ls.piece = merged;
            ls.next = r.next;
            self.symbols[right as usize].len = 0;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = left as i32;
            }
            self.add_bigram(model, l.prev, left as i32);
            self.add_bigram(model, left as i32, r.next);
        }
        for s in &self.symbols {
            if s.len == 0 {
                continue;
            }
            if s.piece < model.n_vocab {
                out.push(s.piece);
                continue;
            }
            // Not a token: llama.cpp looks up each byte of the byte-level text on its
            // own, which only finds the printable ASCII characters.
            let bytes = &word[s.start as usize..(s.start + s.len) as usize];
            for &b in bytes {
                let c = BYTE_TO_CHAR[b as usize];
                if c.is_ascii() {
                    let id = model.ascii_token[c as usize];
                    if id != NO_PIECE {
                        out.push(id);
                    }
                }
            }
        }
    }

    fn add_bigram(&mut self, model: &BpeModel, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        if l.piece == NO_PIECE || r.piece == NO_PIECE {
            return;
        }
        if let Some(&(rank, _)) = model.merges.get(&(l.piece, r.piece)) {
            self.queue
                .push(Reverse((rank, left as u32, right as u32, l.len + r.len)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_rank() {
        // Vocabulary: the byte-level characters we use plus merged tokens.
        let vocab = ["a", "b", "c", "ab", "bc", "abc", "Ġ", "Ġa"];
        let id = |s: &str| vocab.iter().position(|v| *v == s).map(|i| i as u32);
        let merges: Vec<String> = ["b c", "a b", "a bc", "Ġ a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let model = BpeModel::new(&merges, vocab.len() as u32, id, false);
        let mut s = BpeSession::default();
        let mut out = Vec::new();
        s.encode_word(&model, b"abc", id, &mut out);
        // "b c" (rank 0) first, then "a bc".
        assert_eq!(out, [id("abc").unwrap()]);
        out.clear();
        s.encode_word(&model, b" ab", id, &mut out);
        // " a" has rank 3 but "a b" rank 1 wins: Ġ + ab.
        assert_eq!(out, [id("Ġ").unwrap(), id("ab").unwrap()]);
    }
}
