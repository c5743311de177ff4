//! The server crate's error type. Mapped to the wire in exactly one place,
//! `api::error`.

use crate::mvcc::MvccError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error(transparent)]
    Mvcc(#[from] MvccError),
    #[error(transparent)]
    Engine(#[from] engine::Error),
    #[error(transparent)]
    Lease(#[from] crate::lease::LeaseError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    /// The store reached `--quota-backend-bytes` or a NOSPACE alarm is on.
    #[error("etcdserver: mvcc: database space exceeded")]
    NoSpace,
    /// A CORRUPT alarm is on.
    #[error("etcdserver: corrupt cluster")]
    Corrupt,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("etcdserver: request timed out")]
    Timeout,
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error("etcdserver: not leader")]
    NotLeader,
    #[error("etcdserver: rpc not supported for learner")]
    NotSupportedForLearner,
    /// A membership change etcd refuses, with etcd's message.
    #[error("{0}")]
    Membership(&'static str),
    /// The client sent something we cannot parse (bad key encoding, bad
    /// query parameter, ...).
    #[error("{0}")]
    BadRequest(String),
    /// Start-up problems: the message tells the operator what to do.
    #[error("{0}")]
    Startup(String),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error(transparent)]
    Decode(#[from] crate::raftlog::DecodeError),
}

/// etcd's membership messages the leader can answer a forwarded request with.
const MEMBERSHIP_MESSAGES: &[&str] = &[
    "etcdserver: can only promote a learner member which is in sync with leader",
    "etcdserver: can only promote a learner member",
    "etcdserver: member not found",
];

impl ServerError {
    /// The error behind a message the leader sent back for a forwarded
    /// request (same code and text as if it had happened here).
    pub fn from_forwarded(message: &str) -> ServerError {
        if let Some(m) = MEMBERSHIP_MESSAGES.iter().find(|m| **m == message) {
            return ServerError::Membership(m);
        }
        match message {
            "etcdserver: not leader" => ServerError::NotLeader,
            "etcdserver: request timed out" => ServerError::Timeout,
            "etcdserver: no leader" => ServerError::NoLeader,
            "etcdserver: mvcc: database space exceeded" => ServerError::NoSpace,
            "etcdserver: corrupt cluster" => ServerError::Corrupt,
            other => ServerError::BadRequest(other.to_string()),
        }
    }
}

impl From<crate::alarm::Refusal> for ServerError {
    fn from(r: crate::alarm::Refusal) -> Self {
        match r {
            crate::alarm::Refusal::NoSpace => ServerError::NoSpace,
            crate::alarm::Refusal::Corrupt => ServerError::Corrupt,
        }
    }
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;
