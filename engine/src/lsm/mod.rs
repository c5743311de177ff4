//! The log-structured merge engine (leveldb lineage): [`LsmEngine`], its
//! snapshots and options.
//!
//! This module owns the engine's in-memory state (the active memtable, the
//! queue of immutable memtables waiting for a flush, the set of live tables
//! per level), the publication of write batches to readers, the registry of
//! live snapshots, and the two background threads: one flushes memtables
//! to level-0 tables, the other (niced) compacts levels downwards, so a
//! `persist` never waits behind a long compaction. Their manifest edits
//! are serialised by one lock, held only for the edit itself (manifest
//! write and install), never for writing tables. File formats live in
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
//! and waits for the flush thread to flush every memtable up to it;
//! each flush writes its table (direct I/O, fdatasync, directory fsync) and
//! then a manifest recording the memtable's applied index. Flushes run
//! oldest first, so the manifest's applied index always covers exactly the
//! data in its tables. Any background I/O failure poisons the engine: later
//! writes and persists fail with [`Error::Poisoned`], never silently lose
//! data (the Raft log still has it; the server restarts and replays).
//!
//! # Compaction
//!
//! Level 0 (newest first, tables may overlap) goes into level 1 when it
//! has `l0_compaction_trigger` tables, unless it is still small next to
//! the level-1 bytes it overlaps (many small persists): then a run of
//! similar-sized level-0 tables is merged into one level-0 table that keeps
//! the run's place, so a persist of a few keys never costs a rewrite of
//! level 1 and each byte is rewritten a logarithmic number of times within
//! level 0. Tables that overlap nothing below move down without a rewrite.
//! Deeper levels compact one table at a time, round robin, when over their
//! size. Compactions read their inputs in large direct reads, and hand the
//! replaced tables' cache room to their outputs.
//!
//! # Throttling
//!
//! Writes never wait for I/O, except one bound on memory: when
//! `max_immutable_memtables` memtables are already waiting for a flush, a
//! write waits until the flush thread finishes one. That happens only
//! if the disk sustains less than the write rate, and then an unbounded
//! queue would end in running out of memory instead. Likewise the flush
//! thread waits while level 0 holds `L0_STOP_TRIGGERS` times its trigger,
//! so a lagging compaction cannot let level 0 (which every read consults)
//! grow without bound.

mod format;
mod iter;
mod manifest;
mod memtable;
mod sst;

pub(crate) use manifest::fuzz_decode as fuzz_manifest;
pub(crate) use sst::{fuzz_block, fuzz_table};

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
use self::sst::{parse_sst_name, BlockSpan, CacheFill, Table, TableBuilder, TableIter, TableMeta};
use crate::io::{sync_dir, BlockCache};
use crate::{BatchOp, Engine, EngineSize, EngineSnapshot, Error, Result, Scan, WriteBatch};

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
    /// Level-0 table count that triggers a compaction into level 1. At 8
    /// rather than leveldb's 4, half the level-1 rewrites: random fills ran
    /// 30 % faster, point reads within noise (bloom filters skip most
    /// level-0 tables), 100-key scans ~10 % slower (docs/benchmarks.md).
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
            l0_compaction_trigger: 8,
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
        self.get_or(key, seq, &mut || {})
    }

    /// [`Levels::get`], calling `before_read` before each block it has to
    /// read from a file.
    fn get_or(
        &self,
        key: &[u8],
        seq: u64,
        before_read: &mut dyn FnMut(),
    ) -> Result<Option<Option<Bytes>>> {
        for t in self.tables_for(key) {
            if let Some(found) = t.get_or(key, seq, before_read)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The tables a lookup of `key` looks into, in the order it does: every
    /// level-0 table newest first, then the one table of each deeper level
    /// whose range may hold it.
    fn tables_for<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = &'a Arc<Table>> + 'a {
        let deeper = self.levels[1..].iter().filter_map(move |level| {
            level.get(level.partition_point(|t| t.meta.largest.as_ref() < key))
        });
        self.levels[0].iter().chain(deeper)
    }

    /// Brings the blocks that lookups of `keys` at `seq` read into the
    /// cache, each table's misses read together. For each key, the block of
    /// the first table whose range and bloom filter admit it: where the key
    /// most likely is (a bloom false positive leaves a deeper block to its
    /// ordinary read). Best effort, as [`Table::prefetch`]; one device round
    /// trip per table (a batch of consecutive revisions mostly lies in one
    /// or two).
    fn prefetch(&self, keys: &[&[u8]], seq: u64) {
        let mut wanted: Vec<(&Arc<Table>, Vec<BlockSpan>)> = Vec::new();
        for &key in keys {
            let Some(table) = self.tables_for(key).find(|t| t.may_contain(key)) else {
                continue;
            };
            let Some(block) = table.uncached_block_of(key, seq) else {
                continue;
            };
            match wanted.iter_mut().find(|(t, _)| Arc::ptr_eq(t, table)) {
                Some((_, blocks)) => blocks.push(block),
                None => wanted.push((table, vec![block])),
            }
        }
        for (table, mut blocks) in wanted {
            table.prefetch(&mut blocks);
        }
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

/// Coordination with the background threads (one flushes memtables, one
/// compacts, so a `persist` never waits behind a long compaction).
struct Work {
    shutdown: bool,
    /// A memtable was queued since the flush thread last looked.
    flush_kicked: bool,
    /// Tables changed since the compaction thread last looked.
    compact_kicked: bool,
    /// Id of the newest memtable whose flush is durable.
    flushed_mem: u64,
    poisoned: Option<String>,
    /// Each thread found nothing to do (for `wait_idle`).
    flush_idle: bool,
    compact_idle: bool,
    /// Full compactions asked for ([`LsmEngine::compact_all`]) and done:
    /// a caller waits until `done` reaches its ticket.
    full_compactions_asked: u64,
    full_compactions_done: u64,
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
    /// The last manifest written; held while a background thread edits
    /// the levels, writes the manifest and installs the result, so the
    /// flush and compaction threads' edits apply one after the other.
    edit: Mutex<ManifestState>,
    /// The next table file number (both threads take numbers).
    next_file: AtomicU64,
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

    /// Wakes the flush thread (a memtable was queued).
    fn kick(&self) {
        self.work().flush_kicked = true;
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
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.work().shutdown = true;
        self.inner.work_cv.notify_all();
        self.inner.done_cv.notify_all();
        let workers =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for worker in workers {
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
        // Level 0 stays in manifest order, newest first: a merge of older
        // level-0 tables gets a newer file number than tables flushed
        // while it ran, so file numbers do not order level 0.
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
                flush_kicked: true,
                compact_kicked: true,
                flushed_mem: 0,
                poisoned: None,
                flush_idle: false,
                compact_idle: false,
                full_compactions_asked: 0,
                full_compactions_done: 0,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            poisoned: AtomicBool::new(false),
            applied_index: AtomicU64::new(state.applied_index),
            durable_applied_index: AtomicU64::new(state.applied_index),
            persist_lock: Mutex::new(()),
            edit: Mutex::new(ManifestState { next_file, ..state }),
            next_file: AtomicU64::new(next_file),
        });
        // The handle exists before the threads so a failed spawn stops the
        // one already running.
        let handle = Arc::new(Handle {
            inner: inner.clone(),
            workers: Mutex::new(Vec::new()),
        });
        let flusher = Flusher {
            inner: inner.clone(),
        };
        let max_levels = inner.options.max_levels;
        let compactor = Compactor {
            inner: inner.clone(),
            compact_pointer: vec![None; max_levels],
        };
        let threads = [
            std::thread::Builder::new()
                .name("metcd-lsm-flush".to_owned())
                .spawn(move || flusher.run()),
            std::thread::Builder::new()
                .name("metcd-lsm-compact".to_owned())
                .spawn(move || compactor.run()),
        ];
        for thread in threads {
            let thread = thread.map_err(|e| Error::io("spawn lsm background thread", dir, e))?;
            handle
                .workers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(thread);
        }
        Ok(LsmEngine { handle })
    }

    /// What the block cache holds.
    pub fn cache_usage(&self) -> crate::io::CacheUsage {
        self.handle.inner.cache.usage()
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
        inner.wait_for(inner.work(), |work| work.flushed_mem >= mem_id)?;
        Ok(applied_index)
    }

    /// Flushes the memtables, then has the compaction thread merge every
    /// level into the deepest, dropping what no snapshot can see (a
    /// defragmentation: Maintenance Defragment). Blocking; writes go on.
    pub fn compact_all(&self) -> Result<()> {
        self.persist()?;
        let inner = &*self.handle.inner;
        let mut work = inner.work();
        work.full_compactions_asked += 1;
        let ticket = work.full_compactions_asked;
        work.compact_kicked = true;
        inner.work_cv.notify_all();
        inner.wait_for(work, |work| work.full_compactions_done >= ticket)
    }

    /// Table count per level, for tests and metrics.
    #[doc(hidden)]
    pub fn table_counts(&self) -> Vec<usize> {
        let v = self.handle.inner.version();
        v.levels.levels.iter().map(Vec::len).collect()
    }

    /// Blocks until the background threads have no flush or compaction
    /// left to do (or failed), for tests.
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
    /// Both threads found nothing to do and nothing was queued since.
    fn idle_seen(&self) -> bool {
        !self.flush_kicked && !self.compact_kicked && self.flush_idle && self.compact_idle
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

    /// Live tables plus memtables. Versions shadowed by newer ones are
    /// counted until a compaction drops them, as an LSM's files hold them.
    fn size(&self) -> EngineSize {
        let v = self.handle.inner.version();
        let tables: u64 = v.levels.levels.iter().flatten().map(|t| t.meta.size).sum();
        let memtables: usize =
            v.imms.iter().map(|m| m.approx_bytes()).sum::<usize>() + v.active.approx_bytes();
        let bytes = tables + memtables as u64;
        EngineSize {
            total_bytes: bytes,
            in_use_bytes: bytes,
        }
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
    F: FnMut(&[u8], &Bytes) -> Scan,
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
    // A reused buffer: cloning each key's `Bytes` would allocate.
    let mut last_key: Option<Vec<u8>> = None;
    while let Some(e) = merged.current() {
        if !before_end(&e.key, end) {
            break;
        }
        if e.seq <= seq && last_key.as_deref() != Some(&e.key[..]) {
            let last = last_key.get_or_insert_with(Vec::new);
            last.clear();
            last.extend_from_slice(&e.key);
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

impl LsmSnapshot {
    /// `key` as the memtables hold it at this snapshot's sequence: its
    /// value or tombstone, or none where no memtable has it.
    fn in_memtables(&self, key: &[u8]) -> Option<Option<Bytes>> {
        let v = &*self.version;
        std::iter::once(&v.active)
            .chain(v.imms.iter().rev())
            .find_map(|m| m.get(key, self.seq))
    }
}

impl EngineSnapshot for LsmSnapshot {
    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match self.in_memtables(key) {
            Some(found) => Ok(found),
            None => Ok(self.version.levels.get(key, self.seq)?.flatten()),
        }
    }

    /// At the first block not in the cache, the blocks of every key from
    /// there on come in together ([`Levels::prefetch`]); keys whose blocks
    /// are cached cost what `get` costs.
    fn get_ahead<K: AsRef<[u8]>>(&self, keys: &[K], now: usize) -> Result<Vec<Option<Bytes>>> {
        let levels = &self.version.levels;
        let now = now.min(keys.len());
        let mut values = Vec::with_capacity(now);
        let mut prefetched = false;
        for (i, key) in keys[..now].iter().enumerate() {
            let key = key.as_ref();
            if let Some(found) = self.in_memtables(key) {
                values.push(found);
                continue;
            }
            let mut before_read = || {
                if !prefetched {
                    prefetched = true;
                    let ahead: Vec<&[u8]> = keys[i..].iter().map(AsRef::as_ref).collect();
                    levels.prefetch(&ahead, self.seq);
                }
            };
            values.push(levels.get_or(key, self.seq, &mut before_read)?.flatten());
        }
        Ok(values)
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        scan_version(&self.version, self.seq, start, end, visit)
    }
}

/// A compaction: `inputs` from `level` merged with the overlapping `next`
/// tables of `out_level` into new tables there. `out_level` is `level + 1`,
/// or 0 for a merge of small level-0 tables among themselves.
struct Compaction {
    level: usize,
    out_level: usize,
    inputs: Vec<Arc<Table>>,
    next: Vec<Arc<Table>>,
    /// Rewrite even tables that could just move down (a full compaction
    /// wants their shadowed versions and tombstones gone).
    rewrite: bool,
}

/// Level 0 goes down into level 1 once it holds at least 1/this of the
/// level-1 bytes it overlaps. Until then (many small persists, each
/// flushing a small table) its tables are merged among themselves, so a
/// persist of a few keys never costs a rewrite of most of level 1.
const L0_PUSH_DIVISOR: u64 = 4;
/// At this many times `l0_compaction_trigger` tables, a merge within level
/// 0 takes all of it (not just a run of similar sizes), which bounds the
/// sources a read looks at after compaction lagged behind the flushes.
const L0_MAX_TRIGGERS: usize = 3;
/// At this many times `l0_compaction_trigger` tables the flush thread waits
/// for compaction to catch up (and through the memtable throttle, so do
/// writes): level 0 must not grow without bound while compaction lags.
const L0_STOP_TRIGGERS: usize = 9;

/// Which background thread.
#[derive(Clone, Copy)]
enum Job {
    Flush,
    Compact,
}

impl Work {
    fn kicked(&mut self, job: Job) -> &mut bool {
        match job {
            Job::Flush => &mut self.flush_kicked,
            Job::Compact => &mut self.compact_kicked,
        }
    }

    fn idle(&mut self, job: Job) -> &mut bool {
        match job {
            Job::Flush => &mut self.flush_idle,
            Job::Compact => &mut self.compact_idle,
        }
    }
}

impl Inner {
    /// The top of a background thread's loop: consumes its kick; false
    /// once the engine shuts down (a poisoned engine only waits for that).
    fn begin_round(&self, job: Job) -> bool {
        let mut work = self.work();
        if work.poisoned.is_some() {
            while !work.shutdown {
                work = self
                    .work_cv
                    .wait(work)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        if work.shutdown {
            return false;
        }
        *work.kicked(job) = false;
        *work.idle(job) = false;
        true
    }

    /// Sleeps until this thread is kicked or the engine shuts down.
    fn idle_until_kicked(&self, job: Job) {
        let mut work = self.work();
        *work.idle(job) = true;
        self.done_cv.notify_all();
        while !*work.kicked(job) && !work.shutdown {
            work = self
                .work_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits on the background threads until `done` holds; an error if
    /// one of them failed first or the engine shuts down.
    fn wait_for(&self, mut work: MutexGuard<'_, Work>, done: impl Fn(&Work) -> bool) -> Result<()> {
        loop {
            if done(&work) {
                return Ok(());
            }
            if let Some(reason) = &work.poisoned {
                return Err(Error::Poisoned(format!(
                    "lsm background job failed: {reason}"
                )));
            }
            if work.shutdown {
                return Err(Error::Invalid("lsm engine is shutting down".to_owned()));
            }
            work = self
                .done_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn take_file_no(&self) -> u64 {
        self.next_file.fetch_add(1, Ordering::AcqRel)
    }

    /// Applies `change` to the current levels, durably writes the manifest
    /// (carrying the flushed memtable's applied index and sequence, if
    /// any) and installs the result, all under the edit lock, so the flush
    /// and compaction threads' edits never lose one another.
    fn apply_edit(
        &self,
        ctx: &str,
        flushed: Option<&Memtable>,
        change: impl FnOnce(&mut Levels),
    ) -> Result<()> {
        let mut current = self.edit.lock().unwrap_or_else(PoisonError::into_inner);
        let mut levels = (*self.version().levels).clone();
        change(&mut levels);
        let mut m = ManifestState {
            edit: current.edit + 1,
            next_file: self.next_file.load(Ordering::Acquire),
            last_seq: current.last_seq,
            applied_index: current.applied_index,
            tables: levels.manifest_tables(),
        };
        if let Some(mem) = flushed {
            m.applied_index = mem.applied_index();
            m.last_seq = m.last_seq.max(mem.last_seq());
        }
        manifest::write(&self.dir, &m, ctx)?;
        *current = m;
        self.install(levels, flushed);
        Ok(())
    }

    /// Installs new levels into the published version (without the
    /// memtable they flushed, if any).
    fn install(&self, levels: Levels, flushed: Option<&Memtable>) {
        let mut st = self.state();
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
            self.durable_applied_index
                .store(mem.applied_index(), Ordering::Release);
        }
    }

    /// Removes table files that never made it into a manifest.
    fn discard_tables(&self, file_nos: &[u64]) {
        for &file_no in file_nos {
            self.cache.forget_file(file_no);
            let _ = std::fs::remove_file(self.dir.join(sst::sst_name(file_no)));
        }
    }
}

/// Runs a background job, turning a panic into an error: the engine is
/// then poisoned (writers and `persist` see why) instead of waiting
/// forever for a thread that is gone.
fn guarded(job: impl FnOnce() -> Result<()>, what: &str) -> Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        Ok(result) => result,
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(Error::Poisoned(format!(
                "the lsm {what} thread panicked: {reason}"
            )))
        }
    }
}

/// The flush thread: writes rotated memtables to level-0 tables, oldest
/// first, so each manifest's applied index covers exactly its tables.
struct Flusher {
    inner: Arc<Inner>,
}

impl Flusher {
    fn run(self) {
        while self.inner.begin_round(Job::Flush) {
            if !self.wait_for_level0_room() {
                continue;
            }
            let oldest = self.inner.version().imms.first().cloned();
            match oldest {
                Some(mem) => {
                    if let Err(e) = guarded(|| self.flush(&mem), "flush") {
                        self.inner.poison(&e);
                    }
                }
                None => self.inner.idle_until_kicked(Job::Flush),
            }
        }
    }

    /// Waits while level 0 is at its stop size; false if the engine shut
    /// down or was poisoned meanwhile.
    fn wait_for_level0_room(&self) -> bool {
        let inner = &*self.inner;
        let stop = inner.options.l0_compaction_trigger * L0_STOP_TRIGGERS;
        let mut work = inner.work();
        loop {
            if work.shutdown || work.poisoned.is_some() {
                return false;
            }
            if inner.version().levels.levels[0].len() < stop {
                return true;
            }
            work = inner
                .done_cv
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn flush(&self, mem: &Arc<Memtable>) -> Result<()> {
        let inner = &*self.inner;
        let table = if mem.is_empty() {
            None
        } else {
            let file_no = inner.take_file_no();
            let table = self
                .write_memtable(mem, file_no)
                // Never listed in a manifest: remove it now rather than at
                // the next open.
                .inspect_err(|_| inner.discard_tables(&[file_no]))?;
            Some(Arc::new(table))
        };
        inner.apply_edit("lsm::flush", Some(mem), |levels| {
            if let Some(t) = table {
                levels.levels[0].insert(0, t);
            }
        })?;
        let mut work = inner.work();
        work.flushed_mem = work.flushed_mem.max(mem.id);
        work.compact_kicked = true;
        inner.done_cv.notify_all();
        inner.work_cv.notify_all();
        Ok(())
    }

    fn write_memtable(&self, mem: &Memtable, file_no: u64) -> Result<Table> {
        let dir = &self.inner.dir;
        let mut builder = TableBuilder::create(
            dir,
            file_no,
            "lsm::flush",
            self.inner.options.bloom_bits_per_key,
            self.inner.cache.clone(),
            CacheFill::Evict,
        )?;
        let mut it = mem.iter(Bound::Unbounded);
        while let Some(e) = it.current() {
            builder.add(&e.key, e.seq, e.value.as_deref())?;
            it.advance()?;
        }
        let table = builder.finish()?;
        failpoint("lsm::flush::sst_dir_sync", dir)?;
        sync_dir(dir)?;
        Ok(table)
    }
}

/// The compaction thread (niced): merges level 0 and over-full levels
/// downwards.
struct Compactor {
    inner: Arc<Inner>,
    /// Per level, the largest key of the last table compacted from it, so
    /// successive compactions walk the key space round robin.
    compact_pointer: Vec<Option<Bytes>>,
}

impl Compactor {
    fn run(mut self) {
        lower_thread_priority();
        while self.inner.begin_round(Job::Compact) {
            let asked = self.inner.work().full_compactions_asked;
            if asked > self.inner.work().full_compactions_done {
                if let Err(e) = guarded(|| self.compact_fully(), "full compaction") {
                    // Its waiters see the poison, never a done ticket.
                    self.inner.poison(&e);
                    continue;
                }
                let mut work = self.inner.work();
                work.full_compactions_done = asked;
                // More may have been asked meanwhile: another round.
                work.compact_kicked = true;
                drop(work);
                self.inner.done_cv.notify_all();
                continue;
            }
            match self.pick_compaction() {
                Some(c) => {
                    if let Err(e) = guarded(|| self.compact(c), "compaction") {
                        self.inner.poison(&e);
                    }
                    // A flush may be waiting for level 0 to shrink.
                    let _work = self.inner.work();
                    self.inner.done_cv.notify_all();
                }
                None => self.inner.idle_until_kicked(Job::Compact),
            }
        }
    }

    /// Merges every level into the deepest one that holds tables (level 1
    /// at least), rewriting all of it: what no snapshot can see any more,
    /// shadowed versions and tombstones with nothing below, is dropped.
    fn compact_fully(&mut self) -> Result<()> {
        let levels = self.inner.version().levels.clone();
        let Some(deepest) = (0..levels.levels.len())
            .rev()
            .find(|l| !levels.levels[*l].is_empty())
        else {
            return Ok(());
        };
        let target = deepest.max(1);
        let mut merged = false;
        for level in 0..target {
            let levels = self.inner.version().levels.clone();
            if levels.levels[level].is_empty() {
                continue;
            }
            self.compact(Compaction {
                level,
                out_level: level + 1,
                inputs: levels.levels[level].clone(),
                next: levels.levels[level + 1].clone(),
                rewrite: true,
            })?;
            merged = true;
            // A flush waiting for level 0 to shrink need not wait for the
            // deeper steps.
            self.inner.done_cv.notify_all();
        }
        if !merged {
            // Everything already sits in the deepest level: rewrite it in
            // place, which drops its garbage all the same.
            let tables = self.inner.version().levels.levels[target].clone();
            self.compact(Compaction {
                level: target,
                out_level: target,
                inputs: tables,
                next: Vec::new(),
                rewrite: true,
            })?;
        }
        Ok(())
    }

    fn pick_compaction(&self) -> Option<Compaction> {
        let levels = self.inner.version().levels.clone();
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
        if level == 0 {
            return self.pick_level0(&levels);
        }
        let tables = &levels.levels[level];
        let after = self.compact_pointer[level]
            .as_ref()
            .and_then(|p| tables.iter().find(|t| t.meta.smallest > *p));
        let inputs = vec![after.or_else(|| tables.first())?.clone()];
        let next = overlapping(&levels.levels[level + 1], &inputs)?;
        Some(Compaction {
            level,
            out_level: level + 1,
            inputs,
            next,
            rewrite: false,
        })
    }

    /// All of level 0 into level 1 (its tables overlap, and leaving an
    /// older one behind would put older data above newer data in level 1),
    /// unless level 0 is still small next to the level-1 bytes it would
    /// rewrite: then a run of similar-sized level-0 tables (all of them if
    /// there are many) is merged into one level-0 table.
    fn pick_level0(&self, levels: &Levels) -> Option<Compaction> {
        let l0 = &levels.levels[0];
        let next = overlapping(&levels.levels[1], l0)?;
        let l0_bytes: u64 = l0.iter().map(|t| t.meta.size).sum();
        let next_bytes: u64 = next.iter().map(|t| t.meta.size).sum();
        let max_l0 = self.inner.options.l0_compaction_trigger * L0_MAX_TRIGGERS;
        if l0.len() >= 2 && l0_bytes.saturating_mul(L0_PUSH_DIVISOR) < next_bytes {
            let run = if l0.len() >= max_l0 {
                0..l0.len()
            } else {
                level0_run(l0)
            };
            return Some(Compaction {
                level: 0,
                out_level: 0,
                inputs: l0[run].to_vec(),
                next: Vec::new(),
                rewrite: false,
            });
        }
        Some(Compaction {
            level: 0,
            out_level: 1,
            inputs: l0.clone(),
            next,
            rewrite: false,
        })
    }

    fn compact(&mut self, c: Compaction) -> Result<()> {
        let inner = self.inner.clone();
        // Nothing to merge with: move the tables down without rewriting.
        let moved =
            !c.rewrite && c.out_level != c.level && c.next.is_empty() && disjoint(&c.inputs);
        let outputs = if moved {
            c.inputs.clone()
        } else {
            let levels = inner.version().levels.clone();
            let mut written_files = Vec::new();
            match self.merge_into_tables(&c, &levels, &mut written_files) {
                Ok(tables) => tables,
                Err(e) => {
                    inner.discard_tables(&written_files);
                    return Err(e);
                }
            }
        };
        let replaced: HashSet<u64> = c
            .inputs
            .iter()
            .chain(&c.next)
            .map(|t| t.meta.file_no)
            .collect();
        inner.apply_edit("lsm::compaction", None, |levels| {
            if c.out_level == 0 {
                // The merged run keeps its place in level 0's newest-first
                // order (flushes since only added newer tables in front).
                let l0 = &mut levels.levels[0];
                let at = l0
                    .iter()
                    .position(|t| replaced.contains(&t.meta.file_no))
                    .unwrap_or(l0.len());
                l0.retain(|t| !replaced.contains(&t.meta.file_no));
                for t in outputs.iter().rev() {
                    l0.insert(at, t.clone());
                }
            } else {
                for level in [c.level, c.out_level] {
                    levels.levels[level].retain(|t| !replaced.contains(&t.meta.file_no));
                }
                for t in &outputs {
                    levels.insert_sorted(c.out_level, t.clone());
                }
            }
        })?;
        if c.level > 0 {
            self.compact_pointer[c.level] = c.inputs.iter().map(|t| t.meta.largest.clone()).max();
        }
        if !moved {
            for t in c.inputs.iter().chain(&c.next) {
                t.mark_obsolete();
            }
            // New readers never read the replaced tables again: give their
            // cache room to the outputs (a reader of an older snapshot
            // reads them from disk; their files go when it lets go).
            let replaced: Vec<u64> = replaced.into_iter().collect();
            inner.cache.forget_files(&replaced);
            for t in &outputs {
                // Only a cache warm-up: a read error here is for the
                // reader of that block to report.
                if !t.warm_cache().unwrap_or(false) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Merges the compaction's inputs into new tables (synced, directory
    /// synced). Records every file it creates in `written` so a failure
    /// can remove them.
    fn merge_into_tables(
        &mut self,
        c: &Compaction,
        levels: &Levels,
        written: &mut Vec<u64>,
    ) -> Result<Vec<Arc<Table>>> {
        let inner = &*self.inner;
        let smallest_snapshot = {
            let st = inner.state();
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
        let opts = &inner.options;
        let dir = &inner.dir;
        // Level 0 tables may overlap: one output keeps the run's place.
        let cut_at = if c.out_level == 0 {
            u64::MAX
        } else {
            opts.target_file_bytes
        };
        let mut tables = Vec::new();
        let mut builder: Option<TableBuilder> = None;
        let mut current_key: Option<Vec<u8>> = None;
        let mut last_seq_for_key = u64::MAX;
        while let Some(e) = merged.current() {
            let first_of_key = current_key.as_deref() != Some(&e.key[..]);
            if first_of_key {
                let current = current_key.get_or_insert_with(Vec::new);
                current.clear();
                current.extend_from_slice(&e.key);
                last_seq_for_key = u64::MAX;
            }
            // leveldb's rules: a version is hidden from every snapshot once
            // a newer one of its key is visible to the oldest snapshot; a
            // tombstone visible to all snapshots with nothing below it
            // shadows nothing (never known for a merge within level 0,
            // which older level-0 tables may lie below).
            let drop = last_seq_for_key <= smallest_snapshot
                || (e.value.is_none()
                    && c.out_level > 0
                    && e.seq <= smallest_snapshot
                    && levels.is_base_for(c.out_level, &e.key));
            last_seq_for_key = e.seq;
            if !drop {
                // Cut tables only between user keys, keeping levels disjoint.
                if first_of_key
                    && builder
                        .as_ref()
                        .is_some_and(|b| b.estimated_size() >= cut_at)
                {
                    if let Some(b) = builder.take() {
                        tables.push(Arc::new(b.finish()?));
                    }
                }
                let b = match builder.as_mut() {
                    Some(b) => b,
                    None => {
                        let file_no = inner.take_file_no();
                        written.push(file_no);
                        builder.insert(TableBuilder::create(
                            dir,
                            file_no,
                            "lsm::compaction",
                            opts.bloom_bits_per_key,
                            inner.cache.clone(),
                            CacheFill::IfRoom,
                        )?)
                    }
                };
                b.add(&e.key, e.seq, e.value.as_deref())?;
            }
            merged.advance()?;
        }
        if let Some(b) = builder.take() {
            tables.push(Arc::new(b.finish()?));
        }
        failpoint("lsm::compaction::sst_dir_sync", dir)?;
        sync_dir(dir)?;
        Ok(tables)
    }
}

/// The tables of `level` overlapping the key range of `inputs` (`None` if
/// `inputs` is empty).
fn overlapping(level: &[Arc<Table>], inputs: &[Arc<Table>]) -> Option<Vec<Arc<Table>>> {
    let lo = inputs.iter().map(|t| &t.meta.smallest).min()?;
    let hi = inputs.iter().map(|t| &t.meta.largest).max()?;
    Some(
        level
            .iter()
            .filter(|t| t.overlaps(lo, hi))
            .cloned()
            .collect(),
    )
}

/// Whether no two of `tables` share a key (so they can all sit in one
/// level below).
fn disjoint(tables: &[Arc<Table>]) -> bool {
    let mut sorted: Vec<&Arc<Table>> = tables.iter().collect();
    sorted.sort_by(|a, b| a.meta.smallest.cmp(&b.meta.smallest));
    sorted
        .windows(2)
        .all(|w| w[0].meta.largest < w[1].meta.smallest)
}

/// The level-0 tables to merge among themselves: the first (newest) run
/// where each next-older table is at most twice the run so far, so merges
/// combine similar sizes and a byte is rewritten a logarithmic number of
/// times; failing that, the two newest. `l0` holds at least two tables.
fn level0_run(l0: &[Arc<Table>]) -> std::ops::Range<usize> {
    for start in 0..l0.len() {
        let mut acc = l0[start].meta.size;
        let mut end = start + 1;
        while end < l0.len() && l0[end].meta.size <= acc.saturating_mul(2) {
            acc += l0[end].meta.size;
            end += 1;
        }
        if end - start >= 2 {
            return start..end;
        }
    }
    0..2.min(l0.len())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(i: u32) -> Bytes {
        Bytes::from(format!("key-{i:06}"))
    }

    fn level_files(engine: &LsmEngine, level: usize) -> Vec<u64> {
        let v = engine.handle.inner.version();
        v.levels.levels[level]
            .iter()
            .map(|t| t.meta.file_no)
            .collect()
    }

    /// Many small persists over a large level 1 merge their level-0 tables
    /// among themselves: level 1 is not rewritten for each, level 0 stays
    /// small, the newest value of every key wins (level 0 keeps its
    /// newest-first order through the merges), also after a reopen.
    #[test]
    fn small_persists_merge_within_level0_without_rewriting_level1() {
        let dir = tempfile::tempdir().unwrap();
        let options = LsmOptions {
            memtable_bytes: 4 << 20,
            block_cache_bytes: 1 << 20,
            target_file_bytes: 256 << 10,
            l0_compaction_trigger: 2,
            ..LsmOptions::default()
        };
        let engine = LsmEngine::open(dir.path(), options.clone()).unwrap();
        let mut model = BTreeMap::new();
        let mut index = 0;
        for half in 0..2u32 {
            let mut batch = WriteBatch::new();
            for i in (half..10_000).step_by(2) {
                let v = Bytes::from(vec![b'a' + (i % 26) as u8; 100]);
                model.insert(key(i), v.clone());
                batch.put(key(i), v);
            }
            index += 1;
            batch.set_applied_index(index);
            engine.write(batch).unwrap();
            assert_eq!(engine.persist().unwrap(), index);
            engine.wait_idle();
        }
        let level1 = level_files(&engine, 1);
        assert!(level1.len() >= 2, "{:?}", engine.table_counts());
        assert_eq!(engine.table_counts()[0], 0);
        for round in 0..30u32 {
            let mut batch = WriteBatch::new();
            for j in 0..5u32 {
                // Spread over the whole key range; some keys come back.
                let k = key((round * 1237 + j * 2003) % 10_000);
                if (round + j) % 7 == 0 {
                    model.remove(&k);
                    batch.delete(k);
                } else {
                    let v = Bytes::from(format!("round-{round}"));
                    model.insert(k.clone(), v.clone());
                    batch.put(k, v);
                }
            }
            index += 1;
            batch.set_applied_index(index);
            engine.write(batch).unwrap();
            assert_eq!(engine.persist().unwrap(), index);
            engine.wait_idle();
            assert!(engine.table_counts()[0] <= 2, "{:?}", engine.table_counts());
        }
        assert_eq!(level_files(&engine, 1), level1, "level 1 was rewritten");
        let check = |engine: &LsmEngine| {
            let snap = engine.snapshot();
            for i in 0..10_000 {
                assert_eq!(
                    snap.get(&key(i)).unwrap(),
                    model.get(&key(i)).cloned(),
                    "{i}"
                );
            }
            let mut scanned = BTreeMap::new();
            snap.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
                scanned.insert(Bytes::copy_from_slice(k), v.clone());
                Scan::Continue
            })
            .unwrap();
            assert!(scanned == model, "scan differs from the model");
        };
        check(&engine);
        drop(engine);
        let engine = LsmEngine::open(dir.path(), options).unwrap();
        assert_eq!(engine.durable_applied_index(), index);
        check(&engine);
    }

    /// Level-0 tables that share no key (a sequential load) move down to
    /// level 1 without being rewritten.
    #[test]
    fn disjoint_level0_tables_move_down_without_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let options = LsmOptions {
            l0_compaction_trigger: 2,
            ..LsmOptions::default()
        };
        let engine = LsmEngine::open(dir.path(), options).unwrap();
        for part in 0..2u32 {
            let mut batch = WriteBatch::new();
            for i in part * 100..(part + 1) * 100 {
                batch.put(key(i), Bytes::from_static(b"v"));
            }
            batch.set_applied_index(u64::from(part) + 1);
            engine.write(batch).unwrap();
            engine.persist().unwrap();
        }
        engine.wait_idle();
        let mut files = level_files(&engine, 1);
        files.sort_unstable();
        assert_eq!(files, vec![1, 2], "{:?}", engine.table_counts());
        assert_eq!(engine.get(&key(150)).unwrap().as_deref(), Some(&b"v"[..]));
    }
}
