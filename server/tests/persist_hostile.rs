//! `--kv-persist` against a hostile local user or a bad disk (issue 48): a symlink planted
//! at a temp name, files readable by others, forged segments, blocks lost after a failed
//! write, a FIFO in the directory, two servers sharing it, a directory writable by others.
//! No model needed: a small KV cache is filled by hand.
#![cfg(unix)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use runtime::kv::{BlockHash, KvCache, KvLayout};
use server::persist::{Persist, PersistConfig};
use sha2::{Digest, Sha256};

fn layout(n_blocks: usize) -> KvLayout {
    KvLayout {
        n_layers: 1,
        n_kv_heads: 1,
        head_dim_k: 4,
        head_dim_v: 4,
        block_size: 4,
        n_blocks,
    }
}

fn cfg(dir: &Path) -> PersistConfig {
    PersistConfig {
        dir: dir.to_path_buf(),
        interval: Duration::from_secs(3600),
        every_blocks: 1_000_000,
        max_bytes: 1 << 30,
    }
}

/// Computes and publishes an 8-token sequence (2 blocks) whose values come from `salt`.
fn publish_seq(kv: &mut KvCache, id: u64, salt: u32) -> Vec<BlockHash> {
    let t: Vec<u32> = (0..8).map(|i| i + salt * 100).collect();
    kv.add_seq(id);
    kv.reserve(id, 8).unwrap();
    let mut slots = Vec::new();
    kv.slots(id, 8, &mut slots).unwrap();
    for (p, &sl) in slots.iter().enumerate() {
        let x = vec![(salt * 10 + p as u32) as f32; 4];
        kv.write(0, sl, &x, &x);
    }
    let mut h = Vec::new();
    runtime::kv::extend_block_hashes(&mut h, &t, 4);
    assert_eq!(kv.publish(id, &h, &t), 2);
    kv.remove_seq(id);
    h
}

fn tenant(_: &BlockHash) -> Option<Arc<str>> {
    Some(Arc::from("default"))
}

/// Writes one 2-block segment into `dir` and closes the writer.
fn write_one(dir: &Path, salt: u32) -> KvCache {
    let mut kv = KvCache::new(layout(8));
    let (mut p, _) = Persist::open(cfg(dir), "aa", &mut kv, |_, _| {}).unwrap();
    publish_seq(&mut kv, 1, salt);
    p.published(2);
    p.finish(&kv, tenant);
    kv
}

fn loaded(dir: &Path) -> usize {
    let mut kv = KvCache::new(layout(16));
    Persist::open(cfg(dir), "aa", &mut kv, |_, _| {}).unwrap().1
}

fn rkv_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rkv") && p.is_file())
        .collect();
    v.sort();
    v
}

/// Defect 2: a symlink planted at every temp name the writer could use never makes it
/// write through the link.
#[test]
fn a_planted_symlink_is_never_followed() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    for seg in 1..4 {
        std::os::unix::fs::symlink(&victim, dir.join(format!("kv-{seg:08}.rkv.tmp"))).unwrap();
    }
    let mut kv = KvCache::new(layout(8));
    let (mut p, _) = Persist::open(cfg(&dir), "aa", &mut kv, |_, _| {}).unwrap();
    for seg in 1..4 {
        let link = dir.join(format!("kv-{seg:08}.rkv.tmp"));
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(&victim, &link).unwrap();
        }
    }
    publish_seq(&mut kv, 1, 3);
    p.published(2);
    p.finish(&kv, tenant);
    drop(p);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(
        loaded(&dir),
        2,
        "the blocks were still written, to a new file"
    );
}

/// Defect 2: a directory that other users may write into (or own) is refused.
#[test]
fn a_directory_others_can_write_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut kv = KvCache::new(layout(8));
    let e = Persist::open(cfg(&dir), "aa", &mut kv, |_, _| {})
        .err()
        .expect("a world-writable persist directory is refused");
    assert!(format!("{e:#}").contains("writable"), "{e:#}");
}

/// Defect 3: the directory is 0700 and every file 0600, whatever the umask.
#[test]
fn persisted_files_are_private() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    write_one(&dir, 5);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700, "directory mode");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!files.is_empty());
    for f in files {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

/// The documented v1 layout with unkeyed SHA-256 digests, as anyone who can write the
/// directory (or the file) can produce it.
fn forge(model_key: &[u8; 32], records: &[(u128, &str, Vec<u32>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"RKVCACHE");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(model_key);
    for x in [4u32, 1, 4, 4, records.len() as u32] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let d = Sha256::digest(&out);
    out.extend_from_slice(&d);
    let mut all = Sha256::new();
    for (key, label, tokens, data) in records {
        let start = out.len();
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&(label.len() as u16).to_le_bytes());
        out.extend_from_slice(label.as_bytes());
        for t in tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(data);
        let d = Sha256::digest(&out[start..]);
        all.update(d);
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(b"RKVEND\0\0");
    out.extend_from_slice(&all.finalize());
    out
}

/// Defect 4: a segment whose digests were recomputed after an edit (or written from
/// scratch) is not loaded: segments carry a MAC under a secret only the server holds.
#[test]
fn forged_segments_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    write_one(&dir, 6);
    let mut h = Vec::new();
    let tokens: Vec<u32> = (0..4).collect();
    runtime::kv::extend_block_hashes(&mut h, &tokens, 4);
    let key = server::persist::model_key("aa", &layout(8));
    let data = vec![0x3cu8; (4 + 4) * 4 * 2];
    let forged = forge(
        &key,
        &[(h[0], "x\"} 1\nrserve_forged 1\n#", tokens.clone(), data)],
    );
    std::fs::write(dir.join("kv-00000099.rkv"), forged).unwrap();
    let mut kv = KvCache::new(layout(16));
    let mut labels = Vec::new();
    let (_p, n) = Persist::open(cfg(&dir), "aa", &mut kv, |_, t| labels.push(t)).unwrap();
    assert_eq!(n, 2, "only the genuine segment loads");
    assert!(
        !kv.is_published(&h[0]),
        "the forged block is not in the cache"
    );
    assert!(labels.iter().all(|l| !l.contains('\n')), "{labels:?}");
}

/// Defect 5: a write that fails (here: its file name is taken by a directory) leaves its
/// blocks unsaved, and they are written once the disk accepts writes again.
#[test]
fn blocks_of_a_failed_write_are_written_later() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    let mut kv = KvCache::new(layout(16));
    let (mut p, _) = Persist::open(cfg(&dir), "aa", &mut kv, |_, _| {}).unwrap();
    // Every name the first write could take is blocked.
    for seg in 1..3 {
        let blocker = dir.join(format!("kv-{seg:08}.rkv"));
        std::fs::create_dir_all(blocker.join("x")).unwrap();
    }
    let first = publish_seq(&mut kv, 1, 7);
    p.published(2);
    p.write_new(&kv, tenant);
    std::thread::sleep(Duration::from_millis(500));
    for seg in 1..3 {
        std::fs::remove_dir_all(dir.join(format!("kv-{seg:08}.rkv"))).unwrap();
    }
    let second = publish_seq(&mut kv, 2, 8);
    p.published(2);
    p.finish(&kv, tenant);
    drop(p);
    let mut kv2 = KvCache::new(layout(16));
    let (_p2, n) = Persist::open(cfg(&dir), "aa", &mut kv2, |_, _| {}).unwrap();
    assert_eq!(n, 4, "both sequences' blocks are on disk");
    for k in first.iter().chain(&second) {
        assert!(kv2.is_published(k));
    }
}

/// Defect 10: a FIFO (or any non-regular file) with a segment's name does not block
/// start-up.
#[test]
fn a_fifo_does_not_block_start_up() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    write_one(&dir, 9);
    let fifo = dir.join("kv-00000050.rkv");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(ok.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let dir2 = dir.clone();
    std::thread::spawn(move || {
        let _ = tx.send(loaded(&dir2));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    if got.is_err() {
        // Unblock the stuck reader so the test process can end.
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
    }
    assert_eq!(got.ok(), Some(2), "start-up hung on a FIFO");
}

/// Defect 11: a second server on the same directory is refused with a clear message
/// while the first runs, and may start once the first is gone.
#[test]
fn two_servers_never_share_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("kv");
    let mut kv = KvCache::new(layout(8));
    let (mut first, _) = Persist::open(cfg(&dir), "aa", &mut kv, |_, _| {}).unwrap();
    let mut kv2 = KvCache::new(layout(8));
    let e = Persist::open(cfg(&dir), "aa", &mut kv2, |_, _| {})
        .err()
        .expect("the second instance is refused");
    assert!(format!("{e:#}").contains("another rserve"), "{e:#}");
    first.finish(&kv, tenant);
    drop(first);
    assert!(Persist::open(cfg(&dir), "aa", &mut kv2, |_, _| {}).is_ok());
    assert!(rkv_files(&dir).is_empty());
}
