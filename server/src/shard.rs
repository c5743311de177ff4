//! Shard executors: one pinned glommio executor per core, each accepting
//! client connections on the same ports (SO_REUSEPORT). Shard 0 owns the
//! Raft group; the other shards forward commands to it over glommio shared
//! channels and route the replies back by request id.
//!
//! Must never: share mutable state between cores except through these
//! channels; block an executor.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use futures_channel::oneshot;
use glommio::channels::shared_channel::{
    self, ConnectedReceiver, ConnectedSender, SharedReceiver, SharedSender,
};
use glommio::{LocalExecutorBuilder, Placement};

use engine::any::AnyEngine;

use crate::api::grpc::require_leader::LeaderGuard;
use crate::api::grpc::serve::{serve as grpc_serve, Router};
use crate::api::grpc::service::{MemberInfo, Services};
use crate::api::http::{self, HttpLimits};
use crate::config::Config;
use crate::error::{Result, ServerError};
use crate::mvcc::{self, StoreReader};
use crate::node::{Caller, Node, NodeStatus};
use crate::read_view::ReadView;
use crate::watch::{EventSubscriber, Feed, HeaderIds, WatchHub};

/// The owner core of the Raft group.
pub const OWNER_SHARD: usize = 0;
/// Messages (batches of up to [`MAX_BATCH`]) a link's channel holds.
const LINK_CAPACITY: usize = MAX_IN_FLIGHT / MAX_BATCH + 1;
/// Messages (each up to [`MAX_BATCH`] feed items, one item per applied
/// entry's events) the event channel to a shard holds before the owner's
/// forwarding task waits (the Raft loop itself only queues).
const CHANNEL_CAPACITY: usize = 4096;

/// A request to the group owner.
#[derive(Debug)]
pub enum Command {
    /// A client's write, with the simple token its request carried (every
    /// command that names a token is checked on the owner while auth is
    /// on).
    Write(mvcc::Request, Option<String>),
    /// A read's gate ([`crate::read_view`]): the read barrier when
    /// linearizable, then the permission check, so a permission revoked
    /// before the read began is never outrun. The read itself runs on the
    /// shard that asked.
    ReadGate {
        linearizable: bool,
        token: Option<String>,
        requirement: crate::auth::Requirement,
    },
    HashKv(i64),
    Hash,
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke(i64, Option<String>),
    /// A backup file for the Maintenance Snapshot stream.
    Backup,
    /// Maintenance Defragment.
    Defragment,
    /// The store's compact revision now (not the status refreshed per loop
    /// turn).
    CompactRevision,
    LeaseKeepAlive(i64),
    LeaseTimeToLive(i64),
    Leases,
    Status,
    /// Maintenance Alarm (through the log).
    Alarm(crate::alarm::AlarmRequest),
    /// The leader this member knows (0: none), from the status of the
    /// last loop turn; cheaper than `Status` (no alarm list, no engine
    /// size).
    Leader,
    /// The Prometheus `/metrics` page.
    Metrics,
    /// Whether this member serves clients yet (it has applied its own
    /// start-up publish).
    Serving,
    Members,
    MemberAdd {
        peer_urls: Vec<String>,
        is_learner: bool,
    },
    MemberRemove(u64),
    MemberPromote(u64),
    MemberUpdate {
        id: u64,
        peer_urls: Vec<String>,
    },
    MoveLeader(u64),
    /// metcd's joint-consensus replacement of a voter (HTTP admin API).
    MemberReplace {
        old: u64,
        peer_urls: Vec<String>,
    },
    /// Whether the caller behind `token` may do what `requirement` names.
    Authorize {
        token: Option<String>,
        requirement: crate::auth::Requirement,
    },
    /// An auth change through the log by the caller behind `token`.
    AuthChange {
        token: Option<String>,
        req: crate::auth::AuthRequest,
    },
    /// A read of the auth state by the caller behind `token`.
    AuthQuery {
        token: Option<String>,
        query: crate::auth::AuthQuery,
    },
}

/// The owner's answer; `term` is the Raft term when it was produced (for
/// etcd's response headers).
#[derive(Debug)]
pub enum Reply {
    Write(Result<mvcc::Response>, u64),
    /// Whether a read may go on ([`Command::ReadGate`]).
    ReadGate(Result<()>, u64),
    HashKv(Result<mvcc::HashKv>, u64),
    /// (hash, revision)
    Hash(Result<(u32, i64)>, u64),
    /// (lease id, granted TTL, revision)
    LeaseGrant(Result<(i64, i64, i64)>, u64),
    LeaseRevoke(Result<i64>, u64),
    CompactRevision(i64),
    Defragment(Result<()>, u64),
    /// (file, bytes) of a backup to stream, then delete.
    Backup(Result<(std::path::PathBuf, u64)>, u64),
    /// A lease query: the answer, the store revision and the term.
    Lease(LeaseInfo, i64, u64),
    /// etcd's families (the client URL's `/metrics`), then metcd's own
    /// (added on the HTTP API's).
    Metrics(String, String),
    Leader(u64),
    Serving(bool),
    Status {
        status: NodeStatus,
        healthy: bool,
        db_size: engine::EngineSize,
        alarms: Vec<crate::alarm::AlarmMember>,
    },
    /// An Alarm call's answer and the term.
    Alarm(Result<Vec<crate::alarm::AlarmMember>>, u64),
    Members(Vec<crate::members::MemberRecord>, u64),
    /// A membership change: the member added (MemberAdd) and all members.
    MemberChange(Result<MemberChange>, u64),
    MoveLeader(Result<()>, u64),
    Authorized(Result<()>),
    /// An auth change's or query's answer, the term and the store revision
    /// (for etcd's response header).
    AuthChange(Result<crate::auth::AuthApplied>, u64, i64),
    AuthQuery(Result<crate::auth::AuthAnswer>, u64, i64),
    /// A command refused before it ran (e.g. a lease query on a follower).
    Failed(ServerError),
}

/// What a membership change answers.
#[derive(Debug)]
pub struct MemberChange {
    pub added: Option<crate::members::MemberRecord>,
    pub members: Vec<crate::members::MemberRecord>,
}

/// Answers of the leader-local lease queries.
#[derive(Debug)]
pub enum LeaseInfo {
    /// The TTL after a keep-alive, `None` for an unknown lease.
    KeepAlive(Option<i64>),
    /// (remaining, granted, keys), `None` for an unknown lease.
    TimeToLive(Option<(i64, i64, Vec<bytes::Bytes>)>),
    List(Vec<i64>),
}

fn member_change(node: &Node, result: Result<Vec<crate::members::MemberRecord>>) -> Reply {
    let result = result.map(|members| MemberChange {
        added: None,
        members,
    });
    Reply::MemberChange(result, node.status().term)
}

fn lease_reply(node: &Node, info: LeaseInfo) -> Reply {
    let status = node.status();
    Reply::Lease(info, status.revision, status.term)
}

/// How a shard reaches the group: directly on the owner core, through
/// channels elsewhere.
#[derive(Clone)]
pub enum Backend {
    Local(Rc<Node>),
    Remote(Rc<Remote>),
}

/// Index keys one slice of a range's walk examines: tens of microseconds
/// under the store's read lock, which the owner's next apply waits for at
/// most.
pub const RANGE_WALK_SLICE: usize = 2048;

impl Backend {
    pub async fn call(&self, cmd: Command) -> Reply {
        match self {
            Backend::Local(node) => execute(node, cmd).await,
            Backend::Remote(remote) => remote.call(cmd).await,
        }
    }

    /// etcd's permission check for the caller behind `token`, run on the
    /// owner; nothing to do, and no trip there, while `auth_enabled` (the
    /// flag the owner's apply keeps) is off.
    pub async fn authorize(
        &self,
        auth_enabled: &std::sync::atomic::AtomicBool,
        token: Option<String>,
        requirement: impl FnOnce() -> crate::auth::Requirement,
    ) -> Result<()> {
        if !auth_enabled.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let cmd = Command::Authorize {
            token,
            requirement: requirement(),
        };
        match self.call(cmd).await {
            Reply::Authorized(result) => result,
            Reply::Failed(e) => Err(e),
            _ => Err(ServerError::Stopped),
        }
    }
}

/// Values loaded between two yields while finishing a range: a chunk
/// costs tens of microseconds, so a put queued behind a big scan waits
/// about that long, not for the whole scan.
pub const RANGE_LOAD_CHUNK: usize = 256;

impl Backend {
    fn read_view(&self) -> std::sync::Arc<ReadView> {
        match self {
            Backend::Local(node) => node.read_view(),
            Backend::Remote(remote) => remote.view.clone(),
        }
    }

    /// A read's gate ([`crate::read_view`]): passes at once, or after the
    /// owner's read barrier and permission check. Returns the store to
    /// read (taken after the gate, so it holds everything the barrier
    /// waited for) and the Raft term for the response header.
    async fn read_gate(
        &self,
        linearizable: bool,
        token: Option<String>,
        requirement: impl FnOnce() -> crate::auth::Requirement,
    ) -> Result<(StoreReader<AnyEngine>, u64)> {
        let view = self.read_view();
        let term = if view.needs_gate(linearizable) {
            let cmd = Command::ReadGate {
                linearizable,
                token,
                requirement: requirement(),
            };
            match self.call(cmd).await {
                Reply::ReadGate(Ok(()), term) => term,
                Reply::ReadGate(Err(e), _) | Reply::Failed(e) => return Err(e),
                _ => return Err(ServerError::Stopped),
            }
        } else {
            view.term()
        };
        let reader = view.reader().ok_or(ServerError::Stopped)?;
        Ok((reader, term))
    }

    /// A range, read on this shard ([`crate::read_view`]): the key index
    /// walked in slices, then the values loaded from the walk's snapshot a
    /// chunk at a time, yielding to the write path in between
    /// ([`crate::sched`]). The owner does nothing for it but the gate.
    pub async fn range(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<mvcc::RangeResponse>, u64) {
        let (walked, term) = self.gated_walk(req, token).await;
        let answer = match walked {
            Ok(mvcc::RangeStart::Done(response)) => Ok(response),
            Ok(mvcc::RangeStart::Plan(plan)) => load_whole(plan).await,
            Err(e) => Err(e),
        };
        (answer, term)
    }

    /// A range as [`Backend::range`] reads it, except that an answer in key
    /// order comes back with its values not loaded
    /// ([`mvcc::RangePlan::into_chunked`]): its caller loads and sends
    /// them a chunk at a time.
    pub async fn range_read(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<RangeRead>, u64) {
        let (walked, term) = self.gated_walk(req, token).await;
        let answer = match walked {
            Ok(mvcc::RangeStart::Done(response)) => Ok(RangeRead::Whole(response)),
            Ok(mvcc::RangeStart::Plan(plan)) => match plan.into_chunked() {
                mvcc::Chunking::Chunked(chunked) => Ok(RangeRead::Chunked(chunked)),
                mvcc::Chunking::Whole(plan) => load_whole(plan).await.map(RangeRead::Whole),
            },
            Err(e) => Err(e),
        };
        (answer, term)
    }

    /// A range's gate ([`crate::read_view`]: once a linearizable read may
    /// go and the caller may read), then its key-index walk; and the Raft
    /// term.
    async fn gated_walk(
        &self,
        req: mvcc::RangeRequest,
        token: Option<String>,
    ) -> (Result<mvcc::RangeStart<Snapshot>>, u64) {
        let gate = self
            .read_gate(!req.serializable, token, || {
                crate::auth::Requirement::Keys(vec![crate::auth::Need::read(
                    &req.key,
                    &req.range_end,
                )])
            })
            .await;
        match gate {
            Ok((reader, term)) => (walk(&reader, req).await, term),
            Err(e) => (Err(e), 0),
        }
    }

    /// A txn without writes, read on this shard from the applied state
    /// (etcd serves these without a log entry too), after the gate of a
    /// linearizable read.
    pub async fn read_txn(
        &self,
        req: mvcc::TxnRequest,
        token: Option<String>,
    ) -> (Result<mvcc::TxnResponse>, u64) {
        let gate = self
            .read_gate(true, token, || {
                let mut needs = Vec::new();
                crate::auth::txn_needs(&req, &mut needs);
                crate::auth::Requirement::Keys(needs)
            })
            .await;
        match gate {
            Ok((reader, term)) => (reader.read_txn(&req).map_err(ServerError::from), term),
            Err(e) => (Err(e), 0),
        }
    }

    /// A watcher's history: the events of `[key, range_end)` from
    /// `from_rev` up to the current revision, and that revision (see
    /// [`StoreReader::begin_history`]). Read on this shard from the read
    /// view, in its reads queue a slice at a time; the owner does nothing
    /// for it. (The watcher's permission was checked when it was created;
    /// a watch is never linearizable, as in etcd.) Also answers the Raft
    /// term for the response header.
    pub async fn watch_history(
        &self,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
        from_rev: i64,
    ) -> (Result<(Vec<mvcc::Event>, i64)>, u64) {
        let view = self.read_view();
        let Some(reader) = view.reader() else {
            return (Err(ServerError::Stopped), 0);
        };
        let read = crate::sched::off_the_write_path(async move {
            let mut walk = reader.begin_history(key, range_end, from_rev)?;
            while !reader.walk_history(&mut walk, WATCH_HISTORY_SLICE)? {
                crate::sched::end_of_slice().await;
            }
            Ok(walk.finish())
        })
        .await
        .unwrap_or(Err(ServerError::Stopped));
        (read, view.term())
    }
}

/// Key revisions one slice of a watcher's history reads under the store's
/// read lock: each costs a decode and, for its previous value, an index
/// lookup and an engine read (about a microsecond), so the owner's next
/// apply waits a few hundred microseconds at most.
const WATCH_HISTORY_SLICE: usize = 256;

/// The engine snapshot a range's values are read from.
pub type Snapshot = <AnyEngine as engine::Engine>::Snapshot;

/// A range read by [`Backend::range_read`].
pub enum RangeRead {
    /// The whole answer, values loaded.
    Whole(mvcc::RangeResponse),
    /// An answer in key order, its values still to load.
    Chunked(mvcc::ChunkedRange<Snapshot>),
}

/// A range's key-index walk, in slices.
async fn walk(
    reader: &StoreReader<AnyEngine>,
    req: mvcc::RangeRequest,
) -> Result<mvcc::RangeStart<Snapshot>> {
    let mut walk = reader.begin_range(req)?;
    while !reader.walk_range(&mut walk, RANGE_WALK_SLICE)? {
        crate::sched::end_of_slice().await;
    }
    Ok(walk.finish())
}

/// A range's values, loaded in slices, and its answer.
async fn load_whole(mut plan: mvcc::RangePlan<Snapshot>) -> Result<mvcc::RangeResponse> {
    while !plan.load(RANGE_LOAD_CHUNK)? {
        crate::sched::end_of_slice().await;
    }
    Ok(plan.finish()?)
}

async fn execute(node: &Node, cmd: Command) -> Reply {
    match cmd {
        Command::Write(req, token) => {
            let result = node.write(req, Caller::Client(token.as_deref())).await;
            Reply::Write(result, node.status().term)
        }
        Command::ReadGate {
            linearizable,
            token,
            requirement,
        } => {
            let barrier = if linearizable {
                node.read_barrier().await
            } else {
                Ok(())
            };
            let result = barrier.and_then(|()| node.authorize(token.as_deref(), || requirement));
            Reply::ReadGate(result, node.status().term)
        }
        Command::HashKv(rev) => Reply::HashKv(node.hash_kv(rev).await, node.status().term),
        Command::Hash => Reply::Hash(node.hash_all().await, node.status().term),
        Command::LeaseGrant { id, ttl } => {
            let result = node.lease_grant(id, ttl).await;
            Reply::LeaseGrant(result, node.status().term)
        }
        Command::LeaseRevoke(id, token) => {
            let result = node
                .lease_revoke(id, Caller::Client(token.as_deref()))
                .await;
            Reply::LeaseRevoke(result, node.status().term)
        }
        Command::Backup => {
            let result = node.write_backup().await;
            Reply::Backup(result, node.status().term)
        }
        // The leader's lessor is the only one whose clock counts: a
        // follower forwards these to it, as etcd does.
        Command::LeaseKeepAlive(id) if !node.leads_leases() => {
            match node
                .forward_lease(crate::peer::PeerQuery::KeepAlive(id))
                .await
            {
                Ok(crate::peer::PeerAnswer::KeepAlive(ttl)) => {
                    lease_reply(node, LeaseInfo::KeepAlive(ttl))
                }
                Ok(_) => Reply::Failed(ServerError::NotLeader),
                Err(e) => Reply::Failed(e),
            }
        }
        Command::LeaseTimeToLive(id) if !node.leads_leases() => {
            match node
                .forward_lease(crate::peer::PeerQuery::TimeToLive(id))
                .await
            {
                Ok(crate::peer::PeerAnswer::TimeToLive(found)) => {
                    let found = found.map(|(remaining, granted, keys)| {
                        (
                            remaining,
                            granted,
                            keys.into_iter().map(bytes::Bytes::from).collect(),
                        )
                    });
                    lease_reply(node, LeaseInfo::TimeToLive(found))
                }
                Ok(_) => Reply::Failed(ServerError::NotLeader),
                Err(e) => Reply::Failed(e),
            }
        }
        Command::LeaseKeepAlive(id) => {
            lease_reply(node, LeaseInfo::KeepAlive(node.lease_keepalive(id)))
        }
        Command::LeaseTimeToLive(id) => {
            lease_reply(node, LeaseInfo::TimeToLive(node.lease_time_to_live(id)))
        }
        Command::Leases => lease_reply(node, LeaseInfo::List(node.leases())),
        Command::Members => Reply::Members(node.members(), node.status().term),
        Command::Authorize { token, requirement } => {
            Reply::Authorized(node.authorize(token.as_deref(), || requirement))
        }
        Command::AuthChange { token, req } => {
            let result = node.auth_change(token.as_deref(), &req).await;
            let status = node.status();
            Reply::AuthChange(result, status.term, status.revision)
        }
        Command::AuthQuery { token, query } => {
            let status = node.status();
            let result = node.auth_query(token.as_deref(), &query);
            Reply::AuthQuery(result, status.term, status.revision)
        }
        Command::MemberAdd {
            peer_urls,
            is_learner,
        } => {
            let result = node
                .member_add(peer_urls, is_learner)
                .await
                .map(|(added, members)| MemberChange {
                    added: Some(added),
                    members,
                });
            Reply::MemberChange(result, node.status().term)
        }
        Command::MemberReplace { old, peer_urls } => {
            let result = node
                .member_replace(old, peer_urls)
                .await
                .map(|(added, members)| MemberChange {
                    added: Some(added),
                    members,
                });
            Reply::MemberChange(result, node.status().term)
        }
        Command::MemberRemove(id) => member_change(node, node.member_remove(id).await),
        // Only the leader knows how far a learner got: a follower asks it,
        // as etcd does.
        Command::MemberPromote(id) if !node.is_leader() => {
            match node
                .forward_lease(crate::peer::PeerQuery::Promote(id))
                .await
            {
                Ok(crate::peer::PeerAnswer::Promoted(Ok(members))) => {
                    member_change(node, Ok(members))
                }
                Ok(crate::peer::PeerAnswer::Promoted(Err(message))) => {
                    Reply::Failed(ServerError::from_forwarded(&message))
                }
                Ok(_) => Reply::Failed(ServerError::NotLeader),
                Err(e) => Reply::Failed(e),
            }
        }
        Command::MemberPromote(id) => member_change(node, node.member_promote(id).await),
        Command::MemberUpdate { id, peer_urls } => {
            member_change(node, node.member_update(id, peer_urls).await)
        }
        Command::MoveLeader(target) => {
            let result = node.move_leader(target).await;
            Reply::MoveLeader(result, node.status().term)
        }
        Command::CompactRevision => Reply::CompactRevision(node.compact_revision()),
        Command::Defragment => {
            let result = node.defragment().await;
            Reply::Defragment(result, node.status().term)
        }
        Command::Metrics => {
            let (etcd, metcd) = node.metrics_page();
            Reply::Metrics(etcd, metcd)
        }
        Command::Leader => Reply::Leader(node.status().leader),
        Command::Serving => Reply::Serving(node.serving()),
        Command::Status => Reply::Status {
            status: node.status(),
            healthy: node.is_healthy(),
            db_size: node.db_size(),
            alarms: node.active_alarms(),
        },
        Command::Alarm(req) => {
            let result = node.alarm(req).await;
            Reply::Alarm(result, node.status().term)
        }
    }
}

/// Items one cross-core message carries at most.
const MAX_BATCH: usize = 256;
/// Requests a shard may have waiting for the owner's replies; callers
/// beyond it wait for a slot (the connection stops reading), so the
/// queues in both directions stay bounded by it.
const MAX_IN_FLIGHT: usize = 4096;

/// One direction of a cross-core link: what tasks queue during an
/// executor turn crosses as one message (at most [`MAX_BATCH`] items),
/// sent by one task woken once per turn, not one message and one wake-up
/// per item.
struct Outbox<T> {
    queue: RefCell<Vec<T>>,
    ready: crate::notify::Notify,
    /// Messages sent (the link's tests count them).
    messages: Cell<u64>,
    /// A feed queue collapsed once (logged the first time).
    overflowed: Cell<bool>,
}

impl<T: Send + 'static> Outbox<T> {
    fn new() -> Rc<Outbox<T>> {
        Rc::new(Outbox {
            queue: RefCell::new(Vec::new()),
            ready: crate::notify::Notify::default(),
            messages: Cell::new(0),
            overflowed: Cell::new(false),
        })
    }

    fn push(&self, item: T) {
        self.queue.borrow_mut().push(item);
        self.ready.notify();
    }

    /// The oldest queued items, at most [`MAX_BATCH`].
    fn take_batch(&self) -> Vec<T> {
        let mut queue = self.queue.borrow_mut();
        let n = queue.len().min(MAX_BATCH);
        queue.drain(..n).collect()
    }

    /// The next batch: what is queued (at most [`MAX_BATCH`]), or, when
    /// nothing is, what the tasks of the turn that wakes it queued.
    async fn next_batch(&self) -> Vec<T> {
        loop {
            let batch = self.take_batch();
            if !batch.is_empty() {
                return batch;
            }
            self.ready.notified().await;
        }
    }

    /// Moves queued items to `to` in batches until the other side is gone.
    /// The task wakes after the tasks that queued, so a turn's items go in
    /// one message.
    async fn drain_into(self: Rc<Self>, to: ConnectedSender<Vec<T>>) {
        loop {
            let batch = self.next_batch().await;
            self.messages.set(self.messages.get() + 1);
            if to.send(batch).await.is_err() {
                return;
            }
        }
    }
}

impl Outbox<Feed> {
    /// Queues a feed item for a hub. The Raft loop never waits for a hub,
    /// so a hub that falls behind (its core busy, its fan-out slow) would
    /// let this queue grow with every write; at [`MAX_QUEUED_FEED`] items
    /// what is queued collapses into one `Restored` at its newest revision
    /// instead: the hub's watchers then re-read those events from history,
    /// as after a snapshot install (etcd's answer to watchers that cannot
    /// keep up), and a compaction past them cancels them with its revision.
    fn push_feed(&self, item: &Feed) {
        {
            let mut queue = self.queue.borrow_mut();
            if queue.len() >= MAX_QUEUED_FEED {
                if !self.overflowed.replace(true) {
                    eprintln!(
                        "metcd: a watch hub fell {} feed items behind; its watchers re-read \
                         from history (logged once per hub)",
                        queue.len()
                    );
                }
                collapse_feed(&mut queue);
            }
            queue.push(item.clone());
        }
        self.ready.notify();
    }
}

/// Feed items queued for one hub before they collapse into a resync.
const MAX_QUEUED_FEED: usize = 8192;

/// Replaces queued events by one `Restored` at the newest revision they
/// reach; a subscription's `Base` (its first item) stays in front.
fn collapse_feed(queue: &mut Vec<Feed>) {
    let revision = queue.iter().map(Feed::revision).max().unwrap_or(0);
    queue.retain(|item| matches!(item, Feed::Base { .. }));
    queue.push(Feed::Restored { revision });
}

/// A non-owner shard's link to the owner.
pub struct Remote {
    to_owner: Rc<Outbox<(u64, Command)>>,
    /// The owner's published read view: ranges are read here.
    view: std::sync::Arc<ReadView>,
    waiting: RefCell<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: Cell<u64>,
    /// Slots for requests waiting for a reply ([`MAX_IN_FLIGHT`]).
    in_flight: glommio::sync::Semaphore,
}

impl Remote {
    /// Connects this shard's ends of a link to the owner and starts the
    /// tasks that carry requests out and replies back.
    async fn start(
        requests: SharedSender<Vec<(u64, Command)>>,
        replies: SharedReceiver<Vec<(u64, Reply)>>,
        view: std::sync::Arc<ReadView>,
        max_in_flight: usize,
    ) -> Rc<Remote> {
        let remote = Rc::new(Remote {
            to_owner: Outbox::new(),
            view,
            waiting: RefCell::new(HashMap::new()),
            next_id: Cell::new(0),
            in_flight: glommio::sync::Semaphore::new(max_in_flight as u64),
        });
        let requests = requests.connect().await;
        glommio::spawn_local(remote.to_owner.clone().drain_into(requests)).detach();
        let replies = replies.connect().await;
        glommio::spawn_local(remote.clone().dispatch_replies(replies)).detach();
        remote
    }

    async fn call(&self, cmd: Command) -> Reply {
        let Ok(_slot) = self.in_flight.acquire_permit(1).await else {
            return stopped();
        };
        let id = self.next_id.get().wrapping_add(1);
        self.next_id.set(id);
        let (tx, rx) = oneshot::channel();
        self.waiting.borrow_mut().insert(id, tx);
        // If the caller goes away (connection closed) before the reply, the
        // entry must not stay behind.
        let _forget = Forget { remote: self, id };
        self.to_owner.push((id, cmd));
        rx.await.unwrap_or_else(|_| stopped())
    }

    async fn dispatch_replies(self: Rc<Self>, replies: ConnectedReceiver<Vec<(u64, Reply)>>) {
        while let Some(batch) = replies.recv().await {
            let mut waiting = self.waiting.borrow_mut();
            for (id, reply) in batch {
                if let Some(tx) = waiting.remove(&id) {
                    let _ = tx.send(reply);
                }
            }
        }
        // The owner is gone: fail everything still waiting.
        self.waiting.borrow_mut().clear();
    }
}

struct Forget<'a> {
    remote: &'a Remote,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.remote.waiting.borrow_mut().remove(&self.id);
    }
}

fn stopped() -> Reply {
    Reply::Write(Err(ServerError::Stopped), 0)
}

/// The owner's end of one remote shard's link: each request runs as a task
/// of its own; replies go back batched.
async fn serve_remote(
    node: Rc<Node>,
    requests: ConnectedReceiver<Vec<(u64, Command)>>,
    replies: ConnectedSender<Vec<(u64, Reply)>>,
) {
    let outbox = Outbox::new();
    glommio::spawn_local(outbox.clone().drain_into(replies)).detach();
    while let Some(batch) = requests.recv().await {
        for (id, cmd) in batch {
            let node = node.clone();
            let outbox = outbox.clone();
            glommio::spawn_local(async move {
                let reply = execute(&node, cmd).await;
                outbox.push((id, reply));
            })
            .detach();
        }
    }
}

type Channel<T> = (SharedSender<Vec<(u64, T)>>, SharedReceiver<Vec<(u64, T)>>);

struct Link {
    requests: Channel<Command>,
    replies: Channel<Reply>,
}

/// Number of executors: `--shards`, or every CPU of the set but one
/// (without `--cpus`, no more than the CPUs the process may use, cgroup
/// quota included). More shards than CPUs in the set is refused: two
/// pinned executors on one CPU take turns at the scheduler's pace.
///
/// The spare core is for the work a shard cannot do itself: the kernel's
/// I/O completions and loopback delivery, the checkpoint thread, and the
/// clients and sidecars that share small machines (a 2-vCPU control-plane
/// VM runs the API server next to its store). Measured on 2 vCPUs with the
/// load client beside the server (docs/benchmarks.md): one shard beat two
/// on every etcd benchmark case, +20 % puts and +36 % ranges at 1000
/// clients, because two shards plus the client oversubscribe the cores and
/// every request that lands on the non-owner shard pays a cross-core hop.
pub fn shard_count(cfg: &Config, cpus: &[usize]) -> Result<usize> {
    if cfg.shards == 0 {
        let usable = match cfg.cpus {
            Some(_) => cpus.len(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        return Ok(default_shards(usable.min(cpus.len())));
    }
    if cfg.shards > cpus.len() {
        return Err(ServerError::Startup(format!(
            "--shards {} needs {} CPUs, but the CPU set has {} ({}): lower --shards, or give \
             the member more CPUs (--cpus, taskset -c, systemd's CPUAffinity=)",
            cfg.shards,
            cfg.shards,
            cpus.len(),
            format_cpu_list(cpus)
        )));
    }
    Ok(cfg.shards)
}

/// Whether the owner shard accepts client connections: as configured, by
/// default only below 3 shards (from 3 on, the owner's core is worth more
/// running the group alone than serving a third or less of the clients).
fn owner_accepts_clients(cfg: &Config, shards: usize) -> Result<bool> {
    let accepts = cfg.owner_accepts_clients.unwrap_or(shards < 3);
    if !accepts && shards < 2 {
        return Err(ServerError::Startup(
            "--owner-accepts-clients false needs --shards 2 or more: with one shard nothing \
             else would accept clients"
                .into(),
        ));
    }
    Ok(accepts)
}

/// The CPUs shards are pinned to: `--cpus`, which must lie inside the
/// process's affinity, or else that affinity.
pub fn cpu_set(cfg: &Config) -> Result<Vec<usize>> {
    let allowed = allowed_cpus();
    let Some(list) = &cfg.cpus else {
        return Ok(allowed);
    };
    let cpus = crate::config::parse_cpu_list(list)
        .map_err(|reason| ServerError::Startup(format!("--cpus {list}: {reason}")))?;
    if let Some(cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
        return Err(ServerError::Startup(format!(
            "--cpus {list}: CPU {cpu} is not one this process may run on ({})",
            format_cpu_list(&allowed)
        )));
    }
    Ok(cpus)
}

/// `cpus` (ascending) in taskset's list syntax: `0-3,8,10-11`.
fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while let Some(&first) = cpus.get(i) {
        let mut last = first;
        while cpus.get(i + 1) == Some(&(last + 1)) {
            last += 1;
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if first == last {
            out.push_str(&first.to_string());
        } else {
            out.push_str(&format!("{first}-{last}"));
        }
        i += 1;
    }
    out
}

/// The CPUs this process may run on (its affinity mask), in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills it for this process and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        (0..(libc::CPU_SETSIZE as usize).min(crate::config::MAX_CPUS))
            .filter(|cpu| libc::CPU_ISSET(*cpu, &set))
            .collect()
    }
}

fn default_shards(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// Starts every shard and blocks until they exit (they serve forever unless
/// start-up fails, in which case the process exits with the error).
pub fn run(mut cfg: Config) -> Result<()> {
    let cpus = cpu_set(&cfg)?;
    let shards = shard_count(&cfg, &cpus)?;
    let owner_accepts_clients = owner_accepts_clients(&cfg, shards)?;
    crate::api::grpc::metrics::init(shards, cfg.metrics == "extensive");
    let addrs = cfg
        .http_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let grpc_addrs = cfg
        .client_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let metrics_addrs = cfg
        .metrics_listen_addrs()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    for addr in addrs
        .iter()
        .copied()
        .chain(grpc_addrs.iter().filter_map(crate::net::Endpoint::tcp))
        .chain(metrics_addrs.iter().filter_map(|(e, _)| e.tcp()))
    {
        probe_port(addr)?;
    }
    let _lock = crate::node::lock_data_dir(&cfg.data_dir())?;
    crate::tls::auto_tls(&mut cfg).map_err(ServerError::Startup)?;
    let (cluster_id, member_id) = crate::node::resolve_identity(&cfg)?;
    let client_tls = match cfg.client_tls_files() {
        Some(files) => Some(crate::tls::client_url_acceptor(&files).map_err(ServerError::Startup)?),
        None => None,
    };
    let member = member_info(&cfg, cluster_id, member_id);
    let read_view = std::sync::Arc::new(ReadView::new(member.auth_enabled.clone()));
    let listeners = Listeners {
        client_tls,
        cert_users: cfg.client_cert_auth,
        max_concurrent_streams: cfg.max_concurrent_streams,
        gateway_request_limit: cfg.gateway_request_limit(),
        http: addrs
            .iter()
            .copied()
            .map(crate::net::Endpoint::Tcp)
            .collect(),
        grpc: grpc_addrs.clone(),
        metrics: metrics_addrs,
        lone_listener_shard: if owner_accepts_clients {
            OWNER_SHARD
        } else {
            OWNER_SHARD + 1
        },
        http_limits: HttpLimits {
            max_request_bytes: cfg.max_request_bytes,
            auth_enabled: member.auth_enabled.clone(),
        },
        member,
        // etcd accepts gRPC messages up to --max-request-bytes plus 512 KiB
        // of overhead, then checks the request itself against the limit.
        max_grpc_message_bytes: cfg.max_request_bytes + GRPC_OVERHEAD_BYTES,
        election_timeout: Duration::from_millis(cfg.election_timeout),
        read_view,
        binding: BindingShards::new(if owner_accepts_clients {
            shards
        } else {
            shards - 1
        }),
    };
    let mut owner_side = Vec::new();
    let mut remote_side = Vec::new();
    for _ in 1..shards {
        let link = Link {
            requests: shared_channel::new_bounded(LINK_CAPACITY),
            replies: shared_channel::new_bounded(LINK_CAPACITY),
        };
        let (events_tx, events_rx) = shared_channel::new_bounded::<Vec<Feed>>(CHANNEL_CAPACITY);
        owner_side.push((link.requests.1, link.replies.0, events_tx));
        remote_side.push((link.requests.0, link.replies.1, events_rx));
    }
    let progress_every = cfg
        .watch_progress_notify_interval()
        .map_err(|e| ServerError::Startup(e.to_string()))?;
    let mut handles = Vec::new();
    // Shard i on the i-th CPU of the set, so `--cpus`, `taskset`,
    // systemd's `CPUAffinity=` or a cgroup's cpuset choose the cores
    // (shard_count checked there are enough).
    let placement = |shard: usize| match cpus.get(shard) {
        Some(cpu) => Placement::Fixed(*cpu),
        None => Placement::Unbound,
    };
    let owner_cfg = cfg.clone();
    let owner_listeners = listeners.clone();
    let owner = LocalExecutorBuilder::new(placement(OWNER_SHARD))
        .name("metcd-shard-0")
        .io_memory(cfg.io_memory_bytes)
        .spin_before_park(Duration::from_micros(cfg.spin_before_park_us))
        .spawn(move || async move {
            crate::sched::install(owner_cfg.range_cpu_shares);
            let bound = owner_accepts_clients.then(|| bind_all(&owner_listeners, OWNER_SHARD));
            owner_listeners.binding.wait_until_all_bound().await;
            let node = match Node::start(&owner_cfg).await {
                Ok(node) => node,
                Err(e) => {
                    eprintln!("metcd: cannot start: {e}");
                    std::process::exit(1);
                }
            };
            node.share_auth_flag(owner_listeners.member.auth_enabled.clone());
            node.share_read_view(owner_listeners.read_view.clone());
            let hub = WatchHub::new(
                owner_listeners.header_ids(),
                owner_listeners.http_limits.max_request_bytes,
            );
            node.subscribe_events(feed_in_watch_queue(hub.clone()));
            for (requests, replies, events) in owner_side {
                let requests = requests.connect().await;
                let replies = replies.connect().await;
                glommio::spawn_local(serve_remote(node.clone(), requests, replies)).detach();
                node.subscribe_events(forward_events(events.connect().await));
            }
            spawn_progress_notifier(hub.clone(), progress_every);
            let backend = Backend::Local(node);
            spawn_watch_resync(hub.clone(), backend.clone());
            if let Some(bound) = bound {
                serve_all(bound, &owner_listeners, OWNER_SHARD, backend, hub).await;
            } else {
                // The owner's core runs only the group; the other shards
                // accept every connection.
                glommio::timer::sleep(Duration::from_secs(u64::MAX / 4)).await;
            }
        })
        .map_err(|e| ServerError::Startup(format!("starting shard 0: {e}")))?;
    handles.push(owner);
    for (i, (requests, replies, events)) in remote_side.into_iter().enumerate() {
        let shard = i + 1;
        let listeners = listeners.clone();
        let range_cpu_shares = cfg.range_cpu_shares;
        let handle = LocalExecutorBuilder::new(placement(shard))
            .name(&format!("metcd-shard-{shard}"))
            .io_memory(cfg.io_memory_bytes)
            .spin_before_park(Duration::from_micros(cfg.spin_before_park_us))
            .spawn(move || async move {
                crate::sched::install(range_cpu_shares);
                let bound = bind_all(&listeners, shard);
                let remote = Remote::start(
                    requests,
                    replies,
                    listeners.read_view.clone(),
                    MAX_IN_FLIGHT,
                )
                .await;
                let hub = WatchHub::new(
                    listeners.header_ids(),
                    listeners.http_limits.max_request_bytes,
                );
                let events = events.connect().await;
                let feed = hub.clone();
                crate::sched::spawn_watch_fanout(async move {
                    while let Some(batch) = events.recv().await {
                        feed_batch(&feed, &batch).await;
                    }
                });
                spawn_progress_notifier(hub.clone(), progress_every);
                let backend = Backend::Remote(remote);
                spawn_watch_resync(hub.clone(), backend.clone());
                serve_all(bound, &listeners, shard, backend, hub).await;
            })
            .map_err(|e| ServerError::Startup(format!("starting shard {shard}: {e}")))?;
        handles.push(handle);
    }
    let list = |a: &[crate::net::Endpoint]| {
        a.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "metcd: {shards} shard(s); etcd gRPC API on {}; HTTP API on {}",
        list(&grpc_addrs),
        list(&listeners.http)
    );
    for h in handles {
        h.join()
            .map_err(|e| ServerError::Startup(format!("shard exited: {e}")))?;
    }
    Ok(())
}

/// SO_REUSEPORT would let us share a port with another process by accident,
/// and the kernel would hand it some of our connections: probe first without
/// it, so a busy port is a clear error. A member killed a moment ago can
/// still hold its listener for a little while (io_uring tears rings down
/// asynchronously), so a busy port is retried for a few seconds first.
fn probe_port(addr: std::net::SocketAddr) -> Result<()> {
    crate::net::retry_while_in_use(|| std::net::TcpListener::bind(addr))
        .map(drop)
        .map_err(|e| ServerError::Startup(format!("cannot listen on {addr}: {e}")))
}

/// What every shard listens on.
#[derive(Clone)]
struct Listeners {
    http: Vec<crate::net::Endpoint>,
    grpc: Vec<crate::net::Endpoint>,
    /// `--listen-metrics-urls`, each with whether it is https://.
    metrics: Vec<(crate::net::Endpoint, bool)>,
    /// The shard that serves what one listener alone may take: the Unix
    /// sockets among the client URLs (one socket file) and the metrics
    /// URLs (little traffic). The client URLs' TCP ports are every shard's.
    lone_listener_shard: usize,
    http_limits: HttpLimits,
    member: MemberInfo,
    max_grpc_message_bytes: usize,
    /// How often leader-requiring streams check for a leader.
    election_timeout: Duration,
    /// `--cert-file`: every client URL connection is TLS.
    client_tls: Option<futures_rustls::TlsAcceptor>,
    /// `--client-cert-auth`: a request without a token is the user its
    /// client certificate's common name names (etcd's AuthInfoFromTLS).
    cert_users: bool,
    /// `--max-concurrent-streams`, per client connection.
    max_concurrent_streams: u32,
    /// The JSON gateway's requests in flight in the member, all together
    /// (`Config::gateway_request_limit`).
    gateway_request_limit: u32,
    /// The owner's published read view ([`crate::read_view`]).
    read_view: std::sync::Arc<ReadView>,
    /// The shards still binding their client listeners.
    binding: BindingShards,
}

/// Counts the shards that have not bound their listeners yet. The owner
/// starts its member only once every shard has: the member's start-up
/// publish prints the lines that tools wait for ("ready to serve client
/// requests", and etcd's e2e harness waits for "published"). A client
/// that saw those lines must never find the port closed: it connects, and
/// the connection waits in the backlog until the shard serves (etcd too
/// listens before its server starts).
#[derive(Clone)]
struct BindingShards(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl BindingShards {
    fn new(shards: usize) -> BindingShards {
        BindingShards(std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(
            shards,
        )))
    }

    fn one_bound(&self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Shards start in parallel threads: a few milliseconds at most.
    async fn wait_until_all_bound(&self) {
        while self.0.load(std::sync::atomic::Ordering::Acquire) > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
    }
}

const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

impl Listeners {
    fn header_ids(&self) -> HeaderIds {
        HeaderIds {
            cluster_id: self.member.cluster_id,
            member_id: self.member.member_id,
        }
    }
}

fn member_info(cfg: &Config, cluster_id: u64, member_id: u64) -> MemberInfo {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect()
    };
    MemberInfo {
        name: cfg.name.clone(),
        cluster_id,
        member_id,
        peer_urls: split(&cfg.initial_advertise_peer_urls),
        client_urls: split(
            cfg.advertise_client_urls
                .as_deref()
                .unwrap_or(&cfg.listen_client_urls),
        ),
        max_txn_ops: cfg.max_txn_ops,
        bcrypt_cost: cfg.bcrypt_cost,
        auth_enabled: Default::default(),
    }
}

/// The owner's end of a remote shard's event feed: the Raft loop only
/// enqueues (never waits for another core); a task moves what each turn
/// queued across as one message.
fn forward_events(to_shard: ConnectedSender<Vec<Feed>>) -> EventSubscriber {
    let outbox = Outbox::new();
    glommio::spawn_local(outbox.clone().drain_into(to_shard)).detach();
    Box::new(move |item| outbox.push_feed(item))
}

/// The owner's own hub, fed in this shard's watch fan-out queue
/// ([`crate::sched`]): the Raft loop only enqueues, so matching events
/// against many watchers never lengthens its turn.
fn feed_in_watch_queue(hub: Rc<WatchHub>) -> EventSubscriber {
    let outbox: Rc<Outbox<Feed>> = Outbox::new();
    let queued = outbox.clone();
    crate::sched::spawn_watch_fanout(async move {
        loop {
            feed_batch(&hub, &queued.next_batch().await).await;
        }
    });
    Box::new(move |item| outbox.push_feed(item))
}

/// Feeds `batch` to `hub` in order, letting the other queues run after it
/// if its time is up.
async fn feed_batch(hub: &WatchHub, batch: &[Feed]) {
    for item in batch {
        hub.feed(item);
    }
    glommio::yield_if_needed().await;
}

/// After this member installed a leader's snapshot, its watchers re-read
/// the history they missed from the new store: one read over every key
/// from the oldest revision any of them needs. Watchers whose next
/// revision was compacted away are cancelled with the compact revision,
/// as etcd cancels a watcher that fell behind compaction.
fn spawn_watch_resync(hub: Rc<WatchHub>, backend: Backend) {
    glommio::spawn_local(async move {
        loop {
            let mut pending = hub.take_resync().await;
            while let Some(from) = pending.iter().map(|claim| claim.from).min() {
                let (history, _) = backend
                    .watch_history(
                        bytes::Bytes::from_static(b"\0"),
                        bytes::Bytes::from_static(b"\0"),
                        from,
                    )
                    .await;
                match history {
                    Ok((events, upto)) => {
                        for claim in pending.drain(..) {
                            hub.finish_resync(&claim, &events, upto);
                        }
                    }
                    Err(ServerError::Mvcc(mvcc::MvccError::Compacted)) => {
                        let compacted = match backend.call(Command::CompactRevision).await {
                            Reply::CompactRevision(rev) => rev,
                            _ => i64::MAX,
                        };
                        let before = pending.len();
                        pending.retain(|claim| {
                            if claim.from < compacted {
                                hub.cancel_compacted(claim.id.0, claim.id.1, compacted);
                                false
                            } else {
                                true
                            }
                        });
                        if pending.len() == before {
                            // Only a compaction racing this read: retry
                            // without spinning the core.
                            glommio::timer::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    Err(e) => {
                        // The owner is stopping; nothing to resync into.
                        eprintln!("metcd: watch resync after a snapshot failed: {e}");
                        break;
                    }
                }
            }
        }
    })
    .detach();
}

fn spawn_progress_notifier(hub: Rc<WatchHub>, every: Option<Duration>) {
    if let Some(every) = every {
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(every).await;
                hub.notify_progress();
            }
        })
        .detach();
    }
}

/// How often a shard asks the owner whether it may serve, at start.
const SERVING_POLL: Duration = Duration::from_millis(20);

/// What one shard listens on, bound but not served yet.
struct BoundListeners {
    http: Vec<crate::net::Listener>,
    grpc: Vec<crate::net::Listener>,
    /// Each with whether it is https://.
    metrics: Vec<(crate::net::Listener, bool)>,
}

/// Binds this shard's listeners (exits the process if one cannot be
/// bound, as at start) and counts the shard as bound.
fn bind_all(listeners: &Listeners, shard: usize) -> BoundListeners {
    use crate::net::{Endpoint, Listener, PortSharing};
    let bind = |endpoint: &Endpoint, sharing| match Listener::bind(endpoint, sharing) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("metcd: cannot listen on {endpoint}: {e}");
            std::process::exit(1);
        }
    };
    let lone = shard == listeners.lone_listener_shard;
    let http_listeners: Vec<_> = (listeners.http.iter())
        .map(|endpoint| bind(endpoint, PortSharing::EveryShard))
        .collect();
    let grpc_listeners: Vec<_> = (listeners.grpc.iter())
        .filter(|endpoint| matches!(endpoint, Endpoint::Tcp(_)) || lone)
        .map(|endpoint| bind(endpoint, PortSharing::EveryShard))
        .collect();
    let metrics_listeners: Vec<_> = (listeners.metrics.iter())
        .filter(|_| lone)
        .map(|(endpoint, https)| (bind(endpoint, PortSharing::Exclusive), *https))
        .collect();
    listeners.binding.one_bound();
    BoundListeners {
        http: http_listeners,
        grpc: grpc_listeners,
        metrics: metrics_listeners,
    }
}

async fn serve_all(
    bound: BoundListeners,
    listeners: &Listeners,
    shard: usize,
    backend: Backend,
    hub: Rc<WatchHub>,
) {
    let mut tasks = Vec::new();
    // As etcd: listening at once (connections wait in the backlog), serving
    // once this member has applied its start-up publish (node,
    // publish_attributes). Polled: once per start, on every shard.
    while !matches!(backend.call(Command::Serving).await, Reply::Serving(true)) {
        glommio::timer::sleep(SERVING_POLL).await;
    }
    for (listener, https) in bound.metrics {
        let tls = if https {
            listeners.client_tls.clone()
        } else {
            None
        };
        tasks.push(glommio::spawn_local(http::serve_metrics(
            listener,
            backend.clone(),
            tls,
        )));
    }
    for listener in bound.http {
        tasks.push(glommio::spawn_local(http::serve(
            listener,
            backend.clone(),
            listeners.http_limits.clone(),
        )));
    }
    let (router, gateway) = Router::new(
        Services::new(backend.clone(), hub, listeners.member.clone()),
        listeners.max_grpc_message_bytes,
        LeaderGuard::start(backend.clone(), listeners.election_timeout),
        backend.clone(),
        crate::api::grpc::metrics::ShardCounters::of_shard(shard),
        listeners.gateway_request_limit,
    );
    for listener in bound.grpc {
        tasks.push(glommio::spawn_local(grpc_serve(
            listener,
            router.clone(),
            gateway.clone(),
            backend.clone(),
            listeners.client_tls.clone(),
            listeners.cert_users,
            listeners.max_concurrent_streams,
        )));
    }
    for t in tasks {
        t.await;
    }
    // Never reached while serving; keep the executor alive otherwise.
    glommio::timer::sleep(Duration::from_secs(u64::MAX / 4)).await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    fn events_at(revision: i64) -> Feed {
        let event = mvcc::Event {
            kind: mvcc::EventKind::Put,
            kv: mvcc::KeyValue {
                key: bytes::Bytes::from_static(b"k"),
                mod_revision: revision,
                ..Default::default()
            },
            prev_kv: None,
            prev_kv_unread: false,
        };
        Feed::Events(std::sync::Arc::from(vec![event]))
    }

    fn revision_of(item: &Feed) -> (char, i64) {
        match item {
            Feed::Events(batch) => ('e', batch[0].kv.mod_revision),
            Feed::Restored { revision } => ('r', *revision),
            Feed::Base { revision } => ('b', *revision),
        }
    }

    /// A hub that stops taking its feed holds at most MAX_QUEUED_FEED
    /// items: the oldest collapse into one resync at the newest revision
    /// they reached, the subscription's base stays first, and what comes
    /// after follows in order.
    #[test]
    fn a_stalled_feed_collapses_into_a_resync_instead_of_growing() {
        let outbox: Rc<Outbox<Feed>> = Outbox::new();
        outbox.push_feed(&Feed::Base { revision: 1 });
        let mut longest = 0;
        for revision in 2..(2 * MAX_QUEUED_FEED as i64 + 100) {
            outbox.push_feed(&events_at(revision));
            longest = longest.max(outbox.queue.borrow().len());
        }
        assert!(longest <= MAX_QUEUED_FEED + 1, "{longest}");
        let queue: Vec<(char, i64)> = outbox.queue.borrow().iter().map(revision_of).collect();
        assert_eq!(queue[0], ('b', 1));
        // Collapsed twice; the second resync covers everything before it.
        let (kind, through) = queue[1];
        assert_eq!(kind, 'r');
        let live: Vec<i64> = queue[2..]
            .iter()
            .map(|(k, r)| {
                assert_eq!(*k, 'e');
                *r
            })
            .collect();
        assert_eq!(live.first(), Some(&(through + 1)));
        assert_eq!(live.last(), Some(&(2 * MAX_QUEUED_FEED as i64 + 99)));
        assert!(live.windows(2).all(|w| w[1] == w[0] + 1));
    }

    /// A member of its own on this executor, serving, with `keys` keys
    /// under `k/`.
    async fn member_with_keys(cfg: &Config, keys: usize) -> Backend {
        let node = Node::start(cfg).await.unwrap();
        while !node.serving() {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        let backend = Backend::Local(node);
        let puts: Vec<_> = (0..keys)
            .map(|i| {
                mvcc::RequestOp::Put(mvcc::PutRequest {
                    key: bytes::Bytes::from(format!("k/{i:06}")),
                    value: bytes::Bytes::from_static(b"v"),
                    ..mvcc::PutRequest::default()
                })
            })
            .collect();
        for ops in puts.chunks(cfg.max_txn_ops) {
            let txn = mvcc::TxnRequest {
                success: ops.to_vec(),
                ..mvcc::TxnRequest::default()
            };
            let reply = backend
                .call(Command::Write(mvcc::Request::Txn(txn), None))
                .await;
            assert!(matches!(reply, Reply::Write(Ok(_), _)), "{reply:?}");
        }
        backend
    }

    /// A range's index walk runs in slices in the reads queue: work the
    /// write path has ready meanwhile runs between two slices, not after
    /// the whole walk. (A count-only range loads no values: the walk is
    /// all its work, and without slices it is one synchronous call.)
    #[test]
    fn a_range_walk_lets_ready_write_path_work_run_between_slices() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            data_dir: Some(dir.path().to_path_buf()),
            listen_peer_urls: Some("http://127.0.0.1:0".into()),
            ..Config::default()
        };
        let keys = 5 * RANGE_WALK_SLICE;
        LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(async move {
                crate::sched::install(cfg.range_cpu_shares);
                let backend = member_with_keys(&cfg, keys).await;
                // Write-path work that is always ready again after a short
                // turn (as a connection with requests queued): it counts
                // its turns.
                let turns = Rc::new(Cell::new(0u64));
                let stop = Rc::new(Cell::new(false));
                let ticker = glommio::spawn_local({
                    let (turns, stop) = (turns.clone(), stop.clone());
                    async move {
                        while !stop.get() {
                            turns.set(turns.get() + 1);
                            glommio::executor().yield_task_queue_now().await;
                        }
                    }
                });
                let req = mvcc::RangeRequest {
                    key: bytes::Bytes::from_static(b"k/"),
                    range_end: bytes::Bytes::from_static(b"k0"),
                    // Every key answered: a walk key by key (a count alone
                    // takes whole leaves of the index at a time).
                    keys_only: true,
                    serializable: true,
                    ..mvcc::RangeRequest::default()
                };
                let seen = turns.clone();
                let (reply, turns_during_walk) = crate::sched::off_the_write_path(async move {
                    let before = seen.get();
                    let reply = backend.range(req, None).await;
                    (reply, seen.get() - before)
                })
                .await
                .unwrap();
                stop.set(true);
                ticker.await;
                let (response, _) = reply;
                assert_eq!(response.unwrap().count, keys as i64);
                assert!(
                    turns_during_walk >= 1,
                    "the write path never ran during a walk of {keys} keys"
                );
            });
    }

    /// A fake owner on an executor of its own: counts the request
    /// messages and items it gets until `answer_until` items (answering
    /// each batch with one batch of `Reply::Leader(7)`), or, with `None`,
    /// answers nothing and counts until nothing came for 300 ms.
    fn fake_owner(
        requests: SharedReceiver<Vec<(u64, Command)>>,
        replies: SharedSender<Vec<(u64, Reply)>>,
        answer_until: Option<usize>,
    ) -> glommio::ExecutorJoinHandle<(usize, usize)> {
        LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                let requests = requests.connect().await;
                let replies = replies.connect().await;
                let (mut messages, mut items) = (0, 0);
                let quiet = Duration::from_millis(300);
                while let Ok(Some(batch)) =
                    glommio::timer::timeout(quiet, async { Ok(requests.recv().await) }).await
                {
                    messages += 1;
                    items += batch.len();
                    let Some(until) = answer_until else {
                        continue;
                    };
                    let answers = batch.into_iter().map(|(id, _)| (id, Reply::Leader(7)));
                    replies.send(answers.collect()).await.unwrap();
                    if items >= until {
                        break;
                    }
                }
                (messages, items)
            })
            .unwrap()
    }

    /// A burst of requests from a shard crosses to the owner in far fewer
    /// messages than requests, and every caller gets its own reply.
    #[test]
    fn a_burst_of_requests_crosses_in_few_messages() {
        const BURST: usize = 2_000;
        let (req_tx, req_rx) = shared_channel::new_bounded(LINK_CAPACITY);
        let (rep_tx, rep_rx) = shared_channel::new_bounded(LINK_CAPACITY);
        let owner = fake_owner(req_rx, rep_tx, Some(BURST));
        let (sent_messages, answered) = LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(async move {
                let view = std::sync::Arc::new(ReadView::new(Default::default()));
                let remote = Remote::start(req_tx, rep_rx, view, MAX_IN_FLIGHT).await;
                let calls: Vec<_> = (0..BURST)
                    .map(|_| {
                        let remote = remote.clone();
                        glommio::spawn_local(async move { remote.call(Command::Leader).await })
                    })
                    .collect();
                let mut answered = 0;
                for call in calls {
                    if matches!(call.await, Reply::Leader(7)) {
                        answered += 1;
                    }
                }
                (remote.to_owner.messages.get(), answered)
            });
        let (messages, items) = owner.join().unwrap();
        assert_eq!(answered, BURST);
        assert_eq!(items, BURST);
        assert_eq!(messages as u64, sent_messages);
        // 2,000 requests queued in one turn: ceil(2000 / MAX_BATCH) = 8.
        assert!(
            messages <= BURST.div_ceil(MAX_BATCH) + 2,
            "{messages} messages"
        );
    }

    /// An owner that answers nothing holds at most the link's bound of a
    /// shard's requests: later callers wait for a slot, nothing piles up.
    #[test]
    fn a_slow_owner_makes_callers_wait_and_the_link_stays_bounded() {
        const BOUND: usize = 64;
        const CALLERS: usize = 3 * BOUND;
        let (req_tx, req_rx) = shared_channel::new_bounded(LINK_CAPACITY);
        let (rep_tx, rep_rx) = shared_channel::new_bounded(LINK_CAPACITY);
        let owner = fake_owner(req_rx, rep_tx, None);
        let (waiting, queued, slots_left) = LocalExecutorBuilder::new(Placement::Unbound)
            .make()
            .unwrap()
            .run(async move {
                let view = std::sync::Arc::new(ReadView::new(Default::default()));
                let remote = Remote::start(req_tx, rep_rx, view, BOUND).await;
                let calls: Vec<_> = (0..CALLERS)
                    .map(|_| {
                        let remote = remote.clone();
                        glommio::spawn_local(async move { remote.call(Command::Leader).await })
                    })
                    .collect();
                // Let every caller run and the outbox drain (bounded).
                for _ in 0..50 {
                    glommio::timer::sleep(Duration::from_millis(2)).await;
                }
                let seen = (
                    remote.waiting.borrow().len(),
                    remote.to_owner.queue.borrow().len(),
                    remote.in_flight.available(),
                );
                drop(calls);
                seen
            });
        let (_, items) = owner.join().unwrap();
        assert_eq!(items, BOUND, "the owner got exactly the bound");
        assert_eq!(waiting, BOUND, "callers past the bound wait for a slot");
        assert_eq!(queued, 0);
        assert_eq!(slots_left, 0);
    }

    #[test]
    fn cpu_lists_print_as_taskset_writes_them() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn the_owner_stops_accepting_clients_from_three_shards_unless_told() {
        let cfg = |accepts| Config {
            owner_accepts_clients: accepts,
            ..Config::default()
        };
        assert!(owner_accepts_clients(&cfg(None), 1).unwrap());
        assert!(owner_accepts_clients(&cfg(None), 2).unwrap());
        assert!(!owner_accepts_clients(&cfg(None), 3).unwrap());
        assert!(owner_accepts_clients(&cfg(Some(true)), 7).unwrap());
        assert!(!owner_accepts_clients(&cfg(Some(false)), 2).unwrap());
        assert!(owner_accepts_clients(&cfg(Some(false)), 1).is_err());
    }

    #[test]
    fn more_shards_than_cpus_are_refused() {
        let cfg = |shards, cpus: Option<&str>| Config {
            shards,
            cpus: cpus.map(str::to_string),
            ..Config::default()
        };
        assert_eq!(
            shard_count(&cfg(0, Some("0-7")), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap(),
            7
        );
        assert_eq!(
            shard_count(&cfg(3, Some("0-7")), &[0, 1, 2, 3, 4, 5, 6, 7]).unwrap(),
            3
        );
        assert_eq!(shard_count(&cfg(2, None), &[4, 6]).unwrap(), 2);
        let refused = shard_count(&cfg(3, None), &[4, 6]).unwrap_err().to_string();
        assert!(
            refused.contains("--shards 3 needs 3 CPUs, but the CPU set has 2 (4,6)"),
            "{refused}"
        );
    }

    #[test]
    fn the_default_leaves_one_core_to_the_rest_of_the_machine() {
        assert_eq!(default_shards(1), 1);
        assert_eq!(default_shards(2), 1);
        assert_eq!(default_shards(3), 2);
        assert_eq!(default_shards(16), 15);
    }
}
