//! Helpers shared by the integration tests.

use std::future::Future;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use engine::{Engine, EngineSnapshot, MemoryEngine, Scan, WriteBatch};
use glommio::{LocalExecutorBuilder, Placement};

/// Runs `f` to completion on a fresh glommio executor thread.
pub fn on_executor<G, F, T>(f: G) -> T
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(1 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// `engine.checkpoint(dir)` run on its own executor.
pub fn checkpoint(engine: &MemoryEngine, dir: &Path) -> engine::Result<u64> {
    let engine = engine.clone();
    let dir = dir.to_path_buf();
    on_executor(move || async move { engine.checkpoint(&dir).await })
}

/// `snapfile::write(snapshot, path)` run on its own executor.
pub fn write_snapfile(engine: &MemoryEngine, path: &Path) -> engine::Result<u64> {
    let snapshot = engine.snapshot();
    let path = path.to_path_buf();
    on_executor(move || async move { engine::snapfile::write(&snapshot, &path).await })
}

pub fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

pub fn put(engine: &MemoryEngine, key: &[u8], value: &[u8]) {
    let mut batch = WriteBatch::new();
    batch.put(b(key), b(value));
    engine.write(batch).unwrap();
}

pub fn delete(engine: &MemoryEngine, key: &[u8]) {
    let mut batch = WriteBatch::new();
    batch.delete(b(key));
    engine.write(batch).unwrap();
}

pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Everything `scan` visits, stopping after `stop_after` visits if set.
pub fn scan<S: EngineSnapshot>(
    snap: &S,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    stop_after: Option<usize>,
) -> Pairs {
    let mut out = Vec::new();
    snap.scan(start, end, |k, v| {
        out.push((k.to_vec(), v.to_vec()));
        if stop_after.is_some_and(|n| out.len() >= n) {
            Scan::Stop
        } else {
            Scan::Continue
        }
    })
    .unwrap();
    out
}

pub fn scan_all<S: EngineSnapshot>(snap: &S) -> Pairs {
    scan(snap, Bound::Unbounded, Bound::Unbounded, None)
}

/// Names of the files in `dir`, sorted.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

pub fn snap_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:016x}.snap"))
}
