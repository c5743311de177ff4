//! Old versions are collected, but never while a snapshot can see them.

use engine::{Engine, EngineSnapshot, MemoryEngine, WriteBatch};

use crate::common::{b, delete, put};

#[test]
fn overwrites_without_snapshots_keep_one_version_per_key() {
    let engine = MemoryEngine::new();
    let keys: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
    for i in 0..5_000u32 {
        let mut batch = WriteBatch::new();
        batch.put(b(keys[i as usize % 4]), b(&i.to_be_bytes()));
        batch.put(b(keys[(i as usize + 1) % 4]), b(&i.to_be_bytes()));
        engine.write(batch).unwrap();
        assert!(
            engine.internal_entry_count() <= keys.len(),
            "after write {i}: {} internal entries for {} keys",
            engine.internal_entry_count(),
            keys.len()
        );
    }
    assert_eq!(engine.internal_entry_count(), 4);
    for key in keys {
        delete(&engine, key);
    }
    // Tombstones nobody needs are gone too.
    assert_eq!(engine.internal_entry_count(), 0);
    assert_eq!(engine.len_hint(), 0);
}

#[test]
fn held_snapshot_keeps_its_versions_until_released() {
    let engine = MemoryEngine::new();
    put(&engine, b"hot", b"original");
    put(&engine, b"doomed", b"alive");
    let snap = engine.snapshot();

    for i in 0..1_000u32 {
        put(&engine, b"hot", &i.to_be_bytes());
    }
    delete(&engine, b"doomed");
    assert_eq!(snap.get(b"hot").unwrap(), Some(b(b"original")));
    assert_eq!(snap.get(b"doomed").unwrap(), Some(b(b"alive")));
    assert_eq!(engine.get(b"doomed").unwrap(), None);
    // Versions the snapshot cannot see were collected along the way: only
    // its own, the newest, and the tombstone remain.
    assert!(
        engine.internal_entry_count() <= 4,
        "{} internal entries",
        engine.internal_entry_count()
    );

    drop(snap);
    engine.collect_garbage();
    assert_eq!(engine.internal_entry_count(), 1);
    assert_eq!(engine.get(b"hot").unwrap(), Some(b(&999u32.to_be_bytes())));
}

#[test]
fn backlog_from_a_released_snapshot_drains_through_later_writes() {
    let engine = MemoryEngine::new();
    for i in 0..500u32 {
        put(&engine, &i.to_be_bytes(), b"v1");
    }
    let snap = engine.snapshot();
    for i in 0..500u32 {
        put(&engine, &i.to_be_bytes(), b"v2");
    }
    assert_eq!(engine.internal_entry_count(), 1_000);
    drop(snap);

    // No explicit collect: ordinary writes elsewhere drain the backlog.
    for i in 0..100u32 {
        put(&engine, b"elsewhere", &i.to_be_bytes());
    }
    assert_eq!(engine.internal_entry_count(), 501);
}

#[test]
fn releasing_a_middle_snapshot_keeps_the_others_exact() {
    let engine = MemoryEngine::new();
    let mut snaps = Vec::new();
    for round in 0..5u32 {
        put(&engine, b"k", &round.to_be_bytes());
        if round % 2 == 0 {
            put(&engine, b"flip", &round.to_be_bytes());
        } else {
            delete(&engine, b"flip");
        }
        snaps.push((round, engine.snapshot()));
        for noise in 0..50u32 {
            put(&engine, b"k", &(1_000 + noise).to_be_bytes());
        }
        put(&engine, b"k", &round.to_be_bytes());
    }
    // Release every other snapshot, then churn and collect.
    let kept: Vec<_> = snaps
        .into_iter()
        .filter(|(round, _)| round % 2 == 0)
        .collect();
    for i in 0..200u32 {
        put(&engine, b"k", &i.to_be_bytes());
        delete(&engine, b"flip");
    }
    engine.collect_garbage();
    for (round, snap) in &kept {
        assert_eq!(snap.get(b"k").unwrap(), Some(b(&round.to_be_bytes())));
        assert_eq!(
            snap.get(b"flip").unwrap(),
            Some(b(&round.to_be_bytes())),
            "round {round}"
        );
    }
    drop(kept);
    engine.collect_garbage();
    assert_eq!(engine.internal_entry_count(), 1);
}

#[test]
fn snapshot_applied_index_survives_gc() {
    let engine = MemoryEngine::new();
    let mut batch = WriteBatch::new();
    batch.put(b(b"k"), b(b"v"));
    batch.set_applied_index(3);
    engine.write(batch).unwrap();
    let snap = engine.snapshot();
    for i in 4..100u64 {
        let mut batch = WriteBatch::new();
        batch.put(b(b"k"), b(&i.to_be_bytes()));
        batch.set_applied_index(i);
        engine.write(batch).unwrap();
    }
    assert_eq!(snap.applied_index(), 3);
    assert_eq!(snap.get(b"k").unwrap(), Some(b(b"v")));
}
