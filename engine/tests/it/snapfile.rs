//! Snapshot files: exact layout, round trips, and every kind of damage is
//! reported as corruption naming the file instead of being served.

use std::path::Path;

use bytes::Bytes;
use engine::snapfile::{self, SnapshotData};
use engine::{Engine, EngineSnapshot, Error, MemoryEngine, WriteBatch};

use crate::common::{b, checkpoint, file_names, put, scan_all, snap_path, write_snapfile};

/// The documented layout, built independently of the implementation.
fn encode(applied_index: u64, version: u32, entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"METCDSNP");
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&applied_index.to_le_bytes());
    for (k, v) in entries {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(v);
    }
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn small_engine() -> MemoryEngine {
    let engine = MemoryEngine::new();
    let mut batch = WriteBatch::new();
    batch.put(b(b""), b(b"empty key"));
    batch.put(b(b"alpha"), b(b"1"));
    batch.put(b(b"beta"), b(b""));
    batch.put(b(b"gamma"), b(b"three"));
    batch.set_applied_index(42);
    engine.write(batch).unwrap();
    engine
}

fn assert_corrupt(result: engine::Result<SnapshotData>, path: &Path, context: &str) {
    match result {
        Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, path, "{context}"),
        Err(other) => panic!("{context}: expected Corrupt, got {other:?}"),
        Ok(data) => panic!("{context}: damaged file was served: {data:?}"),
    }
}

#[test]
fn file_bytes_match_the_documented_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.snap");
    let len = write_snapfile(&small_engine(), &path).unwrap();
    let expected = encode(
        42,
        1,
        &[
            (b"", b"empty key"),
            (b"alpha", b"1"),
            (b"beta", b""),
            (b"gamma", b"three"),
        ],
    );
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes, expected);
    assert_eq!(len, expected.len() as u64);
}

/// The streaming writer writes the same bytes as the engine's, refuses
/// keys out of order, and leaves no file behind when not finished.
#[test]
fn a_streamed_file_is_byte_for_byte_the_engines() {
    let dir = tempfile::tempdir().unwrap();
    let (from_engine, streamed) = (dir.path().join("a.snap"), dir.path().join("b.snap"));
    write_snapfile(&small_engine(), &from_engine).unwrap();
    let mut writer = snapfile::StreamWriter::create(&streamed, 42).unwrap();
    for (k, v) in [
        (&b""[..], &b"empty key"[..]),
        (b"alpha", b"1"),
        (b"beta", b""),
        (b"gamma", b"three"),
    ] {
        writer.put(k, v).unwrap();
    }
    let len = writer.finish().unwrap();
    let bytes = std::fs::read(&streamed).unwrap();
    assert_eq!(bytes, std::fs::read(&from_engine).unwrap());
    assert_eq!(len, bytes.len() as u64);

    let unfinished = dir.path().join("c.snap");
    let mut writer = snapfile::StreamWriter::create(&unfinished, 1).unwrap();
    writer.put(b"b", b"1").unwrap();
    assert!(writer.put(b"b", b"2").is_err(), "a repeated key");
    assert!(writer.put(b"a", b"3").is_err(), "a key going back");
    drop(writer);
    assert!(!unfinished.exists(), "an unfinished file was left behind");
}

#[test]
fn empty_snapshot_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.snap");
    let len = write_snapfile(&MemoryEngine::new(), &path).unwrap();
    assert_eq!(len, 20 + 12);
    let data = snapfile::read(&path).unwrap();
    assert_eq!(data, SnapshotData::default());
}

#[test]
fn large_snapshot_round_trips_across_chunks_and_buffers() {
    let engine = MemoryEngine::new();
    let mut expected = Vec::new();
    // More records than one scan chunk, values of many sizes, and values
    // bigger than a write buffer so records straddle buffer boundaries.
    for i in 0..10_000u32 {
        let key = format!("key/{i:08}").into_bytes();
        let value = vec![(i % 251) as u8; (i as usize * 37) % 300];
        put(&engine, &key, &value);
        expected.push((Bytes::from(key), Bytes::from(value)));
    }
    for (i, size) in [(0u8, 300_000usize), (1, 1 << 20), (2, 4096)] {
        let key = vec![0xff, i];
        let value: Vec<u8> = (0..size).map(|j| (j % 253) as u8).collect();
        put(&engine, &key, &value);
        expected.push((Bytes::from(key), Bytes::from(value)));
    }
    let mut batch = WriteBatch::new();
    batch.set_applied_index(123_456_789_012);
    engine.write(batch).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.snap");
    let len = write_snapfile(&engine, &path).unwrap();
    assert_eq!(len, std::fs::metadata(&path).unwrap().len());

    let data = snapfile::read(&path).unwrap();
    assert_eq!(data.applied_index, 123_456_789_012);
    assert_eq!(data.entries.len(), expected.len());
    assert!(data.entries == expected, "entries differ");
}

#[test]
fn every_flipped_byte_is_reported_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.snap");
    write_snapfile(&small_engine(), &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged.snap");
    for offset in 0..good.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bytes = good.clone();
            bytes[offset] ^= mask;
            std::fs::write(&damaged, &bytes).unwrap();
            assert_corrupt(
                snapfile::read(&damaged),
                &damaged,
                &format!("byte {offset} ^ {mask:#x}"),
            );
        }
    }
}

#[test]
fn every_truncation_and_any_trailing_garbage_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.snap");
    write_snapfile(&small_engine(), &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let damaged = dir.path().join("damaged.snap");
    for len in 0..good.len() {
        std::fs::write(&damaged, &good[..len]).unwrap();
        assert_corrupt(
            snapfile::read(&damaged),
            &damaged,
            &format!("truncated to {len}"),
        );
    }
    for extra in [&[0u8][..], &[0; 4096], b"garbage"] {
        let mut bytes = good.clone();
        bytes.extend_from_slice(extra);
        std::fs::write(&damaged, &bytes).unwrap();
        assert_corrupt(
            snapfile::read(&damaged),
            &damaged,
            &format!("{} trailing bytes", extra.len()),
        );
    }
}

#[test]
fn structural_errors_are_caught_even_with_a_valid_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.snap");
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("future version", encode(1, 2, &[(b"a", b"1")]), 8),
        (
            "keys out of order",
            encode(1, 1, &[(b"b", b"1"), (b"a", b"2")]),
            30,
        ),
        (
            "duplicate keys",
            encode(1, 1, &[(b"a", b"1"), (b"a", b"2")]),
            30,
        ),
        (
            "count too high",
            {
                let mut bytes = encode(1, 1, &[(b"a", b"1")]);
                let n = bytes.len();
                bytes[n - 12..n - 4].copy_from_slice(&2u64.to_le_bytes());
                let crc = crc32c::crc32c(&bytes[..n - 4]);
                bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
                bytes
            },
            30,
        ),
    ];
    for (name, bytes, offset) in cases {
        std::fs::write(&path, &bytes).unwrap();
        match snapfile::read(&path) {
            Err(Error::Corrupt {
                path: p, offset: o, ..
            }) => {
                assert_eq!(p, path, "{name}");
                assert_eq!(o, offset, "{name}");
            }
            other => panic!("{name}: expected Corrupt, got {other:?}"),
        }
    }
    // And the crafted encoder itself produces readable files.
    std::fs::write(&path, encode(9, 1, &[(b"a", b"1"), (b"b", b"")])).unwrap();
    let data = snapfile::read(&path).unwrap();
    assert_eq!(data.applied_index, 9);
    assert_eq!(data.entries, vec![(b(b"a"), b(b"1")), (b(b"b"), b(b""))]);
}

#[test]
fn missing_file_is_an_io_error_not_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let err = snapfile::read(&dir.path().join("nope.snap")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

#[test]
fn checkpoint_then_open_restores_state_and_keeps_only_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    let engine = small_engine();
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 42);
    assert_eq!(engine.durable_applied_index(), 42);

    let mut batch = WriteBatch::new();
    batch.delete(b(b"alpha"));
    batch.put(b(b"delta"), b(b"4"));
    batch.set_applied_index(50);
    engine.write(batch).unwrap();
    assert_eq!(engine.durable_applied_index(), 42);
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 50);
    assert_eq!(engine.durable_applied_index(), 50);
    // Two of four keys changed: a delta after the base.
    assert_eq!(
        file_names(dir.path()),
        vec![
            "000000000000002a-0000000000000032.delta",
            "000000000000002a.snap"
        ]
    );

    // Not in any checkpoint: gone after reopening.
    put(&engine, b"lost", b"x");

    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(reopened.applied_index(), 50);
    assert_eq!(reopened.durable_applied_index(), 50);
    assert_eq!(reopened.len_hint(), 4);
    assert_eq!(
        scan_all(&reopened.snapshot()),
        vec![
            (b"".to_vec(), b"empty key".to_vec()),
            (b"beta".to_vec(), b"".to_vec()),
            (b"delta".to_vec(), b"4".to_vec()),
            (b"gamma".to_vec(), b"three".to_vec()),
        ]
    );
    // The reopened engine keeps working from there.
    let mut batch = WriteBatch::new();
    batch.put(b(b"after"), b(b"1"));
    batch.set_applied_index(51);
    reopened.write(batch).unwrap();
    assert_eq!(reopened.get(b"after").unwrap(), Some(b(b"1")));
    assert_eq!(reopened.snapshot().applied_index(), 51);
}

#[test]
fn open_of_a_new_dir_is_empty() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("a/b");
    let engine = MemoryEngine::open(&sub).unwrap();
    assert!(sub.is_dir());
    assert_eq!(engine.applied_index(), 0);
    assert_eq!(engine.durable_applied_index(), 0);
    assert!(scan_all(&engine.snapshot()).is_empty());
}

#[test]
fn open_deletes_tmp_leftovers_and_ignores_foreign_files() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(&small_engine(), dir.path()).unwrap();
    // An interrupted later checkpoint, plus files that are not ours.
    std::fs::write(dir.path().join("0000000000000063.snap.tmp"), b"half").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"hi").unwrap();
    std::fs::write(dir.path().join("63.snap"), b"bad name").unwrap();

    let engine = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(engine.applied_index(), 42);
    assert_eq!(engine.get(b"alpha").unwrap(), Some(b(b"1")));
    assert_eq!(
        file_names(dir.path()),
        vec!["000000000000002a.snap", "63.snap", "notes.txt"]
    );
}

#[test]
fn open_refuses_a_corrupt_newest_snapshot_even_if_an_older_one_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let engine = small_engine();
    checkpoint(&engine, dir.path()).unwrap();
    let older = std::fs::read(snap_path(dir.path(), 42)).unwrap();

    // More bytes change than the store holds: a full checkpoint, not a delta.
    let mut batch = WriteBatch::new();
    batch.delete(b(b"alpha"));
    for key in ["zeta", "eta", "theta", "iota", "kappa"] {
        batch.put(b(key.as_bytes()), Bytes::from(vec![b'6'; 200]));
    }
    batch.set_applied_index(60);
    engine.write(batch).unwrap();
    checkpoint(&engine, dir.path()).unwrap();
    assert_eq!(file_names(dir.path()), vec!["000000000000003c.snap"]);
    // Put the valid older file back, then damage the newest.
    std::fs::write(snap_path(dir.path(), 42), older).unwrap();
    let newest = snap_path(dir.path(), 60);
    let mut bytes = std::fs::read(&newest).unwrap();
    bytes[25] ^= 0x04;
    std::fs::write(&newest, bytes).unwrap();

    match MemoryEngine::open(dir.path()) {
        Err(err @ Error::Corrupt { .. }) => {
            let Error::Corrupt { ref path, .. } = err else {
                unreachable!()
            };
            assert_eq!(path, &newest);
            // Operators see the file in the message.
            assert!(err.to_string().contains("000000000000003c.snap"), "{err}");
        }
        Err(other) => panic!("expected Corrupt, got {other:?}"),
        Ok(engine) => panic!(
            "opened despite corruption, at applied index {}",
            engine.applied_index()
        ),
    }
}

#[test]
fn open_refuses_a_snapshot_whose_name_disagrees_with_its_header() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint(&small_engine(), dir.path()).unwrap();
    std::fs::rename(snap_path(dir.path(), 42), snap_path(dir.path(), 43)).unwrap();
    match MemoryEngine::open(dir.path()) {
        Err(Error::Corrupt { path, .. }) => assert_eq!(path, snap_path(dir.path(), 43)),
        other => panic!(
            "expected Corrupt, got {:?}",
            other.map(|e| e.applied_index())
        ),
    }
}

#[test]
fn snapshot_of_reopened_engine_round_trips() {
    // Data loaded from a file can itself be checkpointed again unchanged.
    let dir = tempfile::tempdir().unwrap();
    let engine = small_engine();
    checkpoint(&engine, dir.path()).unwrap();
    let first = std::fs::read(snap_path(dir.path(), 42)).unwrap();
    let reopened = MemoryEngine::open(dir.path()).unwrap();
    let other = tempfile::tempdir().unwrap();
    checkpoint(&reopened, other.path()).unwrap();
    let second = std::fs::read(snap_path(other.path(), 42)).unwrap();
    assert_eq!(first, second);
    assert_eq!(reopened.snapshot().applied_index(), 42);
}

/// A store of 100 keys: a base checkpoint at applied index 1.
fn store_with_base(dir: &Path) -> MemoryEngine {
    let engine = MemoryEngine::new();
    let mut batch = WriteBatch::new();
    for i in 0..100u32 {
        batch.put(
            b(format!("key{i:03}").as_bytes()),
            b(format!("v{i}").as_bytes()),
        );
    }
    batch.set_applied_index(1);
    engine.write(batch).unwrap();
    assert_eq!(checkpoint(&engine, dir).unwrap(), 1);
    engine
}

/// Puts `key` = `value` and deletes `gone`, at applied index `index`.
fn change(engine: &MemoryEngine, index: u64, key: &str, value: &str, gone: &str) {
    let mut batch = WriteBatch::new();
    batch.put(b(key.as_bytes()), b(value.as_bytes()));
    batch.delete(b(gone.as_bytes()));
    batch.set_applied_index(index);
    engine.write(batch).unwrap();
}

/// After a base, a checkpoint writes only what changed (a delta chained to
/// the file before it), and an open reads the base and its deltas back to
/// exactly the state checkpointed; once the chain has MAX_DELTAS deltas the
/// next checkpoint is full again and the old chain is deleted.
#[test]
fn deltas_chain_after_a_base_and_reopen_to_the_checkpointed_state() {
    let dir = tempfile::tempdir().unwrap();
    let engine = store_with_base(dir.path());
    let base_len = std::fs::metadata(snap_path(dir.path(), 1)).unwrap().len();
    change(&engine, 2, "key000", "changed", "key001");
    change(&engine, 3, "new", "x", "key002");
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 3);
    assert_eq!(engine.durable_applied_index(), 3);
    let delta = dir.path().join("0000000000000001-0000000000000003.delta");
    assert_eq!(
        file_names(dir.path()),
        vec![
            "0000000000000001-0000000000000003.delta",
            "0000000000000001.snap"
        ]
    );
    // Two puts and two deletions: far smaller than the base.
    assert!(std::fs::metadata(&delta).unwrap().len() * 4 < base_len);
    change(&engine, 4, "key001", "back", "new");
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 4);
    // Not in any checkpoint: gone after reopening.
    change(&engine, 5, "lost", "x", "key050");

    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(reopened.applied_index(), 4);
    assert_eq!(reopened.durable_applied_index(), 4);
    let mut want = scan_all(&store_with_base(tempfile::tempdir().unwrap().path()).snapshot());
    want.retain(|(k, _)| k != b"key002");
    want[0].1 = b"changed".to_vec();
    want[1].1 = b"back".to_vec();
    assert_eq!(scan_all(&reopened.snapshot()), want);
    assert_eq!(reopened.len_hint(), 99);

    // The reopened engine adds to the same chain, up to MAX_DELTAS deltas.
    for index in 5..(5 + engine::memory::MAX_DELTAS as u64 - 2) {
        change(&reopened, index, "key010", &format!("v{index}"), "none");
        assert_eq!(checkpoint(&reopened, dir.path()).unwrap(), index);
    }
    let names = file_names(dir.path());
    assert_eq!(names.len(), 1 + engine::memory::MAX_DELTAS, "{names:?}");
    let index = 5 + engine::memory::MAX_DELTAS as u64 - 2;
    change(&reopened, index, "key010", "last", "none");
    assert_eq!(checkpoint(&reopened, dir.path()).unwrap(), index);
    assert_eq!(file_names(dir.path()), vec![format!("{index:016x}.snap")]);
    let again = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(scan_all(&again.snapshot()), scan_all(&reopened.snapshot()));
}

/// A damaged delta, or a delta missing from the middle of the chain, stops
/// the open with the file named: never an older state.
#[test]
fn a_damaged_or_missing_delta_refuses_to_open() {
    for damage in ["flip a byte", "remove the first delta"] {
        let dir = tempfile::tempdir().unwrap();
        let engine = store_with_base(dir.path());
        change(&engine, 2, "key000", "changed", "key001");
        checkpoint(&engine, dir.path()).unwrap();
        change(&engine, 3, "key003", "changed", "key004");
        checkpoint(&engine, dir.path()).unwrap();
        let first = dir.path().join("0000000000000001-0000000000000002.delta");
        let second = dir.path().join("0000000000000002-0000000000000003.delta");
        let named = if damage == "flip a byte" {
            let mut bytes = std::fs::read(&second).unwrap();
            bytes[25] ^= 0x10;
            std::fs::write(&second, bytes).unwrap();
            second
        } else {
            std::fs::remove_file(&first).unwrap();
            second
        };
        match MemoryEngine::open(dir.path()) {
            Err(err @ Error::Corrupt { .. }) => {
                let Error::Corrupt { ref path, .. } = err else {
                    unreachable!()
                };
                assert_eq!(path, &named, "{damage}");
                assert!(
                    err.to_string()
                        .contains("0000000000000002-0000000000000003.delta"),
                    "{err}"
                );
            }
            Err(other) => panic!("{damage}: expected Corrupt, got {other:?}"),
            Ok(e) => panic!("{damage}: opened at applied index {}", e.applied_index()),
        }
    }
}

/// Deltas older than the newest base (a crash after a full checkpoint,
/// before it deleted the old chain) and interrupted delta writes are
/// removed at open; the base's state is what opens.
#[test]
fn superseded_deltas_and_tmp_leftovers_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let engine = store_with_base(dir.path());
    std::fs::write(
        dir.path().join("0000000000000000-0000000000000001.delta"),
        b"old",
    )
    .unwrap();
    std::fs::write(
        dir.path()
            .join("0000000000000001-0000000000000009.delta.tmp"),
        b"half",
    )
    .unwrap();
    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(file_names(dir.path()), vec!["0000000000000001.snap"]);
    assert_eq!(scan_all(&reopened.snapshot()), scan_all(&engine.snapshot()));
    // Deltas with no base at all are not this engine's state.
    std::fs::remove_file(snap_path(dir.path(), 1)).unwrap();
    std::fs::write(
        dir.path().join("0000000000000001-0000000000000002.delta"),
        b"x",
    )
    .unwrap();
    assert!(matches!(
        MemoryEngine::open(dir.path()),
        Err(Error::Corrupt { .. })
    ));
}

/// After a delta checkpoint fails, the next checkpoint is full: nothing
/// written before the failure is missing, and no delta follows a file the
/// failed one may have left.
#[test]
fn a_failed_delta_checkpoint_is_followed_by_a_full_one() {
    let dir = tempfile::tempdir().unwrap();
    let engine = store_with_base(dir.path());
    change(&engine, 2, "key000", "changed", "key001");
    // The delta's tmp name taken by a directory: its write fails.
    let blocker = dir
        .path()
        .join("0000000000000001-0000000000000002.delta.tmp");
    std::fs::create_dir(&blocker).unwrap();
    assert!(checkpoint(&engine, dir.path()).is_err());
    std::fs::remove_dir(&blocker).unwrap();
    change(&engine, 3, "key005", "changed", "key006");
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 3);
    assert_eq!(file_names(dir.path()), vec!["0000000000000003.snap"]);
    // And deltas again after it.
    change(&engine, 4, "key007", "changed", "key008");
    assert_eq!(checkpoint(&engine, dir.path()).unwrap(), 4);
    assert_eq!(
        file_names(dir.path()),
        vec![
            "0000000000000003-0000000000000004.delta",
            "0000000000000003.snap"
        ]
    );
    let reopened = MemoryEngine::open(dir.path()).unwrap();
    assert_eq!(scan_all(&reopened.snapshot()), scan_all(&engine.snapshot()));
    assert_eq!(reopened.get(b"key000").unwrap(), Some(b(b"changed")));
    assert_eq!(reopened.get(b"key001").unwrap(), None);
}
