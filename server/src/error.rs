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
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    #[error("etcdserver: too many requests")]
    TooManyRequests,
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

pub type Result<T, E = ServerError> = std::result::Result<T, E>;
