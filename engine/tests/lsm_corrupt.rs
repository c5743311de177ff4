//! Corruption and format checks for the lsm engine: a flipped byte in a
//! table or manifest is reported as `Error::Corrupt` naming the file and
//! offset, never served as data; foreign and newer-format directories are
//! refused with a clear message.
#![allow(clippy::unwrap_used)]

use std::ops::Bound;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use engine::lsm::{LsmEngine, LsmOptions};
use engine::{Engine, EngineSnapshot, Error, Scan, WriteBatch};

/// One table of `n` keys `key-00000..`, persisted; returns its path.
fn one_table(dir: &Path, n: u64) -> PathBuf {
    let engine = LsmEngine::open(dir, LsmOptions::default()).unwrap();
    let mut batch = WriteBatch::new();
    for i in 0..n {
        batch.put(
            Bytes::from(format!("key-{i:05}")),
            Bytes::from(format!("value-{i:05}-{}", "v".repeat(40))),
        );
    }
    batch.set_applied_index(1);
    engine.write(batch).unwrap();
    assert_eq!(engine.persist().unwrap(), 1);
    let ssts: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "sst"))
        .collect();
    assert_eq!(ssts.len(), 1);
    ssts[0].clone()
}

fn flip(path: &Path, offset: usize) {
    let mut data = std::fs::read(path).unwrap();
    data[offset] ^= 0x04;
    std::fs::write(path, data).unwrap();
}

#[test]
fn flipped_byte_in_a_data_block_is_corruption_never_data() {
    let dir = tempfile::tempdir().unwrap();
    let sst = one_table(dir.path(), 500);
    // The first data block starts after the header page; byte 100 is
    // inside its first entries.
    flip(&sst, 4096 + 100);
    let engine = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap();
    let snap = engine.snapshot();
    for _ in 0..2 {
        // Twice: a failed block must not have been cached as good.
        let err = snap.get(b"key-00001").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Corrupt { .. }), "{msg}");
        assert!(msg.contains(&sst.display().to_string()), "{msg}");
        assert!(msg.contains("offset 4096"), "{msg}");
    }
    let err = snap
        .scan(Bound::Unbounded, Bound::Unbounded, |_, _| Scan::Continue)
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { offset: 4096, .. }), "{err}");
    // Blocks that were not touched still read correctly.
    assert_eq!(
        snap.get(b"key-00499").unwrap(),
        Some(Bytes::from(format!("value-00499-{}", "v".repeat(40))))
    );
}

#[test]
fn flipped_byte_in_index_footer_or_manifest_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let sst = one_table(dir.path(), 500);
    let len = std::fs::metadata(&sst).unwrap().len() as usize;
    // The footer page is the last one; byte 20 is inside its fields.
    flip(&sst, len - 4096 + 20);
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains(&sst.display().to_string()),
        "{err}"
    );
    flip(&sst, len - 4096 + 20);
    // The index block is the page before the footer.
    flip(&sst, len - 2 * 4096 + 10);
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    flip(&sst, len - 2 * 4096 + 10);
    assert!(LsmEngine::open(dir.path(), LsmOptions::default()).is_ok());

    let manifest = dir.path().join("MANIFEST");
    flip(&manifest, 40);
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("MANIFEST"), "{err}");
}

#[test]
fn foreign_and_newer_format_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.db"), b"someone else's").unwrap();
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert!(
        err.to_string().contains("not an lsm engine directory"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sst = one_table(dir.path(), 10);
    let manifest = dir.path().join("MANIFEST");
    let mut data = std::fs::read(&manifest).unwrap();
    data[8] = 9; // format version 9
    std::fs::write(&manifest, &data).unwrap();
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(err.to_string().contains("format version 9"), "{err}");
    data[8] = 1;
    std::fs::write(&manifest, &data).unwrap();
    data[..8].copy_from_slice(b"SQLITE3\0");
    std::fs::write(&manifest, &data).unwrap();
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(
        err.to_string().contains("not a metcd lsm manifest"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let sst2 = one_table(dir.path(), 10);
    drop(sst);
    let mut data = std::fs::read(&sst2).unwrap();
    data[8] = 2; // table format version 2
    std::fs::write(&sst2, &data).unwrap();
    let err = LsmEngine::open(dir.path(), LsmOptions::default()).unwrap_err();
    assert!(err.to_string().contains("sst format version 2"), "{err}");
}

#[test]
fn new_directory_opens_at_index_zero_and_reopens_empty() {
    let dir = tempfile::tempdir().unwrap();
    let engine = LsmEngine::open(&dir.path().join("lsm"), LsmOptions::default()).unwrap();
    assert_eq!(engine.applied_index(), 0);
    assert_eq!(engine.durable_applied_index(), 0);
    assert_eq!(engine.persist().unwrap(), 0);
    // A batch carrying only an applied index is persisted too.
    let mut batch = WriteBatch::new();
    batch.set_applied_index(7);
    engine.write(batch).unwrap();
    assert_eq!(engine.persist().unwrap(), 7);
    drop(engine);
    let engine = LsmEngine::open(&dir.path().join("lsm"), LsmOptions::default()).unwrap();
    assert_eq!(engine.durable_applied_index(), 7);
    assert_eq!(engine.get(b"").unwrap(), None);
}
