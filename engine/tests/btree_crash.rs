//! Crash tests for the btree engine: a failpoint fails each write and sync
//! step of a commit and of a defragmentation; the engine is dropped (as a
//! crashed process would be) and reopened. What comes back must be exactly
//! the last successful commit, or, once the new meta page has reached the
//! file, that new commit whole: never a mix, and always with the applied
//! index of the data it holds.
//!
//! Failpoint configuration is process-global: every test holds a
//! `FailScenario`, which serialises them.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;

use bytes::Bytes;
use engine::btree::{BtreeEngine, BtreeOptions, DATA_FILE};
use engine::{Engine, EngineSnapshot, Error, Scan, WriteBatch};
use fail::FailScenario;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn options() -> BtreeOptions {
    BtreeOptions {
        cache_bytes: 256 << 10,
        resident_nodes: 0,
    }
}

fn dump(engine: &BtreeEngine) -> Model {
    let mut out = Model::new();
    engine
        .snapshot()
        .scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
            out.insert(k.to_vec(), v.to_vec());
            Scan::Continue
        })
        .unwrap();
    out
}

/// Round `round` of writes: puts (some overflowing a page), overwrites and
/// deletes of earlier rounds' keys.
fn write_round(engine: &BtreeEngine, model: &mut Model, round: u64) {
    let mut b = WriteBatch::new();
    for i in 0..400u64 {
        let k = format!("key/{:05}", (i * 7 + round * 131) % 1200).into_bytes();
        if (i + round).is_multiple_of(6) {
            b.delete(Bytes::from(k.clone()));
            model.remove(&k);
        } else {
            let v = if i % 13 == 0 {
                vec![round as u8; 5000 + i as usize]
            } else {
                format!("round {round} item {i}").into_bytes()
            };
            b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
            model.insert(k, v);
        }
    }
    b.set_applied_index(round);
    engine.write(b).unwrap();
}

/// Reopens and checks the state is `old` (at `old_index`) or, when
/// `may_be_new`, `new` (at `new_index`).
fn reopen_and_check(
    dir: &Path,
    old: &Model,
    old_index: u64,
    new: &Model,
    new_index: u64,
    may_be_new: bool,
) -> (BtreeEngine, Model, u64) {
    let engine = BtreeEngine::open(dir, options()).unwrap();
    engine.check().unwrap();
    let state = dump(&engine);
    let index = engine.durable_applied_index();
    assert_eq!(engine.applied_index(), index);
    if index == old_index {
        assert!(
            state == *old,
            "state at index {old_index} is not that commit's"
        );
        (engine, state, index)
    } else {
        assert!(
            may_be_new,
            "came back at index {index}, expected {old_index}"
        );
        assert_eq!(index, new_index);
        assert!(
            state == *new,
            "state at index {new_index} is not that commit's"
        );
        (engine, state, index)
    }
}

/// After a crash the engine must go on: more commits, another restart.
fn goes_on(dir: &Path, engine: BtreeEngine, mut model: Model, index: u64) {
    write_round(&engine, &mut model, index + 1);
    assert_eq!(engine.persist().unwrap(), index + 1);
    write_round(&engine, &mut model, index + 2);
    assert_eq!(engine.persist().unwrap(), index + 2);
    drop(engine);
    let engine = BtreeEngine::open(dir, options()).unwrap();
    assert_eq!(engine.durable_applied_index(), index + 2);
    assert_eq!(dump(&engine), model);
    engine.check().unwrap();
}

fn commit_fails_at(point: &str, meta_written: bool) {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    let mut model = Model::new();
    write_round(&engine, &mut model, 1);
    engine.persist().unwrap();
    write_round(&engine, &mut model, 2);
    engine.persist().unwrap();
    let durable = model.clone();
    write_round(&engine, &mut model, 3);

    fail::cfg(point, "return").unwrap();
    let err = engine.persist().unwrap_err();
    assert!(err.to_string().contains(point), "{err}");
    fail::remove(point);
    // A failed commit poisons: no more commits or writes.
    assert!(matches!(engine.persist(), Err(Error::Poisoned(_))));
    let mut b = WriteBatch::new();
    b.put(Bytes::from_static(b"x"), Bytes::from_static(b"y"));
    assert!(matches!(engine.write(b), Err(Error::Poisoned(_))));
    // Readers still see everything written.
    assert_eq!(dump(&engine), model);
    drop(engine);

    let (engine, state, index) = reopen_and_check(dir.path(), &durable, 2, &model, 3, meta_written);
    goes_on(dir.path(), engine, state, index);
    scenario.teardown();
}

#[test]
fn crash_after_page_write() {
    commit_fails_at("btree::commit::after_page_write", false);
}

#[test]
fn crash_after_data_sync() {
    commit_fails_at("btree::commit::after_data_sync", false);
}

#[test]
fn crash_after_meta_write_before_meta_sync() {
    commit_fails_at("btree::commit::after_meta_write", true);
}

fn defrag_fails_at(point: &str, file_replaced: bool) {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    let mut model = Model::new();
    write_round(&engine, &mut model, 1);
    write_round(&engine, &mut model, 2);
    engine.persist().unwrap();
    let durable = model.clone();
    write_round(&engine, &mut model, 3);

    fail::cfg(point, "return").unwrap();
    let err = engine.defragment().unwrap_err();
    assert!(err.to_string().contains(point), "{err}");
    fail::remove(point);
    if file_replaced {
        assert!(matches!(engine.persist(), Err(Error::Poisoned(_))));
    } else {
        // Nothing changed: the temporary file is gone, the engine works on.
        assert!(!dir.path().join("data.btree.tmp").exists());
        assert_eq!(dump(&engine), model);
    }
    drop(engine);

    let (engine, state, index) =
        reopen_and_check(dir.path(), &durable, 2, &model, 3, file_replaced);
    goes_on(dir.path(), engine, state, index);
    scenario.teardown();
}

#[test]
fn crash_during_defragment_tmp_write() {
    defrag_fails_at("btree::defrag::after_tmp_write", false);
}

#[test]
fn crash_before_defragment_rename() {
    defrag_fails_at("btree::defrag::before_rename", false);
}

#[test]
fn crash_after_defragment_rename() {
    defrag_fails_at("btree::defrag::after_rename", true);
}

#[test]
fn leftover_defragment_tmp_file_is_ignored() {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    let mut model = Model::new();
    write_round(&engine, &mut model, 1);
    engine.persist().unwrap();
    drop(engine);
    std::fs::write(dir.path().join("data.btree.tmp"), b"half a defragmentation").unwrap();
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    assert_eq!(dump(&engine), model);
    assert!(!dir.path().join("data.btree.tmp").exists());
    assert!(dir.path().join(DATA_FILE).exists());
    scenario.teardown();
}

/// Writes that replace nodes a commit in flight has frozen but not yet
/// written must free those nodes' pages once (at the next commit): the page
/// accounting check finds a leak or a double use otherwise.
#[test]
fn writes_during_a_commit_free_its_pages_once() {
    let scenario = FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    let mut model = Model::new();
    write_round(&engine, &mut model, 1);
    engine.persist().unwrap();
    write_round(&engine, &mut model, 2);

    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let reached_tx = std::sync::Mutex::new(reached_tx);
    let go_rx = std::sync::Mutex::new(go_rx);
    fail::cfg_callback("btree::commit::after_freeze", move || {
        reached_tx.lock().unwrap().send(()).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
    })
    .unwrap();
    let committer = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.persist())
    };
    reached_rx.recv().unwrap();
    // The commit has frozen round 2's dirty nodes; rewrite them.
    write_round(&engine, &mut model, 3);
    go_tx.send(()).unwrap();
    assert_eq!(committer.join().unwrap().unwrap(), 2);
    fail::remove("btree::commit::after_freeze");
    engine.check().unwrap();
    assert_eq!(engine.persist().unwrap(), 3);
    engine.check().unwrap();
    write_round(&engine, &mut model, 4);
    assert_eq!(engine.persist().unwrap(), 4);
    engine.check().unwrap();
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), options()).unwrap();
    engine.check().unwrap();
    assert_eq!(dump(&engine), model);
    scenario.teardown();
}
