//! The engine a member runs, chosen at start (`--engine memory|btree|lsm`):
//! [`AnyEngine`] dispatches to one of them, and [`EngineDir`] owns the layout
//! of the engine's directory — which engine a data dir belongs to, where the
//! on-disk engines keep their files, and how a snapshot received from a
//! leader replaces them crash-safely.
//!
//! Layout of the engine directory:
//! - `ENGINE`: the engine's name. A data dir opened with another `--engine`
//!   is refused (switching engines means restoring a snapshot into a new
//!   member, not reinterpreting files).
//! - memory: `*.snap` checkpoint files (see [`crate::memory`]).
//! - btree, lsm: `db.current` names the live subdirectory `db-<n>`; a
//!   received snapshot is built into `db-<n+1>`, persisted, and only then
//!   does `db.current` switch to it (write tmp, fsync, rename, fsync dir), so
//!   a crash leaves either the old state or the new one, never a mix.
//!
//! It must never open a data dir with an engine other than the one recorded,
//! and never point `db.current` at a directory that is not fully persisted.

use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

use crate::btree::{BtreeEngine, BtreeSnapshot};
use crate::lsm::{LsmEngine, LsmSnapshot};
use crate::memory::MemorySnapshot;
use crate::snapfile;
use crate::{Engine, EngineSize, EngineSnapshot, Error, MemoryEngine, Result, Scan, WriteBatch};

const KIND_FILE: &str = "ENGINE";
const CURRENT_FILE: &str = "db.current";
const DB_PREFIX: &str = "db-";
/// Entries per write batch when loading a received snapshot into an
/// on-disk engine.
const INSTALL_BATCH: usize = 4096;
/// Bytes of keys and values loaded between two persists while installing.
const INSTALL_PERSIST_BYTES: usize = 64 << 20;

/// Serialises snapshot installs (rare; each is a background job).
static INSTALLS: Mutex<()> = Mutex::new(());

/// Which engine stores a member's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineKind {
    /// Skiplist in memory, checkpointed to snapshot files; the WAL makes
    /// writes between checkpoints durable.
    #[default]
    Memory,
    /// Copy-on-write B+tree file (boltdb/redb lineage): read-heavy work.
    Btree,
    /// Log-structured merge tree (leveldb lineage): write-heavy work.
    Lsm,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Memory => "memory",
            EngineKind::Btree => "btree",
            EngineKind::Lsm => "lsm",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "memory" => Ok(EngineKind::Memory),
            "btree" => Ok(EngineKind::Btree),
            "lsm" => Ok(EngineKind::Lsm),
            other => Err(format!(
                "unknown engine {other:?}: expected memory, btree or lsm"
            )),
        }
    }
}

/// An on-disk engine that persists itself (the Raft WAL covers what it has
/// not persisted yet).
trait DiskEngine: Engine + Clone + Send + Sync + Sized {
    fn open_dir(dir: &Path, cache_bytes: usize) -> Result<Self>;
    /// Blocking: writes and syncs everything applied so far.
    fn persist(&self) -> Result<u64>;
}

impl DiskEngine for BtreeEngine {
    fn open_dir(dir: &Path, cache_bytes: usize) -> Result<Self> {
        let options = crate::btree::BtreeOptions {
            cache_bytes,
            ..Default::default()
        };
        BtreeEngine::open(dir, options)
    }
    fn persist(&self) -> Result<u64> {
        BtreeEngine::persist(self)
    }
}

impl DiskEngine for LsmEngine {
    fn open_dir(dir: &Path, cache_bytes: usize) -> Result<Self> {
        let options = crate::lsm::LsmOptions {
            block_cache_bytes: cache_bytes,
            ..Default::default()
        };
        LsmEngine::open(dir, options)
    }
    fn persist(&self) -> Result<u64> {
        LsmEngine::persist(self)
    }
}

/// One of the engines, chosen at start.
#[derive(Clone)]
pub enum AnyEngine {
    Memory(MemoryEngine),
    Btree(BtreeEngine),
    Lsm(LsmEngine),
}

/// A snapshot of whichever engine runs.
pub enum AnySnapshot {
    Memory(MemorySnapshot),
    Btree(BtreeSnapshot),
    Lsm(LsmSnapshot),
}

macro_rules! dispatch {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            AnyEngine::Memory($name) => $body,
            AnyEngine::Btree($name) => $body,
            AnyEngine::Lsm($name) => $body,
        }
    };
}

macro_rules! dispatch_snapshot {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            AnySnapshot::Memory($name) => $body,
            AnySnapshot::Btree($name) => $body,
            AnySnapshot::Lsm($name) => $body,
        }
    };
}

impl EngineSnapshot for AnySnapshot {
    fn applied_index(&self) -> u64 {
        dispatch_snapshot!(self, s => s.applied_index())
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        dispatch_snapshot!(self, s => s.get(key))
    }

    fn get_ahead<K: AsRef<[u8]>>(&self, keys: &[K], now: usize) -> Result<Vec<Option<Bytes>>> {
        dispatch_snapshot!(self, s => s.get_ahead(keys, now))
    }

    fn scan<F>(&self, start: Bound<&[u8]>, end: Bound<&[u8]>, visit: F) -> Result<()>
    where
        F: FnMut(&[u8], &Bytes) -> Scan,
    {
        dispatch_snapshot!(self, s => s.scan(start, end, visit))
    }
}

impl Engine for AnyEngine {
    type Snapshot = AnySnapshot;

    fn write(&self, batch: WriteBatch) -> Result<()> {
        dispatch!(self, e => e.write(batch))
    }

    fn snapshot(&self) -> AnySnapshot {
        match self {
            AnyEngine::Memory(e) => AnySnapshot::Memory(e.snapshot()),
            AnyEngine::Btree(e) => AnySnapshot::Btree(e.snapshot()),
            AnyEngine::Lsm(e) => AnySnapshot::Lsm(e.snapshot()),
        }
    }

    fn applied_index(&self) -> u64 {
        dispatch!(self, e => e.applied_index())
    }

    fn durable_applied_index(&self) -> u64 {
        dispatch!(self, e => e.durable_applied_index())
    }

    fn size(&self) -> EngineSize {
        dispatch!(self, e => Engine::size(e))
    }

    fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        dispatch!(self, e => e.get(key))
    }
}

impl AnyEngine {
    /// Whether the next checkpoint rewrites the whole store (a full one of
    /// the memory engine) rather than only what changed since the last (the
    /// memory engine's deltas, and every btree or lsm checkpoint).
    pub fn checkpoint_rewrites_store(&self) -> bool {
        match self {
            AnyEngine::Memory(e) => e.next_checkpoint_rewrites_store(),
            _ => false,
        }
    }

    /// What the engine's block cache holds (the memory engine has none).
    pub fn cache_usage(&self) -> crate::io::CacheUsage {
        match self {
            AnyEngine::Memory(_) => crate::io::CacheUsage::default(),
            AnyEngine::Btree(e) => e.cache_usage(),
            AnyEngine::Lsm(e) => e.cache_usage(),
        }
    }

    pub fn kind(&self) -> EngineKind {
        match self {
            AnyEngine::Memory(_) => EngineKind::Memory,
            AnyEngine::Btree(_) => EngineKind::Btree,
            AnyEngine::Lsm(_) => EngineKind::Lsm,
        }
    }
}

/// The engine directory of one member and the engine recorded in it.
#[derive(Debug, Clone)]
pub struct EngineDir {
    dir: PathBuf,
    kind: EngineKind,
    /// Block cache of the btree and lsm engines.
    cache_bytes: usize,
}

/// The btree/lsm block cache unless configured (`--engine-cache-bytes`):
/// a quarter of physical memory, between 64 MiB and 1 GiB. It plays the
/// part the OS page cache plays for bbolt's mmap (etcd) or redb's buffered
/// reads, which our O_DIRECT engines bypass; it fills only as blocks are
/// read, so a small store never uses it all. 1 GiB holds etcd's default
/// 2 GiB quota's usual working set and matches redb's own default cache.
pub fn default_cache_bytes() -> usize {
    const FLOOR: u64 = 64 << 20;
    const CEILING: u64 = 1 << 30;
    // SAFETY: sysconf only reads system constants.
    let (pages, page_size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let memory = u64::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(u64::try_from(page_size).unwrap_or(0));
    usize::try_from((memory / 4).clamp(FLOOR, CEILING)).unwrap_or(FLOOR as usize)
}

impl EngineDir {
    /// Opens `dir` for `kind`: a new directory records `kind`; one that
    /// records another engine is refused. A directory from before engines
    /// were recorded holds memory-engine snapshot files.
    pub fn open(dir: &Path, kind: EngineKind) -> Result<EngineDir> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create engine dir", dir, e))?;
        let kind_path = dir.join(KIND_FILE);
        match std::fs::read_to_string(&kind_path) {
            Ok(text) => {
                let recorded: EngineKind = text
                    .trim()
                    .parse()
                    .map_err(|e: String| Error::Invalid(format!("{}: {e}", kind_path.display())))?;
                if recorded != kind {
                    return Err(Error::Invalid(format!(
                        "the data dir was created with --engine {recorded} ({}), but --engine is {kind}; \
                         start with --engine {recorded}, or restore a snapshot into a new \
                         data dir to change engines",
                        kind_path.display()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let legacy_memory = list_names(dir)?.iter().any(|n| n.ends_with(".snap"));
                if legacy_memory && kind != EngineKind::Memory {
                    return Err(Error::Invalid(format!(
                        "the data dir holds memory-engine snapshots ({}), but --engine is \
                         {kind}; start with --engine memory",
                        dir.display()
                    )));
                }
                write_durably(dir, KIND_FILE, format!("{kind}\n").as_bytes())?;
            }
            Err(e) => return Err(Error::io("read", &kind_path, e)),
        }
        Ok(EngineDir {
            dir: dir.to_path_buf(),
            kind,
            cache_bytes: default_cache_bytes(),
        })
    }

    /// Sizes the block cache of the btree and lsm engines (they read with
    /// O_DIRECT, so this cache is all the memory their reads get).
    pub fn with_cache_bytes(mut self, cache_bytes: usize) -> EngineDir {
        self.cache_bytes = cache_bytes;
        self
    }

    pub fn kind(&self) -> EngineKind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Opens the engine with the state of its last checkpoint.
    pub fn open_engine(&self) -> Result<AnyEngine> {
        match self.kind {
            EngineKind::Memory => Ok(AnyEngine::Memory(MemoryEngine::open(&self.dir)?)),
            EngineKind::Btree => Ok(AnyEngine::Btree(self.open_disk()?)),
            EngineKind::Lsm => Ok(AnyEngine::Lsm(self.open_disk()?)),
        }
    }

    /// Makes `engine`'s applied state durable so the WAL before it can be
    /// released; returns the applied index made durable. Runs off the
    /// caller's core (serialising or syncing takes milliseconds to seconds);
    /// the engine keeps accepting writes meanwhile.
    pub async fn checkpoint(&self, engine: &AnyEngine) -> Result<u64> {
        match engine {
            AnyEngine::Memory(e) => e.checkpoint(&self.dir).await,
            // Not `Background`: a persist takes locks the write path also
            // takes (the btree evicts under its writer lock), and a starved
            // holder would stall the shard behind it.
            AnyEngine::Btree(e) => off_core(e.clone(), Urgency::Waited, |e| e.persist()).await,
            AnyEngine::Lsm(e) => off_core(e.clone(), Urgency::Waited, |e| e.persist()).await,
        }
    }

    /// Rewrites the engine's files compactly (the Maintenance Defragment
    /// RPC): the btree file shrinks to its live pages, the lsm engine
    /// flushes and merges every level into its deepest (dropping deleted
    /// and overwritten data no snapshot sees). The memory engine has
    /// nothing to rewrite. Returns (bytes before, after).
    pub async fn defragment(&self, engine: &AnyEngine) -> Result<(u64, u64)> {
        match engine {
            AnyEngine::Btree(e) => {
                let report = off_core(e.clone(), Urgency::Waited, |e| e.defragment()).await?;
                Ok((report.bytes_before, report.bytes_after))
            }
            AnyEngine::Lsm(e) => {
                let before = Engine::size(e).total_bytes;
                off_core(e.clone(), Urgency::Waited, |e| e.compact_all()).await?;
                Ok((before, Engine::size(e).total_bytes))
            }
            AnyEngine::Memory(_) => Ok((0, 0)),
        }
    }

    /// Replaces the engine's state by the snapshot file `file` (from a
    /// leader), durably; returns the engine holding exactly that state.
    /// The engine in use before is left untouched in memory; the caller
    /// swaps it out.
    pub async fn install_snapshot_file(&self, file: &Path) -> Result<AnyEngine> {
        match self.kind {
            EngineKind::Memory => Ok(AnyEngine::Memory(
                MemoryEngine::install_snapshot_file(&self.dir, file).await?,
            )),
            EngineKind::Btree => {
                let this = self.clone();
                let file = file.to_path_buf();
                Ok(AnyEngine::Btree(
                    off_core((), Urgency::Waited, move |_| this.install_disk(&file)).await?,
                ))
            }
            EngineKind::Lsm => {
                let this = self.clone();
                let file = file.to_path_buf();
                Ok(AnyEngine::Lsm(
                    off_core((), Urgency::Waited, move |_| this.install_disk(&file)).await?,
                ))
            }
        }
    }

    fn current_db(&self) -> Result<Option<(u64, PathBuf)>> {
        let path = self.dir.join(CURRENT_FILE);
        match std::fs::read_to_string(&path) {
            Ok(name) => {
                let name = name.trim();
                let n = name
                    .strip_prefix(DB_PREFIX)
                    .and_then(|n| u64::from_str_radix(n, 16).ok())
                    .ok_or_else(|| Error::Corrupt {
                        what: "engine pointer",
                        path: path.clone(),
                        offset: 0,
                        reason: format!("{name:?} names no {DB_PREFIX}<n> directory"),
                    })?;
                Ok(Some((n, self.dir.join(name))))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("read", &path, e)),
        }
    }

    fn db_name(n: u64) -> String {
        format!("{DB_PREFIX}{n:016x}")
    }

    fn open_disk<E: DiskEngine>(&self) -> Result<E> {
        let (n, db) = match self.current_db()? {
            Some(current) => current,
            None => {
                let name = Self::db_name(1);
                let db = self.dir.join(&name);
                // A leftover from a crash before the pointer was written
                // holds nothing acknowledged: start clean.
                remove_dir_if_present(&db)?;
                std::fs::create_dir_all(&db).map_err(|e| Error::io("create", &db, e))?;
                write_durably(&self.dir, CURRENT_FILE, name.as_bytes())?;
                (1, db)
            }
        };
        // Directories of interrupted or superseded installs.
        self.remove_dbs_except(n)?;
        E::open_dir(&db, self.cache_bytes)
    }

    fn install_disk<E: DiskEngine>(&self, file: &Path) -> Result<E> {
        // One install at a time per directory: two would build the same
        // db-<n+1>.
        let _installing = INSTALLS.lock().unwrap_or_else(PoisonError::into_inner);
        let n = self.current_db()?.map_or(1, |(n, _)| n + 1);
        let name = Self::db_name(n);
        let db = self.dir.join(&name);
        remove_dir_if_present(&db)?;
        std::fs::create_dir_all(&db).map_err(|e| Error::io("create", &db, e))?;
        crate::io::sync_dir(&self.dir)?;
        let engine = E::open_dir(&db, self.cache_bytes)?;
        // Streamed in batches, persisted every INSTALL_PERSIST_BYTES so the
        // engine's unpersisted state stays bounded whatever the snapshot's
        // size; db.current still names the old db until the end, so a
        // crash or a bad file leaves the old state in place.
        let mut batch = WriteBatch::with_capacity(INSTALL_BATCH);
        let mut unpersisted = 0usize;
        let applied = snapfile::read_with(file, |key, value| {
            unpersisted += key.len() + value.len();
            batch.put(key, value);
            if batch.len() >= INSTALL_BATCH {
                engine.write(std::mem::replace(
                    &mut batch,
                    WriteBatch::with_capacity(INSTALL_BATCH),
                ))?;
            }
            if unpersisted >= INSTALL_PERSIST_BYTES {
                engine.persist()?;
                unpersisted = 0;
            }
            Ok(())
        });
        let applied = match applied {
            Ok(applied) => applied,
            Err(e) => {
                drop(engine);
                let _ = remove_dir_if_present(&db);
                return Err(e);
            }
        };
        batch.set_applied_index(applied);
        engine.write(batch)?;
        engine.persist()?;
        write_durably(&self.dir, CURRENT_FILE, name.as_bytes())?;
        let _ = std::fs::remove_file(file);
        // The engine being replaced may still serve snapshots; its files
        // (the other db-* directories) go at the next open.
        Ok(engine)
    }

    fn remove_dbs_except(&self, keep: u64) -> Result<()> {
        for name in list_names(&self.dir)? {
            let Some(n) = name
                .strip_prefix(DB_PREFIX)
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                continue;
            };
            if n != keep {
                remove_dir_if_present(&self.dir.join(&name))?;
            }
        }
        Ok(())
    }
}

/// How the kernel should weigh an engine worker thread against the
/// shards' threads when the cores are busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Urgency {
    /// Someone waits for the result (a defragmentation, a snapshot install,
    /// a backup): ordinary priority.
    Waited,
    /// A periodic checkpoint nobody waits for and that holds no lock the
    /// shards need (the memory engine's: it serialises a snapshot): the
    /// lowest CPU priority (nice 19), so on a machine whose cores are all
    /// busy serving it takes only what the shards leave instead of stalling
    /// them. On idle cores it runs at full speed. Its caller may raise it
    /// back to ordinary priority once the work has fallen behind
    /// ([`hurry_background_work`]).
    Background,
}

/// The threads doing [`Urgency::Background`] work now, the nice value they
/// were started from, and whether that work was hurried.
struct BackgroundThreads {
    tids: Vec<libc::pid_t>,
    normal_nice: i32,
    hurried: bool,
}

static BACKGROUND_THREADS: Mutex<BackgroundThreads> = Mutex::new(BackgroundThreads {
    tids: Vec::new(),
    normal_nice: 0,
    hurried: false,
});

fn background_threads() -> std::sync::MutexGuard<'static, BackgroundThreads> {
    // The registry holds no invariant a panic could break halfway.
    BACKGROUND_THREADS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// The calling thread, registered as doing background work for as long as
/// this lives: at nice 19, or at the priority it came from once the work
/// is hurried (a thread registered after that starts hurried).
pub(crate) struct BackgroundThread {
    tid: libc::pid_t,
}

impl BackgroundThread {
    pub(crate) fn enter() -> BackgroundThread {
        let tid = own_tid();
        let mut threads = background_threads();
        if threads.tids.is_empty() {
            // The first thread of a job inherited its starter's priority
            // (a shard's): what hurried work goes back to.
            threads.normal_nice = nice_of(tid).unwrap_or(0);
            threads.hurried = false;
        }
        threads.tids.push(tid);
        let nice = if threads.hurried {
            threads.normal_nice
        } else {
            LOWEST_PRIORITY
        };
        // Under the lock: a hurry between the choice and the change would
        // be undone. Best effort: a thread left at its priority only
        // competes harder with the shards (or, hurried, keeps lagging).
        let _ = set_nice(tid, nice);
        drop(threads);
        BackgroundThread { tid }
    }
}

impl Drop for BackgroundThread {
    fn drop(&mut self) {
        let mut threads = background_threads();
        threads.tids.retain(|&tid| tid != self.tid);
    }
}

/// Raises every thread doing [`Urgency::Background`] work now (and any
/// that joins the same work later) back to the priority its work was
/// started from: for a checkpoint that has fallen so far behind that the
/// log a restart would replay keeps growing faster than it writes. Returns
/// how many threads were raised; an error when the process may not raise
/// priorities (neither root nor `CAP_SYS_NICE`, nor an `RLIMIT_NICE` that
/// allows it).
pub fn hurry_background_work() -> std::io::Result<usize> {
    let mut threads = background_threads();
    threads.hurried = !threads.tids.is_empty();
    let nice = threads.normal_nice;
    // Every thread is tried, whatever one of them answers.
    let mut refused = None;
    for &tid in &threads.tids {
        if let Err(e) = set_nice(tid, nice) {
            refused.get_or_insert(e);
        }
    }
    match refused {
        Some(e) => Err(e),
        None => Ok(threads.tids.len()),
    }
}

const LOWEST_PRIORITY: i32 = 19;

/// Blocks the calling background thread until it runs above the lowest
/// priority (it was hurried), for at most `bound`: the failpoint that makes
/// a checkpoint starve in tests.
pub(crate) fn wait_until_hurried(bound: std::time::Duration) {
    let deadline = std::time::Instant::now() + bound;
    while nice_of(own_tid()).is_ok_and(|nice| nice >= LOWEST_PRIORITY)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn own_tid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Thread `tid`'s nice value.
fn nice_of(tid: libc::pid_t) -> std::io::Result<i32> {
    // SAFETY: integer-only syscalls; errno is cleared first because -1 is
    // also a valid priority.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        if *libc::__errno_location() != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(nice)
    }
}

/// Sets thread `tid`'s nice value (on Linux, `PRIO_PROCESS` with a thread
/// id changes that thread alone).
fn set_nice(tid: libc::pid_t, nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority only reads its integer arguments.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs blocking engine work (a btree/lsm persist, a defragmentation, a
/// memory checkpoint's executor) on a thread of its own, awaited through a
/// channel. Not on the executor's blocking pool: that pool has one thread,
/// which also runs glommio's renames, removes and truncates for the core,
/// and a WAL segment roll would wait for the whole persist. These calls
/// are rare (once per checkpoint), so a thread each costs nothing that
/// matters. Threads the work starts (an executor) inherit its priority;
/// to be hurried with it, they register ([`BackgroundThread::enter`]).
pub(crate) async fn off_core<T, R, F>(value: T, urgency: Urgency, f: F) -> Result<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: FnOnce(T) -> Result<R> + Send + 'static,
{
    let (done, answer) = futures_channel::oneshot::channel();
    std::thread::Builder::new()
        .name("metcd-engine-io".to_owned())
        .spawn(move || {
            let result = {
                // Unregistered before the answer goes: the caller's next
                // job must find this one gone (and start at nice 19).
                let _background = (urgency == Urgency::Background).then(BackgroundThread::enter);
                f(value)
            };
            let _ = done.send(result);
        })
        .map_err(|source| Error::Io {
            op: "start a thread for",
            path: "engine work".into(),
            source,
        })?;
    answer.await.map_err(|_| {
        Error::Invalid("the engine's worker thread stopped without an answer".to_owned())
    })?
}

fn list_names(dir: &Path) -> Result<Vec<String>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("read dir", dir, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("read dir", dir, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

fn remove_dir_if_present(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", dir, e)),
    }
}

/// Writes `dir/name` so that after a crash it holds either its old content
/// or `data`: tmp file, fsync, rename, fsync of the directory.
fn write_durably(dir: &Path, name: &str, data: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
    f.write_all(data).map_err(|e| Error::io("write", &tmp, e))?;
    f.sync_all().map_err(|e| Error::io("fsync", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e))?;
    crate::io::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The calling thread's nice value.
    fn own_nice() -> i32 {
        // SAFETY: integer-only syscalls; errno is cleared first because -1
        // is also a valid priority.
        unsafe {
            *libc::__errno_location() = 0;
            let nice = libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t);
            assert_eq!(*libc::__errno_location(), 0, "getpriority failed");
            nice
        }
    }

    /// Held by the tests that read priorities: the registry of background
    /// threads is the process's.
    static PRIORITY_TESTS: Mutex<()> = Mutex::new(());

    #[test]
    fn background_work_yields_the_cpu_and_waited_work_does_not() {
        let _serial = PRIORITY_TESTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let caller = own_nice();
        let (waited, background, started_by_background) =
            glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .io_memory(1 << 20)
                .spawn(|| async {
                    let waited = off_core((), Urgency::Waited, |()| Ok(own_nice()))
                        .await
                        .unwrap();
                    let background = off_core((), Urgency::Background, |()| Ok(own_nice()))
                        .await
                        .unwrap();
                    // A memory checkpoint starts an executor thread from the
                    // worker: it must inherit the priority.
                    let started = off_core((), Urgency::Background, |()| {
                        Ok(std::thread::spawn(own_nice).join().unwrap())
                    })
                    .await
                    .unwrap();
                    (waited, background, started)
                })
                .unwrap()
                .join()
                .unwrap();
        assert_eq!(waited, caller);
        assert_eq!(background, 19);
        assert_eq!(started_by_background, 19);
        assert_eq!(own_nice(), caller, "the caller's own priority is untouched");
    }

    #[test]
    fn hurried_background_work_goes_back_to_its_starters_priority() {
        let _serial = PRIORITY_TESTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let caller = own_nice();
        let (hurried, niced, raised, joined_later, next_job) =
            glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
                .io_memory(1 << 20)
                .spawn(move || async move {
                    let (started, started_rx) = futures_channel::oneshot::channel();
                    let (go_on, go_on_rx) = std::sync::mpsc::channel::<()>();
                    let work = glommio::spawn_local(off_core((), Urgency::Background, move |()| {
                        // An executor thread the job started, registered.
                        let (helper_go_on, helper_go_on_rx) = std::sync::mpsc::channel::<()>();
                        let helper = std::thread::spawn(move || {
                            let _registered = BackgroundThread::enter();
                            helper_go_on_rx.recv().unwrap();
                            own_nice()
                        });
                        let niced = own_nice();
                        started.send(()).unwrap();
                        go_on_rx.recv().unwrap();
                        let raised = own_nice();
                        helper_go_on.send(()).unwrap();
                        let helper_raised = helper.join().unwrap();
                        let joined_later = std::thread::spawn(|| {
                            let _registered = BackgroundThread::enter();
                            own_nice()
                        })
                        .join()
                        .unwrap();
                        Ok((niced, (raised, helper_raised), joined_later))
                    }));
                    started_rx.await.unwrap();
                    // Wait until the helper has registered too.
                    while background_threads().tids.len() < 2 {
                        glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    // Raising a priority needs root or CAP_SYS_NICE (CI
                    // and the scripts run as root).
                    let hurried = hurry_background_work().unwrap();
                    go_on.send(()).unwrap();
                    let (niced, raised, joined_later) = work.await.unwrap();
                    // A later job starts at the lowest priority again.
                    let next_job = off_core((), Urgency::Background, |()| Ok(own_nice()))
                        .await
                        .unwrap();
                    (hurried, niced, raised, joined_later, next_job)
                })
                .unwrap()
                .join()
                .unwrap();
        assert_eq!(niced, 19);
        assert_eq!(hurried, 2, "the worker and the thread it started");
        assert_eq!(
            raised,
            (caller, caller),
            "both threads are back at the caller's priority"
        );
        assert_eq!(
            joined_later, caller,
            "a thread joining hurried work starts hurried"
        );
        assert_eq!(next_job, 19);
        assert!(background_threads().tids.is_empty());
    }

    /// A snapshot file in `snapfile`'s layout, written by hand so the test
    /// needs no runtime.
    fn snapshot_file(path: &Path, applied: u64, n: u32, break_crc: bool) {
        let mut out = Vec::new();
        out.extend_from_slice(snapfile::MAGIC);
        out.extend_from_slice(&snapfile::FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&applied.to_le_bytes());
        for i in 0..n {
            let (k, v) = (format!("k{i:06}"), format!("v{i}"));
            out.extend_from_slice(&(k.len() as u32).to_le_bytes());
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        out.extend_from_slice(&u64::from(n).to_le_bytes());
        let crc = crc32c::crc32c(&out) ^ u32::from(break_crc);
        out.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(path, out).unwrap();
    }

    fn count(engine: &AnyEngine) -> usize {
        let mut n = 0;
        engine
            .snapshot()
            .scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
                n += 1;
                Scan::Continue
            })
            .unwrap();
        n
    }

    #[test]
    fn installs_switch_only_after_a_verified_persisted_copy() {
        for kind in [EngineKind::Btree, EngineKind::Lsm] {
            let tmp = tempfile::tempdir().unwrap();
            let dir = EngineDir::open(tmp.path(), kind).unwrap();
            let first = tmp.path().join("first.snapshot");
            snapshot_file(&first, 40, 10_000, false);
            let installed = match kind {
                EngineKind::Btree => AnyEngine::Btree(dir.install_disk(&first).unwrap()),
                _ => AnyEngine::Lsm(dir.install_disk(&first).unwrap()),
            };
            assert_eq!(installed.applied_index(), 40);
            assert_eq!(count(&installed), 10_000);
            assert_eq!(
                installed.get(b"k004321").unwrap().as_deref(),
                Some(&b"v4321"[..])
            );
            drop(installed);

            // A damaged file: an error, and the previous state stays.
            let bad = tmp.path().join("bad.snapshot");
            snapshot_file(&bad, 90, 500, true);
            let err = match kind {
                EngineKind::Btree => dir.install_disk::<BtreeEngine>(&bad).map(|_| ()),
                _ => dir.install_disk::<LsmEngine>(&bad).map(|_| ()),
            }
            .unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "{err}");
            let reopened = EngineDir::open(tmp.path(), kind)
                .unwrap()
                .open_engine()
                .unwrap();
            assert_eq!(reopened.applied_index(), 40);
            assert_eq!(count(&reopened), 10_000);
            let dbs = list_names(tmp.path())
                .unwrap()
                .into_iter()
                .filter(|n| n.starts_with(DB_PREFIX))
                .count();
            assert_eq!(dbs, 1, "the failed install's directory is gone");
        }
    }

    #[test]
    fn a_dir_keeps_its_engine() {
        let tmp = tempfile::tempdir().unwrap();
        EngineDir::open(tmp.path(), EngineKind::Lsm).unwrap();
        let err = EngineDir::open(tmp.path(), EngineKind::Btree).unwrap_err();
        assert!(
            err.to_string().contains("created with --engine lsm"),
            "{err}"
        );
        assert!(EngineDir::open(tmp.path(), EngineKind::Lsm).is_ok());
        assert_eq!("btree".parse::<EngineKind>(), Ok(EngineKind::Btree));
        assert!("rocks".parse::<EngineKind>().is_err());
    }
}
