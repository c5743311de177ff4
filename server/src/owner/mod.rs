//! The owner protocol: everything a shard asks of its Raft group's owner
//! core, each question with its own typed answer. A question from the
//! owner's own core runs at once; from another core it crosses the
//! shard's link ([`link`]) as a job that runs on the owner, and its answer
//! comes back the same way. Reads run on the asking shard against the
//! owner's published read view and ask the owner only for their gate
//! ([`reads`]).
//!
//! Owns: the list of questions (the methods of [`Backend`]) and how each
//! is answered on the owner. Must never: run a question's work anywhere
//! but on the owner's core, or hand an answer to its asker on another
//! core than the asker's.

pub(crate) mod link;
mod reads;

use std::future::Future;
use std::rc::Rc;

use crate::error::{Result, ServerError};
use crate::members::MemberRecord;
use crate::mvcc;
use crate::node::{Caller, Node, NodeStatus};

pub use link::Remote;
pub use reads::{RangeRead, Snapshot, RANGE_LOAD_CHUNK, RANGE_WALK_SLICE};

/// How a shard reaches the group: directly on the owner core, through its
/// link elsewhere.
#[derive(Clone)]
pub enum Backend {
    Local(Rc<Node>),
    Remote(Rc<Remote<Node>>),
}

/// What a membership change answers.
#[derive(Debug)]
pub struct MemberChange {
    /// The member added (MemberAdd, the HTTP API's replace).
    pub added: Option<MemberRecord>,
    pub members: Vec<MemberRecord>,
}

/// Maintenance Status' view of this member.
#[derive(Debug)]
pub struct StatusReport {
    pub status: NodeStatus,
    pub healthy: bool,
    pub db_size: engine::EngineSize,
    pub alarms: Vec<crate::alarm::AlarmMember>,
}

/// A lease query's answer with the store revision and the Raft term it
/// was answered at (etcd's response header).
#[derive(Debug)]
pub struct LeaseAnswer<T> {
    pub answer: T,
    pub revision: i64,
    pub term: u64,
}

/// A lease's remaining TTL, granted TTL and keys.
pub type LeaseTtl = (i64, i64, Vec<bytes::Bytes>);

impl Backend {
    /// Runs `work` with the owner's node on the owner's core: at once
    /// here, or across the link ([`Remote::ask`]).
    async fn ask<T, F, Fut>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Node>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        match self {
            Backend::Local(node) => Ok(work(node.clone()).await),
            Backend::Remote(remote) => remote.ask(work).await,
        }
    }

    /// [`Backend::ask`] for work that may fail, with the Raft term its
    /// answer was produced in (etcd's response headers).
    async fn ask_termed<T, F, Fut>(&self, work: F) -> Result<(T, u64)>
    where
        T: Send + 'static,
        F: FnOnce(Rc<Node>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
    {
        self.ask(move |node| async move {
            let answer = work(node.clone()).await?;
            Ok((answer, node.status().term))
        })
        .await?
    }

    /// A client's write by the caller behind `token` (checked on the owner
    /// before it is proposed, and by every member when it applies).
    pub async fn write(
        &self,
        req: mvcc::Request,
        token: Option<String>,
    ) -> Result<(mvcc::Response, u64)> {
        self.ask_termed(move |node| async move {
            node.write(req, Caller::Client(token.as_deref())).await
        })
        .await
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
        let requirement = requirement();
        self.ask(move |node| async move { node.authorize(token.as_deref(), || requirement) })
            .await?
    }

    /// Maintenance HashKV at `revision`.
    pub async fn hash_kv(&self, revision: i64) -> Result<(mvcc::HashKv, u64)> {
        self.ask_termed(move |node| async move { node.hash_kv(revision).await })
            .await
    }

    /// Maintenance Hash: (hash, revision).
    pub async fn hash(&self) -> Result<((u32, i64), u64)> {
        self.ask_termed(|node| async move { node.hash_all().await })
            .await
    }

    /// LeaseGrant: (lease id, granted TTL, revision).
    pub async fn lease_grant(&self, id: i64, ttl: i64) -> Result<((i64, i64, i64), u64)> {
        self.ask_termed(move |node| async move { node.lease_grant(id, ttl).await })
            .await
    }

    /// LeaseRevoke by the caller behind `token`: the revision of the
    /// deletes.
    pub async fn lease_revoke(&self, id: i64, token: Option<String>) -> Result<(i64, u64)> {
        self.ask_termed(move |node| async move {
            node.lease_revoke(id, Caller::Client(token.as_deref()))
                .await
        })
        .await
    }

    /// LeaseKeepAlive: the TTL after it, `None` for an unknown lease. The
    /// leader's lessor is the only one whose clock counts: a follower
    /// forwards it, as etcd does.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<LeaseAnswer<Option<i64>>> {
        self.ask(move |node| async move {
            let ttl = if node.leads_leases() {
                node.lease_keepalive(id)
            } else {
                match node
                    .forward_lease(crate::peer::PeerQuery::KeepAlive(id))
                    .await?
                {
                    crate::peer::PeerAnswer::KeepAlive(ttl) => ttl,
                    _ => return Err(ServerError::NotLeader),
                }
            };
            Ok(lease_answer(&node, ttl))
        })
        .await?
    }

    /// LeaseTimeToLive: `None` for an unknown lease; forwarded by a
    /// follower to the leader as a keep-alive is.
    pub async fn lease_time_to_live(&self, id: i64) -> Result<LeaseAnswer<Option<LeaseTtl>>> {
        self.ask(move |node| async move {
            let found = if node.leads_leases() {
                node.lease_time_to_live(id)
            } else {
                match node
                    .forward_lease(crate::peer::PeerQuery::TimeToLive(id))
                    .await?
                {
                    crate::peer::PeerAnswer::TimeToLive(found) => {
                        found.map(|(remaining, granted, keys)| {
                            let keys = keys.into_iter().map(bytes::Bytes::from).collect();
                            (remaining, granted, keys)
                        })
                    }
                    _ => return Err(ServerError::NotLeader),
                }
            };
            Ok(lease_answer(&node, found))
        })
        .await?
    }

    /// LeaseLeases: every lease's ID.
    pub async fn leases(&self) -> Result<LeaseAnswer<Vec<i64>>> {
        self.ask(|node| async move { lease_answer(&node, node.leases()) })
            .await
    }

    /// A backup file for the Maintenance Snapshot stream: (file, bytes),
    /// to stream and then delete.
    pub async fn backup(&self) -> Result<(std::path::PathBuf, u64)> {
        self.ask(|node| async move { node.write_backup().await })
            .await?
    }

    /// Maintenance Defragment.
    pub async fn defragment(&self) -> Result<()> {
        self.ask(|node| async move { node.defragment().await })
            .await?
    }

    /// The store's compact revision now (not the status refreshed per loop
    /// turn).
    pub async fn compact_revision(&self) -> Result<i64> {
        self.ask(|node| async move { node.compact_revision() })
            .await
    }

    /// Maintenance Status: the status of the last loop turn, health, the
    /// store's size and the active alarms.
    pub async fn status(&self) -> Result<StatusReport> {
        self.ask(|node| async move {
            StatusReport {
                status: node.status(),
                healthy: node.is_healthy(),
                db_size: node.db_size(),
                alarms: node.active_alarms(),
            }
        })
        .await
    }

    /// The leader this member knows (0: none), from the status of the last
    /// loop turn; cheaper than [`Backend::status`] (no alarm list, no
    /// engine size).
    pub async fn leader(&self) -> Result<u64> {
        self.ask(|node| async move { node.status().leader }).await
    }

    /// Whether this member serves clients yet (it has applied its own
    /// start-up publish).
    pub async fn serving(&self) -> Result<bool> {
        self.ask(|node| async move { node.serving() }).await
    }

    /// The Prometheus `/metrics` page: etcd's families (the client URL's
    /// `/metrics`), then metcd's own (added on the HTTP API's).
    pub async fn metrics(&self) -> Result<(String, String)> {
        self.ask(|node| async move { node.metrics_page() }).await
    }

    /// Maintenance Alarm (through the log): the alarms after it.
    pub async fn alarm(
        &self,
        req: crate::alarm::AlarmRequest,
    ) -> Result<Vec<crate::alarm::AlarmMember>> {
        self.ask(move |node| async move { node.alarm(req).await })
            .await?
    }

    /// MemberList.
    pub async fn members(&self) -> Result<(Vec<MemberRecord>, u64)> {
        self.ask(|node| async move { (node.members(), node.status().term) })
            .await
    }

    /// MemberAdd.
    pub async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<(MemberChange, u64)> {
        self.ask_termed(move |node| async move {
            with_added(node.member_add(peer_urls, is_learner).await)
        })
        .await
    }

    /// metcd's joint-consensus replacement of a voter (HTTP admin API).
    pub async fn member_replace(
        &self,
        old: u64,
        peer_urls: Vec<String>,
    ) -> Result<(MemberChange, u64)> {
        self.ask_termed(
            move |node| async move { with_added(node.member_replace(old, peer_urls).await) },
        )
        .await
    }

    /// MemberRemove.
    pub async fn member_remove(&self, id: u64) -> Result<(MemberChange, u64)> {
        self.ask_termed(move |node| async move { members_only(node.member_remove(id).await) })
            .await
    }

    /// MemberPromote. Only the leader knows how far a learner got: a
    /// follower asks it, as etcd does.
    pub async fn member_promote(&self, id: u64) -> Result<(MemberChange, u64)> {
        self.ask_termed(move |node| async move {
            if node.is_leader() {
                return members_only(node.member_promote(id).await);
            }
            match node
                .forward_lease(crate::peer::PeerQuery::Promote(id))
                .await?
            {
                crate::peer::PeerAnswer::Promoted(Ok(members)) => members_only(Ok(members)),
                crate::peer::PeerAnswer::Promoted(Err(message)) => {
                    Err(ServerError::from_forwarded(&message))
                }
                _ => Err(ServerError::NotLeader),
            }
        })
        .await
    }

    /// MemberUpdate.
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<(MemberChange, u64)> {
        self.ask_termed(
            move |node| async move { members_only(node.member_update(id, peer_urls).await) },
        )
        .await
    }

    /// Maintenance MoveLeader.
    pub async fn move_leader(&self, target: u64) -> Result<((), u64)> {
        self.ask_termed(move |node| async move { node.move_leader(target).await })
            .await
    }

    /// An auth change through the log by the caller behind `token`: its
    /// answer, the term and the store revision (etcd's response header).
    pub async fn auth_change(
        &self,
        token: Option<String>,
        req: crate::auth::AuthRequest,
    ) -> Result<(crate::auth::AuthApplied, u64, i64)> {
        self.ask(move |node| async move {
            let applied = node.auth_change(token.as_deref(), &req).await?;
            let status = node.status();
            Ok((applied, status.term, status.revision))
        })
        .await?
    }

    /// A read of the auth state by the caller behind `token`, with the
    /// term and the store revision.
    pub async fn auth_query(
        &self,
        token: Option<String>,
        query: crate::auth::AuthQuery,
    ) -> Result<(crate::auth::AuthAnswer, u64, i64)> {
        self.ask(move |node| async move {
            let status = node.status();
            let answer = node.auth_query(token.as_deref(), &query)?;
            Ok((answer, status.term, status.revision))
        })
        .await?
    }
}

fn lease_answer<T>(node: &Node, answer: T) -> LeaseAnswer<T> {
    let status = node.status();
    LeaseAnswer {
        answer,
        revision: status.revision,
        term: status.term,
    }
}

fn with_added(change: Result<(MemberRecord, Vec<MemberRecord>)>) -> Result<MemberChange> {
    change.map(|(added, members)| MemberChange {
        added: Some(added),
        members,
    })
}

fn members_only(members: Result<Vec<MemberRecord>>) -> Result<MemberChange> {
    members.map(|members| MemberChange {
        added: None,
        members,
    })
}
