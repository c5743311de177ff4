//! The in-memory key index: for every key, the ordered revisions at which it
//! was put or deleted since the last compaction (etcd's `treeIndex` /
//! `keyIndex`, flattened: generations are implicit between tombstones).
//!
//! It owns only revision numbers, never values (those stay in the engine),
//! and it must never be the only copy of anything: it is rebuilt from the
//! engine on open. The value of a key visible at revision `R` is the last
//! event with `main <= R`, unless that event is a tombstone.
//!
//! Layout (issue 20, memory per key): keys live in leaves of up to 64
//! consecutive keys, their bytes back to back in one buffer, each with a
//! 40-byte slot holding its newest event and generation inline; older
//! events, which only keys written again before a compaction have, are
//! boxed. Each leaf also counts its live keys and bounds its newest
//! revision, so a count at a revision that sees every key's newest event
//! (a range at "now", or a paged LIST pinned to its first page's revision
//! with no writes since) takes a leaf at a time: the rest of a LIST's range
//! after each page is counted in O(leaves), not O(keys).
//! A B-tree maps each leaf's lower bound to the leaf. 1M 8-byte keys
//! take 48 MiB instead of 208 MiB with a B-tree entry per key (`Bytes` key,
//! `Vec` of events, node slack), and inserting, walking and compacting
//! touch a few large allocations instead of millions of small ones.

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

/// Entries a leaf holds at most: a leaf is searched and shifted as a whole,
/// so it stays small; the map above it has one node per leaf, not per key.
const LEAF_SLOTS: usize = 64;

/// Key bytes past which a leaf splits (unless it holds a single key).
const LEAF_KEY_BYTES: usize = 4096;

/// Set in [`Slot::sub`] when the newest event is a tombstone; sub revisions
/// are bounded by `--max-txn-ops` far below it.
const TOMBSTONE_BIT: u32 = 1 << 31;

/// One key's events: its newest inline, the older ones (if any) boxed, as
/// most keys have a single event between compactions.
#[derive(Debug)]
struct Slot {
    /// End of this key in its leaf's key bytes (the start is the previous
    /// slot's end).
    key_end: u32,
    /// The newest event's sub revision, with [`TOMBSTONE_BIT`].
    sub: u32,
    /// The newest event's main revision.
    main: i64,
    /// Of the newest event when it is a put and known (`version == 0`: not
    /// known; etcd versions start at 1).
    created: i64,
    version: i64,
    /// Events before the newest, oldest first. Boxed on purpose: one
    /// pointer (8 bytes, null for most keys) instead of a Vec's 24 in every
    /// slot; only keys written again before a compaction pay the extra
    /// allocation.
    #[allow(clippy::box_collection)]
    older: Option<Box<Vec<Rev>>>,
}

impl Slot {
    fn new(key_end: u32, rev: Rev, generation: Option<Generation>) -> Slot {
        let mut slot = Slot {
            key_end,
            sub: 0,
            main: 0,
            created: 0,
            version: 0,
            older: None,
        };
        slot.set_newest(rev, generation);
        slot
    }

    fn newest(&self) -> Rev {
        Rev {
            main: self.main,
            sub: self.sub & !TOMBSTONE_BIT,
            tombstone: self.sub & TOMBSTONE_BIT != 0,
        }
    }

    fn set_newest(&mut self, rev: Rev, generation: Option<Generation>) {
        self.main = rev.main;
        self.sub = (rev.sub & !TOMBSTONE_BIT) | if rev.tombstone { TOMBSTONE_BIT } else { 0 };
        let g = generation.filter(|_| !rev.tombstone).unwrap_or(Generation {
            created: 0,
            version: 0,
        });
        self.created = g.created;
        self.version = g.version;
    }

    fn generation(&self) -> Option<Generation> {
        (self.version != 0).then_some(Generation {
            created: self.created,
            version: self.version,
        })
    }

    fn is_live(&self) -> bool {
        self.sub & TOMBSTONE_BIT == 0
    }

    fn older(&self) -> &[Rev] {
        self.older.as_deref().map_or(&[], Vec::as_slice)
    }

    fn event_count(&self) -> usize {
        self.older().len() + 1
    }

    /// Event `i`, oldest first.
    fn event(&self, i: usize) -> Rev {
        self.older()
            .get(i)
            .copied()
            .unwrap_or_else(|| self.newest())
    }

    /// The visible (non-tombstone) event at revision `at`.
    fn visible(&self, at: i64) -> Option<Rev> {
        let r = if self.main <= at {
            self.newest()
        } else {
            let older = self.older();
            let n = older.partition_point(|r| r.main <= at);
            *older.get(n.checked_sub(1)?)?
        };
        (!r.tombstone).then_some(r)
    }

    /// How many leading events no read at a revision `>= at` can reach:
    /// all events before the last one with `main <= at`, and that one too
    /// if it is a tombstone (etcd's `keyIndex.compact`).
    fn garbage_len(&self, at: i64) -> usize {
        let n = if self.main <= at {
            self.event_count()
        } else {
            self.older().partition_point(|r| r.main <= at)
        };
        match n.checked_sub(1).map(|i| self.event(i)) {
            Some(last) if last.tombstone => n,
            Some(_) => n - 1,
            None => 0,
        }
    }

    /// Drops the first `n` events; false when none is left.
    fn drop_oldest(&mut self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let Some(older) = self.older.as_mut() else {
            return false;
        };
        if n > older.len() {
            return false;
        }
        older.drain(..n);
        if older.is_empty() {
            self.older = None;
        } else {
            // Compaction is rare; give back the memory of long histories.
            older.shrink_to_fit();
        }
        true
    }
}

/// A run of consecutive keys, their bytes back to back, and what counts
/// them without a walk.
#[derive(Debug, Default)]
struct Leaf {
    keys: Vec<u8>,
    slots: Vec<Slot>,
    /// Slots whose newest event is a put.
    live: u32,
    /// At least the newest main revision of any slot (never below it; may
    /// stay above after a rollback or compaction). A read at a revision
    /// `>= newest_main` sees every slot's newest event, so `live` keys:
    /// a paged LIST counts the rest of its range a leaf at a time instead
    /// of a key at a time (etcd 3.4 walks them all, for every page).
    newest_main: i64,
}

impl Leaf {
    fn key_start(&self, i: usize) -> usize {
        i.checked_sub(1)
            .and_then(|p| self.slots.get(p))
            .map_or(0, |s| s.key_end as usize)
    }

    fn key(&self, i: usize) -> &[u8] {
        let end = self.slots.get(i).map_or(0, |s| s.key_end as usize);
        self.keys.get(self.key_start(i)..end).unwrap_or_default()
    }

    /// `Ok(i)`: `key` is slot `i`; `Err(i)`: it would go at `i`.
    fn search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.slots.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The first slot whose key is past `start`.
    fn first_from(&self, start: Bound<&[u8]>) -> usize {
        match start {
            Bound::Unbounded => 0,
            Bound::Included(k) => self.search(k).unwrap_or_else(|i| i),
            Bound::Excluded(k) => self.search(k).map_or_else(|i| i, |i| i + 1),
        }
    }

    fn is_full(&self) -> bool {
        self.slots.len() >= LEAF_SLOTS || (self.slots.len() > 1 && self.keys.len() > LEAF_KEY_BYTES)
    }

    /// Notes that a slot's newest event became `rev`, live or not before.
    fn note_event(&mut self, was_live: bool, rev: Rev) {
        self.newest_main = self.newest_main.max(rev.main);
        match (was_live, rev.tombstone) {
            (false, false) => self.live += 1,
            (true, true) => self.live -= 1,
            _ => {}
        }
    }

    /// Recounts the summary from the slots (after a split).
    fn recount(&mut self) {
        self.live = self.slots.iter().filter(|s| s.is_live()).count() as u32;
        self.newest_main = self.slots.iter().map(|s| s.main).max().unwrap_or(0);
    }

    /// Keys of this leaf visible at `at`, when the summary knows it
    /// without a walk.
    fn visible_count(&self, at: i64) -> Option<i64> {
        (at >= self.newest_main).then_some(i64::from(self.live))
    }

    fn insert(&mut self, at: usize, key: &[u8], rev: Rev, generation: Option<Generation>) {
        self.note_event(false, rev);
        let start = self.key_start(at);
        self.keys.splice(start..start, key.iter().copied());
        let len = key_len(key);
        for s in self.slots.iter_mut().skip(at) {
            s.key_end += len;
        }
        self.slots
            .insert(at, Slot::new(start as u32 + len, rev, generation));
    }

    fn remove(&mut self, at: usize) {
        if self.slots.get(at).is_some_and(Slot::is_live) {
            self.live -= 1;
        }
        let (start, end) = (self.key_start(at), self.key_end(at));
        self.keys.drain(start..end);
        self.slots.remove(at);
        let len = (end - start) as u32;
        for s in self.slots.iter_mut().skip(at) {
            s.key_end -= len;
        }
    }

    fn key_end(&self, i: usize) -> usize {
        self.slots.get(i).map_or(0, |s| s.key_end as usize)
    }

    /// Moves slots `from..` into a new leaf.
    fn split_off(&mut self, from: usize) -> Leaf {
        let cut = self.key_start(from);
        let keys = self.keys.split_off(cut);
        let mut slots = Vec::with_capacity(LEAF_SLOTS);
        slots.extend(self.slots.drain(from..).map(|mut s| {
            s.key_end -= cut as u32;
            s
        }));
        self.recount();
        let mut right = Leaf {
            keys,
            slots,
            ..Leaf::default()
        };
        right.recount();
        right
    }
}

/// Whether `key` comes before the range's `end`.
fn before_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Unbounded => true,
        Bound::Excluded(e) => key < e,
        Bound::Included(e) => key <= e,
    }
}

/// Where a slice of a range's walk goes, resuming after `after`.
enum SliceBounds<'a> {
    /// Keys from the first bound up to the second.
    Keys(Bound<&'a [u8]>, Bound<&'a [u8]>),
    /// The range's single key, not examined yet.
    Single(&'a [u8]),
    /// Nothing left.
    Nothing,
}

fn slice_bounds<'a>(range: KeyRange<'a>, after: Option<&'a [u8]>) -> SliceBounds<'a> {
    let (start, end) = match range {
        KeyRange::Empty => return SliceBounds::Nothing,
        KeyRange::Single(key) if after.is_none() => return SliceBounds::Single(key),
        KeyRange::Single(_) => return SliceBounds::Nothing,
        KeyRange::From(key) => (key, Bound::Unbounded),
        KeyRange::Between(key, end) => (key, Bound::Excluded(end)),
    };
    let start = match after {
        Some(last) => Bound::Excluded(last),
        None => Bound::Included(start),
    };
    SliceBounds::Keys(start, end)
}

/// A key's length as stored in a leaf; keys are bounded by the request size
/// limit, far below 4 GiB.
fn key_len(key: &[u8]) -> u32 {
    u32::try_from(key.len()).unwrap_or(u32::MAX)
}

/// The key index: leaves of consecutive keys under a B-tree keyed by each
/// leaf's lower bound (the first leaf's is empty, so every key has a leaf).
/// About 48 bytes per key plus the key itself, against ~200 for a B-tree
/// node per key with its own allocations.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    /// Leaf lower bound -> leaf: every key of a leaf is `>=` its bound and
    /// `<` the next leaf's.
    leaves: BTreeMap<Box<[u8]>, Leaf>,
    /// Keys with at least one event.
    len: usize,
    /// Keys whose newest event is a put (etcd's `keys_total`).
    live: usize,
}

impl KeyIndex {
    /// Number of keys with at least one event (live or not).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Number of keys that exist now (their newest event is a put).
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    fn leaf_of(&self, key: &[u8]) -> Option<&Leaf> {
        self.leaves
            .range::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
            .map(|(_, l)| l)
    }

    fn slot(&self, key: &[u8]) -> Option<&Slot> {
        let leaf = self.leaf_of(key)?;
        leaf.slots.get(leaf.search(key).ok()?)
    }

    /// The event visible for `key` at revision `at`.
    pub(crate) fn get(&self, key: &[u8], at: i64) -> Option<Rev> {
        self.slot(key)?.visible(at)
    }

    /// The key's newest event as a put at revision `at` sees it. An event
    /// at `at` itself (an earlier change of the same request) is
    /// `Unknown`: the put's watchers compare with the value before the
    /// whole request, which the index does not hold.
    pub(crate) fn newest(&self, key: &[u8], at: i64) -> Newest {
        let Some(s) = self.slot(key) else {
            return Newest::Absent;
        };
        if s.main >= at {
            Newest::Unknown
        } else if !s.is_live() {
            Newest::Absent
        } else {
            s.generation().map_or(Newest::Unknown, Newest::Put)
        }
    }

    /// The leaves in key order from the one that holds (or would hold)
    /// `start`'s key on.
    fn leaves_from<'a>(&'a self, start: Bound<&[u8]>) -> impl Iterator<Item = &'a Leaf> + 'a {
        let first = match start {
            Bound::Unbounded => None,
            Bound::Included(k) | Bound::Excluded(k) => self
                .leaves
                .range::<[u8], _>((Bound::Unbounded, Bound::Included(k)))
                .next_back()
                .map(|(bound, _)| &bound[..]),
        };
        let from = first.map_or(Bound::Unbounded, Bound::Included);
        self.leaves
            .range::<[u8], _>((from, Bound::Unbounded))
            .map(|(_, leaf)| leaf)
    }

    /// Calls `f` for each key from `start` up to `end` with its slot, in
    /// ascending key order, until `f` returns false; true when it never did.
    fn for_each_from<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        mut f: impl FnMut(&'a [u8], &'a Slot) -> bool,
    ) -> bool {
        for leaf in self.leaves_from(start) {
            for i in leaf.first_from(start)..leaf.slots.len() {
                let key = leaf.key(i);
                if !before_end(key, end) {
                    return true;
                }
                if let Some(slot) = leaf.slots.get(i) {
                    if !f(key, slot) {
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Calls `f` for every key of `range` visible at `at`, in ascending key
    /// order, until `f` returns false.
    pub(crate) fn visit(
        &self,
        range: KeyRange<'_>,
        at: i64,
        mut f: impl FnMut(&[u8], Rev) -> bool,
    ) {
        let (start, end) = match range {
            KeyRange::Empty => return,
            KeyRange::Single(key) => {
                if let Some(r) = self.get(key, at) {
                    f(key, r);
                }
                return;
            }
            KeyRange::From(key) => (key, Bound::Unbounded),
            KeyRange::Between(key, end) => (key, Bound::Excluded(end)),
        };
        self.for_each_from(Bound::Included(start), end, |k, s| {
            s.visible(at).is_none_or(|r| f(k, r))
        });
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
        mut f: impl FnMut(&[u8], Rev),
    ) -> Option<Bytes> {
        let (start, end) = match slice_bounds(range, after) {
            SliceBounds::Keys(start, end) => (start, end),
            SliceBounds::Single(key) => {
                if let Some(r) = self.get(key, at) {
                    f(key, r);
                }
                return None;
            }
            SliceBounds::Nothing => return None,
        };
        self.slice_from(start, end, max_keys, |k, s| {
            if let Some(r) = s.visible(at) {
                f(k, r);
            }
        })
    }

    /// Calls `f` for at most `max_keys` (at least one) keys from `start`
    /// up to `end` with their slots; the last key examined when keys of the
    /// range remain (where the next slice resumes, exclusive).
    fn slice_from(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        max_keys: usize,
        mut f: impl FnMut(&[u8], &Slot),
    ) -> Option<Bytes> {
        let budget = max_keys.max(1);
        let mut examined = 0;
        let mut last: Option<&[u8]> = None;
        let mut cut = false;
        self.for_each_from(start, end, |k, s| {
            if examined == budget {
                cut = true;
                return false;
            }
            examined += 1;
            f(k, s);
            last = Some(k);
            true
        });
        if cut {
            last.map(Bytes::copy_from_slice)
        } else {
            None
        }
    }

    /// Number of keys of `range` visible at `at`.
    pub(crate) fn count(&self, range: KeyRange<'_>, at: i64) -> i64 {
        let mut n = 0;
        // An unbounded slice: the whole range in one call.
        self.count_slice(range, at, None, usize::MAX, &mut n);
        n
    }

    /// Adds to `count` the keys of `range` visible at `at` after `after`,
    /// as [`KeyIndex::visit_slice`] with a counting `f` would, examining at
    /// most `max_keys` keys; a leaf wholly inside the range whose summary
    /// answers for `at` counts as one key examined. Returns where the next
    /// slice resumes.
    pub(crate) fn count_slice(
        &self,
        range: KeyRange<'_>,
        at: i64,
        after: Option<&[u8]>,
        max_keys: usize,
        count: &mut i64,
    ) -> Option<Bytes> {
        let (start, end) = match slice_bounds(range, after) {
            SliceBounds::Keys(start, end) => (start, end),
            SliceBounds::Single(key) => {
                if self.get(key, at).is_some() {
                    *count += 1;
                }
                return None;
            }
            SliceBounds::Nothing => return None,
        };
        let budget = max_keys.max(1);
        let mut examined = 0;
        let mut last: Option<&[u8]> = None;
        for leaf in self.leaves_from(start) {
            let first = leaf.first_from(start);
            let Some(last_slot) = leaf.slots.len().checked_sub(1) else {
                continue;
            };
            let leaf_last = leaf.key(last_slot);
            if let (0, Some(n), true) = (first, leaf.visible_count(at), before_end(leaf_last, end))
            {
                if examined == budget {
                    return last.map(Bytes::copy_from_slice);
                }
                examined += 1;
                *count += n;
                last = Some(leaf_last);
                continue;
            }
            for i in first..leaf.slots.len() {
                let key = leaf.key(i);
                if !before_end(key, end) {
                    return None;
                }
                if examined == budget {
                    return last.map(Bytes::copy_from_slice);
                }
                examined += 1;
                if leaf.slots.get(i).is_some_and(|s| s.visible(at).is_some()) {
                    *count += 1;
                }
                last = Some(key);
            }
        }
        None
    }

    /// Records a new event for `key`, with its generation when it is a put
    /// whose creation revision and version the caller knows. Events must
    /// arrive in increasing `(main, sub)` order, which the apply path and
    /// the engine scan in `open` both guarantee.
    pub(crate) fn push(&mut self, key: &[u8], rev: Rev, generation: Option<Generation>) {
        if self.leaves.is_empty() {
            self.leaves.insert(Box::default(), Leaf::default());
        }
        let Some((_, leaf)) = self
            .leaves
            .range_mut::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
        else {
            return;
        };
        let at = match leaf.search(key) {
            Ok(i) => {
                if let Some(s) = leaf.slots.get_mut(i) {
                    let was_live = s.is_live();
                    let old = s.newest();
                    s.older.get_or_insert_with(Box::default).push(old);
                    s.set_newest(rev, generation);
                    leaf.note_event(was_live, rev);
                    match (was_live, rev.tombstone) {
                        (false, false) => self.live += 1,
                        (true, true) => self.live -= 1,
                        _ => {}
                    }
                }
                return;
            }
            Err(i) => i,
        };
        self.len += 1;
        if !rev.tombstone {
            self.live += 1;
        }
        if !leaf.is_full() {
            leaf.insert(at, key, rev, generation);
            return;
        }
        // Full: split. Appending past the end keeps the full leaf as it is
        // (keys arriving in order, as a checkpoint loads them or sequential
        // names, fill leaves completely); otherwise halve it.
        let appending = at == leaf.slots.len();
        let mut right = if appending {
            Leaf {
                slots: Vec::with_capacity(LEAF_SLOTS),
                ..Leaf::default()
            }
        } else {
            leaf.split_off(leaf.slots.len() / 2)
        };
        let right_bound: Box<[u8]> = if appending {
            key.into()
        } else {
            right.key(0).into()
        };
        let bound_is_before_key = *right_bound <= *key;
        if bound_is_before_key {
            let i = right.search(key).unwrap_or_else(|i| i);
            right.insert(i, key, rev, generation);
        } else {
            leaf.insert(at, key, rev, generation);
        }
        leaf.keys.shrink_to_fit();
        self.leaves.insert(right_bound, right);
    }

    /// Undoes the last [`KeyIndex::push`] for `key` if it was at `main`
    /// (rollback of a failed request).
    pub(crate) fn pop(&mut self, key: &[u8], main: i64) {
        let Some((bound, leaf)) = self
            .leaves
            .range_mut::<[u8], _>((Bound::Unbounded, Bound::Included(key)))
            .next_back()
        else {
            return;
        };
        let Ok(i) = leaf.search(key) else {
            return;
        };
        let Some(s) = leaf.slots.get_mut(i) else {
            return;
        };
        if s.main != main {
            return;
        }
        let was_live = s.is_live();
        let previous = s.older.as_mut().and_then(|o| o.pop());
        if s.older.as_ref().is_some_and(|o| o.is_empty()) {
            s.older = None;
        }
        let now_live = match previous {
            Some(r) => {
                // The event before is not remembered: the next put reads it.
                s.set_newest(r, None);
                let now_live = s.is_live();
                // Its newest_main stays as high as it was: safe, as the
                // summary only ever claims a count at or past it.
                match (was_live, now_live) {
                    (true, false) => leaf.live -= 1,
                    (false, true) => leaf.live += 1,
                    _ => {}
                }
                now_live
            }
            None => {
                leaf.remove(i);
                self.len -= 1;
                false
            }
        };
        match (was_live, now_live) {
            (true, false) => self.live -= 1,
            (false, true) => self.live += 1,
            _ => {}
        }
        if leaf.slots.is_empty() && !bound.is_empty() {
            let bound = bound.clone();
            self.leaves.remove(&bound);
        }
    }

    /// Calls `f` for every event that [`KeyIndex::compact`] at `at` would
    /// drop, without changing anything.
    pub(crate) fn compaction_garbage(&self, at: i64, mut f: impl FnMut(Rev)) {
        self.for_each_from(Bound::Unbounded, Bound::Unbounded, |_, s| {
            (0..s.garbage_len(at)).for_each(|i| f(s.event(i)));
            true
        });
    }

    /// Drops every event no read at a revision `>= at` can reach, and keys
    /// left with no event. Rebuilds the leaves, packed.
    pub(crate) fn compact(&mut self, at: i64) {
        // The newest event always survives (only a tombstone goes, and its
        // key with it), so a kept key's generation stays true.
        let old = std::mem::take(&mut self.leaves);
        let mut packed = KeyIndex::default();
        for (_, mut leaf) in old {
            let keys = std::mem::take(&mut leaf.keys);
            let mut start = 0;
            for mut slot in leaf.slots.drain(..) {
                let end = slot.key_end as usize;
                let key = keys.get(start..end).unwrap_or_default();
                start = end;
                if slot.drop_oldest(slot.garbage_len(at)) {
                    packed.append(key, slot);
                }
            }
        }
        *self = packed;
    }

    /// Visits, in key order after `after` (from the start when `None`), at
    /// most `max_keys` keys with their events at or below `at` (keys with
    /// none are skipped, but count) and the newest one's generation when
    /// it is among them and known: the index as it stood at revision `at`,
    /// provided nothing was compacted since. Returns the last key examined
    /// when keys remain.
    pub(crate) fn visit_history_slice(
        &self,
        at: i64,
        after: Option<&[u8]>,
        max_keys: usize,
        mut f: impl FnMut(&[u8], &[Rev], Option<Rev>, Option<Generation>),
    ) -> Option<Bytes> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.slice_from(start, Bound::Unbounded, max_keys, |k, s| {
            if s.main <= at {
                f(k, s.older(), Some(s.newest()), s.generation());
            } else {
                let older = s.older();
                let n = older.partition_point(|r| r.main <= at);
                if let Some(upto) = older.get(..n).filter(|o| !o.is_empty()) {
                    f(k, upto, None, None);
                }
            }
        })
    }

    /// Adds `key` with `events` (oldest first, at least one) and its
    /// newest put's generation, for loading a checkpoint: `key` must come
    /// after every key held. False (nothing added) when it does not or
    /// `events` is empty.
    pub(crate) fn append_history(
        &mut self,
        key: &[u8],
        events: &[Rev],
        generation: Option<Generation>,
    ) -> bool {
        let in_order = self.last_key().is_none_or(|last| last < key);
        let Some((newest, older)) = events.split_last() else {
            return false;
        };
        if !in_order {
            return false;
        }
        let mut slot = Slot::new(0, *newest, generation);
        if !older.is_empty() {
            slot.older = Some(Box::new(older.to_vec()));
        }
        self.append(key, slot);
        true
    }

    fn last_key(&self) -> Option<&[u8]> {
        let (_, leaf) = self
            .leaves
            .iter()
            .rev()
            .find(|(_, l)| !l.slots.is_empty())?;
        Some(leaf.key(leaf.slots.len().checked_sub(1)?))
    }

    /// The first difference between the events this index and `other` hold
    /// (generations aside), for checking a loaded checkpoint against a full
    /// rebuild; `None` when they hold the same.
    pub(crate) fn first_difference(&self, other: &KeyIndex) -> Option<String> {
        let mine = self.all_events();
        let theirs = other.all_events();
        if let Some(i) = (0..mine.len().min(theirs.len())).find(|&i| mine[i] != theirs[i]) {
            return Some(format!("{:?} against {:?}", mine[i], theirs[i]));
        }
        (mine.len() != theirs.len()).then(|| {
            format!(
                "{} keys against {} (first extra: {:?})",
                mine.len(),
                theirs.len(),
                mine.get(theirs.len()).or(theirs.get(mine.len()))
            )
        })
    }

    fn all_events(&self) -> Vec<(Vec<u8>, Vec<Rev>)> {
        let mut all = Vec::with_capacity(self.len);
        self.for_each_from(Bound::Unbounded, Bound::Unbounded, |k, s| {
            all.push((
                k.to_vec(),
                (0..s.event_count()).map(|i| s.event(i)).collect(),
            ));
            true
        });
        all
    }

    /// Each key's newest event and generation where the index knows it.
    pub(crate) fn known_generations(&self, mut f: impl FnMut(&[u8], Rev, Generation)) {
        self.for_each_from(Bound::Unbounded, Bound::Unbounded, |k, s| {
            if let Some(g) = s.generation() {
                f(k, s.newest(), g);
            }
            true
        });
    }

    /// Adds `key`, greater than every key held, with its events.
    fn append(&mut self, key: &[u8], mut slot: Slot) {
        let needs_leaf = self
            .leaves
            .last_key_value()
            .is_none_or(|(_, leaf)| leaf.is_full());
        if needs_leaf {
            let bound: Box<[u8]> = if self.leaves.is_empty() {
                Box::default()
            } else {
                key.into()
            };
            if let Some((_, last)) = self.leaves.iter_mut().next_back() {
                last.keys.shrink_to_fit();
            }
            self.leaves.insert(
                bound,
                Leaf {
                    slots: Vec::with_capacity(LEAF_SLOTS),
                    ..Leaf::default()
                },
            );
        }
        let Some(mut entry) = self.leaves.last_entry() else {
            return;
        };
        let leaf = entry.get_mut();
        leaf.keys.extend_from_slice(key);
        slot.key_end = key_len(&leaf.keys);
        self.len += 1;
        if slot.is_live() {
            self.live += 1;
        }
        leaf.note_event(false, slot.newest());
        leaf.slots.push(slot);
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

    /// The flat index this module replaced: a map of keys to their events.
    #[derive(Default)]
    struct Model {
        keys: BTreeMap<Vec<u8>, (Vec<Rev>, Option<Generation>)>,
    }

    impl Model {
        fn visible(revs: &[Rev], at: i64) -> Option<Rev> {
            let n = revs.partition_point(|r| r.main <= at);
            let r = *revs.get(n.checked_sub(1)?)?;
            (!r.tombstone).then_some(r)
        }
        fn garbage_len(revs: &[Rev], at: i64) -> usize {
            let n = revs.partition_point(|r| r.main <= at);
            match n.checked_sub(1).map(|i| revs[i]) {
                Some(last) if last.tombstone => n,
                Some(_) => n - 1,
                None => 0,
            }
        }
        fn push(&mut self, key: &[u8], rev: Rev, g: Option<Generation>) {
            let e = self.keys.entry(key.to_vec()).or_default();
            e.0.push(rev);
            e.1 = if rev.tombstone { None } else { g };
        }
        fn pop(&mut self, key: &[u8], main: i64) {
            if let Some(e) = self.keys.get_mut(key) {
                if e.0.last().is_some_and(|r| r.main == main) {
                    e.0.pop();
                    e.1 = None;
                }
                if e.0.is_empty() {
                    self.keys.remove(key);
                }
            }
        }
        fn compact(&mut self, at: i64) {
            self.keys.retain(|_, e| {
                let n = Self::garbage_len(&e.0, at);
                e.0.drain(..n);
                !e.0.is_empty()
            });
        }
        fn live(&self) -> usize {
            self.keys
                .values()
                .filter(|e| e.0.last().is_some_and(|r| !r.tombstone))
                .count()
        }
        fn newest(&self, key: &[u8], at: i64) -> Newest {
            match self.keys.get(key) {
                None => Newest::Absent,
                Some((revs, g)) => match revs.last() {
                    Some(l) if l.main >= at => Newest::Unknown,
                    Some(l) if l.tombstone => Newest::Absent,
                    None => Newest::Absent,
                    Some(_) => g.map_or(Newest::Unknown, Newest::Put),
                },
            }
        }
        fn visit(&self, lo: &[u8], hi: Option<&[u8]>, at: i64) -> Vec<(Vec<u8>, Rev)> {
            self.keys
                .range::<[u8], _>((
                    Bound::Included(lo),
                    hi.map_or(Bound::Unbounded, Bound::Excluded),
                ))
                .filter_map(|(k, e)| Some((k.clone(), Self::visible(&e.0, at)?)))
                .collect()
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A request's changes: keys, each put (with a generation or not)
        /// or deleted, then maybe rolled back.
        Request(Vec<(u16, bool, bool)>, bool),
        Compact(u8),
    }

    /// Keys of varied lengths, some long enough to split leaves by bytes.
    fn key_of(id: u16) -> Vec<u8> {
        let width = match id % 7 {
            0 => 1,
            1 => 3,
            6 => 300,
            n => usize::from(n) * 6,
        };
        format!("{id:0width$}").into_bytes()
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            12 => (proptest::collection::vec((0u16..400, any::<bool>(), any::<bool>()), 1..4), proptest::bool::weighted(0.1))
                .prop_map(|(changes, rollback)| Op::Request(changes, rollback)),
            1 => any::<u8>().prop_map(Op::Compact),
        ]
    }

    fn check(ix: &KeyIndex, model: &Model, rev: i64, probe: &[u16]) {
        for leaf in ix.leaves.values() {
            let live = leaf.slots.iter().filter(|s| s.is_live()).count();
            assert_eq!(leaf.live as usize, live, "a leaf's live keys");
            assert!(leaf.slots.iter().all(|s| s.main <= leaf.newest_main));
        }
        assert_eq!(ix.len(), model.keys.len());
        assert_eq!(ix.live(), model.live());
        let all = |at| {
            let mut got = Vec::new();
            ix.visit(KeyRange::From(b""), at, |k, r| {
                got.push((k.to_vec(), r));
                true
            });
            got
        };
        for at in [1, rev / 2, rev - 1, rev, rev + 1] {
            assert_eq!(all(at), model.visit(b"", None, at), "visit at {at}");
            assert_eq!(
                ix.count(KeyRange::From(b""), at),
                model.visit(b"", None, at).len() as i64
            );
        }
        for pair in probe.chunks(2) {
            let lo = key_of(pair[0]);
            let hi = pair.get(1).map(|&h| key_of(h));
            for at in [rev / 3, rev] {
                assert_eq!(
                    ix.get(&lo, at),
                    Model::visible(model.keys.get(&lo).map_or(&[][..], |e| &e.0), at)
                );
                assert_eq!(
                    ix.newest(&lo, at),
                    model.newest(&lo, at),
                    "newest {lo:?} at {at}"
                );
                let range = match &hi {
                    Some(h) => KeyRange::new(&lo, h),
                    None => KeyRange::From(&lo),
                };
                let want = match range {
                    KeyRange::Empty => Vec::new(),
                    _ => model.visit(&lo, hi.as_deref(), at),
                };
                // In slices of 5 keys examined, resuming after the last.
                let mut got = Vec::new();
                let mut after: Option<Bytes> = None;
                loop {
                    let next = ix.visit_slice(range, at, after.as_deref(), 5, |k, r| {
                        got.push((k.to_vec(), r))
                    });
                    match next {
                        Some(k) => after = Some(k),
                        None => break,
                    }
                }
                assert_eq!(got, want, "slices of {lo:?}..{hi:?} at {at}");
                // Counted in slices too, leaves whole where they can be.
                let mut counted = 0;
                let mut after: Option<Bytes> = None;
                while let Some(k) = ix.count_slice(range, at, after.as_deref(), 3, &mut counted) {
                    after = Some(k);
                }
                assert_eq!(
                    counted,
                    want.len() as i64,
                    "count of {lo:?}..{hi:?} at {at}"
                );
                assert_eq!(ix.count(range, at), want.len() as i64);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// The packed index answers every question exactly as a plain map
        /// of keys to their event lists does.
        #[test]
        fn packed_index_agrees_with_a_map(ops in proptest::collection::vec(op(), 1..400), probe in proptest::collection::vec(0u16..400, 1..12)) {
            let mut ix = KeyIndex::default();
            let mut model = Model::default();
            let mut rev = 1i64;
            for op in ops {
                match op {
                    Op::Request(changes, rollback) => {
                        rev += 1;
                        let mut pushed = Vec::new();
                        for (sub, (id, tombstone, known)) in changes.into_iter().enumerate() {
                            let key = key_of(id);
                            let r = Rev { main: rev, sub: sub as u32, tombstone };
                            let g = known.then_some(Generation { created: rev, version: 1 + sub as i64 });
                            ix.push(&key, r, g);
                            model.push(&key, r, g);
                            pushed.push(key);
                        }
                        if rollback {
                            for key in pushed.iter().rev() {
                                ix.pop(key, rev);
                                model.pop(key, rev);
                            }
                            rev -= 1;
                        }
                    }
                    Op::Compact(n) => {
                        let at = 1 + i64::from(n) % rev;
                        let mut got = Vec::new();
                        ix.compaction_garbage(at, |r| got.push(r));
                        let mut want = Vec::new();
                        for (revs, _) in model.keys.values() {
                            want.extend_from_slice(&revs[..Model::garbage_len(revs, at)]);
                        }
                        proptest::prop_assert_eq!(got, want);
                        ix.compact(at);
                        model.compact(at);
                    }
                }
            }
            check(&ix, &model, rev, &probe);
        }
    }

    /// Counting the rest of a range after a page costs a step per leaf,
    /// not per key, where the read sees every key's newest event; a read
    /// at an older revision walks the keys written since.
    #[test]
    fn counts_whole_leaves_when_the_newest_events_are_visible() {
        let mut ix = KeyIndex::default();
        for i in 0..10_000i64 {
            ix.push(format!("{i:08}").as_bytes(), put(i + 2, 0), None);
        }
        ix.push(b"00000100", del(10_002, 0), None);
        let all = KeyRange::From(b"");
        let steps = 10_000 / LEAF_SLOTS + 2;
        let mut n = 0;
        assert_eq!(ix.count_slice(all, 10_002, None, steps, &mut n), None);
        assert_eq!(n, 9_999);
        // At revision 5_001 the last half of the keys and the leaf of the
        // deleted one must be walked key by key.
        let mut n = 0;
        let after = ix.count_slice(all, 5_001, None, steps, &mut n);
        assert!(after.is_some(), "counted {n} in {steps} steps");
        assert_eq!(ix.count(all, 5_001), 5_000);
        assert_eq!(ix.count(all, 10_001), 10_000);
    }

    /// Keys put in order fill leaves completely (checkpoints load that
    /// way); in any order a key costs a bounded number of bytes.
    #[test]
    fn a_key_costs_about_its_bytes_plus_a_slot() {
        let mut ix = KeyIndex::default();
        for i in 0..10_000i64 {
            ix.push(format!("{i:08}").as_bytes(), put(i + 2, 0), None);
        }
        let leaves = ix.leaves.len();
        assert!(leaves <= 10_000 / LEAF_SLOTS + 1, "{leaves} leaves");
        assert_eq!(ix.len(), 10_000);
        assert_eq!(std::mem::size_of::<Slot>(), 40);
    }
}
