//! Real `metcd` processes on loopback forming one cluster, and the faults
//! done to them: SIGKILL and restart, SIGSTOP and SIGCONT, and partitions
//! through the peer transport's fault files (`--experimental-peer-fault-
//! file`: each member drops traffic to and from the member IDs listed).
//!
//! Talks to members only through process signals, files and loopback
//! sockets; the clients live in `workload`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Member {
    pub name: String,
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub http_port: u16,
    pub peer_port: u16,
    faults_file: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// Joins an existing cluster (`--initial-cluster-state existing`): a
    /// member added by a membership change.
    joining: bool,
    /// Bumped each time the slot gets a new member (a wiped data dir and a
    /// new member ID): answers from different incarnations are from
    /// different members.
    pub incarnation: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Member {
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn paused(&self) -> bool {
        self.paused
    }
}

pub struct Cluster {
    pub members: Vec<Member>,
    metcd: PathBuf,
    initial: String,
    extra: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    #[error("cannot start {}: {source}", .path.display())]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("member {0} exited: {1}")]
    Exited(String, String),
    #[error("member {0} did not become healthy")]
    NotHealthy(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Cluster {
    /// Starts `n` members under `dir` and waits until every one answers
    /// `/health`.
    pub fn start(
        metcd: &Path,
        dir: &Path,
        n: usize,
        extra: &[String],
    ) -> Result<Cluster, ClusterError> {
        let ports = free_ports(3 * n)?;
        let mut members = Vec::new();
        for i in 0..n {
            let name = format!("m{}", i + 1);
            members.push(Member {
                data_dir: dir.join(&name),
                client_port: ports[3 * i],
                http_port: ports[3 * i + 1],
                peer_port: ports[3 * i + 2],
                faults_file: dir.join(format!("{name}.faults")),
                log: dir.join(format!("{name}.log")),
                name,
                child: None,
                paused: false,
                joining: false,
                incarnation: Default::default(),
            });
        }
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            members,
            metcd: metcd.to_path_buf(),
            initial,
            extra: extra.to_vec(),
        };
        for i in 0..n {
            std::fs::write(&cluster.members[i].faults_file, "")?;
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i, Duration::from_secs(60))?;
        }
        Ok(cluster)
    }

    /// Starts member `i`'s process (a restart keeps its data dir and ports).
    pub fn spawn(&mut self, i: usize) -> Result<(), ClusterError> {
        self.spawn_with_failpoints(i, None)
    }

    /// As [`Cluster::spawn`], with the engine's disk faults armed by
    /// `FAILPOINTS` (the `fail` crate's syntax).
    pub fn spawn_with_failpoints(
        &mut self,
        i: usize,
        failpoints: Option<&str>,
    ) -> Result<(), ClusterError> {
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)?;
        let peer = m.peer_url();
        let child = Command::new(&self.metcd)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .arg("--listen-client-urls")
            .arg(m.endpoint())
            .arg("--listen-http-urls")
            .arg(format!("http://127.0.0.1:{}", m.http_port))
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(&self.initial)
            .arg("--initial-cluster-token")
            .arg("robust")
            .args(
                m.joining
                    .then_some(["--initial-cluster-state", "existing"])
                    .into_iter()
                    .flatten(),
            )
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .arg("--experimental-peer-fault-file")
            .arg(&m.faults_file)
            .args(&self.extra)
            .envs(failpoints.map(|f| ("FAILPOINTS", f)))
            // A restart that loads a key index checkpoint compares it with a
            // full rebuild and refuses to serve on a difference.
            .env("METCD_VERIFY_INDEX_CHECKPOINT", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                path: self.metcd.clone(),
                source,
            })?;
        m.child = Some(child);
        m.paused = false;
        Ok(())
    }

    /// Waits until member `i` answers `/health` with 200.
    pub fn wait_healthy(&mut self, i: usize, limit: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let m = &mut self.members[i];
            if let Some(child) = m.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    m.child = None;
                    return Err(ClusterError::Exited(m.name.clone(), status.to_string()));
                }
            }
            if http_status(m.http_port, "/health") == Some(200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ClusterError::NotHealthy(self.members[i].name.clone()))
    }

    /// SIGKILL: nothing flushed, nothing handed over.
    pub fn kill9(&mut self, i: usize) {
        let m = &mut self.members[i];
        if let Some(mut child) = m.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        m.paused = false;
    }

    /// Member `i` (stopped) becomes a new member: its data dir wiped, the
    /// next start joins the existing cluster, answers count as another
    /// member's.
    pub fn wipe_for_rejoin(&mut self, i: usize) -> Result<(), ClusterError> {
        let m = &mut self.members[i];
        assert!(m.child.is_none(), "wipe a stopped member only");
        if m.data_dir.exists() {
            std::fs::remove_dir_all(&m.data_dir)?;
        }
        m.joining = true;
        m.incarnation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    pub fn pause(&mut self, i: usize) {
        self.signal(i, libc::SIGSTOP);
        self.members[i].paused = true;
    }

    pub fn resume(&mut self, i: usize) {
        self.signal(i, libc::SIGCONT);
        self.members[i].paused = false;
    }

    fn signal(&self, i: usize, sig: libc::c_int) {
        if let Some(child) = &self.members[i].child {
            // SAFETY: kill(2) on our own child's pid; it has not been
            // reaped (we hold its Child), so the pid is still ours.
            unsafe {
                libc::kill(child.id() as libc::pid_t, sig);
            }
        }
    }

    /// Cuts member `i` off from the others in both directions (`ids` are
    /// the members' Raft IDs by position), or heals every cut with None.
    pub fn isolate(&self, i: Option<usize>, ids: &[u64]) -> Result<(), ClusterError> {
        for (j, m) in self.members.iter().enumerate() {
            let blocked: Vec<String> = match i {
                Some(i) if i == j => ids
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| *k != i)
                    .map(|(_, id)| format!("{id:x}"))
                    .collect(),
                Some(i) => vec![format!("{:x}", ids[i])],
                None => Vec::new(),
            };
            std::fs::write(&m.faults_file, blocked.join("\n"))?;
        }
        Ok(())
    }

    /// Waits (bounded) for member `i` to exit by itself; its status.
    pub fn wait_exit(&mut self, i: usize, limit: Duration) -> Option<String> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let m = &mut self.members[i];
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    m.child = None;
                    return Some(status.to_string());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Member `i`'s log from byte `from` on.
    pub fn log_since(&self, i: usize, from: u64) -> String {
        let text = std::fs::read(&self.members[i].log).unwrap_or_default();
        String::from_utf8_lossy(text.get(from as usize..).unwrap_or_default()).into_owned()
    }

    pub fn log_len(&self, i: usize) -> u64 {
        std::fs::metadata(&self.members[i].log).map_or(0, |m| m.len())
    }

    /// Every member's exit status, if any exited by itself (a crash).
    pub fn crashed(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    out.push((m.name.clone(), status.to_string()));
                    m.child = None;
                }
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if self.members[i].paused {
                self.resume(i);
            }
            self.kill9(i);
        }
    }
}

/// A plain HTTP/1.1 GET on loopback; the status code.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    let text = std::str::from_utf8(&head[..n]).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

/// `n` distinct loopback ports free now, below the ephemeral range (so no
/// outgoing connection takes one before a member binds it), starting at a
/// pid-dependent place so runs back to back do not meet TIME_WAIT.
fn free_ports(n: usize) -> Result<Vec<u16>, ClusterError> {
    const FIRST: u32 = 21_000;
    const SPAN: u32 = 10_000;
    let start = (std::process::id() % 50) * 200;
    let mut ports = Vec::new();
    for k in 0..SPAN {
        let port = (FIRST + (start + k) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
            if ports.len() == n {
                return Ok(ports);
            }
        }
    }
    Err(ClusterError::Io(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "no free loopback ports",
    )))
}
