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
    decode_proposal, kv_body, lease_grant_body, lease_needs, lease_revoke_body, leases_used,
    proposal, ApplyContext, Decoded, ProposedBy, StateMachine, TAG_ALARM, TAG_AUTH,
    TAG_CONF_RECORD, TAG_LEASE_CHECKPOINT, TAG_LEASE_GRANT, TAG_MEMBER_ATTRS, TAG_MEMBER_PEERS,
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

mod checkpoint;
mod hashes;
mod leases;
mod member;
mod membership;
mod raft_loop;
mod startup;
mod tasks;

use checkpoint::*;
use member::Member;
pub use membership::check_new_member_urls;
use membership::*;
pub(crate) use membership::{conf_holds, single_change};
use startup::*;
use tasks::*;

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

/// A Raft group of this member: its log, its store and everything that
/// applies one to the other, driven by its loop on its owner core. What
/// belongs to the member whatever its groups is in [`member::Member`].
pub struct Node {
    /// The member this group runs in (shared by its groups).
    member: Rc<Member>,
    /// Counters and latency histograms for `/metrics`.
    pub metrics: crate::metrics::NodeMetrics,
    /// Raft progress (matched index) of every member, on the leader.
    progress: RefCell<HashMap<u64, u64>>,
    /// A leader transfer asked by MoveLeader, for the next loop turn.
    transfer_to: Cell<Option<u64>>,
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

fn log(msg: std::fmt::Arguments<'_>) {
    eprintln!("metcd: {msg}");
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

impl Node {
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
            member_id: self.member.id,
            has_leader: status.leader != 0,
            is_leader: status.leader == self.member.id,
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
            peers: Some(self.member.transport.traffic()),
        };
        (
            crate::metrics::render(&gauges, &self.metrics),
            crate::metrics::render_metcd(&gauges),
        )
    }

    /// etcd's `/health`: no fatal error, a leader, and no active alarm.
    /// Whether client requests are served yet (see [`publish_attributes`]).
    pub fn serving(&self) -> bool {
        self.member.serving.get()
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
        let by = match caller {
            Caller::Member => None,
            Caller::Client(token) => {
                if matches!(req, mvcc::Request::Put(_) | mvcc::Request::Txn(_)) {
                    self.check_quota(crate::alarm::cost(&req)).await?;
                }
                let mut used = Vec::new();
                leases_used(&req, &mut used);
                let collect = |needs: &mut Vec<_>| crate::auth::kv_needs(&req, needs);
                Some(self.check_proposal(token, collect, &used)?)
            }
        };
        let (tag, body) = kv_body(&req, by.as_ref());
        match self.propose(tag, &body).await? {
            Applied::Kv(r) => Ok(r),
            _ => Err(ServerError::Stopped),
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
        let data = proposal(self.member.id, id, tag, body);
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
        self.member.id
    }

    pub fn cluster_id(&self) -> u64 {
        self.member.cluster_id
    }

    pub fn is_leader(&self) -> bool {
        self.status.get().leader == self.member.id
    }

    /// Whether this member's lease clock is the cluster's (the leader's,
    /// or the only member's).
    pub fn leads_leases(&self) -> bool {
        self.solo.get() || self.is_leader()
    }

    /// Every member's record, in ID order.
    pub fn members(&self) -> Vec<MemberRecord> {
        self.member.registry.borrow().all()
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
        if self.learner.get()
            || self
                .alarms
                .borrow()
                .is_active(AlarmType::NoSpace, self.member.id)
        {
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
                member: self.member.id,
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

    /// Data directories (for tests and tooling).
    pub fn dirs(&self) -> &DataDirs {
        &self.dirs
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
