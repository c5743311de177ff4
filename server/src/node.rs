//! The Raft group's owner: the loop that drives raft-rs `RawNode` on its
//! owner core, appends to the WAL with group commit, applies committed
//! entries in order to MVCC and answers the proposers.
//!
//! Group commit: proposals queue up while the previous `fdatasync` runs;
//! the loop takes everything queued (up to `wal-max-batch`, optionally
//! waiting `wal-batch-window-us` for more), proposes it, and the resulting
//! Ready is written as one WAL frame with one `fdatasync`.
//!
//! Order of a Ready follows raft-rs' `five_mem_node` example: messages,
//! snapshot, committed entries, append entries, hard state, sync, persisted
//! messages, advance, light-ready commit and entries, `advance_apply`.
//!
//! With peers, a Ready's messages go to the peer transport (appends before
//! the local sync, as raft-rs allows; responses after it), proposals made on
//! a follower are forwarded to the leader by raft-rs and answered when the
//! entry is applied here, and linearizable reads wait for a batched
//! ReadIndex round and for the apply loop to reach it.
//!
//! Must never: reply to a write before its entry is durable and applied;
//! apply out of order; keep accepting writes after a failed sync; apply a
//! Raft snapshot whose data it did not receive.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BufMut;
use engine::any::{AnyEngine, EngineDir};
use engine::wal::{self, Wal, WalOptions};
use engine::Engine;
use futures_channel::oneshot;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType,
    Message, MessageType,
};
use raft::storage::MemStorage;
use raft::{RawNode, Storage};

pub use crate::apply::Applied;
use crate::apply::{
    decode_proposal, lease_needs, leases_used, proposal, ApplyContext, Decoded, ProposedBy,
    StateMachine, TAG_ALARM, TAG_AUTH, TAG_CONF_RECORD, TAG_KV, TAG_KV_AUTHED,
    TAG_LEASE_CHECKPOINT, TAG_LEASE_GRANT, TAG_LEASE_REVOKE, TAG_LEASE_REVOKE_AUTHED,
    TAG_MEMBER_ATTRS, TAG_MEMBER_PEERS,
};
use crate::compactor::Compactor;
use crate::config::Config;
use crate::error::{Result, ServerError};
use crate::members::{self, MemberRecord, Registry};
use crate::mvcc::{self, MvccStore};
use crate::notify::Notify;
use crate::peer::{self, Transport};
use crate::raftlog;
use crate::read_index::{ReadRounds, RoundAnswer};

type WriteReply = oneshot::Sender<Result<Applied>>;

/// etcd's `maxLeaseCheckpointBatchSize`.
const LEASE_CHECKPOINT_BATCH: usize = 1000;

/// Who asks for a write or a lease revoke.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    /// metcd itself (lease expiry, auto-compaction): never checked.
    Member,
    /// A client, with the simple token its request carried.
    Client(Option<&'a str>),
}

/// Most proposal bytes in one group commit: far below the WAL's frame
/// limit even with the largest allowed request on top.
const MAX_BATCH_BYTES: usize = 64 << 20;
/// etcd checks lease expiry every 500 ms.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(500);
const SNAPSHOT_RETRY: Duration = Duration::from_secs(10);
/// How long start-up may take to re-apply the recovered log.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(300);
/// Where the applied membership (ConfState) is kept in MVCC metadata.
pub(crate) const CONF_META: &[u8] = b"raft/conf";
/// Prefix of the metadata records of removed members.
pub(crate) const REMOVED_META: &[u8] = b"removed/";
/// etcd's answers when a membership change would risk the quorum
/// (`--strict-reconfig-check`, on by default, as in etcd).
const NOT_ENOUGH_STARTED: &str =
    "etcdserver: re-configuration failed due to not enough started members";
const UNHEALTHY: &str = "etcdserver: unhealthy cluster";
/// How long a voter's link must have been up to count as healthy for a
/// membership change (etcd's `HealthInterval`).
const RECONFIG_HEALTH_INTERVAL: Duration = Duration::from_secs(5);

/// A majority of `members` voters.
fn quorum(members: usize) -> usize {
    members / 2 + 1
}
/// etcd allows one learner at a time.
const MAX_LEARNERS: usize = 1;
const READ_INDEX_RETRY: Duration = Duration::from_millis(500);
/// etcd's request timeout: 5 s plus two election timeouts (added at start).
const REQUEST_TIMEOUT_BASE: Duration = Duration::from_secs(5);

struct Proposal {
    id: u64,
    data: Vec<u8>,
    /// A membership change: `data` goes into the entry's context.
    conf: Option<ConfChangeV2>,
    reply: WriteReply,
}

/// Where a member keeps its files.
pub struct DataDirs {
    pub root: PathBuf,
    pub wal: PathBuf,
    pub snap: PathBuf,
}

impl DataDirs {
    pub fn new(root: &Path) -> Self {
        let member = root.join("member");
        Self {
            root: root.to_path_buf(),
            wal: member.join("wal"),
            snap: member.join("snap"),
        }
    }
}

/// Creates `dir` (and parents) and fsyncs each new directory's parent, so
/// the directory entries themselves survive a crash.
pub(crate) fn create_dir_durable(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_durable(parent)?;
    }
    std::fs::create_dir(dir).map_err(|e| engine::Error::io("create_dir", dir, e))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)
        .and_then(|f| f.sync_all())
        .map_err(|e| engine::Error::io("fsync_dir", parent, e))?;
    Ok(())
}

/// Where a leader snapshot's WAL marker is kept while it is installed.
const INSTALLED_SNAPSHOT: &str = "installed-snapshot";

/// Writes (index, marker meta) atomically: temporary file, fsync, rename,
/// fsync of the directory. Snapshot installs are rare and already block
/// on the engine's file, so this runs in line.
fn write_installed_snapshot(dirs: &DataDirs, index: u64, meta: &[u8]) -> Result<()> {
    let dir = dirs.root.join("member");
    let path = dir.join(INSTALLED_SNAPSHOT);
    let tmp = dir.join(format!("{INSTALLED_SNAPSHOT}.tmp"));
    let mut body = index.to_le_bytes().to_vec();
    body.extend_from_slice(meta);
    let written = std::fs::write(&tmp, &body)
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| std::fs::File::open(&dir)?.sync_all());
    written.map_err(|e| engine::Error::io("write", &path, e).into())
}

fn read_installed_snapshot(dirs: &DataDirs) -> Option<(u64, bytes::Bytes)> {
    let body = std::fs::read(dirs.root.join("member").join(INSTALLED_SNAPSHOT)).ok()?;
    let index = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
    Some((index, bytes::Bytes::copy_from_slice(&body[8..])))
}

/// Who this member is: (cluster ID, member ID), recorded in
/// `member/identity` at its first start. For a new cluster both are
/// derived from the flags as etcd derives them; a member joining an
/// existing cluster asks a peer, which knows the cluster ID fixed at
/// bootstrap and the ID `member add` gave these peer URLs.
pub fn resolve_identity(cfg: &Config) -> Result<(u64, u64)> {
    let member_dir = cfg.data_dir().join("member");
    let path = member_dir.join("identity");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let mut ids = text
            .split_whitespace()
            .map(|t| u64::from_str_radix(t, 16).ok());
        if let (Some(Some(cluster)), Some(Some(member))) = (ids.next(), ids.next()) {
            return Ok((cluster, member));
        }
        return Err(ServerError::Startup(format!(
            "{} does not hold a cluster and member ID",
            path.display()
        )));
    }
    let members = cfg
        .initial_members()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let derived = cfg.member_id();
    let (cluster, member) = if cfg.initial_cluster_state == "existing" {
        let urls: Vec<String> = members
            .iter()
            .filter(|m| m.id != derived)
            .flat_map(|m| m.peer_urls.clone())
            .collect();
        let addrs = crate::config::parse_peer_urls("initial-cluster", &urls.join(","))
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        let (cluster, known) =
            peer::probe_cluster(&addrs, Duration::from_secs(30), peer_tls(cfg)?.as_ref())
                .ok_or_else(|| {
                    ServerError::Startup(format!(
                "--initial-cluster-state existing: no member of --initial-cluster ({}) answered; \
                 start this member once the cluster runs",
                urls.join(",")
            ))
                })?;
        let mut mine = crate::config::split_list(&cfg.initial_advertise_peer_urls);
        mine.sort_unstable();
        let me = known.iter().find(|m| {
            let mut theirs: Vec<&str> = m.peer_urls.iter().map(String::as_str).collect();
            theirs.sort_unstable();
            theirs == mine
        });
        let Some(me) = me else {
            return Err(ServerError::Startup(format!(
                "--initial-cluster-state existing: the cluster has no member with peer URLs {}; \
                 add it first: etcdctl member add {} --peer-urls={}",
                mine.join(","),
                cfg.name,
                mine.join(",")
            )));
        };
        // The joiner reaches its peers before the leader's log tells it
        // who they are: keep what they said.
        let roster = member_dir.join("join-members.json");
        create_dir_durable(&member_dir)?;
        std::fs::write(&roster, serde_json::to_vec(&known).unwrap_or_default())
            .map_err(|e| engine::Error::io("write", &roster, e))?;
        (cluster, me.id)
    } else {
        let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
        (crate::ids::cluster_id(&ids), derived)
    };
    create_dir_durable(&member_dir)?;
    let tmp = member_dir.join("identity.tmp");
    std::fs::write(&tmp, format!("{cluster:x} {member:x}\n"))
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &path))
        .and_then(|()| std::fs::File::open(&member_dir)?.sync_all())
        .map_err(|e| engine::Error::io("write", &path, e))?;
    Ok((cluster, member))
}

/// Holds an exclusive `flock` on the data dir for the process lifetime, so
/// two members never share one directory.
pub struct DirLock {
    _file: std::fs::File,
}

pub fn lock_data_dir(root: &Path) -> Result<DirLock> {
    create_dir_durable(root)?;
    let path = root.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| engine::Error::io("open", &path, e))?;
    // SAFETY: flock on a valid, owned file descriptor; no memory is shared.
    let rc = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    if rc != 0 {
        return Err(ServerError::Startup(format!(
            "data dir {} is locked by another metcd process; stop it or pick another --data-dir",
            root.display()
        )));
    }
    Ok(DirLock { _file: file })
}

/// Live statistics of the Raft group (for /health, status and benchmarks).
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeStatus {
    pub term: u64,
    pub leader: u64,
    pub applied_index: u64,
    pub committed_index: u64,
    pub revision: i64,
    pub compact_revision: i64,
    pub wal_syncs: u64,
    /// Bytes of WAL frames written since the process started.
    pub wal_bytes: u64,
    pub is_learner: bool,
}

type ReadWaiter = oneshot::Sender<Result<()>>;

pub struct Node {
    /// This member's ID (its Raft ID too), derived as etcd derives it.
    id: u64,
    /// Counters and latency histograms for `/metrics`.
    pub metrics: crate::metrics::NodeMetrics,
    cluster_id: u64,
    registry: RefCell<Registry>,
    /// The attributes this member publishes through the log.
    my_attrs: MemberRecord,
    transport: Rc<Transport>,
    /// Raft progress (matched index) of every member, on the leader.
    progress: RefCell<HashMap<u64, u64>>,
    /// A leader transfer asked by MoveLeader, for the next loop turn.
    transfer_to: Cell<Option<u64>>,
    /// etcd's `--strict-reconfig-check`: membership changes that would
    /// risk the quorum are refused.
    strict_reconfig: bool,
    /// This start's publish has been applied: client listeners serve.
    serving: Cell<bool>,
    /// When this member started to stop (SIGTERM/SIGINT, crate::stop).
    stopping_since: Cell<Option<Instant>>,
    /// How long a stopping leader waits for its successor (two election
    /// timeouts, as etcd bounds its transfer on stop).
    stop_transfer_limit: Duration,
    /// This member was removed from the cluster: it stops.
    removed: Cell<bool>,
    /// Members removed from the cluster (kept in MVCC metadata under
    /// `removed/<id>`): their peer connections are refused as removed.
    removed_members: RefCell<std::collections::HashSet<u64>>,
    /// Messages from peers for the next loop turn.
    inbound: RefCell<Vec<Message>>,
    /// Linearizable reads: queued, in ReadIndex rounds, waiting for apply.
    read_rounds: RefCell<ReadRounds<ReadWaiter, Instant>>,
    /// The only voter and no learners: every accepted proposal commits
    /// here and every applied write is a linearizable read point.
    solo: Cell<bool>,
    /// This member is a learner (no writes, no linearizable reads).
    learner: Cell<bool>,
    was_leader: Cell<bool>,
    /// When this member, as leader, last sent each peer a heartbeat, and
    /// whether its response is still awaited (the round trip's start).
    heartbeats_sent: RefCell<HashMap<u64, (Instant, bool)>>,
    /// This member leads and has committed an entry of its own term, so
    /// it knows every committed entry (what a hash comparison needs).
    leads_settled: Cell<bool>,
    request_timeout: Duration,
    mvcc: RefCell<MvccStore<AnyEngine>>,
    /// Replaced wholesale when a leader's snapshot is installed.
    engine: RefCell<AnyEngine>,
    engine_dir: EngineDir,
    /// The Raft log storage (shared with the RawNode), for snapshot terms.
    raft_store: MemStorage,
    /// Snapshot files received from the leader, by snapshot index.
    incoming_snapshots: RefCell<HashMap<u64, PathBuf>>,
    /// Peers a snapshot is being streamed to.
    snapshot_sends: RefCell<std::collections::HashSet<u64>>,
    /// Finished snapshot sends, for raft-rs' report_snapshot.
    snapshot_reports: RefCell<Vec<(u64, bool)>>,
    catch_up_entries: u64,
    dirs: DataDirs,
    queue: RefCell<Vec<Proposal>>,
    queue_ready: Notify,
    pending: RefCell<HashMap<u64, WriteReply>>,
    next_id: Cell<u64>,
    fatal: RefCell<Option<String>>,
    status: Cell<NodeStatus>,
    lessor: RefCell<crate::lease::Lessor>,
    auth: RefCell<crate::auth::AuthStore>,
    /// The log index known committed at start (what start-up replays): an
    /// Authenticate entry up to it is replayed, not new, and must not
    /// bring its token back (tokens die with the process, as etcd's simple
    /// tokens). One committed later is new to this process: its client may
    /// be talking to another member that applies it too.
    replayed_commit_index: u64,
    /// Whether auth is on, shared with every shard's API edge so requests
    /// skip the owner round trip of a permission check while it is off.
    auth_flag: RefCell<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// What every shard reads ranges from ([`crate::read_view`]).
    read_view: RefCell<std::sync::Arc<crate::read_view::ReadView>>,
    /// Called with every applied batch of events (watch hubs of all shards).
    watch_subscribers: RefCell<Vec<crate::watch::EventSubscriber>>,
    snapshot_done: RefCell<Option<Result<u64>>>,
    warned_snapshot: Cell<bool>,
    snapshot_in_flight: Cell<bool>,
    snapshot_retry_at: Cell<Option<Instant>>,
    last_snapshot_index: Cell<u64>,
    /// When the checkpoint in flight started (for its log line).
    snapshot_started: Cell<Option<Instant>>,
    /// The applied index at which the checkpoint in flight, if still
    /// running at the lowest CPU priority, is raised to ordinary priority:
    /// by then the log a restart would replay has grown by another
    /// checkpoint's spacing while it ran.
    snapshot_hurry_at: Cell<Option<u64>>,
    /// WAL bytes written when the last checkpoint started, and the bytes
    /// that checkpoint rewrote (the whole store for the memory engine, 0
    /// for engines that persist only what changed): the next one waits
    /// until the WAL has grown by as much, so a large store is not
    /// rewritten every `snapshot-count` entries.
    snapshot_pacing: Cell<(u64, u64)>,
    /// The pacing of the checkpoint in flight, made the rule only once it
    /// is durable (a failed one must not delay the retry).
    snapshot_pacing_pending: Cell<Option<(u64, u64)>>,
    /// The key index checkpoint that follows each engine checkpoint.
    index_checkpointing: RefCell<IndexCheckpointing>,
    /// Terms of the applied log, for checkpoints that finish after the
    /// in-memory log was trimmed past them.
    applied_terms: RefCell<raftlog::TermStarts>,
    max_request_bytes: usize,
    max_pending: usize,
    /// `--quota-backend-bytes` in force (None: disabled).
    backend_quota: Option<u64>,
    alarms: RefCell<crate::alarm::Alarms>,
    /// When this member last proposed its NOSPACE alarm (one attempt in
    /// flight at a time; retried if it got lost).
    nospace_proposed_at: Cell<Option<Instant>>,
    /// An applied write took the store past the quota: the loop raises
    /// this member's NOSPACE alarm after the turn.
    nospace_wanted: Cell<bool>,
    /// Leases a keep-alive refreshed while a checkpoint of theirs stands:
    /// the loop proposes their reset after the turn.
    checkpoint_resets: RefCell<std::collections::BTreeSet<i64>>,
    /// Leases whose periodic checkpoint is proposed and not answered yet:
    /// a keep-alive meanwhile resets them too, or the older value would
    /// land after it.
    checkpoints_in_flight: RefCell<std::collections::HashSet<i64>>,
    max_batch: usize,
    batch_window: Duration,
    snapshot_count: u64,
    tick_interval: Duration,
}

/// Where a start-up's time and memory went, logged phase by phase
/// (`start-up: read the WAL 812 ms, RSS 301 MiB`) so an operator sees what
/// a restart costs and why.
struct StartupPhases {
    last: Instant,
}

/// When the first member start-up of this process began.
static STARTUP_BEGAN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

impl StartupPhases {
    fn begin() -> StartupPhases {
        let now = Instant::now();
        STARTUP_BEGAN.get_or_init(|| now);
        StartupPhases { last: now }
    }

    fn done(&mut self, phase: &str) {
        let now = Instant::now();
        log(format_args!(
            "start-up: {phase} {} ms, RSS {} MiB",
            (now - self.last).as_millis(),
            resident_mib()
        ));
        self.last = now;
    }

    /// Logs the whole start-up: from its beginning to serving clients
    /// (the replay of committed entries and the publish included).
    fn ready() {
        if let Some(began) = STARTUP_BEGAN.get() {
            log(format_args!(
                "start-up: serving after {} ms, RSS {} MiB",
                began.elapsed().as_millis(),
                resident_mib()
            ));
        }
    }
}

/// This process's resident memory (0 where /proc cannot say).
fn resident_mib() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system; no pointers.
    let page_bytes = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    pages * page_bytes / (1 << 20)
}

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("metcd: {msg}");
}

/// How long a background checkpoint may take before it is raised to
/// ordinary CPU priority, however few entries came meanwhile (a full
/// checkpoint of 1M keys takes about a second on an idle core).
const CHECKPOINT_PATIENCE: Duration = Duration::from_secs(10);

/// The most entries between two checkpoints of the btree engine, whatever
/// `--snapshot-count` says (etcd commits bbolt every 100 ms anyway): a
/// restart re-applies every entry since the engine's last persist, ~8 us
/// each on 2 vCPUs (each write copies its path of nodes), so 100,000
/// entries cost 0.8 s of a restart and 20,000 about 0.2 s. A persist
/// writes only the pages changed since the last (measured filling 500k
/// keys: 34.6k puts/s either way).
const BTREE_CHECKPOINT_ENTRIES: u64 = 20_000;

/// A compaction past the key index checkpoint brings the next engine
/// checkpoint forward, at most this often.
const FORCED_CHECKPOINT_SPACING: Duration = Duration::from_secs(10);

/// A key index checkpoint to write: a reader of the store, what the
/// checkpoint describes, and the WAL bytes written when it was planned.
type PlannedIndexCheckpoint = (mvcc::StoreReader<AnyEngine>, mvcc::IndexCheckpointPlan, u64);

/// The state of key index checkpointing (see [`crate::index_file`]).
#[derive(Default)]
struct IndexCheckpointing {
    /// Planned with the engine checkpoint in flight.
    planned: Option<PlannedIndexCheckpoint>,
    /// The same, once the engine checkpoint is durable: to be written.
    ready: Option<PlannedIndexCheckpoint>,
    in_flight: bool,
    /// WAL bytes written when the last one was planned, and its size.
    last_written: (u64, u64),
    /// Revision of the last one written (or loaded at start); 0: none.
    written_revision: i64,
    /// When a compaction last brought an engine checkpoint forward.
    forced_at: Option<Instant>,
}

/// Logs where the key index came from at start-up; the checkpoint's
/// revision when it came from one.
fn report_index_source(source: &mvcc::IndexSource) -> Option<i64> {
    match source {
        mvcc::IndexSource::Checkpoint {
            revision,
            keys,
            revisions_after,
        } => {
            log(format_args!(
                "key index: loaded the checkpoint at revision {revision} ({keys} keys) and \
                 {revisions_after} newer revisions from the engine"
            ));
            Some(*revision)
        }
        mvcc::IndexSource::Rebuilt { why: Some(why) } => {
            log(format_args!(
                "key index: rebuilt from every revision in the engine ({why})"
            ));
            None
        }
        mvcc::IndexSource::Rebuilt { why: None } => None,
    }
}

/// Runs `work` on a new thread named `name` and awaits its answer: for
/// reads of a whole store (hashes, backups) that must not hold a shard.
async fn on_a_thread<T: Send + 'static>(
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let (done, answer) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let _ = done.send(work());
        })
        .map_err(|e| ServerError::Startup(format!("cannot start a {name} thread: {e}")))?;
    answer
        .await
        .map_err(|_| ServerError::Startup(format!("the {name} thread stopped")))
}

/// What a start-up reads beside the engine: the WAL, and the key index
/// checkpoint decoded (not yet checked against the engine).
struct ReadAlongside {
    wal: std::result::Result<wal::Recovered, engine::Error>,
    wal_took: Duration,
    index_checkpoint: Option<crate::mvcc::DecodedIndexCheckpoint>,
    index_took: Duration,
}

fn read_wal_and_index_checkpoint(dirs: &DataDirs) -> ReadAlongside {
    let began = Instant::now();
    let wal = wal::recover(&dirs.wal);
    let wal_took = began.elapsed();
    let began = Instant::now();
    let index_checkpoint = crate::index_file::read(&dirs.root)
        .map(|bytes| crate::mvcc::DecodedIndexCheckpoint::decode(&bytes));
    ReadAlongside {
        wal,
        wal_took,
        index_checkpoint,
        index_took: began.elapsed(),
    }
}

/// The peer TLS configuration, when `--peer-cert-file` and friends are set.
fn peer_tls(cfg: &Config) -> Result<Option<crate::tls::PeerTls>> {
    cfg.peer_tls_files()
        .map(|files| crate::tls::PeerTls::load(&files).map_err(ServerError::Startup))
        .transpose()
}

impl Node {
    /// Recovers the member from its data dir and starts the Raft loop and
    /// the auto-compactor on the current executor.
    pub async fn start(cfg: &Config) -> Result<Rc<Node>> {
        let mut phases = StartupPhases::begin();
        let dirs = DataDirs::new(&cfg.data_dir());
        for dir in [&dirs.root, &dirs.wal, &dirs.snap] {
            create_dir_durable(dir)?;
        }
        // Backup streams interrupted by a crash are never part of the state.
        if let Ok(entries) = std::fs::read_dir(&dirs.snap) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("backup-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let engine_dir = EngineDir::open(&dirs.snap, cfg.engine_kind())?
            .with_cache_bytes(cfg.engine_cache_bytes);
        // The WAL and the key index checkpoint do not depend on the engine:
        // they are read and decoded on a thread of their own while the
        // engine loads (each takes 0.05-1 s for a store of 1M keys).
        let (engine, alongside) = std::thread::scope(|scope| {
            let reader = std::thread::Builder::new()
                .name("metcd-recover".into())
                .spawn_scoped(scope, || read_wal_and_index_checkpoint(&dirs));
            let engine = engine_dir.open_engine();
            let alongside = match reader {
                Ok(reader) => reader.join().map_err(|_| {
                    ServerError::Startup("the thread reading the WAL panicked".into())
                }),
                // No thread to be had: read them here, after the engine.
                Err(_) => Ok(read_wal_and_index_checkpoint(&dirs)),
            };
            (engine, alongside)
        });
        let engine = engine?;
        let engine_applied = engine.applied_index();
        let alongside = alongside?;
        phases.done("open the engine");
        log(format_args!(
            "start-up: alongside it: read the WAL {} ms, decode the key index checkpoint {} ms",
            alongside.wal_took.as_millis(),
            alongside.index_took.as_millis()
        ));
        let mut recovered = alongside.wal?;
        let index_checkpoint = alongside.index_checkpoint;
        if raftlog::adopt_installed_snapshot(
            &mut recovered,
            engine_applied,
            read_installed_snapshot(&dirs),
        ) {
            // Wal::open writes the adopted marker into its first frame.
            log(format_args!(
                "the engine holds a leader's snapshot at index {engine_applied} whose WAL marker was lost \
                 in a crash; its marker kept in member/{INSTALLED_SNAPSHOT} stands in"
            ));
        }
        if let Some((path, offset)) = &recovered.truncated {
            log(format_args!(
                "wal: cut a torn tail in {} at offset {offset} (an unacknowledged group commit)",
                path.display()
            ));
        }
        let initial = cfg
            .initial_members()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        let (cluster_id, id) = resolve_identity(cfg)?;
        let all_ids: Vec<u64> = initial.iter().map(|m| m.id).collect();
        let joining = cfg.initial_cluster_state == "existing";
        // A new cluster starts with all of --initial-cluster as voters. A
        // joining member starts from the membership its peers reported
        // (the bootstrap voters are in no log entry it could replay); the
        // leader's log then brings it up to date.
        let join_roster: Vec<MemberRecord> = if joining {
            std::fs::read(dirs.root.join("member").join("join-members.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let initial_conf = if joining {
            ConfState {
                voters: join_roster
                    .iter()
                    .filter(|m| !m.is_learner)
                    .map(|m| m.id)
                    .collect(),
                learners: join_roster
                    .iter()
                    .filter(|m| m.is_learner)
                    .map(|m| m.id)
                    .collect(),
                ..Default::default()
            }
        } else {
            ConfState {
                voters: all_ids.clone(),
                ..Default::default()
            }
        };
        match raftlog::check_engine_against_wal(&recovered, engine_applied) {
            Ok(()) => {}
            Err(raftlog::EngineWalMismatch::WalReleasedPastEngine { marker }) => {
                return Err(ServerError::Startup(format!(
                    "the WAL was released up to index {marker} but the newest snapshot in {} is at {engine_applied}: \
                     the snapshot directory is older than the WAL (restored from an old backup?); restore both together",
                    dirs.snap.display()
                )));
            }
            Err(raftlog::EngineWalMismatch::WalMissing { wal_end }) => {
                return Err(ServerError::Startup(format!(
                    "the snapshot in {} is at index {engine_applied} but the WAL ends at {wal_end}: WAL data is missing; \
                     restore this member from a backup or re-add it to its cluster",
                    dirs.snap.display(),
                )));
            }
        }
        let restored = raftlog::restore(&recovered, engine_applied, &initial_conf)?;
        if restored.discarded > 0 {
            log(format_args!(
                "dropped {} log entries after the snapshot: a branch the leader's snapshot replaced \
                 (their terms go down)",
                restored.discarded
            ));
        }
        phases.done("restore the raft log");
        let never_started = recovered.state.is_none()
            && recovered.entries.is_empty()
            && recovered.snapshot.is_none()
            && engine_applied == 0;
        if !joining && never_started {
            // etcd bootstraps a new cluster's log with its ConfChange
            // entries at term 1, so its first leader is elected at term 2
            // and every response header of a fresh cluster says
            // `raft_term: 2`. Starting at term 1 gives clients the same
            // numbers (our bootstrap voters live in the ConfState instead).
            restored.storage.wl().mut_hard_state().term = 1;
        }
        let (mvcc, index_source) =
            MvccStore::open_with_decoded_checkpoint(engine.clone(), index_checkpoint, cluster_id)?;
        let checkpoint_revision = report_index_source(&index_source);
        if checkpoint_revision.is_some()
            && std::env::var_os("METCD_VERIFY_INDEX_CHECKPOINT").is_some()
        {
            mvcc.verify_index().map_err(|e| {
                ServerError::Startup(format!(
                    "METCD_VERIFY_INDEX_CHECKPOINT: the checkpoint loaded wrong: {e}"
                ))
            })?;
            log(format_args!(
                "key index: checked against a full rebuild (METCD_VERIFY_INDEX_CHECKPOINT)"
            ));
        }
        phases.done("load the key index");
        // Membership changes applied into the engine are newer than any
        // WAL snapshot marker (the engine is at or past it).
        if let Some(cs) = conf_kept_in(&mvcc, engine_applied)? {
            restored.storage.wl().set_conf_state(cs);
        }
        let conf = restored.storage.initial_state()?.conf_state;
        let single_voter = conf.voters == [id] && conf.learners.is_empty();
        let in_conf = conf.voters.contains(&id) || conf.learners.contains(&id);
        let unknown = conf.voters.is_empty() && conf.learners.is_empty();
        if !in_conf && !unknown {
            return Err(ServerError::Startup(format!(
                "member {id:x} (from --initial-advertise-peer-urls and --initial-cluster-token) is not in the \
                 cluster this data dir belongs to (members {:x?}); start it with the flags it was created with",
                conf.voters
            )));
        }
        // Only committed entries are sure to apply before peers are heard.
        let catch_up_to = if single_voter {
            restored.last_index
        } else {
            restored.storage.initial_state()?.hard_state.commit
        };
        let lessor = crate::apply::restore_leases(
            &mvcc,
            crate::lease::min_ttl_secs(cfg.election_timeout),
            Instant::now(),
        )?;
        let mut auth = crate::apply::restore_auth(&mvcc)?;
        auth.set_token_settings(
            cfg.token_settings()
                .map_err(|e| ServerError::Startup(e.to_string()))?,
        );
        let alarms = crate::apply::restore_alarms(&mvcc)?;
        phases.done("restore leases, auth, alarms");
        let wal = Wal::open(
            &dirs.wal,
            WalOptions {
                segment_bytes: cfg.wal_segment_bytes,
                preallocate: true,
                dsync: cfg.wal_dsync,
            },
            &recovered,
        )
        .await?;
        log(format_args!(
            "recovered {} log entries after snapshot index {}, applied index {}, revision {}",
            recovered.entries.len(),
            recovered.snapshot.as_ref().map_or(0, |(i, _)| *i),
            restored.applied,
            mvcc.current_revision(),
        ));
        drop(recovered);
        phases.done("open the WAL");

        let raft_cfg = crate::ready::raft_config(
            id,
            restored.applied,
            (cfg.election_timeout / cfg.heartbeat_interval).max(2) as usize,
        );
        raft_cfg.validate()?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let removed_members: std::collections::HashSet<u64> = mvcc
            .meta_with_prefix(REMOVED_META)?
            .into_iter()
            .filter_map(|(name, _)| {
                let id: [u8; 8] = name.get(REMOVED_META.len()..)?.try_into().ok()?;
                Some(u64::from_be_bytes(id))
            })
            .collect();
        let raft_store = restored.storage.clone();
        let mut raw = RawNode::new(&raft_cfg, restored.storage, &logger)?;
        if single_voter {
            // A one-voter group elects itself at once.
            raw.campaign()?;
        }
        let mut registry = Registry::default();
        for m in &join_roster {
            registry.upsert(m.clone());
        }
        for m in initial.iter().filter(|_| !joining) {
            registry.upsert(MemberRecord {
                id: m.id,
                name: String::new(),
                peer_urls: m.peer_urls.clone(),
                client_urls: Vec::new(),
                is_learner: false,
            });
        }
        load_member_records(&mvcc, &mut registry)?;
        registry.retain(|m| {
            conf.voters.contains(&m.id)
                || conf.learners.contains(&m.id)
                || (conf.voters.is_empty() && conf.learners.is_empty())
        });
        let my_attrs = MemberRecord {
            id,
            name: cfg.name.clone(),
            peer_urls: crate::config::split_list(&cfg.initial_advertise_peer_urls)
                .into_iter()
                .map(String::from)
                .collect(),
            client_urls: crate::config::split_list(
                cfg.advertise_client_urls
                    .as_deref()
                    .unwrap_or(&cfg.listen_client_urls),
            )
            .into_iter()
            .map(String::from)
            .collect(),
            is_learner: false,
        };
        let peer_addrs = cfg
            .peer_listen_addrs()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        // Always there (idle without peers), so a member added later is
        // reachable; inbound needs --listen-peer-urls on a single member.
        let faults = peer::Faults::new(cfg.experimental_peer_fault_file.clone());
        let tls = peer_tls(cfg)?;
        let transport = Transport::new(id, cluster_id, faults.clone(), tls.clone());
        for m in registry.all() {
            connect_peer(&transport, &m);
        }

        let boot_nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let node = Rc::new(Node {
            id,
            metrics: Default::default(),
            cluster_id,
            registry: RefCell::new(registry),
            my_attrs,
            transport,
            progress: RefCell::new(HashMap::new()),
            transfer_to: Cell::new(None),
            stopping_since: Cell::new(None),
            serving: Cell::new(false),
            strict_reconfig: cfg.strict_reconfig_check,
            stop_transfer_limit: Duration::from_millis(2 * cfg.election_timeout),
            removed: Cell::new(false),
            removed_members: RefCell::new(removed_members),
            inbound: RefCell::new(Vec::new()),
            read_rounds: RefCell::new(ReadRounds::new(id)),
            solo: Cell::new(single_voter),
            learner: Cell::new(conf.learners.contains(&id)),
            was_leader: Cell::new(false),
            heartbeats_sent: RefCell::new(HashMap::new()),
            leads_settled: Cell::new(false),
            request_timeout: REQUEST_TIMEOUT_BASE + Duration::from_millis(2 * cfg.election_timeout),
            mvcc: RefCell::new(mvcc),
            engine: RefCell::new(engine),
            engine_dir,
            raft_store: raft_store.clone(),
            incoming_snapshots: RefCell::new(HashMap::new()),
            snapshot_sends: RefCell::new(Default::default()),
            snapshot_reports: RefCell::new(Vec::new()),
            catch_up_entries: cfg.experimental_snapshot_catchup_entries,
            last_snapshot_index: Cell::new(engine_applied),
            dirs,
            queue: RefCell::new(Vec::new()),
            queue_ready: Notify::default(),
            pending: RefCell::new(HashMap::new()),
            // Unique across restarts: entries replayed from an earlier run
            // must never match a proposal of this run.
            next_id: Cell::new(boot_nanos),
            fatal: RefCell::new(None),
            status: Cell::new(NodeStatus::default()),
            lessor: RefCell::new(lessor),
            auth: RefCell::new(auth),
            replayed_commit_index: catch_up_to,
            auth_flag: RefCell::new(Default::default()),
            read_view: RefCell::new(std::sync::Arc::new(crate::read_view::ReadView::new(
                Default::default(),
            ))),
            watch_subscribers: RefCell::new(Vec::new()),
            snapshot_done: RefCell::new(None),
            warned_snapshot: Cell::new(false),
            snapshot_in_flight: Cell::new(false),
            snapshot_retry_at: Cell::new(None),
            snapshot_started: Cell::new(None),
            snapshot_hurry_at: Cell::new(None),
            snapshot_pacing: Cell::new((0, 0)),
            snapshot_pacing_pending: Cell::new(None),
            index_checkpointing: RefCell::new(IndexCheckpointing {
                written_revision: checkpoint_revision.unwrap_or(0),
                ..IndexCheckpointing::default()
            }),
            applied_terms: RefCell::new(raftlog::TermStarts::default()),
            max_request_bytes: cfg.max_request_bytes,
            max_pending: cfg.max_pending_proposals,
            backend_quota: cfg.backend_quota(),
            alarms: RefCell::new(alarms),
            nospace_proposed_at: Cell::new(None),
            nospace_wanted: Cell::new(false),
            checkpoint_resets: RefCell::new(Default::default()),
            checkpoints_in_flight: RefCell::new(Default::default()),
            max_batch: cfg.wal_max_batch,
            batch_window: Duration::from_micros(cfg.wal_batch_window_us),
            snapshot_count: cfg.snapshot_count,
            tick_interval: Duration::from_millis(cfg.heartbeat_interval),
        });
        node.refresh_status(&raw, &wal);
        let weak = Rc::downgrade(&node);
        let deliver: peer::Deliver = Rc::new(move |m: Message| {
            if let Some(node) = weak.upgrade() {
                node.inbound.borrow_mut().push(m);
                node.queue_ready.notify();
            }
        });
        node.publish_read_view();
        let weak = Rc::downgrade(&node);
        let roster: peer::Roster = Rc::new(move || {
            weak.upgrade()
                .map(|node| node.members())
                .unwrap_or_default()
        });
        let weak = Rc::downgrade(&node);
        let deliver_snapshot = Rc::new(move |m: Message, file: PathBuf| {
            if let Some(node) = weak.upgrade() {
                let index = m.get_snapshot().get_metadata().index;
                if let Some(old) = node.incoming_snapshots.borrow_mut().insert(index, file) {
                    let _ = std::fs::remove_file(old);
                }
                node.inbound.borrow_mut().push(m);
                node.queue_ready.notify();
            }
        });
        let weak = Rc::downgrade(&node);
        let query: peer::QueryHandler = Rc::new(move |q: peer::PeerQuery| {
            let node = weak.upgrade();
            Box::pin(async move {
                match node {
                    Some(node) => node.answer_peer(q).await,
                    None => peer::PeerAnswer::NotLeader,
                }
            })
        });
        let weak = Rc::downgrade(&node);
        let is_removed = Rc::new(move |member: u64| {
            weak.upgrade()
                .is_some_and(|node| node.removed_members.borrow().contains(&member))
        });
        let inbound = Rc::new(peer::Inbound {
            is_removed,
            deliver,
            roster,
            faults: faults.clone(),
            snapshot_dir: node.dirs.snap.clone(),
            deliver_snapshot,
            query,
            traffic: node.transport.traffic(),
        });
        for addr in peer_addrs {
            // A member killed a moment ago may still hold the port.
            crate::net::retry_while_in_use(|| {
                peer::listen(addr.clone(), id, cluster_id, inbound.clone(), tls.clone())
            })
            .map_err(|e| ServerError::Startup(format!("cannot listen for peers on {addr}: {e}")))?;
        }
        let looped = node.clone();
        glommio::spawn_local(async move {
            if let Err(e) = looped.run(raw, wal).await {
                looped.fail(format!("raft loop stopped: {e}"));
            }
        })
        .detach();
        let compactor = Compactor::new(
            cfg.auto_compaction()
                .map_err(|e| ServerError::Startup(e.to_string()))?,
        );
        glommio::spawn_local(auto_compact(node.clone(), compactor)).detach();
        glommio::spawn_local(expire_leases(node.clone())).detach();
        glommio::spawn_local(publish_attributes(node.clone())).detach();
        node.wait_applied(catch_up_to).await?;
        if cfg.experimental_initial_corrupt_check {
            node.check_initial_hash().await?;
        }
        let corrupt_check = cfg
            .corrupt_check_interval()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        if let Some(every) = corrupt_check {
            glommio::spawn_local(check_corruption_periodically(node.clone(), every)).detach();
        }
        let lease_checkpoints = cfg
            .lease_checkpoint_interval()
            .map_err(|e| ServerError::Startup(e.to_string()))?;
        if let Some(every) = lease_checkpoints {
            glommio::spawn_local(checkpoint_leases(node.clone(), every)).detach();
        }
        Ok(node)
    }

    /// The other members' IDs.
    fn peer_ids(&self) -> Vec<u64> {
        let registry = self.registry.borrow();
        registry
            .all()
            .iter()
            .map(|m| m.id)
            .filter(|id| *id != self.id)
            .collect()
    }

    /// `peer`'s KV hash at `revision`: (hash, its current revision, its
    /// compact revision); None (logged) if it cannot say, as etcd skips
    /// such peers (down, lagging behind the revision, or compacted past it).
    async fn peer_hash_kv(&self, peer: u64, revision: i64) -> Option<(u32, i64, i64)> {
        debug_assert!(revision > 0, "a hash check names its revision");
        let asked = Box::pin(self.within_request_timeout(async {
            self.transport
                .ask(peer, &peer::PeerQuery::HashKv(revision))
                .await
                .map_err(|e| ServerError::BadRequest(e.to_string()))
        }))
        .await;
        match asked {
            Ok(peer::PeerAnswer::HashKv(Ok((hash, hashed, current, compacted)))) => {
                // A hash of another revision compares with nothing.
                (hashed == revision).then_some((hash, current, compacted))
            }
            Ok(peer::PeerAnswer::HashKv(Err(why))) => {
                log(format_args!(
                    "cannot check the hash of peer {peer:x} at revision {revision}: {why}"
                ));
                None
            }
            Ok(_) => None,
            Err(e) => {
                log(format_args!("cannot fetch the hash of peer {peer:x}: {e}"));
                None
            }
        }
    }

    /// etcd's `--experimental-initial-corrupt-check`: a peer that hashes
    /// this member's revision differently, with the same compact revision,
    /// means this member's data diverged: refuse to serve.
    async fn check_initial_hash(&self) -> Result<()> {
        let own = self.hash_kv(0).await?;
        let mut mismatches = 0;
        for peer in self.peer_ids() {
            let Some((hash, revision, compact_revision)) =
                self.peer_hash_kv(peer, own.revision).await
            else {
                continue;
            };
            if hash == own.hash {
                continue;
            }
            if compact_revision == own.compact_revision {
                log(format_args!(
                    "{:x}'s hash {} != {peer:x}'s hash {hash} (revision {}, peer revision \
                     {revision}, compact revision {compact_revision})",
                    self.id, own.hash, own.revision
                ));
                mismatches += 1;
            } else {
                log(format_args!(
                    "cannot check the hash of peer {peer:x}: it has a different compact \
                     revision {compact_revision} (revision {revision})"
                ));
            }
        }
        if mismatches > 0 {
            return Err(ServerError::Startup(format!(
                "{:x} found data inconsistency with peers (this member's data differs from \
                 theirs: remove it from the cluster, wipe its data dir and add it back, see \
                 docs/operations.md)",
                self.id
            )));
        }
        Ok(())
    }

    /// etcd's periodic corruption check, run by the leader: its own hash
    /// at its current revision against every peer's at that revision, its
    /// own again (a change at the same revision is local corruption). A
    /// peer ahead of the leader's revision or compaction, or hashing the
    /// same compacted history differently, gets the CORRUPT alarm (one
    /// member per check, as etcd), which stops every write cluster-wide.
    async fn check_peer_hashes(&self) -> Result<()> {
        // Only a leader that knows every committed entry compares: a new
        // one may not have applied what a follower already has.
        if !self.leads_settled.get() {
            return Ok(());
        }
        let term = self.status.get().term;
        let first = self.hash_kv(0).await?;
        let mut answers = Vec::new();
        for peer in self.peer_ids() {
            if let Some(answer) = self.peer_hash_kv(peer, first.revision).await {
                answers.push((peer, answer));
            }
        }
        // Leadership lost meanwhile: followers moved on under another
        // leader, and their revisions say nothing about this member.
        if !self.leads_settled.get() || self.status.get().term != term {
            return Ok(());
        }
        let again = self.hash_kv(0).await?;
        let mut suspect = None;
        if again.hash != first.hash
            && again.revision == first.revision
            && again.compact_revision == first.compact_revision
        {
            suspect = Some(self.id);
        }
        for (peer, (hash, revision, compact_revision)) in answers {
            if suspect.is_some() {
                break;
            }
            if revision > again.revision
                || compact_revision > again.compact_revision
                || (compact_revision == first.compact_revision && hash != first.hash)
            {
                log(format_args!(
                    "member {peer:x}'s hash {hash} (revision {revision}, compact revision \
                     {compact_revision}) differs from the leader's {} (revision {}, compact \
                     revision {})",
                    first.hash, first.revision, first.compact_revision
                ));
                suspect = Some(peer);
            }
        }
        let Some(member) = suspect else {
            return Ok(());
        };
        log(format_args!(
            "raising the CORRUPT alarm for member {member:x}"
        ));
        self.alarm(crate::alarm::AlarmRequest {
            action: crate::alarm::AlarmAction::Activate,
            member,
            alarm: crate::alarm::AlarmType::Corrupt,
        })
        .await?;
        Ok(())
    }

    /// Stops accepting work after an unrecoverable error (e.g. a failed
    /// fsync) and exits: a restart recovers from the WAL, which is the only
    /// safe way on.
    fn fail(&self, why: String) {
        log(format_args!("fatal: {why}"));
        *self.fatal.borrow_mut() = Some(why);
        self.pending.borrow_mut().clear();
        self.queue.borrow_mut().clear();
        std::process::exit(2);
    }

    /// Waits until everything the WAL held is applied, so the first read
    /// after a restart already sees every acknowledged write.
    async fn wait_applied(&self, index: u64) -> Result<()> {
        let deadline = Instant::now() + CATCH_UP_LIMIT;
        while self.status.get().applied_index < index {
            if let Some(why) = self.fatal.borrow().as_ref() {
                return Err(ServerError::Startup(why.clone()));
            }
            if Instant::now() > deadline {
                return Err(ServerError::Startup(format!(
                    "re-applying the log did not reach index {index} within {CATCH_UP_LIMIT:?}"
                )));
            }
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// The loop publishes term, leader and indexes once per turn, but a
    /// turn's replies go out as each entry applies, before that turn ends:
    /// a client that saw its write acknowledged (through another shard,
    /// on another thread) must find its revision here, so the store's own
    /// figures are read live.
    pub fn status(&self) -> NodeStatus {
        let mut status = self.status.get();
        if let Ok(mvcc) = self.mvcc.try_borrow() {
            status.revision = mvcc.current_revision();
            status.compact_revision = mvcc.compact_revision();
            status.applied_index = status.applied_index.max(mvcc.applied_index());
            status.committed_index = status.committed_index.max(status.applied_index);
        }
        status
    }

    /// The Prometheus `/metrics` page (see [`crate::metrics`]): etcd's
    /// families, and metcd's own.
    pub fn metrics_page(&self) -> (String, String) {
        let status = self.status();
        let (keys, ops) = self
            .mvcc
            .try_borrow()
            .map_or((0, Default::default()), |m| (m.key_count(), m.op_counts()));
        let gauges = crate::metrics::Gauges {
            member_id: self.id,
            has_leader: status.leader != 0,
            is_leader: status.leader == self.id,
            is_learner: status.is_learner,
            committed_index: status.committed_index,
            applied_index: status.applied_index,
            proposals_pending: self.queue.try_borrow().map_or(0, |q| q.len())
                + self.pending.try_borrow().map_or(0, |p| p.len()),
            db_size: self.db_size(),
            block_cache: self.engine.borrow().cache_usage(),
            keys,
            ops,
            watchers: crate::watch::watchers_in_process(),
            slow_watchers: crate::watch::slow_watchers_in_process(),
            watch_streams: crate::watch::watch_streams_in_process(),
            watch_events_sent: crate::watch::events_sent_in_process(),
            quota_backend_bytes: self.backend_quota.unwrap_or(0),
            revision: status.revision,
            compact_revision: status.compact_revision,
            auth_revision: self.auth.try_borrow().map_or(0, |a| a.revision()),
            pending_events: crate::watch::pending_events_in_process(),
            wal_write_bytes: status.wal_bytes,
            peers: Some(self.transport.traffic()),
        };
        (
            crate::metrics::render(&gauges, &self.metrics),
            crate::metrics::render_metcd(&gauges),
        )
    }

    /// etcd's `/health`: no fatal error, a leader, and no active alarm.
    /// Whether client requests are served yet (see [`publish_attributes`]).
    pub fn serving(&self) -> bool {
        self.serving.get()
    }

    pub fn is_healthy(&self) -> bool {
        self.fatal.borrow().is_none()
            && self.status.get().leader != 0
            && self.alarms.borrow().is_empty()
    }

    /// Proposes a write and waits until it is durable and applied; a
    /// client's is checked against its permissions first (and again at
    /// apply), as etcd's.
    pub async fn write(&self, req: mvcc::Request, caller: Caller<'_>) -> Result<mvcc::Response> {
        let mut body = Vec::with_capacity(64);
        let tag = match caller {
            Caller::Member => TAG_KV,
            Caller::Client(token) => {
                if matches!(req, mvcc::Request::Put(_) | mvcc::Request::Txn(_)) {
                    self.check_quota(crate::alarm::cost(&req)).await?;
                }
                let mut used = Vec::new();
                leases_used(&req, &mut used);
                self.check_proposal(token, |needs| crate::auth::kv_needs(&req, needs), &used)?
                    .encode(&mut body);
                TAG_KV_AUTHED
            }
        };
        mvcc::codec::encode(&req, &mut body);
        match self.propose(tag, &body).await? {
            Applied::Kv(r) => Ok(r),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Grants a lease through the log; `id` 0 lets the member pick one.
    pub async fn lease_grant(&self, id: i64, ttl: i64) -> Result<(i64, i64, i64)> {
        self.check_quota(crate::alarm::LEASE_COST).await?;
        if ttl > crate::lease::MAX_LEASE_TTL {
            return Err(ServerError::Lease(crate::lease::LeaseError::TtlTooLarge));
        }
        let id = if id == 0 { self.new_lease_id() } else { id };
        let mut body = Vec::with_capacity(16);
        body.put_i64_le(id);
        body.put_i64_le(ttl);
        match self.propose(TAG_LEASE_GRANT, &body).await? {
            Applied::LeaseGranted { id, ttl, revision } => Ok((id, ttl, revision)),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Revokes a lease through the log, deleting its keys; returns the
    /// revision. A client needs write permission on every attached key.
    pub async fn lease_revoke(&self, id: i64, caller: Caller<'_>) -> Result<i64> {
        let mut body = Vec::with_capacity(8);
        let tag = match caller {
            Caller::Member => TAG_LEASE_REVOKE,
            Caller::Client(token) => {
                self.check_proposal(token, |_| {}, &[id])?.encode(&mut body);
                TAG_LEASE_REVOKE_AUTHED
            }
        };
        body.put_i64_le(id);
        match self.propose(tag, &body).await? {
            Applied::LeaseRevoked { revision } => Ok(revision),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Keep-alive (leader-local, as in etcd): the TTL, or `None` if unknown.
    pub fn lease_keepalive(&self, id: i64) -> Option<i64> {
        let mut lessor = self.lessor.borrow_mut();
        let ttl = lessor.refresh(id, Instant::now())?;
        crate::metrics::count(&self.metrics.leases_renewed);
        let checkpointed = lessor.get(id).is_some_and(|l| l.checkpointed.is_some());
        if checkpointed || self.checkpoints_in_flight.borrow().contains(&id) {
            // The full TTL from now is what a new leader must start from
            // (etcd resets the checkpoint on a keep-alive too).
            self.checkpoint_resets.borrow_mut().insert(id);
        }
        Some(ttl)
    }

    /// Proposes one batch of lease checkpoints and waits for it.
    async fn propose_checkpoints(&self, batch: &[(i64, i64)]) -> Result<()> {
        let mut body = Vec::with_capacity(batch.len() * 16);
        for (id, remaining) in batch {
            body.put_i64_le(*id);
            body.put_i64_le(*remaining);
        }
        self.propose(TAG_LEASE_CHECKPOINT, &body).await.map(|_| ())
    }

    /// The leader's periodic checkpoints of the leases in `due`, in
    /// etcd's batches of 1000, each batch's remaining TTLs read when it is
    /// proposed (a keep-alive between batches is not overwritten).
    async fn checkpoint_due(&self, due: Vec<i64>, interval: Duration) {
        for ids in due.chunks(LEASE_CHECKPOINT_BATCH) {
            let now = Instant::now();
            let batch: Vec<(i64, i64)> = {
                let lessor = self.lessor.borrow();
                ids.iter()
                    .filter_map(|id| lessor.due_checkpoint(*id, now, interval))
                    .collect()
            };
            self.checkpoints_in_flight
                .borrow_mut()
                .extend(batch.iter().map(|(id, _)| *id));
            let proposed = self.propose_checkpoints(&batch).await;
            let mut in_flight = self.checkpoints_in_flight.borrow_mut();
            for (id, _) in &batch {
                in_flight.remove(id);
            }
            if let Err(e) = proposed {
                log(format_args!("lease checkpoint: {e}"));
                return;
            }
        }
    }

    /// Proposes the resets keep-alives asked for; a failed one is asked
    /// again while this member still leads (the next loop turn retries).
    async fn reset_checkpoints(&self, ids: Vec<i64>) {
        for ids in ids.chunks(LEASE_CHECKPOINT_BATCH) {
            let batch: Vec<(i64, i64)> = ids.iter().map(|id| (*id, 0)).collect();
            if let Err(e) = self.propose_checkpoints(&batch).await {
                log(format_args!("lease checkpoint reset: {e}"));
                if self.leads_leases() {
                    self.checkpoint_resets
                        .borrow_mut()
                        .extend(ids.iter().copied());
                }
            }
        }
    }

    /// (remaining TTL, granted TTL, keys) of a lease, `None` if unknown.
    pub fn lease_time_to_live(&self, id: i64) -> Option<(i64, i64, Vec<bytes::Bytes>)> {
        let lessor = self.lessor.borrow();
        let state = lessor.get(id)?;
        let remaining = lessor.remaining(id, Instant::now()).unwrap_or(state.ttl);
        Some((remaining, state.ttl, state.keys.iter().cloned().collect()))
    }

    /// A follower's forwarded lease question, answered by the leader.
    async fn answer_peer(&self, q: peer::PeerQuery) -> peer::PeerAnswer {
        if let peer::PeerQuery::HashKv(revision) = q {
            return peer::PeerAnswer::HashKv(
                self.hash_kv(revision)
                    .await
                    .map(|h| (h.hash, h.hash_revision, h.revision, h.compact_revision))
                    .map_err(|e| e.to_string()),
            );
        }
        if !self.leads_leases() {
            return peer::PeerAnswer::NotLeader;
        }
        match q {
            peer::PeerQuery::KeepAlive(id) => peer::PeerAnswer::KeepAlive(self.lease_keepalive(id)),
            peer::PeerQuery::TimeToLive(id) => peer::PeerAnswer::TimeToLive(
                self.lease_time_to_live(id)
                    .map(|(remaining, granted, keys)| {
                        (
                            remaining,
                            granted,
                            keys.into_iter().map(|k| k.to_vec()).collect(),
                        )
                    }),
            ),
            peer::PeerQuery::Promote(id) => {
                peer::PeerAnswer::Promoted(self.member_promote(id).await.map_err(|e| e.to_string()))
            }
            peer::PeerQuery::HashKv(_) => peer::PeerAnswer::NotLeader,
        }
    }

    /// Asks the leader a lease question (from a follower).
    pub async fn forward_lease(&self, q: peer::PeerQuery) -> Result<peer::PeerAnswer> {
        let leader = self.status.get().leader;
        if leader == 0 {
            return Err(ServerError::NoLeader);
        }
        // Boxed: the peer call's future is kilobytes, and unboxed it would
        // size every owner command's future (puts included) to match.
        Box::pin(self.within_request_timeout(async {
            self.transport
                .ask(leader, &q)
                .await
                .map_err(|_| ServerError::NotLeader)
        }))
        .await
    }

    /// `answer`, or `etcdserver: request timed out` after etcd's request
    /// timeout (what may never come back once a peer is involved).
    async fn within_request_timeout<T>(
        &self,
        answer: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let timed_out = async {
            glommio::timer::sleep(self.request_timeout).await;
            Err(ServerError::Timeout)
        };
        futures_lite::future::or(answer, timed_out).await
    }

    pub fn leases(&self) -> Vec<i64> {
        self.lessor.borrow().ids().collect()
    }

    /// etcd picks lease IDs from its request-ID generator: positive, unique.
    fn new_lease_id(&self) -> i64 {
        loop {
            let id = self.next_id.get().wrapping_add(1);
            self.next_id.set(id);
            let candidate = (id & (i64::MAX as u64)) as i64;
            if candidate != 0 && !self.lessor.borrow().exists(candidate) {
                return candidate;
            }
        }
    }

    async fn propose(&self, tag: u8, body: &[u8]) -> Result<Applied> {
        self.propose_with(tag, body, None).await
    }

    async fn propose_with(
        &self,
        tag: u8,
        body: &[u8],
        conf: Option<ConfChangeV2>,
    ) -> Result<Applied> {
        if self.fatal.borrow().is_some() {
            return Err(ServerError::Stopped);
        }
        if self.learner.get() && tag != TAG_MEMBER_ATTRS {
            return Err(ServerError::NotSupportedForLearner);
        }
        if self.queue.borrow().len() >= self.max_pending {
            return Err(ServerError::TooManyRequests);
        }
        // etcd checks the marshalled request against --max-request-bytes.
        if body.len() > self.max_request_bytes {
            return Err(ServerError::RequestTooLarge);
        }
        let id = self.next_id.get().wrapping_add(1);
        self.next_id.set(id);
        let data = proposal(self.id, id, tag, body);
        let (tx, rx) = oneshot::channel();
        self.queue.borrow_mut().push(Proposal {
            id,
            data,
            conf,
            reply: tx,
        });
        self.queue_ready.notify();
        if self.solo.get() {
            // A single member answers every proposal it accepted.
            return rx.await.map_err(|_| ServerError::Stopped)?;
        }
        // With peers a forwarded proposal can be lost with a leader change.
        let answer = self
            .within_request_timeout(async { rx.await.map_err(|_| ServerError::Stopped)? })
            .await;
        if let Err(e) = &answer {
            self.pending.borrow_mut().remove(&id);
            if matches!(
                e,
                ServerError::Timeout
                    | ServerError::LeaderChanged
                    | ServerError::NoLeader
                    | ServerError::Stopped
            ) {
                self.metrics.note_failed_proposal();
            }
        }
        answer
    }

    /// Publishes this member's read view ([`crate::read_view`]) to every
    /// shard; kept current from then on.
    pub fn share_read_view(&self, view: std::sync::Arc<crate::read_view::ReadView>) {
        *self.read_view.borrow_mut() = view;
        self.publish_read_view();
    }

    pub fn read_view(&self) -> std::sync::Arc<crate::read_view::ReadView> {
        self.read_view.borrow().clone()
    }

    /// The store, whether this member is the only voter, and the term, as
    /// readers on every shard see them.
    fn publish_read_view(&self) {
        let view = self.read_view.borrow();
        view.publish(self.mvcc.borrow().reader());
        view.set_solo(self.solo.get());
        view.set_term(self.status.get().term);
    }

    /// Shares whether auth is on with the API edges of every shard.
    pub fn share_auth_flag(&self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        flag.store(
            self.auth.borrow().enabled(),
            std::sync::atomic::Ordering::Release,
        );
        *self.auth_flag.borrow_mut() = flag;
    }

    /// Whether the caller behind `token` may do what `requirement` names
    /// (always, with auth off, and then `requirement` is never built).
    pub fn authorize(
        &self,
        token: Option<&str>,
        requirement: impl FnOnce() -> crate::auth::Requirement,
    ) -> Result<()> {
        let mut auth = self.auth.borrow_mut();
        if !auth.enabled() {
            return Ok(());
        }
        let requirement = requirement();
        let for_keys =
            matches!(&requirement, crate::auth::Requirement::Keys(needs) if !needs.is_empty());
        let user = auth.user_of(token, Instant::now(), for_keys)?;
        Ok(auth.check(user.as_deref(), &requirement)?)
    }

    /// The proposer's check of a client's write (while auth is on): the
    /// needs `collect` adds, plus write permission on every key already
    /// attached to `leases` (etcd's `checkLeasePuts`: who may not revoke a
    /// lease may not attach keys to it either). Returns who to name in the
    /// entry for the check at apply — always, even with auth off (no user,
    /// the current auth revision): auth enabled in between bumps the
    /// revision, so such a write is refused at apply, as etcd refuses it,
    /// and a lease that gains keys in between is checked there too.
    fn check_proposal(
        &self,
        token: Option<&str>,
        collect: impl FnOnce(&mut Vec<crate::auth::Need>),
        leases: &[i64],
    ) -> Result<ProposedBy> {
        let mut auth = self.auth.borrow_mut();
        let auth_revision = auth.revision();
        if !auth.enabled() {
            return Ok(ProposedBy {
                user: String::new(),
                auth_revision,
            });
        }
        let mut needs = Vec::new();
        collect(&mut needs);
        lease_needs(&self.lessor.borrow(), leases, &mut needs);
        let user = auth.user_of(token, Instant::now(), !needs.is_empty())?;
        if !needs.is_empty() {
            auth.check(user.as_deref(), &crate::auth::Requirement::Keys(needs))?;
        }
        Ok(ProposedBy {
            user: user.unwrap_or_default(),
            auth_revision,
        })
    }

    /// An auth change through the log, by the caller behind `token`: root
    /// while auth is on (etcd's admin check), anybody for Authenticate.
    pub async fn auth_change(
        &self,
        token: Option<&str>,
        req: &crate::auth::AuthRequest,
    ) -> Result<crate::auth::AuthApplied> {
        if !matches!(req, crate::auth::AuthRequest::Authenticate { .. }) {
            self.authorize(token, || crate::auth::Requirement::Admin)?;
        }
        let mut body = Vec::new();
        crate::auth::encode(req, &mut body);
        match self.propose(TAG_AUTH, &body).await? {
            Applied::Auth(applied) => Ok(applied),
            _ => Err(ServerError::Stopped),
        }
    }

    /// A read of the auth state by the caller behind `token`.
    pub fn auth_query(
        &self,
        token: Option<&str>,
        query: &crate::auth::AuthQuery,
    ) -> Result<crate::auth::AuthAnswer> {
        self.authorize(token, || query.requirement())?;
        Ok(self.auth.borrow().query(query)?)
    }

    /// This member's ID.
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    pub fn is_leader(&self) -> bool {
        self.status.get().leader == self.id
    }

    /// Whether this member's lease clock is the cluster's (the leader's,
    /// or the only member's).
    pub fn leads_leases(&self) -> bool {
        self.solo.get() || self.is_leader()
    }

    /// Every member's record, in ID order.
    pub fn members(&self) -> Vec<MemberRecord> {
        self.registry.borrow().all()
    }

    /// Waits until this member has applied everything committed when the
    /// call began (a batched ReadIndex round through the leader), so a read
    /// that follows is linearizable. Immediate on a single member: every
    /// acknowledged write is already applied there.
    pub async fn read_barrier(&self) -> Result<()> {
        if self.solo.get() {
            return Ok(());
        }
        if self.learner.get() {
            return Err(ServerError::NotSupportedForLearner);
        }
        if self.status.get().leader == 0 {
            crate::metrics::count(&self.metrics.read_indexes_failed);
            return Err(ServerError::NoLeader);
        }
        let (tx, rx) = oneshot::channel();
        self.read_rounds.borrow_mut().queue(tx);
        self.queue_ready.notify();
        let read = self
            .within_request_timeout(async { rx.await.map_err(|_| ServerError::Stopped)? })
            .await;
        if matches!(read, Err(ServerError::Timeout)) {
            crate::metrics::count(&self.metrics.slow_read_indexes);
        }
        read
    }

    /// Writes a consistent snapshot of the whole store (keys, revisions,
    /// leases, auth, alarms, members) to a new file under the snap dir as
    /// an etcd 3.4 backend db ([`crate::etcd_db`]), for the Maintenance
    /// Snapshot stream, on a thread of its own. Returns (path, bytes); the
    /// caller deletes the file when sent.
    pub async fn write_backup(&self) -> Result<(PathBuf, u64)> {
        let snapshot = self.engine.borrow().snapshot();
        let n = self.next_id.get().wrapping_add(1);
        self.next_id.set(n);
        let path = self.dirs.snap.join(format!("backup-{n:016x}.db"));
        let target = path.clone();
        let started = Instant::now();
        let bytes = on_a_thread("metcd-backup", move || {
            crate::etcd_db::write_db(&snapshot, &target)
        })
        .await??;
        self.metrics
            .backend_snapshot
            .observe_seconds(started.elapsed());
        Ok((path, bytes))
    }

    /// Hands one feed item to every shard's watch hub (they only enqueue).
    fn feed_watchers(&self, item: &crate::watch::Feed) {
        for subscriber in self.watch_subscribers.borrow().iter() {
            subscriber(item);
        }
    }

    /// Registers a receiver of applied events; it must only enqueue. Its
    /// first item is the store's revision now ([`crate::watch::Feed::Base`]).
    pub fn subscribe_events(&self, f: crate::watch::EventSubscriber) {
        let revision = self.mvcc.borrow().current_revision();
        f(&crate::watch::Feed::Base { revision });
        self.watch_subscribers.borrow_mut().push(f);
    }

    /// Rewrites the engine's file compactly (btree); writes wait meanwhile,
    /// as in etcd's defragmentation.
    pub async fn defragment(&self) -> Result<()> {
        let engine = self.engine.borrow().clone();
        let started = Instant::now();
        self.metrics.defrag_inflight.set(true);
        let defragmented = self.engine_dir.defragment(&engine).await;
        self.metrics.defrag_inflight.set(false);
        self.metrics.defrag.observe_seconds(started.elapsed());
        let (before, after) = defragmented?;
        if before > 0 {
            log(format_args!(
                "defragmented the {} engine: {before} -> {after} bytes",
                engine.kind()
            ));
        }
        Ok(())
    }

    pub fn compact_revision(&self) -> i64 {
        self.mvcc.borrow().compact_revision()
    }

    /// The Hash RPC's CRC of the whole store, computed on a thread of its
    /// own from a snapshot (it reads every record).
    pub async fn hash_all(&self) -> Result<(u32, i64)> {
        let snapshot = self.engine.borrow().snapshot();
        let revision = self.mvcc.borrow().current_revision();
        let started = Instant::now();
        let hash = on_a_thread("metcd-hash", move || {
            let mut hash = 0u32;
            engine::EngineSnapshot::scan(
                &snapshot,
                std::ops::Bound::Unbounded,
                std::ops::Bound::Unbounded,
                |k, v| {
                    hash = crc32c::crc32c_append(crc32c::crc32c_append(hash, k), v);
                    engine::Scan::Continue
                },
            )
            .map(|()| hash)
        })
        .await??;
        self.metrics.hash.observe_seconds(started.elapsed());
        Ok((hash, revision))
    }

    /// etcd's HashKV: planned on this core (the index's part), hashed on a
    /// thread of its own, so a large store's hash never stalls the shard.
    pub async fn hash_kv(&self, revision: i64) -> Result<mvcc::HashKv> {
        let started = Instant::now();
        let plan = self.mvcc.borrow().plan_hash_kv(revision)?;
        let hash = on_a_thread("metcd-hash", move || plan.run()).await??;
        self.metrics.hash_rev.observe_seconds(started.elapsed());
        Ok(hash)
    }

    async fn run(self: &Rc<Self>, mut raw: RawNode<MemStorage>, mut wal: Wal) -> Result<()> {
        let mut next_tick = Instant::now() + self.tick_interval;
        let mut entry_buf = Vec::with_capacity(4096);
        loop {
            if self.queue.borrow().is_empty()
                && self.inbound.borrow().is_empty()
                && !self.read_rounds.borrow().has_queued()
                && !raw.has_ready()
                && self.snapshot_done.borrow().is_none()
            {
                let wait = next_tick.saturating_duration_since(Instant::now());
                futures_lite::future::or(self.queue_ready.notified(), glommio::timer::sleep(wait))
                    .await;
            }
            if Instant::now() >= next_tick {
                raw.tick();
                self.retry_read_index(&mut raw);
                next_tick = Instant::now() + self.tick_interval;
            }
            if !self.batch_window.is_zero() {
                let queued = self.queue.borrow().len();
                if queued > 0 && queued < self.max_batch {
                    glommio::timer::sleep(self.batch_window).await;
                }
            }
            self.step_inbound(&mut raw)?;
            for peer in self.transport.take_unreachable() {
                raw.report_unreachable(peer);
            }
            if self.transport.told_removed() && !self.removed.replace(true) {
                self.leave("a peer says this member", Duration::from_millis(100));
            }
            if let Some(target) = self.transfer_to.take() {
                raw.transfer_leader(target);
            }
            if crate::stop::requested() {
                self.stop_step(&mut raw);
            }
            for (peer, ok) in std::mem::take(&mut *self.snapshot_reports.borrow_mut()) {
                let status = if ok {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                raw.report_snapshot(peer, status);
            }
            self.propose_queued(&mut raw);
            self.start_read_index(&mut raw);
            self.finish_snapshot(&mut raw, &mut wal).await?;
            self.handle_ready(&mut raw, &mut wal, &mut entry_buf)
                .await?;
            self.refresh_status(&raw, &wal);
            if self.nospace_wanted.take() {
                let node = self.clone();
                glommio::spawn_local(async move { node.raise_nospace().await }).detach();
            }
            let resets = std::mem::take(&mut *self.checkpoint_resets.borrow_mut());
            if !resets.is_empty() {
                let node = self.clone();
                let resets = resets.into_iter().collect();
                glommio::spawn_local(async move { node.reset_checkpoints(resets).await }).detach();
            }
            self.on_role_change(&raw);
            self.maybe_snapshot(wal.bytes_written());
            self.trim_memory_log(&raw)?;
            // Let connections run between group commits.
            glommio::yield_if_needed().await;
        }
    }

    /// Steps what peers sent. Refuses to go on (instead of raft-rs'
    /// panic, etcd's panic loop in seed 001) when the leader believes this
    /// member holds entries it does not: its data dir was wiped or rolled back.
    fn step_inbound(&self, raw: &mut RawNode<MemStorage>) -> Result<()> {
        let msgs = std::mem::take(&mut *self.inbound.borrow_mut());
        for m in msgs {
            if m.get_msg_type() == MessageType::MsgHeartbeatResponse {
                self.note_round_trip(m.from);
            }
            if let Some(last) = crate::ready::claims_entries_we_lack(raw, &m) {
                return Err(ServerError::Startup(format!(
                    "leader {:x} says entries up to {} are committed on this member, but its log ends at {last}: \
                     the data dir {} was wiped or restored from an old copy. Refusing to run, as it would break \
                     the cluster's log. Safe procedure (docs/operations.md): on a healthy member \
                     `etcdctl member remove {:x}`, wipe this data dir, add the member back as a learner and start \
                     it with --initial-cluster-state existing",
                    m.from,
                    m.commit,
                    self.dirs.root.display(),
                    self.id
                )));
            }
            if m.get_msg_type() == MessageType::MsgSnapshot {
                // Only with its data on disk (the snapshot stream delivers
                // both); a bare one would make us adopt a state we lack.
                let index = m.get_snapshot().get_metadata().index;
                if !self.incoming_snapshots.borrow().contains_key(&index) {
                    if !self.warned_snapshot.replace(true) {
                        log(format_args!(
                            "dropped a snapshot message from {:x} without its data",
                            m.from
                        ));
                    }
                    continue;
                }
            }
            match raw.step(m) {
                Ok(()) | Err(raft::Error::StepPeerNotFound) | Err(raft::Error::StepLocalMsg) => {}
                Err(e) => log(format_args!("dropped a peer message: {e}")),
            }
        }
        Ok(())
    }

    /// One ReadIndex round for every linearizable read queued since the last.
    fn start_read_index(&self, raw: &mut RawNode<MemStorage>) {
        self.read_rounds.borrow_mut().start(raw, Instant::now());
    }

    /// A ReadIndex round can be lost (no leader yet, a message dropped, a
    /// leader change): ask again, as etcd does every 500 ms.
    fn retry_read_index(&self, raw: &mut RawNode<MemStorage>) {
        let now = Instant::now();
        self.read_rounds.borrow_mut().retry(raw, now, |sent| {
            now.duration_since(sent) >= READ_INDEX_RETRY
        });
    }

    /// A ReadIndex round came back: its reads may go once `index` is applied.
    fn read_index_ready(&self, ctx: &[u8], index: u64, applied: u64) {
        let mut ready = Vec::new();
        let answer = self
            .read_rounds
            .borrow_mut()
            .answered(ctx, index, applied, &mut ready);
        if answer == RoundAnswer::Stale {
            crate::metrics::count(&self.metrics.slow_read_indexes);
        }
        for w in ready {
            let _ = w.send(Ok(()));
        }
    }

    fn release_reads(&self, applied: u64) {
        let mut ready = Vec::new();
        self.read_rounds.borrow_mut().release(applied, &mut ready);
        for w in ready {
            let _ = w.send(Ok(()));
        }
    }

    /// Leadership changes: the new leader restarts every lease's clock (as
    /// etcd's Promote); reads of a round that will never come back fail.
    fn on_role_change(&self, raw: &RawNode<MemStorage>) {
        let leader = raw.raft.state == raft::StateRole::Leader;
        if leader == self.was_leader.get() {
            return;
        }
        self.was_leader.set(leader);
        if leader {
            self.heartbeats_sent.borrow_mut().clear();
            log(format_args!("became leader at term {}", raw.raft.term));
            self.lessor.borrow_mut().promote(Instant::now());
        } else {
            log(format_args!(
                "no longer leader at term {} (leader {:x})",
                raw.raft.term, raw.raft.leader_id
            ));
            let mut failed = Vec::new();
            let rounds = self.read_rounds.borrow_mut().fail_in_flight(&mut failed);
            for _ in 0..rounds {
                crate::metrics::count(&self.metrics.read_indexes_failed);
            }
            for w in failed {
                let _ = w.send(Err(ServerError::LeaderChanged));
            }
        }
    }

    fn propose_queued(&self, raw: &mut RawNode<MemStorage>) {
        let batch: Vec<Proposal> = {
            let mut queue = self.queue.borrow_mut();
            // Bound the group commit by count and by bytes, so one Ready
            // always fits in a WAL frame whatever clients send at once.
            let mut bytes = 0usize;
            let n = queue
                .iter()
                .take(self.max_batch)
                .position(|p| {
                    bytes += p.data.len();
                    bytes > MAX_BATCH_BYTES
                })
                .unwrap_or(queue.len().min(self.max_batch))
                .max(1)
                .min(queue.len());
            queue.drain(..n).collect()
        };
        let mut pending = self.pending.borrow_mut();
        for p in batch {
            let proposed = match p.conf {
                Some(cc) => raw.propose_conf_change(p.data, cc),
                None => raw.propose(Vec::new(), p.data),
            };
            match proposed {
                Ok(()) => {
                    pending.insert(p.id, p.reply);
                }
                Err(raft::Error::ProposalDropped) => {
                    let _ = p.reply.send(Err(ServerError::NoLeader));
                }
                Err(e) => {
                    let _ = p.reply.send(Err(ServerError::Raft(e)));
                }
            }
        }
        if !self.queue.borrow().is_empty() {
            // More than one batch queued: come back without sleeping.
            self.queue_ready.notify();
        }
    }

    async fn handle_ready(
        self: &Rc<Self>,
        raw: &mut RawNode<MemStorage>,
        wal: &mut Wal,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        crate::ready::handle_ready(raw, &mut NodeReady { node: self, wal }, buf).await
    }

    /// Adopts a leader's snapshot: its data file becomes the engine (and
    /// the newest checkpoint on disk), MVCC, leases and members are rebuilt
    /// from it, raft-rs' storage restarts at its index, and the WAL gets a
    /// marker there (written with this Ready's sync).
    async fn install_snapshot(
        &self,
        raw: &mut RawNode<MemStorage>,
        wal: &mut Wal,
        snap: raft::eraftpb::Snapshot,
    ) -> Result<()> {
        let meta = snap.get_metadata().clone();
        let index = meta.index;
        let Some(file) = self.incoming_snapshots.borrow_mut().remove(&index) else {
            return Err(ServerError::Startup(format!(
                "raft applies a snapshot at index {index} whose data never arrived"
            )));
        };
        // The marker's contents go beside the engine first: if the member
        // dies before this Ready's sync writes the marker, the engine is
        // ahead of the WAL and start-up adopts them (raftlog).
        let marker = raftlog::encode_snapshot_meta(meta.term, meta.get_conf_state());
        write_installed_snapshot(&self.dirs, index, &marker)?;
        let engine = self.engine_dir.install_snapshot_file(&file).await?;
        // Tests only: die as kill -9 would between the install and the marker.
        fail::fail_point!("node::snapshot_installed", |_| std::process::abort());
        if engine.applied_index() != index {
            return Err(ServerError::Startup(format!(
                "the snapshot for index {index} holds applied index {}",
                engine.applied_index()
            )));
        }
        let mvcc = MvccStore::open(engine.clone())?;
        let lessor =
            crate::apply::restore_leases(&mvcc, self.lessor.borrow().min_ttl(), Instant::now())?;
        let auth = crate::apply::restore_auth(&mvcc)?;
        let alarms = crate::apply::restore_alarms(&mvcc)?;
        let conf = meta.get_conf_state().clone();
        let mut registry = Registry::default();
        load_member_records(&mvcc, &mut registry)?;
        // Bootstrap members that never published have no record yet: keep
        // what this member knew of them.
        for m in self.registry.borrow().all() {
            if registry.get(m.id).is_none() {
                registry.upsert(m);
            }
        }
        registry.retain(|m| conf.voters.contains(&m.id) || conf.learners.contains(&m.id));
        for m in registry.all() {
            connect_peer(&self.transport, &m);
        }
        *self.engine.borrow_mut() = engine;
        *self.mvcc.borrow_mut() = mvcc;
        *self.lessor.borrow_mut() = lessor;
        *self.alarms.borrow_mut() = alarms;
        self.auth_flag
            .borrow()
            .store(auth.enabled(), std::sync::atomic::Ordering::Release);
        let mut auth = auth;
        auth.adopt_tokens(std::mem::take(&mut *self.auth.borrow_mut()));
        *self.auth.borrow_mut() = auth;
        *self.registry.borrow_mut() = registry;
        self.solo
            .set(conf.voters == [self.id] && conf.learners.is_empty());
        self.learner.set(conf.learners.contains(&self.id));
        self.publish_read_view();
        raw.store().wl().apply_snapshot(snap)?;
        wal.append_snapshot(index, &marker);
        self.last_snapshot_index.set(index);
        let mut terms = self.applied_terms.borrow_mut();
        terms.note(index, meta.term);
        terms.forget_before(index);
        drop(terms);
        let stale: Vec<u64> = self
            .incoming_snapshots
            .borrow()
            .keys()
            .copied()
            .filter(|i| *i < index)
            .collect();
        for i in stale {
            if let Some(path) = self.incoming_snapshots.borrow_mut().remove(&i) {
                let _ = std::fs::remove_file(path);
            }
        }
        let revision = self.mvcc.borrow().current_revision();
        self.feed_watchers(&crate::watch::Feed::Restored { revision });
        log(format_args!(
            "installed the leader's snapshot at index {index} (term {}, revision {revision}); \
             watchers re-read the events it covers",
            meta.term
        ));
        Ok(())
    }

    fn send(self: &Rc<Self>, mut msgs: Vec<Message>) {
        if msgs.is_empty() {
            return;
        }
        self.note_heartbeats(&msgs);
        if msgs
            .iter()
            .any(|m| m.get_msg_type() == MessageType::MsgSnapshot)
        {
            let (snapshots, rest): (Vec<Message>, Vec<Message>) = msgs
                .into_iter()
                .partition(|m| m.get_msg_type() == MessageType::MsgSnapshot);
            msgs = rest;
            for m in snapshots {
                self.start_snapshot_send(m);
            }
        }
        self.transport.send(msgs);
    }

    /// Counts heartbeats sent later than twice the heartbeat interval after
    /// the previous one to the same peer, as etcd's leader counts them: a
    /// sign that it is too loaded (or its disk too slow) to keep followers
    /// from starting elections.
    fn note_heartbeats(&self, msgs: &[Message]) {
        let mut sent = self.heartbeats_sent.borrow_mut();
        let now = Instant::now();
        for m in msgs {
            if m.get_msg_type() != MessageType::MsgHeartbeat {
                continue;
            }
            if let Some((last, _)) = sent.insert(m.to, (now, true)) {
                if now.duration_since(last) > 2 * self.tick_interval {
                    crate::metrics::count(&self.metrics.heartbeat_send_failures);
                }
            }
        }
    }

    /// A heartbeat's response came from `peer`: the round trip since the
    /// heartbeat went out (etcd's `peer_round_trip_time_seconds`, which
    /// etcd measures with probes of its own; metcd's leader uses the
    /// heartbeats it sends anyway).
    fn note_round_trip(&self, peer: u64) {
        let mut sent = self.heartbeats_sent.borrow_mut();
        let Some((at, awaited)) = sent.get_mut(&peer) else {
            return;
        };
        if std::mem::take(awaited) {
            self.metrics
                .peer_round_trips
                .borrow_mut()
                .entry(peer)
                .or_default()
                .observe_seconds(at.elapsed());
        }
    }

    /// raft-rs asked for a snapshot to a follower that lags behind the log
    /// kept in memory. Its data is a snapshot file of the engine at its
    /// applied index (the metadata is rewritten to that index, term and
    /// membership), streamed on its own connection by a separate task.
    fn start_snapshot_send(self: &Rc<Self>, msg: Message) {
        let to = msg.to;
        if !self.snapshot_sends.borrow_mut().insert(to) {
            return;
        }
        let node = self.clone();
        glommio::spawn_local(async move {
            let path = node.dirs.snap.join(format!("outgoing-{to:016x}.snap.tmp"));
            let result = node.send_snapshot(msg, &path).await;
            let _ = std::fs::remove_file(&path);
            match &result {
                Ok(index) => log(format_args!("sent a snapshot at index {index} to {to:x}")),
                Err(e) => log(format_args!("sending a snapshot to {to:x} failed: {e}")),
            }
            node.snapshot_sends.borrow_mut().remove(&to);
            node.snapshot_reports
                .borrow_mut()
                .push((to, result.is_ok()));
            node.queue_ready.notify();
        })
        .detach();
    }

    async fn send_snapshot(&self, mut msg: Message, path: &Path) -> Result<u64> {
        // raft-rs names the commit index; the engine has applied it, or
        // will within a loop turn.
        let wanted = msg.get_snapshot().get_metadata().index;
        let deadline = Instant::now() + self.request_timeout;
        while self.engine.borrow().applied_index() < wanted {
            if Instant::now() > deadline {
                return Err(ServerError::Timeout);
            }
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        // No await between these: the engine view, the term and the
        // membership all describe the same applied index.
        let snapshot = self.engine.borrow().snapshot();
        let index = engine::EngineSnapshot::applied_index(&snapshot);
        let term = self.raft_store.term(index)?;
        let conf = self.raft_store.initial_state()?.conf_state;
        {
            let meta = msg.mut_snapshot().mut_metadata();
            meta.index = index;
            meta.term = term;
            meta.set_conf_state(conf);
        }
        engine::memory::write_snapshot_file_off_core(snapshot, path, engine::any::Urgency::Waited)
            .await?;
        self.transport
            .send_snapshot(&msg, path)
            .await
            .map_err(|e| ServerError::Startup(format!("snapshot stream: {e}")))?;
        Ok(index)
    }

    fn apply_entries(&self, raw: &mut RawNode<MemStorage>, entries: Vec<Entry>) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut mvcc = self.mvcc.borrow_mut();
        mvcc.set_read_prev_for_watchers(crate::watch::prev_kv_watched());
        let mut pending = self.pending.borrow_mut();
        let mut events = Vec::new();
        // Before the watch hubs subscribe (the start-up replay), nobody reads
        // events: collecting a whole replayed tail's would cost hundreds of
        // MiB that the allocator then keeps.
        let watched = !self.watch_subscribers.borrow().is_empty();
        // Whether a write that adds data applied (etcd's quota applier
        // checks those after applying them).
        let mut grew = false;
        let context = ApplyContext {
            now: Instant::now(),
            replayed_commit_index: self.replayed_commit_index,
        };
        let mut terms = self.applied_terms.borrow_mut();
        for entry in entries {
            let _slow = SlowApply::timing(&self.metrics);
            terms.note(entry.index, entry.term);
            if entry.entry_type != EntryType::EntryNormal {
                let (origin, id, result) = self.apply_membership(raw, &mut mvcc, &entry)?;
                if origin == self.id {
                    if let Some(reply) = pending.remove(&id) {
                        let _ = reply.send(result);
                    }
                }
                continue;
            }
            if entry.data.is_empty() {
                // Leader no-ops (and, later, conf changes) still advance the
                // applied index so replay stays idempotent.
                mvcc.apply_noop(entry.index)?;
                continue;
            }
            let Some((origin, id, decoded)) = decode_proposal(entry.data.clone()) else {
                // Every member sees the same bytes and does the same: skip
                // it (a request from a newer format, say) rather than stop
                // the member at every restart.
                log(format_args!(
                    "entry {} holds no request this version understands; skipped",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                continue;
            };
            let result = match decoded {
                Decoded::MemberPeers(update) => {
                    let updated = self
                        .registry
                        .borrow_mut()
                        .update_peers(update.id, update.peer_urls);
                    match updated {
                        Some(record) => {
                            mvcc.put_meta(
                                entry.index,
                                &members::meta_name(record.id),
                                bytes::Bytes::from(members::encode(&record)),
                            )?;
                            connect_peer(&self.transport, &record);
                            Ok(Applied::Members(self.registry.borrow().all()))
                        }
                        None => {
                            mvcc.apply_noop(entry.index)?;
                            Err(ServerError::Membership("etcdserver: member not found"))
                        }
                    }
                }
                Decoded::MemberAttrs(attrs) => {
                    let merged = self.registry.borrow_mut().publish(attrs);
                    match merged {
                        Some(merged) => mvcc.put_meta(
                            entry.index,
                            &members::meta_name(merged.id),
                            bytes::Bytes::from(members::encode(&merged)),
                        )?,
                        None => mvcc.apply_noop(entry.index)?,
                    }
                    Ok(Applied::Published)
                }
                decoded => {
                    let compacting =
                        matches!(decoded, Decoded::Kv(mvcc::Request::Compaction(_), _))
                            .then(Instant::now);
                    let mut lessor = self.lessor.borrow_mut();
                    let mut auth = self.auth.borrow_mut();
                    let mut alarms = self.alarms.borrow_mut();
                    let mut machine = StateMachine {
                        mvcc: &mut mvcc,
                        lessor: &mut lessor,
                        auth: &mut auth,
                        alarms: &mut alarms,
                    };
                    let outcome = machine.apply(
                        entry.index,
                        decoded,
                        &context,
                        watched.then_some(&mut events),
                    )?;
                    if let (Some(started), Some(stats)) = (compacting, mvcc.take_compaction_stats())
                    {
                        self.metrics.note_compaction(started.elapsed(), stats);
                    }
                    grew |= outcome.grew;
                    match &outcome.result {
                        Ok(Applied::LeaseGranted { ttl, .. }) => {
                            crate::metrics::count(&self.metrics.leases_granted);
                            self.metrics.lease_ttls.observe((*ttl).max(0) as f64);
                        }
                        Ok(Applied::LeaseRevoked { .. }) => {
                            crate::metrics::count(&self.metrics.leases_revoked)
                        }
                        Ok(Applied::Auth(_)) => self
                            .auth_flag
                            .borrow()
                            .store(auth.enabled(), std::sync::atomic::Ordering::Release),
                        Ok(Applied::Alarms(now_active)) => {
                            if let Some(raised) = outcome.alarm_changed {
                                log(format_args!(
                                    "alarm {}: {}",
                                    if raised { "raised" } else { "disarmed" },
                                    now_active
                                        .iter()
                                        .map(|a| a.text())
                                        .collect::<String>()
                                        .trim_end()
                                ));
                            }
                        }
                        _ => {}
                    }
                    outcome.result
                }
            };
            if origin == self.id {
                if let Some(reply) = pending.remove(&id) {
                    let _ = reply.send(result);
                }
            }
        }
        drop(pending);
        drop(mvcc);
        if !events.is_empty() {
            self.feed_watchers(&crate::watch::Feed::Events(events.into()));
        }
        if grew
            && self
                .backend_quota
                .is_some_and(|quota| self.db_size().total_bytes >= quota)
        {
            // etcd's apply-time quota check: a write took the store past
            // the quota (writes admitted together at proposal overshoot).
            self.nospace_wanted.set(true);
        }
        Ok(())
    }

    /// etcd's quota check of a request that may add `cost` bytes: refused
    /// with NOSPACE if the store would reach the quota, after this
    /// member's NOSPACE alarm went through the log (as etcd, which answers
    /// once its alarm request returned). What adds nothing (a txn that only
    /// reads or deletes) always passes, as in etcd; a learner is left to
    /// refuse the write itself.
    async fn check_quota(&self, cost: u64) -> Result<()> {
        let Some(quota) = self.backend_quota.filter(|_| cost > 0) else {
            return Ok(());
        };
        if self.learner.get() || self.db_size().total_bytes.saturating_add(cost) < quota {
            return Ok(());
        }
        self.raise_nospace().await;
        Err(ServerError::NoSpace)
    }

    /// Proposes this member's NOSPACE alarm and waits for it, unless it is
    /// active or another raise is in flight (those callers do not wait:
    /// a thousand refused clients make one proposal, not a thousand).
    async fn raise_nospace(&self) {
        use crate::alarm::{AlarmAction, AlarmRequest, AlarmType};
        if self.learner.get() || self.alarms.borrow().is_active(AlarmType::NoSpace, self.id) {
            return;
        }
        let now = Instant::now();
        if self
            .nospace_proposed_at
            .get()
            .is_some_and(|at| now.duration_since(at) < self.request_timeout)
        {
            return;
        }
        self.nospace_proposed_at.set(Some(now));
        log(format_args!(
            "the store reached the backend quota ({} bytes); raising the NOSPACE alarm",
            self.backend_quota.unwrap_or(0)
        ));
        let raised = self
            .alarm(AlarmRequest {
                action: AlarmAction::Activate,
                member: self.id,
                alarm: AlarmType::NoSpace,
            })
            .await;
        if let Err(e) = raised {
            log(format_args!("raising the NOSPACE alarm: {e}"));
        }
        self.nospace_proposed_at.set(None);
    }

    /// An Alarm call, through the log as etcd 3.4 sends every one (`Get`
    /// included).
    pub async fn alarm(
        &self,
        req: crate::alarm::AlarmRequest,
    ) -> Result<Vec<crate::alarm::AlarmMember>> {
        let mut body = Vec::with_capacity(10);
        crate::alarm::encode(&req, &mut body);
        match self.propose(TAG_ALARM, &body).await? {
            Applied::Alarms(alarms) => Ok(alarms),
            _ => Err(ServerError::Stopped),
        }
    }

    /// The active alarms as of the last applied entry (Status `errors`).
    pub fn active_alarms(&self) -> Vec<crate::alarm::AlarmMember> {
        self.alarms.borrow().get(crate::alarm::AlarmType::None)
    }

    /// The engine's size now (etcd's `dbSize`); cheap.
    pub fn db_size(&self) -> engine::EngineSize {
        self.engine.borrow().size()
    }

    fn refresh_status(&self, raw: &RawNode<MemStorage>, wal: &Wal) {
        let mvcc = self.mvcc.borrow();
        let raft = &raw.raft;
        self.metrics.note_leader(raft.leader_id);
        self.read_view.borrow().set_term(raft.term);
        self.status.set(NodeStatus {
            term: raft.term,
            leader: raft.leader_id,
            applied_index: raft.raft_log.applied,
            committed_index: raft.raft_log.committed,
            revision: mvcc.current_revision(),
            compact_revision: mvcc.compact_revision(),
            wal_syncs: wal.frames_written(),
            wal_bytes: wal.bytes_written(),
            is_learner: self.learner.get(),
        });
        self.leads_settled.set(
            raft.state == raft::StateRole::Leader
                && raft.raft_log.term(raft.raft_log.committed).ok() == Some(raft.term)
                && raft.raft_log.applied == raft.raft_log.committed,
        );
        let mut progress = self.progress.borrow_mut();
        progress.clear();
        if raft.state == raft::StateRole::Leader {
            progress.extend(raft.prs().iter().map(|(id, pr)| (*id, pr.matched)));
        }
    }

    /// Starts a checkpoint of the engine once `snapshot-count` entries were
    /// applied since the last one and, for an engine whose checkpoint
    /// rewrites the whole store, the WAL has grown by the last checkpoint's
    /// size since it started (each WAL byte pays for at most one checkpoint
    /// byte; recovery replays at most about a store's worth of log). It runs
    /// as its own task, at the lowest CPU priority (the engine's
    /// `Urgency::Background`), so the loop keeps committing, until
    /// another spacing's worth of entries has been applied meanwhile (see
    /// [`Node::hurry_a_lagging_checkpoint`]).
    fn maybe_snapshot(self: &Rc<Self>, wal_bytes: u64) {
        self.maybe_write_index_checkpoint();
        let applied = self.engine.borrow().applied_index();
        self.hurry_a_lagging_checkpoint(applied);
        let (wal_bytes_then, rewritten) = self.snapshot_pacing.get();
        let counted = applied >= self.last_snapshot_index.get() + self.checkpoint_spacing();
        let forced = !counted && self.compaction_wants_checkpoint(applied);
        let due = counted || forced;
        if self.snapshot_in_flight.get()
            || !due
            || self
                .snapshot_retry_at
                .get()
                .is_some_and(|t| Instant::now() < t)
        {
            return;
        }
        // A checkpoint that rewrites the store waits until the WAL has
        // written as much as the last one did (so checkpoints cost at most
        // what the writes do); one that writes only what changed does not.
        let engine = self.engine.borrow().clone();
        let rewrites_store = engine.checkpoint_rewrites_store();
        if rewrites_store && wal_bytes < wal_bytes_then.saturating_add(rewritten) {
            return;
        }
        self.snapshot_retry_at.set(None);
        self.snapshot_in_flight.set(true);
        if forced {
            self.index_checkpointing.borrow_mut().forced_at = Some(Instant::now());
        }
        self.snapshot_started.set(Some(Instant::now()));
        // Only the memory engine's checkpoint is background work (btree
        // and lsm persists keep ordinary priority: they hold locks).
        let background = engine.kind() == engine::any::EngineKind::Memory;
        self.snapshot_hurry_at
            .set(background.then(|| applied.saturating_add(self.checkpoint_spacing())));
        let rewrites = if rewrites_store {
            engine::Engine::size(&engine).total_bytes
        } else {
            0
        };
        self.snapshot_pacing_pending
            .set(Some((wal_bytes, rewrites)));
        {
            // The key index as it stands now is what the engine checkpoint
            // holds: written once that is durable (see finish_snapshot).
            let mvcc = self.mvcc.borrow();
            let mut ick = self.index_checkpointing.borrow_mut();
            ick.planned = Some((
                mvcc.reader(),
                mvcc.index_checkpoint_plan(self.cluster_id),
                wal_bytes,
            ));
        }
        let node = self.clone();
        glommio::spawn_local(async move {
            let started = Instant::now();
            let result = node
                .engine_dir
                .checkpoint(&engine)
                .await
                .map_err(ServerError::from);
            node.metrics
                .backend_commit
                .observe_seconds(started.elapsed());
            *node.snapshot_done.borrow_mut() = Some(result);
            node.queue_ready.notify();
        })
        .detach();
    }

    /// Raises the checkpoint in flight to ordinary CPU priority once
    /// `applied` reaches its hurry point: on cores kept busy by the shards
    /// (and, on a small machine, the clients), a checkpoint at the lowest
    /// priority can starve for as long as the writes last, and everything
    /// applied meanwhile is log a restart replays (half a million entries
    /// once, filling 1M keys on 2 vCPUs). Also once it has run for
    /// [`CHECKPOINT_PATIENCE`] whatever was applied: a member that went
    /// quiet with its last checkpoint starved by other processes would
    /// otherwise replay that checkpoint's log at every restart until it
    /// finished. Once per checkpoint.
    fn hurry_a_lagging_checkpoint(&self, applied: u64) {
        let Some(at) = self.snapshot_hurry_at.get() else {
            return;
        };
        let running_for = self
            .snapshot_started
            .get()
            .map_or(Duration::ZERO, |t| t.elapsed());
        if !self.snapshot_in_flight.get() || (applied < at && running_for < CHECKPOINT_PATIENCE) {
            return;
        }
        let meanwhile = (applied + self.checkpoint_spacing()).saturating_sub(at);
        let hurried = engine::any::hurry_background_work();
        if !matches!(hurried, Ok(0)) {
            // Once: raised, or refused (no privilege). With no thread
            // registered yet, the next turn asks again.
            self.snapshot_hurry_at.set(None);
        }
        match hurried {
            Ok(0) => {}
            Ok(_) => log(format_args!(
                "checkpoint still running after {:.1} s and {meanwhile} more applied entries: \
                 raised to ordinary CPU priority",
                running_for.as_secs_f64(),
            )),
            Err(e) => log(format_args!(
                "checkpoint still running after {:.1} s: could not raise its CPU priority \
                 ({e}; needs root or CAP_SYS_NICE), a restart may replay more log",
                running_for.as_secs_f64()
            )),
        }
    }

    /// Entries between two engine checkpoints: `--snapshot-count`, and at
    /// most [`BTREE_CHECKPOINT_ENTRIES`] for the btree engine.
    fn checkpoint_spacing(&self) -> u64 {
        if self.engine.borrow().kind() == engine::any::EngineKind::Btree {
            self.snapshot_count.min(BTREE_CHECKPOINT_ENTRIES)
        } else {
            self.snapshot_count
        }
    }

    /// Whether a compaction went past the last key index checkpoint's
    /// revision (a restart could not use it: see
    /// [`MvccStore::open_with_index_checkpoint`]) and a checkpoint should
    /// come early. Not for an engine whose checkpoint rewrites the whole
    /// store (its pacing rules), and at most every
    /// [`FORCED_CHECKPOINT_SPACING`].
    fn compaction_wants_checkpoint(&self, applied: u64) -> bool {
        let ick = self.index_checkpointing.borrow();
        if ick.in_flight
            || ick.ready.is_some()
            || applied <= self.last_snapshot_index.get()
            || self.engine.borrow().checkpoint_rewrites_store()
            || ick
                .forced_at
                .is_some_and(|t| t.elapsed() < FORCED_CHECKPOINT_SPACING)
        {
            return false;
        }
        self.mvcc.borrow().compact_revision() > ick.written_revision
    }

    /// Starts writing the key index checkpoint of the last durable engine
    /// checkpoint on a thread of its own, unless one is being written or
    /// the last one is recent enough: each byte of it is paid for by at
    /// least one byte of WAL since the last (a restart reads at most about
    /// that much more), or a compaction made the last one unusable.
    fn maybe_write_index_checkpoint(self: &Rc<Self>) {
        let mut ick = self.index_checkpointing.borrow_mut();
        if ick.in_flight {
            return;
        }
        let Some((reader, plan, wal_bytes)) = ick.ready.take() else {
            return;
        };
        let (wal_then, size) = ick.last_written;
        let compacted_past = plan.compact_revision > ick.written_revision;
        if ick.written_revision > 0 && !compacted_past && wal_bytes < wal_then.saturating_add(size)
        {
            return;
        }
        ick.in_flight = true;
        drop(ick);
        let node = self.clone();
        let root = self.dirs.root.clone();
        glommio::spawn_local(async move {
            let result = on_a_thread("keyindex", move || {
                crate::index_file::write(&root, &reader, plan)
            })
            .await;
            let mut ick = node.index_checkpointing.borrow_mut();
            ick.in_flight = false;
            match result {
                Ok(Ok(w)) => {
                    ick.last_written = (wal_bytes, w.bytes);
                    ick.written_revision = w.plan.revision;
                    log(format_args!(
                        "key index checkpoint at revision {} (applied index {}): {} keys, \
                         {:.1} MiB in {:.0} ms",
                        w.plan.revision,
                        w.plan.applied_index,
                        w.keys,
                        w.bytes as f64 / f64::from(1 << 20),
                        w.took.as_secs_f64() * 1e3
                    ));
                }
                Ok(Err(e)) => log(format_args!(
                    "key index checkpoint not written (the next checkpoint tries again): {e}"
                )),
                Err(e) => log(format_args!("key index checkpoint not written: {e}")),
            }
        })
        .detach();
    }

    /// Drops applied entries from the in-memory Raft log between
    /// checkpoints. The WAL keeps them for recovery until the next
    /// checkpoint; memory only needs what peers may still ask for: nothing
    /// on a single member, `catch_up_entries` behind the slowest peer's
    /// match (learners included) otherwise. Before, the log kept every
    /// entry since the last checkpoint (up to `snapshot-count`, 100,000 by
    /// default: tens of MB at 1000-client put rates, all of it freshly
    /// faulted-in memory). Also while a checkpoint is being written (it may
    /// take long at background priority): its completion finds the term at
    /// its index in `applied_terms`.
    fn trim_memory_log(&self, raw: &RawNode<MemStorage>) -> Result<()> {
        let applied = raw.raft.raft_log.applied;
        let keep_from = if self.solo.get() {
            applied
        } else {
            let mut wanted = applied;
            if raw.raft.state == raft::StateRole::Leader {
                for (id, progress) in raw.raft.prs().iter() {
                    if *id != raw.raft.id {
                        wanted = wanted.min(progress.matched + 1);
                    }
                }
            }
            wanted.saturating_sub(self.catch_up_entries)
        };
        let store = raw.store();
        // In steps, so the entries kept (a peer's catch-up tail) are not
        // shifted on every turn.
        let step = (self.snapshot_count / 4).clamp(64, 4096);
        if keep_from >= store.first_index()? + step {
            store.wl().compact(keep_from)?;
        }
        Ok(())
    }

    /// After a checkpoint is durable: mark it in the WAL, drop the covered
    /// entries from memory and release WAL segments it makes unnecessary.
    async fn finish_snapshot(&self, raw: &mut RawNode<MemStorage>, wal: &mut Wal) -> Result<()> {
        let Some(result) = self.snapshot_done.borrow_mut().take() else {
            return Ok(());
        };
        self.snapshot_in_flight.set(false);
        self.snapshot_hurry_at.set(None);
        let pacing = self.snapshot_pacing_pending.take();
        let took = self
            .snapshot_started
            .take()
            .map_or(Duration::ZERO, |t| t.elapsed());
        let planned = self.index_checkpointing.borrow_mut().planned.take();
        let index = match result {
            Ok(index) => index,
            Err(e) => {
                // The WAL still holds everything: a failed checkpoint only
                // delays segment release. Try again later.
                log(format_args!(
                    "snapshot failed, retrying in {SNAPSHOT_RETRY:?}: {e}"
                ));
                self.snapshot_retry_at
                    .set(Some(Instant::now() + SNAPSHOT_RETRY));
                return Ok(());
            }
        };
        if index <= self.last_snapshot_index.get() {
            // A leader's snapshot was installed meanwhile, past this one.
            return Ok(());
        }
        let started = Instant::now();
        let store = raw.store().clone();
        let known = store.term(index).ok();
        let Some(term) = known.or_else(|| self.applied_terms.borrow().term_at(index)) else {
            // Cannot happen for an applied index; if it did, a marker with a
            // guessed term could mislead recovery. The WAL keeps everything.
            log(format_args!(
                "snapshot at applied index {index}: its term is unknown; not marked, \
                 retrying in {SNAPSHOT_RETRY:?}"
            ));
            self.snapshot_retry_at
                .set(Some(Instant::now() + SNAPSHOT_RETRY));
            return Ok(());
        };
        let conf = store.initial_state()?.conf_state;
        wal.append_snapshot(index, &raftlog::encode_snapshot_meta(term, &conf));
        wal.sync().await?;
        // With peers, keep a tail of the log in memory for followers that
        // lag a little (a snapshot transfer would be needed otherwise).
        let keep_from = if !self.solo.get() {
            index.saturating_sub(self.catch_up_entries)
        } else {
            index
        };
        if keep_from > store.first_index()? {
            store.wl().compact(keep_from)?;
        }
        let marked = started.elapsed();
        // The files go in the background (in order; see `Wal::release_through`).
        let count = wal.release_through(index);
        if let Some(why) = wal.take_unlink_failure() {
            log(format_args!(
                "could not delete released WAL segments (retried at the next snapshot): {why}"
            ));
        }
        self.last_snapshot_index.set(index);
        if let Some(planned) = planned.filter(|(_, plan, _)| plan.applied_index <= index) {
            self.index_checkpointing.borrow_mut().ready = Some(planned);
        }
        self.applied_terms.borrow_mut().forget_before(index);
        // Only a checkpoint that rewrote the store sets the pace: the next
        // full one waits for as much WAL since it, deltas between or not.
        if let Some(pacing) = pacing.filter(|(_, rewrote)| *rewrote > 0) {
            self.snapshot_pacing.set(pacing);
        }
        log(format_args!(
            "snapshot at applied index {index} (term {term}) written in {:.0} ms; released \
             {count} WAL segment(s) (marker {:.1} ms)",
            took.as_secs_f64() * 1e3,
            marked.as_secs_f64() * 1e3,
        ));
        Ok(())
    }

    /// Applies a committed membership change: raft-rs' configuration, the
    /// member registry, the transport, and the ConfState kept in MVCC
    /// metadata (so a restart resumes with it). Returns the proposer's
    /// (member, proposal id) and its answer.
    fn apply_membership(
        &self,
        raw: &mut RawNode<MemStorage>,
        mvcc: &mut MvccStore<AnyEngine>,
        entry: &Entry,
    ) -> Result<(u64, u64, Result<Applied>)> {
        let cc = match entry.entry_type {
            EntryType::EntryConfChange if entry.data.is_empty() => {
                mvcc.apply_noop(entry.index)?;
                return Ok((0, 0, Err(ServerError::Stopped)));
            }
            EntryType::EntryConfChange => ConfChange::parse_from_bytes(&entry.data).map(|c| {
                let mut v2 = ConfChangeV2::default();
                v2.set_changes(vec![single_change(c.get_change_type(), c.node_id)].into());
                v2
            }),
            _ => ConfChangeV2::parse_from_bytes(&entry.data),
        };
        let (origin, id, record) = match decode_proposal(entry.context.clone()) {
            Some((origin, id, Decoded::ConfRecord(r))) => (origin, id, Some(r)),
            Some((origin, id, _)) => (origin, id, None),
            None => (0, 0, None),
        };
        // An empty ConfChangeV2 is raft-rs' "leave the joint configuration"
        // (proposed by the leader after a joint change): applied like any.
        let cc = match cc {
            Ok(cc) => cc,
            Err(e) => {
                log(format_args!(
                    "undecodable membership change at index {}: {e}",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                return Ok((origin, id, Err(ServerError::Stopped)));
            }
        };
        let before = raw.store().initial_state()?.conf_state;
        let cs = match raw.apply_conf_change(&cc) {
            Ok(cs) => cs,
            Err(e) => {
                log(format_args!(
                    "membership change at index {} refused by raft: {e}",
                    entry.index
                ));
                mvcc.apply_noop(entry.index)?;
                return Ok((origin, id, Err(ServerError::Raft(e))));
            }
        };
        raw.store().wl().set_conf_state(cs.clone());
        mvcc.put_meta(
            entry.index,
            CONF_META,
            bytes::Bytes::from(raftlog::encode_snapshot_meta(0, &cs)),
        )?;
        let mut registry = self.registry.borrow_mut();
        for change in cc.get_changes() {
            let member = change.node_id;
            match change.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    let mut rec = record
                        .clone()
                        .filter(|r| r.id == member)
                        .or_else(|| registry.get(member).cloned())
                        .unwrap_or(MemberRecord {
                            id: member,
                            name: String::new(),
                            peer_urls: Vec::new(),
                            client_urls: Vec::new(),
                            is_learner: false,
                        });
                    if let Some(known) = registry.get(member) {
                        // A promotion keeps what the member published.
                        rec.name = known.name.clone();
                        rec.client_urls = known.client_urls.clone();
                    }
                    rec.is_learner = change.get_change_type() == ConfChangeType::AddLearnerNode;
                    mvcc.put_meta(
                        entry.index,
                        &members::meta_name(member),
                        bytes::Bytes::from(members::encode(&rec)),
                    )?;
                    connect_peer(&self.transport, &rec);
                    registry.upsert(rec);
                }
                ConfChangeType::RemoveNode => {
                    registry.remove(member);
                    mvcc.delete_meta(entry.index, &members::meta_name(member))?;
                }
            }
        }
        // A member leaving through a joint configuration still counts for
        // the outgoing quorum until the joint state is left: keep talking to
        // it (and keep running, if it is us) until then.
        let in_conf = |m: u64| conf_holds(&cs, m);
        for peer in self.transport.peers() {
            if !in_conf(peer) {
                self.transport.remove_peer(peer);
            }
        }
        // Whoever left every configuration is gone for good: its peer
        // connections are refused as removed from now on.
        let left = before
            .voters
            .iter()
            .chain(&before.learners)
            .chain(&before.voters_outgoing)
            .chain(&before.learners_next)
            .copied()
            .filter(|m| !in_conf(*m))
            .collect::<std::collections::BTreeSet<u64>>();
        for member in left {
            let mut name = REMOVED_META.to_vec();
            name.extend_from_slice(&member.to_be_bytes());
            mvcc.put_meta(entry.index, &name, bytes::Bytes::new())?;
            self.removed_members.borrow_mut().insert(member);
        }
        if !in_conf(self.id) {
            self.removed.set(true);
        }
        self.solo
            .set(cs.voters == [self.id] && cs.learners.is_empty());
        self.learner.set(cs.learners.contains(&self.id));
        self.read_view.borrow().set_solo(self.solo.get());
        log(format_args!(
            "membership at index {}: voters {:x?}, learners {:x?}{}",
            entry.index,
            cs.voters,
            cs.learners,
            if cs.voters_outgoing.is_empty() {
                String::new()
            } else {
                format!(" (joint with outgoing voters {:x?})", cs.voters_outgoing)
            }
        ));
        if self.removed.get() {
            // Long enough for the answer to the client to go out first.
            self.leave("this member", Duration::from_millis(500));
        }
        Ok((origin, id, Ok(Applied::Members(registry.all()))))
    }

    /// One turn of a requested stop (crate::stop): a leader of other
    /// voters first hands leadership to the most caught-up one and waits
    /// (bounded) until it has stepped down; then the process exits. Every
    /// acknowledged write is already durable in the WAL.
    fn stop_step(&self, raw: &mut RawNode<MemStorage>) {
        let leading = raw.raft.state == raft::StateRole::Leader;
        let Some(since) = self.stopping_since.get() else {
            self.stopping_since.set(Some(Instant::now()));
            let successor = leading
                .then(|| most_caught_up_voter(raw, self.id))
                .flatten();
            match successor {
                Some(target) => {
                    log(format_args!(
                        "leader {:x} is stopping: transferring leadership to {target:x}",
                        self.id
                    ));
                    raw.transfer_leader(target);
                }
                None => {
                    if leading {
                        log(format_args!(
                            "skipped leadership transfer for single voting member cluster"
                        ));
                    }
                    self.stopped();
                }
            }
            return;
        };
        if !leading {
            log(format_args!(
                "leadership transfer finished: {:x} leads",
                raw.raft.leader_id
            ));
            self.stopped();
        } else if since.elapsed() > self.stop_transfer_limit {
            log(format_args!(
                "leadership transfer did not finish within {:?}; stopping anyway",
                self.stop_transfer_limit
            ));
            self.stopped();
        }
    }

    fn stopped(&self) -> ! {
        log(format_args!(
            "member {:x} stopped (applied index {})",
            self.id,
            self.status.get().applied_index
        ));
        crate::stop::exit(0)
    }

    /// Stops the process (status 0) after `grace`: this member was removed
    /// from the cluster. `who` says how it learned it.
    fn leave(&self, who: &str, grace: Duration) {
        log(format_args!(
            "{who} ({:x}) was removed from the cluster; stopping",
            self.id
        ));
        glommio::spawn_local(async move {
            glommio::timer::sleep(grace).await;
            std::process::exit(0);
        })
        .detach();
    }

    /// MemberAdd: a new voter or learner with these peer URLs; its ID is
    /// derived as etcd's (peer URLs, cluster token and the current time).
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberRecord, Vec<MemberRecord>)> {
        self.may_add_member(is_learner)?;
        let record = self.new_member_record(peer_urls, is_learner)?;
        let kind = if is_learner {
            ConfChangeType::AddLearnerNode
        } else {
            ConfChangeType::AddNode
        };
        let all = self.change_membership(kind, &record).await?;
        Ok((record, all))
    }

    /// Validates a new member's peer URLs (etcd's checks and messages) and
    /// derives its ID.
    fn new_member_record(&self, peer_urls: Vec<String>, is_learner: bool) -> Result<MemberRecord> {
        check_new_member_urls(&peer_urls)?;
        // etcd's ID for a runtime add: the peer URLs and the Unix second,
        // no cluster name (`membership.NewMember("", urls, "", &now)`); so
        // the same URLs added twice within a second collide on the ID, and
        // the checks run in etcd's order (removed ID, ID, URLs, learners).
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let urls: Vec<&str> = peer_urls.iter().map(String::as_str).collect();
        let id = crate::ids::member_id(&urls, &now.to_string());
        if self.removed_members.borrow().contains(&id) {
            return Err(ServerError::Membership("etcdserver: member not found"));
        }
        let members = self.members();
        if members.iter().any(|m| m.id == id) {
            return Err(ServerError::Membership(
                "etcdserver: member ID already exist",
            ));
        }
        if members
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)))
        {
            return Err(ServerError::Membership(
                "etcdserver: Peer URLs already exists",
            ));
        }
        if is_learner && members.iter().filter(|m| m.is_learner).count() >= MAX_LEARNERS {
            return Err(ServerError::Membership(
                "etcdserver: too many learner members in cluster",
            ));
        }
        Ok(MemberRecord {
            id,
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner,
        })
    }

    /// MemberRemove.
    pub async fn member_remove(&self, id: u64) -> Result<Vec<MemberRecord>> {
        self.may_remove_member(id)?;
        let record = self.known_member(id).await?;
        self.change_membership(ConfChangeType::RemoveNode, &record)
            .await
    }

    /// MemberPromote: a learner becomes a voter once it has caught up (etcd's
    /// rule: its log within 10% of the leader's). Decided on the leader.
    pub async fn member_promote(&self, id: u64) -> Result<Vec<MemberRecord>> {
        let promoted = self.promote_as_leader(id).await;
        match &promoted {
            Ok(_) => crate::metrics::count(&self.metrics.learners_promoted),
            Err(ServerError::NotLeader) => {}
            Err(e) => self.metrics.note_promote_failure(&e.to_string()),
        }
        promoted
    }

    async fn promote_as_leader(&self, id: u64) -> Result<Vec<MemberRecord>> {
        let record = self.known_member(id).await?;
        if !record.is_learner {
            return Err(ServerError::Membership(
                "etcdserver: can only promote a learner member",
            ));
        }
        if !self.is_leader() {
            return Err(ServerError::NotLeader);
        }
        let ready = {
            let progress = self.progress.borrow();
            let leader = progress.get(&self.id).copied().unwrap_or(0);
            let learner = progress.get(&id).copied().unwrap_or(0);
            learner as f64 >= leader as f64 * 0.9 && learner > 0
        };
        if !ready {
            return Err(ServerError::Membership(
                "etcdserver: can only promote a learner member which is in sync with leader",
            ));
        }
        // etcd's IsReadyToPromoteMember: the promoted learner counts as a
        // started voter of the new configuration.
        let (voters, started) = self.started_voters(None);
        if self.strict_reconfig && started + 1 < quorum(voters + 1) {
            return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
        }
        self.change_membership(ConfChangeType::AddNode, &record)
            .await
    }

    /// Replaces a voter with a new one in a single joint-consensus step
    /// (ConfChangeV2 entering `old ∪ new` and leaving it automatically):
    /// the cluster never runs with fewer voters than before. The new member
    /// starts with `--initial-cluster-state existing`; until it has caught
    /// up the joint quorum needs it, so start it right away.
    pub async fn member_replace(
        &self,
        old: u64,
        peer_urls: Vec<String>,
    ) -> Result<(MemberRecord, Vec<MemberRecord>)> {
        let leaving = self.known_member(old).await?;
        if leaving.is_learner {
            return Err(ServerError::Membership(
                "etcdserver: can only replace a voting member",
            ));
        }
        let record = self.new_member_record(peer_urls, false)?;
        let add = single_change(ConfChangeType::AddNode, record.id);
        let remove = single_change(ConfChangeType::RemoveNode, old);
        let mut cc = ConfChangeV2::default();
        cc.set_transition(raft::eraftpb::ConfChangeTransition::Auto);
        cc.set_changes(vec![add, remove].into());
        match self
            .propose_with(TAG_CONF_RECORD, &members::encode(&record), Some(cc))
            .await?
        {
            Applied::Members(all) => Ok((record, all)),
            _ => Err(ServerError::Stopped),
        }
    }

    /// MemberUpdate: new peer URLs (no Raft configuration change).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<Vec<MemberRecord>> {
        let mut record = self.known_member(id).await?;
        if peer_urls.is_empty()
            || crate::config::parse_peer_urls("peer-urls", &peer_urls.join(",")).is_err()
        {
            return Err(ServerError::Membership(
                "etcdserver: given member URLs are invalid",
            ));
        }
        record.peer_urls = peer_urls;
        match self
            .propose(TAG_MEMBER_PEERS, &members::encode(&record))
            .await?
        {
            Applied::Members(all) => Ok(all),
            _ => Err(ServerError::Stopped),
        }
    }

    /// MoveLeader: hands leadership to `target` and waits (bounded) until
    /// it leads.
    pub async fn move_leader(&self, target: u64) -> Result<()> {
        if !self.is_leader() {
            return Err(ServerError::NotLeader);
        }
        match self.registry.borrow().get(target) {
            Some(m) if !m.is_learner => {}
            _ => return Err(ServerError::Membership("etcdserver: bad leader transferee")),
        }
        if target == self.id {
            return Ok(());
        }
        self.transfer_to.set(Some(target));
        self.queue_ready.notify();
        let deadline = Instant::now() + self.request_timeout;
        while Instant::now() < deadline {
            if self.status.get().leader == target {
                return Ok(());
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        Err(ServerError::Membership(
            "etcdserver: request timed out, leader transfer took too long",
        ))
    }

    /// Voting members other than `except`, and how many of them have
    /// started (published their name), etcd's `IsStarted`.
    fn started_voters(&self, except: Option<u64>) -> (usize, usize) {
        let members = self.registry.borrow().all();
        let voters = members
            .iter()
            .filter(|m| !m.is_learner && Some(m.id) != except);
        voters.fold((0, 0), |(n, started), m| {
            (n + 1, started + usize::from(!m.name.is_empty()))
        })
    }

    fn voter_ids(&self) -> Vec<u64> {
        let registry = self.registry.borrow();
        registry
            .all()
            .iter()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect()
    }

    /// Whether the link to voter `peer` has been up for etcd's health
    /// interval (this member counts as connected to itself).
    fn connected_long_enough(&self, peer: u64) -> bool {
        peer == self.id
            || self
                .transport
                .connected_since(peer)
                .is_some_and(|t| t.elapsed() >= RECONFIG_HEALTH_INTERVAL)
    }

    /// etcd's strict reconfiguration check for MemberAdd (`mayAddMember`):
    /// a new voter must not leave the cluster without a quorum of started
    /// members (adding a second member to a single one is allowed: the
    /// restore procedure), and every voter must have been reachable for
    /// the health interval.
    fn may_add_member(&self, is_learner: bool) -> Result<()> {
        if !self.strict_reconfig {
            return Ok(());
        }
        if !is_learner {
            let (voters, started) = self.started_voters(None);
            let restoring_a_single_member = started == 1 && voters == 1;
            if !restoring_a_single_member && started < quorum(voters + 1) {
                return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
            }
        }
        if !self
            .voter_ids()
            .iter()
            .all(|&v| self.connected_long_enough(v))
        {
            return Err(ServerError::Membership(UNHEALTHY));
        }
        Ok(())
    }

    /// etcd's strict reconfiguration check for MemberRemove
    /// (`mayRemoveMember`): removing a voter must leave a quorum of started
    /// members; removing one that is down is safe; otherwise the voters
    /// reachable for the health interval, minus the removed one, must still
    /// be a quorum. Learners go freely.
    fn may_remove_member(&self, id: u64) -> Result<()> {
        if !self.strict_reconfig {
            return Ok(());
        }
        let is_learner = self.registry.borrow().get(id).is_some_and(|m| m.is_learner);
        if is_learner {
            return Ok(());
        }
        let (voters, started) = self.started_voters(Some(id));
        if started < quorum(voters) {
            return Err(ServerError::Membership(NOT_ENOUGH_STARTED));
        }
        if id != self.id && self.transport.connected_since(id).is_none() {
            return Ok(());
        }
        let voters = self.voter_ids();
        let active = voters
            .iter()
            .filter(|&&v| self.connected_long_enough(v))
            .count();
        if active.saturating_sub(1) < quorum(voters.len().saturating_sub(1)) {
            return Err(ServerError::Membership(UNHEALTHY));
        }
        Ok(())
    }

    /// The member `id` as the cluster knows it now: a member this one has
    /// not heard of yet may have been added by an entry it has still to
    /// apply (a MemberAdd answered by another member a moment ago), so it
    /// looks again after a read barrier before answering "not found".
    async fn known_member(&self, id: u64) -> Result<MemberRecord> {
        let lookup = || self.registry.borrow().get(id).cloned();
        if let Some(record) = lookup() {
            return Ok(record);
        }
        // A failed barrier (no leader, a learner) leaves the local answer.
        let _ = self.read_barrier().await;
        lookup().ok_or(ServerError::Membership("etcdserver: member not found"))
    }

    async fn change_membership(
        &self,
        kind: ConfChangeType,
        record: &MemberRecord,
    ) -> Result<Vec<MemberRecord>> {
        let mut cc = ConfChangeV2::default();
        cc.set_changes(vec![single_change(kind, record.id)].into());
        match self
            .propose_with(TAG_CONF_RECORD, &members::encode(record), Some(cc))
            .await?
        {
            Applied::Members(all) => Ok(all),
            _ => Err(ServerError::Stopped),
        }
    }

    /// Data directories (for tests and tooling).
    pub fn dirs(&self) -> &DataDirs {
        &self.dirs
    }
}

/// The Raft loop's effects for [`crate::ready::handle_ready`]: the real
/// transport, WAL, state machine and read waiters of this member.
struct NodeReady<'a> {
    node: &'a Rc<Node>,
    wal: &'a mut Wal,
}

impl crate::ready::ReadyHost for NodeReady<'_> {
    fn send(&mut self, msgs: Vec<Message>) {
        self.node.send(msgs);
    }

    async fn install_snapshot(
        &mut self,
        raw: &mut RawNode<MemStorage>,
        snap: raft::eraftpb::Snapshot,
    ) -> Result<()> {
        self.node.metrics.snapshot_applying.set(true);
        let installed = self.node.install_snapshot(raw, self.wal, snap).await;
        self.node.metrics.snapshot_applying.set(false);
        installed
    }

    fn read_index_ready(&mut self, ctx: &[u8], index: u64, applied: u64) {
        self.node.read_index_ready(ctx, index, applied);
    }

    fn apply(&mut self, raw: &mut RawNode<MemStorage>, entries: Vec<Entry>) -> Result<()> {
        self.node.apply_entries(raw, entries)
    }

    fn log_entry(&mut self, index: u64, record: &[u8]) {
        self.wal.append_entry(index, record);
    }

    fn log_state(&mut self, record: &[u8]) {
        self.wal.append_state(record);
    }

    async fn sync_log(&mut self) -> Result<()> {
        let started = Instant::now();
        self.wal.sync().await?;
        self.node
            .metrics
            .wal_fsync
            .observe_seconds(started.elapsed());
        Ok(())
    }

    fn release_reads(&mut self, applied: u64) {
        self.node.release_reads(applied);
    }
}

/// The membership the engine holds (`raft/conf`, written by every applied
/// change), if any change was applied: newer than any WAL marker's.
pub(crate) fn conf_kept_in<E: Engine>(
    mvcc: &MvccStore<E>,
    engine_applied: u64,
) -> Result<Option<ConfState>> {
    match mvcc.meta_with_prefix(CONF_META)?.into_iter().next() {
        Some((_, value)) => Ok(Some(
            raftlog::decode_snapshot_meta(engine_applied, &value)?.1,
        )),
        None => Ok(None),
    }
}

/// Times one entry's apply: one slower than [`crate::metrics::SLOW_APPLY`]
/// counts in `etcd_server_slow_apply_total`.
struct SlowApply<'a> {
    metrics: &'a crate::metrics::NodeMetrics,
    started: Instant,
}

impl<'a> SlowApply<'a> {
    fn timing(metrics: &'a crate::metrics::NodeMetrics) -> Self {
        SlowApply {
            metrics,
            started: Instant::now(),
        }
    }
}

impl Drop for SlowApply<'_> {
    fn drop(&mut self) {
        if self.started.elapsed() > crate::metrics::SLOW_APPLY {
            crate::metrics::count(&self.metrics.slow_applies);
        }
    }
}

/// The leader's expiry clock: revokes expired leases through the log.
async fn expire_leases(node: Rc<Node>) {
    loop {
        glommio::timer::sleep(LEASE_CHECK_INTERVAL).await;
        if node.fatal.borrow().is_some() {
            return;
        }
        if !node.is_leader() {
            // Only the leader's clock decides (etcd's rule).
            continue;
        }
        let expired = node.lessor.borrow_mut().take_expired(Instant::now(), 64);
        for id in expired {
            let node = node.clone();
            glommio::spawn_local(async move {
                match node.lease_revoke(id, Caller::Member).await {
                    Ok(_) => crate::metrics::count(&node.metrics.leases_expired),
                    Err(ServerError::Lease(_)) => {}
                    Err(e) => {
                        log(format_args!("revoking expired lease {id:x}: {e}"));
                        node.lessor.borrow_mut().revoke_failed(id);
                    }
                }
            })
            .detach();
        }
    }
}

/// etcd's lease checkpoints: every `every`, the leader puts the remaining
/// TTL of each lease that outlives the interval through the log, so a new
/// leader or a restarted member starts it from there, not from a full TTL.
async fn checkpoint_leases(node: Rc<Node>, every: Duration) {
    loop {
        glommio::timer::sleep(every).await;
        if node.fatal.borrow().is_some() || node.removed.get() {
            return;
        }
        if !node.leads_leases() {
            continue;
        }
        let due = node.lessor.borrow().checkpoints_due(Instant::now(), every);
        if !due.is_empty() {
            node.checkpoint_due(due.into_iter().map(|(id, _)| id).collect(), every)
                .await;
        }
    }
}

/// Proposes compactions when the auto-compaction policy says so; they go
/// through the log like any client's, so every member compacts at the same
/// revision.
async fn auto_compact(node: Rc<Node>, mut compactor: Compactor) {
    if compactor.policy() == crate::config::AutoCompaction::Off {
        return;
    }
    loop {
        glommio::timer::sleep(compactor.tick_interval()).await;
        if node.fatal.borrow().is_some() {
            return;
        }
        let status = node.status();
        if let Some(revision) =
            compactor.tick(Instant::now(), status.revision, status.compact_revision)
        {
            let req = mvcc::Request::Compaction(mvcc::CompactionRequest {
                revision,
                physical: false,
            });
            match node.write(req, Caller::Member).await {
                Ok(_) => log(format_args!(
                    "auto-compaction: compacted to revision {revision}"
                )),
                Err(e) => log(format_args!(
                    "auto-compaction to revision {revision} failed: {e}"
                )),
            }
        }
    }
}

/// Every `every`, on the leader, while no CORRUPT alarm is on: see
/// [`Node::check_peer_hashes`]. Each check reads the whole store (on a
/// thread of its own, as the HashKV RPC does): keep the interval in
/// minutes on large stores.
async fn check_corruption_periodically(node: Rc<Node>, every: Duration) {
    loop {
        glommio::timer::sleep(every).await;
        if node.fatal.borrow().is_some() || node.removed.get() {
            return;
        }
        let corrupt = node.alarms.borrow().any(crate::alarm::AlarmType::Corrupt);
        if !node.is_leader() || corrupt {
            continue;
        }
        if let Err(e) = node.check_peer_hashes().await {
            log(format_args!("corruption check: {e}"));
        }
    }
}

/// Publishes this member's name and client URLs through the log once a
/// leader exists, at every start, as etcd does; then the member serves
/// clients ([`Node::serving`]). Applying its own publish means it has
/// applied every entry committed before this start, so nothing it answers
/// from now on is older than what it answered before a crash (its durable
/// commit index may lag what it had applied and answered).
async fn publish_attributes(node: Rc<Node>) {
    loop {
        if node.fatal.borrow().is_some() {
            return;
        }
        if node.status().leader != 0 {
            match node
                .propose(TAG_MEMBER_ATTRS, &members::encode(&node.my_attrs))
                .await
            {
                Ok(_) => break,
                Err(e) => log(format_args!("publishing member attributes: {e}")),
            }
        }
        glommio::timer::sleep(Duration::from_millis(200)).await;
    }
    // etcd's start-up lines, which tools (etcd's e2e harness among them)
    // wait for: the cluster version, the publish, then serving.
    log(format_args!(
        "enabled capabilities for version {}",
        crate::ETCD_CLUSTER_VERSION
            .rsplit_once('.')
            .map_or(crate::ETCD_CLUSTER_VERSION, |(major_minor, _)| major_minor)
    ));
    log(format_args!(
        "published {{Name:{} ClientURLs:[{}]}} to cluster {:x}",
        node.my_attrs.name,
        node.my_attrs.client_urls.join(" "),
        node.cluster_id
    ));
    node.serving.set(true);
    // Recovery's buffers (the WAL read, the replayed tail) are freed by now;
    // give their pages back rather than holding the start-up peak forever.
    crate::alloc::release_freed_memory();
    StartupPhases::ready();
    log(format_args!("ready to serve client requests"));
}

/// Points the transport at a member's peer URLs (not at this member).
fn connect_peer(transport: &Rc<Transport>, member: &MemberRecord) {
    if member.peer_urls.is_empty() {
        return;
    }
    match crate::config::parse_peer_urls("peer-urls", &member.peer_urls.join(",")) {
        Ok(addrs) => transport.add_peer(member.id, addrs),
        Err(e) => log(format_args!("member {:x}: {e}", member.id)),
    }
}

/// Whether `member` is in `cs`, on either side of a joint configuration.
pub(crate) fn conf_holds(cs: &ConfState, member: u64) -> bool {
    [
        &cs.voters,
        &cs.learners,
        &cs.voters_outgoing,
        &cs.learners_next,
    ]
    .iter()
    .any(|ids| ids.contains(&member))
}

pub(crate) fn single_change(kind: ConfChangeType, member: u64) -> ConfChangeSingle {
    let mut single = ConfChangeSingle::default();
    single.set_change_type(kind);
    single.node_id = member;
    single
}

/// Overlays the member records kept in MVCC metadata on `registry`.
fn load_member_records(mvcc: &MvccStore<AnyEngine>, registry: &mut Registry) -> Result<()> {
    for (_, value) in mvcc.meta_with_prefix(members::META_PREFIX)? {
        if let Some(record) = members::decode(&value) {
            registry.upsert(record);
        }
    }
    Ok(())
}

/// The voter other than `me` whose log matches the leader's furthest (a
/// leader's view; `None` when it is the only voter).
fn most_caught_up_voter(raw: &RawNode<MemStorage>, me: u64) -> Option<u64> {
    let prs = raw.raft.prs();
    let voters: Vec<u64> = prs.conf().voters().ids().iter().collect();
    voters
        .into_iter()
        .filter(|id| *id != me)
        .filter_map(|id| prs.get(id).map(|p| (p.matched, id)))
        .max()
        .map(|(_, id)| id)
}

/// A MemberAdd's peer URLs as etcd checks them (before anything else,
/// the caller's permission included), in its words.
pub fn check_new_member_urls(peer_urls: &[String]) -> Result<()> {
    if peer_urls.is_empty()
        || crate::config::parse_peer_urls("peer-urls", &peer_urls.join(",")).is_err()
    {
        return Err(ServerError::Membership(
            "etcdserver: given member URLs are invalid",
        ));
    }
    Ok(())
}
