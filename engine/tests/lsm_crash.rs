//! Crash tests for the lsm engine: a failpoint fails one write, fsync or
//! rename of a flush, a manifest update or a compaction; the failure must
//! surface from `persist`, and after dropping the engine (the test's
//! "crash") a reopen recovers exactly the last successful persist.
//!
//! Failpoints are process-global: every test here holds a `FailScenario`,
//! which serialises them, and this file is its own test binary.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use engine::lsm::{LsmEngine, LsmOptions};
use engine::{Engine, EngineSnapshot, Error, Scan, WriteBatch};
use std::ops::Bound;

type Model = BTreeMap<Bytes, Bytes>;

const STEPS: &[&str] = &[
    "sst_write",
    "sst_sync",
    "sst_dir_sync",
    "manifest_write",
    "manifest_sync",
    "manifest_rename",
    "manifest_dir_sync",
];

fn options(l0_compaction_trigger: usize) -> LsmOptions {
    LsmOptions {
        memtable_bytes: 1 << 20,
        l0_compaction_trigger,
        ..LsmOptions::default()
    }
}

/// Writes batches `first..=last` (applied index = batch number); each
/// rewrites a few keys, deletes one and adds a new one.
fn write_batches(engine: &LsmEngine, model: &mut Model, first: u64, last: u64) {
    for i in first..=last {
        let mut batch = WriteBatch::new();
        for j in 0..4 {
            let k = Bytes::from(format!("key-{:03}", (i * 3 + j) % 50));
            let v = Bytes::from(format!("v{i}-{j}"));
            model.insert(k.clone(), v.clone());
            batch.put(k, v);
        }
        let dead = Bytes::from(format!("key-{:03}", (i * 7) % 50));
        model.remove(&dead);
        batch.delete(dead);
        batch.set_applied_index(i);
        engine.write(batch).unwrap();
    }
}

fn contents(engine: &LsmEngine) -> Model {
    let mut out = Model::new();
    engine
        .snapshot()
        .scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
            out.insert(Bytes::copy_from_slice(k), v.clone());
            Scan::Continue
        })
        .unwrap();
    out
}

fn sst_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".sst")
        })
        .count()
}

fn assert_poisoned(err: Error, name: &str) {
    let msg = err.to_string();
    assert!(matches!(err, Error::Poisoned(_)), "{name}: {msg}");
    assert!(
        msg.contains(name),
        "{name}: the error should name the failed step: {msg}"
    );
}

/// A flush fails at `step`: `persist` errors, later writes are refused, and
/// a reopen shows the previous persist (or, if the failure came after the
/// manifest's rename, its commit point, exactly the new one).
#[test]
fn failed_flush_surfaces_and_reopen_recovers_last_persist() {
    for step in STEPS {
        let scenario = fail::FailScenario::setup();
        let name = format!("lsm::flush::{step}");
        let dir = tempfile::tempdir().unwrap();
        let engine = LsmEngine::open(dir.path(), options(100)).unwrap();
        let mut model = Model::new();
        write_batches(&engine, &mut model, 1, 20);
        assert_eq!(engine.persist().unwrap(), 20);
        let persisted = model.clone();

        fail::cfg(&name, "return").unwrap();
        let mut attempted = model.clone();
        write_batches(&engine, &mut attempted, 21, 40);
        assert_poisoned(engine.persist().unwrap_err(), &name);
        // Poisoned: no more writes, and persist keeps failing.
        let mut batch = WriteBatch::new();
        batch.put(Bytes::from_static(b"late"), Bytes::from_static(b"x"));
        batch.set_applied_index(41);
        assert!(
            matches!(engine.write(batch), Err(Error::Poisoned(_))),
            "{name}"
        );
        assert!(engine.persist().is_err(), "{name}");
        assert_eq!(engine.durable_applied_index(), 20, "{name}");
        fail::remove(&name);
        drop(engine);

        let engine = LsmEngine::open(dir.path(), options(100)).unwrap();
        let durable = engine.durable_applied_index();
        if *step == "manifest_dir_sync" {
            // The rename (the commit point) happened; only its directory
            // fsync was refused, so either state may survive a real crash.
            assert!(durable == 20 || durable == 40, "{name}: {durable}");
        } else {
            assert_eq!(durable, 20, "{name}");
        }
        assert_eq!(engine.applied_index(), durable, "{name}");
        let want = if durable == 20 {
            &persisted
        } else {
            &attempted
        };
        assert_eq!(&contents(&engine), want, "{name}");
        // Files of the failed flush were removed (now or at open).
        assert_eq!(
            sst_count(dir.path()),
            engine.table_counts().iter().sum::<usize>(),
            "{name}"
        );
        // The reopened engine works: the log would be replayed from here.
        let mut model = want.clone();
        write_batches(&engine, &mut model, durable + 1, durable + 5);
        assert_eq!(engine.persist().unwrap(), durable + 5, "{name}");
        drop(engine);
        let engine = LsmEngine::open(dir.path(), options(100)).unwrap();
        assert_eq!(contents(&engine), model, "{name}");
        scenario.teardown();
    }
}

/// A compaction fails at `step` after the flushes it follows succeeded:
/// the next `persist` reports it, and a reopen shows exactly the last
/// successful persist with no table lost or left behind.
#[test]
fn failed_compaction_surfaces_and_reopen_recovers_last_persist() {
    for step in STEPS {
        let scenario = fail::FailScenario::setup();
        let name = format!("lsm::compaction::{step}");
        let dir = tempfile::tempdir().unwrap();
        let engine = LsmEngine::open(dir.path(), options(2)).unwrap();
        let mut model = Model::new();
        write_batches(&engine, &mut model, 1, 20);
        assert_eq!(engine.persist().unwrap(), 20);
        engine.wait_idle();

        fail::cfg(&name, "return").unwrap();
        write_batches(&engine, &mut model, 21, 40);
        // The flush succeeds; the compaction it triggers (two level-0
        // tables) fails in the background.
        assert_eq!(engine.persist().unwrap(), 40, "{name}");
        engine.wait_idle();
        assert_poisoned(engine.persist().unwrap_err(), &name);
        // Reads still see everything written.
        assert_eq!(contents(&engine), model, "{name}");
        fail::remove(&name);
        drop(engine);

        let engine = LsmEngine::open(dir.path(), options(2)).unwrap();
        assert_eq!(engine.durable_applied_index(), 40, "{name}");
        assert_eq!(contents(&engine), model, "{name}");
        engine.wait_idle();
        // Reopened, the compaction is retried and succeeds.
        assert_eq!(engine.table_counts()[0], 0, "{name}");
        assert_eq!(contents(&engine), model, "{name}");
        assert_eq!(
            sst_count(dir.path()),
            engine.table_counts().iter().sum::<usize>(),
            "{name}"
        );
        drop(engine);
        let engine = LsmEngine::open(dir.path(), options(2)).unwrap();
        assert_eq!(contents(&engine), model, "{name}");
        scenario.teardown();
    }
}
