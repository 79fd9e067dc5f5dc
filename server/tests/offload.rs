//! rserve with layers offloaded (`-ngl`), ggml's CPU backend standing in for the device:
//! it serves concurrent requests to completion, and the greedy text of a lone request
//! matches the CPU-only server's on most prompts (the device's kernels round differently,
//! so an exact match is not required; runtime/tests/offload.rs measures agreement).
//! `--kv-persist` with offload is refused at start. Skipped with the reason when this
//! build has no ggml (a failure under GGML_SYS_REQUIRED=1, as in CI).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use server::ServerConfig;

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "My favourite fruit is",
    "Water boils at",
];

fn texts(addr: std::net::SocketAddr) -> Vec<String> {
    PROMPTS
        .iter()
        .map(|p| {
            let r = post(
                addr,
                "/v1/completions",
                &json!({"prompt": p, "max_tokens": 12, "temperature": 0}),
            );
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect()
}

/// `n` requests at once, each answered in full with generated tokens.
fn all_complete(addr: std::net::SocketAddr, n: usize, max_tokens: usize) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("Request {i}: the weather today is"), "max_tokens": max_tokens, "temperature": 0});
                post(addr, "/v1/completions", &body)
            })
        })
        .collect();
    for h in handles {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    }
}

#[test]
fn serves_with_layers_offloaded() {
    if !model_available() || !ggml_ready() {
        return;
    }
    let _g = serial();
    let cpu = start(engine_config());
    let want = texts(cpu.addr);
    drop(cpu);

    let mut cfg = engine_config();
    cfg.run.offload = runtime::offload::OffloadSpec::new(99, Some("CPU".into()));
    let srv = start(cfg);
    let addr = srv.addr;
    let got = texts(addr);
    let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
    eprintln!(
        "offloaded server: {same}/{} greedy texts equal the CPU server's",
        want.len()
    );
    assert!(same * 2 >= want.len(), "{got:?} vs {want:?}");

    // Concurrent requests, all completed.
    all_complete(addr, 8, 16);
}

/// `rserve --rpc`: the layers on a ggml RPC server (ggml's RPC server over the CPU device,
/// started in this process on loopback, as `rllama rpc-server` does) give the same greedy
/// texts as the same device in this process: the kernels are the same, only the wire is
/// new. Concurrent requests run through it too.
#[test]
fn serves_with_layers_on_an_rpc_server() {
    if !model_available() || !ggml_ready() {
        return;
    }
    let _g = serial();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The server runs until the test process ends.
    std::thread::spawn(move || {
        let e = runtime::offload::rpc_serve("127.0.0.1", port, 2, "CPU", None, false);
        eprintln!("rpc server ended: {e:?}");
    });
    let ep = format!("127.0.0.1:{port}");
    assert!(eventually(Duration::from_secs(30), || {
        std::net::TcpStream::connect(&ep).is_ok()
    }));

    let mut local = engine_config();
    local.run.offload = runtime::offload::OffloadSpec::new(99, Some("CPU".into()));
    let srv = start(local);
    let want = texts(srv.addr);
    drop(srv);

    let mut remote = engine_config();
    remote.run.offload = runtime::offload::OffloadSpec {
        rpc: vec![ep.clone()],
        ..runtime::offload::OffloadSpec::new(99, None)
    };
    let srv = start(remote);
    let addr = srv.addr;
    assert_eq!(texts(addr), want);
    all_complete(addr, 4, 8);
}

#[test]
fn kv_persist_with_offload_is_refused() {
    if !model_available() || !ggml_ready() {
        return;
    }
    let _g = serial();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = engine_config();
    cfg.run.offload = runtime::offload::OffloadSpec::new(4, Some("CPU".into()));
    cfg.kv_persist = Some(server::persist::PersistConfig {
        dir: dir.path().to_path_buf(),
        interval: Duration::from_secs(30),
        every_blocks: 64,
        max_bytes: 1 << 30,
    });
    let srv = server::start(ServerConfig {
        host: "127.0.0.1".into(),
        port: 0,
        engine: cfg,
        max_body_bytes: 1 << 20,
        http_threads: 2,
        drain_timeout: Duration::from_secs(5),
        handle_signals: false,
        api_keys: None,
        ..ServerConfig::default()
    })
    .expect("listens");
    let err = srv
        .wait_ready(Duration::from_secs(120))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--kv-persist with -ngl > 0"), "{err}");
    srv.begin_shutdown();
    srv.join();
}

/// A device that is lost mid-run (every device step fails from the 40th on): the requests
/// of the failing steps end with an error, none hangs, and the server stays up.
#[test]
fn a_lost_device_fails_requests_and_the_server_stays_up() {
    if !model_available() || !ggml_ready() {
        return;
    }
    let _g = serial();
    let mut cfg = engine_config();
    cfg.run.offload = runtime::offload::OffloadSpec::new(8, Some("CPU".into()));
    cfg.run.offload.fail_at = Some(40);
    let srv = start(cfg);
    let addr = srv.addr;
    let statuses: Vec<(u16, String)> = (0..6)
        .map(|i| {
            let body = json!({"prompt": format!("Story {i}: once upon a time"), "max_tokens": 16, "temperature": 0});
            let r = post(addr, "/v1/completions", &body);
            (r.status, r.text())
        })
        .collect();
    assert_eq!(statuses[0].0, 200, "{statuses:?}");
    let failed: Vec<&(u16, String)> = statuses.iter().filter(|(s, _)| *s != 200).collect();
    assert!(!failed.is_empty(), "no request failed: {statuses:?}");
    for (s, body) in &failed {
        assert_eq!(*s, 500, "{body}");
        assert!(body.contains("device lost"), "{body}");
    }
    assert_eq!(get(addr, "/health").status, 200);
    assert_eq!(get(addr, "/v1/models").status, 200);
}

/// Reads the environment first, as the binaries do (`RLLAMA_GGML_DIR` names the ggml that
/// `tools/vulkan_test.sh` built), then whether ggml loads.
fn ggml_ready() -> bool {
    runtime::options::init();
    ggml_sys::available_or_skip()
}
