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
fn checkpoint_then_open_restores_state_and_keeps_only_the_newest_file() {
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
    assert_eq!(file_names(dir.path()), vec!["0000000000000032.snap"]);

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

    let mut batch = WriteBatch::new();
    batch.put(b(b"zeta"), b(b"6"));
    batch.set_applied_index(60);
    engine.write(batch).unwrap();
    checkpoint(&engine, dir.path()).unwrap();
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
