//! Layers on other machines' ggml devices through ggml's RPC backend: `rllama rpc-server`
//! serving ggml's CPU device on loopback, and `rllama run -ngl 99 --rpc HOST:PORT[,...]`,
//! the layers on one server or split over two (`--tensor-split`). The remote devices run
//! the same ggml kernels as the local `--device CPU`, so the greedy output must be the
//! same tokens; every way an endpoint can be wrong gets a clear error before ggml sees it
//! (ggml aborts the process on a server it cannot reach), and a server lost mid-run ends
//! the client with a clear error and status 1, not an abort.
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
    // Split over two servers: by their free memory (equal here: 16 of the 31 units, the
    // layers and the output layer, on the first, as llama.cpp assigns them), and 1:3.
    let (_b, eb) = start_server();
    let both = format!("{ep},{eb}");
    for (ts, first) in [(None, "layers 0..16"), (Some("1,3"), "layers 0..8")] {
        let mut args = vec!["-ngl", "99", "--rpc", &both, "--json"];
        if let Some(ts) = ts {
            args.extend(["--tensor-split", ts]);
        }
        let (ok, split, err) = run(&args);
        assert!(ok, "split run ({ts:?}) failed: {err}");
        assert_eq!(text(&split), text(&local), "split {ts:?}");
        let line = err
            .lines()
            .find(|l| l.contains("offload: 30 layers + output on RPC0,RPC1"))
            .unwrap_or_else(|| panic!("no split summary: {err}"));
        assert!(
            line.contains(&format!("split RPC0: {first}")) && line.contains("+ output"),
            "{line}"
        );
    }
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
    // Two servers, but three shares; the CPU device beside a remote one.
    let (_a, ea) = start_server();
    let (_b, eb) = start_server();
    let both = format!("{ea},{eb}");
    let (ok, _, err) = run(&["-ngl", "99", "--rpc", &both, "-ts", "1,1,1"]);
    assert!(
        !ok && err.contains("3 shares") && err.contains("2 offload devices"),
        "{err}"
    );
    let (ok, _, err) = run(&["-ngl", "99", "--rpc", &both, "-ts", "1,-1"]);
    assert!(!ok && err.contains("non-negative"), "{err}");
    let (ok, _, err) = run(&["-ngl", "99", "--rpc", &ea, "--device", "RPC0,CPU"]);
    assert!(!ok && err.contains("only on its own"), "{err}");
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

#[test]
fn a_lost_rpc_server_ends_the_client_with_a_clear_error() {
    if !ggml_here() || common::model("smollm2-135m").is_none() {
        return;
    }
    let (_a, ea) = start_server();
    let (mut b, eb) = start_server();
    let model = common::model("smollm2-135m").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = rllama()
        .args([
            "run",
            "-m",
            model.to_str().unwrap(),
            "-t",
            "2",
            "-n",
            "4000",
        ])
        .args(["-p", "Once upon a time", "-ngl", "99"])
        .args(["--rpc", &format!("{ea},{eb}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    // Once the layers are up and generating, the second server goes away.
    let t0 = Instant::now();
    while !std::fs::read_to_string(&err_path)
        .unwrap_or_default()
        .contains("split RPC0")
    {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no offload summary"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    b.0.kill().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the client hangs after losing its server"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "not a clean exit: {status:?}\n{err}"
    );
    assert!(
        err.contains("an RPC server of the offloaded layers was lost"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
