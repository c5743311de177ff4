//! The log-structured merge engine (leveldb lineage): [`LsmEngine`], its
//! snapshots and options.
//!
//! This module owns the engine's in-memory state (the active memtable, the
//! queue of immutable memtables waiting for a flush, the set of live tables
//! per level), the publication of write batches to readers, the registry of
//! live snapshots, and the background thread that flushes memtables to
//! level-0 tables and compacts levels downwards. File formats live in
//! `sst` and `manifest`.
//!
//! It must never: let a reader see part of a batch; block the writer on
//! disk I/O (the only wait is the documented throttle below); make data
//! durable past the applied index it is recorded with, or report an applied
//! index durable before the manifest edit carrying it is synced; delete a
//! table file a snapshot still reads; drop a version or tombstone a live
//! snapshot can still see. There is no engine WAL: the server's Raft log
//! is the only log, replayed from [`Engine::durable_applied_index`] + 1.
//!
//! # Versions and snapshots
//!
//! Each batch gets the next sequence number; its ops go into the active
//! memtable as `(key, seq) -> Option<value>` and `seq` is published only
//! after all of them are in, together with the batch's applied index. A
//! `Version` is an immutable list (active memtable, immutable memtables,
//! tables per level) swapped under a short lock; a snapshot pins one
//! version and its sequence, and reads the newest entry ≤ its sequence from
//! the newest source that has the key. Tables are `Arc`s: one that a
//! compaction replaced is marked obsolete once the manifest no longer lists
//! it, and its file is deleted when the last version holding it drops.
//!
//! # Durability
//!
//! `persist` rotates the active memtable (if anything was written to it)
//! and waits for the background thread to flush every memtable up to it;
//! each flush writes its table (direct I/O, fdatasync, directory fsync) and
//! then a manifest recording the memtable's applied index. Flushes run
//! oldest first, so the manifest's applied index always covers exactly the
//! data in its tables. Any background I/O failure poisons the engine: later
//! writes and persists fail with [`Error::Poisoned`], never silently lose
//! data (the Raft log still has it; the server restarts and replays).
//!
//! # Throttling
//!
//! Writes never wait for I/O, except one bound on memory: when
//! `max_immutable_memtables` memtables are already waiting for a flush, a
//! write waits until the background thread finishes one. That happens only
//! if the disk sustains less than the write rate, and then an unbounded
//! queue would end in running out of memory instead.

mod format;
mod iter;
mod manifest;
mod memtable;
mod sst;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use bytes::Bytes;

use self::format::{failpoint, EntryIter};
use self::iter::{LevelIter, MergeIter};
use self::manifest::ManifestState;
use self::memtable::Memtable;
use self::sst::{parse_sst_name, Table, TableBuilder, TableIter, TableMeta};
use crate::io::{sync_dir, BlockCache};
use crate::{BatchOp, Engine, EngineSnapshot, Error, Result, Scan, WriteBatch};

/// Sizes and shape of an [`LsmEngine`].
#[derive(Debug, Clone)]
pub struct LsmOptions {
    /// The active memtable is rotated (queued for a flush) at this size.
    pub memtable_bytes: usize,
    /// Rotated memtables waiting for a flush before writes are throttled.
    pub max_immutable_memtables: usize,
    /// Capacity of the block cache shared by all tables.
    pub block_cache_bytes: usize,
    /// Compaction cuts output tables at about this size.
    pub target_file_bytes: u64,
    /// Level-0 table count that triggers a compaction into level 1.
    pub l0_compaction_trigger: usize,
    /// Size limit of level 1; level n+1 may hold `level_size_ratio` times
    /// more than level n.
    pub level1_max_bytes: u64,
    pub level_size_ratio: u64,
    /// Number of levels, level 0 included; the last never compacts down.
    pub max_levels: usize,
    /// Bloom filter bits per key (10 gives about 1% false positives).
    pub bloom_bits_per_key: usize,
}

impl Default for LsmOptions {
    fn default() -> Self {
        LsmOptions {
            memtable_bytes: 32 << 20,
            max_immutable_memtables: 4,
            block_cache_bytes: 64 << 20,
            target_file_bytes: 8 << 20,
            l0_compaction_trigger: 4,
            level1_max_bytes: 64 << 20,
            level_size_ratio: 10,
            max_levels: 7,
            bloom_bits_per_key: 10,
        }
    }
}

impl LsmOptions {
    fn validate(&self) -> Result<()> {
        let ok = self.memtable_bytes > 0
            && self.max_immutable_memtables > 0
            && self.target_file_bytes > 0
            && self.l0_compaction_trigger > 0
            && self.level1_max_bytes > 0
            && self.level_size_ratio >= 2
            && (2..=32).contains(&self.max_levels)
            && (1..=64).contains(&self.bloom_bits_per_key);
        if ok {
            Ok(())
        } else {
            Err(Error::Invalid(format!("invalid lsm options: {self:?}")))
        }
    }

    /// Size limit of `level` (≥ 1).
    fn max_bytes(&self, level: usize) -> u64 {
        let mut limit = self.level1_max_bytes;
        for _ in 1..level {
            limit = limit.saturating_mul(self.level_size_ratio);
        }
        limit
    }
}

/// Live tables: level 0 newest first (its tables may overlap); levels ≥ 1
/// sorted by key and disjoint.
#[derive(Clone)]
struct Levels {
    levels: Vec<Vec<Arc<Table>>>,
}

impl Levels {
    fn get(&self, key: &[u8], seq: u64) -> Result<Option<Option<Bytes>>> {
        for t in &self.levels[0] {
            if let Some(found) = t.get(key, seq)? {
                return Ok(Some(found));
            }
        }
        for level in &self.levels[1..] {
            let i = level.partition_point(|t| t.meta.largest.as_ref() < key);
            if let Some(t) = level.get(i) {
                if let Some(found) = t.get(key, seq)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    fn level_bytes(&self, level: usize) -> u64 {
        self.levels[level].iter().map(|t| t.meta.size).sum()
    }

    fn manifest_tables(&self) -> Vec<(u8, TableMeta)> {
        let mut out = Vec::new();
        for (level, tables) in self.levels.iter().enumerate() {
            for t in tables {
                out.push((level as u8, t.meta.clone()));
            }
        }
        out
    }

    /// Whether no level below `level` holds `key` (so a tombstone for it
    /// at `level` shadows nothing and may go).
    fn is_base_for(&self, level: usize, key: &[u8]) -> bool {
        self.levels[level + 1..].iter().all(|tables| {
            let i = tables.partition_point(|t| t.meta.largest.as_ref() < key);
            tables.get(i).is_none_or(|t| t.meta.smallest.as_ref() > key)
        })
    }

    fn insert_sorted(&mut self, level: usize, table: Arc<Table>) {
        let tables = &mut self.levels[level];
        let i = tables.partition_point(|t| t.meta.smallest < table.meta.smallest);
        tables.insert(i, table);
    }
}

/// Everything a reader needs, swapped as a whole.
struct Version {
    active: Arc<Memtable>,
    /// Oldest first.
    imms: Vec<Arc<Memtable>>,
    levels: Arc<Levels>,
}

/// Published state, behind a short lock.
struct State {
    version: Arc<Version>,
    seq: u64,
    applied_index: u64,
    /// Sequence -> number of live snapshots at it.
    snapshots: BTreeMap<u64, usize>,
}

/// The single writer's state.
struct Writer {
    active: Arc<Memtable>,
    last_seq: u64,
    applied_index: u64,
    next_mem_id: u64,
}

/// Coordination with the background thread.
struct Work {
    shutdown: bool,
    /// Work was queued since the thread last looked.
    kicked: bool,
    /// Id of the newest memtable whose flush is durable.
    flushed_mem: u64,
    poisoned: Option<String>,
    /// The worker found nothing to do (for `wait_idle`).
    idle: bool,
}

struct Inner {
    dir: PathBuf,
    options: LsmOptions,
    cache: Arc<BlockCache>,
    state: Mutex<State>,
    writer: Mutex<Writer>,
    work: Mutex<Work>,
    /// Wakes the background thread.
    work_cv: Condvar,
    /// Signalled after each flush and on poisoning.
    done_cv: Condvar,
    poisoned: AtomicBool,
    applied_index: AtomicU64,
    durable_applied_index: AtomicU64,
    /// Serialises `persist` calls.
    persist_lock: Mutex<()>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // State is replaced whole under the lock; a panic cannot leave it
        // half-updated, so a poisoned lock still guards consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn work(&self) -> MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn version(&self) -> Arc<Version> {
        self.state().version.clone()
    }

    fn check_poisoned(&self) -> Result<()> {
        if !self.poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self.work().poisoned.clone().unwrap_or_default();
        Err(Error::Poisoned(format!(
            "lsm background job failed: {reason}"
        )))
    }

    fn poison(&self, e: &Error) {
        let mut work = self.work();
        work.poisoned.get_or_insert_with(|| e.to_string());
        self.poisoned.store(true, Ordering::Release);
        self.done_cv.notify_all();
    }

    fn kick(&self) {
        self.work().kicked = true;
        self.work_cv.notify_all();
    }

    /// Queues the active memtable for a flush and starts a new one.
    fn rotate(&self, w: &mut Writer) {
        let fresh = Arc::new(Memtable::new(w.next_mem_id, w.applied_index, w.last_seq));
        w.next_mem_id += 1;
        let old = std::mem::replace(&mut w.active, fresh.clone());
        {
            let mut st = self.state();
            let mut imms = st.version.imms.clone();
            imms.push(old);
            st.version = Arc::new(Version {
                active: fresh,
                imms,
                levels: st.version.levels.clone(),
            });
        }
        self.kick();
    }

    /// The write throttle (see the module docs).
    fn throttle(&self) -> Result<()> {
        let max = self.options.max_immutable_memtables;
        if self.version().imms.len() < max {
            return Ok(());
        }
        let mut work = self.work();
        loop {
            if let Some(reason) = &work.poisoned {
                return Err(Error::Poisoned(format!(
                    "lsm background job failed: {reason}"
                )));
            }
            if work.shutdown || self.version().imms.len() < max {
                return Ok(());
            }
            work = self
                .done_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A log-structured merge engine. Cheap to clone; the background thread
/// stops when the last clone is dropped (unflushed memtables are dropped
/// with it: the Raft log replays them).
#[derive(Clone)]
pub struct LsmEngine {
    handle: Arc<Handle>,
}

struct Handle {
    inner: Arc<Inner>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.work().shutdown = true;
        self.inner.work_cv.notify_all();
        self.inner.done_cv.notify_all();
        let worker = self
            .worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(worker) = worker {
            // A panicked worker has nothing left to clean up.
            let _ = worker.join();
        }
    }
}

impl fmt::Debug for LsmEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LsmEngine")
            .field("dir", &self.handle.inner.dir)
            .finish()
    }
}

impl LsmEngine {
    /// Opens (creating if absent) the engine in `dir` and recovers the state
    /// of the last successful [`LsmEngine::persist`]. Refuses a directory
    /// holding foreign files, a newer format, or a corrupt manifest or table.
    pub fn open(dir: &Path, options: LsmOptions) -> Result<LsmEngine> {
        options.validate()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create lsm dir", dir, e))?;
        let mut ssts = Vec::new();
        let mut foreign = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io("list lsm dir", dir, e))? {
            let entry = entry.map_err(|e| Error::io("list lsm dir", dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == manifest::MANIFEST_TMP_NAME {
                // An edit that never committed.
                std::fs::remove_file(entry.path())
                    .map_err(|e| Error::io("remove stale manifest tmp", entry.path(), e))?;
            } else if let Some(file_no) = parse_sst_name(&name) {
                ssts.push((file_no, entry.path()));
            } else if name != manifest::MANIFEST_NAME {
                foreign.push(name);
            }
        }
        let state = match manifest::read(dir)? {
            Some(state) => state,
            None if ssts.is_empty() && foreign.is_empty() => {
                let state = ManifestState {
                    next_file: 1,
                    ..ManifestState::default()
                };
                manifest::write(dir, &state, "lsm::open")?;
                state
            }
            None => {
                return Err(Error::Invalid(format!(
                    "{} is not an lsm engine directory: it holds files but no {} ({})",
                    dir.display(),
                    manifest::MANIFEST_NAME,
                    ssts.iter()
                        .map(|(_, p)| p.display().to_string())
                        .chain(foreign)
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(", ")
                )))
            }
        };

        let cache = Arc::new(BlockCache::new(options.block_cache_bytes));
        let mut levels = Levels {
            levels: vec![Vec::new(); options.max_levels],
        };
        let mut live = HashSet::new();
        for (level, meta) in &state.tables {
            let level = *level as usize;
            if level >= options.max_levels {
                return Err(Error::Invalid(format!(
                    "{} lists a table at level {level}, but max_levels is {}",
                    dir.join(manifest::MANIFEST_NAME).display(),
                    options.max_levels
                )));
            }
            let table = Table::open(dir, meta.file_no, cache.clone())?;
            live.insert(meta.file_no);
            levels.levels[level].push(Arc::new(table));
        }
        levels.levels[0].sort_by_key(|t| std::cmp::Reverse(t.meta.file_no));
        for level in &mut levels.levels[1..] {
            level.sort_by(|a, b| a.meta.smallest.cmp(&b.meta.smallest));
        }
        let mut next_file = state.next_file.max(1);
        for (file_no, path) in ssts {
            next_file = next_file.max(file_no + 1);
            if !live.contains(&file_no) {
                // Written by a flush or compaction whose manifest edit
                // never committed.
                std::fs::remove_file(&path)
                    .map_err(|e| Error::io("remove orphan table", &path, e))?;
            }
        }

        let active = Arc::new(Memtable::new(1, state.applied_index, state.last_seq));
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            options,
            cache,
            state: Mutex::new(State {
                version: Arc::new(Version {
                    active: active.clone(),
                    imms: Vec::new(),
                    levels: Arc::new(levels),
                }),
                seq: state.last_seq,
                applied_index: state.applied_index,
                snapshots: BTreeMap::new(),
            }),
            writer: Mutex::new(Writer {
                active,
                last_seq: state.last_seq,
                applied_index: state.applied_index,
                next_mem_id: 2,
            }),
            work: Mutex::new(Work {
                shutdown: false,
                kicked: true,
                flushed_mem: 0,
                poisoned: None,
                idle: false,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            poisoned: AtomicBool::new(false),
            applied_index: AtomicU64::new(state.applied_index),
            durable_applied_index: AtomicU64::new(state.applied_index),
            persist_lock: Mutex::new(()),
        });
        let max_levels = inner.options.max_levels;
        let worker = Worker {
            inner: inner.clone(),
            manifest: ManifestState { next_file, ..state },
            compact_pointer: vec![None; max_levels],
        };
        let thread = std::thread::Builder::new()
            .name("metcd-lsm".to_owned())
            .spawn(move || worker.run())
            .map_err(|e| Error::io("spawn lsm background thread", dir, e))?;
        Ok(LsmEngine {
            handle: Arc::new(Handle {
                inner,
                worker: Mutex::new(Some(thread)),
            }),
        })
    }

    /// Makes everything written so far durable with its applied index and
    /// returns that index. Rotates the active memtable under the writer
    /// lock (a pointer swap), then waits without any lock the writer needs.
    pub fn persist(&self) -> Result<u64> {
        let inner = &*self.handle.inner;
        let _serial = inner
            .persist_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        inner.check_poisoned()?;
        let target = {
            let mut w = inner.writer.lock().map_err(|_| {
                Error::Poisoned("an lsm engine write panicked mid-batch".to_owned())
            })?;
            if w.active.is_dirty() {
                inner.rotate(&mut w);
            }
            let st = inner.state();
            st.version.imms.last().map(|m| (m.id, m.applied_index()))
        };
        let Some((mem_id, applied_index)) = target else {
            return Ok(inner.durable_applied_index.load(Ordering::Acquire));
        };
        let mut work = inner.work();
        loop {
            if work.flushed_mem >= mem_id {
                return Ok(applied_index);
            }
            if let Some(reason) = &work.poisoned {
                return Err(Error::Poisoned(format!(
                    "lsm background job failed: {reason}"
                )));
            }
            if work.shutdown {
                return Err(Error::Invalid("lsm engine is shutting down".to_owned()));
            }
            work = inner
                .done_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Table count per level, for tests and metrics.
    #[doc(hidden)]
    pub fn table_counts(&self) -> Vec<usize> {
        let v = self.handle.inner.version();
        v.levels.levels.iter().map(Vec::len).collect()
    }

    /// Blocks until the background thread has no flush or compaction left
    /// to do (or failed), for tests.
    #[doc(hidden)]
    pub fn wait_idle(&self) {
        let inner = &*self.handle.inner;
        let mut work = inner.work();
        while work.poisoned.is_none() && !work.shutdown && !work.idle_seen() {
            work = inner
                .done_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Work {
    /// The worker found nothing to do and nothing was queued since.
    fn idle_seen(&self) -> bool {
        !self.kicked && self.idle
    }
}

impl Engine for LsmEngine {
    type Snapshot = LsmSnapshot;

    fn write(&self, batch: WriteBatch) -> Result<()> {
        let inner = &*self.handle.inner;
        let mut w = inner
            .writer
            .lock()
            .map_err(|_| Error::Poisoned("an lsm engine write panicked mid-batch".to_owned()))?;
        inner.check_poisoned()?;
        if let Some(index) = batch.applied_index() {
            if index < w.applied_index {
                return Err(Error::Invalid(format!(
                    "applied index would go backwards from {} to {index}",
                    w.applied_index
                )));
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        inner.throttle()?;
        let applied_index = batch.applied_index().unwrap_or(w.applied_index);
        let seq = w.last_seq + 1;
        for op in batch.into_ops() {
            match op {
                BatchOp::Put { key, value } => w.active.insert(key, seq, Some(value)),
                BatchOp::Delete { key } => w.active.insert(key, seq, None),
            }
        }
        w.active.note_batch(seq, applied_index);
        w.last_seq = seq;
        w.applied_index = applied_index;
        {
            let mut st = inner.state();
            st.seq = seq;
            st.applied_index = applied_index;
        }
        inner.applied_index.store(applied_index, Ordering::Release);
        if w.active.approx_bytes() >= inner.options.memtable_bytes {
            inner.rotate(&mut w);
        }
        Ok(())
    }

    fn snapshot(&self) -> LsmSnapshot {
        let inner = &self.handle.inner;
        let mut st = inner.state();
        let seq = st.seq;
        *st.snapshots.entry(seq).or_insert(0) += 1;
        LsmSnapshot {
            inner: inner.clone(),
            version: st.version.clone(),
            seq,
            applied_index: st.applied_index,
        }
    }

    fn applied_index(&self) -> u64 {
        self.handle.inner.applied_index.load(Ordering::Acquire)
    }

    fn durable_applied_index(&self) -> u64 {
        self.handle
            .inner
            .durable_applied_index
            .load(Ordering::Acquire)
    }
}

/// A consistent view of an [`LsmEngine`]: pins one version (memtables and
/// tables) and a sequence; compactions keep what it can see until dropped.
pub struct LsmSnapshot {
    inner: Arc<Inner>,
    version: Arc<Version>,
    seq: u64,
    applied_index: u64,
}

impl Drop for LsmSnapshot {
    fn drop(&mut self) {
        let mut st = self.inner.state();
        if let Some(n) = st.snapshots.get_mut(&self.seq) {
            *n -= 1;
            if *n == 0 {
                st.snapshots.remove(&self.seq);
            }
        }
    }
}

impl fmt::Debug for LsmSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LsmSnapshot")
            .field("seq", &self.seq)
            .field("applied_index", &self.applied_index)
            .finish()
    }
}

fn before_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Unbounded => true,
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
    }
}

fn after_start(key: &[u8], start: Bound<&[u8]>) -> bool {
    match start {
        Bound::Unbounded => true,
        Bound::Included(s) => key >= s,
        Bound::Excluded(s) => key > s,
    }
}

/// Visits the newest version ≤ `seq` of each live key in `[start, end)`.
fn scan_version<'a, F>(
    v: &'a Version,
    seq: u64,
    start: Bound<&'a [u8]>,
    end: Bound<&'a [u8]>,
    mut visit: F,
) -> Result<()>
where
    F: FnMut(&Bytes, &Bytes) -> Scan,
{
    let mut sources: Vec<Box<dyn EntryIter + 'a>> = Vec::new();
    sources.push(Box::new(v.active.iter(start)));
    for m in v.imms.iter().rev() {
        sources.push(Box::new(m.iter(start)));
    }
    for t in &v.levels.levels[0] {
        if after_start(&t.meta.largest, start) && before_end(&t.meta.smallest, end) {
            sources.push(Box::new(TableIter::new(t, start)?));
        }
    }
    for level in &v.levels.levels[1..] {
        if !level.is_empty() {
            sources.push(Box::new(LevelIter::new(level, start, end, true)?));
        }
    }
    let mut merged = MergeIter::new(sources);
    let mut last_key: Option<Bytes> = None;
    while let Some(e) = merged.current() {
        if !before_end(&e.key, end) {
            break;
        }
        if e.seq <= seq && last_key.as_ref() != Some(&e.key) {
            last_key = Some(e.key.clone());
            if let Some(value) = &e.value {
                if visit(&e.key, value) == Scan::Stop {
                    break;
                }
            }
        }
        merged.advance()?;
    }
    Ok(())
}

impl EngineSnapshot for LsmSnapshot {
    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let v = &*self.version;
        for m in std::iter::once(&v.active).chain(v.imms.iter().rev()) {
            if let Some(found) = m.get(key, self.seq) {
                return Ok(found);
            }
        }
        Ok(v.levels.get(key, self.seq)?.flatten())
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: F) -> Result<()>
    where
        F: FnMut(&Bytes, &Bytes) -> Scan,
    {
        scan_version(&self.version, self.seq, start, end, visit)
    }
}

/// A compaction: `inputs` from `level` merged with the overlapping `next`
/// tables of `level + 1` into new tables at `level + 1`.
struct Compaction {
    level: usize,
    inputs: Vec<Arc<Table>>,
    next: Vec<Arc<Table>>,
}

/// The background thread: flushes memtables oldest first, then compacts.
struct Worker {
    inner: Arc<Inner>,
    /// The last manifest written (counters and applied index).
    manifest: ManifestState,
    /// Per level, the largest key of the last table compacted from it, so
    /// successive compactions walk the key space round robin.
    compact_pointer: Vec<Option<Bytes>>,
}

impl Worker {
    fn run(mut self) {
        lower_thread_priority();
        loop {
            {
                let mut work = self.inner.work();
                if work.poisoned.is_some() {
                    while !work.shutdown {
                        work = self
                            .inner
                            .work_cv
                            .wait(work)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
                if work.shutdown {
                    return;
                }
                work.kicked = false;
                work.idle = false;
            }
            let oldest = self.inner.version().imms.first().cloned();
            let result = if let Some(mem) = oldest {
                self.flush(&mem)
            } else if let Some(c) = self.pick_compaction() {
                self.compact(c)
            } else {
                let mut work = self.inner.work();
                work.idle = true;
                self.inner.done_cv.notify_all();
                while !work.kicked && !work.shutdown {
                    work = self
                        .inner
                        .work_cv
                        .wait(work)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                continue;
            };
            if let Err(e) = result {
                self.inner.poison(&e);
            }
        }
    }

    fn levels(&self) -> Arc<Levels> {
        self.inner.version().levels.clone()
    }

    fn next_file(&mut self) -> u64 {
        let n = self.manifest.next_file;
        self.manifest.next_file += 1;
        n
    }

    /// Writes `edit` (derived from the current manifest) durably and makes
    /// it the current one.
    fn commit(
        &mut self,
        levels: &Levels,
        applied_index: u64,
        last_seq: u64,
        ctx: &str,
    ) -> Result<()> {
        let mut m = self.manifest.clone();
        m.edit += 1;
        m.applied_index = applied_index;
        m.last_seq = last_seq;
        m.tables = levels.manifest_tables();
        manifest::write(&self.inner.dir, &m, ctx)?;
        self.manifest = m;
        Ok(())
    }

    /// Installs new levels into the published version.
    fn install(&self, levels: Levels, flushed: Option<&Memtable>) {
        let mut st = self.inner.state();
        let imms = match flushed {
            Some(mem) => st
                .version
                .imms
                .iter()
                .filter(|m| m.id != mem.id)
                .cloned()
                .collect(),
            None => st.version.imms.clone(),
        };
        st.version = Arc::new(Version {
            active: st.version.active.clone(),
            imms,
            levels: Arc::new(levels),
        });
        if let Some(mem) = flushed {
            self.inner
                .durable_applied_index
                .store(mem.applied_index(), Ordering::Release);
        }
    }

    fn flush(&mut self, mem: &Arc<Memtable>) -> Result<()> {
        let inner = self.inner.clone();
        let mut levels = (*self.levels()).clone();
        if !mem.is_empty() {
            let file_no = self.next_file();
            let table = self.write_memtable(mem, file_no).inspect_err(|_| {
                // Never listed in a manifest: remove it now rather than at
                // the next open.
                let _ = std::fs::remove_file(inner.dir.join(sst::sst_name(file_no)));
            })?;
            levels.levels[0].insert(0, Arc::new(table));
        }
        let last_seq = self.manifest.last_seq.max(mem.last_seq());
        self.commit(&levels, mem.applied_index(), last_seq, "lsm::flush")?;
        self.install(levels, Some(mem));
        let mut work = inner.work();
        work.flushed_mem = work.flushed_mem.max(mem.id);
        inner.done_cv.notify_all();
        Ok(())
    }

    fn write_memtable(&self, mem: &Memtable, file_no: u64) -> Result<Table> {
        let dir = &self.inner.dir;
        let mut builder = TableBuilder::create(
            dir,
            file_no,
            "lsm::flush",
            self.inner.options.bloom_bits_per_key,
        )?;
        let mut it = mem.iter(Bound::Unbounded);
        while let Some(e) = it.current() {
            builder.add(&e.key, e.seq, e.value.as_deref())?;
            it.advance()?;
        }
        builder.finish()?;
        failpoint("lsm::flush::sst_dir_sync", dir)?;
        sync_dir(dir)?;
        Table::open(dir, file_no, self.inner.cache.clone())
    }

    fn pick_compaction(&self) -> Option<Compaction> {
        let levels = self.levels();
        let opts = &self.inner.options;
        let mut best: Option<(f64, usize)> = None;
        let l0_score = levels.levels[0].len() as f64 / opts.l0_compaction_trigger as f64;
        if l0_score >= 1.0 {
            best = Some((l0_score, 0));
        }
        for level in 1..opts.max_levels - 1 {
            let score = levels.level_bytes(level) as f64 / opts.max_bytes(level) as f64;
            if score >= 1.0 && best.is_none_or(|(b, _)| score > b) {
                best = Some((score, level));
            }
        }
        let (_, level) = best?;
        let inputs: Vec<Arc<Table>> = if level == 0 {
            // All of level 0: its tables overlap, and leaving an older one
            // behind would put older data above newer data in level 1.
            levels.levels[0].clone()
        } else {
            let tables = &levels.levels[level];
            let after = self.compact_pointer[level]
                .as_ref()
                .and_then(|p| tables.iter().find(|t| t.meta.smallest > *p));
            vec![after.or_else(|| tables.first())?.clone()]
        };
        let lo = inputs.iter().map(|t| &t.meta.smallest).min()?.clone();
        let hi = inputs.iter().map(|t| &t.meta.largest).max()?.clone();
        let next = levels.levels[level + 1]
            .iter()
            .filter(|t| t.overlaps(&lo, &hi))
            .cloned()
            .collect();
        Some(Compaction {
            level,
            inputs,
            next,
        })
    }

    fn compact(&mut self, c: Compaction) -> Result<()> {
        let levels = self.levels();
        let out_level = c.level + 1;
        let mut new_levels = (*levels).clone();
        let replaced: HashSet<u64> = c
            .inputs
            .iter()
            .chain(&c.next)
            .map(|t| t.meta.file_no)
            .collect();
        for level in [c.level, out_level] {
            new_levels.levels[level].retain(|t| !replaced.contains(&t.meta.file_no));
        }
        let moved = c.inputs.len() == 1 && c.next.is_empty();
        let outputs = if moved {
            // Nothing to merge with: move the table down without rewriting.
            c.inputs.clone()
        } else {
            let dir = self.inner.dir.clone();
            let mut written_files = Vec::new();
            match self.merge_into_tables(&c, &levels, &mut written_files) {
                Ok(tables) => tables,
                Err(e) => {
                    for file_no in written_files {
                        let _ = std::fs::remove_file(dir.join(sst::sst_name(file_no)));
                    }
                    return Err(e);
                }
            }
        };
        for t in &outputs {
            new_levels.insert_sorted(out_level, t.clone());
        }
        self.compact_pointer[c.level] = c.inputs.iter().map(|t| t.meta.largest.clone()).max();
        let (applied, last_seq) = (self.manifest.applied_index, self.manifest.last_seq);
        self.commit(&new_levels, applied, last_seq, "lsm::compaction")?;
        self.install(new_levels, None);
        if !moved {
            for t in c.inputs.iter().chain(&c.next) {
                t.mark_obsolete();
            }
        }
        Ok(())
    }

    /// Merges the compaction's inputs into new tables (synced, directory
    /// synced, opened). Records every file it creates in `written` so a
    /// failure can remove them.
    fn merge_into_tables(
        &mut self,
        c: &Compaction,
        levels: &Levels,
        written: &mut Vec<u64>,
    ) -> Result<Vec<Arc<Table>>> {
        let out_level = c.level + 1;
        let smallest_snapshot = {
            let st = self.inner.state();
            st.snapshots.keys().next().copied().unwrap_or(st.seq)
        };
        let mut sources: Vec<Box<dyn EntryIter + '_>> = Vec::new();
        // Level 0 inputs are newest first already; a single input of a
        // deeper level is newer than everything in the next level.
        for t in &c.inputs {
            sources.push(Box::new(TableIter::with_cache(t, Bound::Unbounded, false)?));
        }
        if !c.next.is_empty() {
            sources.push(Box::new(LevelIter::new(
                &c.next,
                Bound::Unbounded,
                Bound::Unbounded,
                false,
            )?));
        }
        let mut merged = MergeIter::new(sources);
        let opts = self.inner.options.clone();
        let dir = self.inner.dir.clone();
        let mut metas = Vec::new();
        let mut builder: Option<TableBuilder> = None;
        let mut current_key: Option<Bytes> = None;
        let mut last_seq_for_key = u64::MAX;
        while let Some(e) = merged.current() {
            let first_of_key = current_key.as_ref() != Some(&e.key);
            if first_of_key {
                current_key = Some(e.key.clone());
                last_seq_for_key = u64::MAX;
            }
            // leveldb's rules: a version is hidden from every snapshot once
            // a newer one of its key is visible to the oldest snapshot; a
            // tombstone visible to all snapshots with nothing below it
            // shadows nothing.
            let drop = last_seq_for_key <= smallest_snapshot
                || (e.value.is_none()
                    && e.seq <= smallest_snapshot
                    && levels.is_base_for(out_level, &e.key));
            last_seq_for_key = e.seq;
            if !drop {
                // Cut tables only between user keys, keeping levels disjoint.
                if first_of_key
                    && builder
                        .as_ref()
                        .is_some_and(|b| b.estimated_size() >= opts.target_file_bytes)
                {
                    if let Some(b) = builder.take() {
                        metas.push(b.finish()?);
                    }
                }
                let b = match builder.as_mut() {
                    Some(b) => b,
                    None => {
                        let file_no = self.next_file();
                        written.push(file_no);
                        builder.insert(TableBuilder::create(
                            &dir,
                            file_no,
                            "lsm::compaction",
                            opts.bloom_bits_per_key,
                        )?)
                    }
                };
                b.add(&e.key, e.seq, e.value.as_deref())?;
            }
            merged.advance()?;
        }
        if let Some(b) = builder.take() {
            metas.push(b.finish()?);
        }
        failpoint("lsm::compaction::sst_dir_sync", &dir)?;
        sync_dir(&dir)?;
        let mut tables = Vec::with_capacity(metas.len());
        for m in metas {
            tables.push(Arc::new(Table::open(
                &dir,
                m.file_no,
                self.inner.cache.clone(),
            )?));
        }
        Ok(tables)
    }
}

/// Background work yields the CPU to the request path: nice 10 for this
/// thread only (Linux applies `setpriority` to a thread id).
fn lower_thread_priority() {
    // SAFETY: gettid has no preconditions; setpriority with our own thread
    // id only changes this thread's nice value. Failure is harmless.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}
