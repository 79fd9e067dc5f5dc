//! Speculative decoding in the server (prompt lookup and a draft model): every output is
//! the one the server gives without it — alone, under concurrency, streamed or not,
//! sampled with a seed, and through preemption when the cache runs out — the counters
//! in /metrics show drafts checked and accepted, a request can opt out, and drafting
//! pauses while the batch holds `max_running` sequences.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use server::engine::SpecConfig;

/// Code to repeat with a change: what prompt lookup drafts from.
const CODE: &str = "Copy this function, renaming total to acc:\n\n\
def add_all(values):\n    total = 0\n    for v in values:\n        total += v\n    return total\n\n\
def add_squares(values):\n    total = 0\n    for v in values:\n        total += v * v\n    return total\n\n\
def add_cubes(values):\n    total = 0\n    for v in values:\n        total += v * v * v\n    return total\n\n\
Copy:\n\n";

fn spec(draft_model: Option<&str>, max_running: usize) -> Option<SpecConfig> {
    Some(SpecConfig {
        params: runtime::speculative::SpecParams {
            p_min: 0.0,
            ..Default::default()
        },
        draft_model: draft_model.map(str::to_string),
        max_running,
    })
}

fn text_of(addr: SocketAddr, body: &Value, stream: bool) -> String {
    let mut body = body.clone();
    if stream {
        body["stream"] = json!(true);
        let s = stream_completion(addr, &body, Duration::from_secs(300)).unwrap();
        assert!(s.error.is_none(), "{:?}", s.error);
        return s.text;
    }
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["choices"][0]["text"].as_str().unwrap().to_string()
}

fn all_at_once(addr: SocketAddr, bodies: &[Value]) -> Vec<String> {
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let hs: Vec<_> = bodies
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, b)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                text_of(addr, &b, i % 2 == 0)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn bodies() -> Vec<Value> {
    let mut v: Vec<Value> = (0..4)
        .map(|i| {
            json!({"prompt": format!("{CODE}{}", "# copy\n".repeat(i)), "max_tokens": 40,
                   "temperature": 0, "ignore_eos": true})
        })
        .collect();
    v.push(
        json!({"prompt": CODE, "max_tokens": 40, "temperature": 0.8, "seed": 3,
                  "ignore_eos": true}),
    );
    v
}

fn drafts(a: SocketAddr) -> (f64, f64) {
    (
        metric(a, "rserve_spec_decode_num_draft_tokens_total"),
        metric(a, "rserve_spec_decode_num_accepted_tokens_total"),
    )
}

/// What a server without speculative decoding answers to each body, one at a time.
fn plain_texts(bodies: &[Value]) -> Vec<String> {
    let plain = start(engine_config());
    let want = bodies
        .iter()
        .map(|b| text_of(plain.addr, b, false))
        .collect();
    plain.shutdown();
    want
}

#[test]
fn speculative_outputs_are_plain_outputs() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let bodies = bodies();
    let want = plain_texts(&bodies);

    for draft_model in [None, Some(common::MODEL)] {
        let label = draft_model.map_or("lookup", |_| "draft model");
        let mut cfg = engine_config();
        cfg.spec = spec(draft_model, 8);
        let srv = start(cfg);
        let a = srv.addr;
        for (i, b) in bodies.iter().enumerate() {
            assert_eq!(
                text_of(a, b, i % 2 == 1),
                want[i],
                "{label}: request {i} alone"
            );
        }
        let (d1, acc1) = drafts(a);
        assert!(
            d1 > 0.0 && acc1 > 0.0,
            "{label}: drafts checked and accepted: {d1} {acc1}"
        );
        assert_eq!(all_at_once(a, &bodies), want, "{label}: all at once");
        // Opting out: no drafts for this request, the same text.
        let (d2, _) = drafts(a);
        let mut b = bodies[0].clone();
        b["speculative"] = json!(false);
        assert_eq!(text_of(a, &b, false), want[0]);
        assert_eq!(drafts(a).0, d2, "{label}: an opted-out request drafted");
        // A bad opt-out value is the client's error.
        b["speculative"] = json!("yes");
        assert_eq!(post(a, "/v1/completions", &b).status, 400);
        // A huge bad value is named by its kind, not echoed back.
        b["speculative"] = json!({"n_max": {"x": "y".repeat(100_000)}});
        let r = post(a, "/v1/completions", &b);
        assert_eq!(r.status, 400);
        assert!(r.text().len() < 1000, "{} bytes", r.text().len());
        assert!(r.text().contains("got an object"), "{}", r.text());
        assert!(eventually(Duration::from_secs(10), || metric(
            a,
            "rserve_kv_blocks_used"
        ) == 0.0));
        let (d, acc) = drafts(a);
        println!(
            "{label}: {d} draft tokens checked, {acc} accepted; every output plain decoding's"
        );
        srv.shutdown();
    }
}

#[test]
fn drafts_survive_preemption_and_pause_in_a_full_batch() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let bodies = bodies();
    let want = plain_texts(&bodies);
    // A cache too small for the five at once: sequences with drafts get preempted.
    let mut cfg = engine_config();
    cfg.n_ctx = Some(256);
    cfg.kv_blocks = Some(18);
    cfg.max_seqs = 5;
    cfg.spec = spec(None, 8);
    let srv = start(cfg);
    let a = srv.addr;
    assert_eq!(all_at_once(a, &bodies), want, "under preemption");
    assert!(
        metric(a, "rserve_preemptions_total") > 0.0,
        "preemption expected"
    );
    assert!(drafts(a).0 > 0.0);
    srv.shutdown();
    // Drafting pauses from max_running sequences on: with 1, never.
    let mut cfg = engine_config();
    cfg.spec = spec(None, 1);
    let srv = start(cfg);
    assert_eq!(text_of(srv.addr, &bodies[0], false), want[0]);
    assert_eq!(drafts(srv.addr).0, 0.0);
    srv.shutdown();
}
