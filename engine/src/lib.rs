//! Storage engines for metcd and the write-ahead log.
//!
//! This crate owns bytes on disk and in memory: ordered key/value engines with
//! atomic write batches and consistent snapshot reads ([`Engine`]), the
//! segmented, checksummed WAL with group commit ([`wal`]), and the snapshot
//! file format ([`snapfile`]). It must never know about Raft, MVCC revisions
//! or any wire API: keys and values are opaque bytes, and the only piece of
//! replication state it stores is the *applied index*, an opaque `u64` that
//! is persisted atomically with the data it describes (etcd's
//! `consistent_index`).
//!
//! Only [`wal`] and [`snapfile`]'s writer touch the glommio runtime (io_uring,
//! direct I/O). The on-disk engines ([`btree`], [`lsm`]) do their direct I/O
//! through [`io`], which owns its own small io_uring rings and needs no
//! runtime, so a simulation or a plain thread can drive them.

pub mod any;
pub mod btree;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod io;
pub mod lsm;
pub mod memory;
pub mod snapfile;
pub mod wal;

use std::ops::Bound;

use bytes::Bytes;

pub use error::{Error, Result};
pub use memory::MemoryEngine;

/// One mutation inside a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOp {
    Put { key: Bytes, value: Bytes },
    Delete { key: Bytes },
}

/// A set of mutations applied atomically: a snapshot sees all of them or none.
///
/// A batch may also carry the applied index it brings the engine to; the
/// engine persists that index together with the data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<BatchOp>,
    applied_index: Option<u64>,
}

impl WriteBatch {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        Self {
            ops: Vec::with_capacity(n),
            applied_index: None,
        }
    }

    pub fn put(&mut self, key: Bytes, value: Bytes) {
        self.ops.push(BatchOp::Put { key, value });
    }

    pub fn delete(&mut self, key: Bytes) {
        self.ops.push(BatchOp::Delete { key });
    }

    /// Records the applied index this batch brings the engine to.
    pub fn set_applied_index(&mut self, index: u64) {
        self.applied_index = Some(index);
    }

    pub fn applied_index(&self) -> Option<u64> {
        self.applied_index
    }

    pub fn ops(&self) -> &[BatchOp] {
        &self.ops
    }

    pub fn into_ops(self) -> Vec<BatchOp> {
        self.ops
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.applied_index.is_none()
    }

    pub fn clear(&mut self) {
        self.ops.clear();
        self.applied_index = None;
    }
}

/// What a scan callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    Continue,
    Stop,
}

/// A consistent, immutable view of an engine at one point in its history.
///
/// Holding a snapshot never blocks writers; writes made after the snapshot
/// was taken are invisible to it. Snapshots are `Send + Sync` so any core can
/// read from them.
pub trait EngineSnapshot: Send + Sync + 'static {
    /// The applied index of the state this snapshot shows.
    fn applied_index(&self) -> u64;

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>>;

    /// [`EngineSnapshot::get`] of every key of `keys`, in order. A disk
    /// engine reads the blocks that many lookups miss together (about one
    /// device round trip per file they lie in, instead of one per block):
    /// for a caller that knows the keys it reads next, e.g. the revisions
    /// of a range's page.
    fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Bytes>>> {
        self.get_ahead(keys, keys.len())
    }

    /// [`EngineSnapshot::get`] of the first `now` keys of `keys`, in order.
    /// The others are the keys the caller reads next: where one of the
    /// first `now` misses the cache, a disk engine reads the blocks of
    /// every key from there on together, as [`EngineSnapshot::get_many`]
    /// does, so that later calls find them cached.
    fn get_ahead<K: AsRef<[u8]>>(&self, keys: &[K], now: usize) -> Result<Vec<Option<Bytes>>> {
        keys.iter()
            .take(now)
            .map(|key| self.get(key.as_ref()))
            .collect()
    }

    /// Visits keys in ascending order from `start` (inclusive) to `end`.
    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan;
}

/// How much room an engine's data takes: what etcd calls the backend's
/// size (`dbSize`) and the part of it live data uses (`dbSizeInUse`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineSize {
    /// Disk engines: their files, plus what was written since the last
    /// persist (an estimate until then). Memory: the live bytes.
    pub total_bytes: u64,
    /// Of that, what live data uses (free pages, obsolete tables not yet
    /// compacted away excluded where the engine knows them).
    pub in_use_bytes: u64,
}

/// An ordered key/value store with atomic batches and snapshot reads.
///
/// Writes come from one owner at a time (the apply loop); reads may come from
/// anywhere through [`Engine::snapshot`].
pub trait Engine: 'static {
    type Snapshot: EngineSnapshot;

    /// Applies `batch` atomically. After it returns, new snapshots see it.
    fn write(&self, batch: WriteBatch) -> Result<()>;

    /// A snapshot of everything written so far.
    fn snapshot(&self) -> Self::Snapshot;

    /// The applied index of the latest write.
    fn applied_index(&self) -> u64;

    /// The applied index that would survive a crash right now without any
    /// log replay (for the memory engine: the index of its last snapshot file).
    fn durable_applied_index(&self) -> u64;

    /// How much room the data takes; cheap (no I/O, at most a short lock).
    fn size(&self) -> EngineSize;

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        self.snapshot().get(key)
    }
}
