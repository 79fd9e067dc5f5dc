//! BPE pre-tokenizers: split text into words before the merges run.
//!
//! llama.cpp selects a list of regular expressions by `tokenizer.ggml.pre` and applies them
//! one after the other, each one splitting the pieces the previous one left (matches and
//! the text between matches both become pieces). The common expressions have hand-written
//! matchers in llama.cpp (`unicode.cpp`) whose behaviour differs from a real regex engine
//! in corner cases; the others run through `std::regex` on a "collapsed" copy of the text
//! where every non-ASCII code point is replaced by a marker for its class. This module
//! reimplements exactly the expressions used by the supported pre-tokenizers, with the
//! same semantics, so no regex engine is needed.

use super::unicode::{CharInfo, Class};

/// One step of a pre-tokenizer: a regular expression of llama.cpp's lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// Like [`Split::Llama3`] with `\p{N}` instead of `\p{N}{1,3}`.
    Qwen2,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// `\p{N}`: every digit on its own.
    EachDigit,
    /// `\p{N}+`
    DigitRuns,
    /// `[0-9][0-9][0-9]`
    AsciiDigitTriples,
    /// `[\p{P}\$\+<=>\^~\|]+`, with `` ` `` too when the flag is set (falcon).
    PunctRuns { backtick: bool },
}

/// A pre-tokenizer configuration: the splits and the flags llama.cpp attaches to the
/// `tokenizer.ggml.pre` name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PreConfig {
    pub splits: &'static [Split],
    /// Skip the merges for a word that is a token as a whole.
    pub ignore_merges: bool,
    /// Detokenizer clean-up of spaces before punctuation and contractions.
    pub clean_spaces: bool,
    /// Default for `add_bos_token` when the metadata does not say.
    pub add_bos: bool,
    /// The model has no BOS token by default.
    pub no_bos: bool,
}

const DEFAULT: &[Split] = &[
    Split::PunctRuns { backtick: false },
    Split::Gpt2,
    Split::DigitRuns,
    Split::AsciiDigitTriples,
];
const FALCON: &[Split] = &[
    Split::PunctRuns { backtick: true },
    Split::Gpt2,
    Split::AsciiDigitTriples,
];
const GPT2: &[Split] = &[Split::Gpt2];
const STARCODER: &[Split] = &[Split::EachDigit, Split::Gpt2];
const LLAMA3: &[Split] = &[Split::Llama3];
const QWEN2: &[Split] = &[Split::Qwen2];
const LAGUNA: &[Split] = &[Split::Newlines, Split::Qwen2];

impl PreConfig {
    /// The configuration for a `tokenizer.ggml.pre` value (`None` or `""`: the default
    /// pre-tokenizer, as llama.cpp falls back to). `None` when the name is not supported.
    pub fn from_name(name: Option<&str>) -> Option<PreConfig> {
        let cfg = |splits, clean_spaces| PreConfig {
            splits,
            ignore_merges: false,
            clean_spaces,
            add_bos: false,
            no_bos: false,
        };
        let name = name.unwrap_or("");
        Some(match name {
            "" | "default" => cfg(DEFAULT, true),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => PreConfig {
                ignore_merges: true,
                add_bos: true,
                ..cfg(LLAMA3, true)
            },
            "dbrx" | "smaug-bpe" => cfg(LLAMA3, true),
            "chatglm-bpe" => PreConfig {
                no_bos: true,
                ..cfg(LLAMA3, true)
            },
            "glm4" | "glm5" => PreConfig {
                no_bos: true,
                ignore_merges: true,
                ..cfg(LLAMA3, true)
            },
            "falcon" => cfg(FALCON, true),
            "mpt" | "olmo" | "jais" | "exaone4" | "gpt-2" | "phi-2" | "jina-es" | "jina-de"
            | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert"
            | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => cfg(GPT2, true),
            "trillion" | "granite-docling" => cfg(GPT2, false),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                cfg(STARCODER, true)
            }
            "smollm" | "command-r" => cfg(STARCODER, false),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
            | "grok-2" => cfg(QWEN2, false),
            "megrez" | "stablelm2" => cfg(QWEN2, true),
            "laguna" => cfg(LAGUNA, false),
            _ => return None,
        })
    }
}

/// Splits `text` into words (byte ranges of `text`, in order, covering it).
pub(crate) fn split_words(
    text: &str,
    splits: &[Split],
    chars: &mut Vec<CharInfo>,
    out: &mut Vec<std::ops::Range<usize>>,
) {
    out.clear();
    chars.clear();
    chars.extend(text.chars().map(CharInfo::new));
    if chars.is_empty() {
        return;
    }
    // Piece lengths in code points.
    let mut lens = vec![chars.len()];
    let mut next = Vec::with_capacity(chars.len() / 2 + 1);
    for &split in splits {
        next.clear();
        let mut start = 0;
        for &len in &lens {
            let seg = &chars[start..start + len];
            match split {
                Split::Gpt2 => split_gpt2(seg, &mut next),
                Split::Llama3 => split_llama3(seg, false, &mut next),
                Split::Qwen2 => split_llama3(seg, true, &mut next),
                Split::Newlines => split_newlines(seg, &mut next),
                Split::EachDigit => isolate(seg, &mut next, |s| {
                    usize::from(s.first().is_some_and(is_collapsed_digit))
                }),
                Split::DigitRuns => isolate(seg, &mut next, |s| {
                    s.iter().take_while(|c| is_collapsed_digit(c)).count()
                }),
                Split::AsciiDigitTriples => isolate(seg, &mut next, |s| {
                    if s.len() >= 3 && s[..3].iter().all(|c| c.c.is_ascii_digit()) {
                        3
                    } else {
                        0
                    }
                }),
                Split::PunctRuns { backtick } => isolate(seg, &mut next, |s| {
                    s.iter()
                        .take_while(|c| is_collapsed_punct(c, backtick))
                        .count()
                }),
            }
            start += len;
        }
        std::mem::swap(&mut lens, &mut next);
    }
    let mut byte = 0;
    let mut cp = 0;
    for len in lens {
        let n: usize = chars[cp..cp + len].iter().map(|c| c.c.len_utf8()).sum();
        out.push(byte..byte + n);
        byte += n;
        cp += len;
    }
}

/// `\p{N}` as llama.cpp's collapsed `std::regex` sees it: ASCII digits, or a non-ASCII,
/// non-space number.
fn is_collapsed_digit(c: &CharInfo) -> bool {
    if c.c.is_ascii() {
        c.c.is_ascii_digit()
    } else {
        !c.ws && c.class == Class::Number
    }
}

/// `[\p{P}\$\+<=>\^~\|]` (and `` ` ``) on collapsed text.
fn is_collapsed_punct(c: &CharInfo, backtick: bool) -> bool {
    if c.c.is_ascii() {
        c.class == Class::Punctuation
            || matches!(c.c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
            || (backtick && c.c == '`')
    } else {
        !c.ws && c.class == Class::Punctuation
    }
}

/// Splits `seg` into the leftmost-first, non-overlapping matches of a pattern and the
/// text between them. `match_len(rest)` is the length of the match at the start of
/// `rest` (0 for none).
fn isolate(seg: &[CharInfo], out: &mut Vec<usize>, match_len: impl Fn(&[CharInfo]) -> usize) {
    let mut gap_start = 0;
    let mut pos = 0;
    while pos < seg.len() {
        let n = match_len(&seg[pos..]);
        if n == 0 {
            pos += 1;
            continue;
        }
        if pos > gap_start {
            out.push(pos - gap_start);
        }
        out.push(n);
        pos += n;
        gap_start = pos;
    }
    if seg.len() > gap_start {
        out.push(seg.len() - gap_start);
    }
}

/// `[^\n]+|[\n]+`
fn split_newlines(seg: &[CharInfo], out: &mut Vec<usize>) {
    let mut pos = 0;
    while pos < seg.len() {
        let nl = seg[pos].c == '\n';
        let run = seg[pos..]
            .iter()
            .take_while(|c| (c.c == '\n') == nl)
            .count();
        out.push(run);
        pos += run;
    }
}

/// Cursor over one piece with llama.cpp's conventions: positions past the end read as
/// "no character" (no class, not a space).
struct Cursor<'a> {
    seg: &'a [CharInfo],
    /// End of the last emitted word.
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Cursor<'_> {
    fn at(&self, pos: usize) -> Option<&CharInfo> {
        self.seg.get(pos)
    }
    fn ch(&self, pos: usize) -> Option<char> {
        self.at(pos).map(|c| c.c)
    }
    fn is_letter(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(CharInfo::is_letter)
    }
    fn is_number(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(CharInfo::is_number)
    }
    fn is_ws(&self, pos: usize) -> bool {
        self.at(pos).is_some_and(|c| c.ws)
    }
    /// `[^\s\p{L}\p{N}]` for a character that exists.
    fn is_other(&self, pos: usize) -> bool {
        self.at(pos)
            .is_some_and(|c| !c.ws && !c.is_letter() && !c.is_number())
    }
    /// Emits the word that ends at `end`.
    fn emit(&mut self, end: usize) {
        if end > self.prev_end {
            self.out.push(end - self.prev_end);
        }
        self.prev_end = end;
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `pos`, optionally case-insensitive: the match length.
    fn contraction(&self, pos: usize, ignore_case: bool) -> usize {
        if self.ch(pos) != Some('\'') || pos + 1 >= self.seg.len() {
            return 0;
        }
        let lower = |c: Option<char>| {
            c.map(|c| {
                if ignore_case {
                    c.to_ascii_lowercase()
                } else {
                    c
                }
            })
        };
        let c1 = lower(self.ch(pos + 1));
        if matches!(c1, Some('s' | 't' | 'm' | 'd')) {
            return 2;
        }
        if pos + 2 < self.seg.len() {
            let c2 = lower(self.ch(pos + 2));
            if matches!(
                (c1, c2),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return 3;
            }
        }
        0
    }

    /// Length of the whitespace run at `pos`, and the end of its last `\r`/`\n` (if any).
    fn whitespace_run(&self, pos: usize) -> (usize, Option<usize>) {
        let mut n = 0;
        let mut last_nl = None;
        while self.is_ws(pos + n) {
            if matches!(self.ch(pos + n), Some('\r' | '\n')) {
                last_nl = Some(pos + n + 1);
            }
            n += 1;
        }
        (n, last_nl)
    }

    /// `\s+(?!\S)|\s+` at `pos` given the run length; returns the new position, or `None`
    /// when there is no whitespace.
    fn trailing_whitespace(&self, pos: usize, n: usize) -> Option<usize> {
        if n > 1 && pos + n < self.seg.len() {
            // Leave the last space to the word that follows.
            Some(pos + n - 1)
        } else if n > 0 {
            Some(pos + n)
        } else {
            None
        }
    }
}

/// GPT-2's expression, as llama.cpp's hand-written matcher runs it.
fn split_gpt2(seg: &[CharInfo], out: &mut Vec<usize>) {
    let mut cur = Cursor {
        seg,
        prev_end: 0,
        out,
    };
    let mut pos = 0;
    while pos < seg.len() {
        let n = cur.contraction(pos, false);
        if n > 0 {
            pos += n;
            cur.emit(pos);
            continue;
        }
        let space = seg[pos].c == ' ';
        // The class that decides: the next character's after an optional space.
        let p2 = pos + usize::from(space);
        if cur.is_letter(p2) {
            pos = p2;
            while cur.is_letter(pos) {
                pos += 1;
            }
            cur.emit(pos);
            continue;
        }
        if cur.is_number(p2) {
            pos = p2;
            while cur.is_number(pos) {
                pos += 1;
            }
            cur.emit(pos);
            continue;
        }
        if cur.is_other(p2) {
            pos = p2;
            while cur.is_other(pos) {
                pos += 1;
            }
            cur.emit(pos);
            continue;
        }
        let (n, _) = cur.whitespace_run(pos);
        pos = match cur.trailing_whitespace(pos, n) {
            Some(p) => p,
            None => pos + 1,
        };
        cur.emit(pos);
    }
}

/// Llama 3's expression (`qwen2`: single digits), as llama.cpp's hand-written matchers.
fn split_llama3(seg: &[CharInfo], single_digits: bool, out: &mut Vec<usize>) {
    let mut cur = Cursor {
        seg,
        prev_end: 0,
        out,
    };
    let mut pos = 0;
    while pos < seg.len() {
        let n = cur.contraction(pos, true);
        if n > 0 {
            pos += n;
            cur.emit(pos);
            continue;
        }
        let c = seg[pos];
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c.c == '\r' || c.c == '\n' || c.is_number())
            && (c.is_letter() || cur.is_letter(pos + 1))
        {
            pos += 1;
            while cur.is_letter(pos) {
                pos += 1;
            }
            cur.emit(pos);
            continue;
        }
        // \p{N}{1,3} or \p{N}
        if c.is_number() {
            if single_digits {
                pos += 1;
            } else {
                let mut start = pos;
                while cur.is_number(pos) {
                    pos += 1;
                    if pos - start >= 3 {
                        cur.emit(pos);
                        start = pos;
                    }
                }
            }
            cur.emit(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let p2 = pos + usize::from(c.c == ' ');
        let other_or_end =
            |p: usize| !matches!(cur.at(p), Some(x) if x.ws || x.is_letter() || x.is_number());
        if other_or_end(p2) {
            pos = p2;
            while cur.is_other(pos) {
                pos += 1;
            }
            while matches!(cur.ch(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            cur.emit(pos);
            continue;
        }
        let (n, last_nl) = cur.whitespace_run(pos);
        // \s*[\r\n]+
        if let Some(end) = last_nl {
            pos = end;
            cur.emit(pos);
            continue;
        }
        pos = match cur.trailing_whitespace(pos, n) {
            Some(p) => p,
            None => pos + 1,
        };
        cur.emit(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(text: &'a str, splits: &[Split]) -> Vec<&'a str> {
        let mut chars = Vec::new();
        let mut out = Vec::new();
        split_words(text, splits, &mut chars, &mut out);
        out.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("Hello world's  end\n\n x", GPT2),
            ["Hello", " world", "'s", " ", " end", "\n\n", " x"]
        );
        assert_eq!(words("a  ", GPT2), ["a", "  "]);
        assert_eq!(words("I'M 12", GPT2), ["I", "'", "M", " 12"]);
    }

    #[test]
    fn llama3_words() {
        assert_eq!(
            words("I'M 1234567 ok!!\n\nyes  ", LLAMA3),
            ["I", "'M", " ", "123", "456", "7", " ok", "!!\n\n", "yes", "  "]
        );
        assert_eq!(words("a 12", QWEN2), ["a", " ", "1", "2"]);
        assert_eq!(words(" \n\n  x", QWEN2), [" \n\n", " ", " x"]);
    }

    #[test]
    fn starcoder_and_default_words() {
        assert_eq!(words("x 123", STARCODER), ["x", " ", "1", "2", "3"]);
        assert_eq!(
            words("a+=b 12345", DEFAULT),
            ["a", "+=", "b", " ", "123", "45"]
        );
        assert_eq!(words("a\nb\n\n", LAGUNA), ["a", "\n", "b", "\n\n"]);
    }
}
