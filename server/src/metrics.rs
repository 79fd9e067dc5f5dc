//! Server metrics in the Prometheus text format. The engine updates gauges once per step
//! and counters as events happen; handlers count what they reject. Every generation
//! request that reaches a handler ends in exactly one `rserve_requests_total{outcome}`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Finished: end of generation or a stop string.
    Stop,
    /// Finished: `max_tokens` or the context.
    Length,
    /// The client went away.
    Cancelled,
    /// 429: admission queue full.
    RejectedQueueFull,
    /// 503: loading or shutting down.
    Unavailable,
    /// 400/413: bad request.
    Invalid,
    /// 401: missing or wrong API key.
    Unauthorized,
    /// 500: engine failure.
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Stop,
        Outcome::Length,
        Outcome::Cancelled,
        Outcome::RejectedQueueFull,
        Outcome::Unavailable,
        Outcome::Invalid,
        Outcome::Unauthorized,
        Outcome::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::RejectedQueueFull => "rejected_queue_full",
            Outcome::Unavailable => "unavailable",
            Outcome::Invalid => "invalid",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Error => "error",
        }
    }
}

/// A generation request's choices (`n`): the request's outcome is counted once, when its
/// last choice ends, as the worst of its choices' outcomes (in [`Outcome`]'s order).
#[derive(Debug)]
pub struct Tally {
    left: AtomicUsize,
    worst: AtomicU8,
}

impl Tally {
    pub fn new(choices: usize) -> Tally {
        Tally {
            left: AtomicUsize::new(choices),
            worst: AtomicU8::new(0),
        }
    }
}

/// Escapes a label value as the Prometheus text format requires (backslash, double quote
/// and newline), so no value can end its label or start a new line.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
    max: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
            max: 0.0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
        self.max = self.max.max(v);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> f64 {
        self.max
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const MASK_BOUNDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
];

const LATENCY_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// One tenant's share of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantKv {
    pub blocks_used: usize,
    pub tokens_used: usize,
    pub blocks_cached: usize,
}

#[derive(Clone, Debug)]
pub struct Metrics {
    pub requests_received: u64,
    /// One per request (the worst of its choices).
    pub outcomes: BTreeMap<Outcome, u64>,
    /// One per choice (a request with `n` choices runs `n` sequences).
    pub choice_outcomes: BTreeMap<Outcome, u64>,
    pub running: usize,
    pub waiting: usize,
    /// Accepted requests not yet admitted (what `--queue-size` bounds).
    pub queued: usize,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Prompt tokens looked up in the prefix cache, and those found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub preemptions: u64,
    pub steps: u64,
    /// Speculative decoding: draft tokens checked, those the model agreed with, and the
    /// verification steps that carried them.
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
    pub spec_drafts: u64,
    pub kv_blocks_total: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_free: usize,
    pub kv_blocks_cached: usize,
    /// Per tenant (by label): KV blocks its running and waiting sequences hold, the
    /// positions they have computed, and the cached prefix blocks it published that are
    /// still in the cache.
    pub tenants: BTreeMap<String, TenantKv>,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    /// Constraint masks: the token trie's nodes (the bound on one mask's work), the most
    /// automaton bytes one mask fed, and the time per mask.
    pub constraint_trie_nodes: u64,
    pub constraint_mask_bytes_max: u64,
    pub constraint_mask: Histogram,
    /// `--kv-persist`: segment writes that failed (their blocks are retried) and blocks
    /// published but not yet durable on disk.
    pub kv_persist_write_errors: u64,
    pub kv_persist_blocks_pending: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests_received: 0,
            outcomes: Outcome::ALL.iter().map(|&o| (o, 0)).collect(),
            choice_outcomes: Outcome::ALL.iter().map(|&o| (o, 0)).collect(),
            running: 0,
            waiting: 0,
            queued: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            preemptions: 0,
            steps: 0,
            spec_draft_tokens: 0,
            spec_accepted_tokens: 0,
            spec_drafts: 0,
            kv_blocks_total: 0,
            kv_blocks_used: 0,
            kv_blocks_free: 0,
            kv_blocks_cached: 0,
            tenants: BTreeMap::new(),
            ttft: Histogram::new(LATENCY_BOUNDS),
            itl: Histogram::new(LATENCY_BOUNDS),
            e2e: Histogram::new(LATENCY_BOUNDS),
            queue_time: Histogram::new(LATENCY_BOUNDS),
            constraint_trie_nodes: 0,
            constraint_mask_bytes_max: 0,
            constraint_mask: Histogram::new(MASK_BOUNDS),
            kv_persist_write_errors: 0,
            kv_persist_blocks_pending: 0,
        }
    }
}

impl Metrics {
    pub fn count(&mut self, o: Outcome) {
        *self.outcomes.entry(o).or_default() += 1;
    }

    /// One choice of a request ended with `o`; the request's outcome is counted when its
    /// last choice ends.
    pub fn end_choice(&mut self, o: Outcome, tally: &Tally) {
        *self.choice_outcomes.entry(o).or_default() += 1;
        let prev = tally.worst.fetch_max(o as u8, Ordering::AcqRel);
        if tally.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let worst = Outcome::ALL[prev.max(o as u8) as usize];
            self.count(worst);
        }
    }

    /// One constraint mask: the automaton bytes it fed and its time.
    pub fn observe_mask(&mut self, bytes: u64, seconds: f64) {
        self.constraint_mask_bytes_max = self.constraint_mask_bytes_max.max(bytes);
        self.constraint_mask.observe(seconds);
    }

    pub fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes.get(&o).copied().unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        let mut one = |name: &str, ty: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {v}");
        };
        one(
            "rserve_requests_received_total",
            "counter",
            "Generation requests received (each ends in one rserve_requests_total outcome).",
            self.requests_received as f64,
        );
        one(
            "rserve_requests_running",
            "gauge",
            "Sequences in the running batch.",
            self.running as f64,
        );
        one(
            "rserve_requests_waiting",
            "gauge",
            "Sequences waiting for admission (queued or preempted).",
            self.waiting as f64,
        );
        one(
            "rserve_requests_queued",
            "gauge",
            "Accepted requests not yet admitted (bounded by --queue-size; beyond it, 429).",
            self.queued as f64,
        );
        one(
            "rserve_prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            self.prompt_tokens as f64,
        );
        one(
            "rserve_generation_tokens_total",
            "counter",
            "Tokens generated.",
            self.generation_tokens as f64,
        );
        one(
            "rserve_prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            self.prefix_cache_queries as f64,
        );
        one(
            "rserve_prefix_cache_hits_total",
            "counter",
            "Prompt tokens served from the prefix cache.",
            self.prefix_cache_hits as f64,
        );
        one(
            "rserve_preemptions_total",
            "counter",
            "Sequences preempted for KV blocks (recomputed later).",
            self.preemptions as f64,
        );
        one(
            "rserve_engine_steps_total",
            "counter",
            "Batches run by the engine.",
            self.steps as f64,
        );
        one(
            "rserve_spec_decode_num_drafts_total",
            "counter",
            "Speculative verification steps (a sequence's decode that carried a draft).",
            self.spec_drafts as f64,
        );
        one(
            "rserve_spec_decode_num_draft_tokens_total",
            "counter",
            "Draft tokens checked by the model.",
            self.spec_draft_tokens as f64,
        );
        one(
            "rserve_spec_decode_num_accepted_tokens_total",
            "counter",
            "Draft tokens the model agreed with (tokens gained).",
            self.spec_accepted_tokens as f64,
        );
        one(
            "rserve_kv_blocks_total",
            "gauge",
            "KV cache blocks.",
            self.kv_blocks_total as f64,
        );
        one(
            "rserve_kv_blocks_used",
            "gauge",
            "KV blocks held by sequences.",
            self.kv_blocks_used as f64,
        );
        one(
            "rserve_kv_blocks_free",
            "gauge",
            "KV blocks free to allocate, including cached prefix blocks no sequence holds.",
            self.kv_blocks_free as f64,
        );
        one(
            "rserve_kv_blocks_cached",
            "gauge",
            "Free KV blocks that still hold a cached prefix (evictable).",
            self.kv_blocks_cached as f64,
        );
        for (name, help, get) in [
            (
                "rserve_tenant_kv_blocks_used",
                "KV blocks held by a tenant's sequences.",
                (|t: &TenantKv| t.blocks_used) as fn(&TenantKv) -> usize,
            ),
            (
                "rserve_tenant_kv_tokens_used",
                "KV positions computed for a tenant's sequences.",
                |t: &TenantKv| t.tokens_used,
            ),
            (
                "rserve_tenant_kv_blocks_cached",
                "Cached prefix blocks a tenant published that are still in the cache (other tenants never see them).",
                |t: &TenantKv| t.blocks_cached,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (tenant, t) in &self.tenants {
                let tenant = escape_label(tenant);
                let _ = writeln!(s, "{name}{{tenant=\"{tenant}\"}} {}", get(t));
            }
        }
        let _ = writeln!(
            s,
            "# HELP rserve_requests_total Generation requests by outcome.\n# TYPE rserve_requests_total counter"
        );
        for o in Outcome::ALL {
            let _ = writeln!(
                s,
                "rserve_requests_total{{outcome=\"{}\"}} {}",
                o.label(),
                self.outcome(o)
            );
        }
        let _ = writeln!(
            s,
            "# HELP rserve_choices_total Choices (sequences) by outcome; a request with n choices has n.\n# TYPE rserve_choices_total counter"
        );
        for o in Outcome::ALL {
            let n = self.choice_outcomes.get(&o).copied().unwrap_or(0);
            let _ = writeln!(s, "rserve_choices_total{{outcome=\"{}\"}} {n}", o.label());
        }
        let mut one = |name: &str, ty: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {v}");
        };
        one(
            "rserve_constraint_trie_nodes",
            "gauge",
            "Nodes of the token trie for response_format masks: the most automaton bytes one mask may feed.",
            self.constraint_trie_nodes as f64,
        );
        one(
            "rserve_constraint_mask_bytes_max",
            "gauge",
            "The most automaton bytes one response_format mask fed so far.",
            self.constraint_mask_bytes_max as f64,
        );
        one(
            "rserve_constraint_mask_seconds_max",
            "gauge",
            "The longest time one response_format mask took so far.",
            self.constraint_mask.max(),
        );
        one(
            "rserve_kv_persist_write_errors_total",
            "counter",
            "KV segment writes that failed (their blocks stay pending and are retried).",
            self.kv_persist_write_errors as f64,
        );
        one(
            "rserve_kv_persist_blocks_pending",
            "gauge",
            "Published KV blocks not yet durable on disk.",
            self.kv_persist_blocks_pending as f64,
        );
        self.constraint_mask.render(
            &mut s,
            "rserve_constraint_mask_seconds",
            "Time to compute one response_format token mask.",
        );
        self.ttft.render(
            &mut s,
            "rserve_time_to_first_token_seconds",
            "From arrival to the first generated token.",
        );
        self.itl.render(
            &mut s,
            "rserve_inter_token_latency_seconds",
            "Between consecutive generated tokens of a request.",
        );
        self.e2e.render(
            &mut s,
            "rserve_request_duration_seconds",
            "From arrival to the end of a finished request.",
        );
        self.queue_time.render(
            &mut s,
            "rserve_queue_time_seconds",
            "From arrival to first admission into the running batch.",
        );
        s
    }
}

/// The metrics of a server with several models: every model's families merged (each
/// family's HELP and TYPE once, then its samples from every loaded model, each with a
/// `model` label), then per model its loads, unloads, state and requests in use, and the
/// requests refused before a model was chosen. A model's counters restart when it is
/// loaded again (Prometheus reads that as a counter reset).
pub fn render_models(per_model: &[(String, String)], models: &crate::models::Models) -> String {
    // family name -> (header lines, samples), in first-seen order.
    let mut order: Vec<String> = Vec::new();
    let mut fams: std::collections::HashMap<String, (String, String)> = Default::default();
    for (id, text) in per_model {
        let label = format!("model=\"{}\"", escape_label(id));
        let mut fam = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                fam = rest.split(' ').next().unwrap_or_default().to_string();
                if !fams.contains_key(&fam) {
                    order.push(fam.clone());
                    fams.insert(fam.clone(), Default::default());
                }
            }
            let entry = fams.entry(fam.clone()).or_default();
            if line.starts_with('#') {
                if !entry.0.contains(line) {
                    entry.0.push_str(line);
                    entry.0.push('\n');
                }
                continue;
            }
            // name{labels} value | name value
            let brace = line.find('{');
            let space = line.find(' ').unwrap_or(line.len());
            let labelled = match brace {
                Some(b) if b < space => format!("{}{{{label},{}", &line[..b], &line[b + 1..]),
                _ => format!("{}{{{label}}}{}", &line[..space], &line[space..]),
            };
            entry.1.push_str(&labelled);
            entry.1.push('\n');
        }
    }
    let mut out = String::new();
    for f in &order {
        let (head, samples) = &fams[f];
        out.push_str(head);
        out.push_str(samples);
    }
    let slots = &models.slots;
    let mut fam = |name: &str, ty: &str, help: &str, v: &dyn Fn(&crate::models::Slot) -> f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {ty}");
        for s in slots {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape_label(&s.id), v(s));
        }
    };
    use std::sync::atomic::Ordering::Relaxed;
    fam(
        "rserve_model_loads_total",
        "counter",
        "Times the model was loaded.",
        &|s| s.loads.load(Relaxed) as f64,
    );
    fam(
        "rserve_model_evictions_total",
        "counter",
        "Times the model was unloaded to make room under --models-memory.",
        &|s| s.evictions.load(Relaxed) as f64,
    );
    fam(
        "rserve_model_loaded",
        "gauge",
        "1 while the model is loaded (or loading).",
        &|s| s.engine().is_some() as u8 as f64,
    );
    fam(
        "rserve_model_requests_in_use",
        "gauge",
        "Requests holding the model (it is not unloaded while any do).",
        &|s| s.in_use() as f64,
    );
    let _ = writeln!(
        out,
        "# HELP rserve_requests_unrouted_total Generation requests refused before a model was chosen (bad key or body, unknown model).\n# TYPE rserve_requests_unrouted_total counter\nrserve_requests_unrouted_total {}",
        models.unrouted()
    );
    out
}

/// The server-wide connection families, after the per-model ones. `rbench soak` subtracts
/// the open connections from the server's descriptors to watch for leaks, and checks they
/// fall back once its clients hang up.
pub fn render_connections(out: &mut String, models: &crate::models::Models) {
    let (open, refused) = models.connections();
    let _ = writeln!(
        out,
        "# HELP rserve_http_connections_open TCP connections accepted and not yet closed (this scrape's own included).\n# TYPE rserve_http_connections_open gauge\nrserve_http_connections_open {open}\n# HELP rserve_http_connections_refused_total Connections answered 503 at once, beyond --max-connections.\n# TYPE rserve_http_connections_refused_total counter\nrserve_http_connections_refused_total {refused}"
    );
}

/// Reads one sample (`name` or `name{labels}`) from Prometheus text; for tests and tools.
pub fn parse_sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_parses_back() {
        let mut m = Metrics {
            requests_received: 3,
            ..Metrics::default()
        };
        m.count(Outcome::Stop);
        m.count(Outcome::RejectedQueueFull);
        m.ttft.observe(0.02);
        m.ttft.observe(7.0);
        let t = m.render();
        assert_eq!(
            parse_sample(&t, "rserve_requests_received_total"),
            Some(3.0)
        );
        assert_eq!(
            parse_sample(&t, "rserve_requests_total{outcome=\"rejected_queue_full\"}"),
            Some(1.0)
        );
        assert_eq!(
            parse_sample(
                &t,
                "rserve_time_to_first_token_seconds_bucket{le=\"0.025\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            parse_sample(&t, "rserve_time_to_first_token_seconds_count"),
            Some(2.0)
        );
        assert_eq!(parse_sample(&t, "rserve_kv_blocks_used"), Some(0.0));
    }

    #[test]
    fn a_request_counts_one_outcome_however_many_choices() {
        let mut m = Metrics::default();
        let t = Tally::new(3);
        m.end_choice(Outcome::Stop, &t);
        m.end_choice(Outcome::Length, &t);
        assert_eq!(m.outcome(Outcome::Length) + m.outcome(Outcome::Stop), 0);
        m.end_choice(Outcome::Stop, &t);
        assert_eq!(m.outcome(Outcome::Length), 1, "the worst of its choices");
        assert_eq!(m.outcome(Outcome::Stop), 0);
        assert_eq!(m.choice_outcomes[&Outcome::Stop], 2);
        let text = m.render();
        assert_eq!(
            parse_sample(&text, "rserve_choices_total{outcome=\"stop\"}"),
            Some(2.0)
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
