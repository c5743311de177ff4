//! Test support: start the real `metcd` binary on loopback ports and talk
//! HTTP/1.1 to it over plain sockets (so malformed requests can be sent too).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port that is free now and that no other call in this test
/// process has returned. Ports come from below the kernel's ephemeral
/// range (32768+), so neither an outgoing connection nor a concurrent
/// `bind(0)` can take one between this call and the server's bind; asking
/// the kernel for port 0 and releasing it could hand two members of one
/// cluster the same port (seen in CI).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 12_000;
    const SPAN: u32 = 20_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Start at a pid-dependent place so test binaries run one after
    // another do not retry the ports the previous one left in TIME_WAIT.
    let start = (std::process::id() % 40) * 500;
    for _ in 0..SPAN {
        let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = (FIRST + offset) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// `n` distinct free loopback ports.
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}

/// Runs `metcd` on `data_dir` with fresh ports to completion, for starts
/// that are expected to fail (a locked or corrupt data dir).
pub fn run_metcd_to_exit(data_dir: &Path) -> std::process::Output {
    run_metcd_to_exit_with(data_dir, &[])
}

/// As [`run_metcd_to_exit`], with more flags.
pub fn run_metcd_to_exit_with(data_dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metcd"))
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen-http-urls")
        .arg(format!("http://127.0.0.1:{}", free_port()))
        .arg("--listen-client-urls")
        .arg(format!("http://127.0.0.1:{}", free_port()))
        .args(extra)
        .output()
        .unwrap()
}

/// A running `metcd` process, killed on drop.
pub struct Server {
    pub port: u16,
    /// The etcd gRPC port (`--listen-client-urls`).
    pub client_port: u16,
    pub data_dir: PathBuf,
    pub extra: Vec<String>,
    /// The client URL is `https://` (client TLS flags in `extra`).
    client_https: bool,
    /// Runs with `METCD_VERIFY_INDEX_CHECKPOINT=1` (the default): a start-up
    /// that loads a key index checkpoint compares it with a full rebuild
    /// and refuses to serve on a difference. Off for tests that damage an
    /// engine on purpose and check what the member does without it.
    pub verify_index_checkpoint: bool,
    /// Environment variables for the next spawn (e.g. `FAILPOINTS`).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let mut s = Server::start_unchecked(data_dir, extra);
        s.wait_healthy();
        s
    }

    /// Starts without waiting for health (a cluster member is healthy only
    /// once a quorum is up); call `wait_healthy` later.
    pub fn start_unchecked(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_with_scheme(data_dir, extra, false)
    }

    /// Starts with an `https://` client URL; `extra` carries the TLS flags.
    pub fn start_https(data_dir: &Path, extra: &[&str]) -> Server {
        let mut s = Server::start_with_scheme(data_dir, extra, true);
        s.wait_healthy();
        s
    }

    fn start_with_scheme(data_dir: &Path, extra: &[&str], client_https: bool) -> Server {
        let mut s = Server {
            port: free_port(),
            client_port: free_port(),
            data_dir: data_dir.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            client_https,
            verify_index_checkpoint: true,
            env: Vec::new(),
            child: None,
            log: data_dir.with_extension("log"),
        };
        s.spawn_process();
        s
    }

    fn spawn(&mut self) {
        self.spawn_process();
        self.wait_healthy();
    }

    /// Starts the process again on the same ports and data dir, without
    /// waiting for health.
    pub fn respawn_unchecked(&mut self) {
        self.kill9();
        self.spawn_process();
    }

    /// Waits for the process to exit by itself (bounded); its status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().unwrap() {
                    self.child = None;
                    return Some(status);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn spawn_process(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_metcd"))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-http-urls")
            .arg(format!("http://127.0.0.1:{}", self.port))
            .arg("--listen-client-urls")
            .arg(format!(
                "{}://127.0.0.1:{}",
                if self.client_https { "https" } else { "http" },
                self.client_port
            ))
            // Tests run two shards unless they choose: the cross-shard
            // paths (forwarded writes, remote watch hubs) are the harder
            // ones, and the default on a 2-core machine is one shard.
            .args(if self.extra.iter().any(|a| a == "--shards") {
                &[][..]
            } else {
                &["--shards", "2"][..]
            })
            .args(&self.extra)
            .envs(
                self.verify_index_checkpoint
                    .then_some(("METCD_VERIFY_INDEX_CHECKPOINT", "1")),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// The etcd gRPC endpoint, as etcdctl wants it.
    pub fn client_endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Applied indexes of the checkpoints this member logged, in order.
    pub fn checkpoint_indexes(&self) -> Vec<u64> {
        self.log_text()
            .lines()
            .filter_map(|l| l.split("snapshot at applied index ").nth(1))
            .filter_map(|rest| rest.split(' ').next()?.parse().ok())
            .collect()
    }

    /// Waits (bounded) until this member logs a checkpoint past `index`:
    /// checkpoints run in the background, at low priority, after the
    /// writes that started them.
    pub fn wait_for_checkpoint_after(&self, index: u64, when: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.checkpoint_indexes().iter().any(|i| *i > index) {
            assert!(
                Instant::now() < deadline,
                "no checkpoint past index {index} {when}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!(
                        "metcd exited with {status} during start-up:\n{}",
                        self.log_text()
                    );
                }
            }
            if let Ok(mut c) = HttpConn::connect(&self.addr()) {
                if let Ok(r) = c.request("GET", "/health", b"") {
                    if r.status == 200 {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("metcd did not become healthy:\n{}", self.log_text());
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        Some(self.child.as_ref()?.id())
    }

    /// The process's resident memory in MiB (from /proc), if it runs.
    pub fn rss_mib(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib / 1024)
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Sends `signal` (libc::SIGTERM, ...) to the running process.
    pub fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("the server runs");
        let pid = i32::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on our own child process.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// Puts `<prefix><n>` = `v<n>` through the HTTP API, one after another,
    /// until one is not acknowledged (or `max` are): the keys acknowledged,
    /// in order. Runs on its own thread while the test does something.
    pub fn put_until_refused(
        &self,
        prefix: &str,
        max: usize,
    ) -> std::thread::JoinHandle<Vec<String>> {
        let addr = self.addr();
        let prefix = prefix.to_string();
        std::thread::spawn(move || {
            let mut acked = Vec::new();
            let Ok(mut conn) = HttpConn::connect(&addr) else {
                return acked;
            };
            for n in 0..max {
                let key = format!("{prefix}{n}");
                match conn.request("PUT", &key, format!("v{n}").as_bytes()) {
                    Ok(r) if r.status == 204 => acked.push(key),
                    _ => break,
                }
            }
            acked
        })
    }

    /// Checks (over one connection) that every key in `keys` reads back as
    /// `put_until_refused` wrote it.
    pub fn assert_all_present(&self, keys: &[String]) {
        let mut conn = self.conn();
        for key in keys {
            let n = key.rsplit(|c: char| !c.is_ascii_digit()).next().unwrap();
            let r = conn.request("GET", key, b"").unwrap();
            assert_eq!(
                (r.status, r.text()),
                (200, format!("v{n}")),
                "acknowledged {key} is lost ({} acknowledged):\n{}",
                keys.len(),
                self.log_text()
            );
        }
    }

    pub fn conn(&self) -> HttpConn {
        HttpConn::connect(&self.addr()).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header_i64(&self, name: &str) -> Option<i64> {
        self.headers.get(name).and_then(|v| v.parse().ok())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// A keep-alive HTTP/1.1 connection.
pub struct HttpConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl HttpConn {
    pub fn connect(addr: &str) -> std::io::Result<HttpConn> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(HttpConn {
            stream,
            buf: Vec::new(),
        })
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> std::io::Result<HttpResponse> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        self.send_raw(&msg)?;
        self.read_response(method == "HEAD")
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn read_response(&mut self, head_only: bool) -> std::io::Result<HttpResponse> {
        let header_end = loop {
            if let Some(pos) = find(&self.buf, b"\r\n\r\n") {
                break pos;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buf[..header_end]).into_owned();
        self.buf.drain(..header_end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
        let mut headers = HashMap::new();
        for line in lines {
            if let Some((k, v)) = line.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let len: usize = if head_only || status == 204 || status == 304 {
            0
        } else {
            headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        while self.buf.len() < len {
            self.fill()?;
        }
        let body = self.buf.drain(..len).collect();
        Ok(HttpResponse {
            status,
            headers,
            body,
        })
    }

    fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 16384];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
