//! The engine: one dedicated OS thread (never a tokio worker) that loads the model and then
//! owns the model, KV cache, workspace and compute thread pool, running the batch loop:
//! take new requests, drop those whose client went away, ask the scheduler for a step,
//! run the forward pass, sample, and send token events back on each request's own channel.
//!
//! Handlers talk to it only through [`Engine::submit`] (admission control: readiness and the
//! bounded queue) and the events on their channel; every accepted request gets exactly one
//! terminal event ([`Event::Done`] or [`Event::Error`]) unless its receiver is dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use runtime::chat::ChatTemplate;
use runtime::kv::{KvCache, SeqId};
use runtime::model::{Logits, Model, SeqBatch, UBatch, Workspace};
use runtime::pool::ThreadPool;
use runtime::sampling::{Sampler, SamplingParams};
use runtime::speculative::{Proposer, SpecParams, Speculator};
use runtime::tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::constrain::{JsonMachine, TokenIndex};
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::{Metrics, Outcome};
use crate::scheduler::{Scheduler, SchedulerConfig, SeqEntry};
use crate::text::StopMatcher;

pub const BLOCK_SIZE: usize = 16;

/// llama.cpp's default micro-batch (`n_ubatch`), whose prompt split our kernels follow
/// so results match llama-server's bit for bit (see `runtime::model::UBatch`).
const LLAMA_N_UBATCH: usize = 512;

/// Engine settings; `None` means "size it from the model and memory".
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Registry name or path.
    pub model: String,
    /// How the model runs: threads, NUMA and weight placement, numerics (llama.cpp's
    /// exact orders or the fast ones; either way a request's output does not depend on
    /// its batch-mates), packing, pinning, and layers on a ggml device (with layers
    /// offloaded, outputs follow the device's kernels, whose rounding may depend on the
    /// batch).
    pub run: runtime::RunOptions,
    /// Per-sequence context (prompt + generated).
    pub n_ctx: Option<usize>,
    pub max_seqs: usize,
    pub max_batch_tokens: usize,
    pub kv_blocks: Option<usize>,
    pub kv_mem_bytes: Option<u64>,
    /// Accepted requests waiting for admission, beyond which submit answers 429.
    pub queue_size: usize,
    pub chunked_prefill: bool,
    pub prefix_caching: bool,
    /// Keep the prefix cache on disk across restarts (needs prefix caching).
    pub kv_persist: Option<crate::persist::PersistConfig>,
    /// A Jinja chat template used instead of the model's (`--chat-template-file`).
    pub chat_template: Option<String>,
    /// How /v1/embeddings pools an input's hidden states, instead of the file's
    /// `pooling_type` (`--pooling`).
    pub pooling: Option<runtime::model::Pooling>,
    /// Speculative decoding (`--spec`), if on.
    pub spec: Option<SpecConfig>,
}

/// How the server drafts (`--spec`, `--model-draft`, `--draft-*`, `--spec-max-running`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    pub params: SpecParams,
    /// A draft model (registry name or path) instead of prompt lookup.
    pub draft_model: Option<String>,
    /// Drafting pauses while this many sequences or more are running: a full batch is
    /// compute-bound, and draft tokens would take compute from other sequences' tokens.
    pub max_running: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            model: "smollm2-135m".into(),
            run: runtime::RunOptions::default(),
            n_ctx: None,
            max_seqs: 8,
            max_batch_tokens: 512,
            kv_blocks: None,
            kv_mem_bytes: None,
            queue_size: 64,
            chunked_prefill: true,
            prefix_caching: true,
            kv_persist: None,
            chat_template: None,
            pooling: None,
            spec: None,
        }
    }
}

/// What a request asks to generate.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    /// Report the chosen token's logprob and this many alternatives.
    pub logprobs: Option<usize>,
    pub ignore_eos: bool,
    /// Added to the logits of these tokens before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    /// The output must follow this format (`response_format`).
    pub format: Option<crate::constrain::Format>,
    /// Decode special tokens as text (harmony's channel markers, which the reasoning
    /// split reads and removes).
    pub special_text: bool,
    /// An embedding request: the prompt is computed and its hidden states pooled this way
    /// (L2-normalized) into one [`Event::Embedding`]; nothing is generated.
    pub embed: Option<runtime::model::Pooling>,
    /// The most draft tokens per step for this request (`speculative.n_max`; 0: no
    /// speculative decoding), capped by the server's; None: the server's.
    pub spec_max: Option<usize>,
}

pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: mpsc::UnboundedSender<Event>,
    pub arrival: Instant,
    /// Its cache-isolation domain.
    pub tenant: crate::tenant::Tenant,
    /// Shared by the choices of one request, which counts one outcome.
    pub tally: Arc<crate::metrics::Tally>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub chosen: TopLogprob,
    pub top: Vec<TopLogprob>,
}

pub use runtime::runner::FinishReason;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

#[derive(Debug)]
pub enum Event {
    /// One generated token: its text so far released (may be empty while a UTF-8 sequence
    /// or a possible stop string is held back).
    Token {
        id: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// The end: any text still held back, why it ended, and the token counts.
    Done {
        text: String,
        finish: FinishReason,
        /// The stop string that ended it, if one did.
        stop: Option<String>,
        usage: Usage,
    },
    /// An embedding request's result: the pooled, L2-normalized vector.
    Embedding {
        vector: Vec<f32>,
        usage: Usage,
    },
    Error(ApiError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    Loading = 0,
    Ready = 1,
    Draining = 2,
    Failed = 3,
}

/// What handlers need once the model is loaded.
pub struct ServedModel {
    pub id: String,
    pub path: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub n_ctx: usize,
    pub n_vocab: usize,
    /// The hidden size: an embedding's length.
    pub n_embd: usize,
    /// How /v1/embeddings pools (the file's `pooling_type` or `--pooling`; `None`: the
    /// endpoint refuses).
    pub pooling: runtime::model::Pooling,
    pub created: u64,
    pub sizing: Sizing,
}

/// The memory plan printed at startup.
#[derive(Clone, Debug)]
pub struct Sizing {
    pub weight_bytes: u64,
    pub kv_blocks: usize,
    pub kv_bytes: usize,
    pub kv_tokens: usize,
    pub kv_bytes_per_token: usize,
    pub n_ctx: usize,
    pub max_seqs: usize,
    pub max_batch_tokens: usize,
    pub threads: usize,
}

/// State shared between the engine thread and the handlers.
pub struct Shared {
    state: AtomicU8,
    /// Accepted requests not yet admitted into the running batch.
    queued: AtomicUsize,
    pub queue_size: usize,
    pub metrics: Mutex<Metrics>,
    pub info: OnceLock<ServedModel>,
    pub load_error: OnceLock<String>,
}

impl Shared {
    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            0 => State::Loading,
            1 => State::Ready,
            2 => State::Draining,
            _ => State::Failed,
        }
    }

    fn set_state(&self, s: State) {
        self.state.store(s as u8, Ordering::Release);
    }

    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    pub fn metrics(&self) -> std::sync::MutexGuard<'_, Metrics> {
        // A panic elsewhere never leaves the metrics half-updated in a way that matters.
        self.metrics.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn count(&self, o: Outcome) {
        self.metrics().count(o);
    }
}

/// Picks tenants by label.
pub type TenantFilter = Box<dyn Fn(&str) -> bool + Send>;

enum Msg {
    Submit(Box<GenRequest>),
    /// Forget cached prefixes: every tenant's (None), or those of the tenants a filter
    /// picks by label.
    ResetPrefixCache(Option<TenantFilter>),
    Stop,
}

pub struct Engine {
    tx: Mutex<std_mpsc::Sender<Msg>>,
    pub shared: Arc<Shared>,
    /// The model name or path the engine was started with (a request's `model` may say
    /// it).
    pub model_name: String,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Starts the engine thread, which loads the model (state `Loading`) and then serves.
    pub fn start(cfg: EngineConfig) -> Engine {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(State::Loading as u8),
            queued: AtomicUsize::new(0),
            queue_size: cfg.queue_size,
            metrics: Mutex::new(Metrics::default()),
            info: OnceLock::new(),
            load_error: OnceLock::new(),
        });
        let (tx, rx) = std_mpsc::channel();
        let sh = shared.clone();
        let model_name = cfg.model.clone();
        let thread = std::thread::Builder::new()
            .name("rserve-engine".into())
            .spawn(move || {
                let guard = FailOnExit(sh.clone());
                engine_main(cfg, &sh, rx);
                std::mem::forget(guard);
            })
            .expect("spawn engine thread");
        Engine {
            tx: Mutex::new(tx),
            shared,
            model_name,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Admission control: accepts the request into the queue, or says why not (503 while
    /// loading, draining or failed; 429 when the queue is full).
    pub fn submit(&self, req: GenRequest) -> Result<(), ApiError> {
        match self.shared.state() {
            State::Ready => {}
            State::Loading => {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 5 },
                    "the model is still loading",
                ))
            }
            State::Draining => {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 5 },
                    "the server is shutting down",
                ))
            }
            State::Failed => {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 30 },
                    "the engine is not running",
                ))
            }
        }
        let cap = self.shared.queue_size;
        if self
            .shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < cap).then_some(q + 1)
            })
            .is_err()
        {
            return Err(ApiError::new(
                ApiErrorKind::Overloaded { retry_after_s: 1 },
                format!("the server is busy: {cap} requests are already waiting; retry later"),
            ));
        }
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.send(Msg::Submit(Box::new(req))).is_err() {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::new(
                ApiErrorKind::Unavailable { retry_after_s: 30 },
                "the engine is not running",
            ));
        }
        Ok(())
    }

    /// Forgets every cached prefix (blocks in use stay with their sequences). Takes effect
    /// before any request submitted after this call.
    pub fn reset_prefix_cache(&self) -> bool {
        self.send(Msg::ResetPrefixCache(None))
    }

    /// Forgets the cached prefixes that tenants whose label `only` accepts published
    /// (blocks in use stay with their sequences); other tenants' caches are untouched.
    pub fn reset_tenant_prefix_cache(&self, only: TenantFilter) -> bool {
        self.send(Msg::ResetPrefixCache(Some(only)))
    }

    fn send(&self, m: Msg) -> bool {
        self.tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(m)
            .is_ok()
    }

    /// Stops taking requests (submit answers 503) without stopping the engine.
    pub fn begin_drain(&self) {
        if self.shared.state() == State::Ready {
            self.shared.set_state(State::Draining);
        }
    }

    /// Stops the engine thread (requests still inside get a 503 error) and joins it.
    pub fn stop(&self) {
        self.begin_drain();
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Msg::Stop);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// Marks the engine failed if its thread ends by panic (handlers then answer 503 and
/// waiting handlers see their channels close).
struct FailOnExit(Arc<Shared>);

impl Drop for FailOnExit {
    fn drop(&mut self) {
        self.0.set_state(State::Failed);
    }
}

/// What the engine thread owns once the model is loaded and the KV cache sized.
struct Prepared {
    model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    kv: KvCache,
    n_ctx: usize,
    sizing: Sizing,
    spec: Option<Speculator>,
}

fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Sizes the context and KV cache: explicit settings win; by default the cache holds
/// `max_seqs` full contexts, capped at 40% of available memory, and never less than one.
pub fn plan_sizing(
    cfg: &EngineConfig,
    n_ctx_train: usize,
    bytes_per_block: usize,
    mem_available: Option<u64>,
) -> Result<(usize, usize), String> {
    let n_ctx = cfg.n_ctx.unwrap_or(n_ctx_train.min(4096));
    if n_ctx < 2 {
        return Err(format!("context {n_ctx} is too small"));
    }
    let one_ctx = n_ctx.div_ceil(BLOCK_SIZE);
    let blocks = match (cfg.kv_blocks, cfg.kv_mem_bytes) {
        (Some(b), _) => b,
        (None, Some(m)) => (m / bytes_per_block as u64) as usize,
        (None, None) => {
            let want = one_ctx * cfg.max_seqs.max(1);
            let cap = mem_available.unwrap_or(8 << 30) * 2 / 5 / bytes_per_block as u64;
            want.min(cap as usize).max(one_ctx)
        }
    };
    if blocks < one_ctx {
        return Err(format!(
            "a KV cache of {blocks} blocks ({} tokens) cannot hold one full context of {n_ctx} \
             tokens; raise --kv-blocks / --kv-mem or lower -c",
            blocks * BLOCK_SIZE
        ));
    }
    Ok((n_ctx, blocks))
}

fn load(cfg: &EngineConfig) -> anyhow::Result<(Prepared, ServedModel)> {
    let runtime::Loaded {
        path,
        file,
        tokenizer,
        mut model,
    } = {
        // The device cache mirrors the KV pool's slots, so offload waits until the pool
        // is sized (below).
        let mut opts = cfg.run.clone();
        opts.offload.n_gpu_layers = 0;
        let ctx = runtime::ContextSize {
            n_ctx: cfg.n_ctx,
            kv_slots: 0,
        };
        runtime::ModelFile::open(&cfg.model)?.load_with(&opts, ctx)?
    };
    if cfg.run.numa.is_some() {
        // Refuse a thread placement that cannot be honoured before serving anything.
        let topo = runtime::numa::Topology::read()?;
        runtime::numa::plan_threads(
            &topo,
            cfg.run.numa,
            cfg.run.threads.max(1),
            runtime::numa::current_cpu(),
        )?;
    }
    let template = ChatTemplate::from_gguf_or(&file, cfg.chat_template.clone());
    let bytes_per_block = model.kv_layout(BLOCK_SIZE, BLOCK_SIZE).total_bytes();
    let (n_ctx, blocks) = plan_sizing(
        cfg,
        model.config.n_ctx_train,
        bytes_per_block,
        mem_available(),
    )
    .map_err(anyhow::Error::msg)?;
    if n_ctx > model.config.n_ctx_train {
        eprintln!(
            "rserve: warning: context {n_ctx} is beyond the model's training context of {}",
            model.config.n_ctx_train
        );
    }
    let layout = model.kv_layout(blocks * BLOCK_SIZE, BLOCK_SIZE);
    if cfg.run.offload.n_gpu_layers > 0 && cfg.kv_persist.is_some() {
        anyhow::bail!(
            "--kv-persist with -ngl > 0 is not supported yet: the persisted prefix cache holds \
             the CPU cache's rows, not the device's"
        );
    }
    if cfg.run.offload.n_gpu_layers > 0 {
        // The device cache mirrors the pool's slots, so it is sized now that they are.
        let m = std::sync::Arc::get_mut(&mut model).expect("the model is not shared yet");
        eprintln!(
            "rserve: offloading {} layers to {} ...",
            cfg.run.offload.n_gpu_layers.min(m.config.n_layer),
            cfg.run.offload.devices_named()
        );
        m.offload(
            &cfg.run.offload,
            blocks * BLOCK_SIZE,
            cfg.run.threads.max(1),
            &mut |_, _| {},
        )?;
        if let Some(d) = m.device_layers() {
            eprintln!("rserve: offload: {}", d.summary());
        }
    }
    let sizing = Sizing {
        weight_bytes: model.weight_bytes(),
        kv_blocks: layout.n_blocks,
        kv_bytes: layout.total_bytes(),
        kv_tokens: layout.capacity_tokens(),
        kv_bytes_per_token: layout.bytes_per_token(),
        n_ctx,
        max_seqs: cfg.max_seqs,
        max_batch_tokens: cfg.max_batch_tokens.max(cfg.max_seqs),
        threads: cfg.run.threads.max(1),
    };
    let kv = KvCache::new(layout);
    let spec = match &cfg.spec {
        None => None,
        Some(sc) => Some(speculator(
            sc,
            &cfg.run,
            &tokenizer,
            model.config.n_vocab,
            n_ctx,
        )?),
    };
    let id = if path.to_string_lossy() == cfg.model || cfg.model.ends_with(".gguf") {
        path.file_stem()
            .map_or(cfg.model.clone(), |s| s.to_string_lossy().into_owned())
    } else {
        cfg.model.clone()
    };
    let info = ServedModel {
        id,
        path: path.clone(),
        tokenizer: tokenizer.clone(),
        template,
        n_ctx,
        n_vocab: model.config.n_vocab,
        n_embd: model.config.n_embd,
        pooling: cfg.pooling.unwrap_or(model.config.pooling),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        sizing: sizing.clone(),
    };
    Ok((
        Prepared {
            model,
            tokenizer,
            kv,
            n_ctx,
            sizing,
            spec,
        },
        info,
    ))
}

/// The server's proposer: prompt lookup, or a draft model on the CPU whose cache holds a
/// context for each sequence that may draft at once.
fn speculator(
    sc: &SpecConfig,
    run: &runtime::RunOptions,
    tokenizer: &Tokenizer,
    target_vocab: usize,
    n_ctx: usize,
) -> anyhow::Result<Speculator> {
    let Some(name) = &sc.draft_model else {
        return Ok(Speculator::lookup(sc.params));
    };
    let seqs = sc.max_running.saturating_sub(1).max(1);
    let d = runtime::speculative::load_draft_model(
        name,
        tokenizer,
        target_vocab,
        run,
        n_ctx,
        seqs * n_ctx,
    )
    .map_err(anyhow::Error::msg)?;
    eprintln!(
        "rserve: draft model {name} ({} layers), cache for {seqs} sequences of {n_ctx} tokens",
        d.n_layer()
    );
    Ok(Speculator {
        params: sc.params,
        proposer: Proposer::Model(Box::new(d)),
    })
}

/// Hashes the model file, loads the persisted prefix cache into `kv`, starts the writer.
fn open_persist(
    pc: &crate::persist::PersistConfig,
    model_path: &std::path::Path,
    kv: &mut KvCache,
    sched: &mut Scheduler,
) -> anyhow::Result<crate::persist::Persist> {
    let t0 = Instant::now();
    let sha = runtime::registry::sha256_file(model_path)
        .map_err(|e| anyhow::anyhow!("cannot hash {}: {e}", model_path.display()))?;
    let (p, n) =
        crate::persist::Persist::open(pc.clone(), &sha, kv, |k, t| sched.note_published(k, t))?;
    eprintln!(
        "rserve: kv-persist: {}: loaded {n} cached blocks ({} tokens) in {:.1}s (model sha256 {}..)",
        pc.dir.display(),
        n * BLOCK_SIZE,
        t0.elapsed().as_secs_f64(),
        &sha[..12]
    );
    Ok(p)
}

const MIB: f64 = 1024.0 * 1024.0;

/// Which rows of chunk `it` the forward pass keeps: the last row of a chunk that ends its
/// prompt (its logits, or a last-token embedding), every row of an embedding pooled over
/// positions.
fn row_kind(active: &HashMap<SeqId, Active<'_>>, it: &crate::scheduler::PlanItem) -> Logits {
    if it.draft > 0 {
        // A decode with a draft: a row for the last sampled token and each draft token.
        return Logits::All;
    }
    use runtime::model::Pooling;
    match active
        .get(&it.seq)
        .and_then(|a| a.embed.as_ref())
        .map(|e| e.pooling)
    {
        Some(Pooling::Mean) => Logits::All,
        Some(Pooling::Cls) if it.start == 0 => Logits::All,
        _ if it.logits => Logits::Last,
        _ => Logits::None,
    }
}

fn engine_main(cfg: EngineConfig, shared: &Arc<Shared>, rx: std_mpsc::Receiver<Msg>) {
    let t0 = Instant::now();
    let (mut loaded, info) = match load(&cfg) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("rserve: failed to load {}: {e:#}", cfg.model);
            let _ = shared.load_error.set(format!("{e:#}"));
            shared.set_state(State::Failed);
            // Answer anything that raced in, then exit.
            while let Ok(m) = rx.try_recv() {
                if let Msg::Submit(r) = m {
                    shared.queued.fetch_sub(1, Ordering::AcqRel);
                    let _ = r.events.send(Event::Error(ApiError::new(
                        ApiErrorKind::Unavailable { retry_after_s: 30 },
                        "the model failed to load",
                    )));
                }
            }
            return;
        }
    };
    let s = &loaded.sizing;
    eprintln!(
        "rserve: loaded {} ({}) in {:.1}s\n\
         rserve: model memory {:.1} MiB (weights, memory-mapped)\n\
         rserve: KV cache memory {:.1} MiB: {} blocks of {} tokens = {} tokens ({:.1} KiB/token)\n\
         rserve: per-sequence context {} tokens, up to {} sequences, {} tokens per step ({}), \
         prefix caching {}, {} threads, queue {}",
        info.id,
        info.path.display(),
        t0.elapsed().as_secs_f64(),
        s.weight_bytes as f64 / MIB,
        s.kv_bytes as f64 / MIB,
        s.kv_blocks,
        BLOCK_SIZE,
        s.kv_tokens,
        s.kv_bytes_per_token as f64 / 1024.0,
        s.n_ctx,
        s.max_seqs,
        s.max_batch_tokens,
        if cfg.chunked_prefill {
            "chunked prefill"
        } else {
            "whole prompts"
        },
        if cfg.prefix_caching { "on" } else { "off" },
        s.threads,
        cfg.queue_size,
    );
    {
        let mut m = shared.metrics();
        m.kv_blocks_total = s.kv_blocks;
        m.kv_blocks_free = s.kv_blocks;
    }
    let path = info.path.clone();
    let _ = shared.info.set(info);
    let pool = ThreadPool::with_options(
        loaded.sizing.threads,
        runtime::pool::PoolOptions {
            pin: cfg.run.pin,
            numa: cfg.run.numa,
        },
    );
    if cfg.run.numa.is_some() || cfg.run.weights != runtime::numa::WeightPlacement::FirstTouch {
        let pages: Vec<String> = loaded
            .model
            .weight_pages()
            .iter()
            .map(|(n, p)| match n {
                Some(n) => format!("copy on node {n}: {}", p.summary()),
                None => p.summary(),
            })
            .collect();
        eprintln!(
            "rserve: numa {}: thread nodes {:?}, CPUs {:?}; weights {} ({})",
            cfg.run.numa.map_or("(none)", |m| m.name()),
            pool.thread_nodes(),
            pool.pinned_cpus(),
            cfg.run.weights,
            pages.join("; ")
        );
    }
    let sched = Scheduler::new(SchedulerConfig {
        max_seqs: loaded.sizing.max_seqs,
        max_batch_tokens: loaded.sizing.max_batch_tokens,
        chunked_prefill: cfg.chunked_prefill,
        prefix_caching: cfg.prefix_caching,
    });
    let mut sched = sched;
    let persist = match &cfg.kv_persist {
        None => None,
        Some(_) if !cfg.prefix_caching => {
            eprintln!("rserve: --kv-persist needs the prefix cache (drop --no-prefix-cache)");
            let _ = shared
                .load_error
                .set("--kv-persist needs the prefix cache".into());
            shared.set_state(State::Failed);
            return;
        }
        Some(pc) => match open_persist(pc, &path, &mut loaded.kv, &mut sched) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("rserve: --kv-persist: {e:#}");
                let _ = shared.load_error.set(format!("--kv-persist: {e:#}"));
                shared.set_state(State::Failed);
                return;
            }
        },
    };
    let tokenizer = loaded.tokenizer.clone();
    let mut run = BatchLoop {
        tok: &tokenizer,
        model: &loaded.model,
        kv: &mut loaded.kv,
        ws: Workspace::default(),
        pool: &pool,
        n_ctx: loaded.n_ctx,
        sched,
        active: HashMap::new(),
        next_id: 1,
        shared,
        token_index: None,
        mask: Vec::new(),
        persist,
        spec: loaded.spec.take(),
        spec_max_running: cfg.spec.as_ref().map_or(0, |s| s.max_running),
        draft: Vec::new(),
    };
    shared.set_state(State::Ready);
    run.serve(&rx);
}

/// Per-request state the scheduler does not need.
struct Active<'t> {
    params: GenParams,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    events: mpsc::UnboundedSender<Event>,
    arrival: Instant,
    admitted: bool,
    last_token_at: Option<Instant>,
    n_sampled: usize,
    /// Where the output stands in its `response_format`.
    constraint: Option<JsonMachine>,
    /// The request's choices, for its one outcome.
    tally: Arc<crate::metrics::Tally>,
    /// An embedding request's hidden states so far.
    embed: Option<Embedding>,
}

/// An embedding being gathered from the hidden states of its prompt's positions.
struct Embedding {
    pooling: runtime::model::Pooling,
    /// Mean: every position's row (`n_prompt x d`, rewritten if the prompt is computed
    /// again after a preemption); Cls and Last: the one row needed.
    rows: Vec<f32>,
}

impl Embedding {
    /// Hidden row `h` of position `pos` of a prompt of `n` tokens.
    fn take(&mut self, pos: usize, n: usize, h: &[f32]) {
        use runtime::model::Pooling;
        let d = h.len();
        match self.pooling {
            Pooling::Mean => {
                self.rows.resize(n * d, 0.0);
                self.rows[pos * d..(pos + 1) * d].copy_from_slice(h);
            }
            Pooling::Cls if pos == 0 => self.rows = h.to_vec(),
            Pooling::Last if pos + 1 == n => self.rows = h.to_vec(),
            _ => {}
        }
    }

    /// The pooled vector, L2-normalized (as llama-server's /v1/embeddings returns it).
    fn finish(&self, n: usize) -> Vec<f32> {
        let mut v: Vec<f32> = match self.pooling {
            runtime::model::Pooling::Mean => {
                let d = self.rows.len() / n.max(1);
                let mut sum = vec![0f64; d];
                for r in self.rows.chunks_exact(d.max(1)) {
                    sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
                }
                sum.iter().map(|s| (s / n as f64) as f32).collect()
            }
            _ => self.rows.clone(),
        };
        let norm = v
            .iter()
            .map(|&x| (x as f64) * (x as f64))
            .sum::<f64>()
            .sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
        }
        v
    }
}

impl Active<'_> {
    /// At the end of generation: the text the decoder and the stop matcher still hold,
    /// and whether a stop string completed inside it.
    fn drain_tail(&mut self) -> (String, bool) {
        let tail = self.decoder.finish();
        let (mut text, stopped) = self.stop.push(&tail);
        if !stopped {
            text.push_str(&self.stop.flush());
        }
        (text, stopped)
    }
}

/// The chosen token's logprob and the `n` most likely alternatives, from raw logits.
fn token_logprobs(tok: &Tokenizer, raw: &[f32], chosen: u32, n: usize) -> TokenLogprobs {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + raw.iter().map(|&v| (v - max).exp()).sum::<f32>().ln();
    let entry = |id: u32| {
        let bytes = tok.token_to_piece(id, false);
        TopLogprob {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob: raw[id as usize] - lse,
        }
    };
    let mut idx: Vec<u32> = (0..raw.len() as u32).collect();
    let by_desc = |a: &u32, b: &u32| raw[*b as usize].total_cmp(&raw[*a as usize]).then(a.cmp(b));
    let n = n.min(idx.len());
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by_desc);
    }
    idx.truncate(n);
    idx.sort_unstable_by(by_desc);
    TokenLogprobs {
        chosen: entry(chosen),
        top: idx.into_iter().map(entry).collect(),
    }
}

/// The batch loop's state on the engine thread: model, cache, scheduler and the active
/// requests' streams.
struct BatchLoop<'a> {
    tok: &'a Tokenizer,
    model: &'a Model,
    kv: &'a mut KvCache,
    ws: Workspace,
    pool: &'a ThreadPool,
    n_ctx: usize,
    sched: Scheduler,
    active: HashMap<SeqId, Active<'a>>,
    next_id: SeqId,
    shared: &'a Shared,
    /// The vocabulary's token trie for constraint masks, built on the first constrained
    /// request.
    token_index: Option<TokenIndex>,
    /// Scratch: the current constraint mask, a bit per token.
    mask: Vec<u64>,
    /// The on-disk copy of the prefix cache, with --kv-persist.
    persist: Option<crate::persist::Persist>,
    /// Speculative decoding's proposer, with --spec.
    spec: Option<Speculator>,
    /// Drafting pauses from this many running sequences on.
    spec_max_running: usize,
    /// Scratch: one sequence's draft.
    draft: Vec<u32>,
}

/// Samples from `logits` with every token outside `mask` (a bit per token) removed first,
/// so the sampler's distribution is the model's conditioned on the constraint; nothing
/// is sampled twice. None when the mask allows no token.
fn sample_masked(sampler: &mut Sampler, logits: &mut [f32], mask: &[u64]) -> Option<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (w, chunk) in logits.chunks_mut(64).enumerate() {
        let bits = mask[w];
        for (j, l) in chunk.iter_mut().enumerate() {
            if bits >> j & 1 == 0 {
                *l = f32::NEG_INFINITY;
            } else if best.is_none_or(|b| *l > b.1) {
                best = Some(((w * 64 + j) as u32, *l));
            }
        }
    }
    let (fallback, _) = best?;
    let t = sampler.sample(logits);
    // Rounding in the sampler's cumulative sum can leave it on a removed token (its last
    // candidate); the most likely allowed token stands in.
    let allowed = mask
        .get(t as usize / 64)
        .is_some_and(|w| w >> (t % 64) & 1 == 1);
    Some(if allowed { t } else { fallback })
}

impl<'a> BatchLoop<'a> {
    fn serve(&mut self, rx: &std_mpsc::Receiver<Msg>) {
        loop {
            // Block only when there is nothing to compute.
            if self.sched.is_idle() {
                let msg = match self.persist.as_ref().and_then(|p| p.wait_hint()) {
                    None => rx
                        .recv()
                        .map_err(|_| std_mpsc::RecvTimeoutError::Disconnected),
                    Some(d) => rx.recv_timeout(d),
                };
                match msg {
                    Ok(Msg::Submit(r)) => self.accept(*r),
                    Ok(Msg::ResetPrefixCache(only)) => self.reset_cache(only),
                    Ok(Msg::Stop) | Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
            let mut stop = false;
            loop {
                match rx.try_recv() {
                    Ok(Msg::Submit(r)) => self.accept(*r),
                    Ok(Msg::ResetPrefixCache(only)) => self.reset_cache(only),
                    Ok(Msg::Stop) => stop = true,
                    Err(std_mpsc::TryRecvError::Empty) => break,
                    Err(std_mpsc::TryRecvError::Disconnected) => {
                        stop = true;
                        break;
                    }
                }
            }
            if stop {
                break;
            }
            self.drop_cancelled();
            if !self.sched.is_idle() {
                self.step();
            }
            if self.persist.as_mut().is_some_and(|p| p.due()) {
                let sched = &self.sched;
                if let Some(p) = self.persist.as_mut() {
                    p.write_new(self.kv, |k| sched.tenant_of(k).cloned());
                }
            }
            self.update_gauges();
        }
        // Shutdown: whatever is still inside gets an explicit error.
        for id in self.sched.ids() {
            self.end_with_error(
                id,
                ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 5 },
                    "the server is shutting down",
                ),
                Outcome::Unavailable,
            );
        }
        while let Ok(m) = rx.try_recv() {
            if let Msg::Submit(r) = m {
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                self.shared
                    .metrics()
                    .end_choice(Outcome::Unavailable, &r.tally);
                let _ = r.events.send(Event::Error(ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 5 },
                    "the server is shutting down",
                )));
            }
        }
        self.update_gauges();
        if let Some(mut p) = self.persist.take() {
            let sched = &self.sched;
            p.finish(self.kv, |k| sched.tenant_of(k).cloned());
        }
    }

    fn reset_cache(&mut self, only: Option<TenantFilter>) {
        match only {
            None => self.kv.clear_prefix_cache(),
            Some(f) => {
                let n = self.sched.forget_tenant_prefixes(self.kv, |t| f(t));
                eprintln!("rserve: reset_prefix_cache: {n} cached blocks of one tenant dropped");
            }
        }
    }

    fn accept(&mut self, r: GenRequest) {
        let embed = r.params.embed;
        let constraint = r.params.format.as_ref().map(|f| f.start());
        let needs_index = constraint.is_some();
        let id = self.next_id;
        self.next_id += 1;
        let mut sampler = Sampler::new(r.params.sampling.clone());
        for &t in &r.prompt {
            sampler.accept(t);
        }
        let skip_special = !r.params.special_text;
        self.active.insert(
            id,
            Active {
                stop: StopMatcher::new(r.params.stop.clone()),
                params: r.params,
                sampler,
                decoder: StreamDecoder::new(self.tok, skip_special),
                events: r.events,
                arrival: r.arrival,
                admitted: false,
                last_token_at: None,
                n_sampled: 0,
                constraint,
                tally: r.tally,
                embed: embed.map(|pooling| Embedding {
                    pooling,
                    rows: Vec::new(),
                }),
            },
        );
        if needs_index && self.token_index.is_none() {
            let tok = self.tok;
            let t0 = Instant::now();
            let pieces: Vec<Option<Vec<u8>>> = (0..tok.n_vocab() as u32)
                .map(|t| (!tok.is_control(t)).then(|| tok.token_to_piece(t, false)))
                .collect();
            let idx = TokenIndex::new(&pieces, |t| tok.is_eog(t));
            eprintln!(
                "rserve: constraint token trie: {} nodes ({} outside plain string content), \
                 built in {:.0} ms",
                idx.cost_bound(),
                idx.special_nodes(),
                t0.elapsed().as_secs_f64() * 1e3
            );
            self.shared.metrics().constraint_trie_nodes = idx.cost_bound() as u64;
            self.token_index = Some(idx);
        }
        let mut e = SeqEntry::new(id, r.prompt).in_tenant(r.tenant.root, &r.tenant.label);
        // Mean and CLS pooling read positions a cached prefix would skip.
        if embed.is_some_and(|p| p != runtime::model::Pooling::Last) {
            e = e.without_prefix_reuse();
        }
        self.sched.add(e);
    }

    /// Frees at once every sequence whose client went away.
    fn drop_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .active
            .iter()
            .filter(|(_, a)| a.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.remove(id, Outcome::Cancelled);
        }
    }

    fn remove(&mut self, id: SeqId, outcome: Outcome) -> Option<(SeqEntry, Active<'a>)> {
        let e = self.sched.remove(id, self.kv);
        if let Some(s) = self.spec.as_mut() {
            s.forget(id);
        }
        let a = self.active.remove(&id)?;
        if !a.admitted {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        self.shared.metrics().end_choice(outcome, &a.tally);
        Some((e?, a))
    }

    fn end_with_error(&mut self, id: SeqId, err: ApiError, outcome: Outcome) {
        if let Some((_, a)) = self.remove(id, outcome) {
            let _ = a.events.send(Event::Error(err));
        }
    }

    /// Gives each sequence about to decode a draft (speculative decoding), unless the
    /// batch is full enough that drafts would only slow the others down, or prompt
    /// tokens are waiting: drafts use spare compute, never a prompt's (time to first
    /// token stays what it is without them).
    fn propose_drafts(&mut self) {
        let Some(spec) = self.spec.as_mut() else {
            return;
        };
        if self.sched.n_running() >= self.spec_max_running || self.sched.prefill_pending() {
            // A draft left from a step that could not carry it waits no longer.
            self.sched.drop_drafts();
            return;
        }
        for id in self.sched.ids() {
            let (Some(e), Some(a)) = (self.sched.get(id), self.active.get(&id)) else {
                continue;
            };
            let len = e.verified_len();
            if !self.sched.is_running(id) || e.n_computed + 1 != len || a.embed.is_some() {
                continue;
            }
            // Each step emits at most the draft plus one token; never past max_tokens or
            // the context.
            let cap = a.params.spec_max.unwrap_or(usize::MAX);
            let room = a
                .params
                .max_tokens
                .saturating_sub(a.n_sampled + 1)
                .min(self.n_ctx.saturating_sub(len))
                .min(cap);
            if room == 0 {
                continue;
            }
            let history = &e.tokens[..len];
            if let Err(err) = spec.propose(self.pool, id, history, room, &mut self.draft) {
                eprintln!("rserve: draft model failed, drafting stops: {err}");
                self.spec = None;
                return;
            }
            self.sched.set_draft(id, &self.draft);
        }
    }

    fn step(&mut self) {
        self.propose_drafts();
        let plan = self.sched.schedule(self.kv);
        let now = Instant::now();
        {
            let mut m = self.shared.metrics();
            m.preemptions += plan.preempted.len() as u64;
            for &id in &plan.admitted {
                let (Some(a), Some(e)) = (self.active.get_mut(&id), self.sched.get(id)) else {
                    continue;
                };
                if !a.admitted {
                    a.admitted = true;
                    self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                    m.prompt_tokens += e.n_prompt as u64;
                    m.prefix_cache_queries += e.n_prompt as u64;
                    m.prefix_cache_hits += e.cached_tokens as u64;
                    m.queue_time
                        .observe(now.duration_since(a.arrival).as_secs_f64());
                }
            }
        }
        if plan.items.is_empty() {
            // Nothing runnable (cannot happen with work queued, by the scheduler's progress
            // guarantee); never spin hot if it does.
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        }
        let batch: Vec<SeqBatch<'_>> = plan
            .items
            .iter()
            .map(|it| {
                let e = self.sched.get(it.seq).expect("planned sequence exists");
                SeqBatch {
                    seq: it.seq,
                    tokens: &e.tokens[it.start..it.start + it.len],
                    logits: row_kind(&self.active, it),
                    // llama.cpp's split of the whole prompt for prompt tokens (however
                    // they were chunked or cached), one micro-batch per generated token:
                    // see SeqBatch::ubatch.
                    ubatch: if it.start >= e.n_prompt {
                        // Alone: a draft's rows are bit for bit plain decoding's.
                        UBatch::Alone
                    } else {
                        UBatch::Prompt {
                            len: e.n_prompt,
                            size: LLAMA_N_UBATCH,
                        }
                    },
                }
            })
            .collect();
        let res = self
            .model
            .forward(&batch, self.kv, &mut self.ws, self.pool, self.n_ctx);
        drop(batch);
        self.shared.metrics().steps += 1;
        if let Err(e) = res {
            // A bug, not a capacity problem (the plan fits by construction): fail the
            // sequences of this batch loudly and keep serving the others.
            eprintln!("rserve: forward pass failed: {e}");
            for it in &plan.items {
                self.end_with_error(
                    it.seq,
                    ApiError::new(ApiErrorKind::Internal, format!("forward pass failed: {e}")),
                    Outcome::Error,
                );
            }
            return;
        }
        let published = self.sched.complete(&plan, self.kv);
        if let Some(p) = self.persist.as_mut() {
            p.published(published);
        }
        // The load a router reads (`/get_load`, `/metrics`) as of this step's cache, before
        // its tokens reach the clients: a client that saw its first token and then asked
        // read the previous step's count (a 300-token prompt's first chunk of 256).
        self.update_gauges();
        let nv = self.model.config.n_vocab;
        let mut r = 0;
        for it in &plan.items {
            let rows = match row_kind(&self.active, it) {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => it.len,
            };
            if self.active.get(&it.seq).is_some_and(|a| a.embed.is_some()) {
                self.on_hidden(it, r, rows);
            } else if it.draft > 0 {
                self.on_draft_logits(it, r);
            } else if rows > 0 {
                self.on_logits(it.seq, r * nv..(r + 1) * nv);
            }
            r += rows;
        }
    }

    /// An embedding request's hidden rows `r..r + rows` of the step, for the chunk `it`;
    /// at the prompt's end, its vector.
    fn on_hidden(&mut self, it: &crate::scheduler::PlanItem, r: usize, rows: usize) {
        let Some(n) = self.sched.get(it.seq).map(|e| e.n_prompt) else {
            return;
        };
        let Some(acc) = self.active.get_mut(&it.seq).and_then(|a| a.embed.as_mut()) else {
            return;
        };
        for k in 0..rows {
            // A Last row is the chunk's last position; All rows are every position.
            let pos = it.start + it.len - rows + k;
            match self.ws.hidden(r + k) {
                Some(h) => acc.take(pos, n, h),
                None => {
                    let e = ApiError::new(
                        ApiErrorKind::InvalidRequest,
                        "embeddings need the output layer on the CPU (this server offloads it: start it with a lower -ngl)",
                    );
                    self.end_with_error(it.seq, e, Outcome::Invalid);
                    return;
                }
            }
        }
        if it.logits {
            let vector = acc.finish(n);
            if let Some((e, a)) = self.remove(it.seq, Outcome::Stop) {
                let usage = Usage {
                    prompt_tokens: e.n_prompt,
                    completion_tokens: 0,
                    cached_tokens: e.cached_tokens,
                };
                self.shared
                    .metrics()
                    .e2e
                    .observe(a.arrival.elapsed().as_secs_f64());
                let _ = a.events.send(Event::Embedding { vector, usage });
            }
        }
    }

    fn on_logits(&mut self, id: SeqId, rows: std::ops::Range<usize>) {
        let n_tokens = self.sched.get(id).map_or(0, |e| e.tokens.len()) + 1;
        if let Some(t) = self.sample_row(id, rows, n_tokens) {
            self.sched.append_token(id, t);
        }
    }

    /// A decode that carried a draft: rows `r..` of the step are the logits after the
    /// last sampled token and after each draft token. Tokens are drawn row by row, as
    /// plain decoding would draw them, while they equal the draft; the first that does
    /// not (or the one after the whole draft) ends the step, and the rejected draft
    /// tokens leave the sequence and the cache.
    fn on_draft_logits(&mut self, it: &crate::scheduler::PlanItem, r: usize) {
        let nv = self.model.config.n_vocab;
        let id = it.seq;
        let Some(e) = self.sched.get(id) else {
            return;
        };
        let verified = e.verified_len();
        let draft: Vec<u32> = e.tokens[verified..].to_vec();
        debug_assert_eq!(draft.len(), it.draft);
        let mut accepted = 0;
        for k in 0..=draft.len() {
            let row = (r + k) * nv..(r + k + 1) * nv;
            // Tokens after this one: the verified ones, the drafts agreed so far, it.
            let Some(t) = self.sample_row(id, row, verified + k + 1) else {
                // Finished (stop, length, error): the sequence is gone.
                self.count_draft(draft.len(), accepted);
                return;
            };
            if k < draft.len() && t == draft[k] {
                accepted += 1;
                continue;
            }
            self.count_draft(draft.len(), accepted);
            self.sched.resolve_draft(id, accepted, self.kv);
            self.sched.append_token(id, t);
            return;
        }
    }

    fn count_draft(&self, drafted: usize, accepted: usize) {
        let mut m = self.shared.metrics();
        m.spec_drafts += 1;
        m.spec_draft_tokens += drafted as u64;
        m.spec_accepted_tokens += accepted as u64;
    }

    /// Samples the next token of `id` from the logits `rows`, emits it, and returns it
    /// when the sequence goes on (the caller records it); None when it finished here.
    /// `n_tokens` is the sequence's length with this token.
    fn sample_row(
        &mut self,
        id: SeqId,
        rows: std::ops::Range<usize>,
        n_tokens: usize,
    ) -> Option<u32> {
        let now = Instant::now();
        let tok = self.tok;
        let a = self.active.get_mut(&id)?;
        let logits = &mut self.ws.logits[rows];
        // Logprobs are of the model's distribution, before penalties and temperature.
        let raw = a.params.logprobs.map(|_| logits.to_vec());
        for &(t, b) in &a.params.logit_bias {
            logits[t as usize] += b;
        }
        let t = match (a.constraint.as_mut(), &self.token_index) {
            (Some(m), Some(idx)) => {
                let t0 = Instant::now();
                let fed = m.mask(idx, !a.params.ignore_eos, &mut self.mask);
                self.shared
                    .metrics()
                    .observe_mask(fed as u64, t0.elapsed().as_secs_f64());
                match sample_masked(&mut a.sampler, logits, &self.mask) {
                    Some(t) => t,
                    None if m.can_end() => {
                        // A top-level number that cannot grow, with ignore_eos: it is done.
                        let (text, _) = a.drain_tail();
                        self.finish(id, FinishReason::Stop, text);
                        return None;
                    }
                    None => {
                        // Compiled schemas never dead-end; a vocabulary without some
                        // byte could.
                        self.end_with_error(
                            id,
                            ApiError::new(
                                ApiErrorKind::Internal,
                                "no token of this model can continue the response_format output",
                            ),
                            Outcome::Error,
                        );
                        return None;
                    }
                }
            }
            _ => a.sampler.sample(logits),
        };
        a.n_sampled += 1;
        {
            let mut m = self.shared.metrics();
            m.generation_tokens += 1;
            match a.last_token_at {
                None => m.ttft.observe(now.duration_since(a.arrival).as_secs_f64()),
                Some(prev) => m.itl.observe(now.duration_since(prev).as_secs_f64()),
            }
        }
        a.last_token_at = Some(now);
        if tok.is_eog(t) && !a.params.ignore_eos {
            let (text, _) = a.drain_tail();
            self.finish(id, FinishReason::Stop, text);
            return None;
        }
        a.sampler.accept(t);
        let mut format_done = false;
        if let Some(m) = a.constraint.as_mut() {
            let ok = m.push(&tok.token_to_piece(t, false));
            debug_assert!(ok, "a sampled token is always allowed");
            format_done = m.is_complete();
        }
        let piece = a.decoder.push(t);
        let (text, stopped) = a.stop.push(&piece);
        let logprobs = a
            .params
            .logprobs
            .zip(raw)
            .map(|(n, raw)| token_logprobs(tok, &raw, t, n));
        let _ = a.events.send(Event::Token {
            id: t,
            text,
            logprobs,
        });
        if stopped {
            self.finish(id, FinishReason::Stop, String::new());
            return None;
        }
        if format_done {
            // The response_format value is complete: nothing may follow it.
            let (text, _) = a.drain_tail();
            self.finish(id, FinishReason::Stop, text);
            return None;
        }
        let full = n_tokens > self.n_ctx;
        if a.n_sampled >= a.params.max_tokens || full {
            let (text, stopped) = a.drain_tail();
            let reason = if stopped {
                FinishReason::Stop
            } else if full {
                FinishReason::Context
            } else {
                FinishReason::Length
            };
            self.finish(id, reason, text);
            return None;
        }
        Some(t)
    }

    fn finish(&mut self, id: SeqId, reason: FinishReason, text: String) {
        let outcome = match reason {
            FinishReason::Stop => Outcome::Stop,
            FinishReason::Length | FinishReason::Context => Outcome::Length,
        };
        let Some((e, a)) = self.remove(id, outcome) else {
            return;
        };
        let usage = Usage {
            prompt_tokens: e.n_prompt,
            completion_tokens: a.n_sampled,
            cached_tokens: e.cached_tokens,
        };
        self.shared
            .metrics()
            .e2e
            .observe(a.arrival.elapsed().as_secs_f64());
        let _ = a.events.send(Event::Done {
            text,
            finish: reason,
            stop: a.stop.matched().map(str::to_string),
            usage,
        });
    }

    fn update_gauges(&mut self) {
        let mut m = self.shared.metrics();
        m.running = self.sched.n_running();
        m.waiting = self.sched.n_waiting();
        m.kv_blocks_used = self.kv.used_blocks();
        m.kv_blocks_free = self.kv.free_blocks();
        m.kv_blocks_cached = self.kv.cached_blocks();
        if let Some(p) = &self.persist {
            m.kv_persist_write_errors = p.write_errors();
            m.kv_persist_blocks_pending = p.pending_blocks() as u64;
        }
        let mut tenants: std::collections::BTreeMap<String, crate::metrics::TenantKv> =
            Default::default();
        for e in self.sched.entries() {
            let t = tenants.entry(e.tenant.to_string()).or_default();
            t.blocks_used += self.kv.seq_blocks(e.id);
            t.tokens_used += e.n_computed;
        }
        for (tenant, n) in self.sched.cached_by_tenant(self.kv) {
            tenants.entry(tenant.to_string()).or_default().blocks_cached = n;
        }
        m.tenants = tenants;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_defaults_and_limits() {
        let cfg = EngineConfig {
            max_seqs: 4,
            ..EngineConfig::default()
        };
        let block = 16 * 1024; // bytes per 16-token block
                               // Default: max_seqs full contexts of min(train, 4096).
        assert_eq!(
            plan_sizing(&cfg, 8192, block, Some(64 << 30)),
            Ok((4096, 4 * 256))
        );
        // Capped at 40% of available memory, but never below one context.
        assert_eq!(
            plan_sizing(&cfg, 8192, block, Some(1000 * block as u64)),
            Ok((4096, 400))
        );
        assert_eq!(
            plan_sizing(&cfg, 8192, block, Some(10 * block as u64)),
            Ok((4096, 256))
        );
        // Explicit sizes win; too small for one context is an error naming both numbers.
        let small = EngineConfig {
            n_ctx: Some(1024),
            kv_blocks: Some(32),
            ..cfg.clone()
        };
        let e = plan_sizing(&small, 8192, block, None).unwrap_err();
        assert!(e.contains("512 tokens") && e.contains("1024"), "{e}");
        let mem = EngineConfig {
            n_ctx: Some(512),
            kv_mem_bytes: Some(100 * block as u64),
            ..cfg
        };
        assert_eq!(plan_sizing(&mem, 8192, block, None), Ok((512, 100)));
    }
}
