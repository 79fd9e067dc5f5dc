//! Code point classes for the pre-tokenizers and the GPT-2 byte-level alphabet.
//!
//! The class table ([`super::unicode_data`]) is generated from Unicode 15.1, the same
//! version llama.cpp's tables come from, so that `\p{L}`, `\p{N}`, ... agree with it on
//! every code point.

use super::unicode_data::CLASS_RANGES;

/// General category class of a code point (the first letter of its category, with
/// unassigned code points apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `Cn`: not assigned in Unicode 15.1.
    Unassigned,
    /// `\p{N}`
    Number,
    /// `\p{L}`
    Letter,
    /// `\p{Z}`
    Separator,
    /// `\p{M}`
    Mark,
    /// `\p{P}`
    Punctuation,
    /// `\p{S}`
    Symbol,
    /// `Cc`, `Cf`, `Cs`, `Co`
    Control,
}

impl Class {
    const fn from_code(code: u8) -> Class {
        match code {
            1 => Class::Number,
            2 => Class::Letter,
            3 => Class::Separator,
            4 => Class::Mark,
            5 => Class::Punctuation,
            6 => Class::Symbol,
            7 => Class::Control,
            _ => Class::Unassigned,
        }
    }
}

/// Classes of the ASCII range, looked up without a search.
static ASCII_CLASSES: [Class; 128] = {
    let mut out = [Class::Unassigned; 128];
    let mut i = 0;
    while i < 128 {
        out[i] = class_slow(i as u32);
        i += 1;
    }
    out
};

const fn class_slow(cp: u32) -> Class {
    // Binary search for the last range starting at or before `cp`.
    let (mut lo, mut hi) = (0usize, CLASS_RANGES.len());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if CLASS_RANGES[mid].0 <= cp {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Class::from_code(CLASS_RANGES[lo].1)
}

/// The class of a code point.
#[inline]
pub(crate) fn class_of(c: char) -> Class {
    let cp = c as u32;
    if cp < 128 {
        ASCII_CLASSES[cp as usize]
    } else {
        class_slow(cp)
    }
}

/// Unicode's `White_Space` property (what llama.cpp's `\s` means).
#[inline]
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{09}'..='\u{0D}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// What the pre-tokenizers need to know about one code point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CharInfo {
    pub c: char,
    pub class: Class,
    pub ws: bool,
}

impl CharInfo {
    #[inline]
    pub fn new(c: char) -> CharInfo {
        CharInfo {
            c,
            class: class_of(c),
            ws: is_whitespace(c),
        }
    }
    #[inline]
    pub fn is_letter(&self) -> bool {
        self.class == Class::Letter
    }
    #[inline]
    pub fn is_number(&self) -> bool {
        self.class == Class::Number
    }
}

/// GPT-2's byte-level alphabet: byte `b` is written as this character in BPE vocabularies.
/// Printable Latin-1 bytes stand for themselves; the other 68 are moved to U+0100...
pub(crate) static BYTE_TO_CHAR: [char; 256] = {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        let cp = if printable {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        out[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    out
};

/// Inverse of [`BYTE_TO_CHAR`]: the byte a byte-level character stands for.
#[inline]
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The n-th non-printable byte (in increasing order) maps to U+0100 + n.
            let n = cp - 0x100;
            NON_PRINTABLE_BYTES.get(n as usize).copied()
        }
        _ => None,
    }
}

/// The 68 bytes that GPT-2 moves out of the printable range, in increasing order.
static NON_PRINTABLE_BYTES: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if !printable {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_map_round_trips() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[b as usize];
            assert!(seen.insert(c), "byte {b} maps to a duplicate char");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'\t' as usize], 'ĉ');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(char_to_byte('€'), None);
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn classes() {
        assert_eq!(super::super::unicode_data::UNICODE_VERSION, "15.1.0");
        assert_eq!(class_of('a'), Class::Letter);
        assert_eq!(class_of('7'), Class::Number);
        assert_eq!(class_of('²'), Class::Number);
        assert_eq!(class_of('٣'), Class::Number);
        assert_eq!(class_of('é'), Class::Letter);
        assert_eq!(class_of('中'), Class::Letter);
        assert_eq!(class_of('\u{301}'), Class::Mark);
        assert_eq!(class_of('$'), Class::Symbol);
        assert_eq!(class_of('!'), Class::Punctuation);
        assert_eq!(class_of('😀'), Class::Symbol);
        assert_eq!(class_of('\u{200D}'), Class::Control);
        assert_eq!(class_of(' '), Class::Separator);
        assert_eq!(class_of('\n'), Class::Control);
        assert_eq!(class_of('\u{10D40}'), Class::Unassigned); // Garay: Unicode 16
        assert_eq!(class_of('\u{2EBF0}'), Class::Letter); // CJK ext. I: Unicode 15.1
        assert!(is_whitespace('\u{3000}') && is_whitespace('\n') && !is_whitespace('\u{200B}'));
    }
}
