//! A prefix cache that survives restarts (`rserve --kv-persist DIR`).
//!
//! Published KV blocks are written to segment files: on shutdown, and while running every
//! `interval` or after `every_blocks` newly published blocks, each segment holding the
//! blocks not yet on disk. At start the segments are read newest first into the free
//! blocks of the cache, as cached (evictable) blocks, so a repeated prompt after a restart
//! attaches them as if they had been computed in this run.
//!
//! A segment is keyed to the model file's SHA-256 and the KV geometry; a segment from
//! another model or layout is refused by its header. Every record carries a SHA-256 of
//! its bytes and the file a trailer over all of them, so a truncated, bit-flipped or torn
//! file is detected and skipped whole (renamed `*.corrupt`), never partly loaded. Writes
//! go to a `.tmp` file that is synced and renamed into place, so a process killed
//! mid-write leaves only a `.tmp`, which the next start deletes. Disk use stays under
//! `max_bytes`: the oldest segments are deleted first, and blocks of a deleted segment that
//! are still cached are written again with the next segment.
//!
//! File layout (little-endian):
//! ```text
//! header  "RKVCACHE" | version u32 | model key [32] | block_size u32 | n_layers u32
//!         | k_row u32 | v_row u32 | records u32 | SHA-256 of the preceding header bytes
//! record  key u128 | tenant label len u16 | label | tokens u32 x block_size
//!         | K/V data (per layer: K slots, V slots; f16) | SHA-256 of the preceding record bytes
//! trailer "RKVEND\0\0" | SHA-256 of all record digests
//! ```

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use runtime::kv::{BlockHash, KvCache, KvLayout};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"RKVCACHE";
const END: &[u8; 8] = b"RKVEND\0\0";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 32 + 5 * 4 + 32;
const EXT: &str = "rkv";

/// Test hook: the writer aborts the process after writing this many bytes of a segment
/// (as `kill -9` mid-write would leave it).
pub const ABORT_ENV: &str = "RSERVE_KV_PERSIST_ABORT_AFTER";

#[derive(Clone, Debug)]
pub struct PersistConfig {
    pub dir: PathBuf,
    /// Write new blocks at least this often while running (when there are any).
    pub interval: Duration,
    /// ... or as soon as this many new blocks are published.
    pub every_blocks: usize,
    /// Disk budget for this model's segments.
    pub max_bytes: u64,
}

/// The model key: the model file's SHA-256 with the KV geometry.
pub fn model_key(model_sha256_hex: &str, layout: &KvLayout) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"rserve kv v1\0");
    h.update(model_sha256_hex.as_bytes());
    for x in [
        layout.n_layers,
        layout.n_kv_heads,
        layout.head_dim_k,
        layout.head_dim_v,
        layout.block_size,
    ] {
        h.update((x as u64).to_le_bytes());
    }
    h.finalize().into()
}

/// One block read from or written to a segment.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub key: BlockHash,
    pub tenant: String,
    pub tokens: Vec<u32>,
    pub data: Vec<u8>,
}

/// The geometry fields of a header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    pub block_size: u32,
    pub n_layers: u32,
    pub k_row: u32,
    pub v_row: u32,
}

impl Geometry {
    pub fn of(l: &KvLayout) -> Geometry {
        Geometry {
            block_size: l.block_size as u32,
            n_layers: l.n_layers as u32,
            k_row: l.k_row() as u32,
            v_row: l.v_row() as u32,
        }
    }

    fn data_len(&self) -> usize {
        (self.k_row + self.v_row) as usize * self.block_size as usize * self.n_layers as usize * 2
    }
}

/// Serializes a segment.
pub fn encode(key: &[u8; 32], g: Geometry, records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(key);
    for x in [
        g.block_size,
        g.n_layers,
        g.k_row,
        g.v_row,
        records.len() as u32,
    ] {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let d = Sha256::digest(&out);
    out.extend_from_slice(&d);
    let mut all = Sha256::new();
    for r in records {
        let start = out.len();
        out.extend_from_slice(&r.key.to_le_bytes());
        let label = &r.tenant.as_bytes()[..r.tenant.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(label.len() as u16).to_le_bytes());
        out.extend_from_slice(label);
        for t in &r.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&r.data);
        let d = Sha256::digest(&out[start..]);
        all.update(d);
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(END);
    out.extend_from_slice(&all.finalize());
    out
}

/// Why a segment was not loaded.
#[derive(Debug, PartialEq)]
pub enum Refused {
    /// Written for another model file or KV layout (left in place).
    OtherModel,
    /// Truncated, torn or altered.
    Corrupt(String),
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Refused> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| Refused::Corrupt(format!("truncated at byte {}", self.b.len())))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, Refused> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
}

/// Parses and verifies a whole segment; nothing is returned unless every byte checks out.
pub fn decode(bytes: &[u8], key: &[u8; 32], g: Geometry) -> Result<Vec<Record>, Refused> {
    let mut r = Reader { b: bytes, at: 0 };
    if r.take(8)? != MAGIC {
        return Err(Refused::Corrupt("not a KV segment (bad magic)".into()));
    }
    let version = r.u32()?;
    let file_key: [u8; 32] = r.take(32)?.try_into().unwrap();
    let geo = Geometry {
        block_size: r.u32()?,
        n_layers: r.u32()?,
        k_row: r.u32()?,
        v_row: r.u32()?,
    };
    let n = r.u32()? as usize;
    let hd = r.take(32)?;
    if Sha256::digest(&bytes[..HEADER_LEN - 32]).as_slice() != hd {
        return Err(Refused::Corrupt("header checksum mismatch".into()));
    }
    if version != VERSION {
        return Err(Refused::Corrupt(format!("format version {version}")));
    }
    if &file_key != key || geo != g {
        return Err(Refused::OtherModel);
    }
    let mut all = Sha256::new();
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for i in 0..n {
        let start = r.at;
        let k = u128::from_le_bytes(r.take(16)?.try_into().unwrap());
        let ll = u16::from_le_bytes(r.take(2)?.try_into().unwrap()) as usize;
        let label = r.take(ll)?;
        let tokens: Vec<u32> = r
            .take(4 * g.block_size as usize)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let data = r.take(g.data_len())?;
        let d = Sha256::digest(&bytes[start..r.at]);
        if r.take(32)? != d.as_slice() {
            return Err(Refused::Corrupt(format!("record {i} checksum mismatch")));
        }
        all.update(d);
        out.push(Record {
            key: k,
            tenant: String::from_utf8_lossy(label).into_owned(),
            tokens,
            data: data.to_vec(),
        });
    }
    if r.take(8)? != END || r.take(32)? != all.finalize().as_slice() {
        return Err(Refused::Corrupt("bad trailer".into()));
    }
    if r.at != bytes.len() {
        return Err(Refused::Corrupt("bytes after the trailer".into()));
    }
    Ok(out)
}

/// A segment's sequence number from its file name `kv-<seq>.rkv`.
fn seg_of(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    name.strip_prefix("kv-")?
        .strip_suffix(&format!(".{EXT}"))?
        .parse()
        .ok()
}

/// One job for the writer thread: write `bytes` as segment `seg`, then delete `drop`.
struct Job {
    seg: u64,
    bytes: Vec<u8>,
    drop: Vec<u64>,
}

/// The engine side: what is on disk, what is new, when to write.
pub struct Persist {
    cfg: PersistConfig,
    key: [u8; 32],
    geo: Geometry,
    /// Keys on disk and the segment holding each.
    saved: HashMap<BlockHash, u64>,
    /// This model's segments, oldest first: (sequence number, bytes).
    segments: VecDeque<(u64, u64)>,
    next_seg: u64,
    new_blocks: usize,
    last_write: Instant,
    tx: Option<mpsc::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("rserve: kv-persist: {msg}");
}

impl Persist {
    /// Opens (creating) the directory, loads every valid segment of this model into the
    /// free blocks of `kv` (newest first, as many as fit) and starts the writer.
    /// `note` learns each loaded block's tenant. Returns the blocks loaded.
    pub fn open(
        cfg: PersistConfig,
        model_sha256_hex: &str,
        kv: &mut KvCache,
        mut note: impl FnMut(BlockHash, Arc<str>),
    ) -> anyhow::Result<(Persist, usize)> {
        fs::create_dir_all(&cfg.dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", cfg.dir.display()))?;
        let key = model_key(model_sha256_hex, kv.layout());
        let geo = Geometry::of(kv.layout());
        let mut found = Vec::new();
        for e in fs::read_dir(&cfg.dir)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", cfg.dir.display()))?
        {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".tmp") && name.starts_with("kv-") {
                log(format!(
                    "{}: a write that never finished (torn); deleted",
                    p.display()
                ));
                let _ = fs::remove_file(&p);
            } else if let Some(s) = seg_of(&p) {
                found.push((s, p));
            }
        }
        found.sort();
        let mut p = Persist {
            key,
            geo,
            saved: HashMap::new(),
            segments: VecDeque::new(),
            next_seg: found.last().map_or(1, |(s, _)| s + 1),
            new_blocks: 0,
            last_write: Instant::now(),
            tx: None,
            writer: None,
            cfg,
        };
        // Newest first, as many blocks as the cache has free; imported oldest first so
        // the newest are the last to be evicted.
        let mut budget = kv.free_blocks();
        let mut take: Vec<(u64, Vec<Record>)> = Vec::new();
        for (s, path) in found.iter().rev() {
            let bytes = match fs::read(path) {
                Ok(b) => b,
                Err(e) => {
                    log(format!("{}: unreadable ({e}); skipped", path.display()));
                    continue;
                }
            };
            match decode(&bytes, &key, geo) {
                Ok(mut recs) => {
                    p.segments.push_front((*s, bytes.len() as u64));
                    recs.retain(|r| !p.saved.contains_key(&r.key));
                    for r in &recs {
                        p.saved.insert(r.key, *s);
                    }
                    recs.truncate(budget);
                    budget -= recs.len();
                    take.push((*s, recs));
                }
                Err(Refused::OtherModel) => log(format!(
                    "{}: written for another model file or KV layout; not loaded (left in place)",
                    path.display()
                )),
                Err(Refused::Corrupt(why)) => {
                    let to = path.with_extension(format!("{EXT}.corrupt"));
                    log(format!(
                        "{}: corrupt ({why}); not loaded, renamed to {}",
                        path.display(),
                        to.display()
                    ));
                    let _ = fs::rename(path, &to);
                }
            }
        }
        let mut loaded = 0;
        for (_, recs) in take.into_iter().rev() {
            for r in recs {
                if kv.import_block(r.key, &r.tokens, &r.data) {
                    note(r.key, Arc::from(r.tenant.as_str()));
                    loaded += 1;
                }
            }
        }
        let (tx, rx) = mpsc::channel::<Job>();
        let dir = p.cfg.dir.clone();
        p.writer = Some(
            std::thread::Builder::new()
                .name("kv-persist".into())
                .spawn(move || writer(&dir, &rx))?,
        );
        p.tx = Some(tx);
        Ok((p, loaded))
    }

    /// Counts newly published blocks.
    pub fn published(&mut self, n: usize) {
        self.new_blocks += n;
    }

    /// Whether a write is due (new blocks and the interval passed, or enough new blocks).
    pub fn due(&self) -> bool {
        self.new_blocks > 0
            && (self.new_blocks >= self.cfg.every_blocks
                || self.last_write.elapsed() >= self.cfg.interval)
    }

    /// How long the engine may sleep before [`due`](Self::due) can turn true by time.
    pub fn wait_hint(&self) -> Option<Duration> {
        (self.new_blocks > 0).then(|| self.cfg.interval.saturating_sub(self.last_write.elapsed()))
    }

    /// Copies the published blocks not on disk into a new segment for the writer, first
    /// dropping the oldest segments as needed to stay under the disk budget. `tenant`
    /// names each block's tenant.
    pub fn write_new(&mut self, kv: &KvCache, tenant: impl Fn(&BlockHash) -> Option<Arc<str>>) {
        self.new_blocks = 0;
        self.last_write = Instant::now();
        let rec_len = |label: usize| {
            16 + 2 + label + 4 * self.geo.block_size as usize + self.geo.data_len() + 32
        };
        let fixed = (HEADER_LEN + 8 + 32) as u64;
        let mut new: Vec<BlockHash> = kv
            .published_keys()
            .filter(|k| !self.saved.contains_key(k))
            .collect();
        let size_of = |keys: &[BlockHash]| -> u64 {
            fixed
                + keys
                    .iter()
                    .map(|k| rec_len(tenant(k).map_or(0, |t| t.len())) as u64)
                    .sum::<u64>()
        };
        let mut on_disk: u64 = self.segments.iter().map(|s| s.1).sum();
        let mut drop = Vec::new();
        while !new.is_empty()
            && on_disk + size_of(&new) > self.cfg.max_bytes
            && !self.segments.is_empty()
        {
            let (s, b) = self.segments.pop_front().unwrap();
            on_disk -= b;
            drop.push(s);
            let gone: Vec<BlockHash> = self
                .saved
                .iter()
                .filter(|(_, &seg)| seg == s)
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                self.saved.remove(&k);
                if kv.is_published(&k) {
                    new.push(k);
                }
            }
        }
        // A cache bigger than the budget: keep what fits.
        while !new.is_empty() && size_of(&new) > self.cfg.max_bytes {
            new.truncate(new.len() - new.len().div_ceil(8));
        }
        if new.is_empty() && drop.is_empty() {
            return;
        }
        let mut recs = Vec::with_capacity(new.len());
        for k in &new {
            let mut data = Vec::new();
            if let Some(tokens) = kv.export_block(k, &mut data) {
                recs.push(Record {
                    key: *k,
                    tenant: tenant(k).map_or_else(String::new, |t| t.to_string()),
                    tokens,
                    data,
                });
            }
        }
        let seg = self.next_seg;
        self.next_seg += 1;
        let bytes = encode(&self.key, self.geo, &recs);
        if !recs.is_empty() {
            for r in &recs {
                self.saved.insert(r.key, seg);
            }
            self.segments.push_back((seg, bytes.len() as u64));
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(Job {
                seg,
                bytes: if recs.is_empty() { Vec::new() } else { bytes },
                drop,
            });
        }
    }

    /// Writes what is new and waits for the writer to finish (shutdown).
    pub fn finish(&mut self, kv: &KvCache, tenant: impl Fn(&BlockHash) -> Option<Arc<str>>) {
        if self.new_blocks > 0 {
            self.write_new(kv, tenant);
        }
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }

    /// Bytes of this model's segments on disk (as last written).
    pub fn disk_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.1).sum()
    }
}

fn writer(dir: &Path, rx: &mpsc::Receiver<Job>) {
    let abort_after: Option<usize> = std::env::var(ABORT_ENV).ok().and_then(|v| v.parse().ok());
    while let Ok(job) = rx.recv() {
        if !job.bytes.is_empty() {
            let path = dir.join(format!("kv-{:08}.{EXT}", job.seg));
            let tmp = dir.join(format!("kv-{:08}.{EXT}.tmp", job.seg));
            let r = (|| -> std::io::Result<()> {
                let mut f = fs::File::create(&tmp)?;
                match abort_after {
                    Some(n) if n < job.bytes.len() => {
                        f.write_all(&job.bytes[..n])?;
                        f.sync_all()?;
                        log(format!(
                            "test hook: aborting after {n} bytes of {}",
                            tmp.display()
                        ));
                        std::process::abort();
                    }
                    _ => f.write_all(&job.bytes)?,
                }
                f.sync_all()?;
                fs::rename(&tmp, &path)?;
                if let Ok(d) = fs::File::open(dir) {
                    let _ = d.sync_all();
                }
                Ok(())
            })();
            match r {
                Ok(()) => log(format!(
                    "wrote {} ({:.1} MiB)",
                    path.display(),
                    job.bytes.len() as f64 / (1 << 20) as f64
                )),
                Err(e) => {
                    log(format!(
                        "cannot write {}: {e}; blocks stay in memory only",
                        path.display()
                    ));
                    let _ = fs::remove_file(&tmp);
                }
            }
        }
        for s in job.drop {
            let p = dir.join(format!("kv-{s:08}.{EXT}"));
            if fs::remove_file(&p).is_ok() {
                log(format!(
                    "disk budget: deleted the oldest segment {}",
                    p.display()
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            block_size: 4,
            n_layers: 2,
            k_row: 3,
            v_row: 3,
        }
    }

    fn recs(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                key: (i as u128) << 70 | 5,
                tenant: if i % 2 == 0 {
                    "default".into()
                } else {
                    "alice".into()
                },
                tokens: vec![i as u32; 4],
                data: (0..geo().data_len()).map(|j| (i * 31 + j) as u8).collect(),
            })
            .collect()
    }

    #[test]
    fn segments_round_trip_and_every_damage_is_caught() {
        let key = [7u8; 32];
        let r = recs(3);
        let bytes = encode(&key, geo(), &r);
        assert_eq!(decode(&bytes, &key, geo()).unwrap(), r);
        assert_eq!(
            decode(&encode(&key, geo(), &[]), &key, geo()).unwrap(),
            vec![]
        );
        // Another model or geometry: refused as such.
        assert_eq!(decode(&bytes, &[8u8; 32], geo()), Err(Refused::OtherModel));
        let g2 = Geometry { k_row: 4, ..geo() };
        assert_eq!(decode(&bytes, &key, g2), Err(Refused::OtherModel));
        // Every truncation and every single bit flip is corrupt, never a partial load.
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut], &key, geo()), Err(Refused::Corrupt(_))),
                "cut at {cut}"
            );
        }
        for i in 0..bytes.len() {
            for bit in [0, 3, 7] {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b, &key, geo()).is_err(), "flip at {i}.{bit}");
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, &key, geo()).is_err());
    }

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

    /// Computes and publishes an 8-token sequence (2 blocks) with values from `salt`.
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

    /// Writes on the block trigger, keeps the directory under its budget by deleting the
    /// oldest segment (re-writing its still-cached blocks), and a reopened cache gets the
    /// newest blocks with identical data.
    #[test]
    fn budget_drops_the_oldest_segments_first() {
        let d = tempfile::tempdir().unwrap();
        let one_block = 16 + 2 + 7 + 16 + 64 + 32;
        let cfg = PersistConfig {
            dir: d.path().to_path_buf(),
            interval: Duration::from_secs(3600),
            every_blocks: 2,
            max_bytes: (HEADER_LEN + 40 + 5 * one_block) as u64,
        };
        let mut kv = KvCache::new(layout(4));
        let (mut p, n) = Persist::open(cfg.clone(), "aa", &mut kv, |_, _| {}).unwrap();
        assert_eq!(n, 0);
        let tenant = |_: &BlockHash| Some(Arc::from("default"));
        let mut all = Vec::new();
        for salt in 1..=4 {
            // A 4-block cache: each new sequence evicts the oldest cached one.
            all.push(publish_seq(&mut kv, salt as u64, salt));
            p.published(2);
            assert!(p.due());
            p.write_new(&kv, tenant);
            assert!(p.disk_bytes() <= cfg.max_bytes, "{}", p.disk_bytes());
        }
        p.finish(&kv, tenant);
        let on_disk: u64 = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(on_disk <= cfg.max_bytes, "{on_disk}");
        assert!(!d.path().join("kv-00000001.rkv").exists(), "oldest deleted");
        let mut kv2 = KvCache::new(layout(8));
        let (_p2, n) = Persist::open(cfg, "aa", &mut kv2, |_, _| {}).unwrap();
        assert!(n >= 4, "{n}");
        for h in &all[2..] {
            for k in h {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                assert_eq!(kv.export_block(k, &mut a), kv2.export_block(k, &mut b));
                assert_eq!(a, b);
                assert!(!b.is_empty());
            }
        }
        // A different model hash refuses them all.
        let mut kv3 = KvCache::new(layout(8));
        let cfg3 = PersistConfig {
            dir: d.path().to_path_buf(),
            interval: Duration::from_secs(1),
            every_blocks: 1,
            max_bytes: 1 << 20,
        };
        assert_eq!(Persist::open(cfg3, "bb", &mut kv3, |_, _| {}).unwrap().1, 0);
    }
}
