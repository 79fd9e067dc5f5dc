//! Streaming OpenAI-API client for the serving benchmark: a minimal HTTP/1.1 client over
//! tokio (keep-alive connections from a pool, as vLLM's aiohttp session keeps them;
//! chunked or plain bodies) that parses the SSE stream and timestamps every content chunk.
//! A pooled connection the server has closed meanwhile is replaced by a fresh one before
//! any byte of the request counts.
//!
//! Timing follows vLLM's `bench serve`, with one stated difference: TTFT is taken at the
//! first chunk that carries **non-empty** content (vLLM's chat client stamps the first chunk
//! with `choices`, which for most servers is an empty `role` delta).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Where requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Path of the API route, e.g. `/v1/completions`.
    pub path: String,
    pub chat: bool,
    /// Send `ignore_eos: true` (fixed output lengths).
    pub ignore_eos: bool,
    /// Idle keep-alive connections to this endpoint.
    pub pool: ConnPool,
}

/// Idle keep-alive connections, shared by every clone of an [`Endpoint`], and the count
/// of connections open (idle or in use) made through this pool and its [`fresh`] siblings.
///
/// [`fresh`]: ConnPool::fresh
#[derive(Clone, Default)]
pub struct ConnPool {
    idle: Arc<Mutex<Vec<Conn>>>,
    open: Arc<AtomicUsize>,
}

/// One connection; counted open until it is dropped (closed).
struct Conn {
    r: BufReader<TcpStream>,
    open: Arc<AtomicUsize>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ConnPool {
    fn take(&self) -> Option<Conn> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put(&self, c: Conn) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }

    fn connected(&self, s: TcpStream) -> Conn {
        self.open.fetch_add(1, Ordering::AcqRel);
        Conn {
            r: BufReader::new(s),
            open: self.open.clone(),
        }
    }

    /// Idle connections held.
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Connections open now, idle or in use, of this pool and its fresh siblings.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// An empty pool whose connections count in the same [`open`](ConnPool::open) total
    /// (dropping it closes its idle connections).
    pub fn fresh(&self) -> ConnPool {
        ConnPool {
            idle: Arc::default(),
            open: self.open.clone(),
        }
    }

    /// Drops the idle connections whose server has closed them (its keep-alive timeout):
    /// they are dead, and counting them open would make the client look as if it held
    /// sockets the server no longer has. A peek that sees end-of-stream (or stray bytes,
    /// which an idle HTTP/1.1 connection never has) closes it; one with nothing to read is
    /// alive. Returns how many were dropped.
    pub fn prune_closed(&self) -> usize {
        use std::os::fd::AsRawFd;
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let before = idle.len();
        idle.retain(|c| {
            let fd = c.r.get_ref().as_raw_fd();
            let mut b = [0u8; 1];
            // SAFETY: a one-byte peek into a live buffer on a socket this pool owns.
            let n = unsafe {
                libc::recv(
                    fd,
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
        });
        before - idle.len()
    }

    /// Drops every idle connection (a new sweep point, a restarted server).
    pub fn clear(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl std::fmt::Debug for ConnPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConnPool({} idle)", self.idle())
    }
}

/// Every pool is equal: endpoints compare by address.
impl PartialEq for ConnPool {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for ConnPool {}

impl Endpoint {
    /// Parse `http://host:port[/prefix]`; the route (`/v1/completions` or
    /// `/v1/chat/completions`) is appended unless the URL already ends with it.
    pub fn parse(url: &str, chat: bool) -> anyhow::Result<Endpoint> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("only http:// URLs are supported: {url}"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse()?),
            None => (authority.to_string(), 80),
        };
        let route = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let path = if path.ends_with("/completions") {
            path.to_string()
        } else {
            format!("{}{route}", path.trim_end_matches("/v1"))
        };
        Ok(Endpoint {
            host,
            port,
            path,
            chat,
            ignore_eos: false,
            pool: ConnPool::default(),
        })
    }
}

/// Failure classes, counted separately in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// Non-2xx status.
    HttpStatus,
    /// Could not connect, or the connection broke.
    Connection,
    /// The whole request exceeded `--timeout`.
    Timeout,
    /// 200 but no content token at all.
    EmptyOutput,
    /// Malformed response (bad SSE / JSON, stream cut before `[DONE]`).
    Protocol,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::HttpStatus,
        ErrorKind::Connection,
        ErrorKind::Timeout,
        ErrorKind::EmptyOutput,
        ErrorKind::Protocol,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::HttpStatus => "http_status",
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
            ErrorKind::EmptyOutput => "empty_output",
            ErrorKind::Protocol => "protocol",
        }
    }
}

/// What one request did. Times in seconds.
#[derive(Debug, Clone, Default)]
pub struct RequestOutput {
    pub error: Option<(ErrorKind, String)>,
    pub prompt_len: usize,
    /// `usage.completion_tokens`, when the server sent it.
    pub usage_output_tokens: Option<usize>,
    /// Number of chunks that carried content.
    pub content_chunks: usize,
    pub generated_text: String,
    pub finish_reason: Option<String>,
    /// Send → first content chunk.
    pub ttft: f64,
    /// Gaps between consecutive content chunks.
    pub itl: Vec<f64>,
    /// Send → last content chunk.
    pub latency: f64,
    /// Send time relative to the experiment start.
    pub send_offset: f64,
    /// Time spent waiting for a concurrency slot (client-side queueing).
    pub queue_time: f64,
    /// The response's HTTP status, once its status line arrived.
    pub status: Option<u16>,
    /// The client dropped the connection mid-stream on purpose (`cancel_after`).
    pub cancelled: bool,
}

impl RequestOutput {
    pub fn success(&self) -> bool {
        self.error.is_none()
    }
}

/// Request body: greedy (`temperature: 0`), streaming with usage, `max_tokens` = the
/// expected output length, `ignore_eos` only when the endpoint asks for it (otherwise an
/// early end of generation is a legitimate finish).
pub fn request_body(ep: &Endpoint, model: &str, prompt: &str, max_tokens: usize) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if ep.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if ep.chat {
        body["messages"] = json!([{"role": "user", "content": prompt}]);
    } else {
        body["prompt"] = json!(prompt);
    }
    body
}

/// The body stream of an HTTP/1.1 response: chunked or until EOF / content-length.
struct Body {
    r: Conn,
    chunked: bool,
    remaining: Option<usize>,
    done: bool,
}

impl Body {
    async fn next(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        if self.chunked {
            let mut line = String::new();
            if self.r.r.read_line(&mut line).await? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "stream cut inside chunked body",
                ));
            }
            let size_str = line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size_str, 16).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad chunk size {line:?}"),
                )
            })?;
            if size == 0 {
                // Trailer fields, then the empty line that ends the message.
                loop {
                    let mut t = String::new();
                    if self.r.r.read_line(&mut t).await? == 0 || t.trim().is_empty() {
                        break;
                    }
                }
                self.done = true;
                return Ok(None);
            }
            let mut buf = vec![0; size + 2];
            self.r.r.read_exact(&mut buf).await?;
            buf.truncate(size);
            Ok(Some(buf))
        } else {
            let want = self.remaining.unwrap_or(64 * 1024).min(64 * 1024);
            if want == 0 {
                self.done = true;
                return Ok(None);
            }
            let mut buf = vec![0; want];
            let n = self.r.r.read(&mut buf).await?;
            if n == 0 {
                self.done = true;
                return Ok(None);
            }
            if let Some(r) = &mut self.remaining {
                *r -= n;
            }
            buf.truncate(n);
            Ok(Some(buf))
        }
    }
}

/// Send one streaming request and time it. Never panics; every failure lands in `error`.
pub async fn send(
    ep: &Endpoint,
    model: &str,
    prompt: &str,
    prompt_len: usize,
    max_tokens: usize,
    timeout: Duration,
) -> RequestOutput {
    send_or_cancel(ep, model, prompt, prompt_len, max_tokens, timeout, None).await
}

/// [`send`], but with `cancel_after: Some(n)` the client hangs up (drops the connection)
/// once `n` content chunks have arrived, and the output says `cancelled` (not an error).
/// A stream that ends before that is an ordinary completion.
pub async fn send_or_cancel(
    ep: &Endpoint,
    model: &str,
    prompt: &str,
    prompt_len: usize,
    max_tokens: usize,
    timeout: Duration,
    cancel_after: Option<usize>,
) -> RequestOutput {
    let start = Instant::now();
    let mut out = RequestOutput {
        prompt_len,
        ..Default::default()
    };
    let body = request_body(ep, model, prompt, max_tokens).to_string();
    let res = tokio::time::timeout(timeout, run(ep, &body, start, &mut out, cancel_after)).await;
    match res {
        Err(_) => {
            out.error = Some((
                ErrorKind::Timeout,
                format!("no complete response within {:.1} s", timeout.as_secs_f64()),
            ))
        }
        Ok(Err(e)) => out.error = Some(e),
        Ok(Ok(())) if out.cancelled => {}
        Ok(Ok(())) => {
            if out.content_chunks == 0 || out.generated_text.is_empty() {
                out.error = Some((
                    ErrorKind::EmptyOutput,
                    format!(
                        "no content (finish_reason {:?}, usage tokens {:?})",
                        out.finish_reason, out.usage_output_tokens
                    ),
                ));
            }
        }
    }
    out
}

async fn run(
    ep: &Endpoint,
    body: &str,
    start: Instant,
    out: &mut RequestOutput,
    cancel_after: Option<usize>,
) -> Result<(), (ErrorKind, String)> {
    let conn = |e: std::io::Error| (ErrorKind::Connection, e.to_string());
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n",
        ep.path,
        ep.host,
        ep.port,
        body.len()
    );
    // A pooled connection first; if the server closed it while idle (nothing of the
    // response arrives), once more on a fresh one.
    let mut pooled = ep.pool.take();
    let (mut r, status_line) = loop {
        let reused = pooled.is_some();
        let mut r = match pooled.take() {
            Some(c) => c,
            None => {
                let s = TcpStream::connect((ep.host.as_str(), ep.port))
                    .await
                    .map_err(conn)?;
                s.set_nodelay(true).ok();
                ep.pool.connected(s)
            }
        };
        let mut status_line = String::new();
        let sent = async {
            r.r.get_mut().write_all(head.as_bytes()).await?;
            r.r.get_mut().write_all(body.as_bytes()).await?;
            r.r.read_line(&mut status_line).await
        }
        .await;
        match sent {
            Ok(n) if n > 0 => break (r, status_line),
            _ if reused => continue,
            Ok(_) => {
                return Err((
                    ErrorKind::Connection,
                    "connection closed before the status line".into(),
                ))
            }
            Err(e) => return Err(conn(e)),
        }
    };
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            (
                ErrorKind::Protocol,
                format!("bad status line {status_line:?}"),
            )
        })?;
    out.status = Some(status);
    let mut chunked = false;
    let mut remaining = None;
    let mut close = false;
    loop {
        let mut line = String::new();
        if r.r.read_line(&mut line).await.map_err(conn)? == 0 {
            return Err((
                ErrorKind::Connection,
                "connection closed inside headers".into(),
            ));
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            let v = v.trim();
            if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            } else if k == "content-length" {
                remaining = v.parse().ok();
            } else if k == "connection" && v.to_ascii_lowercase().contains("close") {
                close = true;
            }
        }
    }
    let mut body = Body {
        r,
        chunked,
        remaining,
        done: false,
    };
    if !(200..300).contains(&status) {
        let mut text = Vec::new();
        while let Ok(Some(b)) = body.next().await {
            text.extend_from_slice(&b);
            if text.len() > 2000 {
                break;
            }
        }
        let text = String::from_utf8_lossy(&text);
        return Err((
            ErrorKind::HttpStatus,
            format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ),
        ));
    }

    let mut pending = Vec::<u8>::new();
    let mut last = 0.0f64;
    let mut saw_done = false;
    while let Some(bytes) = body.next().await.map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::InvalidData {
            ErrorKind::Protocol
        } else {
            ErrorKind::Connection
        };
        (kind, format!("while streaming: {e}"))
    })? {
        pending.extend_from_slice(&bytes);
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim();
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                saw_done = true;
                continue;
            }
            let now = start.elapsed().as_secs_f64();
            let v: Value = serde_json::from_str(data)
                .map_err(|e| (ErrorKind::Protocol, format!("bad SSE JSON {data:?}: {e}")))?;
            if let Some(err) = v.get("error") {
                return Err((
                    ErrorKind::HttpStatus,
                    format!("error event in stream: {err}"),
                ));
            }
            if let Some(c) = v
                .get("choices")
                .and_then(Value::as_array)
                .and_then(|c| c.first())
            {
                let text = if ep.chat {
                    c.pointer("/delta/content")
                } else {
                    c.get("text")
                };
                if let Some(t) = text.and_then(Value::as_str).filter(|t| !t.is_empty()) {
                    if out.content_chunks == 0 {
                        out.ttft = now;
                    } else {
                        out.itl.push(now - last);
                    }
                    last = now;
                    out.content_chunks += 1;
                    out.generated_text.push_str(t);
                    if cancel_after == Some(out.content_chunks) {
                        // Hang up mid-stream: the connection is dropped, never pooled.
                        out.cancelled = true;
                        out.latency = last;
                        return Ok(());
                    }
                }
                if let Some(fr) = c.get("finish_reason").and_then(Value::as_str) {
                    out.finish_reason = Some(fr.to_string());
                }
            }
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(Value::as_u64)
            {
                out.usage_output_tokens = Some(n as usize);
            }
        }
    }
    // A fully read, delimited body leaves the connection ready for the next request.
    if body.done && (body.chunked || body.remaining == Some(0)) && !close {
        ep.pool.put(body.r);
    }
    if !saw_done {
        return Err((
            ErrorKind::Protocol,
            "stream ended without data: [DONE]".into(),
        ));
    }
    out.latency = last;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignore_eos_is_sent_only_when_asked() {
        let mut e = Endpoint::parse("http://127.0.0.1:8080", false).unwrap();
        assert!(request_body(&e, "m", "p", 4).get("ignore_eos").is_none());
        e.ignore_eos = true;
        assert_eq!(request_body(&e, "m", "p", 4)["ignore_eos"], true);
    }

    #[test]
    fn idle_connections_the_server_closed_are_pruned() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let pool = ConnPool::default();
            for _ in 0..2 {
                let s = TcpStream::connect(addr).await.unwrap();
                pool.put(pool.connected(s));
            }
            let (first, _) = l.accept().unwrap();
            let (_second, _) = l.accept().unwrap();
            assert_eq!((pool.open(), pool.prune_closed()), (2, 0), "both alive");
            drop(first); // the server's keep-alive timeout
            for _ in 0..100 {
                if pool.prune_closed() == 1 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!((pool.open(), pool.idle()), (1, 1));
        });
    }

    #[test]
    fn endpoint_parsing() {
        let e = Endpoint::parse("http://127.0.0.1:8080", false).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.path.as_str()),
            ("127.0.0.1", 8080, "/v1/completions")
        );
        let e = Endpoint::parse("http://localhost:9/v1", true).unwrap();
        assert_eq!(e.path, "/v1/chat/completions");
        let e = Endpoint::parse("http://h:1/v1/completions/", true).unwrap();
        assert_eq!(e.path, "/v1/completions");
        assert!(Endpoint::parse("https://x", false).is_err());
    }
}
