//! Helpers for the server tests: an in-process server on an ephemeral port, and a tiny
//! blocking HTTP/1.1 client (std sockets, `Connection: close`, hard timeouts) that can also
//! read SSE streams event by event and hang up mid-stream.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use server::engine::EngineConfig;
use server::{RunningServer, ServerConfig};

pub const MODEL: &str = "smollm2-135m";

/// Model tests share two cores: run them one at a time so timings mean something.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fetches the model if needed; `None` (skip) when RLLAMA_SKIP_MODEL_TESTS is set.
pub fn model_available() -> bool {
    if std::env::var_os("RLLAMA_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipping: RLLAMA_SKIP_MODEL_TESTS is set");
        return false;
    }
    runtime::registry::resolve(MODEL).unwrap_or_else(|e| panic!("cannot get model {MODEL}: {e}"));
    true
}

pub fn engine_config() -> EngineConfig {
    EngineConfig {
        model: MODEL.into(),
        run: runtime::RunOptions {
            threads: 2,
            ..runtime::RunOptions::default()
        },
        n_ctx: Some(2048),
        max_seqs: 8,
        max_batch_tokens: 256,
        kv_blocks: Some(640),
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

/// Starts a server with `engine` on 127.0.0.1 and an ephemeral port, ready to serve.
pub fn start(engine: EngineConfig) -> RunningServer {
    start_with_keys(engine, None)
}

/// [`start`] with API keys required.
pub fn start_with_keys(
    engine: EngineConfig,
    keys: Option<server::tenant::ApiKeys>,
) -> RunningServer {
    let srv = server::start(ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        engine,
        max_body_bytes: 1 << 20,
        http_threads: 2,
        drain_timeout: Duration::from_secs(30),
        handle_signals: false,
        api_keys: keys.map(std::sync::Arc::new),
        ..ServerConfig::default()
    })
    .expect("server starts");
    srv.wait_ready(Duration::from_secs(120))
        .expect("model loads");
    srv
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {} body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn connect(addr: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    s.set_nodelay(true)?;
    Ok(s)
}

fn send_request(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> std::io::Result<()> {
    send_request_with(s, method, path, body, &[])
}

fn send_request_with(
    s: &mut TcpStream,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    extra: &[(&str, &str)],
) -> std::io::Result<()> {
    let host = s.peer_addr()?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: */*\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    if let Some(b) = body {
        s.write_all(b)?;
    }
    s.flush()
}

fn read_head(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    })
}

/// Reads one chunk of a chunked body; empty at the end.
fn read_chunk(r: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
        .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
    let mut buf = vec![0; n];
    r.read_exact(&mut buf)?;
    let mut crlf = [0u8; 2];
    r.read_exact(&mut crlf)?;
    Ok(buf)
}

/// One request, whole response; errors on timeout or a broken connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<Resp> {
    request_with(addr, method, path, body, &[], timeout)
}

/// [`request`] with extra headers.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Resp> {
    let mut s = connect(addr, timeout)?;
    send_request_with(&mut s, method, path, body, headers)?;
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r)?;
    let mut body = Vec::new();
    if is_chunked(&headers) {
        loop {
            let c = read_chunk(&mut r)?;
            if c.is_empty() {
                break;
            }
            body.extend(c);
        }
    } else if let Some(n) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(
        addr,
        "POST",
        path,
        Some(body.to_string().as_bytes()),
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("POST {path}: {e}"))
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, None, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// A streaming response read event by event.
pub struct Sse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    r: BufReader<TcpStream>,
    chunked: bool,
    pending: Vec<u8>,
}

impl Sse {
    pub fn open(
        addr: SocketAddr,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> std::io::Result<Sse> {
        let mut s = connect(addr, timeout)?;
        send_request(&mut s, "POST", path, Some(body.to_string().as_bytes()))?;
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r)?;
        Ok(Sse {
            status,
            chunked: is_chunked(&headers),
            headers,
            r,
            pending: Vec::new(),
        })
    }

    /// The whole body of a non-streaming answer (an error), as a response.
    pub fn into_resp(mut self) -> std::io::Result<Resp> {
        let mut body = Vec::new();
        if self.chunked {
            loop {
                let c = read_chunk(&mut self.r)?;
                if c.is_empty() {
                    break;
                }
                body.extend(c);
            }
        } else if let Some(n) = self
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse::<usize>().ok())
        {
            body.resize(n, 0);
            self.r.read_exact(&mut body)?;
        }
        Ok(Resp {
            status: self.status,
            headers: self.headers,
            body,
        })
    }

    /// The next `data:` payload, `None` after `[DONE]` or at the end of the stream.
    pub fn next_data(&mut self) -> std::io::Result<Option<String>> {
        loop {
            if let Some(i) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let ev: Vec<u8> = self.pending.drain(..i + 2).collect();
                let ev = String::from_utf8_lossy(&ev).into_owned();
                let data: String = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect::<Vec<_>>()
                    .join("\n");
                if data == "[DONE]" {
                    return Ok(None);
                }
                if !data.is_empty() {
                    return Ok(Some(data));
                }
                continue;
            }
            let more = if self.chunked {
                read_chunk(&mut self.r)?
            } else {
                let mut b = vec![0; 4096];
                let n = self.r.read(&mut b)?;
                b.truncate(n);
                b
            };
            if more.is_empty() {
                return Ok(None);
            }
            self.pending.extend(more);
        }
    }
}

/// A streamed completion, collected: text, finish reason, usage, and when each content
/// chunk arrived.
#[derive(Debug, Default)]
pub struct Streamed {
    pub text: String,
    pub finish: Option<String>,
    pub usage: Option<Value>,
    pub chunk_times: Vec<Instant>,
    pub error: Option<Value>,
}

pub fn stream_completion(
    addr: SocketAddr,
    body: &Value,
    timeout: Duration,
) -> std::io::Result<Streamed> {
    let mut s = Sse::open(addr, "/v1/completions", body, timeout)?;
    if s.status != 200 {
        return Err(std::io::Error::other(format!("status {}", s.status)));
    }
    let mut out = Streamed::default();
    while let Some(d) = s.next_data()? {
        let v: Value = serde_json::from_str(&d).map_err(std::io::Error::other)?;
        if v.get("error").is_some() {
            out.error = Some(v);
            continue;
        }
        if let Some(u) = v.get("usage") {
            out.usage = Some(u.clone());
        }
        if let Some(c) = v["choices"].get(0) {
            let t = c["text"].as_str().unwrap_or("");
            if !t.is_empty() {
                out.text.push_str(t);
                out.chunk_times.push(Instant::now());
            }
            if let Some(f) = c["finish_reason"].as_str() {
                out.finish = Some(f.to_string());
            }
        }
    }
    Ok(out)
}

/// Reads a sample from the server's /metrics.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let m = get(addr, "/metrics").text();
    server::metrics::parse_sample(&m, name).unwrap_or_else(|| panic!("no metric {name}"))
}

/// Polls until `f` holds or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// A deterministic pseudo-text prompt of roughly `n_words` words.
pub fn words(n_words: usize, seed: u64) -> String {
    const W: &[&str] = &[
        "the",
        "river",
        "quietly",
        "carried",
        "old",
        "stories",
        "about",
        "mountains",
        "and",
        "people",
        "who",
        "lived",
        "near",
        "its",
        "banks",
        "during",
        "long",
        "winters",
        "when",
        "snow",
        "covered",
        "every",
        "road",
        "village",
        "market",
        "bread",
        "was",
        "shared",
        "between",
        "families",
        "children",
        "learned",
        "to",
        "read",
        "by",
        "candle",
        "light",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = String::new();
    for i in 0..n_words {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if i > 0 {
            out.push(if i % 13 == 0 { '.' } else { ' ' });
            if i % 13 == 0 {
                out.push(' ');
            }
        }
        out.push_str(W[(x >> 33) as usize % W.len()]);
    }
    out
}

/// A structured prompt: numbered notes of a few words each, so a model's continuation
/// ("Note N+1: ...") depends on attending to the whole context.
pub fn notes(n_lines: usize, seed: u64) -> String {
    (0..n_lines)
        .map(|i| {
            format!(
                "Note {}: {}.\n",
                i + 1,
                words(5 + (i + seed as usize) % 4, seed * 1000 + i as u64)
            )
        })
        .collect()
}
