//! Memory per key: where a member's bytes go for a store of N keys, counted
//! by the allocator (live bytes as allocated, size-class rounding
//! included, and live allocations), not estimated from RSS. Deterministic:
//! CPU load on the machine does not change it.
//!
//! ```sh
//! cargo bench -p bench --bench memory_per_key -- [--keys N] [--value-bytes 256]
//! ```
//!
//! Stages (each the live memory it added, per key):
//! 1. an MVCC store on the memory engine, filled as a member's apply fills
//!    it (one Put per log index; keys `%08d` in order, as
//!    `bench/large-store.sh` puts them): the engine's records, the key
//!    index and the store's own structures;
//! 2. a second memory engine holding copies of the same records, written
//!    in batches of 1000: the engine's share (so stage 1 minus stage 2 is
//!    the key index's and the store's);
//! 3. the first engine checkpointed, everything dropped, the engine opened
//!    from its checkpoint (a restart), then the store opened on it (the key
//!    index rebuilt from the records).
//!
//! What a running member adds on top (Raft log tail, connections, the
//! allocator's retained free memory, the block cache of btree/lsm) is not
//! here: `bench/large-store.sh` measures the process.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicI64, Ordering};

use bytes::Bytes;
use engine::{Engine, EngineSnapshot, MemoryEngine, Scan, WriteBatch};
use server::mvcc::{MvccStore, PutRequest, Request};

/// mimalloc, counting what is live: bytes as allocated (its size class,
/// `mi_usable_size`) and allocations.
struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_ALLOCS: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call goes to mimalloc's own allocator with the caller's
// layout, unchanged; the counters only read the sizes of blocks mimalloc
// handed out and has not yet been given back.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as GlobalAlloc::alloc's contract.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            count(p, 1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as GlobalAlloc::alloc_zeroed's contract.
        let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            count(p, 1);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        count(p, -1);
        // SAFETY: `p` came from this allocator with `layout`.
        unsafe { mimalloc::MiMalloc.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(p, -1);
        // SAFETY: as GlobalAlloc::realloc's contract.
        let q = unsafe { mimalloc::MiMalloc.realloc(p, layout, new_size) };
        if q.is_null() {
            // The old block stands.
            count(p, 1);
        } else {
            count(q, 1);
        }
        q
    }
}

fn count(p: *mut u8, sign: i64) {
    // SAFETY: `p` is a live block of mimalloc's (allocated by it and not
    // yet freed): the size of its size class can be read.
    let size = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) } as i64;
    LIVE_BYTES.fetch_add(sign * size, Ordering::Relaxed);
    LIVE_ALLOCS.fetch_add(sign, Ordering::Relaxed);
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[derive(Clone, Copy)]
struct Live {
    bytes: i64,
    allocs: i64,
}

fn live() -> Live {
    Live {
        bytes: LIVE_BYTES.load(Ordering::Relaxed),
        allocs: LIVE_ALLOCS.load(Ordering::Relaxed),
    }
}

fn report(stage: &str, before: Live, keys: usize) -> Live {
    let now = live();
    let bytes = now.bytes - before.bytes;
    let allocs = now.allocs - before.allocs;
    println!(
        "{stage:<58} {:>8.1} MiB  {:>6.1} bytes/key  {:>5.2} allocations/key",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / keys as f64,
        allocs as f64 / keys as f64,
    );
    now
}

fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let keys = flag(&args, "--keys", 1_000_000);
    let value_bytes = flag(&args, "--value-bytes", 256);
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("memory_per_key: a temporary dir: {e}");
            std::process::exit(1);
        }
    };
    let path = dir.path().to_path_buf();
    let ran = glommio::LocalExecutorBuilder::default()
        .spawn(move || async move { run(keys, value_bytes, &path).await })
        .map_err(|e| e.to_string())
        .and_then(|h| h.join().map_err(|e| e.to_string()));
    match ran {
        Ok(Ok(())) => {}
        Ok(Err(e)) | Err(e) => {
            eprintln!("memory_per_key: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(keys: usize, value_bytes: usize, dir: &std::path::Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    println!(
        "{keys} keys of 8 bytes, values of {value_bytes} bytes ({:.1} MiB of keys and values)",
        (keys * (8 + value_bytes)) as f64 / (1 << 20) as f64
    );
    let value = Bytes::from(vec![b'v'; value_bytes]);
    let start = live();
    let mut store = MvccStore::open(MemoryEngine::new()).map_err(|e| err(&e))?;
    for i in 0..keys {
        let put = PutRequest {
            key: Bytes::from(format!("{i:08}")),
            value: value.clone(),
            ..Default::default()
        };
        store
            .apply(i as u64 + 1, &Request::Put(put))
            .map_err(|e| err(&e))?;
    }
    report(
        "1. MVCC store (memory engine), filled by apply",
        start,
        keys,
    );

    let engine = store.engine().clone();
    let base = live();
    let copy = MemoryEngine::new();
    let mut records = Vec::with_capacity(keys);
    engine
        .snapshot()
        .scan(
            std::ops::Bound::Unbounded,
            std::ops::Bound::Unbounded,
            |k, v| {
                records.push((Bytes::copy_from_slice(k), Bytes::copy_from_slice(v)));
                Scan::Continue
            },
        )
        .map_err(|e| err(&e))?;
    // Moved in, not cloned: a clone would give each copy a sharing header.
    let mut records = records.into_iter().peekable();
    let mut index = 0;
    while records.peek().is_some() {
        index += 1;
        let mut batch = WriteBatch::with_capacity(1000);
        for (k, v) in records.by_ref().take(1000) {
            batch.put(k, v);
        }
        batch.set_applied_index(index);
        copy.write(batch).map_err(|e| err(&e))?;
    }
    drop(records);
    report("2. memory engine alone, copies of its records", base, keys);
    drop(copy);

    engine.checkpoint(dir).await.map_err(|e| err(&e))?;
    drop(engine);
    drop(store);
    let dropped = live();
    let reopened = MemoryEngine::open(dir).map_err(|e| err(&e))?;
    let opened = report(
        "3a. memory engine opened from its checkpoint",
        dropped,
        keys,
    );
    let store = MvccStore::open(reopened).map_err(|e| err(&e))?;
    report(
        "3b. + the store opened on it (key index rebuilt)",
        opened,
        keys,
    );
    drop(store);
    Ok(())
}
