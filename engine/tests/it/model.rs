//! Model-based test: `MemoryEngine` against a `BTreeMap`, with held
//! snapshots, checkpoints and reopens interleaved with writes.

use std::collections::BTreeMap;
use std::ops::Bound;

use engine::memory::MemorySnapshot;
use engine::{Engine, EngineSnapshot, Error, MemoryEngine, WriteBatch};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::common::{b, file_names, on_executor, scan, scan_all, Pairs};

/// Few keys, so writes collide; includes the empty key, a key that is a
/// prefix of others and bytes at both ends of the range.
const KEYS: &[&[u8]] = &[
    b"",
    b"\x00",
    b"a",
    b"a\x00",
    b"aa",
    b"ab",
    b"b",
    b"ba",
    b"\xff",
    b"\xff\xff",
];
/// Bound probes: the keys plus some that are never written.
const PROBES: &[&[u8]] = &[
    b"",
    b"\x00",
    b"a",
    b"a\x00",
    b"aa",
    b"ab",
    b"b",
    b"ba",
    b"\xff",
    b"\xff\xff",
    b"0",
    b"az",
    b"c",
];

#[derive(Debug, Clone)]
enum BoundSpec {
    Unbounded,
    Included(usize),
    Excluded(usize),
}

impl BoundSpec {
    fn get(&self) -> Bound<&'static [u8]> {
        match self {
            BoundSpec::Unbounded => Bound::Unbounded,
            BoundSpec::Included(i) => Bound::Included(PROBES[*i]),
            BoundSpec::Excluded(i) => Bound::Excluded(PROBES[*i]),
        }
    }
}

#[derive(Debug, Clone)]
struct ScanSpec {
    start: BoundSpec,
    end: BoundSpec,
    stop_after: Option<usize>,
}

#[derive(Debug, Clone)]
enum Step {
    /// Puts (`Some`) and deletes (`None`); optionally advances the applied
    /// index by the given delta (0 re-states the current index).
    Write {
        ops: Vec<(usize, Option<Vec<u8>>)>,
        applied_delta: Option<u64>,
    },
    /// A batch whose applied index goes backwards: must be refused whole.
    Regress,
    TakeSnapshot,
    ReleaseSnapshot(usize),
    ScanHeld(usize, ScanSpec),
    ScanLatest(ScanSpec),
    Checkpoint,
    Reopen,
}

fn bound_spec() -> impl Strategy<Value = BoundSpec> {
    prop_oneof![
        1 => Just(BoundSpec::Unbounded),
        2 => (0..PROBES.len()).prop_map(BoundSpec::Included),
        2 => (0..PROBES.len()).prop_map(BoundSpec::Excluded),
    ]
}

fn scan_spec() -> impl Strategy<Value = ScanSpec> {
    (bound_spec(), bound_spec(), prop::option::of(1usize..5)).prop_map(
        |(start, end, stop_after)| ScanSpec {
            start,
            end,
            stop_after,
        },
    )
}

fn step() -> impl Strategy<Value = Step> {
    let op = (
        0..KEYS.len(),
        // Empty values are legal and must not read as deletions.
        prop::option::weighted(0.7, prop::collection::vec(any::<u8>(), 0..4)),
    );
    prop_oneof![
        8 => (prop::collection::vec(op, 0..5), prop::option::of(0u64..3))
            .prop_map(|(ops, applied_delta)| Step::Write { ops, applied_delta }),
        1 => Just(Step::Regress),
        2 => Just(Step::TakeSnapshot),
        1 => any::<usize>().prop_map(Step::ReleaseSnapshot),
        2 => (any::<usize>(), scan_spec()).prop_map(|(i, s)| Step::ScanHeld(i, s)),
        1 => scan_spec().prop_map(Step::ScanLatest),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Reopen),
    ]
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    applied: u64,
}

impl Model {
    fn scan(&self, spec: &ScanSpec) -> Pairs {
        let (start, end) = (spec.start.get(), spec.end.get());
        let in_range = |k: &[u8]| {
            (match start {
                Bound::Unbounded => true,
                Bound::Included(s) => k >= s,
                Bound::Excluded(s) => k > s,
            }) && (match end {
                Bound::Unbounded => true,
                Bound::Included(e) => k <= e,
                Bound::Excluded(e) => k < e,
            })
        };
        self.map
            .iter()
            .filter(|(k, _)| in_range(k))
            .take(spec.stop_after.unwrap_or(usize::MAX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn pairs(&self) -> Pairs {
        self.map
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

fn check_snapshot(snap: &MemorySnapshot, model: &Model, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        snap.applied_index(),
        model.applied,
        "{} applied index",
        what
    );
    for key in PROBES {
        let got = snap.get(key).unwrap().map(|v| v.to_vec());
        prop_assert_eq!(got, model.map.get(*key).cloned(), "{} get {:?}", what, key);
    }
    prop_assert_eq!(scan_all(snap), model.pairs(), "{} full scan", what);
    Ok(())
}

fn check_latest(engine: &MemoryEngine, model: &Model, durable: u64) -> Result<(), TestCaseError> {
    prop_assert_eq!(engine.applied_index(), model.applied);
    prop_assert_eq!(engine.durable_applied_index(), durable);
    prop_assert_eq!(engine.len_hint(), model.map.len());
    for key in PROBES {
        let got = Engine::get(engine, key).unwrap().map(|v| v.to_vec());
        prop_assert_eq!(got, model.map.get(*key).cloned(), "engine get {:?}", key);
    }
    check_snapshot(&engine.snapshot(), model, "fresh snapshot")
}

async fn run(steps: Vec<Step>, deltas: bool) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = MemoryEngine::open(dir.path()).unwrap();
    engine.set_deltas_whenever_possible(deltas);
    let mut model = Model::default();
    let mut durable: Option<Model> = None;
    let mut held: Vec<(MemorySnapshot, Model)> = Vec::new();

    for step in steps {
        match step {
            Step::Write { ops, applied_delta } => {
                let mut batch = WriteBatch::new();
                for (key, value) in ops {
                    let key = KEYS[key];
                    match value {
                        Some(value) => {
                            batch.put(b(key), b(&value));
                            model.map.insert(key.to_vec(), value);
                        }
                        None => {
                            batch.delete(b(key));
                            model.map.remove(key);
                        }
                    }
                }
                if let Some(delta) = applied_delta {
                    model.applied += delta;
                    batch.set_applied_index(model.applied);
                }
                engine.write(batch).unwrap();
            }
            Step::Regress => {
                if model.applied > 0 {
                    let mut batch = WriteBatch::new();
                    batch.put(b(KEYS[2]), b(b"regressed"));
                    batch.delete(b(KEYS[3]));
                    batch.set_applied_index(model.applied - 1);
                    let err = engine.write(batch).unwrap_err();
                    prop_assert!(matches!(err, Error::Invalid(_)), "{:?}", err);
                }
            }
            Step::TakeSnapshot => held.push((engine.snapshot(), model.clone())),
            Step::ReleaseSnapshot(i) => {
                if !held.is_empty() {
                    let len = held.len();
                    held.remove(i % len);
                }
            }
            Step::ScanHeld(i, spec) => {
                if !held.is_empty() {
                    let (snap, at) = &held[i % held.len()];
                    let got = scan(snap, spec.start.get(), spec.end.get(), spec.stop_after);
                    prop_assert_eq!(got, at.scan(&spec), "held scan {:?}", spec);
                }
            }
            Step::ScanLatest(spec) => {
                let got = scan(
                    &engine.snapshot(),
                    spec.start.get(),
                    spec.end.get(),
                    spec.stop_after,
                );
                prop_assert_eq!(got, model.scan(&spec), "latest scan {:?}", spec);
            }
            Step::Checkpoint => {
                let index = engine.checkpoint(dir.path()).await.unwrap();
                prop_assert_eq!(index, model.applied);
                // One base, then deltas chained after it, the newest file
                // under the checkpoint's index.
                let names = file_names(dir.path());
                let bases: Vec<&String> = names.iter().filter(|n| n.ends_with(".snap")).collect();
                prop_assert_eq!(bases.len(), 1, "{:?}", names);
                let mut last = u64::from_str_radix(&bases[0][..16], 16).unwrap();
                for delta in names.iter().filter(|n| n.ends_with(".delta")) {
                    prop_assert_eq!(&delta[..16], format!("{last:016x}"), "{:?}", names);
                    last = u64::from_str_radix(&delta[17..33], 16).unwrap();
                }
                prop_assert_eq!(last, index, "{:?}", names);
                prop_assert_eq!(
                    names.len(),
                    1 + names.iter().filter(|n| n.ends_with(".delta")).count()
                );
                prop_assert!(!deltas || names.len() <= 1 + engine::memory::MAX_DELTAS);
                durable = Some(model.clone());
            }
            Step::Reopen => {
                // Writes since the last checkpoint are gone: replaying them
                // is the WAL's job, not this engine's.
                engine = MemoryEngine::open(dir.path()).unwrap();
                engine.set_deltas_whenever_possible(deltas);
                model = durable.clone().unwrap_or_default();
            }
        }

        let durable_index = durable.as_ref().map_or(0, |d| d.applied);
        check_latest(&engine, &model, durable_index)?;
        // Held snapshots (including ones of an engine since replaced by a
        // reopen) still show exactly what they showed when taken.
        for (snap, at) in &held {
            check_snapshot(snap, at, "held snapshot")?;
        }
    }

    // With nothing held, GC leaves exactly one version per live key.
    drop(held);
    engine.collect_garbage();
    prop_assert_eq!(engine.internal_entry_count(), model.map.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn memory_engine_matches_btreemap_model(
        steps in prop::collection::vec(step(), 1..60),
        deltas in any::<bool>(),
    ) {
        // One executor per case, for the checkpoints. Half the cases write
        // delta checkpoints whenever a base exists.
        on_executor(move || run(steps, deltas))?;
    }
}
