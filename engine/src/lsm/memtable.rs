//! The lsm engine's memtable: a lock-free skiplist of versions keyed by
//! (user key, sequence descending), written by the single owner and read by
//! any number of snapshots at once.
//!
//! It owns the versions written since its creation and the bookkeeping a
//! flush needs (approximate size, the applied index and last sequence of the
//! newest batch it holds). It must never remove a version: a memtable is
//! immutable once rotated out, and is dropped whole when its flushed table
//! replaces it in every version that referenced it.

use std::cmp::Ordering as CmpOrdering;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use crossbeam_skiplist::SkipMap;

use super::format::{cmp_internal, Entry, EntryIter};
use crate::Result;

/// Bytes charged per version on top of key and value, for the skiplist
/// node and our key struct; keeps the size estimate honest for tiny keys.
const VERSION_OVERHEAD_BYTES: usize = 48;

pub(crate) struct InternalKey {
    pub key: Bytes,
    pub seq: u64,
}

impl PartialEq for InternalKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl Eq for InternalKey {}
impl PartialOrd for InternalKey {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for InternalKey {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        cmp_internal(&self.key, self.seq, &other.key, other.seq)
    }
}

type Map = SkipMap<InternalKey, Option<Bytes>>;

pub(crate) struct Memtable {
    /// Rotation order: a larger id holds newer writes.
    pub id: u64,
    map: Map,
    approx_bytes: AtomicUsize,
    /// Applied index after the newest batch written here (or, while empty,
    /// the engine's applied index when this memtable was created).
    applied_index: AtomicU64,
    /// Sequence of the newest batch written here (or the engine's last
    /// sequence when created).
    last_seq: AtomicU64,
    /// Whether any batch (even one carrying only an applied index) landed
    /// here: only then does `persist` need to rotate and flush it.
    dirty: AtomicBool,
}

impl Memtable {
    pub fn new(id: u64, applied_index: u64, last_seq: u64) -> Memtable {
        Memtable {
            id,
            map: SkipMap::new(),
            approx_bytes: AtomicUsize::new(0),
            applied_index: AtomicU64::new(applied_index),
            last_seq: AtomicU64::new(last_seq),
            dirty: AtomicBool::new(false),
        }
    }

    /// Inserts one version. Only the engine's single writer calls this, and
    /// publishes `seq` to readers only after the whole batch is in.
    pub fn insert(&self, key: Bytes, seq: u64, value: Option<Bytes>) {
        let size = key.len() + value.as_ref().map_or(0, Bytes::len) + VERSION_OVERHEAD_BYTES;
        self.map.insert(InternalKey { key, seq }, value);
        self.approx_bytes.fetch_add(size, Ordering::Relaxed);
    }

    /// Records the batch just written: its sequence and applied index.
    pub fn note_batch(&self, seq: u64, applied_index: u64) {
        self.last_seq.store(seq, Ordering::Release);
        self.applied_index.store(applied_index, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
    }

    pub fn approx_bytes(&self) -> usize {
        self.approx_bytes.load(Ordering::Relaxed)
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index.load(Ordering::Acquire)
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq.load(Ordering::Acquire)
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The newest version of `key` with a sequence <= `seq`: `Some(None)`
    /// is a tombstone, `None` means this memtable knows nothing of it.
    pub fn get(&self, key: &[u8], seq: u64) -> Option<Option<Bytes>> {
        // Spares the probe key's allocation on a fresh memtable (the
        // common case right after a rotation or persist).
        if self.map.is_empty() {
            return None;
        }
        let probe = InternalKey {
            key: Bytes::copy_from_slice(key),
            seq,
        };
        let entry = self.map.lower_bound(Bound::Included(&probe))?;
        (entry.key().key == key).then(|| entry.value().clone())
    }

    /// Every version from the first key at/after `start`, in internal order.
    pub fn iter(&self, start: Bound<&[u8]>) -> MemIter<'_> {
        let lower = match start {
            Bound::Unbounded => Bound::Unbounded,
            Bound::Included(k) => Bound::Included(InternalKey {
                key: Bytes::copy_from_slice(k),
                seq: u64::MAX,
            }),
            // Sequence 0 sorts after every real version of `k` (sequences
            // start at 1), so excluding it excludes all of `k`.
            Bound::Excluded(k) => Bound::Excluded(InternalKey {
                key: Bytes::copy_from_slice(k),
                seq: 0,
            }),
        };
        let mut range = self.map.range((lower, Bound::Unbounded));
        let cur = range.next().map(|e| to_entry(&e));
        MemIter { range, cur }
    }
}

type Range<'a> = crossbeam_skiplist::map::Range<
    'a,
    InternalKey,
    (Bound<InternalKey>, Bound<InternalKey>),
    InternalKey,
    Option<Bytes>,
>;

fn to_entry(e: &crossbeam_skiplist::map::Entry<'_, InternalKey, Option<Bytes>>) -> Entry {
    Entry {
        key: e.key().key.clone(),
        seq: e.key().seq,
        value: e.value().clone(),
    }
}

pub(crate) struct MemIter<'a> {
    range: Range<'a>,
    cur: Option<Entry>,
}

impl EntryIter for MemIter<'_> {
    fn current(&self) -> Option<&Entry> {
        self.cur.as_ref()
    }

    fn advance(&mut self) -> Result<()> {
        self.cur = self.range.next().map(|e| to_entry(&e));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn reads_newest_version_at_or_below_sequence() {
        let m = Memtable::new(1, 0, 0);
        m.insert(b("k"), 1, Some(b("v1")));
        m.insert(b("k"), 3, None);
        m.insert(b("k"), 5, Some(b("v5")));
        assert_eq!(m.get(b"k", 0), None);
        assert_eq!(m.get(b"k", 2), Some(Some(b("v1"))));
        assert_eq!(m.get(b"k", 4), Some(None));
        assert_eq!(m.get(b"k", 9), Some(Some(b("v5"))));
        assert_eq!(m.get(b"j", 9), None);
    }

    #[test]
    fn iterates_from_included_and_excluded_starts() {
        let m = Memtable::new(1, 0, 0);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            m.insert(b(k), i as u64 + 1, Some(b(k)));
            m.insert(b(k), i as u64 + 10, None);
        }
        let keys = |mut it: MemIter<'_>| {
            let mut out = Vec::new();
            while let Some(e) = it.current() {
                out.push((e.key.clone(), e.seq));
                it.advance().unwrap();
            }
            out
        };
        assert_eq!(
            keys(m.iter(Bound::Included(b"b"))),
            vec![(b("b"), 11), (b("b"), 2), (b("c"), 12), (b("c"), 3)]
        );
        assert_eq!(
            keys(m.iter(Bound::Excluded(b"b"))),
            vec![(b("c"), 12), (b("c"), 3)]
        );
        assert_eq!(keys(m.iter(Bound::Unbounded)).len(), 6);
    }
}
