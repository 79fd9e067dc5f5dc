//! `--kv-persist`: the prefix cache survives a restart (cache hits, the same greedy text),
//! and damaged or foreign files are skipped, never loaded: a process killed mid-write,
//! truncated and bit-flipped segments, a segment of another model file.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use server::persist::PersistConfig;

fn persisting(dir: &Path, model: &str) -> server::engine::EngineConfig {
    let mut c = engine_config();
    c.model = model.into();
    c.kv_persist = Some(PersistConfig {
        dir: dir.to_path_buf(),
        interval: Duration::from_secs(3600),
        every_blocks: 100_000,
        max_bytes: 1 << 30,
    });
    c
}

fn ask(a: SocketAddr, prompt: &str) -> (String, u64) {
    let r = post(
        a,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 12, "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: Value = r.json();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

fn files(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    v.sort();
    v
}

#[test]
fn the_prefix_cache_survives_a_restart_and_damaged_files_are_skipped() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    let prompt = words(300, 41);

    // Cold: nothing cached; shutdown writes the cache.
    let srv = start(persisting(&dir, MODEL));
    let (text, cached) = ask(srv.addr, &prompt);
    assert_eq!(cached, 0);
    srv.shutdown();
    let segs = files(&dir, ".rkv");
    assert_eq!(segs.len(), 1, "{segs:?}");

    // Warm after a restart: the prompt's blocks come from disk, the text is the same.
    let srv = start(persisting(&dir, MODEL));
    let (t2, c2) = ask(srv.addr, &prompt);
    assert!(c2 >= 256, "cached {c2} tokens after the restart");
    assert_eq!(t2, text, "same greedy text from the restored blocks");
    srv.shutdown();

    // Damage: a truncated copy and a bit-flipped copy with newer sequence numbers are
    // renamed *.corrupt and never loaded; the good segment still is.
    let good = std::fs::read(&segs[0]).unwrap();
    std::fs::write(dir.join("kv-00000090.rkv"), &good[..good.len() / 2]).unwrap();
    let mut flipped = good.clone();
    let at = good.len() * 2 / 3;
    flipped[at] ^= 0x10;
    std::fs::write(dir.join("kv-00000091.rkv"), &flipped).unwrap();
    let srv = start(persisting(&dir, MODEL));
    let (t3, c3) = ask(srv.addr, &prompt);
    assert!(c3 >= 256 && t3 == text, "{c3} {t3:?}");
    srv.shutdown();
    assert_eq!(files(&dir, ".rkv.corrupt").len(), 2);

    // Another model file (the same weights plus one trailing byte hash differently): its
    // server refuses this model's segments and computes everything.
    let orig = runtime::registry::resolve(MODEL).unwrap();
    let other = d.path().join("other.gguf");
    std::fs::copy(&orig, &other).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&other)
            .unwrap();
        f.write_all(&[0]).unwrap();
    }
    let srv = start(persisting(&dir, other.to_str().unwrap()));
    let (t4, c4) = ask(srv.addr, &prompt);
    assert_eq!(c4, 0, "another model's blocks are never loaded");
    assert_eq!(t4, text);
    srv.shutdown();
    // Both models' segments are now in the directory; ours still loads.
    let srv = start(persisting(&dir, MODEL));
    assert!(ask(srv.addr, &prompt).1 >= 256);
    srv.shutdown();
}

/// A real `rserve` killed mid-write (the test hook aborts it after 4 KiB of a segment, as
/// `kill -9` would): the next start deletes the torn `.tmp`, loads nothing from it and
/// serves.
#[test]
fn a_write_killed_midway_is_skipped_on_the_next_start() {
    let _g = serial();
    if !model_available() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rserve"))
        .args([
            "-m",
            MODEL,
            "--port",
            "0",
            "-t",
            "2",
            "-c",
            "2048",
            "--kv-blocks",
            "640",
        ])
        .arg("--kv-persist")
        .arg(&dir)
        .env(server::persist::ABORT_ENV, "4096")
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
    assert!(eventually(Duration::from_secs(120), || get(
        addr, "/health"
    )
    .status
        == 200));
    let prompt = words(300, 42);
    let (text, _) = ask(addr, &prompt);
    // SIGTERM: shutdown writes the cache, and the hook aborts the write.
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    log.push_str(&rest);
    assert!(!status.success(), "the hook aborts: {status:?}\n{log}");
    assert!(log.contains("aborting after 4096 bytes"), "{log}");
    assert_eq!(files(&dir, ".rkv").len(), 0);
    let torn = files(&dir, ".tmp");
    assert_eq!(torn.len(), 1, "{torn:?}");
    assert_eq!(std::fs::metadata(&torn[0]).unwrap().len(), 4096);

    let srv = start(persisting(&dir, MODEL));
    assert!(files(&dir, ".tmp").is_empty(), "the torn file is deleted");
    let (t2, c2) = ask(srv.addr, &prompt);
    assert_eq!((t2.as_str(), c2), (text.as_str(), 0));
    srv.shutdown();
}
