//! The MVCC store: etcd v3's revisioned key space on top of an
//! [`Engine`], applied one Raft entry at a time.
//!
//! It owns the in-memory [`KeyIndex`], the current and compacted revisions,
//! and the `k`/`m` key spaces of the engine. It must never half-apply a
//! request, never panic on any request, and never depend on anything but
//! the engine state and the request (every replica must compute the same
//! bytes); it knows nothing about Raft, leases' liveness or the runtime.
//!
//! # Engine layout
//!
//! - `b'k' ++ main (u64 BE) ++ sub (u64 BE)` → one key revision, encoded by
//!   [`codec::encode_kv`]: `version byte, flags (tombstone), key` and, for a
//!   put, `create_revision, version, lease, value`. Big-endian revisions make
//!   the engine's key order the revision order, so `open` rebuilds the
//!   index with one scan.
//! - `b'm' ++ name` → metadata; `b"mcompact_rev"` is the finished compaction
//!   revision (i64 BE). Compaction deletes its garbage and writes this key in
//!   the same batch, so there is no "scheduled but unfinished" state.
//!
//! Every [`MvccStore::apply`] writes exactly one [`WriteBatch`] carrying the
//! applied index, also when the request fails with a user error (then the
//! batch holds nothing else), so the engine's applied index always says
//! which log entries are reflected in the data.
//!
//! # Revisions
//!
//! As in etcd, a write request takes one revision (`current + 1`) if it
//! changes anything: the n-th change inside it gets sub revision n. Reads
//! inside a txn see its earlier writes; compares and the txn's pre-checks
//! see the state before the txn.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::atomic::{self, AtomicU64};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use engine::{Engine, EngineSnapshot, Scan, WriteBatch};

use super::codec::{self, MAX_TXN_DEPTH};
use super::error::MvccError;
use super::index_checkpoint::{self, CheckpointError, IndexCheckpointPlan};
use super::key_index::{Generation, KeyIndex, KeyRange, Newest, Rev};
use super::types::{
    ApplyOutcome, CompactionRequest, CompactionResponse, Compare, CompareResult, CompareTarget,
    DeleteRangeRequest, DeleteRangeResponse, Event, EventKind, HashKv, KeyValue, PutRequest,
    PutResponse, RangeRequest, RangeResponse, Request, RequestOp, Response, ResponseHeader,
    ResponseOp, SortOrder, SortTarget, TargetUnion, TxnRequest, TxnResponse,
};
use super::validate::is_txn_readonly;

const KEY_PREFIX: u8 = b'k';
/// The engine key of the finished compaction revision (i64 BE).
pub(crate) const META_COMPACT_REV: &[u8] = b"mcompact_rev";
/// The revision of an empty store, as etcd's.
const INITIAL_REVISION: i64 = 1;
/// The compact revision of a store never compacted, as etcd reports it.
const NEVER_COMPACTED: i64 = -1;
const REV_KEY_LEN: usize = 17;

fn meta_key(name: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(1 + name.len());
    k.push(b'm');
    k.extend_from_slice(name);
    Bytes::from(k)
}

/// The engine key of key revision `(main, sub)`.
fn rev_key(main: i64, sub: u64) -> Bytes {
    Bytes::copy_from_slice(&rev_key_array(main, sub))
}

/// [`rev_key`] without an allocation.
fn rev_key_array(main: i64, sub: u64) -> [u8; REV_KEY_LEN] {
    let mut k = [0u8; REV_KEY_LEN];
    k[0] = KEY_PREFIX;
    // Stored mains are >= 1, so the cast keeps their order.
    k[1..9].copy_from_slice(&(main as u64).to_be_bytes());
    k[9..].copy_from_slice(&sub.to_be_bytes());
    k
}

fn parse_rev_key(k: &[u8]) -> Result<(i64, u32), MvccError> {
    let bad = || MvccError::Corrupt(format!("bad revision key {k:02x?}"));
    if k.len() != REV_KEY_LEN || k[0] != KEY_PREFIX {
        return Err(bad());
    }
    let main = u64::from_be_bytes(k[1..9].try_into().map_err(|_| bad())?);
    let sub = u64::from_be_bytes(k[9..].try_into().map_err(|_| bad())?);
    match (i64::try_from(main), u32::try_from(sub)) {
        (Ok(main), Ok(sub)) if main > 0 => Ok((main, sub)),
        _ => Err(bad()),
    }
}

/// Visits stored key revisions in revision order from engine key `start`
/// up to `end` (excluded; both within the `k` space), until `visit` says
/// stop or fails.
fn scan_revisions<S: EngineSnapshot>(
    snap: &S,
    start: &[u8],
    end: &[u8],
    mut visit: impl FnMut(i64, u32, &Bytes) -> Result<Scan, MvccError>,
) -> Result<(), MvccError> {
    let mut failed = None;
    snap.scan(
        Bound::Included(start),
        Bound::Excluded(end),
        |k, v| match parse_rev_key(k).and_then(|(main, sub)| visit(main, sub, v)) {
            Ok(next) => next,
            Err(e) => {
                failed = Some(e);
                Scan::Stop
            }
        },
    )?;
    failed.map_or(Ok(()), Err)
}

/// The finished compaction revision stored in the engine.
fn stored_compact_revision<S: EngineSnapshot>(snap: &S) -> Result<i64, MvccError> {
    match snap.get(META_COMPACT_REV)? {
        // etcd's "never compacted".
        None => Ok(NEVER_COMPACTED),
        Some(v) => {
            let b: [u8; 8] = v[..]
                .try_into()
                .map_err(|_| corrupt("compact revision is not 8 bytes"))?;
            let rev = i64::from_be_bytes(b);
            if rev < 0 {
                return Err(corrupt(format!("negative compact revision {rev}")));
            }
            Ok(rev)
        }
    }
}

/// Adds every stored revision after `after` to `index`; returns the newest
/// main revision read (0 if none) and how many were read.
fn index_revisions_after<S: EngineSnapshot>(
    snap: &S,
    index: &mut KeyIndex,
    after: i64,
) -> Result<(i64, u64), MvccError> {
    let mut max_main = 0i64;
    let mut read = 0u64;
    let start = rev_key(after.saturating_add(1).max(1), 0);
    scan_revisions(snap, &start, &[KEY_PREFIX + 1], |main, sub, v| {
        let (tombstone, key) =
            codec::decode_kv_key(v).map_err(|e| corrupt(format!("revision {main}/{sub}: {e}")))?;
        // Generations are not decoded here (open stays a key scan): the
        // first put of each key reads its previous value once.
        index.push(
            key,
            Rev {
                main,
                sub,
                tombstone,
            },
            None,
        );
        max_main = main;
        read += 1;
        Ok(Scan::Continue)
    })?;
    Ok((max_main, read))
}

/// Whether a decoded checkpoint describes a state this engine's history
/// passed through and can be brought up to date by reading the newer
/// revisions (see [`MvccStore::open_with_index_checkpoint`]).
fn usable_checkpoint(
    plan: &IndexCheckpointPlan,
    cluster_id: u64,
    engine_applied: u64,
    compact_rev: i64,
) -> Result<(), CheckpointError> {
    if plan.cluster_id != cluster_id {
        return Err(CheckpointError::OtherCluster {
            found: plan.cluster_id,
            expected: cluster_id,
        });
    }
    if plan.applied_index > engine_applied {
        return Err(CheckpointError::Ahead {
            checkpoint: plan.applied_index,
            engine: engine_applied,
        });
    }
    if plan.compact_revision > compact_rev {
        return Err(CheckpointError::CompactedAhead {
            checkpoint: plan.compact_revision,
            engine: compact_rev,
        });
    }
    if compact_rev > plan.revision {
        return Err(CheckpointError::CompactedSince {
            revision: plan.revision,
            compacted: compact_rev,
        });
    }
    Ok(())
}

/// A key index checkpoint (`member/keyindex`) decoded, or why it could
/// not be: decoding needs nothing but its bytes, so it may run on another
/// thread than the one that opens the store.
pub struct DecodedIndexCheckpoint(Result<index_checkpoint::Decoded, CheckpointError>);

impl DecodedIndexCheckpoint {
    pub fn decode(bytes: &[u8]) -> DecodedIndexCheckpoint {
        DecodedIndexCheckpoint(index_checkpoint::decode(bytes))
    }
}

/// Where an opened store's key index came from, for the start-up log.
#[derive(Debug)]
pub enum IndexSource {
    /// Loaded from a checkpoint at `revision` holding `keys` keys, then
    /// `revisions_after` newer revisions read from the engine.
    Checkpoint {
        revision: i64,
        keys: usize,
        revisions_after: u64,
    },
    /// Rebuilt from every revision in the engine; `why` a checkpoint
    /// offered was not used.
    Rebuilt { why: Option<CheckpointError> },
}

/// A HashKV ready to run off the owner (see [`MvccStore::plan_hash_kv`]).
pub struct HashPlan<S> {
    snap: S,
    /// As asked: 0 is the current revision, a negative one hashes nothing.
    revision: i64,
    rev: i64,
    current_rev: i64,
    compact_rev: i64,
    /// The compacted revisions that count; None: all of them (no key is
    /// live at `rev`).
    kept: Option<Vec<Rev>>,
}

impl<S: EngineSnapshot> HashPlan<S> {
    /// etcd's hash: a CRC32C of `"key"`, then of every counted revision up
    /// to `rev` in etcd's bucket layout, in revision order.
    pub fn run(mut self) -> Result<HashKv, MvccError> {
        let order = |r: &Rev| (r.main, r.sub, r.tombstone);
        if let Some(kept) = self.kept.as_mut() {
            kept.sort_unstable_by_key(order);
        }
        let mut hash = crc32c::crc32c(b"key");
        if self.revision < 0 {
            // etcd hashes the revisions below `revision + 1`: none at all.
            return Ok(HashKv {
                hash,
                hash_revision: self.revision,
                revision: self.current_rev,
                compact_revision: self.compact_rev,
            });
        }
        let end = rev_key(self.rev.saturating_add(1), 0);
        let (mut key_buf, mut value_buf) = (Vec::with_capacity(18), Vec::new());
        let mut failed = None;
        self.snap.scan(
            Bound::Included(&[KEY_PREFIX][..]),
            Bound::Excluded(&end[..]),
            |k, v| {
                let decoded = parse_rev_key(k).and_then(|(main, sub)| {
                    let (tombstone, kv) = codec::decode_kv(v, main).map_err(corrupt)?;
                    Ok((sub, tombstone, kv))
                });
                let (sub, tombstone, kv) = match decoded {
                    Ok(d) => d,
                    Err(e) => {
                        failed = Some(e);
                        return Scan::Stop;
                    }
                };
                if kv.mod_revision <= self.compact_rev {
                    let this = Rev {
                        main: kv.mod_revision,
                        sub,
                        tombstone,
                    };
                    if self.kept.as_ref().is_some_and(|kept| {
                        kept.binary_search_by_key(&order(&this), order).is_err()
                    }) {
                        return Scan::Continue;
                    }
                }
                codec::etcd_bucket_record(&mut key_buf, &mut value_buf, &kv, sub, tombstone);
                hash = crc32c::crc32c_append(crc32c::crc32c_append(hash, &key_buf), &value_buf);
                Scan::Continue
            },
        )?;
        if let Some(e) = failed {
            return Err(e);
        }
        Ok(HashKv {
            hash,
            hash_revision: self.rev,
            revision: self.current_rev,
            compact_revision: self.compact_rev,
        })
    }
}

fn corrupt(what: impl std::fmt::Display) -> MvccError {
    MvccError::Corrupt(what.to_string())
}

fn header(revision: i64) -> ResponseHeader {
    ResponseHeader { revision }
}

/// etcd's MVCC key space over an engine. See the module docs.
pub struct MvccStore<E: Engine> {
    engine: E,
    /// The key index and revisions, which readers on other cores share
    /// ([`StoreReader`]).
    shared: Arc<Shared>,
    /// Whether a put reads the key's previous value for watchers with
    /// `prev_kv` even when its request does not need it (see
    /// [`Event::prev_kv_unread`]).
    read_prev_for_watchers: bool,
    /// Operations counted as etcd's metrics count them (a Cell: reads
    /// count through `&self`).
    ops: std::cell::Cell<OpCounts>,
    last_compaction: std::cell::Cell<Option<CompactionStats>>,
}

/// The state a range reads besides the engine: the key index and the
/// revisions that bound it. The store's owner changes it only under the
/// write lock, and for a whole request at a time together with the
/// engine batch, so a reader holding the read lock sees the index, both
/// revisions and a fresh engine snapshot agree.
#[derive(Debug)]
struct Indexed {
    index: KeyIndex,
    current_rev: i64,
    compact_rev: i64,
}

/// What the store shares with its readers.
#[derive(Debug)]
struct Shared {
    indexed: RwLock<Indexed>,
    /// Ranges and read-only txns served by readers, for
    /// [`MvccStore::op_counts`] (reads count no puts or deletes).
    reader_ranges: AtomicU64,
    reader_txns: AtomicU64,
}

impl Shared {
    fn count_reads(&self, counts: OpCounts) {
        self.reader_ranges
            .fetch_add(counts.ranges, atomic::Ordering::Relaxed);
        self.reader_txns
            .fetch_add(counts.txns, atomic::Ordering::Relaxed);
    }

    // A poisoned lock means a panic while applying, which aborts the
    // process (release profile): the state behind it is never used after.
    fn read(&self) -> RwLockReadGuard<'_, Indexed> {
        self.indexed.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Indexed> {
        self.indexed.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A handle on a store's published read state that any core may hold:
/// ranges walk the key index and load values from an engine snapshot
/// without the store's owner doing anything for them. A walk holds the
/// read lock for one slice at a time, so the owner's next apply waits at
/// most one slice; between slices the owner applies freely and the walk
/// stays a read at its revision (see [`StoreReader::walk_range`]).
///
/// A reader stays on the store it was taken from: after a snapshot install
/// replaced that store, its walks finish in the old one (consistent, at
/// the revision they began at) and the owner hands out readers of the new.
pub struct StoreReader<E: Engine> {
    engine: E,
    shared: Arc<Shared>,
}

impl<E: Engine + Clone> Clone for StoreReader<E> {
    fn clone(&self) -> Self {
        StoreReader {
            engine: self.engine.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<E: Engine> std::fmt::Debug for StoreReader<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader").finish_non_exhaustive()
    }
}

impl<E: Engine> StoreReader<E> {
    /// Begins a range's key-index walk at the store's current revision
    /// (or the one `req` names): checks the revision and takes the engine
    /// snapshot its values will be read from. Continue it with
    /// [`StoreReader::walk_range`].
    pub fn begin_range(&self, req: RangeRequest) -> Result<RangeWalk<E::Snapshot>, MvccError> {
        self.shared.count_reads(OpCounts {
            ranges: 1,
            ..OpCounts::default()
        });
        new_walk(&self.engine, &self.shared.read(), req)
    }

    /// Walks up to `max_keys` more keys of the index for `walk`; true once
    /// the walk has seen its whole range. Between two slices the store may
    /// apply anything.
    ///
    /// A walk stays a read at its revision across slices: later writes add
    /// only newer events, which it skips, and keys leave the index only by
    /// compaction. A compaction past the walk's revision fails a walk at a
    /// named revision as etcd's `ErrCompacted`, and starts one at "now"
    /// over at the current revision (the answer is then the one a range
    /// begun now gives).
    pub fn walk_range(
        &self,
        walk: &mut RangeWalk<E::Snapshot>,
        max_keys: usize,
    ) -> Result<bool, MvccError> {
        walk_range(&self.engine, &self.shared, walk, max_keys)
    }

    /// Encodes the key index checkpoint `plan` describes (taken with
    /// [`MvccStore::index_checkpoint_plan`] on this store) and hands it to
    /// `sink` chunk by chunk, each chunk up to `keys_per_chunk` keys encoded
    /// under one hold of the read lock (the owner's next apply waits at most
    /// that long). The index as it stood at the plan's revision is what goes
    /// in: later events are left out; a compaction since the plan makes that
    /// impossible and fails the checkpoint. Returns the number of keys.
    pub fn encode_index_checkpoint<Err: From<CheckpointError>>(
        &self,
        plan: IndexCheckpointPlan,
        keys_per_chunk: usize,
        mut sink: impl FnMut(&[u8]) -> Result<(), Err>,
    ) -> Result<u64, Err> {
        let mut encoder = index_checkpoint::Encoder::new(plan);
        let mut after: Option<Bytes> = None;
        loop {
            let mut chunk = Vec::new();
            encoder.begin_chunk(&mut chunk);
            {
                let st = self.shared.read();
                if st.compact_rev != plan.compact_revision || st.current_rev < plan.revision {
                    return Err(CheckpointError::Interrupted.into());
                }
                after = st.index.visit_history_slice(
                    plan.revision,
                    after.as_deref(),
                    keys_per_chunk,
                    |key, older, newest, generation| {
                        encoder.key(&mut chunk, key, older, newest, generation);
                    },
                );
            }
            encoder.end_chunk(&chunk);
            sink(&chunk)?;
            if after.is_none() {
                break;
            }
        }
        let keys = encoder.keys();
        sink(&encoder.finish())?;
        Ok(keys)
    }

    /// Begins a watcher's history read: every change to a key in
    /// `[key, range_end)` at revision `from_rev` or later, up to the
    /// store's current revision (`from_rev <= 0` or in the future: no
    /// events). Fails with `Compacted` when `from_rev` is below the
    /// compact revision, as etcd's watch does. Continue it with
    /// [`StoreReader::walk_history`].
    pub fn begin_history(
        &self,
        key: Bytes,
        range_end: Bytes,
        from_rev: i64,
    ) -> Result<HistoryWalk, MvccError> {
        begin_history(&self.shared.read(), key, range_end, from_rev)
    }

    /// Reads about `max_entries` more key revisions of `walk` (whole main
    /// revisions: a txn's changes stay together) under one hold of the
    /// read lock; true once the walk reached its end revision. Between two
    /// slices the store may apply anything: revisions up to the walk's end
    /// never change, and a compaction past the next one fails the walk
    /// with `Compacted` (etcd cancels such a watcher).
    pub fn walk_history(
        &self,
        walk: &mut HistoryWalk,
        max_entries: usize,
    ) -> Result<bool, MvccError> {
        walk_history(&self.engine, &self.shared.read(), walk, max_entries)
    }

    /// A read-only txn, as [`MvccStore::read_txn`] runs it.
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let (response, counts) = read_txn(&self.engine, &self.shared.read(), req)?;
        self.shared.count_reads(counts);
        Ok(response)
    }
}

/// A watcher's history read in progress ([`StoreReader::begin_history`]).
#[derive(Debug)]
pub struct HistoryWalk {
    key: Bytes,
    range_end: Bytes,
    /// The next main revision to read.
    next_rev: i64,
    /// The store's current revision when the walk began: the last one read.
    upto: i64,
    /// The compact revision when the walk began.
    compacted_at_begin: i64,
    events: Vec<Event>,
}

impl HistoryWalk {
    /// The events read, in revision order, and the revision they run up to.
    pub fn finish(self) -> (Vec<Event>, i64) {
        (self.events, self.upto)
    }
}

fn begin_history(
    st: &Indexed,
    key: Bytes,
    range_end: Bytes,
    from_rev: i64,
) -> Result<HistoryWalk, MvccError> {
    let upto = st.current_rev;
    let next_rev = if from_rev <= 0 || from_rev > upto {
        upto + 1
    } else if from_rev < st.compact_rev {
        return Err(MvccError::Compacted);
    } else {
        from_rev
    };
    Ok(HistoryWalk {
        key,
        range_end,
        next_rev,
        upto,
        compacted_at_begin: st.compact_rev,
        events: Vec::new(),
    })
}

fn walk_history<E: Engine>(
    engine: &E,
    st: &Indexed,
    walk: &mut HistoryWalk,
    max_entries: usize,
) -> Result<bool, MvccError> {
    if walk.next_rev > walk.upto {
        return Ok(true);
    }
    let compacted_since = st.compact_rev != walk.compacted_at_begin;
    if walk.next_rev < st.compact_rev || (compacted_since && walk.next_rev == st.compact_rev) {
        // The revisions below the compact revision are gone, and so are
        // the compact revision's own tombstones and replaced values: a
        // walk may begin there (as etcd's watch may) but not pass a
        // compaction to it.
        return Err(MvccError::Compacted);
    }
    let snap = engine.snapshot();
    let view = view_of(st, &snap);
    let start = rev_key(walk.next_rev, 0);
    let end = rev_key(walk.upto + 1, 0);
    let mut read = 0usize;
    let mut last_main = 0;
    let mut stopped_at = None;
    scan_revisions(&snap, &start, &end, |main, sub, v| {
        if read >= max_entries && main != last_main {
            stopped_at = Some(main);
            return Ok(Scan::Stop);
        }
        read += 1;
        last_main = main;
        let (tombstone, kv) = codec::decode_kv(v, main)
            .map_err(|e| corrupt(format!("revision {main}/{sub}: {e}")))?;
        if crate::watch::in_range(&kv.key, &walk.key, &walk.range_end) {
            // A create (also one after a delete in the same txn) has
            // no prev_kv, as the apply path and etcd say.
            let prev_kv = if !tombstone && kv.create_revision == main {
                None
            } else {
                view.get(&kv.key, main - 1)?
            };
            let kind = if tombstone {
                EventKind::Delete
            } else {
                EventKind::Put
            };
            walk.events.push(Event {
                kind,
                kv,
                prev_kv,
                prev_kv_unread: false,
            });
        }
        Ok(Scan::Continue)
    })?;
    walk.next_rev = stopped_at.unwrap_or(walk.upto + 1);
    Ok(stopped_at.is_none())
}

fn new_walk<E: Engine>(
    engine: &E,
    st: &Indexed,
    req: RangeRequest,
) -> Result<RangeWalk<E::Snapshot>, MvccError> {
    let cur_rev = st.current_rev;
    let at = read_revision(req.revision, cur_rev, st.compact_rev)?;
    Ok(RangeWalk {
        snap: engine.snapshot(),
        at,
        cur_rev,
        req,
        after: None,
        revs: Vec::new(),
        count: 0,
    })
}

/// One slice of a walk under the read lock (see [`StoreReader::walk_range`]).
fn walk_range<E: Engine>(
    engine: &E,
    shared: &Shared,
    walk: &mut RangeWalk<E::Snapshot>,
    max_keys: usize,
) -> Result<bool, MvccError> {
    let st = shared.read();
    if walk.at < st.compact_rev {
        if walk.req.revision > 0 {
            return Err(MvccError::Compacted);
        }
        // Over again, at "now".
        *walk = new_walk(engine, &st, std::mem::take(&mut walk.req))?;
    }
    walk.after = collect_range(
        &st.index,
        &walk.req,
        walk.at,
        walk.after.as_deref(),
        max_keys,
        &mut walk.revs,
        &mut walk.count,
    );
    Ok(walk.after.is_none())
}

/// A read-only txn over the state under `st` and a fresh snapshot, and the
/// operations it counts.
fn read_txn<E: Engine>(
    engine: &E,
    st: &Indexed,
    req: &TxnRequest,
) -> Result<(TxnResponse, OpCounts), MvccError> {
    if !is_txn_readonly(req) {
        return Err(MvccError::NotReadOnly);
    }
    let snap = engine.snapshot();
    let view = view_of(st, &snap);
    let cur = st.current_rev;
    let succeeded = view.compares(&req.compare, cur)?;
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    for op in ops {
        if let RequestOp::Range(r) = op {
            check_range_rev(r, cur, st.compact_rev)?;
        }
    }
    let mut responses = Vec::with_capacity(ops.len());
    for op in ops {
        let RequestOp::Range(r) = op else {
            return Err(MvccError::NotReadOnly);
        };
        responses.push(ResponseOp::Range(view.range(r, cur)?));
    }
    let response = TxnResponse {
        header: header(cur),
        succeeded,
        responses,
    };
    let counts = OpCounts::of_txn(req, &response);
    Ok((response, counts))
}

fn view_of<'a, S>(st: &'a Indexed, snap: &'a S) -> View<'a, S> {
    View {
        index: &st.index,
        snap,
        staged_main: 0,
        staged: &[],
        compact_rev: st.compact_rev,
    }
}

/// What the last compaction did, for the member's metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionStats {
    /// Revisions deleted from the engine.
    pub revisions_deleted: u64,
    /// Time spent pruning the key index.
    pub index_pause: std::time::Duration,
}

/// Ranges, puts, deletes and txns seen by this member, counted as etcd's
/// `metricsTxnWrite` counts them: each read of the store (a Range, a
/// compare, the previous value a put or delete returns or keeps) is a
/// range; a put or delete request one put or delete; a store transaction
/// of more than one operation also one txn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    pub ranges: u64,
    pub puts: u64,
    pub deletes: u64,
    pub txns: u64,
    /// Bytes of the keys and values put (etcd's `total_put_size`).
    pub put_bytes: u64,
}

impl OpCounts {
    fn add(&mut self, other: OpCounts) {
        self.ranges += other.ranges;
        self.puts += other.puts;
        self.deletes += other.deletes;
        self.txns += other.txns;
        self.put_bytes += other.put_bytes;
    }

    /// One store transaction of these operations.
    fn transaction(mut self) -> OpCounts {
        if self.ranges + self.puts + self.deletes > 1 {
            self.txns += 1;
        }
        self
    }

    fn of_put(p: &PutRequest) -> OpCounts {
        OpCounts {
            puts: 1,
            ranges: u64::from(p.prev_kv || p.ignore_value || p.ignore_lease),
            ..OpCounts::default()
        }
    }

    fn of_delete(d: &DeleteRangeRequest) -> OpCounts {
        OpCounts {
            deletes: 1,
            ranges: u64::from(d.prev_kv),
            ..OpCounts::default()
        }
    }

    /// The ops of the branch a txn took, nested txns included (their own
    /// compares are reads too).
    fn of_branch(req: &TxnRequest, resp: &TxnResponse) -> OpCounts {
        let branch = if resp.succeeded {
            &req.success
        } else {
            &req.failure
        };
        let mut counts = OpCounts::default();
        for (op, answer) in branch.iter().zip(&resp.responses) {
            counts.add(match (op, answer) {
                (RequestOp::Range(_), _) => OpCounts {
                    ranges: 1,
                    ..OpCounts::default()
                },
                (RequestOp::Put(p), _) => OpCounts::of_put(p),
                (RequestOp::DeleteRange(d), _) => OpCounts::of_delete(d),
                (RequestOp::Txn(t), ResponseOp::Txn(r)) => {
                    let mut nested = OpCounts::of_branch(t, r);
                    nested.ranges += t.compare.len() as u64;
                    nested
                }
                (RequestOp::Txn(_), _) => OpCounts::default(),
            });
        }
        counts
    }

    /// etcd reads a txn's compares in a transaction of their own before it
    /// runs the branch in another.
    fn of_txn(req: &TxnRequest, resp: &TxnResponse) -> OpCounts {
        let mut counts = OpCounts {
            ranges: req.compare.len() as u64,
            ..OpCounts::default()
        }
        .transaction();
        counts.add(OpCounts::of_branch(req, resp).transaction());
        counts
    }
}

impl<E: Engine> std::fmt::Debug for MvccStore<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.read();
        f.debug_struct("MvccStore")
            .field("current_rev", &st.current_rev)
            .field("compact_rev", &st.compact_rev)
            .field("keys", &st.index.len())
            .finish_non_exhaustive()
    }
}

impl<E: Engine> MvccStore<E> {
    /// Opens the store over `engine`, rebuilding the key index with one scan
    /// of the `k` key space.
    pub fn open(engine: E) -> Result<Self, MvccError> {
        Ok(Self::open_with_index_checkpoint(engine, None, 0)?.0)
    }

    /// Opens the store over `engine` from a key index checkpoint when it
    /// is usable (see [`index_checkpoint`]): it must be whole, of cluster
    /// `cluster_id`, at an applied index the engine has reached, and no
    /// compaction may have passed its revision since (a tombstone
    /// compacted away after it would leave no trace in the engine). Then
    /// only the revisions after the checkpoint's are read from the engine;
    /// otherwise all of them are, as [`MvccStore::open`] does.
    pub fn open_with_index_checkpoint(
        engine: E,
        checkpoint: Option<&[u8]>,
        cluster_id: u64,
    ) -> Result<(Self, IndexSource), MvccError> {
        Self::open_with_decoded_checkpoint(
            engine,
            checkpoint.map(DecodedIndexCheckpoint::decode),
            cluster_id,
        )
    }

    /// [`Self::open_with_index_checkpoint`] with a checkpoint decoded
    /// beforehand (a start-up decodes it on another thread while the engine
    /// opens); whether it is used is decided here, against the engine.
    pub fn open_with_decoded_checkpoint(
        engine: E,
        checkpoint: Option<DecodedIndexCheckpoint>,
        cluster_id: u64,
    ) -> Result<(Self, IndexSource), MvccError> {
        let snap = engine.snapshot();
        let compact_rev = stored_compact_revision(&snap)?;
        let loaded = checkpoint.map(|decoded| {
            let d = decoded.0?;
            usable_checkpoint(&d.plan, cluster_id, snap.applied_index(), compact_rev)?;
            Ok::<_, CheckpointError>(d)
        });
        let (mut index, from_checkpoint, refused) = match loaded {
            None => (KeyIndex::default(), None, None),
            Some(Err(why)) => (KeyIndex::default(), None, Some(why)),
            Some(Ok(mut d)) => {
                if compact_rev > d.plan.compact_revision {
                    d.index.compact(compact_rev);
                }
                (d.index, Some(d.plan.revision), None)
            }
        };
        let keys_loaded = index.len();
        let after = from_checkpoint.unwrap_or(0);
        let (max_main, read) = index_revisions_after(&snap, &mut index, after)?;
        let source = match from_checkpoint {
            Some(revision) => IndexSource::Checkpoint {
                revision,
                keys: keys_loaded,
                revisions_after: read,
            },
            None => IndexSource::Rebuilt { why: refused },
        };
        let indexed = Indexed {
            index,
            // Compaction may have removed every entry of the newest revisions
            // (all tombstones), but never below the compact revision.
            // etcd's store starts at revision 1: the first write is 2.
            current_rev: max_main.max(after).max(compact_rev).max(INITIAL_REVISION),
            compact_rev,
        };
        let store = MvccStore {
            engine,
            shared: Arc::new(Shared {
                indexed: RwLock::new(indexed),
                reader_ranges: AtomicU64::new(0),
                reader_txns: AtomicU64::new(0),
            }),
            read_prev_for_watchers: true,
            ops: std::cell::Cell::new(OpCounts::default()),
            last_compaction: std::cell::Cell::new(None),
        };
        Ok((store, source))
    }

    /// Checks the key index against one rebuilt from every revision in the
    /// engine, and every generation it knows against the stored value: for
    /// tests and operators who want proof that a checkpoint loaded right
    /// (`METCD_VERIFY_INDEX_CHECKPOINT=1`). Costs a full rebuild.
    pub fn verify_index(&self) -> Result<(), MvccError> {
        let snap = self.engine.snapshot();
        let st = self.shared.read();
        let mut rebuilt = KeyIndex::default();
        index_revisions_after(&snap, &mut rebuilt, 0)?;
        rebuilt.compact(st.compact_rev);
        if let Some(diff) = st.index.first_difference(&rebuilt) {
            return Err(corrupt(format!(
                "the key index differs from the engine's revisions: {diff}"
            )));
        }
        let mut wrong = None;
        st.index.known_generations(|key, rev, g| {
            if wrong.is_some() {
                return;
            }
            match load_rev(&snap, rev) {
                Ok(kv)
                    if kv.key == key
                        && kv.create_revision == g.created
                        && kv.version == g.version => {}
                Ok(kv) => {
                    wrong = Some(format!(
                        "key {key:?}: generation {g:?} in the index, created {} version {} stored",
                        kv.create_revision, kv.version
                    ));
                }
                Err(e) => wrong = Some(e.to_string()),
            }
        });
        wrong.map_or(Ok(()), |w| Err(corrupt(w)))
    }

    /// What a key index checkpoint taken now describes (see
    /// [`StoreReader::encode_index_checkpoint`]).
    pub fn index_checkpoint_plan(&self, cluster_id: u64) -> IndexCheckpointPlan {
        let st = self.shared.read();
        IndexCheckpointPlan {
            applied_index: self.engine.applied_index(),
            revision: st.current_rev,
            compact_revision: st.compact_rev,
            cluster_id,
        }
    }

    /// Whether some watcher may want `prev_kv` (a hint: a watcher that
    /// finds an event's previous value unread reads it from history).
    pub fn set_read_prev_for_watchers(&mut self, read: bool) {
        self.read_prev_for_watchers = read;
    }

    /// Keys that exist now, as etcd's `etcd_debugging_mvcc_keys_total`
    /// counts them (a delete takes one away at once, not at compaction).
    pub fn key_count(&self) -> usize {
        self.shared.read().index.live()
    }

    /// A handle for reading this store from any core ([`StoreReader`]).
    pub fn reader(&self) -> StoreReader<E>
    where
        E: Clone,
    {
        StoreReader {
            engine: self.engine.clone(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// What the last compaction applied did, once (then `None`).
    pub fn take_compaction_stats(&self) -> Option<CompactionStats> {
        self.last_compaction.take()
    }

    /// What this member has served and applied so far (etcd's
    /// `etcd_mvcc_{range,put,delete,txn}_total`).
    pub fn op_counts(&self) -> OpCounts {
        let mut counts = self.ops.get();
        counts.ranges += self.shared.reader_ranges.load(atomic::Ordering::Relaxed);
        counts.txns += self.shared.reader_txns.load(atomic::Ordering::Relaxed);
        counts
    }

    /// The revision of the last change (1 for an empty store, as etcd's).
    pub fn current_revision(&self) -> i64 {
        self.shared.read().current_rev
    }

    /// The revision of the last compaction: reads below it fail.
    pub fn compact_revision(&self) -> i64 {
        self.shared.read().compact_rev
    }

    /// The Raft index of the last entry applied to the engine.
    pub fn applied_index(&self) -> u64 {
        self.engine.applied_index()
    }

    /// The engine, e.g. to take a snapshot for a Raft snapshot.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// etcd's `HashKV`, computed over the bytes etcd itself would hash, so
    /// the value equals etcd's for the same history: a CRC32C of `"key"`
    /// and then, in revision order, every stored key revision at or below
    /// `revision` (`0`: the current one; a negative one hashes nothing but
    /// `"key"`, as etcd's) in etcd's bucket layout
    /// ([`codec::etcd_bucket_record`]). Like etcd, revisions at or below
    /// the compaction point count only if a compaction at `revision` would
    /// keep them (each key's live revision there), unless no key is live
    /// there. Members that applied the same log hold the same revisions, so
    /// their hashes are equal; any divergence shows (seed 000).
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv, MvccError> {
        self.plan_hash_kv(revision)?.run()
    }

    /// [`MvccStore::hash_kv`] in two steps: the part that needs the
    /// in-memory index (which compacted revisions still count), done here
    /// on the owner, and a [`HashPlan`] that scans and hashes an engine
    /// snapshot on any thread, so a large store's hash (etcdctl endpoint
    /// hashkv, the corruption checks) never stalls the owner's core.
    pub fn plan_hash_kv(&self, revision: i64) -> Result<HashPlan<E::Snapshot>, MvccError> {
        let st = self.shared.read();
        if revision > 0 && revision <= st.compact_rev {
            return Err(MvccError::Compacted);
        }
        if revision > st.current_rev {
            return Err(MvccError::FutureRevision);
        }
        let snap = self.engine.snapshot();
        let rev = if revision == 0 {
            st.current_rev
        } else {
            revision
        };
        // Revisions at or below the compaction point count only if a
        // compaction at `rev` would keep them: each key's live revision
        // there; all of them when no key is live there.
        // Pushed here in key order; sorted on the hashing thread.
        let mut kept = Vec::new();
        let mut some_key_live = false;
        if revision >= 0 && st.compact_rev > 0 {
            st.index.visit(KeyRange::From(b""), rev, |_, r| {
                some_key_live = true;
                if r.main <= st.compact_rev {
                    kept.push(r);
                }
                true
            });
        }
        Ok(HashPlan {
            snap,
            revision,
            rev,
            current_rev: st.current_rev,
            compact_rev: st.compact_rev,
            kept: some_key_live.then_some(kept),
        })
    }

    /// Stores a record of another replicated subsystem (leases) beside the
    /// data, in the same engine batch as the entry's applied index, under
    /// the metadata namespace (`b'm' ++ name`).
    pub fn put_meta(&mut self, index: u64, name: &[u8], value: Bytes) -> Result<(), MvccError> {
        let mut batch = WriteBatch::new();
        batch.put(meta_key(name), value);
        batch.set_applied_index(index);
        self.engine.write(batch)?;
        Ok(())
    }

    pub fn delete_meta(&mut self, index: u64, name: &[u8]) -> Result<(), MvccError> {
        let mut batch = WriteBatch::new();
        batch.delete(meta_key(name));
        batch.set_applied_index(index);
        self.engine.write(batch)?;
        Ok(())
    }

    /// Writes and deletes (`None`) several metadata records atomically,
    /// with the entry's applied index.
    pub fn write_meta(
        &mut self,
        index: u64,
        changes: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> Result<(), MvccError> {
        let mut batch = WriteBatch::new();
        for (name, value) in changes {
            match value {
                Some(v) => batch.put(meta_key(&name), v),
                None => batch.delete(meta_key(&name)),
            }
        }
        batch.set_applied_index(index);
        self.engine.write(batch)?;
        Ok(())
    }

    /// Metadata records whose name starts with `prefix` (names returned
    /// without the namespace byte).
    pub fn meta_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Bytes, Bytes)>, MvccError> {
        let start = meta_key(prefix);
        let mut out = Vec::new();
        self.engine
            .snapshot()
            .scan(Bound::Included(&start[..]), Bound::Unbounded, |k, v| {
                if !k.starts_with(&start) {
                    return Scan::Stop;
                }
                out.push((Bytes::copy_from_slice(&k[1..]), v.clone()));
                Scan::Continue
            })?;
        Ok(out)
    }

    /// A Range at `req.revision` (`<= 0`: the current revision), with etcd's
    /// filter, sort, limit, `count` and `more` rules.
    fn count(&self, counts: OpCounts) {
        let mut total = self.ops.get();
        total.add(counts);
        self.ops.set(total);
    }

    fn count_range(&self) {
        self.count(OpCounts {
            ranges: 1,
            ..OpCounts::default()
        });
    }

    pub fn range(&self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.count_range();
        let st = self.shared.read();
        let snap = self.engine.snapshot();
        view_of(&st, &snap).range(req, st.current_rev)
    }

    /// The index half of `req` and a snapshot to load the values from
    /// elsewhere (see [`RangePlan`]), in one go. The server walks in
    /// slices instead ([`StoreReader::begin_range`]).
    pub fn start_range(&self, req: RangeRequest) -> Result<RangeStart<E::Snapshot>, MvccError>
    where
        E: Clone,
    {
        let reader = self.reader();
        let mut walk = reader.begin_range(req)?;
        while !reader.walk_range(&mut walk, usize::MAX)? {}
        Ok(walk.finish())
    }

    /// Executes a read-only txn (every op of both branches a Range, see
    /// [`is_txn_readonly`]) without the Raft log, like etcd does.
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let (response, counts) = read_txn(&self.engine, &self.shared.read(), req)?;
        self.count(counts);
        Ok(response)
    }

    /// Applies one committed write request at Raft index `index`.
    ///
    /// Writes exactly one engine batch carrying `index`. A user error (any
    /// [`MvccError`] that is not [`MvccError::is_fatal`]) changes no data
    /// but still advances the applied index. A fatal error leaves the store
    /// as it was before the call (in memory) and must stop the member.
    ///
    /// The caller must not apply an index twice: the engine's applied index
    /// ([`MvccStore::applied_index`]) says where to resume after a restart.
    pub fn apply(&mut self, index: u64, req: &Request) -> Result<ApplyOutcome, MvccError> {
        if let Request::Compaction(c) = req {
            return self.apply_compaction(index, c);
        }
        // Held for the whole request, engine batch included: readers on
        // other cores then see the index, the revisions and the engine
        // agree.
        let mut guard = self.shared.write();
        let st = &mut *guard;
        let snap = self.engine.snapshot();
        let begin_rev = st.current_rev;
        let mut tx = WriteTxn {
            index: &mut st.index,
            snap: &snap,
            begin_rev,
            compact_rev: st.compact_rev,
            read_prev_for_watchers: self.read_prev_for_watchers,
            changes: Vec::new(),
        };
        let result = match req {
            Request::Put(p) => tx.put(p).map(Response::Put),
            Request::DeleteRange(d) => tx.delete_range(d).map(Response::DeleteRange),
            Request::Txn(t) => tx.txn(t).map(Response::Txn),
            Request::Compaction(_) => Err(corrupt("compaction in the write path")),
        };
        let changes = std::mem::take(&mut tx.changes);
        let rev = begin_rev + 1;
        if let Ok(done) = &result {
            self.count(match (req, done) {
                (Request::Put(p), _) => OpCounts::of_put(p),
                (Request::DeleteRange(d), _) => OpCounts::of_delete(d),
                (Request::Txn(t), Response::Txn(r)) => OpCounts::of_txn(t, r),
                _ => OpCounts::default(),
            });
        }
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                rollback(&mut st.index, &changes, rev);
                if !e.is_fatal() {
                    self.write_applied_index(index)?;
                }
                return Err(e);
            }
        };

        let mut batch = WriteBatch::with_capacity(changes.len());
        for (sub, ch) in changes.iter().enumerate() {
            let mut value = Vec::with_capacity(24 + ch.kv.key.len() + ch.kv.value.len());
            codec::encode_kv(&mut value, &ch.kv, ch.tombstone);
            // A `Bytes` made of a Vec with spare capacity allocates a header
            // to remember it (32 bytes that an engine keeping the record in
            // memory keeps as long as the record); an exact Vec needs none.
            value.shrink_to_fit();
            batch.put(rev_key(rev, sub as u64), Bytes::from(value));
        }
        batch.set_applied_index(index);
        if let Err(e) = self.engine.write(batch) {
            rollback(&mut st.index, &changes, rev);
            return Err(e.into());
        }
        if !changes.is_empty() {
            st.current_rev = rev;
        }
        drop(guard);
        let put_bytes = changes
            .iter()
            .filter(|c| !c.tombstone)
            .map(|c| (c.kv.key.len() + c.kv.value.len()) as u64)
            .sum();
        self.count(OpCounts {
            put_bytes,
            ..OpCounts::default()
        });
        let events = changes
            .into_iter()
            .map(|c| Event {
                kind: if c.tombstone {
                    EventKind::Delete
                } else {
                    EventKind::Put
                },
                kv: c.kv,
                prev_kv: c.event_prev,
                prev_kv_unread: c.event_prev_unread,
            })
            .collect();
        Ok(ApplyOutcome { response, events })
    }

    /// Advances the applied index for a log entry with nothing for MVCC
    /// (empty entries, configuration changes, other subsystems' requests).
    pub fn apply_noop(&mut self, index: u64) -> Result<(), MvccError> {
        self.write_applied_index(index)
    }

    fn write_applied_index(&self, index: u64) -> Result<(), MvccError> {
        let mut batch = WriteBatch::new();
        batch.set_applied_index(index);
        self.engine.write(batch)?;
        Ok(())
    }

    fn apply_compaction(
        &mut self,
        index: u64,
        c: &CompactionRequest,
    ) -> Result<ApplyOutcome, MvccError> {
        let at = c.revision;
        let mut st = self.shared.write();
        // etcd's order: an already compacted revision wins over a future one.
        let user_err = if at <= st.compact_rev {
            Some(MvccError::Compacted)
        } else if at > st.current_rev {
            Some(MvccError::FutureRevision)
        } else {
            None
        };
        if let Some(e) = user_err {
            self.write_applied_index(index)?;
            return Err(e);
        }
        // Plan the deletions first and prune the index only once the batch
        // is durable in the engine, so a failed write changes nothing.
        let mut batch = WriteBatch::new();
        let mut garbage = 0u64;
        st.index.compaction_garbage(at, |r| {
            garbage += 1;
            batch.delete(rev_key(r.main, u64::from(r.sub)));
        });
        batch.put(
            Bytes::from_static(META_COMPACT_REV),
            Bytes::copy_from_slice(&at.to_be_bytes()),
        );
        batch.set_applied_index(index);
        self.engine.write(batch)?;
        let pruning = std::time::Instant::now();
        st.index.compact(at);
        self.last_compaction.set(Some(CompactionStats {
            revisions_deleted: garbage,
            index_pause: pruning.elapsed(),
        }));
        st.compact_rev = at;
        Ok(ApplyOutcome {
            response: Response::Compaction(CompactionResponse {
                header: header(st.current_rev),
            }),
            events: Vec::new(),
        })
    }
}

/// Undoes the index events a failed request pushed (all at `rev`).
fn rollback(index: &mut KeyIndex, changes: &[Change], rev: i64) {
    for ch in changes.iter().rev() {
        index.pop(&ch.kv.key, rev);
    }
}

/// The generation a put's key-value belongs to.
fn generation_of(kv: &KeyValue) -> Generation {
    Generation {
        created: kv.create_revision,
        version: kv.version,
    }
}

/// A change's previous value for `prev_kv` watchers: `Some` once read
/// (`Some(None)`: there was none), `None` when it was not read (see
/// [`Event::prev_kv_unread`]).
type EventPrev = Option<Option<KeyValue>>;

/// A change staged by the request being applied; its sub revision is its
/// position in the list.
struct Change {
    kv: KeyValue,
    tombstone: bool,
    /// The watcher's `prev_kv` for this change (see [`Event::prev_kv`]).
    event_prev: Option<KeyValue>,
    /// See [`Event::prev_kv_unread`].
    event_prev_unread: bool,
}

/// A read-only view: the index, an engine snapshot, and the changes staged
/// at `staged_main` by the request being applied (not yet in the engine).
/// What the index answers for a range.
enum IndexRange {
    /// `count_only`: the index alone answers.
    Counted(RangeResponse),
    /// The revisions to load, in key order, and the count.
    Revisions { revs: Vec<Rev>, count: i64 },
}

/// The revision a range with `revision` reads at, as etcd checks it:
/// `<= 0` is the current one; a future one or one compacted away fails.
fn read_revision(revision: i64, cur_rev: i64, compact_rev: i64) -> Result<i64, MvccError> {
    if revision > cur_rev {
        return Err(MvccError::FutureRevision);
    }
    let rev = if revision <= 0 { cur_rev } else { revision };
    if rev < compact_rev {
        return Err(MvccError::Compacted);
    }
    Ok(rev)
}

/// How many revisions a range loads. etcd fetches everything when it will
/// sort or filter, otherwise limit + 1 keys (the extra one decides
/// `more`). Note the original sort order decides this: a non-key target
/// with order NONE sorts only the fetched limit + 1 keys, exactly like
/// etcd.
/// Whether `req` filters its keys by mod or create revision (which only
/// their loaded values tell).
fn revision_filtered(req: &RangeRequest) -> bool {
    req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0
}

fn fetch_limit(req: &RangeRequest) -> usize {
    let fetch_all = req.sort_order != SortOrder::None || revision_filtered(req);
    if fetch_all || req.limit <= 0 {
        usize::MAX
    } else {
        usize::try_from(req.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    }
}

/// One pass of a range over the index at `at`, from after `after`, over at
/// most `max_keys` keys (see [`KeyIndex::visit_slice`]; a leaf counted
/// whole, see [`KeyIndex::count_slice`], is one): `count` counts
/// every visible key, regardless of limit and of the revision filters
/// applied later; `revs` keeps the first [`fetch_limit`] of them (none for
/// `count_only`). Returns where the next pass resumes.
fn collect_range(
    index: &KeyIndex,
    req: &RangeRequest,
    at: i64,
    after: Option<&[u8]>,
    max_keys: usize,
    revs: &mut Vec<Rev>,
    count: &mut i64,
) -> Option<Bytes> {
    let keep = if req.count_only { 0 } else { fetch_limit(req) };
    let range = KeyRange::new(&req.key, &req.range_end);
    let mut after = after.map(Bytes::copy_from_slice);
    let mut budget = max_keys.max(1);
    // Key by key until the answer has the revisions it returns...
    while revs.len() < keep {
        let step = budget.min(keep - revs.len());
        let next = index.visit_slice(range, at, after.as_deref(), step, |_, r| {
            *count += 1;
            if revs.len() < keep {
                revs.push(r);
            }
        });
        budget -= step;
        match next {
            None => return None,
            Some(k) if budget == 0 => return Some(k),
            Some(k) => after = Some(k),
        }
    }
    // ...then only the count is left to make: whole leaves at a time where
    // the index can (a paged LIST's page no longer costs the rest of the
    // key space).
    index.count_slice(range, at, after.as_deref(), budget, count)
}

/// The answer of a `count_only` range.
fn counted_response(cur_rev: i64, count: i64) -> RangeResponse {
    RangeResponse {
        header: header(cur_rev),
        kvs: Vec::new(),
        more: false,
        count,
    }
}

/// How many values are looked up together: the batches of
/// [`RangePlan::finish`], and the look-ahead of [`ChunkedRange::load`].
const LOAD_BATCH: usize = 256;

/// The key revision `rev` as stored in `snap`.
fn load_rev<S: EngineSnapshot>(snap: &S, rev: Rev) -> Result<KeyValue, MvccError> {
    decode_rev(rev, snap.get(&rev_key_array(rev.main, u64::from(rev.sub)))?)
}

/// The key revisions `revs` as stored in `snap`, in order, each handed to
/// `each`. The engine looks them up together ([`EngineSnapshot::get_many`]):
/// a disk engine reads the blocks the lookups miss in one go.
fn load_revs<S: EngineSnapshot>(
    snap: &S,
    revs: &[Rev],
    each: impl FnMut(KeyValue),
) -> Result<(), MvccError> {
    let keys = rev_keys(revs);
    decode_revs(revs, snap.get_many(&keys)?, each)
}

/// The engine keys of `revs`.
fn rev_keys(revs: &[Rev]) -> Vec<[u8; REV_KEY_LEN]> {
    revs.iter()
        .map(|r| rev_key_array(r.main, u64::from(r.sub)))
        .collect()
}

/// Hands the key-values of `revs`, from their stored `values` in the same
/// order, to `each`.
fn decode_revs(
    revs: &[Rev],
    values: Vec<Option<Bytes>>,
    mut each: impl FnMut(KeyValue),
) -> Result<(), MvccError> {
    if values.len() != revs.len() {
        return Err(corrupt(format!(
            "the engine answered {} of {} revisions looked up",
            values.len(),
            revs.len()
        )));
    }
    for (&rev, value) in revs.iter().zip(values) {
        each(decode_rev(rev, value)?);
    }
    Ok(())
}

/// The key-value of key revision `rev` from its stored `value`.
fn decode_rev(rev: Rev, value: Option<Bytes>) -> Result<KeyValue, MvccError> {
    let value =
        value.ok_or_else(|| corrupt(format!("revision {}/{} missing", rev.main, rev.sub)))?;
    match codec::decode_kv(&value, rev.main) {
        Ok((false, kv)) => Ok(kv),
        Ok((true, _)) => Err(corrupt(format!(
            "revision {}/{} is a tombstone in the engine, not in the index",
            rev.main, rev.sub
        ))),
        Err(e) => Err(corrupt(format!("revision {}/{}: {e}", rev.main, rev.sub))),
    }
}

/// The value half of a range, after its values are loaded: revision
/// filters, sort, limit and `more`, `keys_only`.
/// etcd's `pruneKVs` with the request's revision filters (0: none).
fn passes_revision_filters(req: &RangeRequest, kv: &KeyValue) -> bool {
    (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
        && (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
        && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
        && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
}

fn finish_range(
    req: &RangeRequest,
    cur_rev: i64,
    count: i64,
    mut kvs: Vec<KeyValue>,
) -> RangeResponse {
    kvs.retain(|kv| passes_revision_filters(req, kv));

    let mut order = req.sort_order;
    if req.sort_target != SortTarget::Key && order == SortOrder::None {
        order = SortOrder::Ascend;
    }
    // Keys come out of the index ascending, so ascending by key is a
    // no-op. The sort is stable: ties keep key order (etcd's Go sort is
    // unstable in general but stable for the <= 12 elements it
    // insertion-sorts; we pick the stable order for every size).
    let target = req.sort_target;
    match order {
        SortOrder::Ascend if target != SortTarget::Key => {
            kvs.sort_by(|a, b| cmp_by(target, a, b));
        }
        SortOrder::Descend => kvs.sort_by(|a, b| cmp_by(target, b, a)),
        _ => {}
    }

    let mut more = false;
    if let Ok(limit) = usize::try_from(req.limit) {
        if limit > 0 && kvs.len() > limit {
            kvs.truncate(limit);
            more = true;
        }
    }
    if req.keys_only {
        for kv in &mut kvs {
            kv.value = Bytes::new();
        }
    }
    RangeResponse {
        header: header(cur_rev),
        kvs,
        more,
        count,
    }
}

/// A range whose index half ran on the owner core: the revisions to read
/// and a snapshot to read them from. Loading the values (the expensive
/// half of a big range) can then run anywhere, a chunk at a time, without
/// holding up the owner's writes. The snapshot pins the revisions, so the
/// answer is the one the owner would have given when the plan was made.
pub struct RangePlan<S> {
    snap: S,
    req: RangeRequest,
    cur_rev: i64,
    count: i64,
    revs: std::vec::IntoIter<Rev>,
    kvs: Vec<KeyValue>,
    /// For an answer whose order or keys depend on each key's revisions or
    /// version ([`RangePlan::order`]): the keys read so far that pass the
    /// revision filters, with the field they sort by (none: by key).
    ordered: Vec<(i64, Rev)>,
    /// How many of `revs` the ordering pass has read.
    ordered_upto: usize,
}

/// A range's key-index walk in progress ([`StoreReader::begin_range`]): the
/// revision it reads at, the snapshot its values come from, the key it
/// stopped after, and what it collected so far.
pub struct RangeWalk<S> {
    req: RangeRequest,
    at: i64,
    cur_rev: i64,
    snap: S,
    after: Option<Bytes>,
    revs: Vec<Rev>,
    count: i64,
}

impl<S> RangeWalk<S> {
    /// The walked range: the whole answer when it needs no values
    /// (`count_only`), a plan to load them otherwise.
    pub fn finish(self) -> RangeStart<S> {
        if self.req.count_only {
            return RangeStart::Done(counted_response(self.cur_rev, self.count));
        }
        RangeStart::Plan(RangePlan {
            kvs: Vec::new(),
            ordered: Vec::new(),
            ordered_upto: 0,
            revs: self.revs.into_iter(),
            snap: self.snap,
            req: self.req,
            cur_rev: self.cur_rev,
            count: self.count,
        })
    }
}

impl<S> std::fmt::Debug for RangeWalk<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeWalk")
            .field("at", &self.at)
            .field("after", &self.after)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

/// A range as the owner core answers it: done, or a plan to finish.
pub enum RangeStart<S> {
    Done(RangeResponse),
    Plan(RangePlan<S>),
}

impl<S> std::fmt::Debug for RangeStart<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RangeStart::Done(r) => f.debug_tuple("Done").field(r).finish(),
            RangeStart::Plan(p) => f.debug_tuple("Plan").field(p).finish(),
        }
    }
}

impl<S> std::fmt::Debug for RangePlan<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangePlan")
            .field("cur_rev", &self.cur_rev)
            .field("count", &self.count)
            .field("to_load", &self.revs.len())
            .field("loaded", &self.kvs.len())
            .finish_non_exhaustive()
    }
}

impl<S: EngineSnapshot> RangePlan<S> {
    /// Loads up to `n` more values; true once every value is loaded.
    pub fn load(&mut self, n: usize) -> Result<bool, MvccError> {
        let revs = self.revs.as_slice();
        let revs = &revs[..n.min(revs.len())];
        let kvs = &mut self.kvs;
        load_revs(&self.snap, revs, |kv| kvs.push(kv))?;
        if let Some(last) = revs.len().checked_sub(1) {
            self.revs.nth(last);
        }
        Ok(self.revs.len() == 0)
    }

    /// Whether the answer's order or its keys depend on each key's
    /// revisions or version (a revision filter; a sort by create or mod
    /// revision or by version), which only the key's record holds.
    fn needs_order(&self) -> bool {
        match self.req.sort_target {
            // Read whole whatever the filters: ordering would only read
            // every record once more.
            SortTarget::Value => false,
            SortTarget::Create | SortTarget::Mod | SortTarget::Version => true,
            SortTarget::Key => revision_filtered(&self.req),
        }
    }

    /// For an answer that [`RangePlan::needs_order`], reads up to `n` more
    /// keys' records and keeps, of those that pass the revision filters,
    /// the revision and the field the answer sorts by (24 bytes a key; the
    /// values go at once), so that [`RangePlan::into_chunked`] can send the
    /// answer in its order a chunk at a time. True once every key is read,
    /// or at once for an answer that needs nothing read.
    pub fn order(&mut self, n: usize) -> Result<bool, MvccError> {
        let revs = self.revs.as_slice();
        if !self.needs_order() || !self.kvs.is_empty() {
            return Ok(true);
        }
        let from = self.ordered_upto.min(revs.len());
        let batch = &revs[from..from.saturating_add(n).min(revs.len())];
        let (req, ordered) = (&self.req, &mut self.ordered);
        let mut next = batch.iter();
        load_revs(&self.snap, batch, |kv| {
            let Some(rev) = next.next() else {
                return;
            };
            if passes_revision_filters(req, &kv) {
                let field = match req.sort_target {
                    SortTarget::Create => kv.create_revision,
                    SortTarget::Mod => kv.mod_revision,
                    SortTarget::Version => kv.version,
                    SortTarget::Key | SortTarget::Value => 0,
                };
                ordered.push((field, *rev));
            }
        })?;
        self.ordered_upto = from + batch.len();
        Ok(self.ordered_upto >= revs.len())
    }

    /// The answer: loads what is left, then filters, sorts and limits.
    pub fn finish(mut self) -> Result<RangeResponse, MvccError> {
        // In batches: each batch's blocks are read together, and a batch
        // never asks the cache to hold more than it can.
        while !self.load(LOAD_BATCH)? {}
        Ok(finish_range(&self.req, self.cur_rev, self.count, self.kvs))
    }

    /// The plan as a [`ChunkedRange`] when its answer is its revisions'
    /// values in key order (ascending, or descending: reversed) with no
    /// revision filter to apply, so that the values can be loaded and sent
    /// a chunk at a time, never all held at once. Otherwise (a sort by
    /// another field, a revision filter, or values loaded already) the plan
    /// back, to [`RangePlan::finish`].
    pub fn into_chunked(mut self) -> Chunking<S> {
        let req = &self.req;
        let ordered_all = self.ordered_upto >= self.revs.len();
        if req.sort_target == SortTarget::Value
            || !self.kvs.is_empty()
            || (self.needs_order() && !ordered_all)
        {
            return Chunking::Whole(self);
        }
        let (limit, keys_only) = (req.limit, req.keys_only);
        // As finish_range: a sort by a field other than the key ascends
        // unless told otherwise, and is stable (ties keep key order).
        let mut order = req.sort_order;
        if req.sort_target != SortTarget::Key && order == SortOrder::None {
            order = SortOrder::Ascend;
        }
        let mut revs: Vec<Rev> = if self.needs_order() {
            let mut ordered = std::mem::take(&mut self.ordered);
            match (req.sort_target, order) {
                (SortTarget::Key, SortOrder::Descend) => ordered.reverse(),
                (SortTarget::Key, _) => {}
                (_, SortOrder::Descend) => {
                    ordered.sort_by_key(|(field, _)| std::cmp::Reverse(*field))
                }
                (_, _) => ordered.sort_by_key(|(field, _)| *field),
            }
            ordered.into_iter().map(|(_, rev)| rev).collect()
        } else {
            let mut revs: Vec<Rev> = self.revs.collect();
            if order == SortOrder::Descend {
                revs.reverse();
            }
            revs
        };
        // As finish_range: the limit applies after the order.
        let mut more = false;
        if let Ok(limit) = usize::try_from(limit) {
            if limit > 0 && revs.len() > limit {
                revs.truncate(limit);
                more = true;
            }
        }
        Chunking::Chunked(ChunkedRange {
            snap: self.snap,
            revs,
            next: 0,
            ahead: Vec::new(),
            ahead_from: 0,
            keys_only,
            revision: self.cur_rev,
            count: self.count,
            more,
        })
    }
}

/// What [`RangePlan::into_chunked`] makes of a plan.
pub enum Chunking<S> {
    Chunked(ChunkedRange<S>),
    /// Not in key order: to load whole ([`RangePlan::finish`]).
    Whole(RangePlan<S>),
}

/// A range's answer to load and send in order, a chunk at a time
/// ([`RangePlan::into_chunked`]): what it holds is the revisions to read
/// (16 bytes a key) and the snapshot that pins their values, not the
/// values. Loading a key twice (a first pass to size the answer, a second
/// to send it) gives the same key-value: the snapshot does not change.
pub struct ChunkedRange<S> {
    snap: S,
    /// The answer's key revisions, in the answer's order.
    revs: Vec<Rev>,
    /// The position of the next load in `revs`.
    next: usize,
    /// The engine keys of `revs[ahead_from..]`, up to [`LOAD_BATCH`] of
    /// them: what the loads look up, and ahead of them what they read
    /// along on a cache miss (the sending pass loads a value at a time).
    ahead: Vec<[u8; REV_KEY_LEN]>,
    ahead_from: usize,
    keys_only: bool,
    /// The store's revision the range was read at (the header's).
    pub revision: i64,
    /// Every key in the range, regardless of limit (etcd's `count`).
    pub count: i64,
    /// Whether the limit left keys out (etcd's `more`).
    pub more: bool,
}

impl<S: EngineSnapshot> ChunkedRange<S> {
    /// How many key-values the answer has.
    pub fn len(&self) -> usize {
        self.revs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// The next load starts at the answer's `position`-th key-value.
    pub fn seek(&mut self, position: usize) {
        self.next = position.min(self.revs.len());
    }

    /// Loads up to `n` more key-values, in the answer's order, and hands
    /// each to `each`; true once the last one was loaded.
    pub fn load(&mut self, n: usize, mut each: impl FnMut(KeyValue)) -> Result<bool, MvccError> {
        let end = self.next.saturating_add(n).min(self.revs.len());
        let (from, ahead_end) = (self.ahead_from, self.ahead_from + self.ahead.len());
        if self.next < from || end > ahead_end {
            let to = self
                .next
                .saturating_add(n.max(LOAD_BATCH))
                .min(self.revs.len());
            self.ahead = rev_keys(&self.revs[self.next..to]);
            self.ahead_from = self.next;
        }
        let keys = &self.ahead[self.next - self.ahead_from..];
        let values = self.snap.get_ahead(keys, end - self.next)?;
        let keys_only = self.keys_only;
        decode_revs(&self.revs[self.next..end], values, |mut kv| {
            if keys_only {
                kv.value = Bytes::new();
            }
            each(kv);
        })?;
        self.next = end;
        Ok(end == self.revs.len())
    }
}

impl<S> std::fmt::Debug for ChunkedRange<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkedRange")
            .field("revision", &self.revision)
            .field("count", &self.count)
            .field("more", &self.more)
            .field("len", &self.revs.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

struct View<'a, S> {
    index: &'a KeyIndex,
    snap: &'a S,
    staged_main: i64,
    staged: &'a [Change],
    compact_rev: i64,
}

impl<S: EngineSnapshot> View<'_, S> {
    fn load(&self, rev: Rev) -> Result<KeyValue, MvccError> {
        if rev.main == self.staged_main {
            return self
                .staged
                .get(rev.sub as usize)
                .map(|c| c.kv.clone())
                .ok_or_else(|| corrupt(format!("no staged change {}/{}", rev.main, rev.sub)));
        }
        load_rev(self.snap, rev)
    }

    fn get(&self, key: &[u8], at: i64) -> Result<Option<KeyValue>, MvccError> {
        self.index.get(key, at).map(|r| self.load(r)).transpose()
    }

    /// etcd's `applierV3backend.Range` over `storeTxnRead.rangeKeys`, where
    /// `cur_rev` is the revision the reader is at.
    fn range(&self, req: &RangeRequest, cur_rev: i64) -> Result<RangeResponse, MvccError> {
        let (revs, count) = match self.index_range(req, cur_rev)? {
            IndexRange::Counted(response) => return Ok(response),
            IndexRange::Revisions { revs, count } => (revs, count),
        };
        let kvs = revs
            .into_iter()
            .map(|r| self.load(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(finish_range(req, cur_rev, count, kvs))
    }

    /// The index half of a range: the revisions whose values it returns
    /// and the count, or the whole answer when it needs no values.
    fn index_range(&self, req: &RangeRequest, cur_rev: i64) -> Result<IndexRange, MvccError> {
        let rev = read_revision(req.revision, cur_rev, self.compact_rev)?;
        let range = KeyRange::new(&req.key, &req.range_end);
        if req.count_only {
            let count = self.index.count(range, rev);
            return Ok(IndexRange::Counted(counted_response(cur_rev, count)));
        }
        let (mut revs, mut count) = (Vec::new(), 0);
        collect_range(
            self.index,
            req,
            rev,
            None,
            usize::MAX,
            &mut revs,
            &mut count,
        );
        Ok(IndexRange::Revisions { revs, count })
    }

    /// etcd's `applyCompare` at revision `at`: every key of the range must
    /// satisfy the compare; no key compares as an all-zero KeyValue, except
    /// that a Value compare on no key fails.
    fn compare(&self, c: &Compare, at: i64) -> Result<bool, MvccError> {
        let mut any = false;
        let mut holds = true;
        let mut failed = None;
        self.index
            .visit(KeyRange::new(&c.key, &c.range_end), at, |_, r| {
                any = true;
                match self.load(r) {
                    Ok(kv) => holds = compare_kv(c, &kv),
                    Err(e) => failed = Some(e),
                }
                holds && failed.is_none()
            });
        if let Some(e) = failed {
            return Err(e);
        }
        if !any {
            if c.target == CompareTarget::Value {
                return Ok(false);
            }
            return Ok(compare_kv(c, &KeyValue::default()));
        }
        Ok(holds)
    }

    fn compares(&self, cmps: &[Compare], at: i64) -> Result<bool, MvccError> {
        for c in cmps {
            if !self.compare(c, at)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// etcd's `compareToPath`: the branch taken by `t` and, in pre-order, by
    /// every nested txn on the taken branches, all evaluated at `at` (the
    /// state before the txn: nested compares do not see earlier writes).
    fn path(
        &self,
        t: &TxnRequest,
        at: i64,
        depth: usize,
        out: &mut Vec<bool>,
    ) -> Result<(), MvccError> {
        // Decoded requests are never this deep; this bounds recursion for
        // requests built in-process.
        if depth > MAX_TXN_DEPTH {
            return Err(MvccError::TooManyOps);
        }
        let succeeded = self.compares(&t.compare, at)?;
        out.push(succeeded);
        for op in if succeeded { &t.success } else { &t.failure } {
            if let RequestOp::Txn(n) = op {
                self.path(n, at, depth + 1, out)?;
            }
        }
        Ok(())
    }
}

fn cmp_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

/// etcd's `compareKV`: the target union only counts if its variant matches
/// the target; otherwise the compare is against zero / the empty value.
fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match c.target {
        CompareTarget::Value => {
            let v: &[u8] = match &c.target_union {
                TargetUnion::Value(v) => v,
                _ => &[],
            };
            kv.value[..].cmp(v)
        }
        CompareTarget::Create => kv.create_revision.cmp(&match c.target_union {
            TargetUnion::CreateRevision(v) => v,
            _ => 0,
        }),
        CompareTarget::Mod => kv.mod_revision.cmp(&match c.target_union {
            TargetUnion::ModRevision(v) => v,
            _ => 0,
        }),
        CompareTarget::Version => kv.version.cmp(&match c.target_union {
            TargetUnion::Version(v) => v,
            _ => 0,
        }),
        CompareTarget::Lease => kv.lease.cmp(&match c.target_union {
            TargetUnion::Lease(v) => v,
            _ => 0,
        }),
    };
    match c.result {
        CompareResult::Equal => ord == Ordering::Equal,
        CompareResult::NotEqual => ord != Ordering::Equal,
        CompareResult::Greater => ord == Ordering::Greater,
        CompareResult::Less => ord == Ordering::Less,
    }
}

/// etcd's `checkRequestRange` for one Range of a txn, against the state
/// before the txn. Revision 0 is always fine; a revision below the compact
/// revision (including negative ones once the store was compacted, since a
/// never-compacted store is at -1) is `Compacted`, exactly as in etcd.
fn check_range_rev(r: &RangeRequest, cur_rev: i64, compact_rev: i64) -> Result<(), MvccError> {
    if r.revision == 0 {
        Ok(())
    } else if r.revision > cur_rev {
        Err(MvccError::FutureRevision)
    } else if r.revision < compact_rev {
        Err(MvccError::Compacted)
    } else {
        Ok(())
    }
}

/// Calls `f` on every non-txn op of the executed path of `t`, in etcd's
/// `checkRequests` order (nested txns recursively, in place).
fn walk_path(
    t: &TxnRequest,
    path: &[bool],
    pos: &mut usize,
    f: &mut impl FnMut(&RequestOp) -> Result<(), MvccError>,
) -> Result<(), MvccError> {
    let succeeded = *path
        .get(*pos)
        .ok_or_else(|| corrupt("txn path too short"))?;
    *pos += 1;
    for op in if succeeded { &t.success } else { &t.failure } {
        match op {
            RequestOp::Txn(n) => walk_path(n, path, pos, f)?,
            op => f(op)?,
        }
    }
    Ok(())
}

/// The write side of one request: mutates the index as it goes (so later
/// ops see earlier ones) and stages engine writes in `changes`; the caller
/// commits them in one batch or rolls the index back.
struct WriteTxn<'a, S> {
    index: &'a mut KeyIndex,
    snap: &'a S,
    /// The store revision before the request; writes go to `begin_rev + 1`.
    begin_rev: i64,
    compact_rev: i64,
    read_prev_for_watchers: bool,
    changes: Vec<Change>,
}

impl<S: EngineSnapshot> WriteTxn<'_, S> {
    fn view(&self) -> View<'_, S> {
        View {
            index: self.index,
            snap: self.snap,
            staged_main: self.begin_rev + 1,
            staged: &self.changes,
            compact_rev: self.compact_rev,
        }
    }

    /// The revision reads inside the request are at (etcd's
    /// `storeTxnWrite.Range`): the pending one once something was written.
    fn read_rev(&self) -> i64 {
        self.begin_rev + i64::from(!self.changes.is_empty())
    }

    /// Stages one change with its watchers' previous value.
    fn stage(
        &mut self,
        kv: KeyValue,
        tombstone: bool,
        event_prev: EventPrev,
    ) -> Result<(), MvccError> {
        let sub = u32::try_from(self.changes.len())
            .map_err(|_| corrupt("more than 2^32 changes in one revision"))?;
        self.index.push(
            &kv.key,
            Rev {
                main: self.begin_rev + 1,
                sub,
                tombstone,
            },
            Some(generation_of(&kv)),
        );
        self.changes.push(Change {
            kv,
            tombstone,
            event_prev_unread: event_prev.is_none(),
            event_prev: event_prev.flatten(),
        });
        Ok(())
    }

    fn put(&mut self, p: &PutRequest) -> Result<PutResponse, MvccError> {
        let rev = self.begin_rev + 1;
        // The key's generation (and the watchers' previous value) from the
        // index alone, or from the previous value read from the engine.
        let (prev, generation, event_prev) = match self.generation_from_index(p, rev) {
            Some((generation, event_prev)) => (None, generation, event_prev),
            None => {
                let view = self.view();
                let prev = view.get(&p.key, rev)?;
                let generation = match &prev {
                    Some(kv) => generation_of(kv).next(),
                    None => Generation::created_at(rev),
                };
                let event_prev = match &prev {
                    // A create event has no prev_kv in etcd's watch.
                    _ if generation.created == rev => None,
                    Some(kv) if kv.mod_revision <= self.begin_rev => Some(kv.clone()),
                    _ => view.get(&p.key, self.begin_rev)?,
                };
                (prev, generation, Some(event_prev))
            }
        };
        // The index path is taken only without ignore_value/ignore_lease,
        // so there `prev` is unread and the request's value and lease hold.
        let (value, lease) = match &prev {
            None if p.ignore_value || p.ignore_lease => return Err(MvccError::KeyNotFound),
            Some(kv) => (
                if p.ignore_value {
                    kv.value.clone()
                } else {
                    p.value.clone()
                },
                if p.ignore_lease { kv.lease } else { p.lease },
            ),
            None => (p.value.clone(), p.lease),
        };
        let kv = KeyValue {
            key: p.key.clone(),
            create_revision: generation.created,
            mod_revision: rev,
            version: generation.version,
            value,
            lease,
        };
        self.stage(kv, false, event_prev)?;
        Ok(PutResponse {
            header: header(rev),
            prev_kv: if p.prev_kv { prev } else { None },
        })
    }

    /// etcd's keyIndex answers a plain put without a backend read: the
    /// generation the put gets and its watchers' previous value (`None`:
    /// not read, see [`Event::prev_kv_unread`]), when the index alone
    /// knows them. `None` when the previous value must be read: the
    /// request needs it (prev_kv, ignore_value, ignore_lease), the index
    /// lacks the key's generation, or a watcher may want it.
    fn generation_from_index(&self, p: &PutRequest, rev: i64) -> Option<(Generation, EventPrev)> {
        if p.prev_kv || p.ignore_value || p.ignore_lease {
            return None;
        }
        match self.index.newest(&p.key, rev) {
            Newest::Absent => Some((Generation::created_at(rev), Some(None))),
            Newest::Put(g) if !self.read_prev_for_watchers => Some((g.next(), None)),
            _ => None,
        }
    }

    fn delete_range(&mut self, d: &DeleteRangeRequest) -> Result<DeleteRangeResponse, MvccError> {
        let rev = self.begin_rev + 1;
        let mut victims = Vec::new();
        self.index.visit(
            KeyRange::new(&d.key, &d.range_end),
            self.read_rev(),
            |k, r| {
                victims.push((Bytes::copy_from_slice(k), r));
                true
            },
        );
        let mut prev_kvs = Vec::new();
        let mut event_prevs = Vec::with_capacity(victims.len());
        {
            let view = self.view();
            for (key, r) in &victims {
                let cur = view.load(*r)?;
                event_prevs.push(if r.main <= self.begin_rev {
                    Some(cur.clone())
                } else {
                    view.get(key, self.begin_rev)?
                });
                if d.prev_kv {
                    prev_kvs.push(cur);
                }
            }
        }
        let deleted = victims.len() as i64;
        for ((key, _), event_prev) in victims.into_iter().zip(event_prevs) {
            let kv = KeyValue {
                key,
                mod_revision: rev,
                ..KeyValue::default()
            };
            self.stage(kv, true, Some(event_prev))?;
        }
        Ok(DeleteRangeResponse {
            header: header(if self.changes.is_empty() {
                self.begin_rev
            } else {
                rev
            }),
            deleted,
            prev_kvs,
        })
    }

    /// etcd's `applierV3backend.Txn`: path from compares, put and range
    /// pre-checks against the state before the txn, then execution.
    fn txn(&mut self, t: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let mut path = Vec::new();
        {
            let view = self.view();
            view.path(t, self.begin_rev, 1, &mut path)?;
            if !is_txn_readonly(t) {
                walk_path(t, &path, &mut 0, &mut |op| match op {
                    RequestOp::Put(p) if p.ignore_value || p.ignore_lease => {
                        match view.index.get(&p.key, self.begin_rev) {
                            Some(_) => Ok(()),
                            None => Err(MvccError::KeyNotFound),
                        }
                    }
                    _ => Ok(()),
                })?;
            }
            walk_path(t, &path, &mut 0, &mut |op| match op {
                RequestOp::Range(r) => check_range_rev(r, self.begin_rev, self.compact_rev),
                _ => Ok(()),
            })?;
        }
        let mut resp = self.exec(t, &path, &mut 0)?;
        resp.header = header(self.read_rev());
        Ok(resp)
    }

    fn exec(
        &mut self,
        t: &TxnRequest,
        path: &[bool],
        pos: &mut usize,
    ) -> Result<TxnResponse, MvccError> {
        let succeeded = *path
            .get(*pos)
            .ok_or_else(|| corrupt("txn path too short"))?;
        *pos += 1;
        let ops = if succeeded { &t.success } else { &t.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            responses.push(match op {
                RequestOp::Range(r) => ResponseOp::Range(self.view().range(r, self.read_rev())?),
                RequestOp::Put(p) => ResponseOp::Put(self.put(p)?),
                RequestOp::DeleteRange(d) => ResponseOp::DeleteRange(self.delete_range(d)?),
                RequestOp::Txn(n) => ResponseOp::Txn(self.exec(n, path, pos)?),
            });
        }
        // etcd never fills a nested txn's header: revision 0. The top-level
        // caller overwrites it.
        Ok(TxnResponse {
            header: ResponseHeader::default(),
            succeeded,
            responses,
        })
    }
}
