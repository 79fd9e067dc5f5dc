//! Serving under concurrency on the real model (smollm2-135m), in-process on 127.0.0.1:
//! - batch invariance: one greedy prompt alone and 2, 8, 32 times at once, with the prefix
//!   cache cold, warm and hot (and off), at short and long contexts, always gives the same
//!   text; mixed prompts finishing at different steps too;
//! - overload: 200 concurrent requests on a small queue all end as a full 200 or an
//!   explicit 429, nothing hangs or is empty, and /metrics accounts for every one;
//! - disconnects: 50 streaming clients hanging up leave no KV block in use;
//! - chunked prefill: running streams keep getting tokens while a 2000-token prompt is
//!   prefilled (max inter-token latency with and without chunking is printed).
//!
//! Each test prints what it measured (`cargo test -- --nocapture` shows it).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const MAX_TOKENS: usize = 8;

#[derive(Debug, Clone)]
struct Out {
    text: String,
    finish: String,
    cached: u64,
    completion_tokens: u64,
}

/// One greedy completion, streamed or not, as the client sees it.
fn complete(addr: SocketAddr, body: &Value, stream: bool) -> Result<Out, String> {
    let mut body = body.clone();
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let s =
            stream_completion(addr, &body, Duration::from_secs(300)).map_err(|e| e.to_string())?;
        if let Some(e) = s.error {
            return Err(e.to_string());
        }
        let u = s.usage.ok_or("no usage chunk")?;
        Ok(Out {
            text: s.text,
            finish: s.finish.ok_or("no finish_reason")?,
            cached: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
        })
    } else {
        let r = request(
            addr,
            "POST",
            "/v1/completions",
            Some(body.to_string().as_bytes()),
            Duration::from_secs(300),
        )
        .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("status {}: {}", r.status, r.text()));
        }
        let v = r.json();
        Ok(Out {
            text: v["choices"][0]["text"].as_str().unwrap_or("").to_string(),
            finish: v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            cached: v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        })
    }
}

/// Sends the bodies all at once (half streamed, half not) and returns the outputs in order.
fn concurrent(addr: SocketAddr, bodies: Vec<Value>) -> Vec<Out> {
    let barrier = Arc::new(Barrier::new(bodies.len()));
    let handles: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                complete(addr, &b, i % 2 == 1)
            })
        })
        .collect();
    handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("request {i} failed: {e}"))
        })
        .collect()
}

fn tokens_of(addr: SocketAddr, text: &str) -> Vec<u64> {
    post(addr, "/tokenize", &json!({"prompt": text})).json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn reset(addr: SocketAddr) {
    assert_eq!(post(addr, "/reset_prefix_cache", &json!({})).status, 200);
}

fn greedy(ids: &[u64], max_tokens: usize) -> Value {
    json!({"prompt": ids, "max_tokens": max_tokens, "temperature": 0})
}

/// Runs `n` copies of `ids` at once and checks every output equals `want`.
fn check_n(addr: SocketAddr, label: &str, ids: &[u64], n: usize, want: &Out) -> Vec<Out> {
    let t0 = Instant::now();
    let outs = concurrent(addr, vec![greedy(ids, MAX_TOKENS); n]);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(
            o.text, want.text,
            "{label} N={n}: request {i} differs from the lone request"
        );
        assert_eq!(o.finish, want.finish, "{label} N={n}: request {i}");
        assert_eq!(
            o.completion_tokens, want.completion_tokens,
            "{label} N={n}: request {i}"
        );
        assert!(!o.text.is_empty(), "{label}: empty output");
    }
    let cached: Vec<u64> = outs.iter().map(|o| o.cached).collect();
    println!(
        "  {label:<5} N={n:<2} identical ({:.1}s; cached tokens min {} max {})",
        t0.elapsed().as_secs_f64(),
        cached.iter().min().unwrap(),
        cached.iter().max().unwrap()
    );
    outs
}

fn invariance_server(prefix_caching: bool) -> server::RunningServer {
    invariance_server_with(prefix_caching, runtime::Numerics::Exact)
}

fn invariance_server_with(
    prefix_caching: bool,
    numerics: runtime::Numerics,
) -> server::RunningServer {
    let mut cfg = engine_config();
    cfg.run.numerics = numerics;
    cfg.max_seqs = 32;
    cfg.max_batch_tokens = 512;
    cfg.n_ctx = Some(2048);
    cfg.kv_blocks = Some(640);
    cfg.prefix_caching = prefix_caching;
    start(cfg)
}

/// Cold: nothing cached. Hot: every full block of the prompt cached (only the last block
/// is recomputed). Warm: a prefix cached, the rest not (a prompt that shares the first
/// `warm_prefix` tokens with a cached one and then goes its own way).
fn invariance_matrix(addr: SocketAddr, ids: &[u64], warm_prefix: usize, tails: &[u64]) {
    let usable = |n: usize| ((n - 1) / 16 * 16) as u64;
    reset(addr);
    let t0 = Instant::now();
    let lone = complete(addr, &greedy(ids, MAX_TOKENS), false).unwrap();
    assert_eq!(lone.cached, 0);
    assert!(!lone.text.is_empty());
    println!(
        "  lone  cold ({} prompt tokens, {:.1}s): {:?} [{}]",
        ids.len(),
        t0.elapsed().as_secs_f64(),
        lone.text,
        lone.finish
    );
    for n in [2, 8, 32] {
        reset(addr);
        let outs = check_n(addr, "cold", ids, n, &lone);
        assert_eq!(
            outs.iter().map(|o| o.cached).min(),
            Some(0),
            "cold: someone computed it all"
        );
    }
    for n in [1, 2, 8, 32] {
        let outs = check_n(addr, "hot", ids, n, &lone);
        assert!(
            outs.iter().all(|o| o.cached == usable(ids.len())),
            "hot: all full blocks cached"
        );
    }
    // Warm: `ids[..warm_prefix]` is cached by now; each run adds its own fresh tail.
    let tail_len = ids.len() - warm_prefix;
    for (k, n) in [1, 2, 8, 32].into_iter().enumerate() {
        let mut p = ids[..warm_prefix].to_vec();
        p.extend(&tails[k * tail_len..(k + 1) * tail_len]);
        let t0 = Instant::now();
        let outs = concurrent(addr, vec![greedy(&p, MAX_TOKENS); n]);
        let warm_time = t0.elapsed();
        // The same prompt again, alone (now hot), is the reference.
        let again = complete(addr, &greedy(&p, MAX_TOKENS), false).unwrap();
        assert_eq!(again.cached, usable(p.len()));
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(
                o.text, again.text,
                "warm N={n}: request {i} differs from the lone request"
            );
            assert_eq!(
                (o.finish.as_str(), o.completion_tokens),
                (again.finish.as_str(), again.completion_tokens)
            );
            assert!(!o.text.is_empty());
        }
        let min = outs.iter().map(|o| o.cached).min().unwrap();
        assert_eq!(
            min,
            warm_prefix as u64 / 16 * 16,
            "warm: only the shared prefix was cached"
        );
        assert!(min < usable(p.len()));
        println!(
            "  warm  N={n:<2} identical ({:.1}s; cached tokens min {min} of {} usable)",
            warm_time.as_secs_f64(),
            usable(p.len())
        );
    }
}

#[test]
fn batch_invariance_short_context() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    let srv = invariance_server(true);
    let ids = tokens_of(srv.addr, &notes(12, 11));
    let ids = &ids[..60];
    let tails = tokens_of(srv.addr, &notes(40, 12));
    println!("batch invariance, short context ({} tokens):", ids.len());
    invariance_matrix(srv.addr, ids, 32, &tails);
    srv.shutdown();

    // Prefix cache off: identical prompts are computed side by side in one batch.
    let srv = invariance_server(false);
    let lone = complete(srv.addr, &greedy(ids, MAX_TOKENS), false).unwrap();
    let outs = check_n(srv.addr, "off", ids, 8, &lone);
    assert!(outs.iter().all(|o| o.cached == 0));
    srv.shutdown();
    println!("batch invariance short: {:.1}s", t0.elapsed().as_secs_f64());
}

/// The fast kernel orders keep the guarantee: the same prompt alone, and eight copies
/// computed side by side in one batch (prefix cache off) and cold/hot/warm with it on,
/// give the same text.
#[test]
fn batch_invariance_fast_numerics() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = invariance_server_with(false, runtime::Numerics::Fast);
    let ids = tokens_of(srv.addr, &notes(12, 11));
    let ids = &ids[..60];
    let lone = complete(srv.addr, &greedy(ids, MAX_TOKENS), false).unwrap();
    let outs = check_n(srv.addr, "fast off", ids, 8, &lone);
    assert!(outs.iter().all(|o| o.cached == 0));
    srv.shutdown();
    let srv = invariance_server_with(true, runtime::Numerics::Fast);
    let tails = tokens_of(srv.addr, &notes(40, 12));
    invariance_matrix(srv.addr, ids, 32, &tails);
    srv.shutdown();
}

#[test]
fn batch_invariance_long_context() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    let srv = invariance_server(true);
    let ids = tokens_of(srv.addr, &notes(160, 5));
    let ids = &ids[..1040];
    let tails = tokens_of(srv.addr, &notes(40, 6));
    println!("batch invariance, long context ({} tokens):", ids.len());
    invariance_matrix(srv.addr, ids, 1008, &tails);
    srv.shutdown();
    println!("batch invariance long: {:.1}s", t0.elapsed().as_secs_f64());
}

#[test]
fn mixed_prompts_finishing_at_different_steps_match_their_lone_runs() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    let mut cfg = engine_config();
    cfg.max_seqs = 16;
    // A small step budget: prompts are chunked across steps while others decode.
    cfg.max_batch_tokens = 64;
    let srv = start(cfg);
    let a = srv.addr;
    let text = tokens_of(a, &notes(90, 9));
    let shapes = [(3, 6), (17, 9), (33, 2), (70, 12), (150, 5), (260, 7)];
    let bodies: Vec<Value> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(len, max))| greedy(&text[i * 40..i * 40 + len], max))
        .collect();
    let alone: Vec<Out> = bodies
        .iter()
        .map(|b| {
            reset(a);
            complete(a, b, false).unwrap()
        })
        .collect();
    reset(a);
    // Each prompt twice (one streamed, one not), all at once.
    let twice: Vec<Value> = bodies.iter().flat_map(|b| [b.clone(), b.clone()]).collect();
    let outs = concurrent(a, twice);
    for (i, o) in outs.iter().enumerate() {
        let want = &alone[i / 2];
        assert_eq!(o.text, want.text, "prompt {} ({:?})", i / 2, shapes[i / 2]);
        assert_eq!(o.finish, want.finish);
        assert_eq!(o.completion_tokens, want.completion_tokens);
    }
    println!(
        "mixed lengths {:?}: 12 concurrent match their lone runs ({:.1}s)",
        shapes,
        t0.elapsed().as_secs_f64()
    );
    srv.shutdown();
}

#[test]
fn overload_every_request_is_served_or_explicitly_rejected() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    let mut cfg = engine_config();
    cfg.max_seqs = 4;
    cfg.queue_size = 8;
    let srv = start(cfg);
    let a = srv.addr;
    let received0 = metric(a, "rserve_requests_received_total");
    const N: usize = 200;
    let barrier = Arc::new(Barrier::new(N));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut body = json!({"prompt": format!("Request {i}: the weather today is"),
                                      "max_tokens": 6, "temperature": 0});
                let stream = i % 2 == 0;
                barrier.wait();
                let t = Instant::now();
                // Either a full answer, or the error response (status, JSON, Retry-After).
                let r: Result<Out, Resp> = if stream {
                    body["stream"] = json!(true);
                    let mut s = Sse::open(a, "/v1/completions", &body, Duration::from_secs(120))
                        .unwrap_or_else(|e| panic!("request {i}: {e}"));
                    if s.status == 200 {
                        let mut text = String::new();
                        let mut finish = String::new();
                        while let Some(d) =
                            s.next_data().unwrap_or_else(|e| panic!("request {i}: {e}"))
                        {
                            let v: Value = serde_json::from_str(&d).unwrap();
                            assert!(v.get("error").is_none(), "in-stream error: {v}");
                            text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
                            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                                finish = f.into();
                            }
                        }
                        Ok(Out {
                            text,
                            finish,
                            cached: 0,
                            completion_tokens: 0,
                        })
                    } else {
                        Err(s.into_resp().unwrap())
                    }
                } else {
                    let r = request(
                        a,
                        "POST",
                        "/v1/completions",
                        Some(body.to_string().as_bytes()),
                        Duration::from_secs(120),
                    )
                    .unwrap_or_else(|e| panic!("request {i}: {e}"));
                    if r.status == 200 {
                        let v = r.json();
                        Ok(Out {
                            text: v["choices"][0]["text"].as_str().unwrap().into(),
                            finish: v["choices"][0]["finish_reason"].as_str().unwrap().into(),
                            cached: 0,
                            completion_tokens: v["usage"]["completion_tokens"].as_u64().unwrap(),
                        })
                    } else {
                        Err(r)
                    }
                };
                (r, t.elapsed())
            })
        })
        .collect();
    let (mut ok, mut rejected, mut unavailable) = (0, 0, 0);
    let mut slowest = Duration::ZERO;
    for h in handles {
        let (r, took) = h.join().unwrap();
        slowest = slowest.max(took);
        match r {
            Ok(o) => {
                assert!(!o.text.is_empty(), "a 200 with empty text: {o:?}");
                assert!(o.finish == "length" || o.finish == "stop", "{o:?}");
                ok += 1;
            }
            Err(r) => {
                let err = r.json();
                assert!(
                    r.status == 429 || r.status == 503,
                    "status {}: {err}",
                    r.status
                );
                assert!(
                    err["error"]["message"].is_string(),
                    "JSON error body: {err}"
                );
                assert!(
                    r.header("retry-after").is_some(),
                    "Retry-After on {}",
                    r.status
                );
                if r.status == 429 {
                    assert_eq!(err["error"]["code"], "rate_limit_exceeded");
                    rejected += 1;
                } else {
                    unavailable += 1;
                }
            }
        }
    }
    assert_eq!(ok + rejected + unavailable, N);
    assert!(
        ok >= 8,
        "at least a full queue of requests is served ({ok})"
    );
    // Healthy afterwards, and the metrics account for every request.
    assert_eq!(get(a, "/health").status, 200);
    assert!(eventually(Duration::from_secs(30), || metric(
        a,
        "rserve_requests_running"
    ) == 0.0));
    let m = |o: &str| metric(a, &format!("rserve_requests_total{{outcome=\"{o}\"}}"));
    assert_eq!(
        metric(a, "rserve_requests_received_total") - received0,
        N as f64
    );
    assert_eq!(m("stop") + m("length"), ok as f64);
    assert_eq!(m("rejected_queue_full"), rejected as f64);
    assert_eq!(
        m("unavailable") + m("error") + m("cancelled"),
        unavailable as f64
    );
    assert_eq!(metric(a, "rserve_kv_blocks_used"), 0.0);
    let after = complete(
        a,
        &json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0}),
        false,
    )
    .unwrap();
    assert!(!after.text.is_empty());
    println!(
        "overload: {N} concurrent -> {ok} served (200), {rejected} rejected (429), {unavailable} \
         unavailable (503), 0 hung; slowest client {:.1}s; total {:.1}s",
        slowest.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    srv.shutdown();
}

#[test]
fn disconnected_streams_free_all_their_kv_blocks() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    let mut cfg = engine_config();
    cfg.max_seqs = 16;
    cfg.queue_size = 64;
    let srv = start(cfg);
    let a = srv.addr;
    const N: usize = 50;
    let handles: Vec<_> = (0..N)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("Story {i}: {}", words(20 + i % 7, i as u64)),
                                  "max_tokens": 400, "temperature": 0.7, "seed": i, "stream": true});
                let mut s = Sse::open(a, "/v1/completions", &body, Duration::from_secs(120)).unwrap();
                assert_eq!(s.status, 200);
                // Hang up after 0, 1 or 3 chunks.
                for _ in 0..[0, 1, 3][i % 3] {
                    if s.next_data().unwrap().is_none() {
                        break;
                    }
                }
                drop(s);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let hung_up = t0.elapsed();
    let freed = eventually(Duration::from_secs(120), || {
        metric(a, "rserve_requests_running") == 0.0
            && metric(a, "rserve_requests_waiting") == 0.0
            && metric(a, "rserve_kv_blocks_used") == 0.0
    });
    let used = metric(a, "rserve_kv_blocks_used");
    let free = metric(a, "rserve_kv_blocks_free");
    let cached = metric(a, "rserve_kv_blocks_cached");
    let total = metric(a, "rserve_kv_blocks_total");
    let admitted = metric(a, "rserve_queue_time_seconds_count");
    assert!(
        freed,
        "KV blocks still in use after every client left: {used}"
    );
    assert_eq!(free, total);
    assert_eq!(
        metric(a, "rserve_requests_total{outcome=\"cancelled\"}"),
        N as f64
    );
    println!(
        "disconnects: {N} streams hung up within {:.1}s ({admitted} had been admitted); all freed \
         {:.1}s later: KV blocks used {used}, free {free} of {total} (of which {cached} hold \
         cached prefixes, evictable)",
        hung_up.as_secs_f64(),
        (t0.elapsed() - hung_up).as_secs_f64()
    );
    // Still serving.
    let o = complete(
        a,
        &json!({"prompt": "Hello", "max_tokens": 2, "temperature": 0}),
        true,
    )
    .unwrap();
    assert!(!o.text.is_empty());
    srv.shutdown();
}

/// While a 2000-token prompt is prefilled, two running streams' inter-token latency.
fn itl_during_long_prefill(chunked: bool) -> (f64, usize, f64, String) {
    let mut cfg = engine_config();
    cfg.max_seqs = 4;
    cfg.max_batch_tokens = 256;
    cfg.chunked_prefill = chunked;
    cfg.n_ctx = Some(2304);
    let srv = start(cfg);
    let a = srv.addr;
    let long = tokens_of(a, &words(2300, 21));
    let long: Vec<u64> = long[..2000].to_vec();
    let streams: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("List {i}: one, two, three,"), "max_tokens": 48,
                                  "temperature": 0, "stream": true, "ignore_eos": true});
                stream_completion(a, &body, Duration::from_secs(600)).unwrap()
            })
        })
        .collect();
    // Let the streams get going, then send the long prompt.
    assert!(eventually(Duration::from_secs(60), || metric(
        a,
        "rserve_generation_tokens_total"
    ) >= 6.0));
    let t_send = Instant::now();
    let long_out = complete(a, &greedy(&long, 1), false).unwrap();
    let t_done = Instant::now();
    let outs: Vec<Streamed> = streams.into_iter().map(|h| h.join().unwrap()).collect();
    let mut max_itl = 0f64;
    let mut during = 0;
    for o in &outs {
        assert_eq!(o.finish.as_deref(), Some("length"));
        for w in o.chunk_times.windows(2) {
            if w[1] > t_send && w[0] < t_done {
                max_itl = max_itl.max((w[1] - w[0]).as_secs_f64());
            }
        }
        during += o
            .chunk_times
            .iter()
            .filter(|&&t| t > t_send && t < t_done)
            .count();
        assert!(
            o.chunk_times.last().unwrap() > &t_done,
            "streams outlast the prefill, so the window is covered"
        );
    }
    srv.shutdown();
    (
        max_itl,
        during,
        (t_done - t_send).as_secs_f64(),
        long_out.text,
    )
}

#[test]
fn chunked_prefill_keeps_streams_going_during_a_long_prompt() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let (itl_c, during_c, pf_c, text_c) = itl_during_long_prefill(true);
    let (itl_w, during_w, pf_w, text_w) = itl_during_long_prefill(false);
    println!(
        "2000-token prefill beside 2 streams: chunked (256 tokens/step): max ITL {itl_c:.2}s, \
         {during_c} stream tokens during {pf_c:.1}s of prefill; whole prompt in one step: max ITL \
         {itl_w:.2}s, {during_w} stream tokens during {pf_w:.1}s"
    );
    assert_eq!(
        text_c, text_w,
        "the long prompt's answer does not depend on chunking"
    );
    assert!(
        during_c >= 4,
        "streams keep receiving tokens during a chunked prefill"
    );
    assert!(
        itl_c < itl_w / 2.0,
        "chunking cuts the worst stall ({itl_c:.2}s vs {itl_w:.2}s)"
    );
}

#[test]
fn kv_exhaustion_preempts_and_recomputes_without_changing_any_output() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let t0 = Instant::now();
    // 10 blocks = 160 positions for 4 sequences that each grow to ~60: they cannot all fit.
    let mut cfg = engine_config();
    cfg.n_ctx = Some(128);
    cfg.kv_blocks = Some(10);
    cfg.max_seqs = 4;
    let srv = start(cfg);
    let a = srv.addr;
    let text = tokens_of(a, &notes(20, 31));
    let bodies: Vec<Value> = (0..4)
        .map(|i| {
            let mut b = greedy(&text[i * 7..i * 7 + 20], 40);
            b["ignore_eos"] = json!(true);
            b
        })
        .collect();
    let alone: Vec<Out> = bodies
        .iter()
        .map(|b| complete(a, b, false).unwrap())
        .collect();
    reset(a);
    let outs = concurrent(a, bodies);
    for (i, (o, want)) in outs.iter().zip(&alone).enumerate() {
        assert_eq!(o.text, want.text, "request {i} changed by preemption");
        assert_eq!(o.completion_tokens, 40);
    }
    let preempted = metric(a, "rserve_preemptions_total");
    assert!(
        preempted > 0.0,
        "the cache was too small for all four: preemption expected"
    );
    assert_eq!(metric(a, "rserve_requests_total{outcome=\"error\"}"), 0.0);
    assert!(eventually(Duration::from_secs(10), || metric(
        a,
        "rserve_kv_blocks_used"
    ) == 0.0));
    println!(
        "kv exhaustion: 4 sequences of 60 tokens in a 160-token cache: {preempted} preemptions, \
         every output identical to its lone run ({:.1}s)",
        t0.elapsed().as_secs_f64()
    );
    srv.shutdown();
}

/// What a router asks a worker (sglang-router's worker protocol): the model's name and
/// file, the server's sizing, the load as requests and KV tokens, and a bodiless
/// `POST /flush_cache` that empties the prefix cache (while a form post is still refused).
#[test]
fn router_worker_protocol() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let srv = start(engine_config());
    let a = srv.addr;
    for path in ["/server_info", "/get_server_info"] {
        let r = get(a, path);
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let v = r.json();
        assert_eq!(v["served_model_name"], MODEL);
        let file = std::path::PathBuf::from(v["model_path"].as_str().unwrap());
        assert!(file.is_absolute() && file.is_file(), "{v}");
        assert_eq!(v["max_running_requests"], 8);
        assert_eq!(v["max_total_num_tokens"], 640 * 16);
        assert_eq!(v["page_size"], 16);
        assert_eq!(v["chunked_prefill_size"], 256);
        assert_eq!(v["disable_radix_cache"], false);
    }
    for path in ["/model_info", "/get_model_info"] {
        let v = get(a, path).json();
        assert_eq!(v["served_model_name"], MODEL);
        assert_eq!(v["is_generation"], true);
        assert_eq!(v["context_length"], 2048);
    }
    let idle = get(a, "/get_load").json();
    assert_eq!(idle[0]["num_reqs"], 0, "{idle}");
    assert_eq!(idle[0]["num_tokens"], 0, "{idle}");
    // Under load: a long streamed request is counted while it runs.
    let prompt = words(300, 5);
    let mut s = Sse::open(
        a,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 400, "ignore_eos": true, "stream": true}),
        Duration::from_secs(60),
    )
    .unwrap();
    s.next_data().unwrap();
    let busy = get(a, "/get_load").json();
    assert_eq!(busy[0]["num_reqs"], 1, "{busy}");
    assert!(busy[0]["num_tokens"].as_u64().unwrap() >= 300, "{busy}");
    drop(s);
    assert!(eventually(Duration::from_secs(30), || {
        get(a, "/get_load").json()[0]["num_reqs"] == 0
    }));
    // The flush a router sends: no body, no type. The cache is empty afterwards.
    assert!(metric(a, "rserve_kv_blocks_cached") > 0.0);
    let r = request(a, "POST", "/flush_cache", None, Duration::from_secs(30)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(eventually(Duration::from_secs(10), || {
        metric(a, "rserve_kv_blocks_cached") == 0.0
    }));
    // A form post (what a cross-site page can send without asking) is still refused.
    let r = request_with(
        a,
        "POST",
        "/flush_cache",
        None,
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", "0"),
        ],
        Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(r.status, 415, "{}", r.text());
    srv.shutdown();
}
