//! The owner's published read view: what any shard needs to serve a range
//! or a read-only txn without the owner core walking anything for it.
//!
//! The owner publishes a [`StoreReader`] of its current store (at start and
//! whenever a snapshot install replaces the store), whether it is the only
//! voter, and its Raft term. A shard then serves a read in two steps:
//!
//! 1. the **gate**, on the owner only when it has something to decide: a
//!    linearizable read on a member with other voters waits for a ReadIndex
//!    round there, and with auth on the caller's permission is checked
//!    there (after the round, so a permission revoked before the read began
//!    is never outrun). A serializable read, or any read on a single-voter
//!    member, with auth off, never reaches the owner: every acknowledged
//!    write is applied, and its changes are visible under the store's read
//!    lock, before its reply leaves.
//! 2. the **walk**, here: the key index in slices under the store's read
//!    lock, the values from the engine snapshot taken with it.
//!
//! So the owner spends O(1) per read (nothing, or one gate), however many
//! keys the read covers. A watcher's history is read the same way, without
//! a gate (its permission is checked when it is created; a watch is never
//! linearizable), a slice of key revisions at a time.
//!
//! Must never: hold the store's lock across an await (a walk slice is
//! synchronous), or be the only place a reader is kept (the owner's store
//! stays the authority).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use engine::any::AnyEngine;

use crate::mvcc::StoreReader;

/// Shared by the owner (who writes it) and every shard (who read it).
#[derive(Debug)]
pub struct ReadView {
    reader: Mutex<Option<StoreReader<AnyEngine>>>,
    solo: AtomicBool,
    term: AtomicU64,
    /// Whether auth is on (the owner's apply keeps it): reads then pass the
    /// gate for their permission check.
    auth_enabled: Arc<AtomicBool>,
}

impl ReadView {
    pub fn new(auth_enabled: Arc<AtomicBool>) -> ReadView {
        ReadView {
            reader: Mutex::new(None),
            solo: AtomicBool::new(false),
            term: AtomicU64::new(0),
            auth_enabled,
        }
    }

    /// The owner publishes its store (at start and after an install).
    pub fn publish(&self, reader: StoreReader<AnyEngine>) {
        *self.reader.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader);
    }

    /// The store to read; `None` only before the owner has started.
    pub fn reader(&self) -> Option<StoreReader<AnyEngine>> {
        self.reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn set_solo(&self, solo: bool) {
        self.solo.store(solo, Ordering::Release);
    }

    pub fn set_term(&self, term: u64) {
        self.term.store(term, Ordering::Release);
    }

    /// The Raft term for a response header that did not pass the owner.
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// Whether a read must pass the owner's gate (see the module docs).
    pub fn needs_gate(&self, linearizable: bool) -> bool {
        (linearizable && !self.solo.load(Ordering::Acquire))
            || self.auth_enabled.load(Ordering::Acquire)
    }
}
