//! Direct checks of `MemoryEngine` semantics a caller relies on.

use std::ops::Bound;

use engine::memory::MemorySnapshot;
use engine::{Engine, EngineSnapshot, Error, MemoryEngine, WriteBatch};

use crate::common::{b, delete, put, scan, scan_all};

#[test]
fn engine_and_snapshots_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<MemoryEngine>();
    assert_send_sync::<MemorySnapshot>();
}

#[test]
fn empty_value_is_not_a_deletion() {
    let engine = MemoryEngine::new();
    put(&engine, b"k", b"");
    assert_eq!(engine.get(b"k").unwrap(), Some(b(b"")));
    assert_eq!(scan_all(&engine.snapshot()), vec![(b"k".to_vec(), vec![])]);
    delete(&engine, b"k");
    assert_eq!(engine.get(b"k").unwrap(), None);
    assert!(scan_all(&engine.snapshot()).is_empty());
    assert_eq!(engine.len_hint(), 0);
}

#[test]
fn last_op_on_a_key_within_a_batch_wins() {
    let engine = MemoryEngine::new();
    let mut batch = WriteBatch::new();
    batch.put(b(b"k"), b(b"1"));
    batch.delete(b(b"k"));
    batch.put(b(b"k"), b(b"2"));
    batch.put(b(b"j"), b(b"1"));
    batch.delete(b(b"j"));
    engine.write(batch).unwrap();
    assert_eq!(engine.get(b"k").unwrap(), Some(b(b"2")));
    assert_eq!(engine.get(b"j").unwrap(), None);
    assert_eq!(engine.len_hint(), 1);
}

#[test]
fn applied_index_moves_with_batches_that_set_it() {
    let engine = MemoryEngine::new();
    assert_eq!(engine.applied_index(), 0);
    assert_eq!(engine.durable_applied_index(), 0);

    let mut batch = WriteBatch::new();
    batch.put(b(b"a"), b(b"1"));
    batch.set_applied_index(7);
    engine.write(batch).unwrap();
    let at_7 = engine.snapshot();

    // A batch without an index leaves it alone.
    put(&engine, b"b", b"2");
    assert_eq!(engine.applied_index(), 7);

    // An index-only batch moves it without touching data.
    let mut batch = WriteBatch::new();
    batch.set_applied_index(9);
    engine.write(batch).unwrap();
    assert_eq!(engine.applied_index(), 9);
    assert_eq!(engine.snapshot().applied_index(), 9);
    assert_eq!(at_7.applied_index(), 7);
    assert_eq!(at_7.get(b"b").unwrap(), None);
    assert_eq!(engine.durable_applied_index(), 0);
}

#[test]
fn applied_index_regression_is_refused_and_applies_nothing() {
    let engine = MemoryEngine::new();
    let mut batch = WriteBatch::new();
    batch.put(b(b"a"), b(b"1"));
    batch.set_applied_index(5);
    engine.write(batch).unwrap();

    let mut batch = WriteBatch::new();
    batch.put(b(b"a"), b(b"2"));
    batch.put(b(b"new"), b(b"x"));
    batch.set_applied_index(4);
    let err = engine.write(batch).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err:?}");
    assert_eq!(engine.get(b"a").unwrap(), Some(b(b"1")));
    assert_eq!(engine.get(b"new").unwrap(), None);
    assert_eq!(engine.applied_index(), 5);

    // The same index again is fine (one entry applied in several batches).
    let mut batch = WriteBatch::new();
    batch.put(b(b"a"), b(b"3"));
    batch.set_applied_index(5);
    engine.write(batch).unwrap();
    assert_eq!(engine.get(b"a").unwrap(), Some(b(b"3")));
}

#[test]
fn scan_honours_bounds_and_stop() {
    let engine = MemoryEngine::new();
    for key in [&b"a"[..], b"b", b"ba", b"c", b"d"] {
        put(&engine, key, key);
    }
    delete(&engine, b"c");
    let snap = engine.snapshot();
    let keys = |pairs: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<Vec<u8>> {
        pairs.into_iter().map(|(k, _)| k).collect()
    };
    let v = |ks: &[&[u8]]| -> Vec<Vec<u8>> { ks.iter().map(|k| k.to_vec()).collect() };

    let inc = Bound::Included;
    let exc = Bound::Excluded;
    assert_eq!(
        keys(scan(&snap, inc(&b"b"[..]), inc(&b"d"[..]), None)),
        v(&[b"b", b"ba", b"d"])
    );
    assert_eq!(
        keys(scan(&snap, exc(&b"b"[..]), exc(&b"d"[..]), None)),
        v(&[b"ba"])
    );
    assert_eq!(
        keys(scan(&snap, Bound::Unbounded, exc(&b"b"[..]), None)),
        v(&[b"a"])
    );
    assert_eq!(
        keys(scan(&snap, inc(&b"bb"[..]), Bound::Unbounded, None)),
        v(&[b"d"])
    );
    assert_eq!(
        keys(scan(&snap, Bound::Unbounded, Bound::Unbounded, Some(2))),
        v(&[b"a", b"b"])
    );
    // Empty and inverted ranges visit nothing.
    assert!(scan(&snap, exc(&b"b"[..]), inc(&b"b"[..]), None).is_empty());
    assert!(scan(&snap, inc(&b"d"[..]), inc(&b"a"[..]), None).is_empty());
}

#[test]
fn snapshot_ignores_later_writes_and_clones_are_independent() {
    let engine = MemoryEngine::new();
    put(&engine, b"k", b"old");
    put(&engine, b"gone", b"x");
    let snap = engine.snapshot();
    let clone = snap.clone();
    drop(snap);

    for i in 0..100u32 {
        put(&engine, b"k", &i.to_be_bytes());
        put(&engine, b"new", &i.to_be_bytes());
    }
    delete(&engine, b"gone");

    assert_eq!(clone.get(b"k").unwrap(), Some(b(b"old")));
    assert_eq!(clone.get(b"gone").unwrap(), Some(b(b"x")));
    assert_eq!(clone.get(b"new").unwrap(), None);
    assert_eq!(
        scan_all(&clone),
        vec![
            (b"gone".to_vec(), b"x".to_vec()),
            (b"k".to_vec(), b"old".to_vec())
        ]
    );
    assert_eq!(engine.get(b"gone").unwrap(), None);
    assert_eq!(engine.get(b"k").unwrap(), Some(b(&99u32.to_be_bytes())));
}

#[test]
fn snapshot_outlives_the_engine_handle() {
    let engine = MemoryEngine::new();
    put(&engine, b"k", b"v");
    let snap = engine.snapshot();
    drop(engine);
    assert_eq!(snap.get(b"k").unwrap(), Some(b(b"v")));
}
