//! The in-memory key index: for every key, the ordered revisions at which it
//! was put or deleted since the last compaction (etcd's `treeIndex` /
//! `keyIndex`, flattened: generations are implicit between tombstones).
//!
//! It owns only revision numbers, never values (those stay in the engine),
//! and it must never be the only copy of anything: it is rebuilt from the
//! engine on open. The value of a key visible at revision `R` is the last
//! event with `main <= R`, unless that event is a tombstone.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

/// One event of a key: written at `(main, sub)`; a tombstone is a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rev {
    pub(crate) main: i64,
    pub(crate) sub: u32,
    pub(crate) tombstone: bool,
}

/// A key range as etcd interprets `(key, range_end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyRange<'a> {
    /// `range_end` empty: just `key`.
    Single(&'a [u8]),
    /// `range_end == "\0"`: every key `>= key`.
    From(&'a [u8]),
    /// `[key, range_end)` with `range_end > key`.
    Between(&'a [u8], &'a [u8]),
    /// `range_end <= key` (and not `"\0"`): nothing.
    Empty,
}

impl<'a> KeyRange<'a> {
    pub(crate) fn new(key: &'a [u8], range_end: &'a [u8]) -> Self {
        if range_end.is_empty() {
            KeyRange::Single(key)
        } else if range_end == [0] {
            KeyRange::From(key)
        } else if range_end <= key {
            // Checked here because BTreeMap::range panics on start > end.
            KeyRange::Empty
        } else {
            KeyRange::Between(key, range_end)
        }
    }
}

/// The visible (non-tombstone) event of `revs` at revision `at`.
fn visible(revs: &[Rev], at: i64) -> Option<Rev> {
    let n = revs.partition_point(|r| r.main <= at);
    let r = *revs.get(n.checked_sub(1)?)?;
    (!r.tombstone).then_some(r)
}

/// How many leading events of `revs` no read at a revision `>= at` can reach:
/// all events before the last one with `main <= at`, and that one too if it
/// is a tombstone (etcd's `keyIndex.compact`).
fn garbage_len(revs: &[Rev], at: i64) -> usize {
    let n = revs.partition_point(|r| r.main <= at);
    match n.checked_sub(1).and_then(|i| revs.get(i)) {
        Some(last) if last.tombstone => n,
        Some(_) => n - 1,
        None => 0,
    }
}

/// The creation revision and version of a key's newest event, a put: what
/// the next put of the key needs, known without reading the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Generation {
    pub(crate) created: i64,
    pub(crate) version: i64,
}

impl Generation {
    /// A key's first put, at revision `rev`.
    pub(crate) fn created_at(rev: i64) -> Generation {
        Generation {
            created: rev,
            version: 1,
        }
    }

    /// The generation one more put of the key gives.
    pub(crate) fn next(self) -> Generation {
        Generation {
            version: self.version.saturating_add(1),
            ..self
        }
    }
}

/// What the index knows of a key as a put at revision `at` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Newest {
    /// Never written, or deleted: the put creates it.
    Absent,
    /// Its newest event is a put of this generation.
    Put(Generation),
    /// A put whose generation the index does not hold (events loaded at
    /// open, or a rolled-back request): read it from the engine.
    Unknown,
}

#[derive(Debug, Default)]
struct History {
    revs: Vec<Rev>,
    /// Of the newest event in `revs`, when it is a put and known.
    newest: Option<Generation>,
}

#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    keys: BTreeMap<Bytes, History>,
    /// Keys whose newest event is a put (etcd's `keys_total`).
    live: usize,
}

fn is_live(h: &History) -> bool {
    h.revs.last().is_some_and(|r| !r.tombstone)
}

impl KeyIndex {
    /// Number of keys with at least one event (live or not).
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Number of keys that exist now (their newest event is a put).
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The event visible for `key` at revision `at`.
    pub(crate) fn get(&self, key: &[u8], at: i64) -> Option<Rev> {
        visible(&self.keys.get(key)?.revs, at)
    }

    /// The key's newest event as a put at revision `at` sees it. An event
    /// at `at` itself (an earlier change of the same request) is
    /// `Unknown`: the put's watchers compare with the value before the
    /// whole request, which the index does not hold.
    pub(crate) fn newest(&self, key: &[u8], at: i64) -> Newest {
        let Some(h) = self.keys.get(key) else {
            return Newest::Absent;
        };
        match (h.revs.last(), h.newest) {
            (Some(last), _) if last.main >= at => Newest::Unknown,
            (None, _) => Newest::Absent,
            (Some(last), _) if last.tombstone => Newest::Absent,
            (Some(_), Some(g)) => Newest::Put(g),
            (Some(_), None) => Newest::Unknown,
        }
    }

    /// Calls `f` for every key of `range` visible at `at`, in ascending key
    /// order, until `f` returns false.
    pub(crate) fn visit(
        &self,
        range: KeyRange<'_>,
        at: i64,
        mut f: impl FnMut(&Bytes, Rev) -> bool,
    ) {
        let bounds: (Bound<&[u8]>, Bound<&[u8]>) = match range {
            KeyRange::Empty => return,
            KeyRange::Single(key) => {
                if let Some((k, h)) = self.keys.get_key_value(key) {
                    if let Some(r) = visible(&h.revs, at) {
                        f(k, r);
                    }
                }
                return;
            }
            KeyRange::From(key) => (Bound::Included(key), Bound::Unbounded),
            KeyRange::Between(key, end) => (Bound::Included(key), Bound::Excluded(end)),
        };
        for (k, h) in self.keys.range::<[u8], _>(bounds) {
            if let Some(r) = visible(&h.revs, at) {
                if !f(k, r) {
                    return;
                }
            }
        }
    }

    /// Visits the keys of `range` visible at `at` that come after `after`
    /// (from the start when `None`), examining at most `max_keys` keys,
    /// visible or not. Returns the last key examined when the slice ended
    /// before the range did: the `after` of the next slice.
    pub(crate) fn visit_slice(
        &self,
        range: KeyRange<'_>,
        at: i64,
        after: Option<&[u8]>,
        max_keys: usize,
        mut f: impl FnMut(&Bytes, Rev),
    ) -> Option<Bytes> {
        let (start, end): (&[u8], Bound<&[u8]>) = match range {
            KeyRange::Empty => return None,
            KeyRange::Single(key) => {
                if after.is_none() {
                    if let Some((k, h)) = self.keys.get_key_value(key) {
                        if let Some(r) = visible(&h.revs, at) {
                            f(k, r);
                        }
                    }
                }
                return None;
            }
            KeyRange::From(key) => (key, Bound::Unbounded),
            KeyRange::Between(key, end) => (key, Bound::Excluded(end)),
        };
        let start = match after {
            Some(last) => Bound::Excluded(last),
            None => Bound::Included(start),
        };
        let mut keys = self.keys.range::<[u8], _>((start, end)).peekable();
        let mut last = None;
        for _ in 0..max_keys.max(1) {
            let (k, h) = keys.next()?;
            if let Some(r) = visible(&h.revs, at) {
                f(k, r);
            }
            last = Some(k);
        }
        keys.peek().and(last.cloned())
    }

    /// Number of keys of `range` visible at `at`.
    pub(crate) fn count(&self, range: KeyRange<'_>, at: i64) -> i64 {
        let mut n = 0i64;
        self.visit(range, at, |_, _| {
            n += 1;
            true
        });
        n
    }

    /// Records a new event for `key`, with its generation when it is a put
    /// whose creation revision and version the caller knows. Events must
    /// arrive in increasing `(main, sub)` order, which the apply path and
    /// the engine scan in `open` both guarantee.
    pub(crate) fn push(&mut self, key: &[u8], rev: Rev, generation: Option<Generation>) {
        let newest = if rev.tombstone { None } else { generation };
        if let Some(h) = self.keys.get_mut(key) {
            let was_live = is_live(h);
            h.revs.push(rev);
            h.newest = newest;
            match (was_live, rev.tombstone) {
                (false, false) => self.live += 1,
                (true, true) => self.live -= 1,
                _ => {}
            }
        } else {
            if !rev.tombstone {
                self.live += 1;
            }
            // Copy the key: the caller's bytes may be a slice of a whole Raft
            // entry, which the index would otherwise pin for its lifetime.
            self.keys.insert(
                Bytes::copy_from_slice(key),
                History {
                    revs: vec![rev],
                    newest,
                },
            );
        }
    }

    /// Undoes the last [`KeyIndex::push`] for `key` if it was at `main`
    /// (rollback of a failed request).
    pub(crate) fn pop(&mut self, key: &[u8], main: i64) {
        let Some(h) = self.keys.get_mut(key) else {
            return;
        };
        if h.revs.last().is_some_and(|r| r.main == main) {
            let was_live = is_live(h);
            h.revs.pop();
            // The event before is not remembered: the next put reads it.
            h.newest = None;
            match (was_live, is_live(h)) {
                (true, false) => self.live -= 1,
                (false, true) => self.live += 1,
                _ => {}
            }
        }
        if h.revs.is_empty() {
            self.keys.remove(key);
        }
    }

    /// Calls `f` for every event that [`KeyIndex::compact`] at `at` would
    /// drop, without changing anything.
    pub(crate) fn compaction_garbage(&self, at: i64, mut f: impl FnMut(Rev)) {
        for h in self.keys.values() {
            let n = garbage_len(&h.revs, at);
            h.revs.iter().take(n).for_each(|r| f(*r));
        }
    }

    /// Drops every event no read at a revision `>= at` can reach, and keys
    /// left with no event.
    pub(crate) fn compact(&mut self, at: i64) {
        // The newest event always survives (only a tombstone goes, and its
        // key with it), so `newest` stays true.
        self.keys.retain(|_, h| {
            let n = garbage_len(&h.revs, at);
            if n > 0 {
                h.revs.drain(..n);
                // Compaction is rare; give back the memory of long histories.
                h.revs.shrink_to_fit();
            }
            !h.revs.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(main: i64, sub: u32) -> Rev {
        Rev {
            main,
            sub,
            tombstone: false,
        }
    }
    fn del(main: i64, sub: u32) -> Rev {
        Rev {
            main,
            sub,
            tombstone: true,
        }
    }

    #[test]
    fn key_range_rules() {
        assert_eq!(KeyRange::new(b"a", b""), KeyRange::Single(b"a"));
        assert_eq!(KeyRange::new(b"a", b"\0"), KeyRange::From(b"a"));
        assert_eq!(KeyRange::new(b"\0", b"\0"), KeyRange::From(b"\0"));
        assert_eq!(KeyRange::new(b"b", b"a"), KeyRange::Empty);
        assert_eq!(KeyRange::new(b"a", b"a"), KeyRange::Empty);
        assert_eq!(KeyRange::new(b"a", b"b"), KeyRange::Between(b"a", b"b"));
    }

    #[test]
    fn newest_generation_for_the_next_put() {
        let g = |created, version| Some(Generation { created, version });
        let mut ix = KeyIndex::default();
        assert_eq!(ix.newest(b"a", 2), Newest::Absent);
        ix.push(b"a", put(2, 0), g(2, 1));
        assert_eq!(
            ix.newest(b"a", 3),
            Newest::Put(Generation {
                created: 2,
                version: 1
            })
        );
        // Loaded at open: generation unknown until the next put records it.
        ix.push(b"b", put(2, 1), None);
        assert_eq!(ix.newest(b"b", 3), Newest::Unknown);
        ix.push(b"a", del(3, 0), None);
        assert_eq!(ix.newest(b"a", 4), Newest::Absent);
        ix.push(b"a", put(4, 0), g(4, 1));
        assert_eq!(ix.newest(b"a", 4), Newest::Unknown, "same request");
        ix.push(b"a", put(5, 0), g(4, 2));
        // A rolled-back put leaves the one before it unknown.
        ix.pop(b"a", 5);
        assert_eq!(ix.newest(b"a", 5), Newest::Unknown);
        // A tombstone never carries a generation.
        ix.push(b"c", del(6, 0), g(1, 1));
        assert_eq!(ix.newest(b"c", 7), Newest::Absent);
        // Compaction keeps the newest event and so its generation.
        ix.push(b"a", put(7, 0), g(4, 3));
        ix.compact(7);
        assert_eq!(
            ix.newest(b"a", 8),
            Newest::Put(Generation {
                created: 4,
                version: 3
            })
        );
    }

    #[test]
    fn visibility_and_compaction() {
        let mut ix = KeyIndex::default();
        ix.push(b"a", put(2, 0), None);
        ix.push(b"a", put(3, 0), None);
        ix.push(b"a", del(5, 0), None);
        ix.push(b"a", put(5, 1), None);
        ix.push(b"b", put(4, 0), None);
        ix.push(b"b", del(6, 0), None);
        assert_eq!(ix.get(b"a", 1), None);
        assert_eq!(ix.get(b"a", 2), Some(put(2, 0)));
        assert_eq!(ix.get(b"a", 4), Some(put(3, 0)));
        assert_eq!(ix.get(b"a", 5), Some(put(5, 1)));
        assert_eq!(ix.get(b"b", 6), None);
        assert_eq!(ix.count(KeyRange::From(b"\0"), 4), 2);
        assert_eq!(ix.count(KeyRange::From(b"\0"), 6), 1);

        let mut garbage = Vec::new();
        ix.compaction_garbage(4, |r| garbage.push(r));
        assert_eq!(garbage, vec![put(2, 0)]);
        ix.compact(4);
        assert_eq!(ix.get(b"a", 4), Some(put(3, 0)));
        assert_eq!(ix.get(b"b", 4), Some(put(4, 0)));

        let mut garbage = Vec::new();
        ix.compaction_garbage(6, |r| garbage.push(r));
        assert_eq!(garbage, vec![put(3, 0), del(5, 0), put(4, 0), del(6, 0)]);
        ix.compact(6);
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.get(b"a", 6), Some(put(5, 1)));

        ix.pop(b"a", 5);
        assert_eq!(ix.len(), 0);
    }
}
