//! Replays the fuzz targets' entry points (`engine::fuzzing`, the same ones
//! the libFuzzer targets in `fuzz/` drive) on stable: seeded random inputs
//! and mutations of real files the engines wrote. A panic anywhere fails
//! the test; an error return is the decoders doing their job.
//!
//! It also checks the harness itself: a real, unmodified file passed
//! through an entry point must still open and read back cleanly, or the
//! sealing would be hiding the decoders from the fuzzer.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use engine::btree::{BtreeEngine, BtreeOptions};
use engine::fuzzing::{self, Inputs};
use engine::lsm::{LsmEngine, LsmOptions};
use engine::{Engine, WriteBatch};

/// Inputs per target and seed; bounded so the test stays in seconds.
const RANDOM_INPUTS: usize = 2000;
const MUTATIONS: usize = 2000;

fn scratch(root: &Path, i: usize) -> PathBuf {
    let dir = root.join(format!("case-{i}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A batch of `n` keys with values of varied sizes (some overflow a btree
/// page, so overflow runs are in the file too).
fn batch(n: usize, applied: u64) -> WriteBatch {
    let mut b = WriteBatch::new();
    for i in 0..n {
        let len = if i % 50 == 7 { 6000 } else { 10 + i % 90 };
        b.put(
            Bytes::from(format!("key-{i:05}")),
            Bytes::from(vec![b'v'; len]),
        );
    }
    b.set_applied_index(applied);
    b
}

fn btree_seed(dir: &Path, keys: usize) -> Vec<u8> {
    let engine = BtreeEngine::open(dir, BtreeOptions::default()).unwrap();
    engine.write(batch(keys, 1)).unwrap();
    engine.persist().unwrap();
    drop(engine);
    std::fs::read(dir.join(engine::btree::DATA_FILE)).unwrap()
}

/// The lsm engine's first table and its manifest, after one flush.
fn lsm_seeds(dir: &Path, keys: usize) -> (Vec<u8>, Vec<u8>) {
    let engine = LsmEngine::open(dir, LsmOptions::default()).unwrap();
    engine.write(batch(keys, 1)).unwrap();
    engine.persist().unwrap();
    drop(engine);
    let mut table = None;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sst") {
            table = Some(std::fs::read(path).unwrap());
        }
    }
    let manifest = std::fs::read(dir.join("MANIFEST")).unwrap();
    (table.expect("a flush writes a table"), manifest)
}

/// A snapshot file in the documented layout (see `engine::snapfile`).
fn snapfile_seed() -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(engine::snapfile::MAGIC);
    f.extend_from_slice(&engine::snapfile::FORMAT_VERSION.to_le_bytes());
    f.extend_from_slice(&7u64.to_le_bytes());
    for i in 0..20u32 {
        let key = format!("k{i:03}");
        f.extend_from_slice(&(key.len() as u32).to_le_bytes());
        f.extend_from_slice(&i.to_le_bytes());
        f.extend_from_slice(key.as_bytes());
        f.extend(std::iter::repeat_n(b'x', i as usize));
    }
    f.extend_from_slice(&20u64.to_le_bytes());
    f.extend_from_slice(&[0; 4]); // the entry point writes the checksum
    f
}

/// A WAL fuzz input (see `fuzzing::wal_segment`): header, then entry
/// records of 4-byte-multiple payloads, one per frame.
fn wal_seed() -> Vec<u8> {
    let mut f = vec![1u8];
    for index in 1..=20u64 {
        let mut record = vec![2u8];
        record.extend_from_slice(&index.to_le_bytes());
        record.extend_from_slice(&3u32.to_le_bytes());
        record.extend_from_slice(b"abc");
        f.push((record.len() / 4) as u8);
        f.extend_from_slice(&record);
    }
    f
}

#[test]
fn real_files_pass_through_the_entry_points_unharmed() {
    let root = tempfile::tempdir().unwrap();
    let btree = btree_seed(&root.path().join("btree"), 600);
    fuzzing::btree_file(&root.path().join("b2"), &btree).unwrap();
    let (table, manifest) = lsm_seeds(&root.path().join("lsm"), 600);
    fuzzing::lsm_table(&root.path().join("t2"), &table).unwrap();
    fuzzing::snapfile(&root.path().join("s2"), &snapfile_seed()).unwrap();
    fuzzing::wal_segment(&root.path().join("w2"), &wal_seed()).unwrap();
    // The manifest entry point takes a manifest's body, which its own
    // sealing must accept; the file as a whole decodes too.
    fuzzing::lsm_manifest(&manifest);
}

#[test]
fn btree_decoders_survive_garbage_and_damage() {
    let root = tempfile::tempdir().unwrap();
    let seed = btree_seed(&root.path().join("seed"), 600);
    let mut rng = Inputs::new(0x9e37_79b9_7f4a_7c15);
    for i in 0..RANDOM_INPUTS {
        fuzzing::btree_page(&rng.bytes(5000));
        let _ = fuzzing::btree_file(&scratch(root.path(), i), &rng.bytes(3 * 4096));
    }
    for i in 0..MUTATIONS {
        let damaged = rng.mutate(&seed);
        let page = rng.below(seed.len() / 4096) * 4096;
        fuzzing::btree_page(&damaged[page.min(damaged.len())..]);
        let _ = fuzzing::btree_file(&scratch(root.path(), i), &damaged);
    }
}

#[test]
fn lsm_decoders_survive_garbage_and_damage() {
    let root = tempfile::tempdir().unwrap();
    let (table, manifest) = lsm_seeds(&root.path().join("seed"), 600);
    let mut rng = Inputs::new(0x2545_f491_4f6c_dd1d);
    for i in 0..RANDOM_INPUTS {
        fuzzing::lsm_block(&rng.bytes(600));
        fuzzing::lsm_manifest(&rng.bytes(300));
        let _ = fuzzing::lsm_table(&scratch(root.path(), i), &rng.bytes(3 * 4096));
    }
    for i in 0..MUTATIONS {
        let damaged = rng.mutate(&table);
        let block = 4096 + rng.below(table.len() / 4096 - 2) * 4096;
        fuzzing::lsm_block(&damaged[block.min(damaged.len())..]);
        let _ = fuzzing::lsm_table(&scratch(root.path(), i), &damaged);
        let m = rng.mutate(&manifest);
        fuzzing::lsm_manifest(&m);
        fuzzing::lsm_manifest(m.get(16..).unwrap_or_default());
    }
}

#[test]
fn wal_and_snapshot_decoders_survive_garbage_and_damage() {
    let root = tempfile::tempdir().unwrap();
    let mut rng = Inputs::new(0xdead_beef_cafe_f00d);
    let (wal, snap) = (wal_seed(), snapfile_seed());
    for i in 0..RANDOM_INPUTS {
        let _ = fuzzing::wal_segment(&scratch(root.path(), i), &rng.bytes(2000));
        let _ = fuzzing::snapfile(&scratch(root.path(), i), &rng.bytes(2000));
    }
    for i in 0..MUTATIONS {
        let _ = fuzzing::wal_segment(&scratch(root.path(), i), &rng.mutate(&wal));
        let _ = fuzzing::snapfile(&scratch(root.path(), i), &rng.mutate(&snap));
    }
}

/// Inputs the fuzzers once crashed on (`tests/fuzz_regressions/<target>/`),
/// replayed through the same entry points: each must now fail cleanly.
#[test]
fn past_fuzzer_findings_are_errors_now() {
    let root = tempfile::tempdir().unwrap();
    let findings = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut replayed = 0;
    for target in std::fs::read_dir(&findings).unwrap() {
        let target = target.unwrap().path();
        for input in std::fs::read_dir(&target).unwrap() {
            let input = input.unwrap().path();
            let data = std::fs::read(&input).unwrap();
            let dir = scratch(root.path(), replayed);
            let result = match target.file_name().unwrap().to_str().unwrap() {
                "btree_file" => fuzzing::btree_file(&dir, &data),
                "lsm_table" => fuzzing::lsm_table(&dir, &data),
                other => panic!("no entry point for findings of {other}"),
            };
            assert!(result.is_err(), "{} opened cleanly", input.display());
            replayed += 1;
        }
    }
    assert!(replayed >= 2, "the findings directory is missing");
}

/// Writes small real files as the libFuzzer targets' starting corpus
/// (`fuzz/corpus/<target>/seed-*`); without them the file-level targets
/// rarely get past the first header check. Run by hand before fuzzing:
/// `cargo test -p engine --test fuzz_replay -- --ignored write_seed_corpus`.
#[test]
#[ignore = "writes fuzz/corpus; run by hand before fuzzing"]
fn write_seed_corpus() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let root = tempfile::tempdir().unwrap();
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for keys in [3, 60] {
        let btree = btree_seed(&root.path().join(format!("b{keys}")), keys);
        write("btree_file", &format!("seed-{keys}"), &btree);
        for (i, page) in btree.chunks(4096).enumerate().skip(2).take(4) {
            write("btree_page", &format!("seed-{keys}-{i}"), page);
        }
        let (table, manifest) = lsm_seeds(&root.path().join(format!("l{keys}")), keys);
        write("lsm_table", &format!("seed-{keys}"), &table);
        // The first data block's body: padding and checksum cut off.
        let block = &table[4096..8192];
        let end = block.iter().rposition(|&b| b != 0).unwrap() + 1;
        write("lsm_block", &format!("seed-{keys}"), &block[..end - 4]);
        write("lsm_manifest", &format!("seed-{keys}"), &manifest[16..]);
    }
    write("wal_segment", "seed", &wal_seed());
    write("snapfile", "seed", &snapfile_seed());
}
