//! Layers on another machine's ggml device through ggml's RPC backend: `rllama rpc-server`
//! serving ggml's CPU device on loopback, and `rllama run -ngl 99 --rpc HOST:PORT`. The
//! remote device runs the same ggml kernels as the local `--device CPU`, so the greedy
//! output must be the same tokens; and every way an endpoint can be wrong gets a clear
//! error before ggml sees it (ggml aborts the process on a server it cannot reach).
//! Skipped where this build has no ggml (`GGML_SYS_REQUIRED=1`, CI: a failure).

mod common;

use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{rllama, run_with_timeout};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ggml_here() -> bool {
    let out = run_with_timeout(
        rllama().args(["devices", "--json"]),
        Duration::from_secs(60),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rpc = v["backends"].as_array().is_some_and(|b| {
        b.iter()
            .any(|b| b["backend"] == "rpc" && b["error"].is_null())
    });
    if !rpc {
        assert!(
            std::env::var("GGML_SYS_REQUIRED").as_deref() != Ok("1"),
            "GGML_SYS_REQUIRED=1 but ggml's RPC backend is not here: {v}"
        );
        eprintln!("SKIPPED: no ggml RPC backend in this build");
    }
    rpc
}

fn start_server() -> (Server, String) {
    let port = free_port();
    let child = rllama()
        .args([
            "rpc-server",
            "--host",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let server = Server(child);
    let ep = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while TcpStream::connect(&ep).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "rpc-server did not listen"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, ep)
}

fn run(args: &[&str]) -> (bool, String, String) {
    let model = common::model("smollm2-135m").unwrap();
    let out = run_with_timeout(
        rllama()
            .args(["run", "-m", model.to_str().unwrap(), "-t", "2", "-n", "24"])
            .args(["-p", "The three primary colors are"])
            .args(args),
        Duration::from_secs(300),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn layers_on_an_rpc_server_give_the_local_devices_tokens() {
    if !ggml_here() || common::model("smollm2-135m").is_none() {
        return;
    }
    let (_server, ep) = start_server();
    let (ok, remote, err) = run(&["-ngl", "99", "--rpc", &ep, "--json"]);
    assert!(ok, "remote run failed: {err}");
    let (ok, local, err) = run(&["-ngl", "99", "--device", "CPU", "--json"]);
    assert!(ok, "local run failed: {err}");
    let text = |s: &str| {
        let v: serde_json::Value = serde_json::from_str(s.trim()).unwrap();
        v["text"].as_str().unwrap().to_string()
    };
    assert_eq!(text(&remote), text(&local));
    assert!(!text(&remote).is_empty());
    // `rllama devices --rpc` lists the remote device under its endpoint.
    let out = run_with_timeout(
        rllama().args(["devices", "--rpc", &ep]),
        Duration::from_secs(60),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains(&format!("RPC[{ep}]")), "{table}");
}

#[test]
fn bad_rpc_endpoints_get_clear_errors_not_an_abort() {
    if !ggml_here() || common::model("smollm2-135m").is_none() {
        return;
    }
    let cases: [(&str, &str); 4] = [
        // A public address: refused without a connection.
        ("8.8.8.8:50052", "--rpc-allow-public"),
        // Nothing listens there.
        ("127.0.0.1:1", "cannot be reached"),
        ("127.0.0.1", "not HOST:PORT"),
        ("no-such-host.invalid:50052", "does not resolve"),
    ];
    for (ep, want) in cases {
        let (ok, _, err) = run(&["-ngl", "99", "--rpc", ep]);
        assert!(!ok, "{ep}: ran");
        assert!(err.contains(want), "{ep}: {err}");
        assert!(
            !err.contains("GGML_ABORT") && !err.contains("panicked"),
            "{ep}: {err}"
        );
    }
    // A listener that is not an RPC server: the handshake times out with the reason.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
    let (ok, _, err) = run(&["-ngl", "99", "--rpc", &ep]);
    assert!(!ok && err.contains("did not answer"), "{err}");
    // Two servers: layers go to one device here; refused, not left idle.
    let (_a, ea) = start_server();
    let (_b, eb) = start_server();
    let (ok, _, err) = run(&["-ngl", "99", "--rpc", &format!("{ea},{eb}")]);
    assert!(!ok && err.contains("--tensor-split"), "{err}");
    // The server refuses to listen on every interface without --allow-public.
    let out = run_with_timeout(
        rllama().args(["rpc-server", "--host", "0.0.0.0", "-p", "1"]),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allow-public"),
        "{err}"
    );
}
