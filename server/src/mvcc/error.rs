//! MVCC's error type.
//!
//! `Display` strings are etcd's own server-side messages. What an etcd
//! *client* sees (v3rpc `rpctypes`) sometimes differs: the API layer should
//! send [`MvccError::client_message`] with the gRPC code below.
//!
//! | variant         | gRPC code        | client-visible message (`rpctypes`)                        |
//! |-----------------|------------------|------------------------------------------------------------|
//! | `Compacted`     | OutOfRange       | `etcdserver: mvcc: required revision has been compacted`   |
//! | `FutureRevision`| OutOfRange       | `etcdserver: mvcc: required revision is a future revision` |
//! | `KeyNotFound`   | InvalidArgument  | `etcdserver: key not found`                                |
//! | `TooManyOps`    | InvalidArgument  | `etcdserver: too many operations in txn request`           |
//! | `DuplicateKey`  | InvalidArgument  | `etcdserver: duplicate key given in txn request`           |
//! | `EmptyKey`      | InvalidArgument  | `etcdserver: key is not provided`                          |
//! | `ValueProvided` | InvalidArgument  | `etcdserver: value is provided`                            |
//! | `LeaseProvided` | InvalidArgument  | `etcdserver: lease is provided`                            |
//!
//! `Engine` and `Corrupt` are fatal to the member (etcd panics on both);
//! they have no etcd client message.

/// Errors of the MVCC store. User errors ([`MvccError::is_fatal`] false)
/// change no data; fatal ones mean the store must not be used any more.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MvccError {
    #[error("mvcc: required revision has been compacted")]
    Compacted,
    #[error("mvcc: required revision is a future revision")]
    FutureRevision,
    #[error("etcdserver: key not found")]
    KeyNotFound,
    #[error("etcdserver: too many operations in txn request")]
    TooManyOps,
    #[error("etcdserver: duplicate key given in txn request")]
    DuplicateKey,
    #[error("etcdserver: key is not provided")]
    EmptyKey,
    #[error("etcdserver: value is provided")]
    ValueProvided,
    #[error("etcdserver: lease is provided")]
    LeaseProvided,
    /// [`super::MvccStore::read_txn`] was given a txn with write operations.
    #[error("mvcc: txn is not read-only")]
    NotReadOnly,
    #[error("mvcc: engine: {0}")]
    Engine(#[from] engine::Error),
    #[error("mvcc: corrupt data: {0}")]
    Corrupt(String),
}

impl MvccError {
    /// True for errors after which the store's state is unknown (engine
    /// failure, corruption): the member must stop applying.
    pub fn is_fatal(&self) -> bool {
        matches!(self, MvccError::Engine(_) | MvccError::Corrupt(_))
    }

    /// The exact message an etcd client receives for this error (etcd's
    /// `rpctypes.ErrGRPC*`), `None` for fatal/internal errors.
    pub fn client_message(&self) -> Option<&'static str> {
        Some(match self {
            MvccError::Compacted => "etcdserver: mvcc: required revision has been compacted",
            MvccError::FutureRevision => "etcdserver: mvcc: required revision is a future revision",
            MvccError::KeyNotFound => "etcdserver: key not found",
            MvccError::TooManyOps => "etcdserver: too many operations in txn request",
            MvccError::DuplicateKey => "etcdserver: duplicate key given in txn request",
            MvccError::EmptyKey => "etcdserver: key is not provided",
            MvccError::ValueProvided => "etcdserver: value is provided",
            MvccError::LeaseProvided => "etcdserver: lease is provided",
            MvccError::NotReadOnly | MvccError::Engine(_) | MvccError::Corrupt(_) => return None,
        })
    }
}
