//! The pure pieces of the storage-engine shoot-out (`benches/engines.rs`):
//! the deterministic key/value generator every engine is fed from, the
//! fill orders, the per-process device-write counters and the
//! write-amplification arithmetic, and the on-disk size of an engine's
//! directory.
//!
//! It owns no engine and never times anything: the benchmark includes this
//! file (`#[path]`) and the binary compiles it only for its unit tests, so
//! the numbers the benchmark prints rest on tested arithmetic. It must never
//! depend on wall-clock time or on a random source other than its own seeded
//! xorshift, so two runs feed every engine byte-identical keys and values.

use std::io;
use std::path::Path;

/// Width of a key: `k` followed by the index as 15 zero-padded decimal
/// digits, so byte order is numeric order (a sequential fill is a sorted
/// fill) and every key has the same length.
pub const KEY_BYTES: usize = 16;

/// xorshift64: small, deterministic and fast enough not to show up in a
/// per-operation timing. Not for anything but choosing benchmark keys.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for stream `stream`; the seed is mixed so nearby stream
    /// numbers give unrelated sequences, and is never zero (xorshift's one
    /// fixed point).
    pub fn new(stream: u64) -> Rng {
        let seed = (stream.wrapping_add(1)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Rng(if seed == 0 {
            0x2545_F491_4F6C_DD1D
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-enough index in `0..n` (`n > 0`); the modulo bias is below
    /// 2^-40 for the key counts used here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `len` pseudo-random bytes: incompressible, so an engine that
    /// compresses (fjall's LZ4) gains nothing over one that does not.
    pub fn fill_bytes(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// The key of index `i`.
pub fn key(i: u64) -> [u8; KEY_BYTES] {
    let mut out = [b'0'; KEY_BYTES];
    out[0] = b'k';
    let mut n = i;
    for slot in out[1..].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    out
}

/// The value written for key `i` the `version`-th time: a function of both,
/// so every engine stores the same bytes for the same write.
pub fn value(i: u64, version: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(i ^ version.rotate_left(40) ^ 0x5EED);
    let mut out = vec![0; len];
    rng.fill_bytes(&mut out);
    out
}

/// `0..n` in a seeded random order (Fisher–Yates): the random fill writes
/// every key exactly once, so it ends with the same store as the
/// sequential one.
pub fn permutation(n: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut rng = Rng::new(seed);
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The process's block-device write counters from `/proc/self/io`: bytes
/// this process (all its threads, background ones included) caused to be
/// written to storage, and bytes it had dirtied but truncated or deleted
/// before they reached the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub write_bytes: u64,
    pub cancelled_write_bytes: u64,
}

impl IoCounters {
    /// Parses the text of `/proc/<pid>/io`.
    pub fn parse(text: &str) -> io::Result<IoCounters> {
        let field = |name: &str| -> io::Result<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("no {name} field"))
                })?
                .trim()
                .parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))
        };
        Ok(IoCounters {
            write_bytes: field("write_bytes")?,
            cancelled_write_bytes: field("cancelled_write_bytes")?,
        })
    }

    pub fn read() -> io::Result<IoCounters> {
        IoCounters::parse(&std::fs::read_to_string("/proc/self/io")?)
    }

    /// Bytes that reached (or will reach) the device between `earlier` and
    /// `self`: written minus cancelled, never below zero (a cancellation may
    /// cancel bytes dirtied before `earlier`).
    pub fn device_bytes_since(&self, earlier: &IoCounters) -> u64 {
        let written = self.write_bytes.saturating_sub(earlier.write_bytes);
        let cancelled = self
            .cancelled_write_bytes
            .saturating_sub(earlier.cancelled_write_bytes);
        written.saturating_sub(cancelled)
    }
}

/// Device bytes per logical byte (key + value of every write); `None` when
/// nothing logical was written.
pub fn write_amplification(device_bytes: u64, logical_bytes: u64) -> Option<f64> {
    (logical_bytes > 0).then(|| device_bytes as f64 / logical_bytes as f64)
}

/// Size of everything under `dir`: (sum of file lengths, sum of allocated
/// blocks). Preallocated or sparse files make the two differ.
pub fn dir_bytes(dir: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut apparent = 0;
    let mut allocated = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                apparent += meta.len();
                allocated += meta.blocks() * 512;
            }
        }
    }
    Ok((apparent, allocated))
}

#[cfg(test)]
mod tests {
    // `clippy --all-targets` also compiles this module inside the
    // harness-less benchmark with cfg(test) but without its #[test]
    // functions, where the glob import is unused.
    #![allow(clippy::unwrap_used, unused_imports)]
    use super::*;

    #[test]
    fn keys_sort_like_their_indices() {
        assert_eq!(&key(42), b"k000000000000042");
        assert_eq!(&key(999_999_999_999_999), b"k999999999999999");
        let mut prev = key(0);
        for i in [1, 9, 10, 11, 99, 100, 12_345, 999_999, 1_000_000] {
            let k = key(i);
            assert!(prev < k, "key({i}) does not sort after its predecessor");
            prev = k;
        }
    }

    #[test]
    fn generator_is_deterministic_and_streams_differ() {
        let a: Vec<u64> = (0..8).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.iter().all(|&x| x == a[0]));
        let mut r1 = Rng::new(1);
        let mut r2 = Rng::new(2);
        assert_ne!(r1.next_u64(), r2.next_u64());
        assert_eq!(value(5, 0, 256), value(5, 0, 256));
        assert_ne!(value(5, 0, 256), value(5, 1, 256));
        assert_ne!(value(5, 0, 256), value(6, 0, 256));
        assert_eq!(value(5, 0, 13).len(), 13);
    }

    #[test]
    fn permutation_visits_every_index_once() {
        let p = permutation(10_000, 3);
        assert_eq!(p, permutation(10_000, 3));
        assert_ne!(p, (0..10_000).collect::<Vec<_>>());
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10_000).collect::<Vec<_>>());
        assert!(permutation(0, 1).is_empty());
    }

    #[test]
    fn parses_proc_io_and_computes_write_amplification() {
        let before = IoCounters::parse(
            "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\n\
             write_bytes: 4096\ncancelled_write_bytes: 0\n",
        )
        .unwrap();
        let after = IoCounters {
            write_bytes: 4096 + 3 * 8192,
            cancelled_write_bytes: 8192,
        };
        assert_eq!(before.write_bytes, 4096);
        assert_eq!(after.device_bytes_since(&before), 2 * 8192);
        assert_eq!(write_amplification(2 * 8192, 8192), Some(2.0));
        assert_eq!(write_amplification(100, 0), None);
        assert!(IoCounters::parse("write_bytes: x\ncancelled_write_bytes: 0").is_err());
        assert!(IoCounters::parse("rchar: 1").is_err());
        // The real file parses on Linux.
        IoCounters::read().unwrap();
    }

    #[test]
    fn dir_bytes_sums_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 1000]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![2u8; 24]).unwrap();
        let (apparent, _allocated) = dir_bytes(dir.path()).unwrap();
        assert_eq!(apparent, 1024);
        assert!(dir_bytes(&dir.path().join("missing")).is_err());
    }
}
