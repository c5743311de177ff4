//! MVCC: etcd v3's revisioned key/value semantics over an [`engine::Engine`].
//!
//! This module owns the meaning of the key space: revisions, versions,
//! generations, tombstones, compaction, txn compare/branch rules, range
//! sorting/limits, and the byte formats of the Raft log payload and of the
//! engine keys it writes (see [`store`] for the engine layout and
//! [`codec`] for the log format). It replicates etcd 3.4/3.5 behaviour
//! exactly, quirks included, because clients depend on it.
//!
//! It must never touch the runtime (no glommio, no I/O of its own), Raft,
//! leases' liveness or auth: it is synchronous code driven by the apply
//! loop, deterministic so that every replica produces the same bytes, and
//! total (no panic) on any request.
//!
//! - [`types`]: the request/response/event types (etcd's protobuf shapes).
//! - [`codec`]: [`encode`]/[`decode`] of a [`Request`] for the Raft log.
//! - [`MvccStore`]: `open`, `apply` (write path), `range`/`read_txn` (reads).
//! - [`validate_txn`] & co: etcd's API-layer checks done before proposing.

pub mod codec;
mod error;
pub mod index_checkpoint;
mod key_index;
pub mod store;
pub mod types;
mod validate;

pub use codec::{decode, decode_shared, encode, DecodeError, MAX_TXN_DEPTH};
pub use error::MvccError;
pub use index_checkpoint::{CheckpointError, IndexCheckpointPlan};
pub use store::{
    ChunkedRange, Chunking, DecodedIndexCheckpoint, HashPlan, HistoryWalk, IndexSource, MvccStore,
    OpCounts, RangePlan, RangeStart, RangeWalk, StoreReader,
};
pub use types::*;
pub use validate::{
    is_txn_readonly, validate_delete_range, validate_put, validate_range, validate_txn,
};
