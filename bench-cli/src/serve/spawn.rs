//! Servers that `rbench serve --spawn` starts itself: a command line per contestant,
//! started in its own process group on a free port, ready once `/health` answers 200,
//! stopped (SIGTERM, then SIGKILL) afterwards or between points, with its command line and
//! version recorded in every result line.
//!
//! `--spawn NAME="CMD …"` runs CMD through `sh -c` (`{port}` is replaced by the port; without
//! it, `--host 127.0.0.1 --port P` is appended). Two names are built in: `rserve` (the binary
//! next to rbench) and `llama-server` (found as `$LLAMA_SERVER`, on PATH, or built into the
//! cache from a llama.cpp checkout named by `$LLAMA_CPP_SRC`), both given the same model,
//! threads, slots and per-slot context.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What the built-in contestants are given.
#[derive(Debug, Clone)]
pub struct SpawnDefaults {
    /// Registry name or GGUF path.
    pub model: String,
    pub threads: usize,
    /// Slots (sequences decoded together).
    pub parallel: usize,
    /// Per-slot context.
    pub ctx: usize,
}

/// The flags that give the built-in contestants their [`SpawnDefaults`] (shared by
/// `rbench serve` and `rbench soak`).
#[derive(clap::Args, Debug, Clone)]
pub struct ServerFlags {
    /// Built-in servers: model (registry name or GGUF path).
    #[arg(long, default_value = "smollm2-135m")]
    pub server_model: String,
    /// Built-in servers: compute threads [default: all cores].
    #[arg(long)]
    pub server_threads: Option<usize>,
    /// Built-in servers: slots (sequences decoded together).
    #[arg(long, default_value_t = 16)]
    pub server_parallel: usize,
    /// Built-in servers: per-slot context.
    #[arg(long, default_value_t = 2048)]
    pub server_ctx: usize,
}

impl ServerFlags {
    /// What the built-in contestants get from these flags.
    pub fn defaults(&self) -> SpawnDefaults {
        SpawnDefaults {
            model: self.server_model.clone(),
            threads: self
                .server_threads
                .unwrap_or_else(runtime::options::default_threads),
            parallel: self.server_parallel.max(1),
            ctx: self.server_ctx,
        }
    }
}

/// One contestant.
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnSpec {
    pub name: String,
    /// The command line; `{port}` is replaced at start.
    pub argv: Vec<String>,
    /// Run through `sh -c` (user commands) or directly (built-ins).
    pub shell: bool,
}

impl SpawnSpec {
    /// The command line as recorded (with the port filled in).
    pub fn command_line(&self, port: u16) -> String {
        let p = port.to_string();
        self.argv
            .iter()
            .map(|a| a.replace("{port}", &p))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Whether `name` may label a contestant (a server, an engine, a command) in results and
/// report columns: non-empty, letters, digits, '-', '_' or '.'.
pub fn is_label(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Parses `NAME=CMD` or a built-in name.
pub fn parse_spawn(s: &str, d: &SpawnDefaults) -> Result<SpawnSpec> {
    let (name, cmd) = match s.split_once('=') {
        Some((n, c)) => (n.trim(), Some(c.trim())),
        None => (s.trim(), None),
    };
    if !is_label(name) {
        bail!("--spawn {s:?}: the name must be letters, digits, '-', '_' or '.'");
    }
    match cmd {
        Some("") => bail!("--spawn {name}=: empty command"),
        Some(c) => {
            let mut cmd = c.to_string();
            if !cmd.contains("{port}") {
                cmd.push_str(" --host 127.0.0.1 --port {port}");
            }
            Ok(SpawnSpec {
                name: name.into(),
                argv: vec![cmd],
                shell: true,
            })
        }
        None => builtin(name, d),
    }
}

fn builtin(name: &str, d: &SpawnDefaults) -> Result<SpawnSpec> {
    builtin_with(name, d, None)
}

/// A built-in contestant; `rserve` names the rserve binary (default `$RSERVE_BIN`, else
/// the one next to rbench).
pub fn builtin_with(name: &str, d: &SpawnDefaults, rserve: Option<&Path>) -> Result<SpawnSpec> {
    if !matches!(name, "rserve" | "llama-server") {
        bail!("--spawn {name}: not a built-in (rserve, llama-server); give NAME=\"CMD ...\"");
    }
    let model = runtime::registry::resolve(&d.model)
        .with_context(|| format!("--spawn {name}: model {}", d.model))?;
    let model = model.display().to_string();
    let (t, np) = (d.threads.to_string(), d.parallel.to_string());
    let argv = match name {
        "rserve" => {
            let exe = rserve.map(Path::to_path_buf).unwrap_or_else(|| {
                runtime::options::Env::get()
                    .rserve_bin
                    .clone()
                    .unwrap_or_else(|| sibling("rserve"))
            });
            if !exe.is_file() {
                bail!(
                    "--spawn rserve: {} not found; build it (cargo build --release -p server) or set RSERVE_BIN",
                    exe.display()
                );
            }
            vec![
                exe.display().to_string(),
                "-m".into(),
                model,
                "-t".into(),
                t,
                "--parallel".into(),
                np,
                "-c".into(),
                d.ctx.to_string(),
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                "{port}".into(),
            ]
        }
        "llama-server" => {
            let exe = llama_server()?;
            // llama-server splits -c over its slots.
            vec![
                exe.display().to_string(),
                "-m".into(),
                model,
                "-t".into(),
                t.clone(),
                "-tb".into(),
                t,
                "-np".into(),
                np,
                "-c".into(),
                (d.ctx * d.parallel).to_string(),
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                "{port}".into(),
            ]
        }
        _ => unreachable!("checked above"),
    };
    Ok(SpawnSpec {
        name: name.into(),
        argv,
        shell: false,
    })
}

fn sibling(name: &str) -> PathBuf {
    std::env::current_exe()
        .map(|p| p.with_file_name(name))
        .unwrap_or_else(|_| PathBuf::from(name))
}

fn on_path(name: &str) -> Option<PathBuf> {
    runtime::options::Env::get().path.as_ref().and_then(|p| {
        std::env::split_paths(p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// Where a llama-server built from `$LLAMA_CPP_SRC` is cached.
fn llama_build_dir() -> PathBuf {
    runtime::registry::tools_cache_dir().join("llama-server-build")
}

/// `$LLAMA_SERVER`, a previous build in the cache, PATH, or a fresh native build: from the
/// llama.cpp checkout in `$LLAMA_CPP_SRC`, else from the llama.cpp vendored in the
/// `llama-cpp-python` source package (fetched once with pip into the tools cache).
pub fn llama_server() -> Result<PathBuf> {
    let env = runtime::options::Env::get();
    if let Some(p) = env.llama_server.clone() {
        if !p.is_file() {
            bail!("LLAMA_SERVER={} is not a file", p.display());
        }
        return Ok(p);
    }
    let built = llama_build_dir().join("bin/llama-server");
    if let Some(src) = env.llama_cpp_src.clone() {
        if !built.is_file() {
            build_llama_server(&src, &llama_build_dir())?;
        }
        return Ok(built);
    }
    if built.is_file() {
        return Ok(built);
    }
    if let Some(p) = on_path("llama-server") {
        return Ok(p);
    }
    let src = fetch_llama_cpp_source().context(
        "--spawn llama-server: no llama-server found and its source could not be fetched. Set \
         LLAMA_SERVER to the binary, put it on PATH, or set LLAMA_CPP_SRC to a llama.cpp \
         checkout to build it natively (the llama.cpp source our reference engine links ships \
         without tools/server)",
    )?;
    build_llama_server(&src, &llama_build_dir())?;
    Ok(built)
}

/// The llama-cpp-python source package whose vendored llama.cpp carries tools/server.
const LLAMA_CPP_PYTHON_SDIST: &str = "llama-cpp-python==0.3.36";

/// Downloads (once) and unpacks the llama-cpp-python source package into the tools cache
/// and returns its vendored llama.cpp.
fn fetch_llama_cpp_source() -> Result<PathBuf> {
    let dir = runtime::registry::tools_cache_dir().join("llama-cpp-python-src");
    let find = |dir: &Path| -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("vendor/llama.cpp"))
            .find(|p| p.join("tools/server").is_dir())
    };
    if let Some(p) = find(&dir) {
        return Ok(p);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "rbench: fetching the {LLAMA_CPP_PYTHON_SDIST} source package for llama.cpp's server \
         into {}",
        dir.display()
    );
    let st = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(&dir)
        .arg(LLAMA_CPP_PYTHON_SDIST)
        .status()
        .context("running python3 -m pip download")?;
    if !st.success() {
        bail!("pip download {LLAMA_CPP_PYTHON_SDIST} failed: {st}");
    }
    let tarball = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
        .ok_or_else(|| anyhow::anyhow!("pip left no .tar.gz in {}", dir.display()))?;
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&dir)
        .status()
        .context("running tar")?;
    if !st.success() {
        bail!("unpacking {} failed: {st}", tarball.display());
    }
    find(&dir).ok_or_else(|| {
        anyhow::anyhow!(
            "{} holds no vendor/llama.cpp with tools/server",
            tarball.display()
        )
    })
}

/// A native Release build of llama-server (cmake), as llama.cpp's own instructions give.
fn build_llama_server(src: &Path, build: &Path) -> Result<()> {
    if !src.join("tools/server").is_dir() {
        bail!(
            "LLAMA_CPP_SRC={}: no tools/server there (a full llama.cpp checkout is needed)",
            src.display()
        );
    }
    eprintln!(
        "rbench: building llama-server from {} into {} (native, Release)",
        src.display(),
        build.display()
    );
    let run = |args: &[&str]| -> Result<()> {
        let st = Command::new("cmake")
            .args(args)
            .status()
            .context("running cmake (is it installed?)")?;
        if !st.success() {
            bail!("cmake {} failed: {st}", args.join(" "));
        }
        Ok(())
    };
    let (s, b) = (src.display().to_string(), build.display().to_string());
    run(&[
        "-S",
        &s,
        "-B",
        &b,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ])?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run(&[
        "--build",
        &b,
        "--target",
        "llama-server",
        "-j",
        &jobs.to_string(),
    ])
}

/// The first line a binary prints for `--version` (stdout or stderr), within 20 s.
pub fn version_of(spec: &SpawnSpec) -> String {
    let exe = if spec.shell {
        spec.argv[0]
            .split_whitespace()
            .find(|w| !w.contains('='))
            .unwrap_or("")
            .to_string()
    } else {
        spec.argv[0].clone()
    };
    let Ok(mut child) = Command::new(&exe)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        return "unknown".into();
    };
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return "unknown (no answer to --version)".into();
            }
        }
    }
    let mut text = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut text);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut text);
    }
    text.lines()
        .map(str::trim)
        .find(|l| l.contains("version") || l.split_whitespace().count() == 2)
        .or_else(|| text.lines().map(str::trim).find(|l| !l.is_empty()))
        .unwrap_or("unknown")
        .to_string()
}

/// A running contestant.
pub struct Spawned {
    pub spec: SpawnSpec,
    pub port: u16,
    pub command_line: String,
    child: Option<Child>,
    log: PathBuf,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// `GET path` on 127.0.0.1:port; the status code.
fn http_status(port: u16, path: &str) -> Option<u16> {
    http_get("127.0.0.1", port, path, false).map(|(status, _)| status)
}

/// `GET path` on host:port (`Connection: close`, 2 s to connect, 5 s per read); the status
/// code and, when `body` is set, the body (plain or chunked). `None` when the server does
/// not answer.
pub fn http_get(host: &str, port: u16, path: &str, body: bool) -> Option<(u16, String)> {
    use std::io::Write;
    use std::net::ToSocketAddrs;
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    if !body {
        return Some((status, String::new()));
    }
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        chunked |= l.starts_with("transfer-encoding:") && l.contains("chunked");
    }
    let mut raw = Vec::new();
    r.read_to_end(&mut raw).ok()?;
    if !chunked {
        return Some((status, String::from_utf8_lossy(&raw).into_owned()));
    }
    let mut text = Vec::new();
    let mut rest = &raw[..];
    while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..nl])
            .ok()?
            .split(';')
            .next()?
            .trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        rest = &rest[nl + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        text.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
    Some((status, String::from_utf8_lossy(&text).into_owned()))
}

/// The last `n` lines of a file.
fn tail(p: &Path, n: usize) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Spawned {
    /// Starts `spec` on a free port, its output in `log_dir/NAME.log`, and waits up to
    /// `ready` for `/health` to answer 200. A server that exits or never gets ready is an
    /// error quoting the end of its log.
    pub fn start(spec: &SpawnSpec, log_dir: &Path, ready: Duration) -> Result<Spawned> {
        let port = free_port()?;
        let command_line = spec.command_line(port);
        let log = log_dir.join(format!("{}.log", spec.name));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = if spec.shell {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("exec {command_line}"));
            c
        } else {
            let p = port.to_string();
            let mut c = Command::new(&spec.argv[0]);
            c.args(spec.argv[1..].iter().map(|a| a.replace("{port}", &p)));
            c
        };
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // If rbench dies (Ctrl-C, a kill), the server gets SIGTERM instead of living on.
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}: {command_line}", spec.name))?;
        eprintln!(
            "rbench serve: started {} (pid {}) on port {port}: {command_line}",
            spec.name,
            child.id()
        );
        let mut s = Spawned {
            spec: spec.clone(),
            port,
            command_line,
            child: Some(child),
            log,
        };
        let t0 = Instant::now();
        loop {
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                s.child = None;
                bail!(
                    "{} exited ({st}) before it was ready; the end of {}:\n{}",
                    s.spec.name,
                    s.log.display(),
                    tail(&s.log, 15)
                );
            }
            if http_status(port, "/health") == Some(200) {
                eprintln!(
                    "rbench serve: {} ready in {:.1}s",
                    s.spec.name,
                    t0.elapsed().as_secs_f64()
                );
                return Ok(s);
            }
            if t0.elapsed() > ready {
                s.stop();
                bail!(
                    "{} not ready (GET /health != 200) within {:.0}s; the end of {}:\n{}",
                    s.spec.name,
                    ready.as_secs_f64(),
                    s.log.display(),
                    tail(&s.log, 15)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Whether the server is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The server's process id while it has not been stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the server ended, once it has (`None` while it runs or after `stop`).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The server's log file and its last `n` lines.
    pub fn log_tail(&self, n: usize) -> (PathBuf, String) {
        (self.log.clone(), tail(&self.log, n))
    }

    /// SIGTERM to the process group, up to 30 s to exit, then SIGKILL.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pg = c.id() as i32;
        // SAFETY: signalling our own child's process group.
        unsafe {
            libc::kill(-pg, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "rbench serve: {} ignored SIGTERM for 30 s; killing it",
            self.spec.name
        );
        // SAFETY: as above.
        unsafe {
            libc::kill(-pg, libc::SIGKILL);
        }
        let _ = c.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The run order of `n` servers at sweep point `point` for `reps` runs each: A B | B A
/// alternating by point when `reps` is 1, A B B A (mirrored halves) within the point
/// otherwise; every server runs `reps` times.
pub fn order(n: usize, point: usize, reps: usize) -> Vec<usize> {
    let fwd: Vec<usize> = (0..n).collect();
    let rev: Vec<usize> = (0..n).rev().collect();
    if reps <= 1 {
        return if point.is_multiple_of(2) { fwd } else { rev };
    }
    (0..reps)
        .flat_map(|r| {
            if r.is_multiple_of(2) {
                fwd.clone()
            } else {
                rev.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> SpawnDefaults {
        SpawnDefaults {
            model: "x".into(),
            threads: 2,
            parallel: 4,
            ctx: 1024,
        }
    }

    #[test]
    fn user_commands_get_a_port() {
        let s = parse_spawn("a=./rserve -m m --parallel 4", &d()).unwrap();
        assert_eq!(s.name, "a");
        assert!(s.shell);
        assert_eq!(
            s.command_line(99),
            "./rserve -m m --parallel 4 --host 127.0.0.1 --port 99"
        );
        let s = parse_spawn("b=srv --listen 127.0.0.1:{port}", &d()).unwrap();
        assert_eq!(s.command_line(7), "srv --listen 127.0.0.1:7");
        assert!(parse_spawn("=x", &d()).is_err());
        assert!(parse_spawn("a b=x", &d()).is_err());
        assert!(parse_spawn("a=", &d()).is_err());
        assert!(parse_spawn("vllm", &d())
            .unwrap_err()
            .to_string()
            .contains("not a built-in"));
    }

    #[test]
    fn http_get_reads_plain_and_chunked_bodies() {
        use std::io::Write;
        let serve = |response: &'static str| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut req = String::new();
                let mut r = BufReader::new(s.try_clone().unwrap());
                while r.read_line(&mut req).unwrap() > 2 {
                    req.clear();
                }
                s.write_all(response.as_bytes()).unwrap();
            });
            port
        };
        let p = serve("HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\na 1\nb 2\n");
        assert_eq!(
            http_get("127.0.0.1", p, "/metrics", true),
            Some((200, "a 1\nb 2\n".into()))
        );
        let p = serve(
            "HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n4\r\na\r\n1\r\n3;x=y\r\n\nb \r\n0\r\n\r\n",
        );
        assert_eq!(
            http_get("127.0.0.1", p, "/metrics", true),
            Some((503, "a\r\n1\nb ".into()))
        );
        let p = serve("HTTP/1.1 404 Not Found\r\n\r\n");
        assert_eq!(
            http_get("127.0.0.1", p, "/", false),
            Some((404, String::new()))
        );
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        assert_eq!(http_get("127.0.0.1", port, "/", true), None);
    }

    #[test]
    fn orders_interleave() {
        assert_eq!(order(2, 0, 1), vec![0, 1]);
        assert_eq!(order(2, 1, 1), vec![1, 0]);
        assert_eq!(order(2, 0, 2), vec![0, 1, 1, 0]);
        assert_eq!(order(3, 5, 2), vec![0, 1, 2, 2, 1, 0]);
    }
}
