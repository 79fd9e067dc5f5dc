//! STUB-SERVER TESTS: client edge cases only (error classification, timeouts, chunked SSE
//! parsing) against a hand-written TCP stub. These are NOT evidence that the benchmark works
//! against a real server; that is `serve_rserve.rs` (gated on RSERVE_BIN).

use std::time::Duration;

use bench_cli::serve::client::{send, Endpoint, ErrorKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A stub that answers every connection with `reply` (after reading the request head),
/// optionally pausing `pause` between the head and the rest.
async fn stub(reply: &'static str, pause: Duration) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let (a, b) = reply.split_at(reply.find("\r\n\r\n").map_or(0, |i| i + 4));
                let _ = s.write_all(a.as_bytes()).await;
                tokio::time::sleep(pause).await;
                let _ = s.write_all(b.as_bytes()).await;
            });
        }
    });
    port
}

fn ep(port: u16) -> Endpoint {
    Endpoint::parse(&format!("http://127.0.0.1:{port}"), false).unwrap()
}

fn chunked(events: &[&str]) -> String {
    let mut s = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    for e in events {
        let d = format!("data: {e}\n\n");
        s.push_str(&format!("{:x}\r\n{d}\r\n", d.len()));
    }
    s.push_str("0\r\n\r\n");
    s
}

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn stub_success_with_early_stop_usage_and_itl() {
    let body = chunked(&[
        r#"{"choices":[{"index":0,"text":"Hello","finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"text":" world","finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#,
        "[DONE]",
    ]);
    let port = stub(Box::leak(body.into_boxed_str()), Duration::from_millis(20)).await;
    let o = send(&ep(port), "m", "hi", 5, 16, T).await;
    assert!(o.success(), "{:?}", o.error);
    assert_eq!(o.generated_text, "Hello world");
    assert_eq!(o.usage_output_tokens, Some(2));
    assert_eq!(o.finish_reason.as_deref(), Some("stop"));
    assert_eq!(o.itl.len(), 1);
    assert!(o.ttft >= 0.02 && o.latency >= o.ttft);
}

#[tokio::test]
async fn stub_http_error_is_counted_with_its_status() {
    let port = stub(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 10\r\n\r\nqueue full",
        Duration::ZERO,
    )
    .await;
    let o = send(&ep(port), "m", "hi", 1, 4, T).await;
    let (k, msg) = o.error.unwrap();
    assert_eq!(k, ErrorKind::HttpStatus);
    assert!(msg.contains("503") && msg.contains("queue full"), "{msg}");
}

#[tokio::test]
async fn stub_empty_output_is_a_failure() {
    let body = chunked(&[
        r#"{"choices":[{"index":0,"text":"","finish_reason":"stop"}]}"#,
        r#"{"choices":[],"usage":{"completion_tokens":0}}"#,
        "[DONE]",
    ]);
    let port = stub(Box::leak(body.into_boxed_str()), Duration::ZERO).await;
    let o = send(&ep(port), "m", "hi", 1, 4, T).await;
    assert_eq!(o.error.unwrap().0, ErrorKind::EmptyOutput);
}

#[tokio::test]
async fn stub_timeout_truncation_and_refused_connection() {
    let port = stub(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        Duration::from_secs(30),
    )
    .await;
    let o = send(&ep(port), "m", "hi", 1, 4, Duration::from_millis(300)).await;
    assert_eq!(o.error.unwrap().0, ErrorKind::Timeout);

    // Stream cut before [DONE] (connection closed after one event).
    let cut = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n";
    let port = stub(cut, Duration::ZERO).await;
    let o = send(&ep(port), "m", "hi", 1, 4, T).await;
    assert_eq!(o.error.unwrap().0, ErrorKind::Protocol);

    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let o = send(&ep(port), "m", "hi", 1, 4, T).await;
    assert_eq!(o.error.unwrap().0, ErrorKind::Connection);
}

/// A stub that answers requests on each connection in turn (keep-alive) and counts the
/// connections it accepted; with `close_after` it closes a connection after that many.
async fn keepalive_stub(
    reply: String,
    close_after: usize,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let conns = std::sync::Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c2.fetch_add(1, Ordering::SeqCst);
            let reply = reply.clone();
            tokio::spawn(async move {
                for _ in 0..close_after {
                    // Read one request: head up to the blank line, then Content-Length.
                    let mut req = Vec::new();
                    let mut b = [0u8; 1];
                    while !req.ends_with(b"\r\n\r\n") {
                        if s.read(&mut b).await.unwrap_or(0) == 0 {
                            return;
                        }
                        req.push(b[0]);
                    }
                    let head = String::from_utf8_lossy(&req).to_ascii_lowercase();
                    let n: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0u8; n];
                    if s.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    if s.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, conns)
}

#[tokio::test]
async fn keep_alive_reuses_connections_and_survives_servers_that_close_them() {
    use std::sync::atomic::Ordering;
    let reply = chunked(&[
        r#"{"choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}"#,
        "[DONE]",
    ]);
    // 10 sequential requests over one kept-alive connection.
    let (port, conns) = keepalive_stub(reply.clone(), usize::MAX).await;
    let e = ep(port);
    for _ in 0..10 {
        let o = send(&e, "m", "hi", 1, 4, T).await;
        assert!(o.success(), "{:?}", o.error);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    assert_eq!(e.pool.idle(), 1);
    // A server that closes every connection after 3 answers (as llama-server's keep-alive
    // limit does): the stale pooled connection is replaced, no request fails.
    let (port, conns) = keepalive_stub(reply, 3).await;
    let e = ep(port);
    for i in 0..10 {
        let o = send(&e, "m", "hi", 1, 4, T).await;
        assert!(o.success(), "request {i}: {:?}", o.error);
    }
    assert_eq!(conns.load(Ordering::SeqCst), 4);
}
