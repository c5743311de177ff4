//! The btree engine against a `BTreeMap` model: random batches, snapshots
//! held across writes, persists and defragmentations, range scans with
//! every kind of bound, and reopening (which must bring back exactly the
//! last persisted state). Also corruption handling (bit flips, torn and
//! foreign meta pages) and defragmentation shrinking the file.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::ops::Bound;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;
use engine::btree::{BtreeEngine, BtreeOptions, BtreeSnapshot, DATA_FILE, PAGE_SIZE};
use engine::{Engine, EngineSnapshot, Error, Scan, WriteBatch};
use proptest::prelude::*;

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn small_options(resident_nodes: usize) -> BtreeOptions {
    BtreeOptions {
        // Small enough that reads miss and go to the file.
        cache_bytes: 256 << 10,
        resident_nodes,
    }
}

fn dump(s: &BtreeSnapshot) -> Model {
    let mut out = Model::new();
    s.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
        out.insert(k.to_vec(), v.to_vec());
        Scan::Continue
    })
    .unwrap();
    out
}

/// `get_many` of every key of `model` in a stride order (so lookups jump
/// around the tree) and of keys never written agrees with the model and
/// with `get`: on a cold cache, the first miss brings in the pages of the
/// keys after it.
fn check_get_many(s: &BtreeSnapshot, model: &Model) {
    let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    let n = keys.len();
    if n > 2 {
        let stride = n / 2 + 1;
        keys = (0..n).map(|i| keys[i * stride % n].clone()).collect();
        keys.dedup();
    }
    keys.extend([b"never written".to_vec(), Vec::new(), vec![0xff; 130]]);
    // Half now, the rest read along on a miss: the first half's values.
    let half = keys.len() / 2;
    let ahead = s.get_ahead(&keys, half).unwrap();
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let got = s.get_many(&refs).unwrap();
    assert_eq!(got.len(), keys.len());
    assert_eq!(ahead[..], got[..half], "get_ahead of the first {half}");
    for (k, v) in keys.iter().zip(got) {
        assert_eq!(
            v.as_deref(),
            model.get(k).map(|v| &v[..]),
            "get_many {k:02x?}"
        );
        assert_eq!(v, s.get(k).unwrap(), "get_many and get of {k:02x?}");
    }
}

fn in_bounds(k: &[u8], start: &Bound<Vec<u8>>, end: &Bound<Vec<u8>>) -> bool {
    let after_start = match start {
        Bound::Unbounded => true,
        Bound::Included(s) => k >= &s[..],
        Bound::Excluded(s) => k > &s[..],
    };
    let before_end = match end {
        Bound::Unbounded => true,
        Bound::Included(e) => k <= &e[..],
        Bound::Excluded(e) => k < &e[..],
    };
    after_start && before_end
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Unbounded => Bound::Unbounded,
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
    }
}

fn check_scan(
    s: &BtreeSnapshot,
    model: &Model,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    limit: usize,
) {
    let mut got = Vec::new();
    s.scan(as_ref(start), as_ref(end), |k, v| {
        got.push((k.to_vec(), v.to_vec()));
        if got.len() == limit {
            Scan::Stop
        } else {
            Scan::Continue
        }
    })
    .unwrap();
    let want: Vec<(Vec<u8>, Vec<u8>)> = model
        .iter()
        .filter(|(k, _)| in_bounds(k, start, end))
        .take(limit)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(got, want, "scan {start:?}..{end:?} limit {limit}");
}

#[derive(Debug, Clone)]
enum Op {
    Batch(Vec<(Vec<u8>, Option<Vec<u8>>)>),
    /// Puts `n` keys `prefix ++ i` (grows the tree by whole levels).
    Fill(Vec<u8>, u16),
    Snapshot,
    DropSnapshot(usize),
    Scan(Bound<Vec<u8>>, Bound<Vec<u8>>, usize),
    Persist,
    Reopen,
    Defragment,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    let prefix = prop_oneof![
        Just(Vec::new()),
        Just(b"a".to_vec()),
        Just(b"ab".to_vec()),
        Just(b"abc/".to_vec()),
        Just(vec![b'p'; 150]),
    ];
    (
        prefix,
        prop::collection::vec(prop::sample::select(b"abcxyz\0\xff".to_vec()), 0..50),
    )
        .prop_map(|(mut p, s)| {
            p.extend(s);
            p
        })
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..100),
        1 => (900usize..1100).prop_map(|n| vec![b'm'; n]),
        1 => (4000usize..10_000, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
    ]
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        Just(Bound::Unbounded),
        key().prop_map(Bound::Included),
        key().prop_map(Bound::Excluded),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => prop::collection::vec((key(), prop::option::weighted(0.8, value())), 1..40)
            .prop_map(Op::Batch),
        1 => (key(), 50u16..600).prop_map(|(k, n)| Op::Fill(k, n)),
        2 => Just(Op::Snapshot),
        1 => any::<usize>().prop_map(Op::DropSnapshot),
        3 => (bound(), bound(), 1usize..300).prop_map(|(s, e, l)| Op::Scan(s, e, l)),
        3 => Just(Op::Persist),
        1 => Just(Op::Reopen),
        1 => Just(Op::Defragment),
    ]
}

struct Held {
    snap: BtreeSnapshot,
    model: Model,
    applied: u64,
}

fn check_held(held: &[Held]) {
    for h in held {
        assert_eq!(h.snap.applied_index(), h.applied);
        assert_eq!(dump(&h.snap), h.model, "a held snapshot changed");
    }
}

fn run(ops: Vec<Op>, resident_nodes: usize) {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = BtreeEngine::open(dir.path(), small_options(resident_nodes)).unwrap();
    let mut model = Model::new();
    let mut applied = 0u64;
    let mut persisted = (Model::new(), 0u64);
    let mut held: Vec<Held> = Vec::new();
    for op in ops {
        match op {
            Op::Batch(ops) => {
                let mut b = WriteBatch::new();
                for (k, v) in ops {
                    match v {
                        Some(v) => {
                            b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
                            model.insert(k, v);
                        }
                        None => {
                            b.delete(Bytes::from(k.clone()));
                            model.remove(&k);
                        }
                    }
                }
                applied += 1;
                b.set_applied_index(applied);
                engine.write(b).unwrap();
            }
            Op::Fill(prefix, n) => {
                let mut b = WriteBatch::new();
                for i in 0..n {
                    let mut k = prefix.clone();
                    k.extend_from_slice(&i.to_be_bytes());
                    let v = vec![(i % 251) as u8; usize::from(i % 64)];
                    b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
                    model.insert(k, v);
                }
                applied += 1;
                b.set_applied_index(applied);
                engine.write(b).unwrap();
            }
            Op::Snapshot => {
                if held.len() < 4 {
                    held.push(Held {
                        snap: engine.snapshot(),
                        model: model.clone(),
                        applied,
                    });
                }
            }
            Op::DropSnapshot(i) => {
                if !held.is_empty() {
                    let h = held.remove(i % held.len());
                    check_get_many(&h.snap, &h.model);
                    assert_eq!(dump(&h.snap), h.model);
                }
            }
            Op::Scan(start, end, limit) => {
                let s = engine.snapshot();
                check_scan(&s, &model, &start, &end, limit);
                if let Bound::Included(k) | Bound::Excluded(k) = &start {
                    assert_eq!(s.get(k).unwrap().map(|v| v.to_vec()), model.get(k).cloned());
                }
            }
            Op::Persist => {
                assert_eq!(engine.persist().unwrap(), applied);
                assert_eq!(engine.durable_applied_index(), applied);
                persisted = (model.clone(), applied);
                check_held(&held);
                engine.check().unwrap();
            }
            Op::Defragment => {
                engine.defragment().unwrap();
                engine.check().unwrap();
                assert_eq!(engine.durable_applied_index(), applied);
                persisted = (model.clone(), applied);
                check_held(&held);
            }
            Op::Reopen => {
                check_held(&held);
                held.clear();
                drop(engine);
                engine = BtreeEngine::open(dir.path(), small_options(resident_nodes)).unwrap();
                model = persisted.0.clone();
                applied = persisted.1;
                assert_eq!(engine.applied_index(), applied);
                assert_eq!(engine.durable_applied_index(), applied);
                check_get_many(&engine.snapshot(), &model);
                assert_eq!(dump(&engine.snapshot()), model, "state after reopen");
                engine.check().unwrap();
            }
        }
    }
    check_held(&held);
    assert_eq!(dump(&engine.snapshot()), model);
    for (k, v) in model.iter().take(50) {
        assert_eq!(engine.get(k).unwrap().as_deref(), Some(&v[..]));
    }
    // Whatever was last persisted is what a restart brings back.
    held.clear();
    assert_eq!(engine.persist().unwrap(), applied);
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), small_options(resident_nodes)).unwrap();
    assert_eq!(engine.durable_applied_index(), applied);
    check_get_many(&engine.snapshot(), &model);
    assert_eq!(dump(&engine.snapshot()), model);
    engine.check().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn btree_matches_model(
        ops in prop::collection::vec(op(), 1..40),
        trim_every_commit in any::<bool>(),
    ) {
        run(ops, if trim_every_commit { 0 } else { 1 << 14 });
    }
}

#[test]
fn deep_tree_with_deletes_and_reopen() {
    // Three levels at least: thousands of 120-byte keys.
    let mut ops = Vec::new();
    for round in 0..6u8 {
        ops.push(Op::Fill(
            vec![b'k'; 118].into_iter().chain([round]).collect(),
            2000,
        ));
        ops.push(Op::Persist);
        ops.push(Op::Snapshot);
    }
    ops.push(Op::Scan(
        Bound::Excluded(vec![b'k'; 119]),
        Bound::Included([vec![b'k'; 118], vec![3]].concat()),
        5000,
    ));
    let deletes: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..2000u16)
        .filter(|i| i % 3 != 0)
        .map(|i| {
            (
                [vec![b'k'; 118], vec![2], i.to_be_bytes().to_vec()].concat(),
                None,
            )
        })
        .collect();
    ops.push(Op::Batch(deletes));
    ops.push(Op::Persist);
    ops.push(Op::Reopen);
    ops.push(Op::DropSnapshot(0));
    ops.push(Op::Defragment);
    ops.push(Op::Reopen);
    run(ops, 0);
}

fn fill(engine: &BtreeEngine, model: &mut Model, n: u32, big_every: u32, index: u64) {
    let mut b = WriteBatch::new();
    for i in 0..n {
        let k = format!("key/{i:06}").into_bytes();
        let v = if big_every > 0 && i % big_every == 0 {
            vec![(i % 256) as u8; 6000]
        } else {
            format!("value {i}").into_bytes()
        };
        b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
        model.insert(k, v);
    }
    b.set_applied_index(index);
    engine.write(b).unwrap();
}

fn page_count(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len() / PAGE_SIZE as u64
}

/// Flips one byte of `path` at `offset`.
fn flip(path: &Path, offset: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x20;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

/// Every read either returns the model's data or a `Corrupt` error naming
/// the data file and an offset at or before `flipped` (an overflow run is
/// named by its first page). Returns whether some read failed.
fn reads_are_right_or_corrupt(dir: &Path, model: &Model, flipped: u64) -> bool {
    let path = dir.join(DATA_FILE);
    let check = |e: Error| match e {
        Error::Corrupt {
            path: p,
            offset,
            what,
            ..
        } => {
            assert_eq!(p, path);
            assert!(
                offset == flipped || (what == "btree overflow value" && offset < flipped),
                "corruption at {flipped} reported at {offset} ({what})"
            );
        }
        other => panic!("expected Corrupt for a flip at {flipped}, got {other}"),
    };
    let engine = match BtreeEngine::open(dir, small_options(0)) {
        Ok(e) => e,
        Err(e) => {
            // A flipped free-list page fails the open itself.
            check(e);
            return true;
        }
    };
    let mut failed = false;
    let s = engine.snapshot();
    let mut seen = Vec::new();
    match s.scan(Bound::Unbounded, Bound::Unbounded, |k, v| {
        seen.push((k.to_vec(), v.to_vec()));
        Scan::Continue
    }) {
        Ok(()) => {
            let want: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            assert_eq!(seen, want);
        }
        Err(e) => {
            // Whatever came before the error is right.
            let want: Vec<_> = model
                .iter()
                .take(seen.len())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(seen, want);
            check(e);
            failed = true;
        }
    }
    for (k, v) in model {
        match s.get(k) {
            Ok(got) => assert_eq!(got.as_deref(), Some(&v[..])),
            Err(e) => {
                check(e);
                failed = true;
            }
        }
    }
    failed
}

#[test]
fn bit_flips_are_reported_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    let mut model = Model::new();
    fill(&engine, &mut model, 600, 50, 1);
    engine.persist().unwrap();
    // A second commit so the file has free and pending pages too.
    let mut b = WriteBatch::new();
    for i in (0..600).step_by(7) {
        let k = format!("key/{i:06}").into_bytes();
        b.delete(Bytes::from(k.clone()));
        model.remove(&k);
    }
    b.set_applied_index(2);
    engine.write(b).unwrap();
    engine.persist().unwrap();
    drop(engine);
    let path = dir.path().join(DATA_FILE);
    let pristine = std::fs::read(&path).unwrap();
    let mut detected = 0;
    for page in 2..page_count(&path) {
        for at in [20u64, 600] {
            std::fs::write(&path, &pristine).unwrap();
            let offset = page * PAGE_SIZE as u64;
            flip(&path, offset + at);
            if reads_are_right_or_corrupt(dir.path(), &model, offset) {
                detected += 1;
            }
        }
    }
    assert!(detected > 10, "only {detected} flips were noticed");
}

#[test]
fn torn_newest_meta_falls_back_and_both_bad_fail() {
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    let mut older = Model::new();
    fill(&engine, &mut older, 300, 40, 7);
    engine.persist().unwrap();
    let mut newer = older.clone();
    fill(&engine, &mut newer, 900, 30, 8);
    engine.persist().unwrap();
    drop(engine);
    let path = dir.path().join(DATA_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let txn = |slot: usize| {
        let at = slot * PAGE_SIZE + 16;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    };
    let newest = if txn(0) > txn(1) { 0 } else { 1 };
    // Tear the newest meta: half a page of garbage from byte 32 on (the
    // magic survives, so it looks like ours but fails its checksum).
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0xA5; PAGE_SIZE / 2], (newest * PAGE_SIZE + 32) as u64)
        .unwrap();
    drop(f);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    assert_eq!(engine.durable_applied_index(), 7);
    assert_eq!(engine.applied_index(), 7);
    assert_eq!(dump(&engine.snapshot()), older);
    engine.check().unwrap();
    // The engine goes on from the older commit and survives a restart.
    fill(&engine, &mut older, 50, 10, 9);
    engine.persist().unwrap();
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    assert_eq!(engine.durable_applied_index(), 9);
    assert_eq!(dump(&engine.snapshot()), older);
    drop(engine);

    // A flipped byte in both metas: open refuses, naming the file.
    flip(&path, 20);
    flip(&path, PAGE_SIZE as u64 + 20);
    match BtreeEngine::open(dir.path(), small_options(0)) {
        Err(Error::Corrupt { path: p, what, .. }) => {
            assert_eq!(p, path);
            assert_eq!(what, "btree meta page");
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("opened a file whose metas are both corrupt"),
    }
}

#[test]
fn foreign_and_newer_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DATA_FILE);
    let mut foreign = b"SQLite format 3\0".to_vec();
    foreign.resize(4 * PAGE_SIZE, 0);
    std::fs::write(&path, &foreign).unwrap();
    let err = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert!(err.to_string().contains("not a metcd btree file"), "{err}");

    std::fs::remove_file(&path).unwrap();
    drop(BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap());
    // Rewrite both metas as format version 3 with valid checksums.
    let mut bytes = std::fs::read(&path).unwrap();
    for slot in 0..2 {
        let m = &mut bytes[slot * PAGE_SIZE..];
        m[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&m[..64]);
        m[64..68].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = BtreeEngine::open(dir.path(), BtreeOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Invalid(_)), "{err}");
    assert!(err.to_string().contains("format version 3"), "{err}");
}

#[test]
fn defragment_shrinks_and_keeps_data_and_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DATA_FILE);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    let mut model = Model::new();
    fill(&engine, &mut model, 5000, 7, 1);
    engine.persist().unwrap();
    let before_delete = model.clone();
    let old = engine.snapshot();
    let mut b = WriteBatch::new();
    for i in 0..5000 {
        if i % 10 != 0 {
            let k = format!("key/{i:06}").into_bytes();
            b.delete(Bytes::from(k.clone()));
            model.remove(&k);
        }
    }
    b.set_applied_index(2);
    engine.write(b).unwrap();
    engine.persist().unwrap();
    let size_before = std::fs::metadata(&path).unwrap().len();
    let space = engine.size().unwrap();
    assert_eq!(space.file_bytes, size_before);
    assert!(space.in_use_bytes * 4 < space.file_bytes, "{space:?}");
    let report = engine.defragment().unwrap();
    assert_eq!(report.bytes_before, size_before);
    let size_after = std::fs::metadata(&path).unwrap().len();
    assert_eq!(report.bytes_after, size_after);
    assert_eq!(engine.size().unwrap().file_bytes, size_after);
    assert!(
        size_after * 4 < size_before,
        "{size_before} -> {size_after} bytes"
    );
    assert_eq!(engine.durable_applied_index(), 2);
    // The snapshot from before keeps reading the old (now unlinked) file,
    // across writes and commits to the new one.
    fill(&engine, &mut model, 100, 0, 3);
    engine.persist().unwrap();
    assert_eq!(dump(&old), before_delete);
    assert_eq!(dump(&engine.snapshot()), model);
    drop(old);
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    assert_eq!(engine.durable_applied_index(), 3);
    assert_eq!(dump(&engine.snapshot()), model);
    engine.check().unwrap();
}

#[test]
fn persist_runs_beside_writers_and_readers() {
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let persister = {
        let engine = engine.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut last = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let index = engine.persist().unwrap();
                assert!(index >= last);
                last = index;
            }
        })
    };
    let mut model = Model::new();
    for round in 0..200u64 {
        let mut b = WriteBatch::new();
        for i in 0..20u64 {
            let k = format!("k{:04}", (round * 37 + i * 11) % 1500).into_bytes();
            if i % 5 == 4 {
                b.delete(Bytes::from(k.clone()));
                model.remove(&k);
            } else {
                let v = if i % 7 == 0 {
                    vec![round as u8; 5000]
                } else {
                    format!("{round}/{i}").into_bytes()
                };
                b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
                model.insert(k, v);
            }
        }
        b.set_applied_index(round + 1);
        engine.write(b).unwrap();
        if round % 20 == 0 {
            let s = engine.snapshot();
            assert_eq!(s.applied_index(), round + 1);
            assert_eq!(dump(&s), model);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    persister.join().unwrap();
    assert_eq!(engine.persist().unwrap(), 200);
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    assert_eq!(engine.durable_applied_index(), 200);
    assert_eq!(dump(&engine.snapshot()), model);
    engine.check().unwrap();
}

#[test]
fn key_limits_and_edge_sizes() {
    use engine::btree::MAX_KEY_LEN;
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    let mut model = Model::new();
    let mut b = WriteBatch::new();
    // Longest keys with values just inline, just overflowing, and large;
    // the empty key; an empty value.
    for (i, vlen) in [0usize, 1, 2, 100, 5000, 70_000].into_iter().enumerate() {
        let mut k = vec![b'z'; MAX_KEY_LEN];
        k[MAX_KEY_LEN - 1] = i as u8;
        let v = vec![i as u8 + 1; vlen];
        b.put(Bytes::from(k.clone()), Bytes::from(v.clone()));
        model.insert(k, v);
    }
    b.put(Bytes::new(), Bytes::from_static(b"empty key"));
    model.insert(Vec::new(), b"empty key".to_vec());
    for i in 0..40u8 {
        let k = vec![i; 1000];
        b.put(Bytes::from(k.clone()), Bytes::new());
        model.insert(k, Vec::new());
    }
    b.set_applied_index(1);
    engine.write(b).unwrap();

    // A batch with a key over the limit is refused whole.
    let mut b = WriteBatch::new();
    b.put(Bytes::from_static(b"fine"), Bytes::from_static(b"x"));
    b.put(Bytes::from(vec![b'k'; MAX_KEY_LEN + 1]), Bytes::new());
    b.set_applied_index(2);
    assert!(matches!(engine.write(b), Err(Error::Invalid(_))));
    assert_eq!(engine.applied_index(), 1);
    assert_eq!(engine.get(b"fine").unwrap(), None);

    assert_eq!(dump(&engine.snapshot()), model);
    engine.persist().unwrap();
    drop(engine);
    let engine = BtreeEngine::open(dir.path(), small_options(0)).unwrap();
    assert_eq!(dump(&engine.snapshot()), model);
    engine.check().unwrap();
    for (k, v) in &model {
        assert_eq!(engine.get(k).unwrap().as_deref(), Some(&v[..]));
    }
}

/// A tree that only grows (a sequential fill, an install) is trimmed after
/// a persist like one whose nodes are rewritten: what stays in memory is
/// bounded by the resident budget, not by the store.
#[test]
fn a_growing_tree_is_trimmed_to_its_resident_budget() {
    const BUDGET: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let engine = BtreeEngine::open(dir.path(), small_options(BUDGET)).unwrap();
    let mut most = 0;
    for round in 0..20u64 {
        let mut batch = WriteBatch::new();
        for i in 0..1000u64 {
            let key = format!("k{:08}", round * 1000 + i);
            batch.put(Bytes::from(key), Bytes::from(vec![b'v'; 200]));
        }
        batch.set_applied_index(round + 1);
        engine.write(batch).unwrap();
        engine.persist().unwrap();
        most = most.max(engine.resident_nodes());
    }
    // 20,000 keys of ~210 bytes fill well over 1,000 leaves.
    assert!(most <= BUDGET, "{most} nodes stayed resident");
    let snap = engine.snapshot();
    assert_eq!(snap.get(b"k00000000").unwrap().unwrap().len(), 200);
    assert_eq!(snap.get(b"k00019999").unwrap().unwrap().len(), 200);
}
