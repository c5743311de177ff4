//! This process's member of the cluster: who it is, what it knows of the
//! other members, how it reaches them, and whether it serves. There is one
//! per process, however many Raft groups it runs (docs/groups.md): the
//! groups hold it by `Rc` and change it only by applying group 0's
//! membership entries.
//!
//! Must never: hold anything of one group's log or store (those are the
//! [`super::Node`]'s).

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::members::{MemberRecord, Registry};
use crate::peer::Transport;

pub(super) struct Member {
    /// This member's ID (its Raft ID in every group), derived as etcd
    /// derives it.
    pub(super) id: u64,
    pub(super) cluster_id: u64,
    /// The cluster's members as the applied log has them.
    pub(super) registry: RefCell<Registry>,
    /// The attributes this member publishes through the log.
    pub(super) my_attrs: MemberRecord,
    pub(super) transport: Rc<Transport>,
    /// etcd's `--strict-reconfig-check`: membership changes that would
    /// risk the quorum are refused.
    pub(super) strict_reconfig: bool,
    /// This start's publish has been applied: client listeners serve.
    pub(super) serving: Cell<bool>,
    /// When this member started to stop (SIGTERM/SIGINT, crate::stop).
    pub(super) stopping_since: Cell<Option<Instant>>,
    /// How long a stopping leader waits for its successor (two election
    /// timeouts, as etcd bounds its transfer on stop).
    pub(super) stop_transfer_limit: Duration,
    /// This member was removed from the cluster: it stops.
    pub(super) removed: Cell<bool>,
    /// Members removed from the cluster (kept in MVCC metadata under
    /// `removed/<id>`): their peer connections are refused as removed.
    pub(super) removed_members: RefCell<HashSet<u64>>,
}
