//! The models a server serves, and which of them are loaded.
//!
//! One model (`rserve -m NAME`, the usual case) is loaded at start and never unloaded.
//! Several (`-m a -m b`, `--models-dir DIR`) load on first use, each its own engine (its
//! thread, KV cache and thread pool), and are unloaded least-recently-used when loading
//! another would pass `--models-memory` (weights plus KV cache, as each engine's sizing
//! reports; before a model's first load its file size stands in). A model in use, one
//! with a request between admission and the end of its response ([`Lease`]), is never
//! unloaded; a request for a model that is loading waits for it, and a load that cannot
//! find room waits for models to come free, both within `load_timeout`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::engine::{Engine, EngineConfig, ServedModel, State};
use crate::error::{ApiError, ApiErrorKind};

/// One model the server can serve.
pub struct Slot {
    /// The name requests use: the registry name or the file's stem.
    pub id: String,
    pub cfg: EngineConfig,
    engine: Mutex<Option<Arc<Engine>>>,
    /// Requests holding a [`Lease`].
    in_use: AtomicUsize,
    /// Milliseconds since the server started, at the last lease's end.
    last_used: AtomicU64,
    pub loads: AtomicU64,
    pub evictions: AtomicU64,
    /// Bytes the model took when last loaded (weights + KV cache), 0 before.
    footprint: AtomicU64,
}

impl Slot {
    /// The engine, if loaded or loading.
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `unloaded`, `loading`, `loaded` or `failed`.
    pub fn state(&self) -> &'static str {
        match self.engine().map(|e| e.shared.state()) {
            None => "unloaded",
            Some(State::Loading) => "loading",
            Some(State::Ready) => "loaded",
            Some(State::Draining) => "unloading",
            Some(State::Failed) => "failed",
        }
    }

    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }

    /// Bytes it takes or would take: its sizing once loaded, else the last load's, else
    /// the file's size.
    fn footprint(&self) -> u64 {
        if let Some(info) = self
            .engine()
            .and_then(|e| e.shared.info.get().map(sizing_bytes))
        {
            return info;
        }
        match self.footprint.load(Ordering::Acquire) {
            0 => file_size(&self.cfg.model),
            b => b,
        }
    }
}

fn sizing_bytes(info: &ServedModel) -> u64 {
    info.sizing.weight_bytes + info.sizing.kv_bytes as u64
}

fn file_size(model: &str) -> u64 {
    let p = PathBuf::from(model);
    let path = if p.exists() {
        Some(p)
    } else {
        runtime::registry::find(model).map(runtime::registry::cached_path)
    };
    path.and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len())
}

/// A request's hold on a loaded model: while any is held the model is not unloaded.
pub struct Lease {
    slot: Arc<Slot>,
    pub engine: Arc<Engine>,
    epoch: Instant,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot
            .last_used
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Release);
        self.slot.in_use.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection, counted in `rserve_http_connections_open` while it lives.
pub struct OpenConnection(Arc<Models>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

pub struct Models {
    pub slots: Vec<Arc<Slot>>,
    /// Several models, loaded on use (false: one, loaded at start).
    pub on_demand: bool,
    /// The most bytes of loaded models (None: no bound).
    pub budget: Option<u64>,
    pub load_timeout: Duration,
    /// Serialises loading and unloading decisions.
    switch: Mutex<()>,
    epoch: Instant,
    /// Requests refused before a model was chosen (several models: a bad key, a bad
    /// body, an unknown model).
    unrouted: AtomicU64,
    /// TCP connections accepted and not yet closed (refused ones included), and those
    /// refused beyond the connection cap: server-wide, not per model.
    connections_open: AtomicU64,
    connections_refused: AtomicU64,
    /// Shutting down: nothing more is loaded.
    closing: std::sync::atomic::AtomicBool,
}

impl Models {
    /// One model, loaded now.
    pub fn single(cfg: EngineConfig) -> Models {
        let m = Models::new(vec![cfg], false, None, Duration::from_secs(300));
        let s = &m.slots[0];
        *s.engine.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Arc::new(Engine::start(s.cfg.clone())));
        s.loads.fetch_add(1, Ordering::Relaxed);
        m
    }

    /// Several models, each loaded on first use.
    pub fn on_demand(
        cfgs: Vec<EngineConfig>,
        budget: Option<u64>,
        load_timeout: Duration,
    ) -> Models {
        Models::new(cfgs, true, budget, load_timeout)
    }

    fn new(
        cfgs: Vec<EngineConfig>,
        on_demand: bool,
        budget: Option<u64>,
        load_timeout: Duration,
    ) -> Models {
        let slots = cfgs
            .into_iter()
            .map(|cfg| {
                Arc::new(Slot {
                    id: model_id(&cfg.model),
                    cfg,
                    engine: Mutex::new(None),
                    in_use: AtomicUsize::new(0),
                    last_used: AtomicU64::new(0),
                    loads: AtomicU64::new(0),
                    evictions: AtomicU64::new(0),
                    footprint: AtomicU64::new(0),
                })
            })
            .collect();
        Models {
            slots,
            on_demand,
            budget,
            load_timeout,
            switch: Mutex::new(()),
            epoch: Instant::now(),
            unrouted: AtomicU64::new(0),
            connections_open: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The one model's engine of a single-model server.
    pub fn single_engine(&self) -> Option<Arc<Engine>> {
        match self.on_demand {
            false => self.slots[0].engine(),
            true => None,
        }
    }

    /// The slot a request's `model` names (None: the first model). Unknown: 404.
    pub fn find(&self, asked: Option<&str>) -> Result<&Arc<Slot>, ApiError> {
        let Some(asked) = asked else {
            return Ok(&self.slots[0]);
        };
        let by_name = self.slots.iter().find(|s| {
            s.id == asked
                || s.cfg.model == asked
                || s.engine()
                    .and_then(|e| e.shared.info.get().map(|i| names(asked, i)))
                    .unwrap_or(false)
        });
        if let Some(s) = by_name {
            return Ok(s);
        }
        // A single model also answers to its file's names once loaded.
        let served: Vec<&str> = self.slots.iter().map(|s| s.id.as_str()).collect();
        Err(ApiError::new(
            ApiErrorKind::ModelNotFound,
            format!(
                "the model '{asked}' does not exist here: this server serves {}",
                served
                    .iter()
                    .map(|s| format!("'{s}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    }

    /// A lease on the model `asked` names, loading it (and unloading others) as needed,
    /// waiting at most `load_timeout` for it to be ready.
    pub async fn acquire(&self, asked: Option<&str>) -> Result<Lease, ApiError> {
        let slot = self.find(asked)?.clone();
        let deadline = Instant::now() + self.load_timeout;
        loop {
            match self.try_acquire(&slot) {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(ApiError::new(
                    ApiErrorKind::Unavailable { retry_after_s: 5 },
                    format!(
                        "the model '{}' is not ready after {:?} (loading, or waiting for \
                         --models-memory held by models in use)",
                        slot.id, self.load_timeout
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A lease if the model is ready; starts its load if it is not loaded and there is
    /// room; None to wait.
    fn try_acquire(&self, slot: &Arc<Slot>) -> Result<Option<Lease>, ApiError> {
        let _switch = self.switch.lock().unwrap_or_else(|e| e.into_inner());
        let shutting_down = || {
            ApiError::new(
                ApiErrorKind::Unavailable { retry_after_s: 5 },
                "the server is shutting down",
            )
        };
        if self.closing.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        if let Some(e) = slot.engine() {
            match e.shared.state() {
                State::Ready => {
                    slot.in_use.fetch_add(1, Ordering::AcqRel);
                    return Ok(Some(Lease {
                        slot: slot.clone(),
                        engine: e,
                        epoch: self.epoch,
                    }));
                }
                // One model: /health says 503 while it loads, and so do requests.
                State::Loading if !self.on_demand => {
                    return Err(ApiError::new(
                        ApiErrorKind::Unavailable { retry_after_s: 5 },
                        "the model is still loading",
                    ))
                }
                State::Loading => return Ok(None),
                State::Draining => return Err(shutting_down()),
                State::Failed => {
                    let why = e.shared.load_error.get().cloned().unwrap_or_default();
                    if self.on_demand {
                        // The next request tries again.
                        *slot.engine.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    }
                    return Err(ApiError::new(
                        ApiErrorKind::Unavailable { retry_after_s: 30 },
                        format!("the model '{}' failed to load: {why}", slot.id),
                    ));
                }
            }
        }
        // Not loaded (only on demand): make room, least recently used first.
        if let Some(budget) = self.budget {
            let need = slot.footprint();
            loop {
                let used: u64 = self
                    .slots
                    .iter()
                    .filter(|s| s.engine().is_some())
                    .map(|s| s.footprint())
                    .sum();
                if used + need <= budget {
                    break;
                }
                let victim = self
                    .slots
                    .iter()
                    .filter(|s| {
                        s.in_use() == 0
                            && s.engine().is_some_and(|e| e.shared.state() == State::Ready)
                    })
                    .min_by_key(|s| s.last_used.load(Ordering::Acquire));
                match victim {
                    Some(v) => self.unload(v),
                    // Nothing else loaded: a model over the budget alone still loads.
                    None if used == 0 => break,
                    None => return Ok(None),
                }
            }
        }
        eprintln!("rserve: loading model '{}'", slot.id);
        *slot.engine.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Arc::new(Engine::start(slot.cfg.clone())));
        slot.loads.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    fn unload(&self, s: &Slot) {
        let Some(e) = s.engine.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        if let Some(info) = e.shared.info.get() {
            s.footprint.store(sizing_bytes(info), Ordering::Release);
        }
        eprintln!("rserve: unloading model '{}' (least recently used)", s.id);
        e.stop();
        s.evictions.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_unrouted(&self) {
        self.unrouted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn unrouted(&self) -> u64 {
        self.unrouted.load(Ordering::Relaxed)
    }

    /// A connection was accepted; it counts as open until the guard is dropped (its
    /// socket closed with it).
    pub fn connection_opened(self: &Arc<Self>, refused: bool) -> OpenConnection {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        if refused {
            self.connections_refused.fetch_add(1, Ordering::Relaxed);
        }
        OpenConnection(self.clone())
    }

    /// (open now, refused in all).
    pub fn connections(&self) -> (u64, u64) {
        (
            self.connections_open.load(Ordering::Relaxed),
            self.connections_refused.load(Ordering::Relaxed),
        )
    }

    /// Every loaded engine, with its slot.
    pub fn loaded(&self) -> Vec<(Arc<Slot>, Arc<Engine>)> {
        self.slots
            .iter()
            .filter_map(|s| s.engine().map(|e| (s.clone(), e)))
            .collect()
    }

    /// Shutdown begins: no model loads from now on, the loaded ones stop taking
    /// requests and finish what they hold.
    pub fn begin_drain(&self) {
        let _switch = self.switch.lock().unwrap_or_else(|e| e.into_inner());
        self.closing.store(true, Ordering::Release);
        for (_, e) in self.loaded() {
            e.begin_drain();
        }
    }

    /// Stops every engine (shutdown).
    pub fn stop_all(&self) {
        for (_, e) in self.loaded() {
            e.stop();
        }
    }
}

fn names(asked: &str, info: &ServedModel) -> bool {
    let file = info.path.file_name().and_then(|f| f.to_str());
    let stem = info.path.file_stem().and_then(|f| f.to_str());
    asked == info.id
        || Some(asked) == file
        || Some(asked) == stem
        || info.path.to_str() == Some(asked)
}

/// A model's name for requests: a registry name as is, a path's file stem.
pub fn model_id(model: &str) -> String {
    let p = std::path::Path::new(model);
    match p.extension().and_then(|e| e.to_str()) {
        Some("gguf") => p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or(model)
            .to_string(),
        _ => model.to_string(),
    }
}

/// The GGUF files of a directory, sorted by name (the first is the default model).
pub fn models_in_dir(dir: &std::path::Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf") && p.is_file())
        .collect();
    v.sort();
    Ok(v)
}
