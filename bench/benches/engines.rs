//! Storage-engine shoot-out: metcd's engines (`memory`, `btree`, `lsm`)
//! next to `redb` (copy-on-write B+tree) and `fjall` (LSM),
//! in one process, one engine after the other, on the same disk.
//!
//! ```sh
//! cargo bench -p bench --bench engines -- [--keys N] [--value-bytes 256] \
//!     [--engines memory,btree,lsm,redb,fjall] [--dir PATH] [--output text|json]
//! ```
//!
//! Phases, per engine: sequential fill (fresh store), random fill (another
//! fresh store, every key once in a seeded random order), then on the
//! random-filled store: random point reads, 100-key range scans, a 90/10
//! read/write mix and a 10/90 read/write mix. Each phase reports ops/s and
//! p99 latency; each write phase its write amplification; each store its
//! size on disk.
//!
//! # Fairness rules
//!
//! - Same data: keys are `k` + 15-digit zero-padded index (16 bytes, byte
//!   order = numeric order), values are `--value-bytes` of seeded xorshift
//!   output (incompressible, so compressing engines gain nothing), a pure
//!   function of (key index, version). Every engine gets the same keys,
//!   values and operation sequence.
//! - Same batching: a fill writes batches of 1000 keys, each one atomic
//!   write batch / transaction. Mix writes are single-op batches.
//! - Same durability point: in fills, every 10th batch (and the last one)
//!   is made durable before the call returns; in the mixes, a durable sync
//!   every 1000 operations (reads included) and at the end
//!   (`--fill-sync-batches`, `--mix-sync-ops`; 100 and 100,000 model
//!   metcd's use, where the Raft WAL is the log and engines persist every
//!   `--snapshot-count` entries). "Durable" is:
//!   metcd's `btree`/`lsm`: `persist()` (checked to return the applied
//!   index of the last batch); `redb`: the transaction is committed with
//!   `Durability::Immediate` (all others with `Durability::None`; a sync
//!   with nothing to write is an empty `Immediate` commit); `fjall`:
//!   `Database::persist(PersistMode::SyncData)` after the batch commit
//!   (fjall's default batch durability, `PersistMode::Buffer`, is kept for
//!   the other batches). The `memory` engine has no persist: it is a
//!   reference for the in-memory ceiling and skips every sync.
//! - Same reads: each read phase takes a fresh snapshot (our engines:
//!   `snapshot()`; redb: a read transaction; fjall: `Database::snapshot()`)
//!   every 1000 operations, and every read is checked (the key must be there
//!   with a value of the right length; a scan must return 100 keys or up to
//!   the end of the key space), so an engine cannot win by skipping work.
//! - Same cache budget: `--cache-mib` (64 by default) of block/page cache
//!   for every engine that has one. redb and fjall do buffered I/O, so the
//!   OS page cache also serves their reads whatever the budget; metcd's
//!   on-disk engines use O_DIRECT and only their own cache. A budget that
//!   holds the data (`--cache-mib 1024` for 1M keys) compares the engines
//!   with everything in memory, as the page cache gives redb and fjall.
//! - Same allocator: mimalloc with metcd's settings (`server::alloc`).
//! - Timing: fills time each batch (including its sync, if any), every
//!   other phase times each operation (including the snapshot refresh or
//!   sync the operation triggers). ops/s = operations / sum of the timed
//!   intervals (key and value generation are outside them); p99 comes from
//!   an HDR histogram of those intervals.
//! - Write amplification: `write_bytes - cancelled_write_bytes` of
//!   `/proc/self/io` (bytes this process, background threads included, sent
//!   to the block layer) around a phase, divided by the key + value bytes
//!   the phase wrote. Background work that outlives a phase is counted in
//!   the "whole store" row, measured from open to after close.
//! - Read/mix phases stop at their operation count or after
//!   `--max-phase-secs`, whichever comes first; fills always complete.

/// Every engine runs on metcd's allocator, tuned as the server tunes it
/// (`server::alloc`). With glibc's malloc, a flush thread freeing a
/// memtable while the writer allocates contends on the arena lock.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../src/engine_bench.rs"]
mod engine_bench;

use std::error::Error;
use std::fmt::Write as _;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use engine::btree::{BtreeEngine, BtreeOptions};
use engine::lsm::{LsmEngine, LsmOptions};
use engine::{Engine, EngineSnapshot, MemoryEngine, Scan, WriteBatch};
use engine_bench::{dir_bytes, key, permutation, value, write_amplification, IoCounters, Rng};
use hdrhistogram::Histogram;
use redb::ReadableDatabase;

type Res<T> = Result<T, Box<dyn Error>>;

/// Keys per fill batch (one atomic batch / transaction each).
const FILL_BATCH: usize = 1000;
/// Read and mix phases refresh their snapshot and (mixes) sync this often.
const OPS_PER_SNAPSHOT: u64 = 1000;
const SCAN_LEN: usize = 100;

#[derive(Parser, Debug)]
#[command(about = "metcd storage engines vs redb and fjall")]
struct Args {
    /// Keys in each store (both fills write every key once).
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    #[arg(long, default_value_t = 256)]
    value_bytes: usize,
    /// Comma-separated: memory, btree, lsm, redb, fjall.
    #[arg(long, default_value = "memory,btree,lsm,redb,fjall")]
    engines: String,
    /// Parent directory for the stores (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// text (a markdown table) or json.
    #[arg(long, default_value = "text")]
    output: String,
    /// Random point reads.
    #[arg(long, default_value_t = 200_000)]
    reads: u64,
    /// 100-key range scans.
    #[arg(long, default_value_t = 20_000)]
    scans: u64,
    /// Operations in each read/write mix.
    #[arg(long, default_value_t = 200_000)]
    mix_ops: u64,
    /// Upper bound on each read or mix phase.
    #[arg(long, default_value_t = 60)]
    max_phase_secs: u64,
    /// Block/page cache of every engine that has one (btree, lsm, redb,
    /// fjall), in MiB. redb and fjall also read through the OS page cache,
    /// which holds their files whatever this says; metcd's engines use
    /// O_DIRECT and only this.
    #[arg(long, default_value_t = 64)]
    cache_mib: usize,
    /// A fill makes every this many batches durable (and its last one).
    #[arg(long, default_value_t = 10)]
    fill_sync_batches: usize,
    /// A mix makes its writes durable every this many operations. With
    /// `--fill-sync-batches 100 --mix-sync-ops 100000` the engines are used
    /// as metcd uses them: the Raft WAL makes each write durable and the
    /// engine persists every --snapshot-count (100,000) entries.
    #[arg(long, default_value_t = 1000)]
    mix_sync_ops: u64,
    /// Passed by `cargo bench` to harness-less benchmarks; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// What a read returns: enough of the value to check it without copying
/// it out of a zero-copy store (redb's guard, fjall's slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Digest {
    len: usize,
    head: [u8; 8],
}

impl Digest {
    fn of(value: &[u8]) -> Digest {
        let mut head = [0; 8];
        let n = value.len().min(8);
        head[..n].copy_from_slice(&value[..n]);
        Digest {
            len: value.len(),
            head,
        }
    }
}

/// What the phases need from a store. Every method returns only after the
/// store did the work (no deferred reads), so timings are comparable.
trait BenchStore {
    /// Writes `kvs` as one atomic batch; durable on return if `sync`.
    fn write(&mut self, kvs: &[(Bytes, Bytes)], sync: bool) -> Res<()>;
    /// Makes everything written so far durable.
    fn sync(&mut self) -> Res<()>;
    /// Replaces the reader's snapshot with one of the current state.
    fn refresh_reader(&mut self) -> Res<()>;
    /// A digest of `key`'s value in the reader's snapshot.
    fn get(&mut self, key: &[u8]) -> Res<Option<Digest>>;
    /// Visits up to `limit` entries from `start` on; returns how many.
    fn scan(&mut self, start: &[u8], limit: usize) -> Res<usize>;
}

/// metcd's engines through the `Engine` trait; `persist` is `None` for the
/// memory engine, which has no durable point of its own.
struct Ours<E: Engine> {
    engine: E,
    persist: Option<fn(&E) -> engine::Result<u64>>,
    reader: Option<E::Snapshot>,
    applied: u64,
}

impl<E: Engine> Ours<E> {
    fn new(engine: E, persist: Option<fn(&E) -> engine::Result<u64>>) -> Self {
        let applied = engine.applied_index();
        Ours {
            engine,
            persist,
            reader: None,
            applied,
        }
    }

    fn reader(&mut self) -> &E::Snapshot {
        self.reader.get_or_insert_with(|| self.engine.snapshot())
    }
}

impl<E: Engine> BenchStore for Ours<E> {
    fn write(&mut self, kvs: &[(Bytes, Bytes)], sync: bool) -> Res<()> {
        let mut batch = WriteBatch::with_capacity(kvs.len());
        for (k, v) in kvs {
            batch.put(k.clone(), v.clone());
        }
        self.applied += 1;
        batch.set_applied_index(self.applied);
        self.engine.write(batch)?;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Res<()> {
        if let Some(persist) = self.persist {
            let durable = persist(&self.engine)?;
            if durable != self.applied {
                return Err(format!(
                    "persist returned applied index {durable}, expected {}",
                    self.applied
                )
                .into());
            }
        }
        Ok(())
    }

    fn refresh_reader(&mut self) -> Res<()> {
        self.reader = Some(self.engine.snapshot());
        Ok(())
    }

    fn get(&mut self, key: &[u8]) -> Res<Option<Digest>> {
        Ok(self.reader().get(key)?.map(|v| Digest::of(&v)))
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Res<usize> {
        let mut seen = 0;
        let mut bytes = 0;
        self.reader()
            .scan(Bound::Included(start), Bound::Unbounded, |k, v| {
                seen += 1;
                bytes += k.len() + v.len();
                if seen >= limit {
                    Scan::Stop
                } else {
                    Scan::Continue
                }
            })?;
        std::hint::black_box(bytes);
        Ok(seen)
    }
}

const REDB_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

struct Redb {
    db: redb::Database,
    reader: Option<redb::ReadOnlyTable<&'static [u8], &'static [u8]>>,
}

impl Redb {
    fn open(dir: &Path, cache_bytes: usize) -> Res<Redb> {
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(dir.join("data.redb"))?;
        // Create the table so the first read transaction finds it.
        let txn = db.begin_write()?;
        txn.open_table(REDB_TABLE)?;
        txn.commit()?;
        Ok(Redb { db, reader: None })
    }

    fn commit(&mut self, kvs: &[(Bytes, Bytes)], sync: bool) -> Res<()> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(if sync {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        })?;
        {
            let mut table = txn.open_table(REDB_TABLE)?;
            for (k, v) in kvs {
                table.insert(k.as_ref(), v.as_ref())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    fn reader(&mut self) -> Res<&redb::ReadOnlyTable<&'static [u8], &'static [u8]>> {
        if self.reader.is_none() {
            self.refresh_reader()?;
        }
        self.reader.as_ref().ok_or_else(|| "redb: no reader".into())
    }
}

impl BenchStore for Redb {
    fn write(&mut self, kvs: &[(Bytes, Bytes)], sync: bool) -> Res<()> {
        self.commit(kvs, sync)
    }

    fn sync(&mut self) -> Res<()> {
        self.commit(&[], true)
    }

    fn refresh_reader(&mut self) -> Res<()> {
        // Drop the old read transaction first so its pages can be reused.
        self.reader = None;
        self.reader = Some(self.db.begin_read()?.open_table(REDB_TABLE)?);
        Ok(())
    }

    fn get(&mut self, key: &[u8]) -> Res<Option<Digest>> {
        Ok(self.reader()?.get(key)?.map(|v| Digest::of(v.value())))
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Res<usize> {
        let mut seen = 0;
        let mut bytes = 0;
        for entry in self.reader()?.range::<&[u8]>(start..)?.take(limit) {
            let (k, v) = entry?;
            seen += 1;
            bytes += k.value().len() + v.value().len();
        }
        std::hint::black_box(bytes);
        Ok(seen)
    }
}

struct Fjall {
    // Field order is drop order: the keyspace and snapshot before the
    // database they belong to.
    reader: Option<fjall::Snapshot>,
    keyspace: fjall::Keyspace,
    db: fjall::Database,
}

impl Fjall {
    fn open(dir: &Path, cache_bytes: usize) -> Res<Fjall> {
        let db = fjall::Database::builder(dir)
            .cache_size(cache_bytes as u64)
            .open()?;
        let keyspace = db.keyspace("bench", fjall::KeyspaceCreateOptions::default)?;
        Ok(Fjall {
            reader: None,
            keyspace,
            db,
        })
    }
}

impl BenchStore for Fjall {
    fn write(&mut self, kvs: &[(Bytes, Bytes)], sync: bool) -> Res<()> {
        let mut batch = self.db.batch();
        for (k, v) in kvs {
            batch.insert(&self.keyspace, k.as_ref(), v.as_ref());
        }
        batch.commit()?;
        if sync {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Res<()> {
        self.db.persist(fjall::PersistMode::SyncData)?;
        Ok(())
    }

    fn refresh_reader(&mut self) -> Res<()> {
        self.reader = Some(self.db.snapshot());
        Ok(())
    }

    fn get(&mut self, key: &[u8]) -> Res<Option<Digest>> {
        use fjall::Readable;
        let reader = self.reader.get_or_insert_with(|| self.db.snapshot());
        Ok(reader.get(&self.keyspace, key)?.map(|v| Digest::of(&v)))
    }

    fn scan(&mut self, start: &[u8], limit: usize) -> Res<usize> {
        use fjall::Readable;
        let reader = self.reader.get_or_insert_with(|| self.db.snapshot());
        let mut seen = 0;
        let mut bytes = 0;
        for guard in reader.range(&self.keyspace, start..).take(limit) {
            let (k, v) = guard.into_inner()?;
            seen += 1;
            bytes += k.len() + v.len();
        }
        std::hint::black_box(bytes);
        Ok(seen)
    }
}

/// The engines this build knows, in report order.
const ENGINES: &[&str] = &["memory", "btree", "lsm", "redb", "fjall"];

fn open_store(name: &str, dir: &Path, args: &Args) -> Res<Box<dyn BenchStore>> {
    std::fs::create_dir_all(dir)?;
    let cache_bytes = args.cache_mib << 20;
    Ok(match name {
        "memory" => Box::new(Ours::new(MemoryEngine::new(), None)),
        "btree" => Box::new(Ours::new(
            BtreeEngine::open(
                dir,
                BtreeOptions {
                    cache_bytes,
                    ..BtreeOptions::default()
                },
            )?,
            Some(BtreeEngine::persist),
        )),
        "lsm" => Box::new(Ours::new(
            LsmEngine::open(
                dir,
                LsmOptions {
                    block_cache_bytes: cache_bytes,
                    ..LsmOptions::default()
                },
            )?,
            Some(LsmEngine::persist),
        )),
        "redb" => Box::new(Redb::open(dir, cache_bytes)?),
        "fjall" => Box::new(Fjall::open(dir, cache_bytes)?),
        other => {
            return Err(format!(
                "unknown engine {other:?} (this build knows {})",
                ENGINES.join(", ")
            )
            .into())
        }
    })
}

#[derive(Debug, Clone)]
struct Phase {
    name: &'static str,
    /// "batch" (fills: one sample per 1000-key batch) or "op".
    timed_per: &'static str,
    ops: u64,
    timed: Duration,
    p99_us: f64,
    /// Device and logical bytes, for phases that write.
    written: Option<(u64, u64)>,
}

impl Phase {
    fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.timed.as_secs_f64().max(1e-9)
    }

    fn write_amp(&self) -> Option<f64> {
        self.written
            .and_then(|(device, logical)| write_amplification(device, logical))
    }
}

struct Recorder {
    hist: Histogram<u64>,
    timed: Duration,
}

impl Recorder {
    fn new() -> Res<Recorder> {
        Ok(Recorder {
            hist: Histogram::new(3)?,
            timed: Duration::ZERO,
        })
    }

    fn record(&mut self, elapsed: Duration) -> Res<()> {
        self.timed += elapsed;
        self.hist
            .record(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1))?;
        Ok(())
    }

    fn finish(
        self,
        name: &'static str,
        timed_per: &'static str,
        ops: u64,
        written: Option<(u64, u64)>,
    ) -> Phase {
        Phase {
            name,
            timed_per,
            ops,
            timed: self.timed,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            written,
        }
    }
}

fn kv(i: u64, version: u64, value_bytes: usize) -> (Bytes, Bytes) {
    (
        Bytes::copy_from_slice(&key(i)),
        Bytes::from(value(i, version, value_bytes)),
    )
}

/// Writes every key of `order` once, 1000 per batch, every
/// `sync_batches`-th batch and the last one durable.
fn fill(
    store: &mut dyn BenchStore,
    name: &'static str,
    order: &[u64],
    value_bytes: usize,
    sync_batches: usize,
) -> Res<Phase> {
    let io_before = IoCounters::read()?;
    let mut rec = Recorder::new()?;
    let mut logical = 0u64;
    let batches = order.len().div_ceil(FILL_BATCH);
    for (b, chunk) in order.chunks(FILL_BATCH).enumerate() {
        let kvs: Vec<(Bytes, Bytes)> = chunk.iter().map(|&i| kv(i, 0, value_bytes)).collect();
        logical += kvs
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum::<u64>();
        let sync = (b + 1).is_multiple_of(sync_batches.max(1)) || b + 1 == batches;
        let t = Instant::now();
        store.write(&kvs, sync)?;
        rec.record(t.elapsed())?;
    }
    let device = IoCounters::read()?.device_bytes_since(&io_before);
    Ok(rec.finish(name, "batch", order.len() as u64, Some((device, logical))))
}

/// A read must find the key; `expected` checks the exact value where the
/// phase knows it, otherwise only its length is checked.
fn check_value(
    what: &str,
    i: u64,
    got: Option<Digest>,
    value_bytes: usize,
    expected: Option<Digest>,
) -> Res<()> {
    match (got, expected) {
        (Some(got), Some(expected)) if got == expected => Ok(()),
        (Some(got), None) if got.len == value_bytes => Ok(()),
        (got, expected) => Err(format!(
            "{what}: key {i} read back as {got:?}, expected {expected:?} ({value_bytes} bytes)"
        )
        .into()),
    }
}

struct Workload<'a> {
    args: &'a Args,
    deadline: Duration,
}

impl Workload<'_> {
    fn out_of_time(&self, op: u64, started: Instant) -> bool {
        op.is_multiple_of(OPS_PER_SNAPSHOT) && op > 0 && started.elapsed() > self.deadline
    }

    fn point_reads(&self, store: &mut dyn BenchStore) -> Res<Phase> {
        let keys = self.args.keys;
        let mut rng = Rng::new(101);
        let mut rec = Recorder::new()?;
        let started = Instant::now();
        let mut op = 0;
        while op < self.args.reads && !self.out_of_time(op, started) {
            let i = rng.below(keys);
            let k = key(i);
            let t = Instant::now();
            if op.is_multiple_of(OPS_PER_SNAPSHOT) {
                store.refresh_reader()?;
            }
            let got = store.get(&k)?;
            rec.record(t.elapsed())?;
            // Nothing overwrote the fill yet: the exact first version.
            let expected = Digest::of(&value(i, 0, self.args.value_bytes));
            check_value("random read", i, got, self.args.value_bytes, Some(expected))?;
            op += 1;
        }
        Ok(rec.finish("random read", "op", op, None))
    }

    fn scans(&self, store: &mut dyn BenchStore) -> Res<Phase> {
        let keys = self.args.keys;
        let mut rng = Rng::new(202);
        let mut rec = Recorder::new()?;
        let started = Instant::now();
        let mut op = 0;
        while op < self.args.scans && !self.out_of_time(op, started) {
            let i = rng.below(keys);
            let k = key(i);
            let t = Instant::now();
            if op.is_multiple_of(OPS_PER_SNAPSHOT) {
                store.refresh_reader()?;
            }
            let seen = store.scan(&k, SCAN_LEN)?;
            rec.record(t.elapsed())?;
            let expected = (keys - i).min(SCAN_LEN as u64) as usize;
            if seen != expected {
                return Err(
                    format!("scan from key {i}: {seen} entries, expected {expected}").into(),
                );
            }
            op += 1;
        }
        Ok(rec.finish("scan 100", "op", op, None))
    }

    /// `read_percent` reads, the rest single-key overwrites of existing
    /// keys; a snapshot refresh and a durable sync every 1000 operations.
    fn mix(
        &self,
        store: &mut dyn BenchStore,
        name: &'static str,
        read_percent: u64,
        seed: u64,
    ) -> Res<Phase> {
        let keys = self.args.keys;
        let value_bytes = self.args.value_bytes;
        let mut rng = Rng::new(seed);
        let mut rec = Recorder::new()?;
        let io_before = IoCounters::read()?;
        let mut logical = 0u64;
        let started = Instant::now();
        let mut op = 0;
        while op < self.args.mix_ops && !self.out_of_time(op, started) {
            let i = rng.below(keys);
            let is_read = rng.below(100) < read_percent;
            let write = (!is_read).then(|| [kv(i, (seed << 32) | op, value_bytes)]);
            let t = Instant::now();
            if op.is_multiple_of(OPS_PER_SNAPSHOT) {
                store.refresh_reader()?;
            }
            let got = match &write {
                None => Some(store.get(&key(i))?),
                Some(kvs) => {
                    store.write(kvs, false)?;
                    None
                }
            };
            if (op + 1).is_multiple_of(self.args.mix_sync_ops.max(1)) {
                store.sync()?;
            }
            rec.record(t.elapsed())?;
            if let Some(got) = got {
                check_value(name, i, got, value_bytes, None)?;
            } else {
                logical += (key(i).len() + value_bytes) as u64;
            }
            op += 1;
        }
        // End durable, as a fill does; this last sync is not timed.
        store.sync()?;
        let device = IoCounters::read()?.device_bytes_since(&io_before);
        Ok(rec.finish(name, "op", op, Some((device, logical))))
    }
}

struct EngineReport {
    name: String,
    phases: Vec<Phase>,
    /// (device, logical) from opening the store to after closing it.
    seq_store_written: (u64, u64),
    rand_store_written: (u64, u64),
    /// (apparent, allocated) bytes under the store's directory.
    seq_size: (u64, u64),
    final_size: (u64, u64),
}

fn run_engine(name: &str, args: &Args, root: &Path, order: &[u64]) -> Res<EngineReport> {
    let workload = Workload {
        args,
        deadline: Duration::from_secs(args.max_phase_secs),
    };
    let mut phases = Vec::new();

    let seq_dir = root.join(format!("{name}-seq"));
    let io_open = IoCounters::read()?;
    let mut store = open_store(name, &seq_dir, args)?;
    let sequential: Vec<u64> = (0..args.keys).collect();
    let seq = fill(
        store.as_mut(),
        "sequential fill",
        &sequential,
        args.value_bytes,
        args.fill_sync_batches,
    )?;
    let seq_logical = seq.written.map_or(0, |(_, l)| l);
    phases.push(seq);
    drop(store);
    let seq_store_written = (
        IoCounters::read()?.device_bytes_since(&io_open),
        seq_logical,
    );
    let seq_size = dir_bytes(&seq_dir)?;
    std::fs::remove_dir_all(&seq_dir)?;
    eprintln!("{name}: sequential fill done");

    let rand_dir = root.join(format!("{name}-rand"));
    let io_open = IoCounters::read()?;
    let mut store = open_store(name, &rand_dir, args)?;
    phases.push(fill(
        store.as_mut(),
        "random fill",
        order,
        args.value_bytes,
        args.fill_sync_batches,
    )?);
    eprintln!("{name}: random fill done");
    phases.push(workload.point_reads(store.as_mut())?);
    phases.push(workload.scans(store.as_mut())?);
    eprintln!("{name}: reads and scans done");
    phases.push(workload.mix(store.as_mut(), "mix 90/10 r/w", 90, 303)?);
    phases.push(workload.mix(store.as_mut(), "mix 10/90 r/w", 10, 404)?);
    eprintln!("{name}: mixes done");
    drop(store);
    let rand_logical = phases[1..]
        .iter()
        .filter_map(|p| p.written.map(|(_, l)| l))
        .sum();
    let rand_store_written = (
        IoCounters::read()?.device_bytes_since(&io_open),
        rand_logical,
    );
    let final_size = dir_bytes(&rand_dir)?;
    std::fs::remove_dir_all(&rand_dir)?;

    Ok(EngineReport {
        name: name.to_string(),
        phases,
        seq_store_written,
        rand_store_written,
        seq_size,
        final_size,
    })
}

fn human_rate(ops_per_sec: f64) -> String {
    if ops_per_sec >= 1e6 {
        format!("{:.2}M", ops_per_sec / 1e6)
    } else if ops_per_sec >= 1e3 {
        format!("{:.1}k", ops_per_sec / 1e3)
    } else {
        format!("{ops_per_sec:.0}")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn amp(written: (u64, u64), has_files: bool) -> String {
    match write_amplification(written.0, written.1) {
        Some(a) if has_files => format!("{a:.2}"),
        _ => "n/a".to_string(),
    }
}

fn text_report(args: &Args, reports: &[EngineReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {} keys, {}-byte values, engine caches {} MiB; \
         fills timed per 1000-key batch, other phases per op",
        args.keys, args.value_bytes, args.cache_mib
    );
    let _ = write!(out, "| phase |");
    for r in reports {
        let _ = write!(out, " {} |", r.name);
    }
    let _ = write!(out, "\n|---|");
    for _ in reports {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    let Some(first) = reports.first() else {
        return out;
    };
    for (p, phase) in first.phases.iter().enumerate() {
        let _ = write!(
            out,
            "| {} (ops/s, p99 per {}) |",
            phase.name, phase.timed_per
        );
        for r in reports {
            let ph = &r.phases[p];
            let _ = write!(
                out,
                " {} ops/s, p99 {:.0} µs |",
                human_rate(ph.ops_per_sec()),
                ph.p99_us
            );
        }
        out.push('\n');
    }
    for (p, phase) in first.phases.iter().enumerate() {
        if phase.written.is_none() {
            continue;
        }
        let _ = write!(out, "| write amp, {} |", phase.name);
        for r in reports {
            let has_files = r.final_size.0 > 0;
            let _ = write!(
                out,
                " {} |",
                amp(r.phases[p].written.unwrap_or((0, 0)), has_files)
            );
        }
        out.push('\n');
    }
    type Cell<'a> = &'a dyn Fn(&EngineReport) -> String;
    let rows: [(&str, Cell); 4] = [
        ("write amp, sequential store open→close", &|r| {
            amp(r.seq_store_written, r.seq_size.0 > 0)
        }),
        (
            "write amp, random store open→close (fill + mixes)",
            &|r| amp(r.rand_store_written, r.final_size.0 > 0),
        ),
        ("size on disk after sequential fill (allocated)", &|r| {
            format!("{} ({})", mib(r.seq_size.0), mib(r.seq_size.1))
        }),
        ("final size on disk, random store (allocated)", &|r| {
            format!("{} ({})", mib(r.final_size.0), mib(r.final_size.1))
        }),
    ];
    for (label, cell) in rows {
        let _ = write!(out, "| {label} |");
        for r in reports {
            let _ = write!(out, " {} |", cell(r));
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "\noperations done per phase (fewer than asked: stopped by --max-phase-secs):"
    );
    for r in reports {
        let ops: Vec<String> = r.phases.iter().map(|p| p.ops.to_string()).collect();
        let _ = writeln!(out, "- {}: {}", r.name, ops.join(" / "));
    }
    out
}

fn json_report(args: &Args, reports: &[EngineReport]) -> Res<String> {
    let engines: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let phases: Vec<serde_json::Value> = r
                .phases
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "phase": p.name,
                        "timed_per": p.timed_per,
                        "ops": p.ops,
                        "timed_secs": p.timed.as_secs_f64(),
                        "ops_per_sec": p.ops_per_sec(),
                        "latency_us_p99": p.p99_us,
                        "device_bytes": p.written.map(|w| w.0),
                        "logical_bytes": p.written.map(|w| w.1),
                        "write_amplification": p.write_amp(),
                    })
                })
                .collect();
            serde_json::json!({
                "engine": r.name,
                "phases": phases,
                "sequential_store": {
                    "device_bytes": r.seq_store_written.0,
                    "logical_bytes": r.seq_store_written.1,
                    "size_bytes": r.seq_size.0,
                    "allocated_bytes": r.seq_size.1,
                },
                "random_store": {
                    "device_bytes": r.rand_store_written.0,
                    "logical_bytes": r.rand_store_written.1,
                    "size_bytes": r.final_size.0,
                    "allocated_bytes": r.final_size.1,
                },
            })
        })
        .collect();
    Ok(serde_json::to_string_pretty(&serde_json::json!({
        "keys": args.keys,
        "value_bytes": args.value_bytes,
        "cache_mib": args.cache_mib,
        "fill_batch": FILL_BATCH,
        "fill_sync_batches": args.fill_sync_batches,
        "mix_sync_ops": args.mix_sync_ops,
        "ops_per_snapshot": OPS_PER_SNAPSHOT,
        "engines": engines,
    }))?)
}

fn main() -> Res<()> {
    server::alloc::tune();
    let args = Args::parse();
    if args.keys == 0 || args.value_bytes == 0 {
        return Err("--keys and --value-bytes must be positive".into());
    }
    if !matches!(args.output.as_str(), "text" | "json") {
        return Err(format!("--output {:?}: expected text or json", args.output).into());
    }
    let names: Vec<&str> = args
        .engines
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = names.iter().find(|n| !ENGINES.contains(n)) {
        return Err(format!(
            "unknown engine {bad:?} (this build knows {})",
            ENGINES.join(", ")
        )
        .into());
    }
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent)?;
    let root = tempfile::Builder::new()
        .prefix("metcd-engines-")
        .tempdir_in(&parent)?;
    let order = permutation(args.keys, 7);
    let started = Instant::now();
    let mut reports = Vec::new();
    for name in names {
        reports.push(run_engine(name, &args, root.path(), &order)?);
    }
    eprintln!("total {:.0} s", started.elapsed().as_secs_f64());
    match args.output.as_str() {
        "json" => println!("{}", json_report(&args, &reports)?),
        _ => print!("{}", text_report(&args, &reports)),
    }
    Ok(())
}
