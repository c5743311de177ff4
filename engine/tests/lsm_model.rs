//! Model test: `LsmEngine` against a `BTreeMap`, with memtables small
//! enough that flushes and compactions really happen, snapshots held across
//! them, scans with every kind of bound, and persists, clean reopens and
//! crash-like reopens (drop without persist) in between.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use bytes::Bytes;
use engine::lsm::{LsmEngine, LsmOptions, LsmSnapshot};
use engine::{Engine, EngineSnapshot, Scan, WriteBatch};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

type Model = BTreeMap<Bytes, Bytes>;

/// Few keys, so writes collide and versions pile up; the empty key, keys
/// that prefix others, and both ends of the byte range.
const KEYS: &[&[u8]] = &[
    b"",
    b"\x00",
    b"a",
    b"a\x00",
    b"aa",
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa2",
    b"ab",
    b"b",
    b"ba",
    b"key-0001",
    b"key-0002",
    b"key-0010",
    b"key-0100",
    b"\xff",
    b"\xff\xff",
];
/// Bound probes: the keys plus some never written.
const PROBES: &[&[u8]] = &[
    b"",
    b"\x00",
    b"a",
    b"aa",
    b"ab",
    b"b",
    b"key-0002",
    b"\xff",
    b"0",
    b"az",
    b"c",
    b"key-",
];

fn small_options() -> LsmOptions {
    LsmOptions {
        memtable_bytes: 1024,
        max_immutable_memtables: 3,
        block_cache_bytes: 64 << 10,
        target_file_bytes: 6 << 10,
        l0_compaction_trigger: 2,
        level1_max_bytes: 12 << 10,
        level_size_ratio: 2,
        max_levels: 4,
        bloom_bits_per_key: 10,
    }
}

#[derive(Debug, Clone)]
enum BoundSpec {
    Unbounded,
    Included(usize),
    Excluded(usize),
}

impl BoundSpec {
    fn get(&self) -> Bound<&'static [u8]> {
        match self {
            BoundSpec::Unbounded => Bound::Unbounded,
            BoundSpec::Included(i) => Bound::Included(PROBES[*i]),
            BoundSpec::Excluded(i) => Bound::Excluded(PROBES[*i]),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// One atomic batch: `(key index, Some(value) | None = delete)`.
    Batch(Vec<(usize, Option<Vec<u8>>)>),
    Snapshot,
    DropSnapshot(usize),
    Scan(BoundSpec, BoundSpec, usize),
    Persist,
    /// persist, drop, reopen: exactly the persisted state.
    PersistReopen,
    /// drop without persist: whatever background flushes made durable.
    CrashReopen,
}

fn bound_spec() -> impl Strategy<Value = BoundSpec> {
    prop_oneof![
        Just(BoundSpec::Unbounded),
        (0..PROBES.len()).prop_map(BoundSpec::Included),
        (0..PROBES.len()).prop_map(BoundSpec::Excluded),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..80),
        // Bigger than a block: exercises oversized blocks.
        1 => proptest::collection::vec(any::<u8>(), 4000..6000),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => proptest::collection::vec(
            (0..KEYS.len(), prop_oneof![3 => value().prop_map(Some), 1 => Just(None)]),
            1..8
        )
        .prop_map(Op::Batch),
        3 => Just(Op::Snapshot),
        2 => any::<usize>().prop_map(Op::DropSnapshot),
        4 => (bound_spec(), bound_spec(), 0usize..20).prop_map(|(s, e, l)| Op::Scan(s, e, l)),
        2 => Just(Op::Persist),
        1 => Just(Op::PersistReopen),
        1 => Just(Op::CrashReopen),
    ]
}

fn in_range(key: &[u8], start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    let after = match start {
        Bound::Unbounded => true,
        Bound::Included(s) => key >= s,
        Bound::Excluded(s) => key > s,
    };
    let before = match end {
        Bound::Unbounded => true,
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
    };
    after && before
}

/// Scans `[start, end)` stopping after `limit` pairs (0 = no limit).
fn scan(
    snap: &LsmSnapshot,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    limit: usize,
) -> Vec<(Bytes, Bytes)> {
    let mut out = Vec::new();
    snap.scan(start, end, |k, v| {
        out.push((Bytes::copy_from_slice(k), v.clone()));
        if limit != 0 && out.len() >= limit {
            Scan::Stop
        } else {
            Scan::Continue
        }
    })
    .unwrap();
    out
}

fn expected(
    model: &Model,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    limit: usize,
) -> Vec<(Bytes, Bytes)> {
    let all = model
        .iter()
        .filter(|(k, _)| in_range(k, start, end))
        .map(|(k, v)| (k.clone(), v.clone()));
    if limit == 0 {
        all.collect()
    } else {
        all.take(limit).collect()
    }
}

/// Every key and a full scan read exactly `model`.
fn check_state(snap: &LsmSnapshot, model: &Model, what: &str) -> Result<(), TestCaseError> {
    for k in KEYS {
        prop_assert_eq!(
            snap.get(k).unwrap(),
            model.get(*k).cloned(),
            "{}: get {:?}",
            what,
            Bytes::from_static(k)
        );
    }
    // Every key twice, in two orders: the first miss of a cold cache
    // brings in the blocks of the keys after it.
    let keys: Vec<&[u8]> = KEYS.iter().chain(KEYS.iter().rev()).copied().collect();
    // A third now, the rest read along on a miss (before get_many warms
    // the cache): the first third's values.
    let ahead = snap.get_ahead(&keys, keys.len() / 3).unwrap();
    let values = snap.get_many(&keys).unwrap();
    prop_assert_eq!(values.len(), keys.len());
    prop_assert_eq!(&ahead[..], &values[..keys.len() / 3], "{}: get_ahead", what);
    for (k, v) in keys.iter().zip(values) {
        prop_assert_eq!(
            v,
            model.get(*k).cloned(),
            "{}: get_many {:?}",
            what,
            Bytes::from_static(k)
        );
    }
    prop_assert_eq!(
        scan(snap, Bound::Unbounded, Bound::Unbounded, 0),
        expected(model, Bound::Unbounded, Bound::Unbounded, 0),
        "{}: full scan",
        what
    );
    Ok(())
}

fn open(dir: &Path) -> LsmEngine {
    LsmEngine::open(dir, small_options()).unwrap()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = open(dir.path());
    let mut model = Model::new();
    // Applied index -> state after that batch (0 = empty).
    let mut history: BTreeMap<u64, Model> = BTreeMap::from([(0, Model::new())]);
    let mut applied = 0u64;
    let mut persisted = 0u64;
    let mut held: Vec<(LsmSnapshot, Model, u64)> = Vec::new();

    for op in ops {
        match op {
            Op::Batch(ops) => {
                let mut batch = WriteBatch::new();
                for (k, v) in ops {
                    let key = Bytes::from_static(KEYS[k]);
                    match v {
                        Some(v) => {
                            let v = Bytes::from(v);
                            model.insert(key.clone(), v.clone());
                            batch.put(key, v);
                        }
                        None => {
                            model.remove(&key);
                            batch.delete(key);
                        }
                    }
                }
                applied += 1;
                batch.set_applied_index(applied);
                engine.write(batch).unwrap();
                history.insert(applied, model.clone());
                prop_assert_eq!(engine.applied_index(), applied);
            }
            Op::Snapshot => {
                let snap = engine.snapshot();
                prop_assert_eq!(snap.applied_index(), applied);
                held.push((snap, model.clone(), applied));
            }
            Op::DropSnapshot(i) => {
                if !held.is_empty() {
                    let i = i % held.len();
                    held.swap_remove(i);
                }
            }
            Op::Scan(s, e, limit) => {
                let snap = engine.snapshot();
                let (s, e) = (s.get(), e.get());
                prop_assert_eq!(
                    scan(&snap, s, e, limit),
                    expected(&model, s, e, limit),
                    "scan {:?}..{:?} limit {}",
                    s,
                    e,
                    limit
                );
            }
            Op::Persist => {
                persisted = engine.persist().unwrap();
                prop_assert_eq!(persisted, applied);
                prop_assert_eq!(engine.durable_applied_index(), applied);
            }
            Op::PersistReopen => {
                persisted = engine.persist().unwrap();
                prop_assert_eq!(persisted, applied);
                drop(engine);
                engine = open(dir.path());
                prop_assert_eq!(engine.durable_applied_index(), persisted);
                prop_assert_eq!(engine.applied_index(), persisted);
                check_state(&engine.snapshot(), &model, "after persist + reopen")?;
            }
            Op::CrashReopen => {
                drop(engine);
                engine = open(dir.path());
                let durable = engine.durable_applied_index();
                prop_assert!(
                    durable >= persisted && durable <= applied,
                    "reopened at {} outside [{}, {}]",
                    durable,
                    persisted,
                    applied
                );
                prop_assert_eq!(engine.applied_index(), durable);
                // The server would replay its log from durable + 1; the
                // model continues from the recovered state instead.
                model = history[&durable].clone();
                history.retain(|&i, _| i <= durable);
                applied = durable;
                persisted = durable;
                check_state(&engine.snapshot(), &model, "after crash reopen")?;
            }
        }
        // Held snapshots never change, whatever flushed or compacted.
        for (snap, m, index) in &held {
            prop_assert_eq!(snap.applied_index(), *index);
            check_state(snap, m, "held snapshot")?;
        }
    }
    check_state(&engine.snapshot(), &model, "final")?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn lsm_matches_btreemap_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}

/// Enough writes that tables reach levels below 0, checked against the
/// model after compactions, a reopen, and with a snapshot from before.
#[test]
fn compactions_reach_deeper_levels_and_keep_data() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let mut model = Model::new();
    let mut early = None;
    for i in 0..3000u64 {
        let key = Bytes::from(format!("key-{:05}", (i * 7919) % 1500));
        let mut batch = WriteBatch::new();
        if i % 5 == 4 {
            model.remove(&key);
            batch.delete(key);
        } else {
            let v = Bytes::from(format!("value-{i}-{}", "x".repeat((i % 40) as usize)));
            model.insert(key.clone(), v.clone());
            batch.put(key, v);
        }
        batch.set_applied_index(i + 1);
        engine.write(batch).unwrap();
        if i == 1000 {
            early = Some((engine.snapshot(), model.clone()));
        }
    }
    assert_eq!(engine.persist().unwrap(), 3000);
    engine.wait_idle();
    let counts = engine.table_counts();
    assert!(
        counts[1..].iter().sum::<usize>() > 0,
        "no table below level 0: {counts:?}"
    );
    let (snap, early_model) = early.unwrap();
    assert_eq!(
        scan(&snap, Bound::Unbounded, Bound::Unbounded, 0),
        expected(&early_model, Bound::Unbounded, Bound::Unbounded, 0)
    );
    drop(snap);
    assert_eq!(
        scan(&engine.snapshot(), Bound::Unbounded, Bound::Unbounded, 0),
        expected(&model, Bound::Unbounded, Bound::Unbounded, 0)
    );
    drop(engine);
    let engine = open(dir.path());
    assert_eq!(engine.durable_applied_index(), 3000);
    let snap = engine.snapshot();
    // On the cold cache of the reopened engine: every key written, deleted
    // ones included, in an order that jumps between tables and levels.
    let keys: Vec<Bytes> = (0..1500u64)
        .map(|i| Bytes::from(format!("key-{:05}", (i * 7) % 1500)))
        .collect();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    for (k, v) in keys.iter().zip(snap.get_many(&refs).unwrap()) {
        assert_eq!(v.as_ref(), model.get(k), "get_many {k:?}");
    }
    for (k, v) in &model {
        assert_eq!(snap.get(k).unwrap().as_ref(), Some(v));
    }
    assert_eq!(snap.get(b"key-99999").unwrap(), None);
    // Table files on disk are exactly the live ones.
    let ssts = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".sst")
        })
        .count();
    assert_eq!(ssts, engine.table_counts().iter().sum::<usize>());
}

/// A table replaced by a compaction keeps its file while a snapshot reads
/// it, and loses it once the snapshot is dropped.
#[test]
fn obsolete_tables_outlive_the_snapshots_that_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let options = LsmOptions {
        l0_compaction_trigger: 2,
        level1_max_bytes: 1 << 20,
        ..small_options()
    };
    let engine = LsmEngine::open(dir.path(), options).unwrap();
    let sst_files = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sst"))
            .collect();
        v.sort();
        v
    };
    let mut batch = WriteBatch::new();
    batch.put(Bytes::from_static(b"k"), Bytes::from_static(b"old"));
    batch.set_applied_index(1);
    engine.write(batch).unwrap();
    engine.persist().unwrap();
    engine.wait_idle();
    let first = sst_files();
    assert_eq!(first.len(), 1);
    let snap = engine.snapshot();
    let mut batch = WriteBatch::new();
    batch.put(Bytes::from_static(b"k"), Bytes::from_static(b"new"));
    batch.set_applied_index(2);
    engine.write(batch).unwrap();
    engine.persist().unwrap();
    engine.wait_idle();
    // Two level-0 tables were compacted into one level-1 table.
    assert_eq!(engine.table_counts()[..2], [0, 1]);
    let files = sst_files();
    assert!(
        files.contains(&first[0]),
        "{files:?} lost {} under a snapshot",
        first[0]
    );
    assert_eq!(snap.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
    drop(snap);
    assert!(!sst_files().contains(&first[0]));
    assert_eq!(sst_files().len(), 1);
    assert_eq!(engine.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
}

/// Pinned from a proptest failure: the empty key as a table's first (and
/// only) key was missing from its bloom filter, so it vanished on flush.
#[test]
fn empty_key_survives_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let mut batch = WriteBatch::new();
    batch.put(Bytes::new(), Bytes::new());
    batch.set_applied_index(1);
    engine.write(batch).unwrap();
    assert_eq!(engine.persist().unwrap(), 1);
    assert_eq!(engine.get(b"").unwrap(), Some(Bytes::new()));
    drop(engine);
    assert_eq!(open(dir.path()).get(b"").unwrap(), Some(Bytes::new()));
}

fn assert_send_sync_static<T: Send + Sync + 'static>() {}

/// One writer, a persisting thread and readers at once: every snapshot
/// sees whole batches only, persisted indexes only grow and never pass
/// what was written, and a reopen recovers the last persist exactly.
#[test]
fn concurrent_writer_persister_and_readers_stay_consistent() {
    assert_send_sync_static::<LsmEngine>();
    assert_send_sync_static::<LsmSnapshot>();
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    const BATCHES: u64 = 1000;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let last_persisted = std::thread::scope(|s| {
        let persister = s.spawn(|| {
            let mut last = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let written = engine.applied_index();
                let p = engine.persist().unwrap();
                assert!(
                    p >= last && p >= written,
                    "persist went from {last} to {p} ({written} written)"
                );
                last = p;
            }
            last
        });
        let readers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        let snap = engine.snapshot();
                        let index = snap.applied_index();
                        // Batch i writes "i" to a, b and c.
                        let want = (index > 0).then(|| Bytes::from(index.to_string()));
                        for k in [b"a", b"b", b"c"] {
                            assert_eq!(snap.get(k).unwrap(), want, "snapshot at {index}");
                        }
                        let mut n = 0;
                        snap.scan(Bound::Unbounded, Bound::Unbounded, |_, v| {
                            assert_eq!(Some(v), want.as_ref());
                            n += 1;
                            Scan::Continue
                        })
                        .unwrap();
                        assert_eq!(n, if index > 0 { 3 } else { 0 });
                    }
                })
            })
            .collect();
        for i in 1..=BATCHES {
            let mut batch = WriteBatch::new();
            let v = Bytes::from(i.to_string());
            for k in ["a", "b", "c"] {
                batch.put(Bytes::from_static(k.as_bytes()), v.clone());
            }
            batch.set_applied_index(i);
            engine.write(batch).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        for r in readers {
            r.join().unwrap();
        }
        persister.join().unwrap()
    });
    assert!(last_persisted <= BATCHES);
    drop(engine);
    let engine = open(dir.path());
    let durable = engine.durable_applied_index();
    // Background flushes may have made more durable than the last persist.
    assert!(durable >= last_persisted, "{durable} < {last_persisted}");
    let want = (durable > 0).then(|| Bytes::from(durable.to_string()));
    assert_eq!(engine.get(b"a").unwrap(), want);
}

/// Writes `n` keys (or deletes them) in one batch at `index`, and persists.
fn put_or_delete_all(engine: &LsmEngine, n: u32, delete: bool, index: u64) {
    let mut batch = WriteBatch::new();
    for i in 0..n {
        let key = Bytes::from(format!("key-{i:04}"));
        if delete {
            batch.delete(key);
        } else {
            batch.put(key, Bytes::from(format!("value-{i}")));
        }
    }
    batch.set_applied_index(index);
    engine.write(batch).unwrap();
    assert_eq!(engine.persist().unwrap(), index);
    engine.wait_idle();
}

/// Compacting puts and their tombstones into the bottom-most data drops
/// both, unless a live snapshot still needs the old values.
#[test]
fn tombstones_are_dropped_at_the_bottom_only_when_no_snapshot_needs_them() {
    let options = LsmOptions {
        memtable_bytes: 1 << 20,
        l0_compaction_trigger: 2,
        level1_max_bytes: 1 << 20,
        ..small_options()
    };
    let dir = tempfile::tempdir().unwrap();
    let engine = LsmEngine::open(dir.path(), options.clone()).unwrap();
    put_or_delete_all(&engine, 300, false, 1);
    assert_eq!(engine.table_counts()[..2], [1, 0]);
    put_or_delete_all(&engine, 300, true, 2);
    // Both level-0 tables merged into nothing: no table is left at all.
    assert_eq!(
        engine.table_counts().iter().sum::<usize>(),
        0,
        "{:?}",
        engine.table_counts()
    );
    assert_eq!(engine.get(b"key-0001").unwrap(), None);

    let dir = tempfile::tempdir().unwrap();
    let engine = LsmEngine::open(dir.path(), options.clone()).unwrap();
    put_or_delete_all(&engine, 300, false, 1);
    let snap = engine.snapshot();
    put_or_delete_all(&engine, 300, true, 2);
    // The snapshot predates the tombstones: values and tombstones stay.
    let counts = engine.table_counts();
    assert!(counts[0] == 0 && counts[1] > 0, "{counts:?}");
    assert_eq!(engine.get(b"key-0001").unwrap(), None);
    assert_eq!(snap.get(b"key-0001").unwrap(), Some(Bytes::from("value-1")));
    drop(snap);
    drop(engine);
    // Reopened (no snapshot can exist any more), still deleted.
    let engine = LsmEngine::open(dir.path(), options).unwrap();
    assert_eq!(engine.get(b"key-0001").unwrap(), None);
    let mut n = 0;
    engine
        .snapshot()
        .scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
            n += 1;
            Scan::Continue
        })
        .unwrap();
    assert_eq!(n, 0);
}
