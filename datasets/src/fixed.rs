//! Fixed-length token prompts, as llama-bench uses for `pp`/`tg` tests: uniformly random
//! token ids (never special tokens), with BOS first when the model adds one.

use rand::{Rng, SeedableRng};

/// Token ids a random prompt may not contain (BOS/EOS/control tokens).
pub struct TokenSpace<'a> {
    pub n_vocab: u32,
    pub excluded: &'a [u32],
}

/// `n` random token ids from `space`, with `bos` prepended (counted within `n`) if given.
pub fn random_tokens(space: &TokenSpace<'_>, n: usize, bos: Option<u32>, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n);
    if let (Some(b), true) = (bos, n > 0) {
        out.push(b);
    }
    while out.len() < n {
        let t = rng.gen_range(0..space.n_vocab);
        if !space.excluded.contains(&t) {
            out.push(t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_bos_first_and_excludes_specials() {
        let space = TokenSpace {
            n_vocab: 10,
            excluded: &[0, 1, 2],
        };
        let a = random_tokens(&space, 100, Some(1), 7);
        assert_eq!(a, random_tokens(&space, 100, Some(1), 7));
        assert_ne!(a, random_tokens(&space, 100, Some(1), 8));
        assert_eq!(a.len(), 100);
        assert_eq!(a[0], 1);
        assert!(a[1..].iter().all(|&t| (3..10).contains(&t)));
        assert!(random_tokens(&space, 0, Some(1), 7).is_empty());
    }
}
