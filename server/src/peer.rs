//! Peer transport: Raft messages between members over TCP, on the owner
//! core's executor.
//!
//! Protocol (ours, not etcd's rafthttp): a connection starts with a hello,
//! `"metcdpr1" | cluster_id u64 | from u64 | to u64` (little-endian), that
//! the receiver checks against its own identity, answering one status byte
//! (0 = accepted). Then frames flow one way: `len u32 | crc32c u32 |
//! eraftpb.Message (protobuf)`. Each peer has one outbound connection; all
//! messages queued for it while the previous write ran go out in one write.
//!
//! Raft snapshots travel on a connection of their own (hello magic
//! `"metcdsn1"`), so appends and heartbeats keep flowing meanwhile.
//!
//! Delivery is best effort, as Raft expects: a lost connection drops what
//! was queued, the peer is reported unreachable and the link reconnects
//! with backoff. Must never: block the Raft loop (it only enqueues), or
//! deliver a message from a member of another cluster.

use crate::net::Endpoint;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::members::MemberRecord;
use crate::notify::Notify;
use crate::tls::{PeerStream, PeerTls};

const MAGIC: &[u8; 8] = b"metcdpr1";
/// A connection carrying one Raft snapshot: the MsgSnapshot frame, then
/// `len u64 | file bytes | crc32c u32`, answered with one byte (0 = kept).
const SNAPSHOT_MAGIC: &[u8; 8] = b"metcdsn1";
const SNAPSHOT_CHUNK: usize = 1 << 20;
/// A connection carrying questions for one peer (lease questions a
/// follower forwards to the leader, the leader's KV hash checks):
/// `len u32 | JSON PeerQuery` answered with `len u32 | JSON PeerAnswer`.
const QUERY_MAGIC: &[u8; 8] = b"metcdls1";
const MAX_QUERY_MESSAGE: usize = 64 << 20;

/// A question for one peer: mostly ones only the leader can answer (its
/// lessor's clock is the cluster's; only it knows a learner's progress),
/// which etcd forwards from followers over HTTP; and the KV hash any
/// member answers for the corruption check (etcd's `/members/hashkv`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum PeerQuery {
    KeepAlive(i64),
    TimeToLive(i64),
    /// MemberPromote of this member ID.
    Promote(u64),
    /// The KV hash at this revision (0: the current one).
    HashKv(i64),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub enum PeerAnswer {
    /// The TTL after the refresh; `None` for an unknown lease.
    KeepAlive(Option<i64>),
    /// (remaining, granted, keys); `None` for an unknown lease.
    TimeToLive(Option<(i64, i64, Vec<Vec<u8>>)>),
    /// The members after the promotion, or etcd's error message.
    Promoted(Result<Vec<MemberRecord>, String>),
    /// The member asked is not the leader (any more).
    NotLeader,
    /// (hash, the revision hashed, the member's current revision, its
    /// compact revision), or why it could not hash that revision.
    HashKv(Result<(u32, i64, i64, i64), String>),
}

/// What answers a forwarded question (it may wait for the log).
pub type QueryHandler =
    Rc<dyn Fn(PeerQuery) -> std::pin::Pin<Box<dyn std::future::Future<Output = PeerAnswer>>>>;
const HELLO_BYTES: usize = 32;
const ACCEPTED: u8 = 0;
const WRONG_CLUSTER: u8 = 1;
const WRONG_MEMBER: u8 = 2;
/// The connecting member was removed from the cluster: it must stop
/// (etcd's peers answer such a member 410 Gone).
const REMOVED: u8 = 4;
/// Answer to a probe (cluster 0, member 0): followed by the cluster ID and
/// the members (`len u32 | JSON`).
const PROBED: u8 = 3;
/// Largest frame accepted: a full append of max_size_per_msg plus slack.
const MAX_FRAME_BYTES: usize = 256 << 20;
/// Messages queued for an unreachable peer beyond this are dropped (Raft
/// resends what matters).
const MAX_QUEUED: usize = 8192;
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(1000);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Test-only fault injection (`--experimental-peer-fault-file`): the file
/// lists member IDs (hex, one per line) whose traffic this member drops in
/// both directions, re-read every 100 ms. A partition is every member's
/// file naming the members across the cut.
#[derive(Default)]
pub struct Faults {
    path: Option<std::path::PathBuf>,
    blocked: RefCell<std::collections::HashSet<u64>>,
}

impl Faults {
    pub fn new(path: Option<std::path::PathBuf>) -> Rc<Faults> {
        let faults = Rc::new(Faults {
            path,
            blocked: RefCell::new(Default::default()),
        });
        if faults.path.is_some() {
            let watched = faults.clone();
            glommio::spawn_local(async move {
                loop {
                    watched.reload();
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                }
            })
            .detach();
        }
        faults
    }

    fn reload(&self) {
        let Some(path) = &self.path else {
            return;
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        *self.blocked.borrow_mut() = text
            .split_whitespace()
            .filter_map(|t| u64::from_str_radix(t, 16).ok())
            .collect();
    }

    pub fn blocks(&self, peer: u64) -> bool {
        self.path.is_some() && self.blocked.borrow().contains(&peer)
    }
}

/// Where messages received from peers go (the Raft loop's inbox).
pub type Deliver = Rc<dyn Fn(Message)>;
/// The current members, for a joining member's probe.
pub type Roster = Rc<dyn Fn() -> Vec<MemberRecord>>;

/// What the listener does with what arrives.
pub struct Inbound {
    pub deliver: Deliver,
    pub roster: Roster,
    pub faults: Rc<Faults>,
    /// Where received snapshot files are written (`*.snap.tmp` until
    /// installed, so a crash leaves nothing the engine would load).
    pub snapshot_dir: std::path::PathBuf,
    /// A complete, checksummed snapshot: its MsgSnapshot and data file.
    pub deliver_snapshot: Rc<dyn Fn(Message, std::path::PathBuf)>,
    /// Answers a peer's question.
    pub query: QueryHandler,
    /// Whether a member ID was removed from the cluster.
    pub is_removed: Rc<dyn Fn(u64) -> bool>,
    /// Where received bytes are counted (the transport's counters).
    pub traffic: Rc<PeerTraffic>,
}

/// An I/O error as logged, with Go's wording of a TLS alert the other end
/// sent (what etcd logs, and what operators grep for).
fn described(e: &std::io::Error) -> String {
    match crate::tls::go_remote_alert(e) {
        Some(go) => format!("{e} ({go})"),
        None => e.to_string(),
    }
}

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("metcd: peer: {msg}");
}

struct Link {
    addrs: Vec<Endpoint>,
    queue: RefCell<Vec<Message>>,
    ready: Notify,
    /// When the current connection to the peer was made; `None` while down.
    connected_since: Cell<Option<Instant>>,
}

/// What this member's traffic with one peer has been (etcd's
/// `etcd_network_*` families).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PeerCounts {
    /// Bytes written to the peer: frames and snapshots.
    pub sent_bytes: u64,
    /// Bytes of frames read from the peer.
    pub received_bytes: u64,
    /// Messages for the peer that were dropped: its queue was full, its
    /// connection failed before they were written, or it was cut off.
    pub sent_failures: u64,
    /// Connections to the peer that were lost.
    pub disconnects: u64,
    /// Frames from the peer that could not be read (bad checksum or
    /// framing, a message not from or not for the link's members).
    pub received_failures: u64,
    /// Snapshots streamed to the peer: done, failed, under way.
    pub snapshot_sends: u64,
    pub snapshot_send_failures: u64,
    pub snapshot_sends_inflight: u64,
    /// Snapshots received from the peer: kept, failed, under way.
    pub snapshot_receives: u64,
    pub snapshot_receive_failures: u64,
    pub snapshot_receives_inflight: u64,
    /// Whether the link to the peer is up, and whether it ever was.
    pub active: bool,
    pub ever_active: bool,
}

/// Traffic counters of every peer, shared by the outbound links and the
/// inbound connections (both on the owner core).
#[derive(Debug, Default)]
pub struct PeerTraffic {
    peers: RefCell<HashMap<u64, PeerCounts>>,
    /// How long each snapshot sent to / received from a peer took, by peer
    /// (etcd's buckets: 0.1 s doubling to 51.2 s).
    pub snapshot_send_seconds: RefCell<HashMap<u64, SnapshotSeconds>>,
    pub snapshot_receive_seconds: RefCell<HashMap<u64, SnapshotSeconds>>,
}

/// A snapshot transfer's duration histogram.
pub type SnapshotSeconds = crate::metrics::Histogram<1000, 10>;

impl PeerTraffic {
    pub(crate) fn update(&self, peer: u64, f: impl FnOnce(&mut PeerCounts)) {
        f(self.peers.borrow_mut().entry(peer).or_default());
    }

    /// Counts a snapshot transfer with `peer` that started at `started`
    /// and ended `ok` or not, as etcd counts sends or receives (`sent`).
    pub(crate) fn snapshot_done(&self, peer: u64, sent: bool, started: Instant, ok: bool) {
        self.update(peer, |c| {
            let (done, failed, inflight) = if sent {
                (
                    &mut c.snapshot_sends,
                    &mut c.snapshot_send_failures,
                    &mut c.snapshot_sends_inflight,
                )
            } else {
                (
                    &mut c.snapshot_receives,
                    &mut c.snapshot_receive_failures,
                    &mut c.snapshot_receives_inflight,
                )
            };
            *inflight = inflight.saturating_sub(1);
            *if ok { done } else { failed } += 1;
        });
        if ok {
            let seconds = if sent {
                &self.snapshot_send_seconds
            } else {
                &self.snapshot_receive_seconds
            };
            seconds
                .borrow_mut()
                .entry(peer)
                .or_default()
                .observe_seconds(started.elapsed());
        }
    }

    /// Every peer's counts so far.
    pub fn all(&self) -> Vec<(u64, PeerCounts)> {
        self.peers.borrow().iter().map(|(p, c)| (*p, *c)).collect()
    }
}

/// Outbound links to every peer and the list of peers found unreachable
/// since the Raft loop last looked.
pub struct Transport {
    self_id: u64,
    cluster_id: u64,
    faults: Rc<Faults>,
    links: RefCell<HashMap<u64, Rc<Link>>>,
    unreachable: RefCell<Vec<u64>>,
    /// A peer said this member was removed from the cluster.
    told_removed: Cell<bool>,
    /// Peer TLS (`--peer-*` files); plaintext when absent.
    tls: Option<PeerTls>,
    traffic: Rc<PeerTraffic>,
}

impl Transport {
    /// The traffic counters, which inbound connections add to as well.
    pub fn traffic(&self) -> Rc<PeerTraffic> {
        self.traffic.clone()
    }

    pub fn new(
        self_id: u64,
        cluster_id: u64,
        faults: Rc<Faults>,
        tls: Option<PeerTls>,
    ) -> Rc<Transport> {
        Rc::new(Transport {
            self_id,
            cluster_id,
            faults,
            links: RefCell::new(HashMap::new()),
            unreachable: RefCell::new(Vec::new()),
            told_removed: Cell::new(false),
            tls,
            traffic: Rc::default(),
        })
    }

    /// Starts (or replaces the addresses of) the link to `peer`.
    pub fn add_peer(self: &Rc<Self>, peer: u64, addrs: Vec<Endpoint>) {
        if peer == self.self_id {
            return;
        }
        if let Some(link) = self.links.borrow().get(&peer) {
            if link.addrs == addrs {
                return;
            }
        }
        let link = Rc::new(Link {
            addrs,
            queue: RefCell::new(Vec::new()),
            ready: Notify::default(),
            connected_since: Cell::new(None),
        });
        self.links.borrow_mut().insert(peer, link.clone());
        glommio::spawn_local(self.clone().run_link(peer, link)).detach();
    }

    /// The peers with a link.
    pub fn peers(&self) -> Vec<u64> {
        self.links.borrow().keys().copied().collect()
    }

    /// Stops sending to `peer` (removed from the cluster).
    pub fn remove_peer(&self, peer: u64) {
        if let Some(link) = self.links.borrow_mut().remove(&peer) {
            link.ready.notify();
        }
    }

    /// Queues messages for their peers; never waits.
    pub fn send(&self, msgs: Vec<Message>) {
        let links = self.links.borrow();
        for m in msgs {
            let Some(link) = links.get(&m.to) else {
                continue;
            };
            let to = m.to;
            if self.faults.blocks(to) {
                self.traffic.update(to, |c| c.sent_failures += 1);
                continue;
            }
            let mut queue = link.queue.borrow_mut();
            if queue.len() < MAX_QUEUED {
                queue.push(m);
            } else {
                self.traffic.update(to, |c| c.sent_failures += 1);
            }
            drop(queue);
            link.ready.notify();
        }
    }

    /// Whether a peer refused this member as removed from the cluster.
    pub fn told_removed(&self) -> bool {
        self.told_removed.get()
    }

    /// Peers whose connection failed since the last call.
    pub fn take_unreachable(&self) -> Vec<u64> {
        std::mem::take(&mut *self.unreachable.borrow_mut())
    }

    pub fn is_connected(&self, peer: u64) -> bool {
        self.connected_since(peer).is_some()
    }

    /// Since when the link to `peer` has been up (etcd's `ActiveSince`);
    /// a peer the fault layer cuts off counts as down, as a real
    /// partition's broken stream would.
    pub fn connected_since(&self, peer: u64) -> Option<Instant> {
        if self.faults.blocks(peer) {
            return None;
        }
        self.links
            .borrow()
            .get(&peer)
            .and_then(|l| l.connected_since.get())
    }

    fn is_current(&self, peer: u64, link: &Rc<Link>) -> bool {
        self.links
            .borrow()
            .get(&peer)
            .is_some_and(|l| Rc::ptr_eq(l, link))
    }

    async fn run_link(self: Rc<Self>, peer: u64, link: Rc<Link>) {
        let mut backoff = BACKOFF_MIN;
        // Why this peer is down, as last logged (None: not down).
        let mut down_because: Option<String> = None;
        let mut buf = Vec::with_capacity(64 << 10);
        while self.is_current(peer, &link) {
            match self.connect(MAGIC, peer, &link.addrs).await {
                Ok(mut stream) => {
                    if down_because.take().is_some() {
                        log(format_args!("connected to {peer:x}"));
                    }
                    backoff = BACKOFF_MIN;
                    link.connected_since.set(Some(Instant::now()));
                    self.traffic.update(peer, |c| {
                        c.active = true;
                        c.ever_active = true;
                    });
                    let err = self.pump(peer, &link, &mut stream, &mut buf).await;
                    link.connected_since.set(None);
                    self.traffic.update(peer, |c| {
                        c.active = false;
                        c.disconnects += 1;
                    });
                    if let Err(e) = err {
                        log(format_args!(
                            "lost connection to {peer:x}: {}",
                            described(&e)
                        ));
                    }
                }
                Err(e) => {
                    // Once per outage, and again when the reason changes
                    // (a peer that was down now refuses our certificate).
                    let why = described(&e);
                    if down_because.as_deref() != Some(why.as_str()) {
                        log(format_args!("cannot reach {peer:x}: {why}; retrying"));
                        down_because = Some(why);
                    }
                }
            }
            let dropped = std::mem::take(&mut *link.queue.borrow_mut()).len() as u64;
            self.traffic.update(peer, |c| c.sent_failures += dropped);
            self.unreachable.borrow_mut().push(peer);
            glommio::timer::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    async fn connect(
        &self,
        magic: &[u8; 8],
        peer: u64,
        addrs: &[Endpoint],
    ) -> std::io::Result<PeerStream> {
        let mut last = std::io::Error::other("no address");
        for addr in addrs {
            match self.open(addr).await {
                Ok(mut stream) => {
                    let mut hello = Vec::with_capacity(HELLO_BYTES);
                    hello.extend_from_slice(magic);
                    hello.extend_from_slice(&self.cluster_id.to_le_bytes());
                    hello.extend_from_slice(&self.self_id.to_le_bytes());
                    hello.extend_from_slice(&peer.to_le_bytes());
                    stream.write_all(&hello).await?;
                    stream.flush().await?;
                    let mut answer = [0u8; 1];
                    stream.read_exact(&mut answer).await?;
                    return match answer[0] {
                        ACCEPTED => Ok(stream),
                        REMOVED => {
                            self.told_removed.set(true);
                            Err(std::io::Error::other(format!(
                                "{addr} says this member was removed from the cluster"
                            )))
                        }
                        WRONG_CLUSTER => Err(std::io::Error::other(format!(
                            "{addr} belongs to another cluster (cluster ID mismatch; check --initial-cluster and --initial-cluster-token)"
                        ))),
                        _ => Err(std::io::Error::other(format!(
                            "{addr} is not member {peer:x} (check --initial-cluster)"
                        ))),
                    };
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A connection to `addr`, TLS first with peer TLS (a Unix socket
    /// is plaintext: the configuration refuses TLS with unix:// URLs).
    async fn open(&self, addr: &Endpoint) -> std::io::Result<PeerStream> {
        let tcp_addr = match addr {
            Endpoint::Tcp(tcp_addr) => tcp_addr,
            Endpoint::Unix(path) => {
                let connecting = glommio::net::UnixStream::connect(path);
                return glommio::timer::timeout(CONNECT_TIMEOUT, connecting)
                    .await
                    .map(PeerStream::Unix)
                    .map_err(|e| std::io::Error::other(format!("{addr}: {e}")));
            }
        };
        let tcp = TcpStream::connect_timeout(tcp_addr, CONNECT_TIMEOUT)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some(tls) => tls.connect(tcp_addr, tcp).await.map_err(|e| {
                std::io::Error::other(format!("TLS handshake with {addr}: {}", described(&e)))
            }),
            None => Ok(PeerStream::Plain(tcp)),
        }
    }

    /// Asks `peer` a question (one connection per question: keep-alives
    /// come once per TTL/3 per lease, hash checks once per check interval,
    /// far from a hot path).
    pub async fn ask(&self, peer: u64, query: &PeerQuery) -> std::io::Result<PeerAnswer> {
        let addrs = self
            .links
            .borrow()
            .get(&peer)
            .map(|l| l.addrs.clone())
            .ok_or_else(|| std::io::Error::other(format!("no address for {peer:x}")))?;
        let mut stream = self.connect(QUERY_MAGIC, peer, &addrs).await?;
        let body = serde_json::to_vec(query).map_err(std::io::Error::other)?;
        let mut out = Vec::with_capacity(4 + body.len());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        stream.write_all(&out).await?;
        stream.flush().await?;
        let answer = read_json_message(&mut stream).await?;
        serde_json::from_slice(&answer).map_err(std::io::Error::other)
    }

    /// Streams a MsgSnapshot and its data file to `msg.to` on a connection
    /// of its own; returns once the peer has the file safely on disk.
    pub async fn send_snapshot(
        &self,
        msg: &Message,
        file: &std::path::Path,
    ) -> std::io::Result<()> {
        let started = Instant::now();
        self.traffic
            .update(msg.to, |c| c.snapshot_sends_inflight += 1);
        let sent = self.stream_snapshot(msg, file).await;
        self.traffic
            .snapshot_done(msg.to, true, started, sent.is_ok());
        if sent.is_err() {
            self.traffic.update(msg.to, |c| c.sent_failures += 1);
        }
        sent
    }

    async fn stream_snapshot(&self, msg: &Message, file: &std::path::Path) -> std::io::Result<()> {
        use std::io::Read;
        let addrs = self
            .links
            .borrow()
            .get(&msg.to)
            .map(|l| l.addrs.clone())
            .ok_or_else(|| std::io::Error::other(format!("no address for {:x}", msg.to)))?;
        let mut stream = self.connect(SNAPSHOT_MAGIC, msg.to, &addrs).await?;
        let mut head = Vec::new();
        encode_frame(msg, &mut head)?;
        let mut f = std::fs::File::open(file)?;
        let data = f.metadata()?.len();
        head.extend_from_slice(&data.to_le_bytes());
        stream.write_all(&head).await?;
        let mut chunk = vec![0u8; SNAPSHOT_CHUNK];
        let mut crc = 0u32;
        loop {
            let n = f.read(&mut chunk)?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &chunk[..n]);
            stream.write_all(&chunk[..n]).await?;
        }
        stream.write_all(&crc.to_le_bytes()).await?;
        stream.flush().await?;
        let sent = head.len() as u64 + data + 4;
        self.traffic.update(msg.to, |c| c.sent_bytes += sent);
        let mut ack = [0u8; 1];
        stream.read_exact(&mut ack).await?;
        if ack[0] != 0 {
            return Err(std::io::Error::other(
                "the peer could not keep the snapshot",
            ));
        }
        Ok(())
    }

    /// Writes everything queued for `peer`, batch by batch, until the
    /// connection fails or the peer is removed.
    async fn pump(
        &self,
        peer: u64,
        link: &Rc<Link>,
        stream: &mut PeerStream,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        loop {
            let batch = std::mem::take(&mut *link.queue.borrow_mut());
            if batch.is_empty() {
                if !self.is_current(peer, link) {
                    return Ok(());
                }
                link.ready.notified().await;
                continue;
            }
            buf.clear();
            for m in &batch {
                encode_frame(m, buf)?;
            }
            stream.write_all(buf).await?;
            stream.flush().await?;
            let written = buf.len() as u64;
            self.traffic.update(peer, |c| c.sent_bytes += written);
            if buf.capacity() > 16 << 20 {
                *buf = Vec::with_capacity(64 << 10);
            }
        }
    }
}

fn encode_frame(m: &Message, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; 8]);
    m.write_to_vec(buf).map_err(std::io::Error::other)?;
    let len = buf.len() - start - 8;
    let crc = crc32c::crc32c(&buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Asks the members at `addrs` for their cluster ID and members (blocking;
/// used once, before the executors start, by a member joining a running
/// cluster).
pub fn probe_cluster(
    addrs: &[Endpoint],
    limit: Duration,
    tls: Option<&PeerTls>,
) -> Option<(u64, Vec<MemberRecord>)> {
    use std::io::{Read, Write};
    trait Stream: Read + Write {}
    impl<T: Read + Write> Stream for T {}
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        for addr in addrs {
            let mut s: Box<dyn Stream> = match addr {
                Endpoint::Unix(path) => {
                    let Ok(unix) = std::os::unix::net::UnixStream::connect(path) else {
                        continue;
                    };
                    let _ = unix.set_read_timeout(Some(CONNECT_TIMEOUT));
                    let _ = unix.set_write_timeout(Some(CONNECT_TIMEOUT));
                    Box::new(unix)
                }
                Endpoint::Tcp(addr) => {
                    let Ok(tcp) = std::net::TcpStream::connect_timeout(addr, CONNECT_TIMEOUT)
                    else {
                        continue;
                    };
                    let _ = tcp.set_read_timeout(Some(CONNECT_TIMEOUT));
                    let _ = tcp.set_write_timeout(Some(CONNECT_TIMEOUT));
                    match tls {
                        None => Box::new(tcp),
                        Some(tls) => {
                            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                            let Ok(conn) = rustls::ClientConnection::new(tls.client_config(), name)
                            else {
                                continue;
                            };
                            Box::new(rustls::StreamOwned::new(conn, tcp))
                        }
                    }
                }
            };
            let mut hello = Vec::with_capacity(HELLO_BYTES);
            hello.extend_from_slice(MAGIC);
            hello.extend_from_slice(&[0u8; 24]);
            let mut answer = [0u8; 13];
            if s.write_all(&hello).is_ok()
                && s.flush().is_ok()
                && s.read_exact(&mut answer).is_ok()
                && answer[0] == PROBED
            {
                let mut id = [0u8; 8];
                id.copy_from_slice(&answer[1..9]);
                let len = u32::from_le_bytes([answer[9], answer[10], answer[11], answer[12]]);
                let mut body = vec![0u8; (len as usize).min(MAX_FRAME_BYTES)];
                if s.read_exact(&mut body).is_err() {
                    continue;
                }
                let members = serde_json::from_slice(&body).unwrap_or_default();
                return Some((u64::from_le_bytes(id), members));
            }
        }
        std::thread::sleep(BACKOFF_MAX / 4);
    }
    None
}

/// Accepts peer connections on `addr` and hands every message to `deliver`.
pub fn listen(
    addr: Endpoint,
    self_id: u64,
    cluster_id: u64,
    inbound: Rc<Inbound>,
    tls: Option<PeerTls>,
) -> std::io::Result<()> {
    let listener = crate::net::Listener::bind(&addr, crate::net::PortSharing::Exclusive)?;
    glommio::spawn_local(async move {
        loop {
            match listener.accept().await {
                Ok(conn) => {
                    let inbound = inbound.clone();
                    let tls = tls.clone();
                    glommio::spawn_local(async move {
                        let stream = match (&tls, conn) {
                            (None, conn) => PeerStream::from(conn),
                            // Refused at start: TLS peer URLs are https://.
                            (Some(_), crate::net::Accepted::Unix(_)) => return,
                            (Some(tls), crate::net::Accepted::Tcp(tcp)) => {
                                let peer_addr = tcp.peer_addr().ok();
                                match tls.accept(tcp).await {
                                    Ok(stream) => stream,
                                    Err(e) => {
                                        log(format_args!(
                                            "TLS handshake with {peer_addr:?} refused: {}",
                                            described(&e)
                                        ));
                                        return;
                                    }
                                }
                            }
                        };
                        if let Err(e) = receive(stream, self_id, cluster_id, &inbound).await {
                            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                                log(format_args!("inbound connection: {e}"));
                            }
                        }
                    })
                    .detach();
                }
                Err(e) => {
                    log(format_args!("accept on {addr}: {e}"));
                    glommio::timer::sleep(BACKOFF_MIN).await;
                }
            }
        }
    })
    .detach();
    Ok(())
}

async fn receive(
    stream: PeerStream,
    self_id: u64,
    cluster_id: u64,
    inbound: &Inbound,
) -> std::io::Result<()> {
    let mut stream = futures_lite::io::BufReader::with_capacity(256 << 10, stream);
    let mut hello = [0u8; HELLO_BYTES];
    stream.read_exact(&mut hello).await?;
    let field = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&hello[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let snapshot_stream = &hello[..8] == SNAPSHOT_MAGIC;
    let query_stream = &hello[..8] == QUERY_MAGIC;
    if &hello[..8] != MAGIC && !snapshot_stream && !query_stream {
        return Err(std::io::Error::other("not a metcd peer (bad hello)"));
    }
    let (their_cluster, from, to) = (field(8), field(16), field(24));
    if their_cluster == 0 && to == 0 {
        // A joining member asks which cluster it is joining.
        let members = serde_json::to_vec(&(inbound.roster)()).unwrap_or_default();
        let mut answer = vec![PROBED];
        answer.extend_from_slice(&cluster_id.to_le_bytes());
        answer.extend_from_slice(&(members.len() as u32).to_le_bytes());
        answer.extend_from_slice(&members);
        stream.get_mut().write_all(&answer).await?;
        stream.get_mut().flush().await?;
        return Ok(());
    }
    let verdict = if their_cluster != cluster_id {
        WRONG_CLUSTER
    } else if (inbound.is_removed)(from) {
        REMOVED
    } else if to != self_id {
        WRONG_MEMBER
    } else {
        ACCEPTED
    };
    stream.get_mut().write_all(&[verdict]).await?;
    stream.get_mut().flush().await?;
    if verdict != ACCEPTED {
        return Err(std::io::Error::other(format!(
            "refused member {from:x} of cluster {their_cluster:x}: {}",
            if verdict == WRONG_CLUSTER {
                format!("this member belongs to cluster {cluster_id:x}")
            } else if verdict == REMOVED {
                "it was removed from the cluster".to_string()
            } else {
                format!("it wanted member {to:x}, this is {self_id:x}")
            }
        )));
    }
    if inbound.faults.blocks(from) {
        return Ok(());
    }
    if snapshot_stream {
        let started = Instant::now();
        inbound
            .traffic
            .update(from, |c| c.snapshot_receives_inflight += 1);
        let received = receive_snapshot(stream, from, self_id, inbound).await;
        inbound
            .traffic
            .snapshot_done(from, false, started, received.is_ok());
        return received;
    }
    if query_stream {
        loop {
            let query = match read_json_message(&mut stream).await {
                Ok(q) => q,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let query: PeerQuery = serde_json::from_slice(&query).map_err(std::io::Error::other)?;
            let answer =
                serde_json::to_vec(&(inbound.query)(query).await).map_err(std::io::Error::other)?;
            let mut out = Vec::with_capacity(4 + answer.len());
            out.extend_from_slice(&(answer.len() as u32).to_le_bytes());
            out.extend_from_slice(&answer);
            stream.get_mut().write_all(&out).await?;
            stream.get_mut().flush().await?;
        }
    }
    let mut body = Vec::new();
    loop {
        let msg = match read_frame(&mut stream, from, self_id, &mut body).await {
            Ok(msg) => msg,
            Err(e) => {
                // A peer closing its link (or dying) is no failure to read.
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    inbound.traffic.update(from, |c| c.received_failures += 1);
                }
                return Err(e);
            }
        };
        let framed = 8 + body.len() as u64;
        inbound.traffic.update(from, |c| c.received_bytes += framed);
        if (inbound.is_removed)(from) {
            // Dropping the connection makes it reconnect and hear why.
            return Err(std::io::Error::other(format!(
                "closing the link of removed member {from:x}"
            )));
        }
        if !inbound.faults.blocks(from) {
            (inbound.deliver)(msg);
        }
    }
}

/// One `len u32 | bytes` message of a query stream.
async fn read_json_message<S: futures_lite::AsyncRead + Unpin>(
    stream: &mut S,
) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_QUERY_MESSAGE {
        return Err(std::io::Error::other("peer query message too large"));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(body)
}

async fn read_frame(
    stream: &mut futures_lite::io::BufReader<PeerStream>,
    from: u64,
    self_id: u64,
    body: &mut Vec<u8>,
) -> std::io::Result<Message> {
    let mut header = [0u8; 8];
    stream.read_exact(&mut header).await?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME_BYTES {
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes from {from:x} exceeds the limit"
        )));
    }
    body.resize(len, 0);
    stream.read_exact(&mut body[..]).await?;
    if crc32c::crc32c(body) != crc {
        return Err(std::io::Error::other(format!(
            "checksum mismatch in a frame from {from:x}"
        )));
    }
    let msg = Message::parse_from_bytes(body).map_err(std::io::Error::other)?;
    if msg.from != from || msg.to != self_id {
        return Err(std::io::Error::other(format!(
            "message from {:x} to {:x} on the link from {from:x}",
            msg.from, msg.to
        )));
    }
    Ok(msg)
}

/// Receives one snapshot: its message, then its data into a temporary file
/// (checksummed, fsync'd) that the Raft loop installs.
async fn receive_snapshot(
    mut stream: futures_lite::io::BufReader<PeerStream>,
    from: u64,
    self_id: u64,
    inbound: &Inbound,
) -> std::io::Result<()> {
    use std::io::Write;
    let mut body = Vec::new();
    let msg = read_frame(&mut stream, from, self_id, &mut body).await?;
    if msg.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot {
        return Err(std::io::Error::other(
            "a snapshot stream without a snapshot",
        ));
    }
    let index = msg.get_snapshot().get_metadata().index;
    let mut len = [0u8; 8];
    stream.read_exact(&mut len).await?;
    let mut left = u64::from_le_bytes(len);
    let path = inbound
        .snapshot_dir
        .join(format!("incoming-{from:016x}-{index:016x}.snap.tmp"));
    let result = async {
        let mut file = std::fs::File::create(&path)?;
        let mut chunk = vec![0u8; SNAPSHOT_CHUNK];
        let mut crc = 0u32;
        while left > 0 {
            let n = (left as usize).min(SNAPSHOT_CHUNK);
            stream.read_exact(&mut chunk[..n]).await?;
            crc = crc32c::crc32c_append(crc, &chunk[..n]);
            file.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        let mut sent_crc = [0u8; 4];
        stream.read_exact(&mut sent_crc).await?;
        if u32::from_le_bytes(sent_crc) != crc {
            return Err(std::io::Error::other("snapshot data checksum mismatch"));
        }
        // fsync on the blocking pool: the owner core keeps committing.
        glommio::executor()
            .spawn_blocking(move || file.sync_all())
            .await?;
        Ok(())
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_file(&path);
        let _ = stream.get_mut().write_all(&[1]).await;
        let _ = stream.get_mut().flush().await;
        return Err(e);
    }
    stream.get_mut().write_all(&[0]).await?;
    stream.get_mut().flush().await?;
    let data = u64::from_le_bytes(len);
    let received = 8 + body.len() as u64 + 8 + data + 4;
    inbound
        .traffic
        .update(from, |c| c.received_bytes += received);
    log(format_args!(
        "received a snapshot at index {index} from {from:x} ({data} bytes)"
    ));
    (inbound.deliver_snapshot)(msg, path);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    #[test]
    fn frames_round_trip_with_checksum() {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgAppend);
        m.from = 7;
        m.to = 9;
        m.term = 3;
        m.entries = vec![Entry {
            index: 5,
            term: 3,
            data: bytes::Bytes::from_static(b"payload"),
            ..Default::default()
        }]
        .into();
        let mut buf = Vec::new();
        encode_frame(&m, &mut buf).unwrap();
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
        assert_eq!(len, buf.len() - 8);
        let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&buf[8..]));
        let back = Message::parse_from_bytes(&buf[8..]).unwrap();
        assert_eq!(back, m);
    }
}
