//! The in-memory engine: [`MemoryEngine`] and its snapshots.
//!
//! This module owns the ordered, multi-versioned in-memory state (a lock-free
//! skiplist of `(user key, sequence)` versions), the publication of write
//! batches, the registry of live snapshots, garbage collection of versions no
//! snapshot can see any more, and checkpointing that state to snapshot files
//! (and loading it back at startup).
//!
//! # Checkpoints: a base and its deltas
//!
//! A checkpoint is either full (`<index>.snap`: every live key, the
//! snapfile format) or a delta (`<prev>-<index>.delta`: the keys written
//! since the checkpoint at `prev`, each with its value at `index` or a
//! deletion mark, in the same format). The writer records the keys it
//! writes once a base exists; a checkpoint takes that set and a snapshot
//! under the writer lock, so the delta holds exactly what changed between
//! the two checkpoints; after a failed checkpoint the next one is full. Loading reads the newest base, then every delta
//! chained after it in order (a gap is corruption, never skipped). A full
//! checkpoint replaces the chain once its deltas outweigh its base, or
//! after [`MAX_DELTAS`], so a restart reads at most about twice the store
//! and a checkpoint writes about what the WAL wrote since the last one.
//!
//! It must never: let a reader observe part of a batch; remove a version a
//! live snapshot (or an in-flight read) can still see; make readers wait for
//! the writer (readers take at most a short registry lock, never the writer
//! lock); or silently fall back to an older snapshot file when the newest one
//! is corrupt. Durability of individual writes is not its job: between
//! checkpoints, the WAL owned by the server is what survives a crash.
//!
//! # Versioning
//!
//! Every [`WriteBatch`] gets the next sequence number `seq`; each of its ops
//! inserts a version `(key, seq) -> Option<value>` (`None` is a tombstone).
//! Only after all of them are in the skiplist is `seq` published, so a
//! snapshot (which reads "the newest version with a sequence ≤ mine") sees a
//! batch entirely or not at all. The applied index is published together
//! with the sequence under the same lock, so a snapshot's applied index always
//! describes exactly the data it shows.
//!
//! # Garbage collection
//!
//! A snapshot at sequence `s` sees, for each key, the newest version with a
//! sequence ≤ `s`; current and future readers see the newest version. So a
//! version is needed only if it is the newest one at or below some live
//! snapshot's sequence, or the newest overall; every other version can go.
//! A needed tombstone can go too once no older version is left, since then
//! "absent" reads the same as "deleted". The writer collects the keys it
//! just wrote. Keys left with more than one version because snapshots pinned
//! them are queued, and revisited once the *horizon* (the oldest live
//! snapshot's sequence, or the published one if none is held; it never
//! decreases) has moved past the point where they were queued.

use std::borrow::Borrow;
use std::cmp::Ordering as CmpOrdering;
use std::collections::{btree_map, BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use crossbeam_skiplist::{map::Entry, SkipMap};

use crate::any::Urgency;
use crate::snapfile::{self, SnapshotData};
use crate::{BatchOp, Engine, EngineSize, EngineSnapshot, Error, Result, Scan, WriteBatch};

/// What one stored version costs beyond its key and value (skiplist node,
/// sequence, reference counts), in [`EngineSize`] terms.
const VERSION_OVERHEAD: u64 = 64;

fn version_bytes(key: &[u8], value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64 + VERSION_OVERHEAD
}

/// Keys written since the last checkpoint always recorded, however small
/// the store and its cap (see [`WriterState::tracking`]).
const DIRTY_KEYS_FLOOR: usize = 4096;

/// Optimistic (unregistered) point reads retry this often when a write lands
/// underneath them before falling back to a registered snapshot.
const OPTIMISTIC_READ_ATTEMPTS: usize = 3;

/// Deferred keys the writer revisits per write on top of one per op, so the
/// backlog left by a long-held snapshot drains without a latency spike.
const DEFERRED_GC_BUDGET: usize = 32;

/// A scan steps over this many stale versions of one key with `next()`
/// before paying for a fresh O(log n) seek past the key.
const STEPS_BEFORE_SEEK: usize = 4;

const SNAPSHOT_SUFFIX: &str = ".snap";
const TMP_SUFFIX: &str = ".snap.tmp";
const DELTA_SUFFIX: &str = ".delta";
const DELTA_TMP_SUFFIX: &str = ".delta.tmp";

/// Deltas after one base at most; then a full checkpoint starts a chain.
pub const MAX_DELTAS: usize = 16;

/// A delta record's value: a mark byte, then the value for a put.
const DELTA_PUT: u8 = 1;
const DELTA_DELETE: u8 = 0;

/// Sequence given to state loaded from a snapshot file: it precedes every
/// write made after loading, and 0 stays "before anything".
const LOADED_SEQ: u64 = 1;

type VersionMap = SkipMap<InternalKey, Option<Bytes>>;
type VersionEntry<'a> = Entry<'a, InternalKey, Option<Bytes>>;

/// Skiplist key: user key ascending, then sequence descending, so a seek to
/// `(key, s)` lands on the newest version of `key` visible at `s`.
struct InternalKey {
    user_key: UserKey,
    seq: u64,
}

/// Keys up to this long are kept inside the skiplist node.
const INLINE_KEY: usize = 22;

/// A stored key. A short one (MVCC's revision keys are 17 bytes) lives in
/// the skiplist node itself: no allocation of its own and no `Bytes`
/// sharing header (once a `Bytes` is cloned it carries one), about 56 bytes
/// a version less (`cargo bench --bench memory_per_key`). A longer one stays
/// the caller's `Bytes`.
enum UserKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Bytes),
}

impl UserKey {
    /// `key` as stored: copied inline when short (the caller's `Bytes` is
    /// not cloned), shared otherwise.
    fn of(key: &Bytes) -> UserKey {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE_KEY => {
                let mut bytes = [0; INLINE_KEY];
                bytes[..key.len()].copy_from_slice(key);
                UserKey::Inline { len, bytes }
            }
            _ => UserKey::Heap(key.clone()),
        }
    }
}

impl std::ops::Deref for UserKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            UserKey::Inline { len, bytes } => &bytes[..usize::from(*len)],
            UserKey::Heap(key) => key,
        }
    }
}

/// What both stored keys and borrowed lookup probes look like, so lookups
/// can go through `Borrow<dyn VersionedKey>` without allocating a key.
trait VersionedKey {
    fn user_key(&self) -> &[u8];
    fn seq(&self) -> u64;
}

impl VersionedKey for InternalKey {
    fn user_key(&self) -> &[u8] {
        &self.user_key
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

struct Probe<'a> {
    user_key: &'a [u8],
    seq: u64,
}

impl VersionedKey for Probe<'_> {
    fn user_key(&self) -> &[u8] {
        self.user_key
    }
    fn seq(&self) -> u64 {
        self.seq
    }
}

fn compare_versioned(a: &dyn VersionedKey, b: &dyn VersionedKey) -> CmpOrdering {
    a.user_key()
        .cmp(b.user_key())
        .then_with(|| b.seq().cmp(&a.seq()))
}

// `Borrow` requires the borrowed form to order exactly like the owner; both
// go through `compare_versioned`.
impl<'a> Borrow<dyn VersionedKey + 'a> for InternalKey {
    fn borrow(&self) -> &(dyn VersionedKey + 'a) {
        self
    }
}

impl PartialEq for dyn VersionedKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        compare_versioned(self, other) == CmpOrdering::Equal
    }
}
impl Eq for dyn VersionedKey + '_ {}
impl PartialOrd for dyn VersionedKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for dyn VersionedKey + '_ {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        compare_versioned(self, other)
    }
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
        compare_versioned(self, other)
    }
}

/// First version at or after `(key, seq)` (or strictly after it).
fn seek<'m>(
    map: &'m VersionMap,
    key: &[u8],
    seq: u64,
    inclusive: bool,
) -> Option<VersionEntry<'m>> {
    let probe = Probe { user_key: key, seq };
    let probe: &dyn VersionedKey = &probe;
    if inclusive {
        map.lower_bound(Bound::Included(probe))
    } else {
        map.lower_bound(Bound::Excluded(probe))
    }
}

/// The first version of the next user key after `entry`'s.
fn skip_user_key<'m>(map: &'m VersionMap, entry: &VersionEntry<'m>) -> Option<VersionEntry<'m>> {
    let key = &entry.key().user_key;
    let mut cur = entry.next();
    for _ in 0..STEPS_BEFORE_SEEK {
        match cur {
            Some(next) if *next.key().user_key == **key => cur = next.next(),
            other => return other,
        }
    }
    match cur {
        // Sequence 0 sorts after every version of `key`.
        Some(next) if *next.key().user_key == **key => seek(map, key, 0, false),
        other => other,
    }
}

fn before_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Unbounded => true,
        Bound::Included(end) => key <= end,
        Bound::Excluded(end) => key < end,
    }
}

/// What readers need to pin a consistent point: published under one lock so
/// sequence, applied index and registration can never disagree.
struct Published {
    seq: u64,
    applied_index: u64,
    /// Sequence -> number of live snapshots at it.
    held: BTreeMap<u64, usize>,
}

impl Published {
    fn pins(&self) -> Pins {
        Pins {
            held: self.held.keys().copied().collect(),
            published: self.seq,
        }
    }
}

/// The sequences live snapshots held when a GC pass started. Snapshots
/// taken later hold the published sequence and see only the newest
/// versions, which GC always keeps; ones released later just make the pass
/// conservative.
struct Pins {
    /// Distinct, ascending.
    held: Vec<u64>,
    published: u64,
}

impl Pins {
    fn horizon(&self) -> u64 {
        self.held.first().copied().unwrap_or(self.published)
    }

    /// Whether some snapshot's sequence is in `lo..hi`, i.e. would see the
    /// version `lo` whose next newer version is `hi`.
    fn any_in(&self, lo: u64, hi: u64) -> bool {
        let first_at_or_above = self.held.partition_point(|&seq| seq < lo);
        self.held
            .get(first_at_or_above)
            .is_some_and(|&seq| seq < hi)
    }
}

struct WriterState {
    last_seq: u64,
    applied_index: u64,
    /// Keys a snapshot kept from being fully collected, with the horizon at
    /// which that was last tried; horizons are non-decreasing front to back.
    deferred: VecDeque<(u64, Bytes)>,
    deferred_keys: HashSet<Bytes>,
    /// Whether writes are recorded in `dirty` (a checkpoint chain exists
    /// to add a delta to, and the set stayed smaller than the store).
    tracking: bool,
    /// Keys written since the last checkpoint, while `tracking`.
    dirty: HashSet<Bytes>,
    /// What a delta of `dirty` would take on disk, about: each write's
    /// record (a key written twice counts twice, which errs towards a
    /// full checkpoint).
    dirty_bytes: u64,
    /// Recorded bytes past which the next checkpoint is full anyway (see
    /// [`MemoryEngine::wants_full`]): recording stops there.
    dirty_cap: u64,
}

/// A delta record's size on disk: the snapfile record header, the mark
/// byte, the key and the value.
fn delta_record_bytes(key: &[u8], value: Option<&Bytes>) -> u64 {
    (snapfile::RECORD_HEADER_LEN as usize + 1 + key.len() + value.map_or(0, |v| v.len())) as u64
}

impl Chain {
    /// Bytes a next delta may take before the chain's deltas would
    /// outweigh its base (then the checkpoint is full).
    fn dirty_cap(&self) -> u64 {
        self.base
            .map_or(0, |(_, bytes)| bytes.saturating_sub(self.delta_bytes))
    }
}

/// The checkpoint files a directory holds for this engine: the base, and
/// the deltas chained after it.
#[derive(Debug, Clone, Default)]
struct Chain {
    /// The directory the chain is in (a checkpoint elsewhere is full).
    dir: PathBuf,
    /// The base's applied index and length, if there is one.
    base: Option<(u64, u64)>,
    /// The applied index of the newest file of the chain.
    last: u64,
    deltas: usize,
    delta_bytes: u64,
}

struct Inner {
    versions: VersionMap,
    visible_seq: AtomicU64,
    applied_index: AtomicU64,
    durable_applied_index: AtomicU64,
    live_keys: AtomicUsize,
    /// Bytes of the newest live version of every key (keys, values and
    /// [`VERSION_OVERHEAD`] each): the engine's [`EngineSize`].
    live_bytes: AtomicU64,
    published: Mutex<Published>,
    writer: Mutex<WriterState>,
    /// The checkpoint chain on disk (only checkpoints, one at a time, and
    /// loading change it).
    chain: Mutex<Chain>,
    /// Tests: write a delta whenever one can be written, however it
    /// compares with the base.
    deltas_whenever_possible: std::sync::atomic::AtomicBool,
}

impl Inner {
    fn new(seq: u64, applied_index: u64) -> Self {
        Inner {
            versions: SkipMap::new(),
            visible_seq: AtomicU64::new(seq),
            applied_index: AtomicU64::new(applied_index),
            durable_applied_index: AtomicU64::new(0),
            live_keys: AtomicUsize::new(0),
            live_bytes: AtomicU64::new(0),
            published: Mutex::new(Published {
                seq,
                applied_index,
                held: BTreeMap::new(),
            }),
            writer: Mutex::new(WriterState {
                last_seq: seq,
                applied_index,
                deferred: VecDeque::new(),
                deferred_keys: HashSet::new(),
                tracking: false,
                dirty: HashSet::new(),
                dirty_bytes: 0,
                dirty_cap: 0,
            }),
            chain: Mutex::new(Chain::default()),
            deltas_whenever_possible: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Applies one record of a delta file to state being loaded (every
    /// version at [`LOADED_SEQ`]).
    fn load_delta_record(&self, path: &Path, key: Bytes, record: Bytes) -> Result<()> {
        let loaded = InternalKey {
            user_key: UserKey::of(&key),
            seq: LOADED_SEQ,
        };
        match record.first() {
            Some(&DELTA_PUT) => {
                self.versions.insert(loaded, Some(record.slice(1..)));
            }
            Some(&DELTA_DELETE) if record.len() == 1 => {
                self.versions.remove(&loaded);
            }
            _ => {
                return Err(Error::Corrupt {
                    what: "delta checkpoint",
                    path: path.to_path_buf(),
                    offset: 0,
                    reason: format!(
                        "a record of key {:02x?} is neither a put nor a deletion",
                        &loaded.user_key[..loaded.user_key.len().min(32)]
                    ),
                })
            }
        }
        Ok(())
    }

    fn chain(&self) -> MutexGuard<'_, Chain> {
        self.chain.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn writer_state(&self) -> Result<MutexGuard<'_, WriterState>> {
        self.writer.lock().map_err(|_| {
            // Unpublished versions of the interrupted batch may be in the
            // map; publishing any later sequence would expose them.
            Error::Poisoned("a memory engine write panicked mid-batch".to_owned())
        })
    }

    /// `chain` is what the directory now holds: later writes are recorded
    /// for the next delta.
    fn adopt_chain(&self, chain: Chain) -> Result<()> {
        self.update_chain(|now| *now = chain);
        let mut writer = self.writer_state()?;
        writer.tracking = true;
        writer.dirty.clear();
        writer.dirty_bytes = 0;
        Ok(())
    }

    /// Changes the chain (a checkpoint was added, or the directory's chain
    /// loaded): keys are then recorded up to its new cap.
    fn update_chain(&self, change: impl FnOnce(&mut Chain)) {
        let cap = {
            let mut chain = self.chain();
            change(&mut chain);
            chain.dirty_cap()
        };
        if let Ok(mut writer) = self.writer_state() {
            writer.dirty_cap = cap;
        }
    }

    /// The registry only holds counters that every critical section leaves
    /// consistent, so a panic elsewhere cannot have broken it.
    fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self) -> (u64, u64) {
        let mut published = self.published();
        let (seq, applied) = (published.seq, published.applied_index);
        *published.held.entry(seq).or_insert(0) += 1;
        (seq, applied)
    }

    fn release(&self, seq: u64) {
        let mut published = self.published();
        if let btree_map::Entry::Occupied(mut held) = published.held.entry(seq) {
            *held.get_mut() -= 1;
            if *held.get() == 0 {
                held.remove();
            }
        }
    }

    /// The newest value of `key` visible at `seq`.
    fn get_at(&self, seq: u64, key: &[u8]) -> Option<Bytes> {
        let entry = seek(&self.versions, key, seq, true)?;
        if *entry.key().user_key != *key {
            return None;
        }
        entry.value().clone()
    }

    fn scan_at<F>(&self, seq: u64, start: Bound<&[u8]>, end: Bound<&[u8]>, mut visit: F)
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        let mut cur = match start {
            Bound::Unbounded => self.versions.front(),
            Bound::Included(key) => seek(&self.versions, key, u64::MAX, true),
            Bound::Excluded(key) => seek(&self.versions, key, 0, false),
        };
        while let Some(entry) = cur {
            let version = entry.key();
            if !before_end(&version.user_key, end) {
                return;
            }
            if version.seq > seq {
                // Written after this snapshot: jump to what it can see.
                cur = seek(&self.versions, &version.user_key, seq, true);
                continue;
            }
            if let Some(value) = entry.value() {
                if visit(&version.user_key, value) == Scan::Stop {
                    return;
                }
            }
            cur = skip_user_key(&self.versions, &entry);
        }
    }

    /// The size (as [`version_bytes`]) of the newest version of `key`
    /// (published or not) if it is a value.
    fn newest_live_bytes(&self, key: &[u8]) -> Option<u64> {
        let entry = seek(&self.versions, key, u64::MAX, true)?;
        if *entry.key().user_key != *key {
            return None;
        }
        entry.value().as_ref().map(|v| version_bytes(key, v))
    }

    /// Drops the versions of `key` no snapshot in `pins` (nor any newer
    /// reader) can see. Returns whether the key is fully collected (at most
    /// one version left, and that a value), i.e. needs no later visit.
    fn collect_key(&self, key: &[u8], pins: &Pins) -> bool {
        let mut cur = seek(&self.versions, key, u64::MAX, true);
        let mut newer_seq: Option<u64> = None;
        let mut kept = 0usize;
        // Kept tombstones with no kept value older than them yet.
        let mut trailing_tombstones: Vec<VersionEntry<'_>> = Vec::new();
        while let Some(entry) = cur {
            if *entry.key().user_key != *key {
                break;
            }
            let seq = entry.key().seq;
            let next = entry.next();
            let needed = newer_seq.is_none_or(|newer| pins.any_in(seq, newer));
            newer_seq = Some(seq);
            if !needed {
                entry.remove();
            } else if entry.value().is_some() {
                kept += 1;
                trailing_tombstones.clear();
            } else {
                kept += 1;
                trailing_tombstones.push(entry);
            }
            cur = next;
        }
        // Every unneeded version older than these tombstones was removed
        // above, so removing them only turns a "deleted" answer into
        // "absent": the same answer. Never the other way round, or an older
        // value would resurface.
        for tombstone in trailing_tombstones.iter().rev() {
            tombstone.remove();
        }
        kept - trailing_tombstones.len() <= 1
    }

    fn defer(writer: &mut WriterState, horizon: u64, key: &Bytes) {
        if writer.deferred_keys.insert(key.clone()) {
            writer.deferred.push_back((horizon, key.clone()));
        }
    }

    /// Revisits deferred keys whose pinning snapshots may have gone: those
    /// queued before the horizon last moved, or all if nothing is held.
    fn sweep_deferred(&self, writer: &mut WriterState, pins: &Pins, budget: usize) {
        let horizon = pins.horizon();
        for _ in 0..budget {
            match writer.deferred.front() {
                Some((tried_at, _)) if *tried_at < horizon || pins.held.is_empty() => {}
                _ => return,
            }
            let Some((_, key)) = writer.deferred.pop_front() else {
                return;
            };
            writer.deferred_keys.remove(&key);
            if !self.collect_key(&key, pins) {
                Self::defer(writer, horizon, &key);
            }
        }
    }

    fn collect_garbage(&self, writer: &mut WriterState) {
        let pins = self.published().pins();
        // Pairs with the fence in optimistic reads; see `write`.
        fence(Ordering::Release);
        self.sweep_deferred(writer, &pins, usize::MAX);
    }
}

/// An in-memory [`Engine`] with multi-versioned, non-blocking snapshots.
///
/// Cloning is cheap and every clone is the same engine. Durability comes
/// from [`MemoryEngine::checkpoint`] snapshot files (plus the server's WAL).
#[derive(Clone)]
pub struct MemoryEngine {
    inner: Arc<Inner>,
}

impl Default for MemoryEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryEngine")
            .field(
                "visible_seq",
                &self.inner.visible_seq.load(Ordering::Relaxed),
            )
            .field("applied_index", &self.applied_index())
            .field("durable_applied_index", &self.durable_applied_index())
            .field("live_keys", &self.len_hint())
            .field("internal_entries", &self.internal_entry_count())
            .finish()
    }
}

impl MemoryEngine {
    /// An empty engine with applied index 0 and no snapshot file.
    pub fn new() -> Self {
        MemoryEngine {
            inner: Arc::new(Inner::new(0, 0)),
        }
    }

    /// Loads the newest base checkpoint in `dir` and the deltas chained
    /// after it (creating `dir` if needed).
    ///
    /// Leftover `*.tmp` files from an interrupted checkpoint are deleted,
    /// and so are deltas older than the base. If a file of the chain is
    /// corrupt, or a delta does not follow the one before, this fails with
    /// [`Error::Corrupt`] naming it instead of falling back to an older
    /// state: silently losing acknowledged state is worse than refusing to
    /// start.
    pub fn open(dir: &Path) -> Result<MemoryEngine> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create snapshot dir", dir, e))?;
        let mut newest: Option<(u64, PathBuf)> = None;
        let mut deltas: Vec<(u64, u64, PathBuf)> = Vec::new();
        for (name, path) in list_dir(dir)? {
            if name.ends_with(TMP_SUFFIX) || name.ends_with(DELTA_TMP_SUFFIX) {
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io("remove stale snapshot tmp", &path, e))?;
            } else if let Some(index) = parse_snapshot_name(&name) {
                if newest.as_ref().is_none_or(|(best, _)| index > *best) {
                    newest = Some((index, path));
                }
            } else if let Some((prev, index)) = parse_delta_name(&name) {
                deltas.push((prev, index, path));
            }
        }
        let Some((index, path)) = newest else {
            if let Some((_, _, path)) = deltas.first() {
                return Err(chain_break(path, "a delta checkpoint without a base"));
            }
            return Ok(MemoryEngine::new());
        };
        // Streamed into the map record by record: reading the file into a
        // list first would hold every record twice at the peak (and leave
        // the allocator holding that peak after).
        let inner = Inner::new(LOADED_SEQ, index);
        let applied_index = snapfile::read_with(&path, |key, value| {
            inner.versions.insert(
                InternalKey {
                    user_key: UserKey::of(&key),
                    seq: LOADED_SEQ,
                },
                Some(value),
            );
            Ok(())
        })?;
        if applied_index != index {
            return Err(name_disagrees(path, applied_index, index));
        }
        let mut chain = Chain {
            dir: dir.to_path_buf(),
            base: Some((index, file_len(&path)?)),
            last: index,
            ..Chain::default()
        };
        deltas.sort_by_key(|(_, index, _)| *index);
        for (prev, delta_index, path) in deltas {
            if delta_index <= index {
                // Left by a crash after the base that replaced it.
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io("remove superseded delta", &path, e))?;
                continue;
            }
            if prev != chain.last {
                return Err(chain_break(
                    &path,
                    &format!(
                        "it follows {prev:016x}, the chain ends at {:016x}",
                        chain.last
                    ),
                ));
            }
            let applied = snapfile::read_with(&path, |key, record| {
                inner.load_delta_record(&path, key, record)
            })?;
            if applied != delta_index {
                return Err(name_disagrees(path, applied, delta_index));
            }
            chain.last = delta_index;
            chain.deltas += 1;
            chain.delta_bytes += file_len(&path)?;
        }
        inner.applied_index.store(chain.last, Ordering::Release);
        inner.published().applied_index = chain.last;
        inner.writer_state()?.applied_index = chain.last;
        let engine = MemoryEngine::with_loaded(inner).durable_at(chain.last);
        engine.inner.adopt_chain(chain)?;
        Ok(engine)
    }

    /// An engine holding exactly `data` (e.g. a snapshot received from a
    /// leader). Its durable applied index is 0 until it is checkpointed.
    pub fn from_snapshot_data(data: SnapshotData) -> MemoryEngine {
        let inner = Inner::new(LOADED_SEQ, data.applied_index);
        for (key, value) in data.entries {
            inner.versions.insert(
                InternalKey {
                    user_key: UserKey::of(&key),
                    seq: LOADED_SEQ,
                },
                Some(value),
            );
        }
        MemoryEngine::with_loaded(inner)
    }

    /// This engine, its state known durable (in a snapshot file) at `index`.
    fn durable_at(self, index: u64) -> MemoryEngine {
        self.inner
            .durable_applied_index
            .store(index, Ordering::Release);
        self
    }

    /// An engine around `inner`, whose map holds loaded versions only:
    /// counts its live keys and bytes from the map (duplicate keys in a
    /// source collapsed there).
    fn with_loaded(inner: Inner) -> MemoryEngine {
        let (keys, bytes) = inner
            .versions
            .iter()
            .filter_map(|e| {
                e.value()
                    .as_ref()
                    .map(|v| version_bytes(&e.key().user_key, v))
            })
            .fold((0usize, 0u64), |(n, b), v| (n + 1, b + v));
        inner.live_keys.store(keys, Ordering::Relaxed);
        inner.live_bytes.store(bytes, Ordering::Relaxed);
        MemoryEngine {
            inner: Arc::new(inner),
        }
    }

    /// Makes the current state durable in `dir`: a delta of the keys
    /// written since the last checkpoint (`<prev>-<index>.delta`), or a full
    /// snapshot (`<index>.snap`, then the older chain is deleted) when there
    /// is no chain to add to or it is long enough (see the module docs).
    /// Each file goes tmp, fdatasync, rename, directory fsync. Returns the
    /// applied index written. Must run on a glommio executor; the file is
    /// written on a thread of its own, so the caller's core keeps serving.
    /// Run at most one checkpoint per directory at a time; writes may
    /// continue meanwhile.
    pub async fn checkpoint(&self, dir: &Path) -> Result<u64> {
        // The snapshot and the keys written before it, taken together:
        // writes after the snapshot go to the next delta.
        let (snapshot, tracked, dirty, dirty_bytes) = {
            let mut writer = self.inner.writer_state()?;
            let snapshot = self.snapshot();
            let tracked = std::mem::replace(&mut writer.tracking, true);
            let dirty_bytes = std::mem::take(&mut writer.dirty_bytes);
            (
                snapshot,
                tracked,
                std::mem::take(&mut writer.dirty),
                dirty_bytes,
            )
        };
        let index = snapshot.applied_index();
        let chain = self.inner.chain().clone();
        let full = !tracked
            || self.wants_full(&chain, dirty_bytes)
            || index == chain.last
            || chain.dir != dir;
        let written = if full {
            // Not needed, and the write may take seconds.
            drop(dirty);
            self.write_full(dir, snapshot, index).await
        } else {
            let mut keys: Vec<Bytes> = dirty.into_iter().collect();
            keys.sort_unstable();
            self.write_delta(dir, snapshot, &chain, Arc::new(keys))
                .await
        };
        if written.is_err() {
            // The file may be in place even so (only the directory's fsync
            // failed): a delta after it, or after the chain it was to end,
            // would not chain. The next checkpoint is full: it supersedes
            // whatever this one left.
            let mut writer = self.inner.writer_state()?;
            writer.tracking = false;
            writer.dirty = HashSet::new();
            writer.dirty_bytes = 0;
        }
        written
    }

    /// Whether the next checkpoint should rewrite the whole store: there
    /// is no chain to add a delta to, or the chain has [`MAX_DELTAS`], or
    /// its deltas with this one (`dirty_bytes`, counted as the writes
    /// came) would outweigh its base.
    fn wants_full(&self, chain: &Chain, dirty_bytes: u64) -> bool {
        let Some((_, base_bytes)) = chain.base else {
            return true;
        };
        if chain.deltas >= MAX_DELTAS {
            return true;
        }
        if self.inner.deltas_whenever_possible.load(Ordering::Relaxed) {
            return false;
        }
        chain.delta_bytes.saturating_add(dirty_bytes) > base_bytes
    }

    /// Tests: checkpoints write deltas whenever a chain exists in their
    /// directory (at most [`MAX_DELTAS`] after a base), even when a full
    /// checkpoint would be as small.
    #[doc(hidden)]
    pub fn set_deltas_whenever_possible(&self, on: bool) {
        self.inner
            .deltas_whenever_possible
            .store(on, Ordering::Relaxed);
    }

    /// Whether the next checkpoint will serialise the whole store, not just
    /// what changed since the last one (for pacing checkpoints).
    pub fn next_checkpoint_rewrites_store(&self) -> bool {
        let Ok(writer) = self.inner.writer_state() else {
            return true;
        };
        let dirty_bytes = writer.dirty_bytes;
        let tracking = writer.tracking;
        drop(writer);
        !tracking || self.wants_full(&self.inner.chain(), dirty_bytes)
    }

    /// Writes `content` (a snapshot, or a delta's view of one) as
    /// `dir/name` durably: tmp file, fdatasync, rename, directory fsync.
    /// Then the engine is durable at the content's applied index. Returns
    /// the file's length.
    async fn write_checkpoint_file<S: EngineSnapshot>(
        &self,
        dir: &Path,
        name: &str,
        content: S,
    ) -> Result<u64> {
        let index = content.applied_index();
        let final_path = dir.join(name);
        let tmp_path = dir.join(format!("{name}.tmp"));
        // Serialising a large engine is seconds of CPU: do it on a separate,
        // unpinned executor thread (still io_uring direct I/O) so the caller's
        // core keeps committing. The blocking-pool thread only waits for it.
        // snapfile::write cleans up its own partial file on failure; the
        // versions the snapshot pinned are collected incrementally by later
        // writes once it is dropped there.
        let len = write_snapshot_file_off_core(content, &tmp_path, Urgency::Background).await?;
        glommio::io::rename(&tmp_path, &final_path)
            .await
            .map_err(|e| Error::glommio("rename checkpoint into place", &final_path, e))?;
        sync_dir(dir).await?;
        self.inner
            .durable_applied_index
            .fetch_max(index, Ordering::AcqRel);
        Ok(len)
    }

    async fn write_full(&self, dir: &Path, snapshot: MemorySnapshot, index: u64) -> Result<u64> {
        let len = self
            .write_checkpoint_file(dir, &snapshot_name(index), snapshot)
            .await?;
        self.inner.update_chain(|chain| {
            *chain = Chain {
                dir: dir.to_path_buf(),
                base: Some((index, len)),
                last: index,
                ..Chain::default()
            }
        });

        // The new file is durable, so older ones and every delta are
        // garbage. Failing to delete one only costs disk space (an open
        // deletes superseded deltas, and the next full checkpoint retries),
        // so it must not turn a durable checkpoint into an error.
        if let Ok(files) = list_dir(dir) {
            for (file_name, path) in files {
                let older = parse_snapshot_name(&file_name).is_some_and(|older| older < index);
                if older || parse_delta_name(&file_name).is_some() {
                    let _ = glommio::io::remove(&path).await;
                }
            }
        }
        Ok(index)
    }

    async fn write_delta(
        &self,
        dir: &Path,
        snapshot: MemorySnapshot,
        chain: &Chain,
        keys: Arc<Vec<Bytes>>,
    ) -> Result<u64> {
        let index = snapshot.applied_index();
        let name = delta_name(chain.last, index);
        let len = self
            .write_checkpoint_file(dir, &name, DeltaView { snapshot, keys })
            .await?;
        self.inner.update_chain(|chain| {
            chain.last = index;
            chain.deltas += 1;
            chain.delta_bytes += len;
        });
        Ok(index)
    }

    /// Adopts a complete snapshot file received from elsewhere (a Raft
    /// leader): verifies it, makes it `dir`'s newest snapshot durably and
    /// returns an engine holding exactly its state. Older snapshot files in
    /// `dir` are deleted. The caller swaps the returned engine in for the
    /// old one; the old one is not modified.
    pub async fn install_snapshot_file(dir: &Path, file: &Path) -> Result<MemoryEngine> {
        let data = snapfile::read(file)?;
        let index = data.applied_index;
        let final_path = dir.join(snapshot_name(index));
        glommio::io::rename(file, &final_path)
            .await
            .map_err(|e| Error::glommio("rename received snapshot into place", &final_path, e))?;
        sync_dir(dir).await?;
        let len = file_len(&final_path)?;
        if let Ok(files) = list_dir(dir) {
            for (file_name, path) in files {
                let other = parse_snapshot_name(&file_name).is_some_and(|other| other != index);
                if other || parse_delta_name(&file_name).is_some() {
                    let _ = glommio::io::remove(&path).await;
                }
            }
        }
        let engine = MemoryEngine::from_snapshot_data(data).durable_at(index);
        engine.inner.adopt_chain(Chain {
            dir: dir.to_path_buf(),
            base: Some((index, len)),
            last: index,
            ..Chain::default()
        })?;
        Ok(engine)
    }

    /// Number of live (non-deleted) keys in the latest state.
    pub fn len_hint(&self) -> usize {
        self.inner.live_keys.load(Ordering::Relaxed)
    }

    /// Versions and tombstones currently stored, for GC tests.
    #[doc(hidden)]
    pub fn internal_entry_count(&self) -> usize {
        self.inner.versions.len()
    }

    /// Collects every version that no live snapshot needs any more.
    ///
    /// Writes do this incrementally; this is for after releasing a long-held
    /// snapshot when no writes are coming. Blocks while a write is running.
    pub fn collect_garbage(&self) {
        // A poisoned writer refuses writes; leaving its garbage is harmless.
        if let Ok(mut writer) = self.inner.writer.lock() {
            self.inner.collect_garbage(&mut writer);
        }
    }
}

/// Writes `snapshot` to `path` (as [`snapfile::write`]) on a short-lived,
/// unpinned executor thread: serialising a large engine is seconds of CPU
/// that must not run on the caller's core, which keeps committing. The
/// caller's executor only waits, without holding its blocking pool (see
/// [`crate::any::off_core`]). Returns the file's length.
pub async fn write_snapshot_file_off_core<S: EngineSnapshot>(
    snapshot: S,
    path: &Path,
    urgency: Urgency,
) -> Result<u64> {
    let tmp = path.to_path_buf();
    let err_path = path.to_path_buf();
    crate::any::off_core((), urgency, move |()| {
        let executor_error =
            |e: String| Error::io("snapshot executor", &err_path, std::io::Error::other(e));
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .name("metcd-snapshot")
            .io_memory(CHECKPOINT_IO_MEMORY)
            .spawn(move || async move {
                let _background =
                    (urgency == Urgency::Background).then(crate::any::BackgroundThread::enter);
                // A timer bounds every sleep of this executor: once, in a
                // test, it slept 15 minutes in io_uring_enter with the
                // write's completion unreaped, until a signal woke it (a
                // lost wake-up, glommio 0.9 on Linux 6.18). Woken every
                // REAP_EVERY, it reaps what came meanwhile and goes on.
                let reaper = glommio::spawn_local(async {
                    loop {
                        glommio::timer::sleep(REAP_EVERY).await;
                    }
                });
                // Tests: a checkpoint that starves until it is hurried (as
                // one at nice 19 on cores kept busy can).
                if checkpoint_starves() {
                    crate::any::wait_until_hurried(std::time::Duration::from_secs(60));
                }
                let written = snapfile::write(&snapshot, &tmp).await;
                drop(reaper);
                written
            })
            .map_err(|e| executor_error(e.to_string()))?
            .join()
            .map_err(|e| executor_error(e.to_string()))?
    })
    .await
}

/// Failpoint `memory::checkpoint_until_hurried` (tests; never set
/// otherwise).
fn checkpoint_starves() -> bool {
    fail::fail_point!("memory::checkpoint_until_hurried", |_| true);
    false
}

/// The longest the checkpoint executor sleeps before it looks for I/O
/// completions again (see `write_snapshot_file_off_core`).
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Locked I/O memory of the short-lived checkpoint executor (its buffers
/// fall back to ordinary aligned allocations beyond this).
const CHECKPOINT_IO_MEMORY: usize = 256 << 10;

impl Engine for MemoryEngine {
    type Snapshot = MemorySnapshot;

    fn write(&self, batch: WriteBatch) -> Result<()> {
        let inner = &*self.inner;
        let mut writer = inner.writer_state()?;
        if let Some(index) = batch.applied_index() {
            if index < writer.applied_index {
                return Err(Error::Invalid(format!(
                    "applied index would go backwards from {} to {index}",
                    writer.applied_index
                )));
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        let applied_index = batch.applied_index().unwrap_or(writer.applied_index);
        let seq = writer.last_seq + 1;
        let mut ops = batch.into_ops();

        let mut became_live = 0usize;
        let mut became_dead = 0usize;
        let (mut bytes_added, mut bytes_gone) = (0u64, 0u64);
        let tracking = writer.tracking;
        for op in &mut ops {
            // The value moves into the map: a clone would give the caller's
            // `Bytes` a sharing header (32 bytes) that the map then keeps
            // for as long as the version lives.
            let (key, value) = match op {
                BatchOp::Put { key, value } => (&*key, Some(std::mem::take(value))),
                BatchOp::Delete { key } => (&*key, None),
            };
            if tracking {
                writer.dirty_bytes += delta_record_bytes(key, value.as_ref());
            }
            let before = inner.newest_live_bytes(key);
            bytes_gone += before.unwrap_or(0);
            bytes_added += value.as_ref().map_or(0, |v| version_bytes(key, v));
            match (before.is_some(), value.is_some()) {
                (false, true) => became_live += 1,
                (true, false) => became_dead += 1,
                _ => {}
            }
            // A key repeated in the batch replaces its own version: last wins.
            inner.versions.insert(
                InternalKey {
                    user_key: UserKey::of(key),
                    seq,
                },
                value,
            );
        }
        writer.last_seq = seq;
        writer.applied_index = applied_index;
        if writer.tracking {
            for op in &ops {
                let key = match op {
                    BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
                };
                writer.dirty.insert(key.clone());
            }
            // Past its cap the next checkpoint is full whatever else is
            // written: stop recording (and holding the keys).
            if writer.dirty_bytes > writer.dirty_cap && writer.dirty.len() > DIRTY_KEYS_FLOOR {
                writer.tracking = false;
                writer.dirty = HashSet::new();
                writer.dirty_bytes = 0;
            }
        }

        let pins = {
            let mut published = inner.published();
            published.seq = seq;
            published.applied_index = applied_index;
            inner.applied_index.store(applied_index, Ordering::Release);
            inner.visible_seq.store(seq, Ordering::Release);
            published.pins()
        };
        // Optimistic reads at the previous sequence validate by re-reading
        // `visible_seq` after an acquire fence; this release fence makes any
        // removal below that they observe imply they also observe `seq`.
        fence(Ordering::Release);

        inner.live_keys.fetch_add(became_live, Ordering::Relaxed);
        inner.live_keys.fetch_sub(became_dead, Ordering::Relaxed);
        // One writer at a time: a plain read-modify-write is enough.
        let bytes =
            (inner.live_bytes.load(Ordering::Relaxed) + bytes_added).saturating_sub(bytes_gone);
        inner.live_bytes.store(bytes, Ordering::Relaxed);

        for op in &ops {
            let key = match op {
                BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
            };
            if !inner.collect_key(key, &pins) {
                Inner::defer(&mut writer, pins.horizon(), key);
            }
        }
        inner.sweep_deferred(&mut writer, &pins, DEFERRED_GC_BUDGET + ops.len());
        Ok(())
    }

    fn snapshot(&self) -> MemorySnapshot {
        let (seq, applied_index) = self.inner.register();
        MemorySnapshot {
            inner: Arc::clone(&self.inner),
            seq,
            applied_index,
        }
    }

    fn applied_index(&self) -> u64 {
        self.inner.applied_index.load(Ordering::Acquire)
    }

    fn durable_applied_index(&self) -> u64 {
        self.inner.durable_applied_index.load(Ordering::Acquire)
    }

    /// The latest state's live bytes. Versions only a snapshot still pins
    /// are not counted: they go when it does.
    fn size(&self) -> EngineSize {
        let bytes = self.inner.live_bytes.load(Ordering::Relaxed);
        EngineSize {
            total_bytes: bytes,
            in_use_bytes: bytes,
        }
    }

    /// A point read without registering a snapshot (no lock): read at the
    /// published sequence, then confirm no newer batch was published
    /// meanwhile, since only a newer batch's GC can remove what that
    /// sequence sees. Falls back to a registered snapshot under contention.
    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let inner = &*self.inner;
        for _ in 0..OPTIMISTIC_READ_ATTEMPTS {
            let seq = inner.visible_seq.load(Ordering::Acquire);
            let value = inner.get_at(seq, key);
            fence(Ordering::Acquire);
            if inner.visible_seq.load(Ordering::Relaxed) == seq {
                return Ok(value);
            }
        }
        self.snapshot().get(key)
    }
}

/// A consistent view of a [`MemoryEngine`]; keeps the versions it can see
/// alive until dropped. Cheap to clone.
pub struct MemorySnapshot {
    inner: Arc<Inner>,
    seq: u64,
    applied_index: u64,
}

impl Clone for MemorySnapshot {
    fn clone(&self) -> Self {
        // Registered again so each clone's drop releases only itself.
        let mut published = self.inner.published();
        *published.held.entry(self.seq).or_insert(0) += 1;
        drop(published);
        MemorySnapshot {
            inner: Arc::clone(&self.inner),
            seq: self.seq,
            applied_index: self.applied_index,
        }
    }
}

impl Drop for MemorySnapshot {
    fn drop(&mut self) {
        self.inner.release(self.seq);
    }
}

impl fmt::Debug for MemorySnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySnapshot")
            .field("seq", &self.seq)
            .field("applied_index", &self.applied_index)
            .finish()
    }
}

impl EngineSnapshot for MemorySnapshot {
    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        Ok(self.inner.get_at(self.seq, key))
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        self.inner.scan_at(self.seq, start, end, visit);
        Ok(())
    }
}

fn snapshot_name(index: u64) -> String {
    format!("{index:016x}{SNAPSHOT_SUFFIX}")
}

/// The applied index encoded in a snapshot file name, if it is one.
fn parse_snapshot_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(SNAPSHOT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn delta_name(prev: u64, index: u64) -> String {
    format!("{prev:016x}-{index:016x}{DELTA_SUFFIX}")
}

/// The (previous, own) applied indexes in a delta file name, if it is one.
fn parse_delta_name(name: &str) -> Option<(u64, u64)> {
    let (prev, index) = name.strip_suffix(DELTA_SUFFIX)?.split_once('-')?;
    let hex = |h: &str| {
        (h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(h, 16).ok())
            .flatten()
    };
    Some((hex(prev)?, hex(index)?))
}

fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| Error::io("stat checkpoint file", path, e))
}

fn chain_break(path: &Path, reason: &str) -> Error {
    Error::Corrupt {
        what: "delta checkpoint",
        path: path.to_path_buf(),
        offset: 0,
        reason: format!("not part of the checkpoint chain: {reason}"),
    }
}

fn name_disagrees(path: PathBuf, header: u64, named: u64) -> Error {
    Error::Corrupt {
        what: "snapshot file",
        path,
        offset: snapfile::APPLIED_INDEX_OFFSET,
        reason: format!("header applied index {header} does not match the file name's {named}"),
    }
}

/// What a delta checkpoint holds, as an engine snapshot the snapfile
/// writer can scan: each of `keys` (sorted) with its value at `snapshot`
/// after a [`DELTA_PUT`] mark, or a lone [`DELTA_DELETE`] mark.
struct DeltaView {
    snapshot: MemorySnapshot,
    keys: Arc<Vec<Bytes>>,
}

impl DeltaView {
    fn record(&self, key: &[u8]) -> Bytes {
        match self.snapshot.inner.get_at(self.snapshot.seq, key) {
            Some(value) => {
                let mut record = Vec::with_capacity(1 + value.len());
                record.push(DELTA_PUT);
                record.extend_from_slice(&value);
                Bytes::from(record)
            }
            None => Bytes::from_static(&[DELTA_DELETE]),
        }
    }
}

impl EngineSnapshot for DeltaView {
    fn applied_index(&self) -> u64 {
        self.snapshot.applied_index
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let found = self.keys.binary_search_by(|k| k.as_ref().cmp(key)).is_ok();
        Ok(found.then(|| self.record(key)))
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, mut visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        let from = match start {
            Bound::Unbounded => 0,
            Bound::Included(s) => self.keys.partition_point(|k| k.as_ref() < s),
            Bound::Excluded(s) => self.keys.partition_point(|k| k.as_ref() <= s),
        };
        for key in &self.keys[from..] {
            if !before_end(key, end) {
                break;
            }
            if matches!(visit(key, &self.record(key)), Scan::Stop) {
                break;
            }
        }
        Ok(())
    }
}

/// `(file name, path)` of every entry in `dir` whose name is UTF-8 (ours
/// always are; anything else is not ours to touch).
fn list_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("list snapshot dir", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list snapshot dir", dir, e))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

/// Makes a rename in `dir` durable.
async fn sync_dir(dir: &Path) -> Result<()> {
    let handle = glommio::io::Directory::open(dir)
        .await
        .map_err(|e| Error::glommio("open snapshot dir", dir, e))?;
    let synced = handle
        .sync()
        .await
        .map_err(|e| Error::glommio("fsync snapshot dir", dir, e));
    let closed = handle
        .close()
        .await
        .map_err(|e| Error::glommio("close snapshot dir", dir, e));
    synced.and(closed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// An inline key costs the node no more than the `Bytes` it replaces,
    /// and reads back as the bytes it was given, at every length around
    /// the inline limit.
    #[test]
    fn short_keys_live_in_the_node_and_read_back() {
        assert!(std::mem::size_of::<UserKey>() <= std::mem::size_of::<Bytes>());
        for len in [0, 1, 17, INLINE_KEY - 1, INLINE_KEY, INLINE_KEY + 1, 100] {
            let key = Bytes::from((0..len).map(|i| i as u8 ^ 0x5a).collect::<Vec<u8>>());
            let stored = UserKey::of(&key);
            assert_eq!(&*stored, &key[..], "length {len}");
            assert_eq!(matches!(stored, UserKey::Inline { .. }), len <= INLINE_KEY);
        }
    }
}
