//! A writer thread and reader threads at the same time: batches must be
//! atomic, snapshots stable, and reads never go back in time.
// `is_multiple_of` is newer than the workspace's rust-version (1.85).
#![allow(clippy::manual_is_multiple_of)]

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use bytes::Bytes;
use engine::memory::MemorySnapshot;
use engine::{snapfile, Engine, EngineSnapshot, MemoryEngine, WriteBatch};

use crate::common::{b, on_executor, scan_all};

const BATCHES: u64 = 20_000;

fn decode(value: Option<Bytes>) -> u64 {
    match value {
        None => 0,
        Some(v) => u64::from_be_bytes(v.as_ref().try_into().unwrap()),
    }
}

/// Batch `i` writes `i` to both `a` and `b`, toggles `c` and sets applied
/// index `i`; so in any consistent state a == b == applied index, and `c`
/// exists exactly when that number is even.
fn batch(i: u64) -> WriteBatch {
    let mut batch = WriteBatch::new();
    batch.put(b(b"a"), b(&i.to_be_bytes()));
    if i % 2 == 0 {
        batch.put(b(b"c"), b(&i.to_be_bytes()));
    } else {
        batch.delete(b(b"c"));
    }
    batch.put(b(b"b"), b(&i.to_be_bytes()));
    batch.set_applied_index(i);
    batch
}

fn spawn_writer(engine: &MemoryEngine, done: &Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let engine = engine.clone();
    let done = Arc::clone(done);
    thread::spawn(move || {
        for i in 1..=BATCHES {
            engine.write(batch(i)).unwrap();
        }
        done.store(true, Ordering::Release);
    })
}

/// Checks the batch invariant on `snap`; returns the number it shows.
fn check_consistent(snap: &MemorySnapshot) -> u64 {
    let a = decode(snap.get(b"a").unwrap());
    let b_ = decode(snap.get(b"b").unwrap());
    let c = snap.get(b"c").unwrap();
    assert_eq!(a, b_, "snapshot saw half a batch");
    assert_eq!(
        a,
        snap.applied_index(),
        "applied index out of step with data"
    );
    assert_eq!(c.is_some(), a % 2 == 0 && a > 0, "c out of step at {a}");
    let scanned = scan_all(snap);
    let expected_keys: Vec<&[u8]> = if a == 0 {
        vec![]
    } else if a % 2 == 0 {
        vec![b"a", b"b", b"c"]
    } else {
        vec![b"a", b"b"]
    };
    let keys: Vec<&[u8]> = scanned.iter().map(|(k, _)| k.as_slice()).collect();
    assert_eq!(keys, expected_keys, "scan at {a}");
    for (_, v) in &scanned {
        assert_eq!(v.as_slice(), &a.to_be_bytes()[..], "scan value at {a}");
    }
    a
}

#[test]
fn snapshots_see_whole_batches_while_a_writer_runs() {
    let engine = MemoryEngine::new();
    let done = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&engine, &done);

    let readers: Vec<_> = (0..2)
        .map(|_| {
            let engine = engine.clone();
            let done = Arc::clone(&done);
            thread::spawn(move || {
                // Some snapshots are held across many later writes and
                // re-checked, so GC runs while they are pinned.
                let mut held: VecDeque<(u64, MemorySnapshot)> = VecDeque::new();
                let mut last_seen = 0;
                let mut last_get = 0;
                let mut rounds = 0u64;
                while !done.load(Ordering::Acquire) || rounds < 10 {
                    rounds += 1;
                    let snap = engine.snapshot();
                    let seen = check_consistent(&snap);
                    assert!(
                        seen >= last_seen,
                        "snapshots went back: {seen} < {last_seen}"
                    );
                    last_seen = seen;

                    // Unregistered point reads: never backwards, and `b`
                    // (written with `a`) read after `a` is never older.
                    let a = decode(engine.get(b"a").unwrap());
                    let b_ = decode(engine.get(b"b").unwrap());
                    assert!(
                        a >= last_get && b_ >= a,
                        "get went back: {last_get} {a} {b_}"
                    );
                    last_get = b_;

                    if rounds % 16 == 0 {
                        held.push_back((seen, snap));
                        if held.len() > 8 {
                            held.pop_front();
                        }
                    }
                    for (at, old) in &held {
                        assert_eq!(check_consistent(old), *at, "held snapshot changed");
                    }
                }
                rounds
            })
        })
        .collect();

    writer.join().unwrap();
    for reader in readers {
        let rounds = reader.join().unwrap();
        assert!(rounds > 10);
    }
    assert_eq!(engine.applied_index(), BATCHES);
    engine.collect_garbage();
    // One version per live key: a, b, and c if the last batch was even.
    assert_eq!(engine.internal_entry_count(), engine.len_hint());
    assert_eq!(engine.len_hint(), if BATCHES % 2 == 0 { 3 } else { 2 });
}

#[test]
fn checkpoints_taken_during_writes_are_consistent() {
    let engine = MemoryEngine::new();
    let dir = tempfile::tempdir().unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&engine, &done);

    let checker = engine.clone();
    let path = dir.path().to_path_buf();
    let written = on_executor(move || async move {
        let mut indexes = Vec::new();
        for _ in 0..8 {
            // Direct snapfile writes race the writer thread; each file must
            // still be one batch-consistent state.
            let snap = checker.snapshot();
            let file = path.join("racing.snap");
            snapfile::write(&snap, &file).await.unwrap();
            let data = snapfile::read(&file).unwrap();
            assert_eq!(data.applied_index, snap.applied_index());
            let mut got = Vec::new();
            snap.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
                got.push((Bytes::copy_from_slice(k), v.clone()));
                engine::Scan::Continue
            })
            .unwrap();
            assert_eq!(data.entries, got);
            if let Some((_, a)) = data.entries.first() {
                assert_eq!(decode(Some(a.clone())), data.applied_index);
            }

            let index = checker.checkpoint(&path).await.unwrap();
            indexes.push(index);
        }
        indexes
    });
    writer.join().unwrap();

    assert!(written.windows(2).all(|w| w[0] <= w[1]), "{written:?}");
    let last = *written.last().unwrap();
    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(reopened.applied_index(), last);
    assert_eq!(reopened.durable_applied_index(), last);
    let a = decode(reopened.get(b"a").unwrap());
    assert_eq!(a, last);
    assert_eq!(decode(reopened.get(b"b").unwrap()), last);
}

/// The checkpoint thread must not hold the caller's blocking pool: glommio
/// runs renames, removes and truncates there, and a WAL segment roll (a
/// rename) on the Raft core waited for a whole checkpoint when the caller
/// joined the thread from that pool.
#[test]
fn a_rename_during_a_checkpoint_does_not_wait_for_it() {
    let engine = MemoryEngine::new();
    fill_16_mib(|batch| engine.write(batch).unwrap());
    let snap = engine.snapshot();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("big.snap");
    let (renamed_first, len) = rename_beside_checkpoint(dir.path(), move || async move {
        engine::memory::write_snapshot_file_off_core(snap, &target, engine::any::Urgency::Waited)
            .await
    });
    assert!(renamed_first, "the rename waited for the checkpoint");
    assert!(len.unwrap() > 16 << 20);
}

/// The same for the btree and lsm engines, whose checkpoint (a persist)
/// runs on a worker thread of its own.
#[test]
fn a_rename_during_a_disk_engine_persist_does_not_wait_for_it() {
    for kind in [engine::any::EngineKind::Btree, engine::any::EngineKind::Lsm] {
        let dir = tempfile::tempdir().unwrap();
        let engine_dir = engine::any::EngineDir::open(&dir.path().join("db"), kind).unwrap();
        let db = engine_dir.open_engine().unwrap();
        fill_16_mib(|batch| db.write(batch).unwrap());
        let (renamed_first, index) = rename_beside_checkpoint(dir.path(), move || async move {
            engine_dir.checkpoint(&db).await
        });
        assert!(renamed_first, "{kind:?}: the rename waited for the persist");
        assert_eq!(index.unwrap(), 16, "{kind:?}");
    }
}

/// 16 batches of 1024 puts of 1 KiB, applied indexes 1..=16.
fn fill_16_mib(mut write: impl FnMut(WriteBatch)) {
    let value = Bytes::from(vec![7u8; 1024]);
    for chunk in 0..16u64 {
        let mut batch = WriteBatch::new();
        for i in 0..1024 {
            batch.put(Bytes::from(format!("key-{chunk:03}-{i:05}")), value.clone());
        }
        batch.set_applied_index(chunk + 1);
        write(batch);
    }
}

/// Starts `checkpoint` as a task, then renames a file in `dir` with glommio
/// on the same executor. Whether the rename finished while the checkpoint
/// was still running, and the checkpoint's result.
fn rename_beside_checkpoint<T, F, Fut>(dir: &std::path::Path, checkpoint: F) -> (bool, T)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    let dir = dir.to_path_buf();
    on_executor(move || async move {
        let finished = std::rc::Rc::new(std::cell::Cell::new(false));
        let flag = finished.clone();
        let task = glommio::spawn_local(async move {
            let result = checkpoint().await;
            flag.set(true);
            result
        });
        let file = glommio::io::DmaFile::create(dir.join("a")).await.unwrap();
        file.rename(dir.join("b")).await.unwrap();
        file.close().await.unwrap();
        let renamed_first = !finished.get();
        (renamed_first, task.await)
    })
}
