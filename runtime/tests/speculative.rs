//! Speculative decoding returns plain decoding's tokens: greedy and seeded sampling, with
//! prompt lookup and with a draft model, up to the end of the context; rejected drafts
//! leave no trace in the cache.

mod common;

use std::sync::Arc;

use runtime::runner::{FinishReason, Runner};
use runtime::sampling::{Sampler, SamplingParams};
use runtime::speculative::{DraftModel, Proposer, SpecParams, SpecStats, Speculator};

const CODE: &str = "Rewrite this function with `total` renamed to `acc`:\n\n\
def add_all(values):\n    total = 0\n    for v in values:\n        total += v\n    return total\n\n\
def add_squares(values):\n    total = 0\n    for v in values:\n        total += v * v\n    return total\n\n\
Rewritten:\n\n";

fn run(
    runner: &mut Runner,
    prompt: &[u32],
    n: usize,
    params: &SamplingParams,
    eog: &dyn Fn(u32) -> bool,
    spec: Option<&mut Speculator>,
) -> (Vec<u32>, FinishReason, SpecStats) {
    let mut sampler = Sampler::new(params.clone());
    runner
        .generate_with(prompt, n, &mut sampler, eog, &mut |_| true, spec)
        .unwrap()
}

#[test]
fn speculative_output_is_plain_decoding() {
    let Some(path) = common::model("smollm2-135m") else {
        return;
    };
    let l = runtime::load(path.to_str().unwrap()).unwrap();
    let tok = l.tokenizer.clone();
    let eog = move |t| tok.is_eog(t);
    let prompt = l.tokenizer.encode(CODE, true, false);
    let mut runner = Runner::new(l.model.clone(), 2, 512);
    let greedy = SamplingParams::greedy();
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: 7,
        ..Default::default()
    };
    let mut rejected = 0;
    for params in [&greedy, &sampled] {
        let plain = run(&mut runner, &prompt, 96, params, &eog, None);
        assert_eq!(plain.2, SpecStats::default());
        for n_max in [1, 3, 8] {
            let mut spec = Speculator::lookup(SpecParams {
                n_max,
                ..Default::default()
            });
            let got = run(&mut runner, &prompt, 96, params, &eog, Some(&mut spec));
            assert_eq!(
                (&got.0, got.1),
                (&plain.0, plain.1),
                "lookup, draft-max {n_max}, {params:?}"
            );
            let s = got.2;
            assert!(s.steps > 0 && s.accepted > 0, "drafts were checked: {s:?}");
            assert!(s.accepted <= s.drafted && s.drafted <= s.steps * n_max as u64);
            rejected += s.drafted - s.accepted;
        }
        // A draft model: the same model (so it shares the tokenizer), drafting greedily.
        let mut spec = Speculator {
            params: SpecParams {
                n_max: 4,
                p_min: 0.0,
                ..Default::default()
            },
            proposer: Proposer::Model(Box::new(DraftModel::new(
                l.model.clone(),
                l.model.config.n_vocab,
                512,
                512,
            ))),
        };
        let got = run(&mut runner, &prompt, 96, params, &eog, Some(&mut spec));
        assert_eq!(
            (&got.0, got.1),
            (&plain.0, plain.1),
            "draft model, {params:?}"
        );
        assert!(got.2.accepted > 0, "{:?}", got.2);
        rejected += got.2.drafted - got.2.accepted;
    }
    assert!(rejected > 0, "some drafts were wrong and rejected");
}

#[test]
fn speculative_decoding_stops_at_the_context_end() {
    let Some(path) = common::model("smollm2-135m") else {
        return;
    };
    let l = runtime::load(path.to_str().unwrap()).unwrap();
    let prompt = l.tokenizer.encode(CODE, true, false);
    let n_ctx = prompt.len() + 21;
    let mut runner = Runner::new(Arc::clone(&l.model), 2, n_ctx);
    let never = |_| false;
    let plain = run(
        &mut runner,
        &prompt,
        200,
        &SamplingParams::greedy(),
        &never,
        None,
    );
    assert_eq!(plain.1, FinishReason::Context);
    let mut spec = Speculator::lookup(SpecParams {
        n_max: 16,
        ..Default::default()
    });
    let got = run(
        &mut runner,
        &prompt,
        200,
        &SamplingParams::greedy(),
        &never,
        Some(&mut spec),
    );
    assert_eq!((&got.0, got.1), (&plain.0, plain.1));
    assert_eq!(runner.pos(), n_ctx, "the cache holds exactly the context");
    // Exactly n tokens, wherever a step's accepted run would overshoot.
    let plain = run(
        &mut runner,
        &prompt,
        7,
        &SamplingParams::greedy(),
        &never,
        None,
    );
    let got = run(
        &mut runner,
        &prompt,
        7,
        &SamplingParams::greedy(),
        &never,
        Some(&mut spec),
    );
    assert_eq!(got.0, plain.0);
    assert_eq!(got.0.len(), 7);
}
