//! The copy-on-write B+tree engine (boltdb/redb lineage): [`BtreeEngine`],
//! its snapshots, and the single file `data.btree` they live in.
//!
//! This module owns the file: opening and recovering it, the commit
//! protocol of [`BtreeEngine::persist`], page allocation and the free list,
//! the block cache in front of reads, and [`BtreeEngine::defragment`]. The
//! tree's shape is the `tree` submodule's, the byte layout `page`'s.
//!
//! It must never: overwrite a page that the durable meta, the previous meta
//! (the fallback after a torn meta write) or a live snapshot can reach;
//! persist data past the applied index written with it; serve bytes whose
//! checksum failed; do I/O under the writer lock outside of cache-miss
//! reads (and a defragmentation, which stops writes on purpose); or accept
//! writes after a failed commit (fsyncgate: the engine is poisoned).
//!
//! # Memory
//!
//! Writes path-copy an in-memory tree of `Arc`'d immutable nodes whose
//! untouched parts are page pointers into the file. A snapshot is a clone
//! of the root pointer plus the file handle: O(1), it never waits for I/O.
//! Dirty nodes stay in memory until a commit writes them. After a commit,
//! once the writer has loaded or copied more than
//! [`BtreeOptions::resident_nodes`] nodes since the last trim, clean nodes
//! are evicted from the writer's tree (replaced by their page ids), so
//! resident memory is bounded by the dirty data plus that budget; reads of
//! evicted nodes go through the block cache.
//!
//! # Commit (`persist`)
//!
//! Under the writer lock (briefly) the current root, applied index and
//! garbage list are frozen and the writer epoch advances; the writer goes on
//! copying anything it touches. Then, without that lock: dirty nodes are
//! given pages bottom-up (overflow values first), the free list is written
//! to a fresh run, all of it goes out in one batched io_uring write
//! (pages adjacent in the file merged into single writes),
//! `fdatasync`, the meta page of transaction `t` is written into slot
//! `t % 2`, `fdatasync`. Open takes the valid meta with the highest `t`.
//!
//! # Reads
//!
//! Point reads probe cached pages in place. Where one operation needs many
//! pages, their cache misses are read together (io_uring, all in flight at
//! once) before they are used: a write batch brings in the paths of its
//! keys level by level, and a scan reads ahead the children it goes on to
//! in doubling windows. Blocks enter the cache referenced (CLOCK's second
//! chance) and pages are dropped from it as soon as they are free.
//!
//! # Page reuse
//!
//! A page the writer drops during epoch `t` is *pending* under tag `t`: the
//! tree of commit `t - 1` and snapshots taken before commit `t` still reach
//! it. It becomes free once commit `t` is durable (so only the current and
//! the previous meta are ever needed) and every snapshot that might reach it
//! (epoch `<= t`) is gone. The on-disk free list of commit `t` holds the free
//! pages and every pending one (after a restart no snapshot exists).
//! [`BtreeEngine::check`] verifies that accounting on the file.
//!
//! # Failures
//!
//! Any error inside a commit poisons the engine (no more writes or commits;
//! snapshots still read): memory may then hold page ids the file never got.
//! Reopening recovers the last durable commit. Failpoints (the `fail`
//! crate): `btree::commit::{after_freeze, after_page_write,
//! after_data_sync, after_meta_write}` (the last is "meta written, not yet
//! synced", so a crash there may recover either commit) and
//! `btree::defrag::{after_tmp_write, before_rename, after_rename}`.

mod page;
mod tree;

use std::collections::BTreeMap;
use std::fs;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use crate::io::{sync_dir, AlignedBuf, BlockCache, DirectFile};
use crate::{BatchOp, Engine, EngineSize, EngineSnapshot, Error, Result, Scan, WriteBatch};
pub(crate) use page::{fuzz_decoders as fuzz_page, fuzz_sealed_file};
use page::{offset_of, pages_for, Meta, MetaSlot, INLINE_MAX, NODE_CAPACITY};
use tree::{BigVal, Child, Entry, Freed, Node, NodeKind, Val, WriteCtx};

pub use page::{MAX_KEY_LEN, PAGE_SIZE};

/// The data file's name inside the engine's directory.
pub const DATA_FILE: &str = "data.btree";
const TMP_FILE: &str = "data.btree.tmp";

/// Cache keys of overflow values carry this bit so they can never be taken
/// for a node page of the same offset.
const BIG_VALUE_CACHE_BIT: u64 = 1 << 63;

/// A write batch brings the pages of this many of its operations into the
/// cache at a time, before applying them (see [`tree::prefetch_paths`]).
const PREFETCH_OPS: usize = 512;

/// Largest single write a commit merges adjacent pages into.
const COALESCE_MAX_BYTES: u64 = 1 << 20;

/// Defragmentation writes the new file in batches of about this many bytes.
const DEFRAG_WRITE_BATCH_BYTES: usize = 4 << 20;

/// Leaves and branches written by defragmentation are filled to this share
/// of a page (percent), leaving room for a few inserts before a split.
const DEFRAG_FILL_PERCENT: usize = 90;

static NEXT_FILE_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug, Clone)]
pub struct BtreeOptions {
    /// Block cache capacity in bytes.
    pub cache_bytes: usize,
    /// Nodes the writer may load or copy before a commit trims its tree
    /// back to the dirty nodes (0: trim after every commit).
    pub resident_nodes: usize,
}

impl Default for BtreeOptions {
    fn default() -> Self {
        BtreeOptions {
            cache_bytes: 64 << 20,
            resident_nodes: 16 << 10,
        }
    }
}

/// Space use of the data file (etcd's `dbSize` and `dbSizeInUse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtreeSize {
    /// Length of `data.btree`.
    pub file_bytes: u64,
    /// Pages neither free nor waiting to become free, in bytes.
    pub in_use_bytes: u64,
}

/// What [`BtreeEngine::defragment`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefragReport {
    pub bytes_before: u64,
    pub bytes_after: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn internal(what: &str) -> Error {
    Error::Invalid(format!("btree: internal invariant broken: {what}"))
}

/// An error a failpoint injects.
// Unused when the fail crate's `failpoints` feature is off (the macros
// compile to nothing).
#[allow(dead_code)]
fn injected(name: &str, path: &Path) -> Error {
    Error::io(
        "failpoint",
        path,
        std::io::Error::other(format!("injected failure at {name}")),
    )
}

/// One data file (the current one, or an older one a snapshot still reads
/// after a defragmentation) with the shared block cache in front of it.
pub(crate) struct DataFile {
    id: u64,
    file: DirectFile,
    cache: Arc<BlockCache>,
}

impl DataFile {
    fn open(path: &Path, cache: Arc<BlockCache>) -> Result<DataFile> {
        Ok(DataFile {
            id: NEXT_FILE_ID.fetch_add(1, Ordering::Relaxed),
            file: DirectFile::open(path, false)?,
            cache,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.file.path()
    }

    fn corrupt(&self, what: &'static str, offset: u64, reason: String) -> Error {
        Error::Corrupt {
            what,
            path: self.path().to_path_buf(),
            offset,
            reason,
        }
    }

    /// Node page `page`'s bytes (through the cache; verified before
    /// caching).
    pub(crate) fn read_block(&self, page: u64) -> Result<Arc<[u8]>> {
        let offset = offset_of(page);
        if page < 2 {
            return Err(self.corrupt("btree page", offset, format!("pointer to page {page}")));
        }
        if let Some(b) = self.cache.get(self.id, offset) {
            return Ok(b);
        }
        let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
        self.file.read_at(&mut buf, offset)?;
        page::verify_node(&buf, page).map_err(|r| self.corrupt("btree page", offset, r))?;
        let block: Arc<[u8]> = Arc::from(&buf[..]);
        self.cache.insert_referenced(self.id, offset, block.clone());
        Ok(block)
    }

    /// Brings the node pages among `pages` that are not cached into the
    /// cache with reads all in flight at once. Best effort: a page that
    /// fails to read or verify is left out, for the ordinary read that
    /// follows to report.
    pub(crate) fn prefetch(&self, pages: &[u64]) {
        let mut pages = pages.to_vec();
        pages.sort_unstable();
        pages.dedup();
        let mut reads: Vec<(u64, AlignedBuf)> = pages
            .into_iter()
            .filter(|&p| p >= 2 && !self.cache.contains(self.id, offset_of(p)))
            .map(|p| (offset_of(p), AlignedBuf::zeroed(PAGE_SIZE)))
            .collect();
        // A single miss has nothing to overlap with: the caller's own read
        // does it.
        if reads.len() < 2 {
            return;
        }
        if self.file.read_many_at(&mut reads).is_err() {
            return;
        }
        for (offset, buf) in reads {
            if page::verify_node(&buf, offset / PAGE_SIZE as u64).is_ok() {
                self.cache
                    .insert_referenced(self.id, offset, Arc::from(&buf[..]));
            }
        }
    }

    /// Reads and decodes node page `page`.
    pub(crate) fn read_node(&self, page: u64) -> Result<Node> {
        let bytes = Bytes::from_owner(self.read_block(page)?);
        let kind = page::decode_node(&bytes)
            .map_err(|r| self.corrupt("btree page", offset_of(page), r))?;
        Ok(Node::stored(page, kind))
    }

    /// One step of a point lookup in node page `page`, without decoding
    /// it. The page comes back only when the step found an inline value
    /// (its bytes are a slice of the page); a cached branch step takes no
    /// reference to the page at all.
    pub(crate) fn probe(&self, page: u64, key: &[u8]) -> Result<(Option<Arc<[u8]>>, page::Probe)> {
        self.probe_or(page, key, &mut || {})
    }

    /// [`DataFile::probe`], calling `before_read` first when the page is
    /// not cached (a batch of lookups then brings in its other pages with
    /// this one).
    pub(crate) fn probe_or(
        &self,
        page: u64,
        key: &[u8],
        before_read: &mut dyn FnMut(),
    ) -> Result<(Option<Arc<[u8]>>, page::Probe)> {
        let cached = (page >= 2)
            .then(|| {
                self.cache.with(self.id, offset_of(page), |block| {
                    let step = page::probe(block, key);
                    let keep = matches!(step, Ok(page::Probe::Inline(_))).then(|| block.clone());
                    (keep, step)
                })
            })
            .flatten();
        let (block, step) = match cached {
            Some(found) => found,
            None => {
                before_read();
                let block = self.read_block(page)?;
                let step = page::probe(&block, key);
                (Some(block), step)
            }
        };
        let step = step.map_err(|r| self.corrupt("btree page", offset_of(page), r))?;
        Ok((block, step))
    }

    /// Reads an overflow value (through the cache; verified before caching).
    pub(crate) fn read_big(&self, b: &BigVal) -> Result<Bytes> {
        /// Largest overflow value read back (metcd's requests are capped at
        /// 64 MiB).
        const MAX_OVERFLOW_VALUE: usize = 256 << 20;
        let first = b.page();
        let offset = offset_of(first);
        if let Some(block) = self.cache.get(self.id | BIG_VALUE_CACHE_BIT, offset) {
            return Ok(Bytes::from_owner(block));
        }
        // Lengths come from disk: bound them before allocating (a value is
        // at most a request, and requests are capped well below this).
        let len = usize::try_from(b.len)
            .ok()
            .filter(|&l| l <= MAX_OVERFLOW_VALUE)
            .ok_or_else(|| {
                self.corrupt("btree overflow value", offset, format!("length {}", b.len))
            })?;
        let mut buf = AlignedBuf::zeroed(pages_for(b.len) as usize * PAGE_SIZE);
        self.file.read_at(&mut buf, offset)?;
        let crc = crc32c::crc32c(&buf[..len]);
        if crc != b.crc() {
            return Err(self.corrupt(
                "btree overflow value",
                offset,
                format!(
                    "checksum mismatch (expected {:#010x}, computed {crc:#010x})",
                    b.crc()
                ),
            ));
        }
        let block: Arc<[u8]> = Arc::from(&buf[..len]);
        self.cache
            .insert_referenced(self.id | BIG_VALUE_CACHE_BIT, offset, block.clone());
        Ok(Bytes::from_owner(block))
    }

    /// Forgets cached contents of pages about to be rewritten.
    fn forget(&self, first: u64, pages: u64) {
        for p in first..first + pages {
            self.cache.forget(self.id, offset_of(p));
            self.cache
                .forget(self.id | BIG_VALUE_CACHE_BIT, offset_of(p));
        }
    }
}

impl Drop for DataFile {
    fn drop(&mut self) {
        self.cache.forget_file(self.id);
        self.cache.forget_file(self.id | BIG_VALUE_CACHE_BIT);
    }
}

/// Free pages as coalesced runs `start -> pages`.
#[derive(Debug, Clone, Default)]
struct FreeRuns {
    runs: BTreeMap<u64, u64>,
}

impl FreeRuns {
    fn insert(&mut self, start: u64, pages: u64) -> std::result::Result<(), String> {
        if pages == 0 {
            return Ok(());
        }
        let prev = self.runs.range(..=start).next_back().map(|(&s, &l)| (s, l));
        if let Some((s, l)) = prev {
            if s + l > start {
                return Err(format!("page {start} freed twice"));
            }
        }
        if let Some((&s, _)) = self.runs.range(start..).next() {
            if s < start + pages {
                return Err(format!("page {s} freed twice"));
            }
        }
        let (mut s, mut l) = (start, pages);
        if let Some((ps, pl)) = prev {
            if ps + pl == start {
                self.runs.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(nl) = self.runs.remove(&(start + pages)) {
            l += nl;
        }
        self.runs.insert(s, l);
        Ok(())
    }

    /// First fit.
    fn alloc(&mut self, pages: u64) -> Option<u64> {
        let (&s, &l) = self.runs.iter().find(|(_, &l)| l >= pages)?;
        self.runs.remove(&s);
        if l > pages {
            self.runs.insert(s + pages, l - pages);
        }
        Some(s)
    }

    /// Takes `[start, start + pages)` out if it is free.
    fn remove_range(&mut self, start: u64, pages: u64) {
        let Some((&s, &l)) = self.runs.range(..=start).next_back() else {
            return;
        };
        if s + l < start + pages {
            return;
        }
        self.runs.remove(&s);
        if start > s {
            self.runs.insert(s, start - s);
        }
        if s + l > start + pages {
            self.runs.insert(start + pages, s + l - start - pages);
        }
    }

    /// Drops a free run at the end of the file; returns the new page count.
    fn trim_tail(&mut self, page_count: u64) -> u64 {
        match self.runs.iter().next_back().map(|(&s, &l)| (s, l)) {
            Some((s, l)) if s + l == page_count => {
                self.runs.remove(&s);
                s
            }
            _ => page_count,
        }
    }

    fn to_vec(&self) -> Vec<(u64, u64)> {
        self.runs.iter().map(|(&s, &l)| (s, l)).collect()
    }
}

/// Allocation state; owned by whoever holds the store lock (a commit or a
/// defragmentation).
struct Store {
    free: FreeRuns,
    /// Epoch tag -> runs dropped during that epoch, not yet reusable.
    pending: BTreeMap<u64, Vec<(u64, u64)>>,
    page_count: u64,
    durable_txn: u64,
    /// The durable meta's root page (0: empty tree).
    durable_root: u64,
    /// The durable meta's free-list run (first page, pages); pages 0 = none.
    freelist: (u64, u64),
}

impl Store {
    fn alloc(&mut self, pages: u64, file: &DataFile) -> u64 {
        let first = self.free.alloc(pages).unwrap_or_else(|| {
            let first = self.page_count;
            self.page_count += pages;
            first
        });
        file.forget(first, pages);
        first
    }
}

struct WriterState {
    /// What writes since the last freeze dropped from the tree.
    freed: Vec<Freed>,
    /// Nodes loaded or copied since the last trim.
    touched: usize,
}

/// The published state readers start from.
struct Current {
    root: Child,
    applied_index: u64,
    /// The number the next commit will get.
    epoch: u64,
    file: Arc<DataFile>,
    /// Live snapshots by the epoch they were taken in.
    held: BTreeMap<u64, usize>,
}

struct Inner {
    dir: PathBuf,
    options: BtreeOptions,
    cache: Arc<BlockCache>,
    /// Lock order: store, then writer, then current.
    store: Mutex<Store>,
    writer: Mutex<WriterState>,
    current: Mutex<Current>,
    durable_applied_index: AtomicU64,
    poisoned: Mutex<Option<String>>,
    /// [`BtreeSize`] as of the last commit, readable without the store
    /// lock (a commit holds it for its whole write).
    committed_file_bytes: AtomicU64,
    committed_in_use_bytes: AtomicU64,
    /// Keys and values put (plus [`PUT_OVERHEAD`] each) since the writer's
    /// root was last frozen for a commit: growth the file has not seen yet.
    unpersisted_bytes: AtomicU64,
    /// The same for the root a running commit writes, until that commit
    /// has measured the file.
    committing_bytes: AtomicU64,
}

/// What a put adds to the file beyond its key and value, in
/// [`EngineSize`] terms (leaf slot and entry header, node splits).
const PUT_OVERHEAD: u64 = 32;

impl Inner {
    /// The store's space use, with `store` locked and `file_bytes` the
    /// data file's length.
    fn measure(store: &Store, file_bytes: u64) -> BtreeSize {
        let free: u64 = store.free.runs.values().sum::<u64>()
            + store
                .pending
                .values()
                .flatten()
                .map(|&(_, n)| n)
                .sum::<u64>();
        BtreeSize {
            file_bytes,
            in_use_bytes: offset_of(store.page_count.saturating_sub(free)),
        }
    }

    fn record_size(&self, size: BtreeSize) {
        self.committed_file_bytes
            .store(size.file_bytes, Ordering::Relaxed);
        self.committed_in_use_bytes
            .store(size.in_use_bytes, Ordering::Relaxed);
        self.committing_bytes.store(0, Ordering::Relaxed);
    }

    fn check_poisoned(&self) -> Result<()> {
        match &*lock(&self.poisoned) {
            Some(why) => Err(Error::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    fn poison(&self, e: &Error) {
        lock(&self.poisoned).get_or_insert_with(|| e.to_string());
    }
}

/// The B+tree engine. Cloning gives another handle to the same engine.
#[derive(Clone)]
pub struct BtreeEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BtreeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BtreeEngine({})", self.inner.dir.display())
    }
}

impl BtreeEngine {
    /// Opens (creating if absent) `dir/data.btree` and recovers the state of
    /// the last successful [`BtreeEngine::persist`].
    pub fn open(dir: &Path, options: BtreeOptions) -> Result<BtreeEngine> {
        fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
        let path = dir.join(DATA_FILE);
        let tmp = dir.join(TMP_FILE);
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &tmp, e)),
        }
        let exists = path.try_exists().map_err(|e| Error::io("stat", &path, e))?;
        if !exists {
            create_fresh(dir, &path, &tmp)?;
        }
        let cache = Arc::new(BlockCache::new(options.cache_bytes));
        let file = Arc::new(DataFile::open(&path, cache.clone())?);
        let meta = read_meta(&file)?;
        let free = read_freelist(&file, &meta)?;
        let epoch = meta.txn + 1;
        let root = if meta.root == 0 {
            Child::Mem(Arc::new(Node::empty_leaf(epoch)))
        } else {
            Child::Disk(meta.root)
        };
        let file_bytes = file.file.len()?;
        let inner = Inner {
            dir: dir.to_path_buf(),
            options,
            cache,
            store: Mutex::new(Store {
                free,
                pending: BTreeMap::new(),
                page_count: meta.page_count,
                durable_txn: meta.txn,
                durable_root: meta.root,
                freelist: (meta.freelist_page, meta.freelist_pages),
            }),
            writer: Mutex::new(WriterState {
                freed: Vec::new(),
                touched: 0,
            }),
            current: Mutex::new(Current {
                root,
                applied_index: meta.applied_index,
                epoch,
                file,
                held: BTreeMap::new(),
            }),
            durable_applied_index: AtomicU64::new(meta.applied_index),
            poisoned: Mutex::new(None),
            committed_file_bytes: AtomicU64::new(0),
            committed_in_use_bytes: AtomicU64::new(0),
            unpersisted_bytes: AtomicU64::new(0),
            committing_bytes: AtomicU64::new(0),
        };
        inner.record_size(Inner::measure(&lock(&inner.store), file_bytes));
        Ok(BtreeEngine {
            inner: Arc::new(inner),
        })
    }

    /// What the block cache holds.
    pub fn cache_usage(&self) -> crate::io::CacheUsage {
        self.inner.cache.usage()
    }

    /// How many nodes of the writer's tree are in memory (what
    /// [`BtreeOptions::resident_nodes`] bounds after each persist).
    pub fn resident_nodes(&self) -> usize {
        tree::resident(&lock(&self.inner.current).root)
    }

    /// Makes everything written so far durable together with its applied
    /// index, and returns that index. Holds the writer out only while it
    /// freezes the current root; concurrent calls are serialised.
    pub fn persist(&self) -> Result<u64> {
        let inner = &*self.inner;
        let mut store = lock(&inner.store);
        inner.check_poisoned()?;
        let (epoch, root, applied, file, freed) = {
            let mut w = lock(&inner.writer);
            let mut c = lock(&inner.current);
            let durable = inner.durable_applied_index.load(Ordering::Acquire);
            if tree::is_clean(&c.root) && c.applied_index == durable {
                return Ok(durable);
            }
            let epoch = c.epoch;
            c.epoch += 1;
            let frozen = inner.unpersisted_bytes.swap(0, Ordering::Relaxed);
            inner.committing_bytes.fetch_add(frozen, Ordering::Relaxed);
            (
                epoch,
                c.root.clone(),
                c.applied_index,
                c.file.clone(),
                std::mem::take(&mut w.freed),
            )
        };
        // A panic inside commit would leave the store's page accounting
        // half-changed: poison the engine as for an I/O error.
        let committed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.commit(&mut store, epoch, &root, applied, &file, freed)
        }))
        .unwrap_or_else(|_| Err(Error::Poisoned("a btree commit panicked".to_owned())));
        if let Err(e) = committed {
            inner.poison(&e);
            return Err(e);
        }
        inner
            .durable_applied_index
            .store(applied, Ordering::Release);
        if let Ok(file_bytes) = file.file.len() {
            inner.record_size(Inner::measure(&store, file_bytes));
        }
        drop(root);
        let mut w = lock(&inner.writer);
        let mut c = lock(&inner.current);
        // `touched` counts the nodes batches loaded or copied, not those
        // they created (splits): a tree that only grows (a sequential fill,
        // an install) was never trimmed and held every node it wrote (7 GB
        // installing 10M keys), so the resident tree is measured too.
        let budget = inner.options.resident_nodes;
        if w.touched > budget || tree::resident_above(&c.root, budget) {
            tree::evict(&mut c.root);
            w.touched = 0;
        }
        Ok(applied)
    }

    fn commit(
        &self,
        store: &mut Store,
        epoch: u64,
        root: &Child,
        applied_index: u64,
        file: &DataFile,
        freed: Vec<Freed>,
    ) -> Result<()> {
        fail::fail_point!("btree::commit::after_freeze", |_| Err(injected(
            "btree::commit::after_freeze",
            file.path()
        )));
        // What this epoch dropped, including the previous free list.
        let mut dropped = Vec::with_capacity(freed.len() + 1);
        for f in freed {
            match f {
                Freed::Run(p, n) => dropped.push((p, n)),
                Freed::Node(n) => match n.page() {
                    0 => return Err(internal("a frozen node was never written")),
                    p => dropped.push((p, 1)),
                },
                Freed::Value(b) => match b.page() {
                    0 => return Err(internal("a frozen value was never written")),
                    p => dropped.push((p, pages_for(b.len))),
                },
            }
        }
        if store.freelist.1 > 0 {
            dropped.push(store.freelist);
        }
        store.pending.entry(epoch).or_default().extend(dropped);

        // Pages dropped in epochs whose commit is durable and that no live
        // snapshot can reach become reusable.
        let oldest_snapshot = lock(&self.inner.current)
            .held
            .keys()
            .next()
            .copied()
            .unwrap_or(u64::MAX);
        let ready: Vec<u64> = store
            .pending
            .range(..=store.durable_txn)
            .map(|(&t, _)| t)
            .take_while(|&t| t < oldest_snapshot)
            .collect();
        for t in ready {
            for (p, n) in store.pending.remove(&t).unwrap_or_default() {
                // Nothing reads a free page again: its cache room goes to
                // live pages now rather than when the page is reused.
                file.forget(p, n);
                store
                    .free
                    .insert(p, n)
                    .map_err(|r| internal(&format!("free list: {r}")))?;
            }
        }
        store.page_count = store.free.trim_tail(store.page_count);

        let mut out = CommitWriter {
            store,
            file,
            writes: Vec::new(),
            node_writes: Vec::new(),
        };
        let root_page = out.write(root)?;
        let CommitWriter {
            store,
            mut writes,
            node_writes,
            ..
        } = out;

        // The free list of this commit: free and pending pages.
        let mut all = store.free.clone();
        for runs in store.pending.values() {
            for &(p, n) in runs {
                all.insert(p, n)
                    .map_err(|r| internal(&format!("free list: {r}")))?;
            }
        }
        // One extra run of room: taking the list's own pages out of a run
        // can split it.
        let list_pages = pages_for(page::freelist_len(all.runs.len() + 1) as u64);
        let list_first = store.alloc(list_pages, file);
        all.remove_range(list_first, list_pages);
        let runs = all.to_vec();
        let mut list = AlignedBuf::zeroed(list_pages as usize * PAGE_SIZE);
        if page::freelist_len(runs.len()) > list.len() {
            return Err(internal("free list outgrew its pages"));
        }
        page::encode_freelist(list_first, &runs, &mut list);
        writes.push((offset_of(list_first), list));

        let node_offsets: std::collections::HashSet<u64> =
            node_writes.iter().map(|&i| writes[i].0).collect();
        let writes = coalesce(writes);
        let batch: Vec<(u64, &AlignedBuf)> = writes.iter().map(|(o, b)| (*o, b)).collect();
        file.file.write_all_at(&batch)?;
        fail::fail_point!("btree::commit::after_page_write", |_| Err(injected(
            "btree::commit::after_page_write",
            file.path()
        )));
        file.file.sync_data()?;
        fail::fail_point!("btree::commit::after_data_sync", |_| Err(injected(
            "btree::commit::after_data_sync",
            file.path()
        )));
        let meta = Meta {
            txn: epoch,
            root: root_page,
            freelist_page: list_first,
            freelist_pages: list_pages,
            page_count: store.page_count,
            applied_index,
        };
        let mut meta_buf = AlignedBuf::zeroed(PAGE_SIZE);
        page::encode_meta(&meta, &mut meta_buf);
        file.file
            .write_all_at(&[(offset_of(epoch % 2), &meta_buf)])?;
        // The meta is written but not yet synced: a crash here may come up
        // with either this commit or the previous one.
        fail::fail_point!("btree::commit::after_meta_write", |_| Err(injected(
            "btree::commit::after_meta_write",
            file.path()
        )));
        file.file.sync_data()?;

        store.durable_txn = epoch;
        store.durable_root = root_page;
        store.freelist = (list_first, list_pages);
        // Node pages just written are the likeliest next reads (the writer's
        // tree may be trimmed down to them).
        for (offset, buf) in &writes {
            for (at, page) in (*offset..).step_by(PAGE_SIZE).zip(buf.chunks(PAGE_SIZE)) {
                if node_offsets.contains(&at) {
                    file.cache.insert_referenced(file.id, at, Arc::from(page));
                }
            }
        }
        Ok(())
    }

    /// The data file's size and how much of it live data uses (as of the
    /// last commit).
    pub fn size(&self) -> Result<BtreeSize> {
        let store = lock(&self.inner.store);
        let file_bytes = lock(&self.inner.current).file.file.len()?;
        Ok(Inner::measure(&store, file_bytes))
    }

    /// Checks the file's page accounting: the durable tree's node pages and
    /// overflow runs, the free list's own run, the free pages and the
    /// pending ones must cover every page after the metas exactly once (an
    /// overlap would let a commit overwrite live data; a gap is a leak).
    /// Reads the whole durable tree; commits wait meanwhile.
    pub fn check(&self) -> Result<()> {
        let store = lock(&self.inner.store);
        let file = lock(&self.inner.current).file.clone();
        let mut used: Vec<(u64, u64, &'static str)> = Vec::new();
        if store.durable_root != 0 {
            let mut stack = vec![store.durable_root];
            while let Some(page) = stack.pop() {
                used.push((page, 1, "tree node"));
                match file.read_node(page)?.kind {
                    NodeKind::Leaf { entries } => {
                        for e in entries {
                            if let Val::Big(b) = &e.value {
                                // Reading verifies the run's checksum too.
                                tree::value_bytes(&file, &e.value)?;
                                used.push((b.page(), pages_for(b.len), "overflow value"));
                            }
                        }
                    }
                    NodeKind::Branch { children, .. } => {
                        for c in children {
                            if let Child::Disk(p) = c {
                                stack.push(p);
                            }
                        }
                    }
                }
            }
        }
        if store.freelist.1 > 0 {
            used.push((store.freelist.0, store.freelist.1, "free list"));
        }
        used.extend(store.free.to_vec().into_iter().map(|(p, n)| (p, n, "free")));
        for runs in store.pending.values() {
            used.extend(runs.iter().map(|&(p, n)| (p, n, "pending")));
        }
        used.sort_unstable();
        let mut next = 2;
        for (page, pages, what) in used {
            if page != next {
                return Err(Error::Invalid(format!(
                    "{}: page accounting broken at page {}: {what} run {page}+{pages} follows page {}",
                    file.path().display(),
                    next.min(page),
                    next
                )));
            }
            next = page + pages;
        }
        if next != store.page_count {
            return Err(Error::Invalid(format!(
                "{}: pages {next}..{} are neither used nor free",
                file.path().display(),
                store.page_count
            )));
        }
        Ok(())
    }

    /// Rewrites the live tree compactly into a new file (leaves and
    /// branches packed, no free pages), then switches to it: tmp file,
    /// `fdatasync`, rename, directory fsync. Writes and commits wait while
    /// it runs; snapshots keep reading the old file, which stays open until
    /// the last of them is dropped. The new file holds everything written so
    /// far, so this is also a commit.
    pub fn defragment(&self) -> Result<DefragReport> {
        let inner = &*self.inner;
        let mut store = lock(&inner.store);
        inner.check_poisoned()?;
        let mut w = lock(&inner.writer);
        let (root, applied, epoch, old) = {
            let c = lock(&inner.current);
            (c.root.clone(), c.applied_index, c.epoch, c.file.clone())
        };
        let bytes_before = old.file.len()?;
        let path = inner.dir.join(DATA_FILE);
        let tmp = inner.dir.join(TMP_FILE);
        let written = (|| -> Result<(u64, u64)> {
            match fs::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", &tmp, e)),
            }
            let new = DirectFile::open(&tmp, true)?;
            let mut b = Bulk {
                old: &old,
                new: &new,
                next_page: 2,
                out: Vec::new(),
                out_bytes: 0,
                leaf: Vec::new(),
                leaf_size: 0,
                levels: Vec::new(),
            };
            b.walk(&root)?;
            let root_page = b.finish()?;
            let page_count = b.next_page;
            fail::fail_point!("btree::defrag::after_tmp_write", |_| Err(injected(
                "btree::defrag::after_tmp_write",
                &tmp
            )));
            let meta = Meta {
                txn: epoch,
                root: root_page,
                freelist_page: 0,
                freelist_pages: 0,
                page_count,
                applied_index: applied,
            };
            let mut metas = AlignedBuf::zeroed(2 * PAGE_SIZE);
            page::encode_meta(&meta, &mut metas[..PAGE_SIZE]);
            page::encode_meta(&meta, &mut metas[PAGE_SIZE..]);
            new.write_all_at(&[(0, &metas)])?;
            new.sync_data()?;
            fail::fail_point!("btree::defrag::before_rename", |_| Err(injected(
                "btree::defrag::before_rename",
                &tmp
            )));
            fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &tmp, e))?;
            Ok((root_page, page_count))
        })();
        let (root_page, page_count) = match written {
            Ok(x) => x,
            Err(e) => {
                // The old file is untouched; nothing changed.
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
        };
        // The new file is in place: from here a failure leaves memory out of
        // step with the disk, so it poisons.
        let opened = (|| -> Result<Arc<DataFile>> {
            fail::fail_point!("btree::defrag::after_rename", |_| Err(injected(
                "btree::defrag::after_rename",
                &path
            )));
            sync_dir(&inner.dir)?;
            Ok(Arc::new(DataFile::open(&path, inner.cache.clone())?))
        })();
        let new_file = match opened {
            Ok(f) => f,
            Err(e) => {
                inner.poison(&e);
                return Err(e);
            }
        };
        {
            let mut c = lock(&inner.current);
            c.root = Child::Disk(root_page);
            c.file = new_file;
            c.epoch = epoch + 1;
        }
        w.freed.clear();
        w.touched = 0;
        *store = Store {
            free: FreeRuns::default(),
            pending: BTreeMap::new(),
            page_count,
            durable_txn: epoch,
            durable_root: root_page,
            freelist: (0, 0),
        };
        inner
            .durable_applied_index
            .store(applied, Ordering::Release);
        inner.unpersisted_bytes.store(0, Ordering::Relaxed);
        inner.record_size(BtreeSize {
            file_bytes: offset_of(page_count),
            in_use_bytes: offset_of(page_count),
        });
        Ok(DefragReport {
            bytes_before,
            bytes_after: offset_of(page_count),
        })
    }
}

/// A commit's page writes merged where they are adjacent in the file (into
/// writes of at most [`COALESCE_MAX_BYTES`]), in offset order: pages of
/// one commit often take consecutive pages (a grown file tail, a freed
/// run), and one large write costs the device about what one page does.
fn coalesce(mut writes: Vec<(u64, AlignedBuf)>) -> Vec<(u64, AlignedBuf)> {
    fn flush(group: &mut Vec<(u64, AlignedBuf)>, out: &mut Vec<(u64, AlignedBuf)>) {
        if group.len() == 1 {
            out.append(group);
            return;
        }
        let Some(start) = group.first().map(|w| w.0) else {
            return;
        };
        let mut buf = AlignedBuf::zeroed(group.iter().map(|w| w.1.len()).sum());
        let mut at = 0;
        for (_, b) in group.drain(..) {
            buf[at..at + b.len()].copy_from_slice(&b);
            at += b.len();
        }
        out.push((start, buf));
    }
    writes.sort_unstable_by_key(|w| w.0);
    let mut out = Vec::with_capacity(writes.len());
    let mut group = Vec::new();
    let (mut start, mut end) = (0, 0);
    for (offset, buf) in writes {
        let len = buf.len() as u64;
        if group.is_empty() || offset != end || end + len - start > COALESCE_MAX_BYTES {
            flush(&mut group, &mut out);
            start = offset;
            end = offset;
        }
        end += len;
        group.push((offset, buf));
    }
    flush(&mut group, &mut out);
    out
}

/// Writes a commit's dirty nodes and overflow values into allocated pages.
struct CommitWriter<'a> {
    store: &'a mut Store,
    file: &'a DataFile,
    writes: Vec<(u64, AlignedBuf)>,
    /// Indices into `writes` of node pages (to warm the cache with).
    node_writes: Vec<usize>,
}

impl CommitWriter<'_> {
    /// Writes the tree under `child` bottom-up; returns its page.
    fn write(&mut self, child: &Child) -> Result<u64> {
        let node = match child {
            Child::Disk(p) => return Ok(*p),
            Child::Mem(n) => n,
        };
        let done = node.page();
        if done != 0 {
            return Ok(done);
        }
        let child_pages = match &node.kind {
            NodeKind::Leaf { entries } => {
                for e in entries {
                    if let Val::Big(b) = &e.value {
                        if b.page() == 0 {
                            let Some(data) = &b.data else {
                                return Err(internal("unwritten overflow value without data"));
                            };
                            let first = self.store.alloc(pages_for(b.len), self.file);
                            self.writes
                                .push((offset_of(first), AlignedBuf::from_slice(data)));
                            b.set_written(first, crc32c::crc32c(data));
                        }
                    }
                }
                Vec::new()
            }
            NodeKind::Branch { children, .. } => children
                .iter()
                .map(|c| self.write(c))
                .collect::<Result<Vec<u64>>>()?,
        };
        let page = self.store.alloc(1, self.file);
        let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
        page::encode_node(&node.kind, page, &child_pages, &mut buf).map_err(|r| internal(&r))?;
        self.node_writes.push(self.writes.len());
        self.writes.push((offset_of(page), buf));
        node.set_page(page);
        Ok(page)
    }
}

/// Defragmentation's bulk loader: streams the live entries in key order
/// into packed leaves, and builds the branch levels above them bottom-up.
struct Bulk<'a> {
    old: &'a DataFile,
    new: &'a DirectFile,
    next_page: u64,
    out: Vec<(u64, AlignedBuf)>,
    out_bytes: usize,
    leaf: Vec<Entry>,
    leaf_size: usize,
    /// Per branch level: (keys, child pages, size).
    levels: Vec<(Vec<Bytes>, Vec<u64>, usize)>,
}

impl Bulk<'_> {
    const FILL: usize = NODE_CAPACITY * DEFRAG_FILL_PERCENT / 100;

    fn walk(&mut self, child: &Child) -> Result<()> {
        let node = match child {
            Child::Mem(n) => n.clone(),
            Child::Disk(p) => Arc::new(self.old.read_node(*p)?),
        };
        match &node.kind {
            NodeKind::Leaf { entries } => {
                for e in entries {
                    let value = match &e.value {
                        Val::Inline(v) => Val::Inline(v.clone()),
                        Val::Big(_) => {
                            let data = tree::value_bytes(self.old, &e.value)?;
                            let len = data.len() as u64;
                            let first = self.next_page;
                            self.next_page += pages_for(len);
                            let crc = crc32c::crc32c(&data);
                            self.emit(first, AlignedBuf::from_slice(&data))?;
                            Val::Big(Arc::new(BigVal::stored(len, first, crc)))
                        }
                    };
                    let size = page::leaf_entry_size(&e.key, &value);
                    if self.leaf_size + size > Self::FILL && !self.leaf.is_empty() {
                        self.flush_leaf()?;
                    }
                    self.leaf_size += size;
                    self.leaf.push(Entry {
                        key: e.key.clone(),
                        value,
                    });
                }
            }
            NodeKind::Branch { children, .. } => {
                for c in children {
                    self.walk(c)?;
                }
            }
        }
        Ok(())
    }

    fn emit(&mut self, offset_page: u64, buf: AlignedBuf) -> Result<()> {
        self.out_bytes += buf.len();
        self.out.push((offset_of(offset_page), buf));
        if self.out_bytes >= DEFRAG_WRITE_BATCH_BYTES {
            self.flush_out()?;
        }
        Ok(())
    }

    fn flush_out(&mut self) -> Result<()> {
        let batch: Vec<(u64, &AlignedBuf)> = self.out.iter().map(|(o, b)| (*o, b)).collect();
        if !batch.is_empty() {
            self.new.write_all_at(&batch)?;
        }
        self.out.clear();
        self.out_bytes = 0;
        Ok(())
    }

    fn write_node(&mut self, kind: &NodeKind, child_pages: &[u64]) -> Result<u64> {
        let page = self.next_page;
        self.next_page += 1;
        let mut buf = AlignedBuf::zeroed(PAGE_SIZE);
        page::encode_node(kind, page, child_pages, &mut buf).map_err(|r| internal(&r))?;
        self.emit(page, buf)?;
        Ok(page)
    }

    fn flush_leaf(&mut self) -> Result<()> {
        let entries = std::mem::take(&mut self.leaf);
        self.leaf_size = 0;
        let first = entries.first().map(|e| e.key.clone()).unwrap_or_default();
        let page = self.write_node(&NodeKind::Leaf { entries }, &[])?;
        self.push_child(0, first, page)
    }

    /// Adds a child (with the smallest key under it) to branch level
    /// `level`, writing that level's node out first if it is full.
    fn push_child(&mut self, level: usize, key: Bytes, page: u64) -> Result<()> {
        if self.levels.len() <= level {
            self.levels.push((Vec::new(), Vec::new(), 0));
        }
        let size = page::branch_entry_size(&key);
        if self.levels[level].2 + size > Self::FILL && !self.levels[level].1.is_empty() {
            self.flush_level(level)?;
        }
        let lv = &mut self.levels[level];
        lv.0.push(key);
        lv.1.push(page);
        lv.2 += size;
        Ok(())
    }

    fn flush_level(&mut self, level: usize) -> Result<()> {
        let (mut keys, pages, _) = std::mem::take(&mut self.levels[level]);
        let first = keys.first().cloned().unwrap_or_default();
        if let Some(k0) = keys.first_mut() {
            *k0 = Bytes::new();
        }
        let children = pages.iter().map(|&p| Child::Disk(p)).collect();
        let page = self.write_node(&NodeKind::Branch { keys, children }, &pages)?;
        self.push_child(level + 1, first, page)
    }

    /// Writes what is left, level by level; returns the root page.
    fn finish(&mut self) -> Result<u64> {
        let empty_tree = self.levels.is_empty();
        if !self.leaf.is_empty() || empty_tree {
            self.flush_leaf()?;
        }
        let mut level = 0;
        let root = loop {
            let top = level + 1 == self.levels.len();
            if top && self.levels[level].1.len() == 1 {
                break self.levels[level].1[0];
            }
            self.flush_level(level)?;
            level += 1;
        };
        self.flush_out()?;
        Ok(root)
    }
}

/// Creates an empty data file: both meta slots at transaction 0, written to
/// a temporary name first so a crash never leaves a half-made file.
fn create_fresh(dir: &Path, path: &Path, tmp: &Path) -> Result<()> {
    let f = DirectFile::open(tmp, true)?;
    let meta = Meta {
        txn: 0,
        root: 0,
        freelist_page: 0,
        freelist_pages: 0,
        page_count: 2,
        applied_index: 0,
    };
    let mut metas = AlignedBuf::zeroed(2 * PAGE_SIZE);
    page::encode_meta(&meta, &mut metas[..PAGE_SIZE]);
    page::encode_meta(&meta, &mut metas[PAGE_SIZE..]);
    f.write_all_at(&[(0, &metas)])?;
    f.sync_data()?;
    drop(f);
    fs::rename(tmp, path).map_err(|e| Error::io("rename", tmp, e))?;
    sync_dir(dir)
}

/// The newest valid meta page.
fn read_meta(file: &DataFile) -> Result<Meta> {
    let path = file.path();
    let len = file.file.len()?;
    if len < 2 * PAGE_SIZE as u64 {
        return Err(Error::Invalid(format!(
            "{}: {len} bytes is too short for a metcd btree file",
            path.display()
        )));
    }
    let mut buf = AlignedBuf::zeroed(2 * PAGE_SIZE);
    file.file.read_at(&mut buf, 0)?;
    let slots = [
        page::decode_meta(&buf[..PAGE_SIZE]),
        page::decode_meta(&buf[PAGE_SIZE..]),
    ];
    let mut best: Option<Meta> = None;
    for slot in &slots {
        match slot {
            MetaSlot::Unsupported(why) => {
                return Err(Error::Invalid(format!("{}: {why}", path.display())))
            }
            MetaSlot::Valid(m) if best.is_none_or(|b| m.txn > b.txn) => best = Some(*m),
            _ => {}
        }
    }
    let Some(meta) = best else {
        if slots.iter().all(|s| matches!(s, MetaSlot::Foreign)) {
            return Err(Error::Invalid(format!(
                "{}: not a metcd btree file (bad magic)",
                path.display()
            )));
        }
        return Err(file.corrupt(
            "btree meta page",
            0,
            "neither meta page (offsets 0 and 4096) passes its checksum".into(),
        ));
    };
    let bad = |reason: String| file.corrupt("btree meta page", offset_of(meta.txn % 2), reason);
    if meta.page_count < 2 || meta.page_count > len / PAGE_SIZE as u64 {
        return Err(bad(format!(
            "page count {} but the file has {} pages",
            meta.page_count,
            len / PAGE_SIZE as u64
        )));
    }
    if meta.root != 0 && (meta.root < 2 || meta.root >= meta.page_count) {
        return Err(bad(format!("root page {} out of range", meta.root)));
    }
    if meta.freelist_pages > 0
        && (meta.freelist_page < 2
            || meta.freelist_page.saturating_add(meta.freelist_pages) > meta.page_count)
    {
        return Err(bad(format!(
            "free list page {} out of range",
            meta.freelist_page
        )));
    }
    Ok(meta)
}

fn read_freelist(file: &DataFile, meta: &Meta) -> Result<FreeRuns> {
    let mut free = FreeRuns::default();
    if meta.freelist_pages == 0 {
        return Ok(free);
    }
    let offset = offset_of(meta.freelist_page);
    let pages = usize::try_from(meta.freelist_pages)
        .map_err(|_| file.corrupt("btree free list", offset, "too long".into()))?;
    let mut buf = AlignedBuf::zeroed(pages * PAGE_SIZE);
    file.file.read_at(&mut buf, offset)?;
    let runs = page::decode_freelist(meta.freelist_page, &buf)
        .map_err(|r| file.corrupt("btree free list", offset, r))?;
    for (start, n) in runs {
        if start < 2 || start.saturating_add(n) > meta.page_count {
            return Err(file.corrupt(
                "btree free list",
                offset,
                format!(
                    "free run {start}+{n} outside the file's {} pages",
                    meta.page_count
                ),
            ));
        }
        free.insert(start, n)
            .map_err(|r| file.corrupt("btree free list", offset, r))?;
    }
    Ok(free)
}

/// A consistent view of the engine: the root at the time it was taken and
/// the file that root lives in.
pub struct BtreeSnapshot {
    root: Child,
    applied_index: u64,
    epoch: u64,
    file: Arc<DataFile>,
    inner: Arc<Inner>,
}

impl Drop for BtreeSnapshot {
    fn drop(&mut self) {
        let mut c = lock(&self.inner.current);
        if let Some(n) = c.held.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                c.held.remove(&self.epoch);
            }
        }
    }
}

impl EngineSnapshot for BtreeSnapshot {
    fn applied_index(&self) -> u64 {
        self.applied_index
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        tree::get(&self.file, &self.root, key)
    }

    /// At the first page not in the cache, the paths of every key from
    /// there on come in together ([`tree::prefetch_paths`]): a cold range
    /// of keys waits about one device round trip per level instead of one
    /// per leaf. Keys whose pages are all cached cost what `get` costs.
    /// Values stored out of line (over `INLINE_MAX` with their record) are
    /// still read one by one.
    fn get_ahead<K: AsRef<[u8]>>(&self, keys: &[K], now: usize) -> Result<Vec<Option<Bytes>>> {
        let now = now.min(keys.len());
        let mut values = Vec::with_capacity(now);
        let mut prefetched = false;
        for (i, key) in keys[..now].iter().enumerate() {
            let mut before_read = || {
                if !prefetched {
                    prefetched = true;
                    let ahead: Vec<&[u8]> = keys[i..].iter().map(AsRef::as_ref).collect();
                    tree::prefetch_paths(&self.file, &self.root, &ahead);
                }
            };
            let value = tree::lookup_or(&self.file, &self.root, key.as_ref(), &mut before_read)?;
            values.push(
                value
                    .map(|v| tree::value_bytes(&self.file, &v))
                    .transpose()?,
            );
        }
        Ok(values)
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, mut visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        tree::scan(&self.file, &self.root, start, end, &mut visit).map(|_| ())
    }
}

impl Engine for BtreeEngine {
    type Snapshot = BtreeSnapshot;

    fn write(&self, batch: WriteBatch) -> Result<()> {
        let inner = &*self.inner;
        inner.check_poisoned()?;
        for op in batch.ops() {
            let key = match op {
                BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
            };
            if key.len() > MAX_KEY_LEN {
                return Err(Error::Invalid(format!(
                    "btree: key of {} bytes exceeds the {MAX_KEY_LEN}-byte limit",
                    key.len()
                )));
            }
        }
        let mut w = lock(&inner.writer);
        let (mut root, epoch, file) = {
            let c = lock(&inner.current);
            (c.root.clone(), c.epoch, c.file.clone())
        };
        let applied = batch.applied_index();
        let mut ctx = WriteCtx {
            file: &file,
            epoch,
            freed: Vec::new(),
            touched: 0,
        };
        let mut ops = batch.into_ops().into_iter();
        let mut put_bytes = 0u64;
        loop {
            let chunk: Vec<BatchOp> = ops.by_ref().take(PREFETCH_OPS).collect();
            if chunk.is_empty() {
                break;
            }
            if chunk.len() > 1 {
                let keys: Vec<&[u8]> = chunk
                    .iter()
                    .map(|op| match op {
                        BatchOp::Put { key, .. } | BatchOp::Delete { key } => &key[..],
                    })
                    .collect();
                tree::prefetch_paths(&file, &root, &keys);
            }
            for op in chunk {
                match op {
                    BatchOp::Put { key, value } => {
                        put_bytes += (key.len() + value.len()) as u64 + PUT_OVERHEAD;
                        let value = if key.len() + value.len() <= INLINE_MAX {
                            Val::Inline(value)
                        } else {
                            Val::Big(Arc::new(BigVal::fresh(value, epoch)))
                        };
                        ctx.put(&mut root, key, value)?;
                    }
                    BatchOp::Delete { key } => {
                        ctx.delete(&mut root, &key)?;
                    }
                }
            }
        }
        {
            let mut c = lock(&inner.current);
            c.root = root;
            if let Some(a) = applied {
                c.applied_index = a;
            }
        }
        w.freed.append(&mut ctx.freed);
        w.touched += ctx.touched;
        inner
            .unpersisted_bytes
            .fetch_add(put_bytes, Ordering::Relaxed);
        Ok(())
    }

    fn snapshot(&self) -> BtreeSnapshot {
        let mut c = lock(&self.inner.current);
        let epoch = c.epoch;
        *c.held.entry(epoch).or_insert(0) += 1;
        BtreeSnapshot {
            root: c.root.clone(),
            applied_index: c.applied_index,
            epoch,
            file: c.file.clone(),
            inner: self.inner.clone(),
        }
    }

    fn applied_index(&self) -> u64 {
        lock(&self.inner.current).applied_index
    }

    fn durable_applied_index(&self) -> u64 {
        self.inner.durable_applied_index.load(Ordering::Acquire)
    }

    /// The file as of the last commit plus what was put since, including
    /// what a running commit is writing (an upper bound: overwrites and
    /// deletes free pages at the next commit).
    fn size(&self) -> EngineSize {
        let inner = &*self.inner;
        let pending = inner.unpersisted_bytes.load(Ordering::Relaxed)
            + inner.committing_bytes.load(Ordering::Relaxed);
        EngineSize {
            total_bytes: inner.committed_file_bytes.load(Ordering::Relaxed) + pending,
            in_use_bytes: inner.committed_in_use_bytes.load(Ordering::Relaxed) + pending,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn put(e: &BtreeEngine, k: &[u8], v: &[u8], index: u64) {
        let mut b = WriteBatch::new();
        b.put(Bytes::copy_from_slice(k), Bytes::copy_from_slice(v));
        b.set_applied_index(index);
        e.write(b).unwrap();
    }

    /// A format-1 leaf page (values next to keys) holding `keys`, each
    /// with the value "abc", sealed as page `id`.
    fn format_1_leaf(id: u64, keys: &[Vec<u8>]) -> Vec<u8> {
        let mut leaf = vec![0u8; PAGE_SIZE];
        leaf[4] = 1;
        leaf[6..8].copy_from_slice(&(keys.len() as u16).to_le_bytes());
        leaf[8..16].copy_from_slice(&id.to_le_bytes());
        let mut at = 16 + 2 * keys.len();
        for (i, k) in keys.iter().enumerate() {
            leaf[16 + 2 * i..18 + 2 * i].copy_from_slice(&(at as u16).to_le_bytes());
            let mut entry = (k.len() as u16).to_le_bytes().to_vec();
            entry.push(0);
            entry.extend_from_slice(&3u16.to_le_bytes());
            entry.extend_from_slice(k);
            entry.extend_from_slice(b"abc");
            leaf[at..at + entry.len()].copy_from_slice(&entry);
            at += entry.len();
        }
        assert!(at <= PAGE_SIZE);
        let crc = crc32c::crc32c(&leaf[4..]);
        leaf[0..4].copy_from_slice(&crc.to_le_bytes());
        leaf
    }

    /// Writes a version-1 data file of `pages` (page 2 on) rooted at page 2.
    fn write_format_1_file(dir: &Path, pages: &[Vec<u8>]) {
        let meta = Meta {
            txn: 9,
            root: 2,
            freelist_page: 0,
            freelist_pages: 0,
            page_count: 2 + pages.len() as u64,
            applied_index: 7,
        };
        let mut file = vec![0u8; 2 * PAGE_SIZE];
        for slot in file.chunks_mut(PAGE_SIZE) {
            page::encode_meta(&meta, slot);
            slot[8..12].copy_from_slice(&1u32.to_le_bytes());
            let crc = crc32c::crc32c(&slot[..64]);
            slot[64..68].copy_from_slice(&crc.to_le_bytes());
        }
        for p in pages {
            file.extend_from_slice(p);
        }
        std::fs::write(dir.join(DATA_FILE), &file).unwrap();
    }

    /// Leaves packed full by format 1 measure more than a page in format 2
    /// (2 bytes more per inline entry); deleting from one, as the root or
    /// under a branch, then committing must still work (the leaf splits)
    /// and keep every other key.
    #[test]
    fn packed_format_1_leaves_survive_deletes_and_commits() {
        // 226 entries of 2 + 5 + 8 + 3 bytes: 4,068 bytes in format 1,
        // 4,520 in format 2 (a page holds 4,080).
        let low: Vec<Vec<u8>> = (0..226).map(|i| format!("a{i:07}").into_bytes()).collect();
        let high: Vec<Vec<u8>> = (0..226).map(|i| format!("b{i:07}").into_bytes()).collect();
        let mut branch = vec![0u8; PAGE_SIZE];
        branch[4] = 2;
        branch[6..8].copy_from_slice(&2u16.to_le_bytes());
        branch[8..16].copy_from_slice(&2u64.to_le_bytes());
        let entries: [(u64, &[u8]); 2] = [(3, b""), (4, &high[0])];
        let mut at = 16 + 4;
        for (i, (child, key)) in entries.iter().enumerate() {
            branch[16 + 2 * i..18 + 2 * i].copy_from_slice(&(at as u16).to_le_bytes());
            branch[at..at + 8].copy_from_slice(&child.to_le_bytes());
            branch[at + 8..at + 10].copy_from_slice(&(key.len() as u16).to_le_bytes());
            branch[at + 10..at + 10 + key.len()].copy_from_slice(key);
            at += 10 + key.len();
        }
        let crc = crc32c::crc32c(&branch[4..]);
        branch[0..4].copy_from_slice(&crc.to_le_bytes());

        let layouts = [
            vec![format_1_leaf(2, &low)],
            vec![branch, format_1_leaf(3, &low), format_1_leaf(4, &high)],
        ];
        for pages in layouts {
            let dir = tempfile::tempdir().unwrap();
            drop(BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap());
            write_format_1_file(dir.path(), &pages);
            let all: Vec<&Vec<u8>> = low
                .iter()
                .chain(if pages.len() > 1 { &high[..] } else { &[] })
                .collect();
            let gone: Vec<&Vec<u8>> = all
                .iter()
                .copied()
                .filter(|k| k.ends_with(b"100"))
                .collect();
            let engine = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap();
            let mut b = WriteBatch::new();
            for k in &gone {
                assert_eq!(engine.get(k).unwrap().unwrap(), Bytes::from_static(b"abc"));
                b.delete(Bytes::copy_from_slice(k));
            }
            b.set_applied_index(8);
            engine.write(b).unwrap();
            assert_eq!(engine.persist().unwrap(), 8);
            drop(engine);
            let engine = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap();
            for k in &all {
                let got = engine.get(k).unwrap();
                if gone.contains(k) {
                    assert_eq!(got, None);
                } else {
                    assert_eq!(got.unwrap(), Bytes::from_static(b"abc"), "{k:?}");
                }
            }
        }
    }

    #[test]
    fn free_runs_coalesce_and_refuse_double_frees() {
        let mut f = FreeRuns::default();
        f.insert(5, 2).unwrap();
        f.insert(3, 2).unwrap();
        f.insert(7, 1).unwrap();
        assert_eq!(f.to_vec(), vec![(3, 5)]);
        assert!(f.insert(4, 1).is_err());
        assert!(f.insert(2, 2).is_err());
        assert_eq!(f.alloc(2), Some(3));
        assert_eq!(f.to_vec(), vec![(5, 3)]);
        f.remove_range(6, 1);
        assert_eq!(f.to_vec(), vec![(5, 1), (7, 1)]);
        assert_eq!(f.trim_tail(8), 7);
        assert_eq!(f.alloc(2), None);
    }

    #[test]
    fn coalesce_merges_adjacent_pages_only() {
        let page = |b: u8| AlignedBuf::from_slice(&[b; PAGE_SIZE]);
        let p = PAGE_SIZE as u64;
        let writes = vec![
            (5 * p, page(5)),
            (2 * p, page(2)),
            (3 * p, AlignedBuf::from_slice(&[3; 2 * PAGE_SIZE])),
            (9 * p, page(9)),
        ];
        let out = coalesce(writes);
        let shape: Vec<(u64, usize)> = out.iter().map(|(o, b)| (*o / p, b.len())).collect();
        assert_eq!(
            shape,
            vec![(2, 4 * PAGE_SIZE), (9, PAGE_SIZE)],
            "pages 2, 3-4 and 5 are one run"
        );
        let firsts: Vec<u8> = out[0].1.chunks(PAGE_SIZE).map(|c| c[0]).collect();
        assert_eq!(firsts, vec![2, 3, 3, 5]);
        // A run longer than the cap is cut.
        let n = COALESCE_MAX_BYTES / p + 3;
        let out = coalesce((0..n).map(|i| (i * p, page(1))).collect());
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].1.len() as u64, COALESCE_MAX_BYTES);
        assert_eq!(out[1].0, COALESCE_MAX_BYTES);
    }

    #[test]
    fn read_many_at_reads_every_page_and_reports_short_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = DirectFile::open(&path, true).unwrap();
        let pages: Vec<AlignedBuf> = (0..300u32)
            .map(|i| AlignedBuf::from_slice(&i.to_le_bytes()))
            .collect();
        let writes: Vec<(u64, &AlignedBuf)> = pages
            .iter()
            .enumerate()
            .map(|(i, b)| (offset_of(i as u64), b))
            .collect();
        f.write_all_at(&writes).unwrap();
        // More reads than the ring holds, in no particular order.
        let mut reads: Vec<(u64, AlignedBuf)> = (0..300u64)
            .rev()
            .map(|i| (offset_of(i), AlignedBuf::zeroed(PAGE_SIZE)))
            .collect();
        f.read_many_at(&mut reads).unwrap();
        for (offset, buf) in &reads {
            assert_eq!(buf[..4], ((offset / PAGE_SIZE as u64) as u32).to_le_bytes());
        }
        let mut past_end = vec![
            (offset_of(1), AlignedBuf::zeroed(PAGE_SIZE)),
            (offset_of(300), AlignedBuf::zeroed(PAGE_SIZE)),
        ];
        let err = f.read_many_at(&mut past_end).unwrap_err().to_string();
        assert!(err.contains(&offset_of(300).to_string()), "{err}");
    }

    #[test]
    fn writes_persist_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let e = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap();
        assert_eq!(e.durable_applied_index(), 0);
        for i in 0..2000u32 {
            put(
                &e,
                format!("key{i:05}").as_bytes(),
                &i.to_be_bytes(),
                u64::from(i) + 1,
            );
        }
        put(&e, b"big", &vec![7u8; 3 * PAGE_SIZE + 5], 2001);
        assert_eq!(e.persist().unwrap(), 2001);
        drop(e);
        let e = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap();
        assert_eq!(e.applied_index(), 2001);
        assert_eq!(e.durable_applied_index(), 2001);
        assert_eq!(
            e.get(b"key01234").unwrap().unwrap()[..],
            1234u32.to_be_bytes()
        );
        assert_eq!(e.get(b"big").unwrap().unwrap().len(), 3 * PAGE_SIZE + 5);
        let mut n = 0;
        e.snapshot()
            .scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
                n += 1;
                Scan::Continue
            })
            .unwrap();
        assert_eq!(n, 2001);
    }
}
