//! Fuzzing entry points: each hands arbitrary bytes to one of this crate's
//! decoders, the way a damaged or hostile file would reach it. They serve
//! the libFuzzer targets in `fuzz/` (nightly, `cargo fuzz`) and
//! `engine/tests/fuzz_replay.rs`, which replays seeded random and mutated
//! inputs through them on stable in CI.
//!
//! Checksums reject almost every random input before the decoders behind
//! them run, so the entry points *seal* their input first: they write the
//! magic, version and checksum the format expects around the fuzzer's bytes.
//! That is what a checksum collision, or a bug in our own encoder, would
//! hand the decoder.
//!
//! The contract under test: a decoder returns a value or an error; it never
//! panics, never loops without bound, and never allocates by a length it
//! has not checked against its input. None of this is on a request path.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::btree::{BtreeEngine, BtreeOptions};
use crate::io::BlockCache;
use crate::{EngineSnapshot, Result, Scan};

/// Small caches: the inputs are small and a fuzzer runs many of them.
const FUZZ_CACHE_BYTES: usize = 1 << 20;
/// Reads per opened store: enough to walk what a small input can describe.
const MAX_VISITS: usize = 10_000;

/// One btree node page: the fuzzer's bytes (cut or zero-padded to a page)
/// sealed as page 9, then decoded, probed and walked as a leaf.
pub fn btree_page(data: &[u8]) {
    crate::btree::fuzz_page(data);
}

/// A whole btree data file: every page of the input sealed (meta pages
/// with magic, version and checksum; node pages with their id and
/// checksum), then opened, scanned and probed through the engine.
pub fn btree_file(dir: &Path, data: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io("create dir", dir, e))?;
    let file = crate::btree::fuzz_sealed_file(data);
    let path = dir.join(crate::btree::DATA_FILE);
    std::fs::write(&path, file).map_err(|e| crate::Error::io("write", &path, e))?;
    let engine = BtreeEngine::open(
        dir,
        BtreeOptions {
            cache_bytes: FUZZ_CACHE_BYTES,
            ..BtreeOptions::default()
        },
    )?;
    read_everything(&crate::Engine::snapshot(&engine), data)
}

/// One lsm data block (sealed as its table would have verified it):
/// every entry walked, then a seek for a key taken from the input.
pub fn lsm_block(data: &[u8]) {
    crate::lsm::fuzz_block(data);
}

/// A whole lsm table file: header and footer sealed around the input's
/// bytes (the footer's fields are the fuzzer's), the index and filter
/// regions the footer names sealed too, then opened, iterated and probed.
pub fn lsm_table(dir: &Path, data: &[u8]) -> Result<()> {
    crate::lsm::fuzz_table(dir, data, Arc::new(BlockCache::new(FUZZ_CACHE_BYTES)))
}

/// An lsm manifest: decoded as given, then sealed (magic, version, body
/// length, checksum) and decoded again.
pub fn lsm_manifest(data: &[u8]) {
    crate::lsm::fuzz_manifest(data);
}

/// A WAL segment: the input is cut into frames (each chunk prefixed by a
/// length byte of the input), each framed with a valid length and
/// checksum, optionally behind a valid segment header, then recovered.
pub fn wal_segment(dir: &Path, data: &[u8]) -> Result<()> {
    crate::wal::fuzz_recover(dir, data)
}

/// A snapshot file: magic and version written over the input's first
/// bytes and its trailing checksum fixed, then read and verified.
pub fn snapfile(dir: &Path, data: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io("create dir", dir, e))?;
    let mut file = data.to_vec();
    let header = crate::snapfile::HEADER_LEN as usize;
    if file.len() >= header {
        file[..8].copy_from_slice(crate::snapfile::MAGIC);
        file[8..12].copy_from_slice(&crate::snapfile::FORMAT_VERSION.to_le_bytes());
    }
    if let Some(split) = file.len().checked_sub(4) {
        let crc = crc32c::crc32c(&file[..split]);
        file[split..].copy_from_slice(&crc.to_le_bytes());
    }
    let path = dir.join("fuzz.snap");
    std::fs::write(&path, &file).map_err(|e| crate::Error::io("write", &path, e))?;
    crate::snapfile::read_with(&path, |_, _| Ok(())).map(|_| ())
}

/// A full scan, a bounded scan and point reads of keys named by the input:
/// what a server does with a store it just opened.
fn read_everything(snapshot: &impl EngineSnapshot, data: &[u8]) -> Result<()> {
    let mut visits = 0usize;
    snapshot.scan(Bound::Unbounded, Bound::Unbounded, |_, _| {
        visits += 1;
        if visits < MAX_VISITS {
            Scan::Continue
        } else {
            Scan::Stop
        }
    })?;
    for key in data.chunks(16).take(64) {
        snapshot.get(key)?;
        snapshot.scan(Bound::Included(key), Bound::Unbounded, |_, _| Scan::Stop)?;
    }
    Ok(())
}

/// The scratch directory of the file-level entry points in this process
/// (under the system temp dir), emptied: call it once per input.
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metcd-fuzz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Seeded inputs for replaying the entry points without libFuzzer: random
/// bytes, and mutations of valid inputs (flipped bits, boundary bytes,
/// inserted bytes, cuts), so the decoders see damage next to real data.
pub struct Inputs(u64);

impl Inputs {
    pub fn new(seed: u64) -> Inputs {
        Inputs(seed | 1)
    }

    /// xorshift64: reproducible, and enough to spread bytes and choices.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Up to `max_len` random bytes.
    pub fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let len = self.below(max_len + 1);
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// `seed` with one to eight edits.
    pub fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut out = seed.to_vec();
        for _ in 0..1 + self.below(8) {
            if out.is_empty() {
                break;
            }
            let at = self.below(out.len());
            match self.below(5) {
                0 => out[at] ^= 1 << self.below(8),
                1 => out[at] = [0x00, 0x01, 0x7f, 0x80, 0xff][self.below(5)],
                2 => out[at] = self.next_u64() as u8,
                3 => out.insert(at, self.next_u64() as u8),
                _ => out.truncate(at + 1),
            }
        }
        out
    }
}
