//! What the clients did and saw: every operation with its invoke and return
//! times and its outcome, every watcher's events, and each member's final
//! state. Plain data: the workload fills it, the checks only read it.
//!
//! Every value the workload writes is unique in the run (client id and a
//! sequence number), so a value names the write that put it: that is what
//! lets the checks match a watch event, a read or an unanswered write to
//! one operation.

use std::collections::BTreeMap;

/// Position of an operation in [`History::ops`].
pub type OpId = usize;
/// A value the workload wrote, unique in the run.
pub type ValueId = u64;
/// A lease ID as etcd hands it out (0: no lease).
pub type LeaseId = i64;

/// Nanoseconds since the run started (one monotonic clock for all clients).
pub type Nanos = u64;

/// The value id written as the key's value on the wire.
pub fn encode_value(value: ValueId) -> String {
    format!("v{value}")
}

/// The value id a stored value names; None for bytes the workload never
/// writes (itself an anomaly).
pub fn decode_value(bytes: &[u8]) -> Option<ValueId> {
    std::str::from_utf8(bytes)
        .ok()?
        .strip_prefix('v')?
        .parse()
        .ok()
}

/// A key's stored version as a read or an event shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kv {
    pub value: ValueId,
    pub mod_revision: i64,
    pub lease: LeaseId,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Put {
        key: String,
        value: ValueId,
        lease: LeaseId,
    },
    Get {
        key: String,
        serializable: bool,
    },
    /// A `Txn`: if the key holds `expect` (None: absent), put `value`;
    /// otherwise get the key. With `mod_revision`, the compare is on the
    /// key's mod_revision (that of the read that saw `expect`) rather than
    /// its value: the same condition, since values are unique.
    Cas {
        key: String,
        expect: Option<ValueId>,
        mod_revision: Option<i64>,
        value: ValueId,
        lease: LeaseId,
    },
    Delete {
        key: String,
    },
    LeaseGrant {
        ttl_s: i64,
    },
    LeaseRevoke {
        lease: LeaseId,
    },
}

impl Request {
    /// The key a single-key request reads or writes.
    pub fn key(&self) -> Option<&str> {
        match self {
            Request::Put { key, .. }
            | Request::Get { key, .. }
            | Request::Cas { key, .. }
            | Request::Delete { key } => Some(key),
            Request::LeaseGrant { .. } | Request::LeaseRevoke { .. } => None,
        }
    }

    /// The value this request may write.
    pub fn written_value(&self) -> Option<ValueId> {
        match self {
            Request::Put { value, .. } | Request::Cas { value, .. } => Some(*value),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Request::Put { .. } => "put",
            Request::Get {
                serializable: false,
                ..
            } => "get",
            Request::Get {
                serializable: true, ..
            } => "get-serializable",
            Request::Cas {
                mod_revision: None, ..
            } => "cas-value",
            Request::Cas { .. } => "cas-mod-revision",
            Request::Delete { .. } => "delete",
            Request::LeaseGrant { .. } => "lease-grant",
            Request::LeaseRevoke { .. } => "lease-revoke",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Put {
        revision: i64,
    },
    Get {
        revision: i64,
        kv: Option<Kv>,
    },
    /// `current` is the else branch's read when the compare failed.
    Cas {
        revision: i64,
        succeeded: bool,
        current: Option<Kv>,
    },
    Delete {
        revision: i64,
        deleted: i64,
    },
    LeaseGrant {
        revision: i64,
        lease: LeaseId,
    },
    LeaseRevoke {
        revision: i64,
    },
}

impl Response {
    /// The response header's revision.
    pub fn revision(&self) -> i64 {
        match self {
            Response::Put { revision }
            | Response::Get { revision, .. }
            | Response::Cas { revision, .. }
            | Response::Delete { revision, .. }
            | Response::LeaseGrant { revision, .. }
            | Response::LeaseRevoke { revision } => *revision,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Response),
    /// A definite refusal (etcd said no): it took no effect.
    Failed(String),
    /// No answer or a transport error: it may or may not have taken effect.
    Unknown(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub client: u32,
    /// The member slot the client sent it to.
    pub member: usize,
    /// Which member held the slot when it was sent (a membership change
    /// replaces a slot's member with a new one).
    pub incarnation: u32,
    pub invoke: Nanos,
    pub ret: Nanos,
    pub request: Request,
    pub outcome: Outcome,
}

impl Op {
    pub fn ok(&self) -> Option<&Response> {
        match &self.outcome {
            Outcome::Ok(r) => Some(r),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub revision: i64,
    pub key: String,
    pub kind: EventKind,
    /// The put's key-value (None for a delete).
    pub kv: Option<Kv>,
    /// prev_kv as the watch delivered it.
    pub prev: Option<Kv>,
}

/// One watcher's stream from revision 1, across reconnections (each resumes
/// after the last revision it delivered).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchRecord {
    pub member: usize,
    /// Events in delivery order, each with the response (batch) it came in.
    pub events: Vec<(u64, Event)>,
    /// Streams that broke and were resumed.
    pub resumed: u32,
}

impl WatchRecord {
    /// The last revision delivered (0: none).
    pub fn last_revision(&self) -> i64 {
        self.events.last().map_or(0, |(_, e)| e.revision)
    }
}

/// A member's store at the end, after faults healed and members converged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FinalState {
    pub member: usize,
    pub revision: i64,
    pub kvs: BTreeMap<String, Kv>,
    /// HashKV at the revision all members reached (None: not asked).
    pub hash: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub ops: Vec<Op>,
    pub watches: Vec<WatchRecord>,
    pub finals: Vec<FinalState>,
}

/// Milliseconds, for evidence that a person reads.
pub fn ms(t: Nanos) -> String {
    format!("{:.3}s", t as f64 / 1e9)
}

impl History {
    /// One line about operation `id`, for an anomaly's evidence.
    pub fn describe(&self, id: OpId) -> String {
        let Some(op) = self.ops.get(id) else {
            return format!("op #{id} (none)");
        };
        let outcome = match &op.outcome {
            Outcome::Ok(r) => format!("ok {r:?}"),
            Outcome::Failed(e) => format!("failed ({e})"),
            Outcome::Unknown(e) => format!("unknown ({e})"),
        };
        format!(
            "op #{id} client {} on member {} [{} .. {}] {:?} -> {outcome}",
            op.client,
            op.member,
            ms(op.invoke),
            ms(op.ret),
            op.request
        )
    }
}
