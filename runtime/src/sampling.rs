//! Token sampling: penalties, then top-k, top-p, min-p, temperature and a seeded draw, in
//! llama.cpp's default chain order. Temperature 0 (or below) is greedy and deterministic.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1.0 disables.
    pub top_p: f32,
    /// 0.0 disables.
    pub min_p: f32,
    /// 1.0 disables. Divides positive logits / multiplies negative ones of recent tokens.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (0 = none, -1 in llama.cpp = context).
    pub penalty_last_n: usize,
    /// Subtracted once from tokens that appeared (OpenAI `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted per occurrence (OpenAI `frequency_penalty`).
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            penalty_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Checks ranges; returns a message naming the bad field.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number, got {v}"))
            }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repeat_penalty", self.repeat_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        if self.temperature < 0.0 || self.temperature > 100.0 {
            return Err(format!(
                "temperature must be in [0, 100], got {}",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p == 0.0 {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty)
            || !(-2.0..=2.0).contains(&self.frequency_penalty)
        {
            return Err("presence_penalty and frequency_penalty must be in [-2, 2]".into());
        }
        Ok(())
    }
}

/// Index of the largest logit (the first one on ties, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// A sampler with its RNG and the history the penalties need.
pub struct Sampler {
    params: SamplingParams,
    rng: rand::rngs::StdRng,
    history: Vec<u32>,
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            rng: rand::rngs::StdRng::seed_from_u64(params.seed),
            params,
            history: Vec::new(),
            cand: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records tokens the penalties should see (prompt or generated).
    pub fn accept(&mut self, token: u32) {
        self.history.push(token);
    }

    /// Chooses the next token from `logits` (which are modified by the penalties).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        let p = &self.params;
        if p.temperature <= 0.0 {
            return argmax(logits);
        }
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        let by_logit_desc =
            |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            cand.truncate(p.top_k);
        }
        cand.sort_unstable_by(by_logit_desc);
        // Probabilities at temperature 1 for top-p / min-p, as llama.cpp's chain does.
        let probs = |c: &[(u32, f32)]| -> Vec<f32> {
            let max = c[0].1;
            let e: Vec<f32> = c.iter().map(|x| (x.1 - max).exp()).collect();
            let s: f32 = e.iter().sum();
            e.into_iter().map(|v| v / s).collect()
        };
        if p.top_p < 1.0 {
            let pr = probs(cand);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, &q) in pr.iter().enumerate() {
                cum += q;
                if cum >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 && cand.len() > 1 {
            let threshold = cand[0].1 + p.min_p.ln();
            let keep = cand.iter().take_while(|c| c.1 >= threshold).count();
            cand.truncate(keep.max(1));
        }
        for c in cand.iter_mut() {
            c.1 /= p.temperature;
        }
        let pr = probs(cand);
        let r: f32 = self.rng.gen();
        let mut cum = 0.0;
        for (c, q) in cand.iter().zip(&pr) {
            cum += q;
            if r < cum {
                return c.0;
            }
        }
        cand.last().map(|c| c.0).unwrap_or(0)
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.penalty_last_n == 0
            || (p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0)
        {
            return;
        }
        let start = self.history.len().saturating_sub(p.penalty_last_n);
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.history[start..] {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &n) in &counts {
            let Some(l) = logits.get_mut(t as usize) else {
                continue;
            };
            if *l > 0.0 {
                *l /= p.repeat_penalty;
            } else {
                *l *= p.repeat_penalty;
            }
            *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_and_deterministic() {
        let mut s = Sampler::new(SamplingParams::greedy());
        let mut l = vec![0.1, 3.0, 2.9, 3.0];
        assert_eq!(s.sample(&mut l), 1);
    }

    #[test]
    fn seeded_sampling_repeats_and_respects_top_k() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.5,
            top_k: 3,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let mut top3: Vec<(usize, f32)> = logits.iter().copied().enumerate().collect();
        top3.sort_by(|a, b| b.1.total_cmp(&a.1));
        let allowed: Vec<u32> = top3[..3].iter().map(|x| x.0 as u32).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams { seed, ..p.clone() });
            (0..50)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<u32>>()
        };
        let a = draw(42);
        assert_eq!(a, draw(42));
        assert_ne!(a, draw(43));
        assert!(a.iter().all(|t| allowed.contains(t)));
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        let mut logits = vec![10.0, 9.9, 0.0, -5.0];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        for _ in 0..100 {
            assert!(s.sample(&mut logits) <= 1);
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&mut logits.clone()), 0);
        }
        logits[0] = 0.0;
    }

    #[test]
    fn penalties_lower_repeated_tokens() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::greedy()
        });
        s.accept(0);
        s.accept(0);
        let mut l = vec![4.0, 1.9];
        assert_eq!(s.sample(&mut l), 1);
        assert_eq!(l[0], 4.0 / 2.0 - 1.0 - 0.25);
    }

    #[test]
    fn validation_names_the_field() {
        let bad = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
        assert!(SamplingParams::default().validate().is_ok());
    }
}
