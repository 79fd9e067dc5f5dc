//! HTTP: axum routes over the engine, SSE streaming, and a server that starts listening
//! at once (`/health` says 503 while the model loads) and drains on shutdown.
//!
//! Handlers run on a small tokio runtime; they parse and tokenize, then hand the engine a
//! request carrying its own event channel. A client that goes away drops that channel,
//! which the engine notices on its next step and frees the sequence.
//!
//! Against hostile clients: connections are capped below the descriptor limit (beyond
//! the cap a connection gets a 503 at once and is closed); a request's headers, and the
//! wait for the next request on a kept-alive connection, must arrive within
//! `header_timeout`, its body within `body_timeout`; an oversize `Content-Length` is a 413
//! before any body byte is read; the API key is checked before the body is read; POST
//! bodies must be `application/json`; a keyless server checks `Host` against DNS
//! rebinding; /metrics needs the metrics (or admin) key when keys are configured.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Digest as _;
use tokio::sync::{mpsc, watch};

use crate::answer::{Answer, AnswerSplitter, Encoder, End, Pieces};
use crate::api::{self, Kind, RawRequest, ResponseMeta};
use crate::engine::{
    Engine, EngineConfig, Event, GenRequest, ServedModel, State as EngineState, Usage,
};
use crate::error::{ApiError, ApiErrorKind};
use crate::metrics::{Outcome, Tally};
use crate::models::{Lease, Models};
use crate::tenant::{bearer, ApiKeys, Tenant, ADMIN};

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    pub engine: EngineConfig,
    pub max_body_bytes: usize,
    /// Tokio worker threads for HTTP (the engine has its own threads).
    pub http_threads: usize,
    /// How long shutdown waits for in-flight requests before ending them with an error.
    pub drain_timeout: Duration,
    /// Listen for SIGINT / SIGTERM (the binary does; tests do not).
    pub handle_signals: bool,
    /// API keys every route but /health and /metrics requires (None: open).
    pub api_keys: Option<Arc<ApiKeys>>,
    /// The key /metrics requires (besides the `admin` API key); with API keys and no
    /// metrics key, only the admin key reads /metrics.
    pub metrics_key: Option<String>,
    /// How long a client has to send a request's headers, also the longest a kept-alive
    /// connection may sit idle between requests.
    pub header_timeout: Duration,
    /// How long a client has to send a request's body.
    pub body_timeout: Duration,
    /// The most connections open at once (None: from the descriptor limit); always kept
    /// below the limit with headroom for the engine's files.
    pub max_connections: Option<usize>,
    /// Host names a keyless server accepts besides loopback names and IP literals
    /// (against DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// The most Responses API conversations kept for `previous_response_id` (oldest
    /// evicted first; also bounded to 64 MiB of JSON).
    pub responses_store: usize,
    /// More models besides `engine.model`, with the same engine settings: when any are
    /// given, every model loads on first use ([`Models`]).
    pub models: Vec<String>,
    /// With several models: the most bytes (weights + KV cache) loaded at once.
    pub models_memory: Option<u64>,
    /// With several models: how long a request waits for its model to load.
    pub model_load_timeout: Duration,
}

/// The default number of stored Responses conversations.
pub const DEFAULT_RESPONSES_STORE: usize = 256;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            engine: EngineConfig::default(),
            max_body_bytes: 4 << 20,
            http_threads: 2,
            drain_timeout: Duration::from_secs(60),
            handle_signals: false,
            api_keys: None,
            metrics_key: None,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: None,
            allowed_hosts: Vec::new(),
            responses_store: DEFAULT_RESPONSES_STORE,
            models: Vec::new(),
            models_memory: None,
            model_load_timeout: Duration::from_secs(300),
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    /// The served models and their engines.
    pub models: Arc<Models>,
    /// When set, every route but /health and /metrics needs one of these keys.
    pub keys: Option<Arc<ApiKeys>>,
    pub limits: Limits,
    /// Keys the salted tenants' labels are hashed with (random per process).
    label_key: [u8; 32],
    /// Stored Responses conversations for `previous_response_id`.
    responses: Arc<crate::responses::Store>,
}

/// What the middleware and handlers enforce per request.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub body_timeout: Duration,
    /// The /metrics key (its label `metrics`).
    pub metrics_key: Option<Arc<ApiKeys>>,
    /// Check `Host` (a keyless server), accepting these names besides loopback names and
    /// IP literals.
    pub host_check: Option<Arc<Vec<String>>>,
    /// The most Responses API conversations kept for `previous_response_id`.
    pub responses_store: usize,
}

impl Limits {
    pub fn new(max_body_bytes: usize) -> Limits {
        Limits {
            max_body_bytes,
            body_timeout: Duration::from_secs(30),
            metrics_key: None,
            host_check: None,
            responses_store: DEFAULT_RESPONSES_STORE,
        }
    }
}

fn random_key() -> [u8; 32] {
    use std::io::Read;
    let mut k = [0u8; 32];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut k))
        .is_err()
    {
        // No /dev/urandom: a per-process value (labels only need to differ from outside
        // guesses, not to be secret forever).
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let d = sha2::Sha256::digest(format!("{t}{}", std::process::id()).as_bytes());
        k.copy_from_slice(&d);
    }
    k
}

fn key_of(headers: &HeaderMap) -> Option<String> {
    let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    bearer(h("authorization"), h("x-api-key"))
}

impl AppState {
    /// Checks the request's API key where keys are configured: the key's label, None
    /// when the server has no keys, 401 otherwise.
    fn authorize(&self, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
        let Some(keys) = &self.keys else {
            return Ok(None);
        };
        let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        match bearer(h("authorization"), h("x-api-key")) {
            Some(k) => match keys.check(&k) {
                Some(label) => Ok(Some(label.to_string())),
                None => Err(ApiError::new(
                    ApiErrorKind::Unauthorized,
                    "incorrect API key provided",
                )),
            },
            None => Err(ApiError::new(
                ApiErrorKind::Unauthorized,
                "this server needs an API key: send `Authorization: Bearer KEY`",
            )),
        }
    }
}

pub fn router(models: Arc<Models>, max_body_bytes: usize) -> Router {
    router_with_keys(models, Limits::new(max_body_bytes), None)
}

/// [`router`] with API keys required on every route but /health and /metrics.
pub fn router_with_keys(models: Arc<Models>, limits: Limits, keys: Option<Arc<ApiKeys>>) -> Router {
    let st = AppState {
        models,
        keys,
        label_key: random_key(),
        responses: Arc::new(crate::responses::Store::new(
            limits.responses_store,
            crate::responses::DEFAULT_STORE_BYTES,
        )),
        limits,
    };
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/responses", post(responses_create))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(list_models))
        .route("/health", get(health))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        // What a router asks its workers (SGLang's names, the older ones too: worker_info).
        .route("/flush_cache", post(reset_prefix_cache))
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/get_load", get(get_load))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), guard))
        .with_state(st)
}

/// Whether `host` (a Host header) names this machine as a browser page cannot: a loopback
/// name, an IP literal, or an allowed name. A DNS-rebinding page reaches us under its own
/// domain name, which this refuses.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        match rest.split_once(']') {
            Some((ip, _)) => return ip.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        }
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(h, _)| h)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::Ipv4Addr>().is_ok()
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

/// Checks every request before routing: `Host` on a keyless server, a JSON body type on
/// POST, and an announced body no larger than the limit (a 413 at once, nothing read).
async fn guard(State(st): State<AppState>, req: Request, next: Next) -> Response {
    // A generation request refused here still counts once, as a handler's would.
    let path = req.uri().path().to_string();
    let generation = Dialect::of_path(&path).is_some() || path == "/v1/embeddings";
    let refused = |e: ApiError| {
        if generation {
            match st.models.single_engine() {
                Some(engine) => {
                    let mut m = engine.shared.metrics();
                    m.requests_received += 1;
                    m.count(Outcome::Invalid);
                }
                None => st.models.count_unrouted(),
            }
        }
        error_for_path(&path, e)
    };
    let h = req.headers();
    if let Some(allowed) = &st.limits.host_check {
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !host_allowed(host, allowed) {
            return refused(ApiError::new(
                ApiErrorKind::Forbidden,
                format!(
                    "Host {host:?} is not this server's (a keyless rserve answers only loopback \
                     names, IP addresses and --allowed-host names)"
                ),
            ));
        }
    }
    // A router's `POST /flush_cache` has neither a body nor a type (sglang-router's does
    // not): that one is let through, as harmless as any keyless request (a flush costs
    // cache hits, and a server with keys still asks for one).
    let bodiless_flush = path == "/flush_cache"
        && h.get(header::CONTENT_TYPE).is_none()
        && h.get(header::TRANSFER_ENCODING).is_none()
        && h.get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0");
    if req.method() == Method::POST && !bodiless_flush {
        let json = h
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return refused(ApiError::new(
                ApiErrorKind::UnsupportedMediaType,
                "POST bodies must be sent as Content-Type: application/json",
            ));
        }
    }
    let declared = h
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > st.limits.max_body_bytes as u64) {
        // A client that writes its whole body before reading gets the 413, not a reset
        // (unread input makes the close a reset): an authorized body up to 4x the limit
        // is read and dropped first, within the body timeout. Anything bigger, or from a
        // client without a valid key, gets the 413 at once.
        let authorized = st.authorize(h).is_ok();
        if authorized && n <= 4 * st.limits.max_body_bytes as u64 {
            use futures_util::StreamExt as _;
            let mut body = req.into_body().into_data_stream();
            let _ = tokio::time::timeout(st.limits.body_timeout, async {
                while let Some(Ok(_)) = body.next().await {}
            })
            .await;
        }
        let mut r = refused(ApiError::new(
            ApiErrorKind::PayloadTooLarge,
            format!(
                "request body is too large (at most {} bytes)",
                st.limits.max_body_bytes
            ),
        ));
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    next.run(req).await
}

/// Reads a request's body after it was authorized: at most the limit, within the body
/// timeout.
async fn read_body(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(
        st.limits.body_timeout,
        axum::body::to_bytes(body, st.limits.max_body_bytes),
    )
    .await
    {
        Err(_) => Err(ApiError::new(
            ApiErrorKind::Timeout,
            format!(
                "the request body did not arrive within {:?}",
                st.limits.body_timeout
            ),
        )),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                ApiError::new(ApiErrorKind::PayloadTooLarge, "request body is too large")
            } else {
                ApiError::new(
                    ApiErrorKind::InvalidRequest,
                    format!("cannot read the request body: {e}"),
                )
            })
        }
    }
}

async fn not_found() -> ApiError {
    ApiError::new(ApiErrorKind::NotFound, "no such route")
}

async fn method_not_allowed() -> Response {
    let mut r = ApiError::new(
        ApiErrorKind::InvalidRequest,
        "method not allowed on this route",
    )
    .into_response();
    *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    r
}

/// A leased model's loaded description.
fn info_of(engine: &Engine) -> Result<&ServedModel, ApiError> {
    engine.shared.info.get().ok_or_else(|| {
        ApiError::new(
            ApiErrorKind::Unavailable { retry_after_s: 5 },
            "the model is still loading",
        )
    })
}

/// Runs a request's preparation (parsing, chat templating, tokenizing a possibly
/// megabyte prompt: CPU work) off the async workers, against the leased model.
async fn prepare<T: Send + 'static>(
    engine: &Arc<Engine>,
    f: impl FnOnce(&ServedModel) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || f(info_of(&engine)?))
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::new(
                ApiErrorKind::Internal,
                format!("request preparation failed: {e}"),
            ))
        })
}

/// The `model` field of a JSON body, if it has a string one (anything else is left to
/// the request's own parsing to refuse).
fn model_field(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct M {
        #[serde(default)]
        model: Option<Value>,
    }
    match serde_json::from_slice::<M>(body).ok()?.model? {
        Value::String(m) => Some(m),
        _ => None,
    }
}

fn outcome_of(e: &ApiError) -> Outcome {
    match e.kind {
        ApiErrorKind::Overloaded { .. } => Outcome::RejectedQueueFull,
        ApiErrorKind::Unavailable { .. } => Outcome::Unavailable,
        ApiErrorKind::Internal => Outcome::Error,
        _ => Outcome::Invalid,
    }
}

async fn completions(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    generate(st, headers, Dialect::OpenAi(Kind::Completion), body).await
}

async fn chat_completions(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    generate(st, headers, Dialect::OpenAi(Kind::Chat), body).await
}

async fn messages(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    generate(st, headers, Dialect::Anthropic, body).await
}

async fn responses_create(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    generate(st, headers, Dialect::Responses, body).await
}

/// Which API a generation request speaks: how its body is read, how its answer and its
/// errors are written. All of them run as OpenAI chat (or completions) requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi(Kind),
    /// Anthropic's Messages API.
    Anthropic,
    /// OpenAI's Responses API.
    Responses,
}

impl Dialect {
    /// The generation route's dialect, None for other routes.
    fn of_path(path: &str) -> Option<Dialect> {
        match path {
            "/v1/completions" => Some(Dialect::OpenAi(Kind::Completion)),
            "/v1/chat/completions" => Some(Dialect::OpenAi(Kind::Chat)),
            "/v1/messages" => Some(Dialect::Anthropic),
            "/v1/responses" => Some(Dialect::Responses),
            _ => None,
        }
    }

    fn error(self, e: ApiError) -> Response {
        match self {
            Dialect::Anthropic => crate::anthropic::error_response(e),
            _ => e.into_response(),
        }
    }
}

/// An error in the shape the route's API uses (Anthropic's under /v1/messages).
fn error_for_path(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        crate::anthropic::error_response(e)
    } else {
        e.into_response()
    }
}

/// A generation request whose outcome is not counted yet: dropped unsettled, it counts
/// `cancelled`, in its model's metrics or, before a model was chosen, as unrouted.
struct Unsettled {
    shared: Option<Arc<crate::engine::Shared>>,
    models: Arc<Models>,
    done: bool,
}

impl Unsettled {
    fn new(models: &Arc<Models>, shared: Option<Arc<crate::engine::Shared>>) -> Unsettled {
        Unsettled {
            shared,
            models: models.clone(),
            done: false,
        }
    }

    fn settle(&mut self, o: Outcome) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        match &self.shared {
            Some(s) => s.count(o),
            None => self.models.count_unrouted(),
        }
    }

    /// The engine counts it from now on.
    fn hand_over(&mut self) {
        self.done = true;
    }
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        self.settle(Outcome::Cancelled);
    }
}

/// What a dialect carries from its request to its response besides the parsed request.
enum Extra {
    None,
    Responses(crate::responses::Context),
}

/// A request the engine holds: its choices' events on one channel.
struct Admitted {
    parsed: api::Parsed,
    model: String,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    extra: Extra,
    /// The model stays loaded while the response is produced.
    lease: Lease,
    shared: Arc<crate::engine::Shared>,
}

/// A request arrives: counted at once where the server has one model (in its metrics),
/// else once its model is known ([`route`]).
fn arrive(st: &AppState) -> Unsettled {
    let single = st.models.single_engine();
    if let Some(e) = &single {
        e.shared.metrics().requests_received += 1;
    }
    Unsettled::new(&st.models, single.map(|e| e.shared.clone()))
}

/// The lease on the model a request's body names (the first model where it names none),
/// loading it if needed.
async fn route(st: &AppState, unsettled: &mut Unsettled, body: &[u8]) -> Result<Lease, ApiError> {
    let lease = st
        .models
        .acquire(model_field(body).as_deref())
        .await
        .inspect_err(|e| unsettled.settle(outcome_of(e)))?;
    if unsettled.shared.is_none() {
        lease.engine.shared.metrics().requests_received += 1;
        unsettled.shared = Some(lease.engine.shared.clone());
    }
    Ok(lease)
}

/// Counts, authorizes, reads, translates, validates and submits a generation request.
async fn admit(
    st: &AppState,
    headers: &HeaderMap,
    dialect: Dialect,
    body: Body,
) -> Result<Admitted, ApiError> {
    let arrival = Instant::now();
    // Until the engine holds its choices, the request's one outcome is the handler's: a
    // client that goes away mid-body or mid-tokenizing drops this future, and the guard
    // counts it cancelled.
    let mut unsettled = arrive(st);
    let key_label = st
        .authorize(headers)
        .inspect_err(|_| unsettled.settle(Outcome::Unauthorized))?;
    // The body is read only now, once the key is known to be good.
    let body = read_body(st, body)
        .await
        .inspect_err(|e| unsettled.settle(outcome_of(e)))?;
    let lease = route(st, &mut unsettled, &body).await?;
    let shared = lease.engine.shared.clone();
    let store = st.responses.clone();
    let owner = key_label.clone();
    let prepared = prepare(&lease.engine, move |info| {
        let (raw, extra, kind) = match dialect {
            Dialect::OpenAi(kind) => (api::parse_json::<RawRequest>(&body)?, Extra::None, kind),
            Dialect::Anthropic => (
                crate::anthropic::parse(&body, true)?,
                Extra::None,
                Kind::Chat,
            ),
            Dialect::Responses => {
                let (raw, ctx) = crate::responses::parse(&body, &store, owner.as_deref())?;
                (raw, Extra::Responses(ctx), Kind::Chat)
            }
        };
        let parsed = api::parse_request(kind, &raw, &info.tokenizer, &info.template, info.n_ctx)?;
        Ok::<_, ApiError>((parsed, info.id.clone(), extra))
    })
    .await;
    let (parsed, model, extra) = prepared.inspect_err(|e| unsettled.settle(outcome_of(e)))?;
    // Every choice is its own sequence; identical prompts in flight share their computed
    // prompt blocks (the scheduler lets the later ones wait for the first's), so `n`
    // costs one prefill, not n.
    let n = parsed.n;
    let tenant = Tenant::of(
        key_label.as_deref(),
        parsed.cache_salt.as_deref(),
        &st.label_key,
    );
    let seqs = (0..n)
        .map(|i| {
            let mut params = parsed.params.clone();
            params.sampling.seed = params.sampling.seed.wrapping_add(i as u64);
            (parsed.prompt.clone(), params)
        })
        .collect();
    let rx = submit_all(&lease.engine, seqs, arrival, &tenant, &mut unsettled)?;
    Ok(Admitted {
        parsed,
        model,
        rx,
        extra,
        lease,
        shared,
    })
}

async fn generate(st: AppState, headers: HeaderMap, dialect: Dialect, body: Body) -> Response {
    let a = match admit(&st, &headers, dialect, body).await {
        Ok(a) => a,
        Err(e) => return dialect.error(e),
    };
    let (shared, lease) = (a.shared, a.lease);
    let p = a.parsed;
    let splitter = || AnswerSplitter::new(p.reasoning, p.tools);
    match (dialect, a.extra) {
        (Dialect::OpenAi(kind), _) => {
            let meta = ResponseMeta {
                kind,
                id: api::new_id(kind),
                created: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                model: a.model,
                reasoning: p.reasoning,
                tools: p.tools,
            };
            if p.stream {
                stream_response(meta, a.rx, p.n, p.include_usage, shared, lease)
            } else {
                collect_response(meta, a.rx, p.n, shared).await
            }
        }
        (Dialect::Anthropic, _) => {
            let id = crate::anthropic::new_id();
            if p.stream {
                let enc = crate::anthropic::Stream::new(id, a.model, p.prompt.len());
                stream_one(enc, splitter(), a.rx, shared, lease)
            } else {
                match collect_one(a.rx, splitter(), &shared).await {
                    Ok((ans, end)) => {
                        Json(crate::anthropic::full(&id, &a.model, &ans, &end)).into_response()
                    }
                    Err(e) => crate::anthropic::error_response(e),
                }
            }
        }
        (Dialect::Responses, Extra::Responses(mut ctx)) => {
            ctx.model = a.model;
            if p.stream {
                stream_one(
                    crate::responses::Stream::new(ctx),
                    splitter(),
                    a.rx,
                    shared,
                    lease,
                )
            } else {
                match collect_one(a.rx, splitter(), &shared).await {
                    Ok((ans, end)) => Json(ctx.full(&ans, &end)).into_response(),
                    Err(e) => e.into_response(),
                }
            }
        }
        (Dialect::Responses, Extra::None) => ApiError::new(
            ApiErrorKind::Internal,
            "a Responses request lost its context",
        )
        .into_response(),
    }
}

/// Submits one request's sequences (its choices, or its embedding inputs) sharing one
/// tally, so that the request counts one outcome; their events come merged, tagged with
/// each sequence's index. From here on the engine counts the request.
fn submit_all(
    engine: &Engine,
    seqs: Vec<(Vec<u32>, crate::engine::GenParams)>,
    arrival: Instant,
    tenant: &Tenant,
    unsettled: &mut Unsettled,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    // Each sequence waits in the queue: more than it holds could never all be accepted
    // (a 400, not a 429 that no retry gets past).
    let cap = engine.shared.queue_size;
    if seqs.len() > cap {
        let e = ApiError::new(
            ApiErrorKind::InvalidRequest,
            format!(
                "this request needs {} sequences (choices or inputs), more than this server's \
                 queue of {cap} (--queue-size) holds",
                seqs.len()
            ),
        );
        unsettled.settle(outcome_of(&e));
        return Err(e);
    }
    let tally = Arc::new(Tally::new(seqs.len()));
    let mut receivers = Vec::with_capacity(seqs.len());
    for (prompt, params) in seqs {
        let (tx, rx) = mpsc::unbounded_channel();
        let req = GenRequest {
            prompt,
            params,
            events: tx,
            arrival,
            tenant: tenant.clone(),
            tally: tally.clone(),
        };
        // Sequences already submitted see their receivers dropped and are freed.
        engine
            .submit(req)
            .inspect_err(|e| unsettled.settle(outcome_of(e)))?;
        receivers.push(rx);
    }
    unsettled.hand_over();
    Ok(merge(receivers))
}

/// The events of every choice on one channel, tagged with the choice's index. A dropped
/// output (client gone) ends each forwarder at its next event, which drops that choice's
/// receiver so the engine frees the sequence.
fn merge(
    receivers: Vec<mpsc::UnboundedReceiver<Event>>,
) -> mpsc::UnboundedReceiver<(usize, Event)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (i, mut r) in receivers.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = r.recv().await {
                if tx.send((i, ev)).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

/// Usage of a request with several choices: the prompt once, every choice's output.
fn add_usage(total: &mut Usage, u: &Usage, first: bool) {
    if first {
        total.prompt_tokens = u.prompt_tokens;
        total.cached_tokens = u.cached_tokens;
    }
    total.completion_tokens += u.completion_tokens;
}

/// An event of the other kind of request (an embedding on a generation request or the
/// reverse): a bug.
fn unexpected_event() -> ApiError {
    ApiError::new(
        ApiErrorKind::Internal,
        "the engine answered with an event of another kind of request",
    )
}

fn engine_stopped(shared: &crate::engine::Shared) -> ApiError {
    shared.count(Outcome::Error);
    ApiError::new(
        ApiErrorKind::Internal,
        "the engine stopped before finishing this request",
    )
}

#[derive(Default)]
struct Collected {
    text: String,
    lps: Vec<crate::engine::TokenLogprobs>,
    want_lp: bool,
    finish: Option<crate::engine::FinishReason>,
}

async fn collect_response(
    meta: ResponseMeta,
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    shared: Arc<crate::engine::Shared>,
) -> Response {
    let mut choices: Vec<Collected> = (0..n).map(|_| Collected::default()).collect();
    let mut usage = Usage::default();
    let mut done = 0;
    while let Some((i, ev)) = rx.recv().await {
        let c = &mut choices[i];
        match ev {
            Event::Token {
                text: t, logprobs, ..
            } => {
                c.text.push_str(&t);
                if let Some(l) = logprobs {
                    c.want_lp = true;
                    c.lps.push(l);
                }
            }
            Event::Done {
                text: t,
                finish,
                usage: u,
                ..
            } => {
                c.text.push_str(&t);
                c.finish = Some(finish);
                add_usage(&mut usage, &u, i == 0);
                done += 1;
                if done == n {
                    // Each whole text split into reasoning, content and tool calls (as the
                    // stream's, chunk by chunk: the splitter gives the same either way).
                    let split: Vec<Pieces> = choices
                        .iter()
                        .map(|c| meta.answer_splitter().push(&c.text, true))
                        .collect();
                    let out: Vec<api::Choice> = choices
                        .iter()
                        .zip(&split)
                        .map(|(c, p)| api::Choice {
                            text: &p.content,
                            reasoning: Some(&p.reasoning),
                            finish: c.finish.unwrap_or(crate::engine::FinishReason::Stop),
                            logprobs: c.want_lp.then_some(&c.lps[..]),
                            tool_calls: &p.calls,
                        })
                        .collect();
                    return Json(meta.full(&out, &usage)).into_response();
                }
            }
            Event::Error(e) => return e.into_response(),
            Event::Embedding { .. } => return unexpected_event().into_response(),
        }
    }
    engine_stopped(&shared).into_response()
}

/// A one-choice answer, gathered.
async fn collect_one(
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    mut sp: AnswerSplitter,
    shared: &crate::engine::Shared,
) -> Result<(Answer, End), ApiError> {
    let mut a = Answer::default();
    while let Some((_, ev)) = rx.recv().await {
        match ev {
            Event::Token { text, .. } => a.add(sp.push(&text, false)),
            Event::Done {
                text,
                finish,
                stop,
                usage,
            } => {
                a.add(sp.push(&text, true));
                let called = sp.calls() > 0;
                return Ok((
                    a,
                    End {
                        finish,
                        stop,
                        usage,
                        called,
                    },
                ));
            }
            Event::Error(e) => return Err(e),
            Event::Embedding { .. } => return Err(unexpected_event()),
        }
    }
    Err(engine_stopped(shared))
}

const SSE_HEADERS: [(header::HeaderName, HeaderValue); 2] = [
    (
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    ),
    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
];

/// A one-choice answer streamed through a dialect's encoder.
fn stream_one<E: Encoder>(
    mut enc: E,
    sp: AnswerSplitter,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    shared: Arc<crate::engine::Shared>,
    lease: Lease,
) -> Response {
    struct S<E> {
        enc: E,
        sp: AnswerSplitter,
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        out: std::collections::VecDeque<Bytes>,
        finished: bool,
        shared: Arc<crate::engine::Shared>,
        _lease: Lease,
    }
    let out = enc.start().into();
    let st = S {
        enc,
        sp,
        rx,
        out,
        finished: false,
        shared,
        _lease: lease,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(b) = st.out.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.finished {
                return None;
            }
            let more = match st.rx.recv().await {
                Some((_, Event::Token { text, .. })) if text.is_empty() => continue,
                Some((_, Event::Token { text, .. })) => st.enc.pieces(st.sp.push(&text, false)),
                Some((
                    _,
                    Event::Done {
                        text,
                        finish,
                        stop,
                        usage,
                    },
                )) => {
                    let mut b = st.enc.pieces(st.sp.push(&text, true));
                    let called = st.sp.calls() > 0;
                    b.extend(st.enc.end(&End {
                        finish,
                        stop,
                        usage,
                        called,
                    }));
                    st.finished = true;
                    b
                }
                Some((_, Event::Error(e))) => {
                    st.finished = true;
                    st.enc.error(&e)
                }
                Some((_, Event::Embedding { .. })) => {
                    st.finished = true;
                    st.enc.error(&unexpected_event())
                }
                None => {
                    st.finished = true;
                    let e = engine_stopped(&st.shared);
                    st.enc.error(&e)
                }
            };
            st.out.extend(more);
        }
    });
    (SSE_HEADERS, Body::from_stream(stream)).into_response()
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

struct SseState {
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    meta: ResponseMeta,
    include_usage: bool,
    /// Per choice: the text offset of its next logprobs.
    text_offset: Vec<usize>,
    n_done: usize,
    usage: Usage,
    /// Per choice: its split into reasoning, content and tool calls.
    answers: Vec<AnswerSplitter>,
    out: std::collections::VecDeque<Bytes>,
    finished: bool,
    shared: Arc<crate::engine::Shared>,
    /// The model stays loaded until the stream ends.
    _lease: Lease,
}

impl SseState {
    /// Chunks for new text of choice `i` (`last`: the choice's end, the splitter gives up
    /// what it holds).
    fn send_text(&mut self, i: usize, text: &str, lp: Option<Value>, last: bool) {
        let p = self.answers[i].push(text, last);
        let mut lp = lp;
        if !p.reasoning.is_empty() {
            let chunk = self.meta.reasoning_chunk(i, &p.reasoning, lp.take());
            self.out.push_back(sse(&chunk));
        }
        if !p.content.is_empty() || lp.is_some() {
            self.out
                .push_back(sse(&self.meta.text_chunk(i, &p.content, lp, None)));
        }
        let first = self.answers[i].calls() - p.calls.len();
        for (k, c) in p.calls.iter().enumerate() {
            self.out
                .push_back(sse(&self.meta.tool_call_chunk(i, first + k, c)));
        }
    }

    fn on_event(&mut self, ev: Option<(usize, Event)>) {
        match ev {
            Some((i, Event::Token { text, logprobs, .. })) => {
                if text.is_empty() && logprobs.is_none() {
                    return;
                }
                let lp = logprobs.map(|l| {
                    api::logprobs_json(
                        self.meta.kind,
                        std::slice::from_ref(&l),
                        self.text_offset[i],
                    )
                });
                self.text_offset[i] += text.len();
                self.send_text(i, &text, lp, false);
            }
            Some((
                i,
                Event::Done {
                    text,
                    finish,
                    usage,
                    ..
                },
            )) => {
                self.send_text(i, &text, None, true);
                let last = match self.answers[i].calls() {
                    0 => self.meta.text_chunk(i, "", None, Some(finish)),
                    _ => self.meta.tool_calls_finish_chunk(i),
                };
                self.out.push_back(sse(&last));
                add_usage(&mut self.usage, &usage, i == 0);
                self.n_done += 1;
                if self.n_done == self.text_offset.len() {
                    if self.include_usage {
                        self.out.push_back(sse(&self.meta.usage_chunk(&self.usage)));
                    }
                    self.end();
                }
            }
            Some((_, Event::Error(e))) => {
                self.out
                    .push_back(Bytes::from(format!("data: {}\n\n", e.body_json())));
                self.end();
            }
            Some((_, Event::Embedding { .. })) => {
                let e = unexpected_event();
                self.out
                    .push_back(Bytes::from(format!("data: {}\n\n", e.body_json())));
                self.end();
            }
            None => {
                let e = engine_stopped(&self.shared);
                self.out
                    .push_back(Bytes::from(format!("data: {}\n\n", e.body_json())));
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.finished = true;
    }
}

fn stream_response(
    meta: ResponseMeta,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    include_usage: bool,
    shared: Arc<crate::engine::Shared>,
    lease: Lease,
) -> Response {
    let mut st = SseState {
        _lease: lease,
        rx,
        include_usage,
        text_offset: vec![0; n],
        n_done: 0,
        usage: Usage::default(),
        answers: (0..n).map(|_| meta.answer_splitter()).collect(),
        out: Default::default(),
        finished: false,
        shared,
        meta,
    };
    for i in 0..n {
        if let Some(first) = st.meta.first_chunk(i) {
            st.out.push_back(sse(&first));
        }
    }
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(b) = st.out.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), st));
            }
            if st.finished {
                return None;
            }
            let ev = st.rx.recv().await;
            st.on_event(ev);
        }
    });
    (SSE_HEADERS, Body::from_stream(stream)).into_response()
}

/// `POST /v1/embeddings`: every input a prompt-only sequence in the engine's batches; one
/// outcome for the request.
async fn embeddings(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let arrival = Instant::now();
    let mut unsettled = arrive(&st);
    let r = async {
        let key_label = st
            .authorize(&headers)
            .inspect_err(|_| unsettled.settle(Outcome::Unauthorized))?;
        let body = read_body(&st, body)
            .await
            .inspect_err(|e| unsettled.settle(outcome_of(e)))?;
        let lease = route(&st, &mut unsettled, &body).await?;
        let shared = lease.engine.shared.clone();
        let queue_size = lease.engine.shared.queue_size;
        let prepared = prepare(&lease.engine, move |info| {
            let req = crate::embeddings::parse(
                &body,
                &info.tokenizer,
                info.n_ctx,
                info.n_embd,
                info.pooling,
                queue_size,
            )?;
            Ok::<_, ApiError>((req, info.id.clone(), info.pooling))
        })
        .await;
        let (req, model, pooling) = prepared.inspect_err(|e| unsettled.settle(outcome_of(e)))?;
        let tenant = Tenant::of(key_label.as_deref(), None, &st.label_key);
        let n = req.inputs.len();
        let prompt_tokens: usize = req.inputs.iter().map(Vec::len).sum();
        let params = crate::engine::GenParams {
            max_tokens: 1,
            sampling: Default::default(),
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            logit_bias: Vec::new(),
            format: None,
            special_text: false,
            embed: Some(pooling),
            spec_max: Some(0),
        };
        let seqs = req
            .inputs
            .into_iter()
            .map(|p| (p, params.clone()))
            .collect();
        let mut rx = submit_all(&lease.engine, seqs, arrival, &tenant, &mut unsettled)?;
        let mut vectors = vec![Vec::new(); n];
        let mut done = 0;
        while done < n {
            match rx.recv().await {
                Some((i, Event::Embedding { vector, .. })) => {
                    vectors[i] = vector;
                    done += 1;
                }
                Some((_, Event::Error(e))) => return Err(e),
                Some((_, Event::Token { .. } | Event::Done { .. })) => {
                    return Err(unexpected_event())
                }
                None => return Err(engine_stopped(&shared)),
            }
        }
        Ok(crate::embeddings::response(
            &model,
            &vectors,
            req.base64,
            prompt_tokens,
        ))
    }
    .await;
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Anthropic's token count: the prompt the request would run with (its messages, system
/// text and tools through the model's template).
async fn count_tokens(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        st.authorize(&headers)?;
        let body = read_body(&st, body).await?;
        let lease = st.models.acquire(model_field(&body).as_deref()).await?;
        prepare(&lease.engine, move |info| {
            let raw = crate::anthropic::parse(&body, false)?;
            let c = api::chat_request(&raw, &info.tokenizer, &info.template)?;
            Ok(c.prompt.len())
        })
        .await
    }
    .await;
    match r {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => crate::anthropic::error_response(e),
    }
}

async fn list_models(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
    // One model: as before, listed once it is loaded. Several: every one, with its state.
    if let Some(engine) = st.models.single_engine() {
        return match info_of(&engine) {
            Ok(info) => Json(json!({
                "object": "list",
                "data": [{
                    "id": info.id,
                    "object": "model",
                    "created": info.created,
                    "owned_by": "rserve",
                    "max_model_len": info.n_ctx,
                    "state": "loaded",
                }],
            }))
            .into_response(),
            Err(e) => e.into_response(),
        };
    }
    let data: Vec<Value> = st
        .models
        .slots
        .iter()
        .map(|s| {
            let info = s
                .engine()
                .and_then(|e| e.shared.info.get().map(|i| (i.created, i.n_ctx)));
            let mut v = json!({
                "id": s.id, "object": "model", "owned_by": "rserve",
                "created": info.map_or(0, |i| i.0),
                "state": s.state(), "in_use": s.in_use(),
            });
            if let Some((_, n_ctx)) = info {
                v["max_model_len"] = json!(n_ctx);
            }
            v
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn health(State(st): State<AppState>) -> Response {
    // Several models load on use: the server is healthy once it listens.
    let Some(engine) = st.models.single_engine() else {
        let states: serde_json::Map<String, Value> = st
            .models
            .slots
            .iter()
            .map(|s| (s.id.clone(), json!(s.state())))
            .collect();
        return (
            StatusCode::OK,
            Json(json!({"status": "ok", "models": states})),
        )
            .into_response();
    };
    let sh = &engine.shared;
    let (code, body) = match sh.state() {
        EngineState::Ready => (StatusCode::OK, json!({"status": "ok"})),
        EngineState::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "loading"}),
        ),
        EngineState::Draining => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "shutting_down"}),
        ),
        EngineState::Failed => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "failed", "error": sh.load_error.get()}),
        ),
    };
    (code, Json(body)).into_response()
}

async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if st.keys.is_some() || st.limits.metrics_key.is_some() {
        let key = key_of(&headers).unwrap_or_default();
        let by_metrics_key = st
            .limits
            .metrics_key
            .as_ref()
            .is_some_and(|k| k.check(&key).is_some());
        let by_admin = st
            .keys
            .as_ref()
            .is_some_and(|k| k.check(&key) == Some(ADMIN));
        if !by_metrics_key && !by_admin {
            return ApiError::new(
                ApiErrorKind::Unauthorized,
                "/metrics needs the --metrics-key or the admin API key",
            )
            .into_response();
        }
    }
    let render = |sh: &crate::engine::Shared| {
        let queued = sh.queued();
        let mut m = sh.metrics();
        m.queued = queued;
        m.render()
    };
    let mut text = match st.models.single_engine() {
        Some(engine) => render(&engine.shared),
        None => {
            let per_model: Vec<(String, String)> = st
                .models
                .loaded()
                .iter()
                .map(|(s, e)| (s.id.clone(), render(&e.shared)))
                .collect();
            crate::metrics::render_models(&per_model, &st.models)
        }
    };
    crate::metrics::render_connections(&mut text, &st.models);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

/// The engine a router's questions are about: the model, or the first of several (a
/// worker behind a router serves one model; see `worker_info`).
fn router_engine(st: &AppState, headers: &HeaderMap) -> Result<Arc<Engine>, ApiError> {
    st.authorize(headers)?;
    st.models.slots[0].engine().ok_or_else(|| {
        ApiError::new(
            ApiErrorKind::Unavailable { retry_after_s: 5 },
            "the model is not loaded yet",
        )
    })
}

async fn server_info(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let cfg = &st.models.slots[0].cfg;
    match router_engine(&st, &headers)
        .and_then(|e| info_of(&e).map(|m| crate::worker_info::server_info(m, cfg)))
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn model_info(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match router_engine(&st, &headers).and_then(|e| info_of(&e).map(crate::worker_info::model_info))
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn get_load(State(st): State<AppState>, headers: HeaderMap) -> Response {
    match router_engine(&st, &headers) {
        Ok(e) => {
            let queued = e.shared.queued();
            Json(crate::worker_info::load(&e.shared.metrics(), queued)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

async fn reset_prefix_cache(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let label = match st.authorize(&headers) {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    // A tenant flushes its own cache (its key's label and its salted domains); the admin
    // key, or anyone on a keyless server, flushes every tenant's.
    let mut sent = false;
    for (_, engine) in st.models.loaded() {
        sent |= match label.clone() {
            Some(l) if l != ADMIN => {
                let sub = format!("{l}/");
                engine.reset_tenant_prefix_cache(Box::new(move |t: &str| {
                    t == l || t.starts_with(&sub)
                }))
            }
            _ => engine.reset_prefix_cache(),
        };
    }
    if sent {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::new(
            ApiErrorKind::Unavailable { retry_after_s: 30 },
            "the engine is not running",
        )
        .into_response()
    }
}

#[derive(Deserialize)]
struct TokenizeRequest {
    prompt: Option<String>,
    messages: Option<Value>,
    add_special: Option<bool>,
    add_generation_prompt: Option<bool>,
}

async fn tokenize(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
    let body = read_body(&st, body).await;
    let lease = match &body {
        Ok(b) => st.models.acquire(model_field(b).as_deref()).await,
        Err(e) => Err(e.clone()),
    };
    let r = (|| {
        let body = body?;
        let lease = lease?;
        let info = info_of(&lease.engine)?;
        let req: TokenizeRequest = api::parse_json(&body)?;
        let tokens = match (&req.prompt, &req.messages) {
            (Some(p), None) => info
                .tokenizer
                .encode(p, req.add_special.unwrap_or(true), true),
            (None, Some(_)) => {
                let msgs = api::chat_messages(&req.messages)?;
                let args = runtime::chat::RenderArgs {
                    add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                    ..Default::default()
                };
                api::chat_prompt(&msgs, &args, &info.template, &info.tokenizer)?.0
            }
            _ => {
                return Err(ApiError::new(
                    ApiErrorKind::InvalidRequest,
                    "give either prompt (a string) or messages",
                ))
            }
        };
        Ok(json!({"tokens": tokens, "count": tokens.len(), "max_model_len": info.n_ctx}))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<i64>,
}

async fn detokenize(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = st.authorize(&headers) {
        return e.into_response();
    }
    let body = read_body(&st, body).await;
    let lease = match &body {
        Ok(b) => st.models.acquire(model_field(b).as_deref()).await,
        Err(e) => Err(e.clone()),
    };
    let r = (|| {
        let body = body?;
        let lease = lease?;
        let info = info_of(&lease.engine)?;
        let req: DetokenizeRequest = api::parse_json(&body)?;
        let n = info.n_vocab as i64;
        if let Some(bad) = req.tokens.iter().find(|&&t| !(0..n).contains(&t)) {
            return Err(ApiError::invalid_param(
                "tokens",
                format!("token id {bad} is outside the vocabulary [0, {n})"),
            ));
        }
        let ids: Vec<u32> = req.tokens.iter().map(|&t| t as u32).collect();
        Ok(json!({"prompt": info.tokenizer.decode(&ids, false)}))
    })();
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A server running on its own threads (HTTP runtime + engine).
pub struct RunningServer {
    pub addr: SocketAddr,
    pub models: Arc<Models>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until the model is loaded; errors if loading failed or took too long.
    pub fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        // Several models load on use: nothing to wait for.
        let Some(engine) = self.models.single_engine() else {
            return Ok(());
        };
        loop {
            match engine.shared.state() {
                EngineState::Ready => return Ok(()),
                EngineState::Failed | EngineState::Draining => {
                    anyhow::bail!(
                        "server is not serving: {}",
                        engine
                            .shared
                            .load_error
                            .get()
                            .map_or("stopped", |s| s.as_str())
                    )
                }
                EngineState::Loading if t0.elapsed() > limit => {
                    anyhow::bail!("model still loading after {limit:?}")
                }
                EngineState::Loading => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Starts a graceful shutdown: new requests get 503, in-flight ones finish.
    pub fn begin_shutdown(&self) {
        let _ = self.stop.send(true);
    }

    /// Shuts down gracefully and waits until everything has stopped.
    pub fn shutdown(mut self) {
        self.begin_shutdown();
        self.join_inner();
    }

    /// Waits for the server to stop (after a signal or `begin_shutdown`).
    pub fn join(mut self) {
        self.join_inner();
    }

    fn join_inner(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.begin_shutdown();
        self.join_inner();
    }
}

/// Binds, starts the engine (which loads the model in the background) and serves.
pub fn start(cfg: ServerConfig) -> anyhow::Result<RunningServer> {
    let listener = std::net::TcpListener::bind((cfg.host.as_str(), cfg.port))
        .map_err(|e| anyhow::anyhow!("cannot listen on {}:{}: {e}", cfg.host, cfg.port))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.http_threads.max(1))
        .thread_name("rserve-http")
        .enable_all()
        .build()?;
    let models = Arc::new(match cfg.models.is_empty() {
        true => Models::single(cfg.engine.clone()),
        false => {
            let cfgs = std::iter::once(cfg.engine.model.clone())
                .chain(cfg.models.iter().cloned())
                .map(|m| EngineConfig {
                    model: m,
                    ..cfg.engine.clone()
                })
                .collect();
            Models::on_demand(cfgs, cfg.models_memory, cfg.model_load_timeout)
        }
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let eng = models.clone();
    let stop_for_signals = stop_tx.clone();
    let thread = std::thread::Builder::new()
        .name("rserve-http-main".into())
        .spawn(move || {
            rt.block_on(async move {
                if cfg.handle_signals {
                    tokio::spawn(async move {
                        wait_for_signal().await;
                        eprintln!("rserve: shutting down: draining in-flight requests");
                        let _ = stop_for_signals.send(true);
                    });
                }
                if let Err(e) = serve(listener, eng, &cfg, stop_rx).await {
                    eprintln!("rserve: server error: {e:#}");
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok(RunningServer {
        addr,
        models,
        stop: stop_tx,
        thread: Some(thread),
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The connection cap: the configured one (default 1024), kept below the descriptor limit
/// with room for the engine's files and the connections refused beyond the cap.
pub fn connection_cap(configured: Option<usize>) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer.
    let fds = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(1 << 20) as usize
    } else {
        1024
    };
    let room = fds.saturating_sub(fds / 8 + 64).max(8);
    configured.unwrap_or(1024).min(room).max(1)
}

/// Answers a connection beyond the cap with a 503 and closes it, without reading it.
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = ApiError::new(
        ApiErrorKind::Unavailable { retry_after_s: 1 },
        "too many connections; retry later",
    )
    .body_json();
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(msg.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

async fn serve(
    listener: std::net::TcpListener,
    models: Arc<Models>,
    cfg: &ServerConfig,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let listener = tokio::net::TcpListener::from_std(listener)?;
    let local = listener.local_addr()?;
    let keyless = cfg.api_keys.is_none();
    let limits = Limits {
        max_body_bytes: cfg.max_body_bytes,
        body_timeout: cfg.body_timeout,
        metrics_key: cfg
            .metrics_key
            .as_deref()
            .map(|k| ApiKeys::single(k).map(Arc::new))
            .transpose()
            .map_err(anyhow::Error::msg)?,
        host_check: (keyless || !cfg.allowed_hosts.is_empty()).then(|| {
            let mut a = cfg.allowed_hosts.clone();
            a.push(local.ip().to_string());
            Arc::new(a)
        }),
        responses_store: cfg.responses_store,
    };
    let app = router_with_keys(models.clone(), limits, cfg.api_keys.clone());
    let cap = connection_cap(cfg.max_connections);
    let slots = Arc::new(tokio::sync::Semaphore::new(cap));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .keep_alive(true);
    let http = Arc::new(http);
    let (close_tx, close_rx) = watch::channel(false);
    let mut stop_accepting = stop.clone();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        let open = models.connection_opened(true);
                        tokio::spawn(async move {
                            refuse(stream).await;
                            drop(open);
                        });
                        continue;
                    };
                    let open = models.connection_opened(false);
                    let _ = stream.set_nodelay(true);
                    let svc = TowerToHyperService::new(app.clone());
                    let http = http.clone();
                    let mut close = close_rx.clone();
                    tokio::spawn(async move {
                        // The connection (and its socket) is dropped at the end of this
                        // block, before it stops counting as open.
                        {
                            let conn = http.serve_connection(TokioIo::new(stream), svc);
                            tokio::pin!(conn);
                            let finished = tokio::select! {
                                _ = conn.as_mut() => true,
                                _ = close.wait_for(|c| *c) => false,
                            };
                            if !finished {
                                conn.as_mut().graceful_shutdown();
                                let _ = conn.as_mut().await;
                            }
                        }
                        drop(slot);
                        drop(open);
                    });
                }
                Err(e) => {
                    // Out of descriptors or the like: back off instead of spinning.
                    eprintln!("rserve: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stop_accepting.wait_for(|s| *s) => break,
        }
    }
    drop(listener);
    models.begin_drain();
    // Kept-alive idle connections close now; in-flight requests finish.
    let _ = close_tx.send(true);
    let all_closed = {
        let slots = slots.clone();
        async move {
            let _ = slots.acquire_many(cap as u32).await;
        }
    };
    tokio::pin!(all_closed);
    // Drain: in-flight requests finish; past the deadline they end with a 503 error.
    if tokio::time::timeout(cfg.drain_timeout, &mut all_closed)
        .await
        .is_err()
    {
        eprintln!("rserve: drain timeout: ending the remaining requests");
        let m = models.clone();
        let _ = tokio::task::spawn_blocking(move || m.stop_all()).await;
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut all_closed).await;
    }
    let m = models.clone();
    let _ = tokio::task::spawn_blocking(move || m.stop_all()).await;
    Ok(())
}
