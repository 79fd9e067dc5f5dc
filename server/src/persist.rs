//! A prefix cache that survives restarts (`rserve --kv-persist DIR`).
//!
//! Published KV blocks are written to segment files: on shutdown, and while running every
//! `interval` or after `every_blocks` newly published blocks, each segment holding the
//! blocks not yet on disk. At start the segments are read newest first into the free
//! blocks of the cache, as cached (evictable) blocks, so a repeated prompt after a restart
//! attaches them as if they had been computed in this run.
//!
//! The directory is treated as hostile ground. It must be owned by this user and not
//! writable by others (it is made 0700, files 0600, whatever the umask). Every file is
//! opened relative to a handle on the directory without following symbolic links, temp
//! files are created exclusively, and only regular files of bounded size are read, never
//! blocking (a FIFO is skipped). A lock on `DIR/lock` keeps a second server off the same
//! directory. Segments are authenticated with HMAC-SHA-256 under a per-directory secret
//! (`DIR/secret`, 32 random bytes, 0600, made on first use), so a segment edited or forged
//! by someone without the secret is refused; tenant labels read back are reduced to a
//! safe alphabet all the same.
//!
//! A segment is keyed to the model file's SHA-256 and the KV geometry; a segment from
//! another model or layout is refused by its header. Every record and the whole file
//! carry MACs, so a truncated, bit-flipped, torn or forged file is skipped whole (renamed
//! `*.corrupt`), never partly loaded. Writes go to a `.tmp` file that is synced and
//! renamed into place (then the directory is synced); only then are its blocks counted as
//! saved. A failed write (a full disk) leaves its blocks pending, counted in
//! [`Persist::write_errors`], and they are written with the next segment. Disk use stays
//! under `max_bytes`: the oldest segments are deleted first, and blocks of a deleted
//! segment that are still cached are written again with the next segment.
//!
//! File layout (little-endian):
//! ```text
//! header  "RKVCACHE" | version u32 | model key [32] | block_size u32 | n_layers u32
//!         | k_row u32 | v_row u32 | records u32 | MAC of the preceding header bytes
//! record  key u128 | tenant label len u16 | label | tokens u32 x block_size
//!         | K/V data (per layer: K slots, V slots; f16) | MAC of the preceding record bytes
//! trailer "RKVEND\0\0" | MAC of all record MACs
//! ```

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use runtime::kv::{BlockHash, KvCache, KvLayout};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"RKVCACHE";
const END: &[u8; 8] = b"RKVEND\0\0";
const VERSION: u32 = 2;
const HEADER_LEN: usize = 8 + 4 + 32 + 5 * 4 + 32;
const EXT: &str = "rkv";
const SECRET: &str = "secret";
const LOCK: &str = "lock";

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

/// HMAC-SHA-256 under a directory's secret: what authenticates a segment's bytes.
#[derive(Clone)]
pub struct Mac {
    ipad: [u8; 64],
    opad: [u8; 64],
}

impl Mac {
    pub fn new(secret: &[u8; 32]) -> Mac {
        let mut ipad = [0x36u8; 64];
        let mut opad = [0x5cu8; 64];
        for (i, &b) in secret.iter().enumerate() {
            ipad[i] ^= b;
            opad[i] ^= b;
        }
        Mac { ipad, opad }
    }

    pub fn tag(&self, data: &[u8]) -> [u8; 32] {
        let inner = Sha256::new()
            .chain_update(self.ipad)
            .chain_update(data)
            .finalize();
        Sha256::new()
            .chain_update(self.opad)
            .chain_update(inner)
            .finalize()
            .into()
    }
}

/// Compares tags without an early exit.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serializes a segment, authenticated under `mac`.
pub fn encode(key: &[u8; 32], mac: &Mac, g: Geometry, records: &[Record]) -> Vec<u8> {
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
    let d = mac.tag(&out);
    out.extend_from_slice(&d);
    let mut all = Vec::with_capacity(32 * records.len());
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
        let d = mac.tag(&out[start..]);
        all.extend_from_slice(&d);
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(END);
    out.extend_from_slice(&mac.tag(&all));
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

/// Parses and verifies a whole segment; nothing is returned unless every byte checks out
/// under `mac`. Tenant labels come back reduced to the safe alphabet.
pub fn decode(
    bytes: &[u8],
    key: &[u8; 32],
    mac: &Mac,
    g: Geometry,
) -> Result<Vec<Record>, Refused> {
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
    if !same(&mac.tag(&bytes[..HEADER_LEN - 32]), hd) {
        return Err(Refused::Corrupt(
            "header MAC mismatch (damaged, or not written with this directory's secret)".into(),
        ));
    }
    if version != VERSION {
        return Err(Refused::Corrupt(format!("format version {version}")));
    }
    if &file_key != key || geo != g {
        return Err(Refused::OtherModel);
    }
    let mut all = Vec::new();
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
        let d = mac.tag(&bytes[start..r.at]);
        if !same(r.take(32)?, &d) {
            return Err(Refused::Corrupt(format!("record {i} MAC mismatch")));
        }
        all.extend_from_slice(&d);
        out.push(Record {
            key: k,
            tenant: crate::tenant::safe_label(&String::from_utf8_lossy(label)),
            tokens,
            data: data.to_vec(),
        });
    }
    if r.take(8)? != END || !same(r.take(32)?, &mac.tag(&all)) {
        return Err(Refused::Corrupt("bad trailer".into()));
    }
    if r.at != bytes.len() {
        return Err(Refused::Corrupt("bytes after the trailer".into()));
    }
    Ok(out)
}

/// A segment's sequence number from its file name `kv-<seq>.rkv`.
fn seg_of(name: &str) -> Option<u64> {
    name.strip_prefix("kv-")?
        .strip_suffix(&format!(".{EXT}"))?
        .parse()
        .ok()
}

fn seg_name(seg: u64) -> String {
    format!("kv-{seg:08}.{EXT}")
}

fn cstr(name: &str) -> std::io::Result<CString> {
    CString::new(name).map_err(|_| std::io::Error::other("a NUL in a file name"))
}

fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The persist directory, held open: every file is reached relative to this handle,
/// never following a symbolic link, so nothing planted in the directory (or a path
/// swapped above it) redirects a read or a write.
struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    fn open(path: &Path) -> std::io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::other("a NUL in the path"))?;
        // SAFETY: a valid C string; the returned descriptor is owned below.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Dir {
            fd,
            path: path.to_path_buf(),
        })
    }

    fn openat(&self, name: &str, flags: libc::c_int) -> std::io::Result<File> {
        let c = cstr(name)?;
        // SAFETY: a valid directory descriptor and C string; the descriptor is owned by
        // the File.
        let fd = check(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// A new file, created exclusively (never an existing file or link), mode 0600
    /// whatever the umask.
    fn create_new(&self, name: &str) -> std::io::Result<File> {
        let f = self.openat(name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL)?;
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        Ok(f)
    }

    /// Reads a regular file of at most `cap` bytes without blocking (a FIFO or device is
    /// refused, not waited on).
    fn read_regular(&self, name: &str, cap: u64) -> std::io::Result<Vec<u8>> {
        let mut f = self.openat(name, libc::O_RDONLY | libc::O_NONBLOCK)?;
        let m = f.metadata()?;
        if !m.file_type().is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if m.len() > cap {
            return Err(std::io::Error::other(format!(
                "{} bytes, more than the {cap} a segment may have",
                m.len()
            )));
        }
        let mut v = Vec::with_capacity(m.len() as usize);
        Read::by_ref(&mut f).take(cap + 1).read_to_end(&mut v)?;
        Ok(v)
    }

    fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        let (a, b) = (cstr(from)?, cstr(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: valid descriptors and C strings.
        check(unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) }).map(|_| ())
    }

    /// Removes a name (a link itself, never its target).
    fn unlink(&self, name: &str) -> std::io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: a valid descriptor and C string.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(|_| ())
    }

    fn sync(&self) -> std::io::Result<()> {
        // SAFETY: a valid descriptor.
        check(unsafe { libc::fsync(self.fd.as_raw_fd()) }).map(|_| ())
    }

    fn names(&self) -> std::io::Result<Vec<String>> {
        let mut v = Vec::new();
        for e in fs::read_dir(&self.path)? {
            if let Some(n) = e?.file_name().to_str() {
                v.push(n.to_string());
            }
        }
        Ok(v)
    }
}

/// Checks (and fixes the mode of) the persist directory: ours, a real directory, not
/// writable by anyone else.
fn secure_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let m = fs::symlink_metadata(dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", dir.display()))?;
    if !m.file_type().is_dir() {
        anyhow::bail!(
            "{} is not a directory (a symbolic link is not accepted)",
            dir.display()
        );
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if m.uid() != me {
        anyhow::bail!(
            "{} is owned by uid {}, not by this user (uid {me}); use a directory of your own",
            dir.display(),
            m.uid()
        );
    }
    if m.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} is writable by other users (mode {:o}); make it 0700",
            dir.display(),
            m.mode() & 0o777
        );
    }
    if m.mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| anyhow::anyhow!("cannot make {} 0700: {e}", dir.display()))?;
    }
    Ok(())
}

/// Takes the directory's lock (released when the returned file closes).
fn lock(dir: &Dir) -> anyhow::Result<File> {
    let f = dir
        .openat(LOCK, libc::O_RDWR | libc::O_CREAT)
        .map_err(|e| anyhow::anyhow!("cannot open {}/{LOCK}: {e}", dir.path.display()))?;
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    // A holder that is going away (a server just stopped, or a child process forked by
    // some thread in the instant before its exec closed the inherited descriptor) gets
    // two seconds to let go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    // SAFETY: a valid descriptor.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        if std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        anyhow::bail!(
            "{} is in use by another rserve (it holds {LOCK}); give each server its own \
             --kv-persist directory",
            dir.path.display()
        );
    }
    Ok(f)
}

/// The directory's MAC secret: read, or made on first use (32 random bytes, 0600).
fn secret(dir: &Dir) -> anyhow::Result<[u8; 32]> {
    let shown = || format!("{}/{SECRET}", dir.path.display());
    match dir.read_regular(SECRET, 32) {
        Ok(b) => {
            let f = dir.openat(SECRET, libc::O_RDONLY | libc::O_NONBLOCK)?;
            let m = f.metadata()?;
            // SAFETY: geteuid has no preconditions.
            if m.uid() != unsafe { libc::geteuid() } || m.mode() & 0o077 != 0 {
                anyhow::bail!("{} must be owned by this user and mode 0600", shown());
            }
            b.try_into()
                .map_err(|_| anyhow::anyhow!("{} is not a 32-byte secret", shown()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut s = [0u8; 32];
            File::open("/dev/urandom")
                .and_then(|mut r| r.read_exact(&mut s))
                .map_err(|e| anyhow::anyhow!("cannot read random bytes: {e}"))?;
            let mut f = dir
                .create_new(SECRET)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", shown()))?;
            f.write_all(&s)?;
            f.sync_all()?;
            dir.sync()?;
            Ok(s)
        }
        Err(e) => anyhow::bail!("cannot read {}: {e}", shown()),
    }
}

/// One job for the writer thread: write `bytes` as segment `seg`, then delete `drop`.
struct Job {
    seg: u64,
    bytes: Vec<u8>,
    drop: Vec<u64>,
}

/// What the writer reports for a job with bytes.
struct Done {
    seg: u64,
    ok: bool,
}

/// The engine side: what is on disk, what is new, when to write.
pub struct Persist {
    cfg: PersistConfig,
    key: [u8; 32],
    mac: Mac,
    geo: Geometry,
    /// Keys durable on disk and the segment holding each.
    saved: HashMap<BlockHash, u64>,
    /// Segments handed to the writer, not yet reported: their keys and bytes.
    in_flight: HashMap<u64, (Vec<BlockHash>, u64)>,
    /// This model's segments, oldest first: (sequence number, bytes).
    segments: VecDeque<(u64, u64)>,
    next_seg: u64,
    new_blocks: usize,
    last_write: Instant,
    write_errors: u64,
    tx: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Held for the directory's lock.
    _lock: File,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!("rserve: kv-persist: {msg}");
}

impl Persist {
    /// Opens (creating) the directory, loads every valid segment of this model into the
    /// free blocks of `kv` (newest first, as many as fit) and starts the writer.
    /// `note` learns each loaded block's tenant. Returns the blocks loaded. Fails when the
    /// directory is not this user's own, or another server holds it.
    pub fn open(
        cfg: PersistConfig,
        model_sha256_hex: &str,
        kv: &mut KvCache,
        mut note: impl FnMut(BlockHash, Arc<str>),
    ) -> anyhow::Result<(Persist, usize)> {
        secure_dir(&cfg.dir)?;
        let dir = Dir::open(&cfg.dir)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", cfg.dir.display()))?;
        let lock_file = lock(&dir)?;
        let mac = Mac::new(&secret(&dir)?);
        let key = model_key(model_sha256_hex, kv.layout());
        let geo = Geometry::of(kv.layout());
        let mut found = Vec::new();
        for name in dir
            .names()
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", cfg.dir.display()))?
        {
            if name.ends_with(".tmp") && name.starts_with("kv-") {
                log(format!(
                    "{}/{name}: a write that never finished (torn); deleted",
                    cfg.dir.display()
                ));
                let _ = dir.unlink(&name);
            } else if let Some(s) = seg_of(&name) {
                found.push((s, name));
            }
        }
        found.sort();
        let (done_tx, done) = mpsc::channel();
        let mut p = Persist {
            key,
            mac,
            geo,
            saved: HashMap::new(),
            in_flight: HashMap::new(),
            segments: VecDeque::new(),
            next_seg: found.last().map_or(1, |(s, _)| s + 1),
            new_blocks: 0,
            last_write: Instant::now(),
            write_errors: 0,
            tx: None,
            done,
            writer: None,
            _lock: lock_file,
            cfg,
        };
        // Newest first, as many blocks as the cache has free; imported oldest first so
        // the newest are the last to be evicted.
        let cap = p.cfg.max_bytes.saturating_add(1 << 20);
        let mut budget = kv.free_blocks();
        let mut take: Vec<(u64, Vec<Record>)> = Vec::new();
        for (s, name) in found.iter().rev() {
            let shown = p.cfg.dir.join(name);
            let bytes = match dir.read_regular(name, cap) {
                Ok(b) => b,
                Err(e) => {
                    log(format!("{}: unreadable ({e}); skipped", shown.display()));
                    continue;
                }
            };
            match decode(&bytes, &key, &p.mac, geo) {
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
                    shown.display()
                )),
                Err(Refused::Corrupt(why)) => {
                    let to = format!("{name}.corrupt");
                    log(format!(
                        "{}: corrupt ({why}); not loaded, renamed to {to}",
                        shown.display()
                    ));
                    let _ = dir.rename(name, &to);
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
        p.writer = Some(
            std::thread::Builder::new()
                .name("kv-persist".into())
                .spawn(move || writer(&dir, &rx, &done_tx))?,
        );
        p.tx = Some(tx);
        Ok((p, loaded))
    }

    /// Counts newly published blocks.
    pub fn published(&mut self, n: usize) {
        self.new_blocks += n;
    }

    /// Takes the writer's reports, then says whether a write is due (new blocks and the
    /// interval passed, or enough new blocks).
    pub fn due(&mut self) -> bool {
        self.poll();
        self.is_due()
    }

    /// Whether a write is due, from what the writer reported so far.
    pub fn is_due(&self) -> bool {
        self.new_blocks > 0
            && (self.new_blocks >= self.cfg.every_blocks
                || self.last_write.elapsed() >= self.cfg.interval)
    }

    /// How long the engine may sleep before [`due`](Self::due) can turn true by time.
    pub fn wait_hint(&self) -> Option<Duration> {
        (self.new_blocks > 0).then(|| self.cfg.interval.saturating_sub(self.last_write.elapsed()))
    }

    /// Segment writes that failed so far (their blocks were kept for a later write).
    pub fn write_errors(&self) -> u64 {
        self.write_errors
    }

    /// Published blocks not yet durable: new since the last write, or in a write not yet
    /// finished.
    pub fn pending_blocks(&self) -> usize {
        self.new_blocks + self.in_flight.values().map(|j| j.0.len()).sum::<usize>()
    }

    /// Takes the writer's reports: a written segment's blocks are saved; a failed one's
    /// are new again (retried on the next write).
    fn poll(&mut self) {
        while let Ok(d) = self.done.try_recv() {
            self.settle(d);
        }
    }

    fn settle(&mut self, d: Done) {
        let Some((keys, bytes)) = self.in_flight.remove(&d.seg) else {
            return;
        };
        if d.ok {
            for k in keys {
                self.saved.insert(k, d.seg);
            }
            self.segments.push_back((d.seg, bytes));
        } else {
            self.write_errors += 1;
            self.new_blocks += keys.len();
        }
    }

    /// Waits for every write in flight to be reported.
    fn settle_all(&mut self) {
        while !self.in_flight.is_empty() {
            match self.done.recv() {
                Ok(d) => self.settle(d),
                Err(_) => {
                    // The writer is gone: what it had is not on disk.
                    for (_, (keys, _)) in self.in_flight.drain() {
                        self.new_blocks += keys.len();
                    }
                }
            }
        }
    }

    /// Copies the published blocks not on disk (nor being written) into a new segment
    /// for the writer, first dropping the oldest segments as needed to stay under the disk
    /// budget. `tenant` names each block's tenant.
    pub fn write_new(&mut self, kv: &KvCache, tenant: impl Fn(&BlockHash) -> Option<Arc<str>>) {
        self.poll();
        if !self.in_flight.is_empty() {
            // One write at a time: the next starts once this one is reported (the engine
            // never waits on the disk).
            return;
        }
        self.new_blocks = 0;
        self.last_write = Instant::now();
        let rec_len = |label: usize| {
            16 + 2 + label + 4 * self.geo.block_size as usize + self.geo.data_len() + 32
        };
        let fixed = (HEADER_LEN + 8 + 32) as u64;
        let writing: std::collections::HashSet<BlockHash> = self
            .in_flight
            .values()
            .flat_map(|j| j.0.iter().copied())
            .collect();
        let mut new: Vec<BlockHash> = kv
            .published_keys()
            .filter(|k| !self.saved.contains_key(k) && !writing.contains(k))
            .collect();
        let label_of =
            |k: &BlockHash| tenant(k).map_or_else(String::new, |t| crate::tenant::safe_label(&t));
        let size_of = |keys: &[BlockHash]| -> u64 {
            fixed
                + keys
                    .iter()
                    .map(|k| rec_len(label_of(k).len()) as u64)
                    .sum::<u64>()
        };
        let mut on_disk: u64 = self.segments.iter().map(|s| s.1).sum::<u64>()
            + self.in_flight.values().map(|j| j.1).sum::<u64>();
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
                    tenant: label_of(k),
                    tokens,
                    data,
                });
            }
        }
        let seg = self.next_seg;
        self.next_seg += 1;
        let bytes = encode(&self.key, &self.mac, self.geo, &recs);
        if !recs.is_empty() {
            self.in_flight.insert(
                seg,
                (recs.iter().map(|r| r.key).collect(), bytes.len() as u64),
            );
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(Job {
                seg,
                bytes: if recs.is_empty() { Vec::new() } else { bytes },
                drop,
            });
        }
    }

    /// Writes what is new (after the writes in flight, so blocks of a failed one are
    /// retried) and waits for the writer to finish (shutdown).
    pub fn finish(&mut self, kv: &KvCache, tenant: impl Fn(&BlockHash) -> Option<Arc<str>>) {
        self.settle_all();
        if self.new_blocks > 0 {
            self.write_new(kv, tenant);
        }
        self.settle_all();
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
        if self.new_blocks > 0 {
            log(format!(
                "{} blocks could not be written before shutdown",
                self.new_blocks
            ));
        }
    }

    /// Bytes of this model's segments on disk (as last written).
    pub fn disk_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.1).sum()
    }
}

/// Writes `bytes` durably as `name`: a temp file created exclusively (a planted link or
/// file at its name is removed, never followed), synced, renamed, and the directory
/// synced.
fn write_segment(
    dir: &Dir,
    name: &str,
    bytes: &[u8],
    abort_after: Option<usize>,
) -> std::io::Result<()> {
    let tmp = format!("{name}.tmp");
    let mut f = match dir.create_new(&tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            dir.unlink(&tmp)?;
            dir.create_new(&tmp)?
        }
        r => r?,
    };
    let r = (|| {
        match abort_after {
            Some(n) if n < bytes.len() => {
                f.write_all(&bytes[..n])?;
                f.sync_all()?;
                log(format!(
                    "test hook: aborting after {n} bytes of {}/{tmp}",
                    dir.path.display()
                ));
                std::process::abort();
            }
            _ => f.write_all(bytes)?,
        }
        f.sync_all()?;
        dir.rename(&tmp, name)?;
        dir.sync()
    })();
    if r.is_err() {
        let _ = dir.unlink(&tmp);
    }
    r
}

fn writer(dir: &Dir, rx: &mpsc::Receiver<Job>, done: &mpsc::Sender<Done>) {
    let abort_after: Option<usize> = runtime::options::Env::get()
        .persist_abort_after
        .as_deref()
        .and_then(|v| v.parse().ok());
    while let Ok(job) = rx.recv() {
        if !job.bytes.is_empty() {
            let name = seg_name(job.seg);
            let ok = match write_segment(dir, &name, &job.bytes, abort_after) {
                Ok(()) => {
                    log(format!(
                        "wrote {}/{name} ({:.1} MiB)",
                        dir.path.display(),
                        job.bytes.len() as f64 / (1 << 20) as f64
                    ));
                    true
                }
                Err(e) => {
                    log(format!(
                        "cannot write {}/{name}: {e}; its blocks stay pending and are retried",
                        dir.path.display()
                    ));
                    false
                }
            };
            let _ = done.send(Done { seg: job.seg, ok });
        }
        for s in job.drop {
            let name = seg_name(s);
            if dir.unlink(&name).is_ok() {
                log(format!(
                    "disk budget: deleted the oldest segment {}/{name}",
                    dir.path.display()
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
        let mac = Mac::new(&[9u8; 32]);
        let r = recs(3);
        let bytes = encode(&key, &mac, geo(), &r);
        assert_eq!(decode(&bytes, &key, &mac, geo()).unwrap(), r);
        assert_eq!(
            decode(&encode(&key, &mac, geo(), &[]), &key, &mac, geo()).unwrap(),
            vec![]
        );
        // Another model or geometry: refused as such.
        assert_eq!(
            decode(&bytes, &[8u8; 32], &mac, geo()),
            Err(Refused::OtherModel)
        );
        let g2 = Geometry { k_row: 4, ..geo() };
        assert_eq!(decode(&bytes, &key, &mac, g2), Err(Refused::OtherModel));
        // Another secret: a forgery, however well formed.
        let other = Mac::new(&[10u8; 32]);
        assert!(matches!(
            decode(&encode(&key, &other, geo(), &r), &key, &mac, geo()),
            Err(Refused::Corrupt(_))
        ));
        // Every truncation and every single bit flip is corrupt, never a partial load.
        for cut in 0..bytes.len() {
            assert!(
                matches!(
                    decode(&bytes[..cut], &key, &mac, geo()),
                    Err(Refused::Corrupt(_))
                ),
                "cut at {cut}"
            );
        }
        for i in 0..bytes.len() {
            for bit in [0, 3, 7] {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(decode(&b, &key, &mac, geo()).is_err(), "flip at {i}.{bit}");
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer, &key, &mac, geo()).is_err());
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
            p.settle_all();
            assert!(p.due());
            p.write_new(&kv, tenant);
            assert!(p.disk_bytes() <= cfg.max_bytes, "{}", p.disk_bytes());
        }
        p.finish(&kv, tenant);
        drop(p);
        let on_disk: u64 = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".rkv"))
            .map(|e| e.metadata().unwrap().len())
            .sum();
        assert!(on_disk <= cfg.max_bytes, "{on_disk}");
        assert!(!d.path().join("kv-00000001.rkv").exists(), "oldest deleted");
        let mut kv2 = KvCache::new(layout(8));
        let (p2, n) = Persist::open(cfg, "aa", &mut kv2, |_, _| {}).unwrap();
        assert!(n >= 4, "{n}");
        drop(p2);
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
