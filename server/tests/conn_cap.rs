//! Defect 6 (issue 48): idle connections cannot exhaust rserve's file descriptors. A real
//! `rserve` runs with a 256-descriptor limit; 300 idle connections later, a new request
//! still gets an answer at once (a fast 503 beyond the connection cap, never a hang), and
//! once they go, /health answers 200.
#![cfg(unix)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The status of `GET /health`, or None when no answer came within `wait`.
fn health(addr: SocketAddr, wait: Duration) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, wait).ok()?;
    s.set_read_timeout(Some(wait)).ok()?;
    s.write_all(
        format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
    head.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn idle_connections_cannot_exhaust_descriptors() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {} -m {MODEL} --port 0 -t 1 -c 512 --kv-blocks 64 -np 2",
            env!("CARGO_BIN_EXE_rserve")
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "rserve ended:\n{log}"
        );
        log.push_str(&line);
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = err.read_to_string(&mut sink);
    });
    assert!(eventually(Duration::from_secs(120), || health(
        addr,
        Duration::from_secs(5)
    ) == Some(200)));
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .collect();
    assert!(idle.len() >= 290, "{} connections", idle.len());
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let got = health(addr, Duration::from_secs(5));
    let secs = t0.elapsed().as_secs_f64();
    assert!(
        got.is_some() && secs < 3.0,
        "with 300 idle connections a new request got {got:?} after {secs:.1}s"
    );
    drop(idle);
    assert!(
        eventually(Duration::from_secs(10), || health(
            addr,
            Duration::from_secs(2)
        ) == Some(200)),
        "/health did not recover"
    );
    // The server's own count of its sockets (what `rbench soak` subtracts from its
    // descriptors): the refused ones were counted, and once the idle ones went, only
    // the scrape's own connection is open.
    let mut last = String::new();
    let settled = eventually(Duration::from_secs(10), || {
        last = get_text(addr, "/metrics");
        metric(&last, "rserve_http_connections_open") == Some(1.0)
    });
    assert!(settled, "connections still counted open:\n{last}");
    let refused = metric(&last, "rserve_http_connections_refused_total").unwrap();
    assert!(
        refused >= 100.0,
        "{refused} refused of 300 (the cap is below 160)"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The body of `GET path` (empty when there was no answer).
fn get_text(addr: SocketAddr, path: &str) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn metric(text: &str, name: &str) -> Option<f64> {
    server::metrics::parse_sample(text, name)
}
