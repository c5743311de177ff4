//! `Engine::size`, what the server's backend quota and etcd's `dbSize` are
//! built on: it follows the data each engine holds.

use bytes::Bytes;
use engine::btree::{BtreeEngine, BtreeOptions};
use engine::lsm::{LsmEngine, LsmOptions};
use engine::{Engine, MemoryEngine, WriteBatch};

fn batch(index: u64, ops: &[(&str, Option<usize>)]) -> WriteBatch {
    let mut b = WriteBatch::new();
    for (key, value) in ops {
        let key = Bytes::copy_from_slice(key.as_bytes());
        match value {
            Some(n) => b.put(key, Bytes::from(vec![b'v'; *n])),
            None => b.delete(key),
        }
    }
    b.set_applied_index(index);
    b
}

#[test]
fn memory_size_is_the_latest_state_whatever_snapshots_hold() {
    let e = MemoryEngine::new();
    assert_eq!(e.size().total_bytes, 0);
    e.write(batch(1, &[("a", Some(1000)), ("b", Some(10))]))
        .unwrap();
    let two = e.size().total_bytes;
    assert!(two >= 1012, "{two}");
    // A snapshot pins the old version; the size is the latest state's.
    let pinned = e.snapshot();
    e.write(batch(2, &[("a", Some(10))])).unwrap();
    let shrunk = e.size().total_bytes;
    assert_eq!(two - shrunk, 990, "overwrite replaces the value's bytes");
    // A key twice in one batch counts once (last wins).
    let per_key_overhead = (two - (1 + 1000 + 1 + 10)) / 2;
    e.write(batch(3, &[("c", Some(500)), ("c", Some(50))]))
        .unwrap();
    let with_c = e.size().total_bytes;
    assert_eq!(with_c - shrunk, 1 + 50 + per_key_overhead);
    e.write(batch(4, &[("c", None), ("a", None), ("b", None)]))
        .unwrap();
    assert_eq!(e.size().total_bytes, 0, "before deletes: {with_c}");
    drop(pinned);
    // A store rebuilt from a snapshot of it reports the same size.
    e.write(batch(5, &[("x", Some(300))])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    crate::common::checkpoint(&e, dir.path()).unwrap();
    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(reopened.size(), e.size());
    assert_eq!(e.size().in_use_bytes, e.size().total_bytes);
}

#[test]
fn btree_size_counts_unpersisted_puts_until_a_commit_measures_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap();
    let fresh = e.size().unwrap().file_bytes;
    assert_eq!(Engine::size(&e).total_bytes, fresh);
    for i in 0..20u64 {
        e.write(batch(i + 1, &[(&format!("k{i}"), Some(50_000))]))
            .unwrap();
    }
    let before = Engine::size(&e).total_bytes;
    assert!(before >= fresh + 20 * 50_000, "{before}");
    e.persist().unwrap();
    let committed = Engine::size(&e);
    assert_eq!(committed.total_bytes, e.size().unwrap().file_bytes);
    assert!(committed.total_bytes >= 20 * 50_000);
    // Deleting all but one and defragmenting gives the room back.
    let deletes: Vec<(String, Option<usize>)> = (1..20).map(|i| (format!("k{i}"), None)).collect();
    let deletes: Vec<(&str, Option<usize>)> =
        deletes.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    e.write(batch(21, &deletes)).unwrap();
    e.defragment().unwrap();
    let after = Engine::size(&e).total_bytes;
    assert!(after < 4 * 50_000, "{after}");
    assert_eq!(after, e.size().unwrap().file_bytes);
}

#[test]
fn lsm_size_counts_memtables_and_tables() {
    let dir = tempfile::tempdir().unwrap();
    let e = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap();
    assert_eq!(Engine::size(&e).total_bytes, 0);
    e.write(batch(1, &[("a", Some(100_000))])).unwrap();
    let in_memtable = Engine::size(&e).total_bytes;
    assert!(in_memtable >= 100_000, "{in_memtable}");
    e.persist().unwrap();
    e.wait_idle();
    let in_table = Engine::size(&e).total_bytes;
    assert!(in_table >= 100_000, "a flushed table holds it: {in_table}");
}

#[test]
fn lsm_compact_all_drops_what_was_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let e = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i:02}")).collect();
    for (i, k) in keys.iter().enumerate() {
        e.write(batch(i as u64 + 1, &[(k, Some(20_000))])).unwrap();
        if i % 10 == 9 {
            // Several tables, some moved down by background compaction.
            e.persist().unwrap();
        }
    }
    e.wait_idle();
    let full = Engine::size(&e).total_bytes;
    assert!(full >= 40 * 20_000, "{full}");
    let deletes: Vec<(&str, Option<usize>)> =
        keys[1..].iter().map(|k| (k.as_str(), None)).collect();
    e.write(batch(41, &deletes)).unwrap();
    e.compact_all().unwrap();
    let after = Engine::size(&e).total_bytes;
    assert!(
        after < 3 * 20_000,
        "one 20 KB value left, yet {after} bytes"
    );
    // What is left reads back, what was deleted stays deleted.
    assert_eq!(e.get(b"k00").unwrap().map(|v| v.len()), Some(20_000));
    assert_eq!(e.get(b"k01").unwrap(), None);
    let counts = e.table_counts();
    assert_eq!(counts[0], 0, "level 0 merged down: {counts:?}");
    // A reopened engine sees the same.
    drop(e);
    let e = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap();
    assert_eq!(e.get(b"k00").unwrap().map(|v| v.len()), Some(20_000));
    assert_eq!(e.get(b"k39").unwrap(), None);
    // Everything now sits in the deepest level: a second full compaction
    // rewrites that level in place.
    e.write(batch(42, &[("k00", None)])).unwrap();
    e.compact_all().unwrap();
    assert_eq!(e.get(b"k00").unwrap(), None);
    assert!(Engine::size(&e).total_bytes < 20_000);
}
