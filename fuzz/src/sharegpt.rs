//! The ShareGPT loader on arbitrary bytes (a truncated or hostile dataset file), then
//! vLLM-style sampling of what it kept.

use datasets::sharegpt::{read_pairs, sample, SampleOptions};

/// One input: the body of the `sharegpt` fuzz target (also replayed by `server/tests/fuzz_replay.rs`).
pub fn run(data: &[u8]) {
    let Ok(loaded) = read_pairs(data) else {
        return;
    };
    assert!(
        loaded.pairs.len() <= loaded.total,
        "kept more pairs than entries"
    );
    let mut o = SampleOptions::new(8, data.len() as u64);
    o.min_len = 1;
    let count = |s: &str| s.split_whitespace().count();
    let s = sample(loaded.pairs, &o, &count);
    assert!(s.requests.len() <= 8);
    for r in &s.requests {
        assert!(r.prompt_len >= 1 && r.prompt_len <= o.max_prompt_len);
    }
}
