//! Generated request sets: `sharegpt-synthetic` (a clearly labelled stand-in when the real
//! ShareGPT file is absent), fixed ISL/OSL sets, shared-prefix sets and the serving presets.
//!
//! Prompt text is real English: word runs taken from an embedded public-domain-style corpus
//! (the Apache License 2.0 text in `testdata/`), starting at a seeded offset, trimmed to the
//! target token count with the caller's token counter. No repeated filler.

use rand::{Rng, SeedableRng};

use crate::sharegpt::{check, SampleOptions};
use crate::{Arrival, SampledRequest, Workload};

const CORPUS: &str = include_str!("../../testdata/apache-2.0.txt");

/// Label of the synthetic ShareGPT stand-in; result files carry it so nobody mistakes it for
/// the real data set.
pub const SHAREGPT_SYNTHETIC: &str = "sharegpt-synthetic";

/// The ISL/OSL matrix from BENCHMARKS.md (longer points when the context allows).
pub const ISL_OSL_MATRIX: [(usize, usize); 5] = [
    (128, 128),
    (256, 256),
    (1024, 1024),
    (1024, 128),
    (128, 1024),
];

/// Preset names accepted by [`preset`].
pub const PRESETS: [&str; 5] = [
    "baseline",
    "continuous_batching",
    "paged_attention",
    "chunked_prefill",
    "prefix_caching",
];

fn corpus_words() -> Vec<&'static str> {
    CORPUS.split_whitespace().collect()
}

/// Text of `target` tokens (by `count`; the result has exactly `target` tokens unless a
/// single word boundary makes that impossible, then the closest count at or below, never
/// zero words) from the corpus, starting at word `start`, wrapping around.
pub fn text_of_tokens(target: usize, start: usize, count: &dyn Fn(&str) -> usize) -> String {
    let words = corpus_words();
    let join = |n: usize| -> String {
        let mut s = String::new();
        for i in 0..n {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(words[(start + i) % words.len()]);
        }
        s
    };
    // Grow an upper bound, then binary-search the longest word prefix with <= target tokens.
    let mut hi = target.max(1);
    while count(&join(hi)) < target {
        hi *= 2;
    }
    let mut lo = 1;
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if count(&join(mid)) <= target {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    join(lo)
}

fn lognormal(rng: &mut impl Rng, mu: f64, sigma: f64) -> f64 {
    // Box–Muller.
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.gen();
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    (mu + sigma * z).exp()
}

/// Log-normal parameters of the synthetic ShareGPT lengths, chosen so that after vLLM's
/// standard filter (4 ≤ prompt ≤ 1024, output ≥ 4, sum ≤ 2048) the means are about 230
/// input / 200 output tokens, right-skewed like the real set (see BENCHMARKS.md).
const IN_MU: f64 = 5.0;
const IN_SIGMA: f64 = 0.95;
const OUT_MU: f64 = 4.75;
const OUT_SIGMA: f64 = 1.05;

/// `(prompt_len, output_len)` pairs of the synthetic ShareGPT stand-in, already passing the
/// standard filter; deterministic for `seed`.
pub fn sharegpt_synthetic_lengths(n: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let o = SampleOptions::new(n, seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let p = lognormal(&mut rng, IN_MU, IN_SIGMA).round() as usize;
        let q = lognormal(&mut rng, OUT_MU, OUT_SIGMA).round() as usize;
        if check(p, q, false, &o).is_ok() {
            out.push((p, q));
        }
    }
    out
}

/// The `sharegpt-synthetic` set: lengths from [`sharegpt_synthetic_lengths`], prompt text of
/// that many tokens; `output_len` overrides the expected output length.
pub fn sharegpt_synthetic(
    n: usize,
    seed: u64,
    output_len: Option<usize>,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed_7e47);
    let n_words = corpus_words().len();
    sharegpt_synthetic_lengths(n, seed)
        .into_iter()
        .map(|(p, q)| make(p, output_len.unwrap_or(q), rng.gen_range(0..n_words), count))
        .collect()
}

fn make(
    prompt_tokens: usize,
    output_len: usize,
    start: usize,
    count: &dyn Fn(&str) -> usize,
) -> SampledRequest {
    let prompt = text_of_tokens(prompt_tokens, start, count);
    SampledRequest {
        prompt_len: count(&prompt),
        prompt,
        expected_output_len: output_len,
        id: None,
    }
}

/// `n` prompts of `isl` tokens asking for `osl` output tokens (one ISL/OSL matrix point).
pub fn fixed_isl_osl(
    n: usize,
    isl: usize,
    osl: usize,
    seed: u64,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n_words = corpus_words().len();
    (0..n)
        .map(|_| make(isl, osl, rng.gen_range(0..n_words), count))
        .collect()
}

/// `n` requests sharing one `prefix_tokens`-token system prompt, each followed by its own
/// suffix of a length drawn from `suffix_tokens` (inclusive range).
pub fn shared_prefix(
    n: usize,
    prefix_tokens: usize,
    suffix_tokens: (usize, usize),
    output_len: usize,
    seed: u64,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n_words = corpus_words().len();
    let prefix = text_of_tokens(prefix_tokens, rng.gen_range(0..n_words), count);
    questions(n, &[prefix], suffix_tokens, output_len, &mut rng, count)
}

/// `n` requests from `groups` tenants, each tenant with its own `prefix_tokens`-token
/// system prompt (a multi-tenant load: what a cache-aware router keeps apart). Each
/// request's tenant is drawn at random, so tenants interleave in arrival order; its
/// suffix is drawn from `suffix_tokens` as in [`shared_prefix`], which this is with one
/// group (the same requests for the same seed).
pub fn shared_prefix_groups(
    n: usize,
    prefix_tokens: usize,
    groups: usize,
    suffix_tokens: (usize, usize),
    output_len: usize,
    seed: u64,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    if groups <= 1 {
        return shared_prefix(n, prefix_tokens, suffix_tokens, output_len, seed, count);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n_words = corpus_words().len();
    let prefixes: Vec<String> = (0..groups)
        .map(|g| {
            // The tenant's name first, so no two prefixes share even their first block.
            let text = text_of_tokens(prefix_tokens, rng.gen_range(0..n_words), count);
            format!("Tenant {}. {text}", g + 1)
        })
        .collect();
    questions(n, &prefixes, suffix_tokens, output_len, &mut rng, count)
}

/// `n` questions, each after one of `prefixes` (drawn at random when there are several)
/// and with a suffix of a length drawn from `suffix_tokens`.
fn questions(
    n: usize,
    prefixes: &[String],
    suffix_tokens: (usize, usize),
    output_len: usize,
    rng: &mut impl Rng,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let n_words = corpus_words().len();
    (0..n)
        .map(|i| {
            let g = match prefixes.len() {
                1 => 0,
                p => rng.gen_range(0..p),
            };
            let k = rng.gen_range(suffix_tokens.0..=suffix_tokens.1);
            let suffix = text_of_tokens(k, rng.gen_range(0..n_words), count);
            let prompt = format!("{}\n\nQuestion {}: {suffix}", prefixes[g], i + 1);
            SampledRequest {
                prompt_len: count(&prompt),
                prompt,
                expected_output_len: output_len,
                id: None,
            }
        })
        .collect()
}

fn ranged(
    n: usize,
    isl: (usize, usize),
    osl: (usize, usize),
    rng: &mut impl Rng,
    count: &dyn Fn(&str) -> usize,
) -> Vec<SampledRequest> {
    let n_words = corpus_words().len();
    (0..n)
        .map(|_| {
            let p = rng.gen_range(isl.0..=isl.1);
            let q = rng.gen_range(osl.0..=osl.1);
            make(p, q, rng.gen_range(0..n_words), count)
        })
        .collect()
}

/// The serving presets from the serving log (seed 001, BENCHMARKS.md):
///
/// | preset | requests | prompt tokens | max tokens | arrivals |
/// |---|---|---|---|---|
/// | baseline | 10 | ~256 | 256 | sequential |
/// | continuous_batching | 32 | 64–512 | 64–256 | uniform 4 RPS |
/// | paged_attention | 48 | 128–384 | 128–256 | one burst |
/// | chunked_prefill | 48 | 75% 1024–2048, 25% 64–128 | 64–256 | Poisson 6 RPS |
/// | prefix_caching | 48 | 1024 shared + 32–128 | 256 | uniform 8 RPS |
///
/// `None` for an unknown name. Note `chunked_prefill` needs a context of ~2.3k tokens.
pub fn preset(name: &str, seed: u64, count: &dyn Fn(&str) -> usize) -> Option<Workload> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (requests, arrival) = match name {
        "baseline" => (
            ranged(10, (256, 256), (256, 256), &mut rng, count),
            Arrival::Sequential,
        ),
        "continuous_batching" => (
            ranged(32, (64, 512), (64, 256), &mut rng, count),
            Arrival::Uniform { rate: 4.0 },
        ),
        "paged_attention" => (
            ranged(48, (128, 384), (128, 256), &mut rng, count),
            Arrival::AllAtOnce,
        ),
        "chunked_prefill" => {
            let n_words = corpus_words().len();
            let reqs = (0..48)
                .map(|_| {
                    let long = rng.gen_bool(0.75);
                    let p = if long {
                        rng.gen_range(1024..=2048)
                    } else {
                        rng.gen_range(64..=128)
                    };
                    let q = rng.gen_range(64..=256);
                    make(p, q, rng.gen_range(0..n_words), count)
                })
                .collect();
            (
                reqs,
                Arrival::Gamma {
                    rate: 6.0,
                    burstiness: 1.0,
                },
            )
        }
        "prefix_caching" => (
            shared_prefix(48, 1024, (32, 128), 256, rng.gen(), count),
            Arrival::Uniform { rate: 8.0 },
        ),
        _ => return None,
    };
    Some(Workload {
        label: format!("preset:{name}"),
        requests,
        arrival,
    })
}

/// Parse `ISLxOSL` / `isl-osl:ISL/OSL` style fixed-set names: `fixed:128/128`.
pub fn parse_fixed(name: &str) -> Option<(usize, usize)> {
    let rest = name.strip_prefix("fixed:")?;
    let (a, b) = rest.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    fn chars4(s: &str) -> usize {
        s.len().div_ceil(4)
    }

    #[test]
    fn shared_prefix_groups_interleave_tenants_with_distinct_prefixes() {
        let r = shared_prefix_groups(64, 40, 4, (4, 8), 16, 7, &words);
        assert_eq!(r, shared_prefix_groups(64, 40, 4, (4, 8), 16, 7, &words));
        let tenant = |p: &str| p.split('.').next().unwrap().to_string();
        let tenants: Vec<String> = r.iter().map(|q| tenant(&q.prompt)).collect();
        let distinct: std::collections::BTreeSet<&String> = tenants.iter().collect();
        assert_eq!(distinct.len(), 4, "{distinct:?}");
        // Interleaved: the tenant changes between neighbours many times.
        let changes = tenants.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(changes > 20, "{changes}");
        // A tenant's requests share its whole prefix; different tenants' differ at once.
        for (a, b) in r.iter().zip(&r[1..]) {
            let pa = a.prompt.split("\n\n").next().unwrap();
            let pb = b.prompt.split("\n\n").next().unwrap();
            assert_eq!(pa == pb, tenant(&a.prompt) == tenant(&b.prompt));
            assert!(words(pa) >= 40);
        }
        assert!(r.iter().all(|q| q.expected_output_len == 16));
        // One group is shared_prefix itself.
        assert_eq!(
            shared_prefix_groups(8, 40, 1, (4, 8), 16, 7, &words),
            shared_prefix(8, 40, (4, 8), 16, 7, &words)
        );
    }

    #[test]
    fn synthetic_lengths_match_published_stats() {
        let l = sharegpt_synthetic_lengths(4000, 0);
        let mi = l.iter().map(|p| p.0 as f64).sum::<f64>() / l.len() as f64;
        let mo = l.iter().map(|p| p.1 as f64).sum::<f64>() / l.len() as f64;
        assert!((200.0..260.0).contains(&mi), "mean input {mi}");
        assert!((175.0..225.0).contains(&mo), "mean output {mo}");
        // Right-skewed: median below mean.
        let mut ins: Vec<_> = l.iter().map(|p| p.0).collect();
        ins.sort();
        assert!((ins[ins.len() / 2] as f64) < mi);
        assert!(l
            .iter()
            .all(|&(p, q)| (4..=1024).contains(&p) && q >= 4 && p + q <= 2048));
        assert_eq!(l, sharegpt_synthetic_lengths(4000, 0));
    }

    #[test]
    fn synthetic_text_is_real_language_of_target_length() {
        let r = sharegpt_synthetic(5, 3, None, &chars4);
        assert_eq!(r, sharegpt_synthetic(5, 3, None, &chars4));
        let lens = sharegpt_synthetic_lengths(5, 3);
        for (req, (p, q)) in r.iter().zip(lens) {
            assert!(
                req.prompt_len <= p && req.prompt_len + 2 >= p,
                "{} vs {p}",
                req.prompt_len
            );
            assert_eq!(req.expected_output_len, q);
            assert!(req.prompt.contains(' '));
        }
        let t = text_of_tokens(50, 0, &words);
        assert_eq!(words(&t), 50);
        assert!(t.starts_with("Apache License Version 2.0"));
        let f = fixed_isl_osl(3, 128, 64, 1, &words);
        assert!(f
            .iter()
            .all(|r| r.prompt_len == 128 && r.expected_output_len == 64));
        assert_ne!(f[0].prompt, f[1].prompt);
    }

    #[test]
    fn shared_prefix_and_presets() {
        let s = shared_prefix(4, 100, (5, 10), 16, 0, &words);
        let prefix: String = s[0]
            .prompt
            .split("\n\nQuestion")
            .next()
            .unwrap()
            .to_string();
        assert_eq!(words(&prefix), 100);
        assert!(s.iter().all(|r| r.prompt.starts_with(&prefix)));
        for name in PRESETS {
            let w = preset(name, 42, &words).unwrap();
            assert_eq!(w.label, format!("preset:{name}"));
            assert!(!w.requests.is_empty());
        }
        let b = preset("baseline", 42, &words).unwrap();
        assert_eq!((b.requests.len(), b.arrival), (10, Arrival::Sequential));
        assert!(preset("nope", 0, &words).is_none());
        assert_eq!(parse_fixed("fixed:1024/128"), Some((1024, 128)));
        assert_eq!(parse_fixed("sharegpt"), None);
    }
}
