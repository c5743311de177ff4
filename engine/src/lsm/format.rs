//! Byte-level building blocks shared by the lsm engine's files: magics and
//! format versions, varints, checksummed ("sealed") blocks, the internal key
//! order, the entry type every iterator yields, and the failpoint helper.
//!
//! It owns no state and does no I/O. It must never panic on bytes read from
//! disk: every decoder is bounds-checked and reports `None`, which callers
//! turn into an [`Error::Corrupt`] naming the file and offset.
//!
//! On-disk integers are little-endian throughout (stated once, here).

use std::cmp::Ordering;
use std::path::Path;

use bytes::Bytes;

use crate::{Error, Result};

/// First bytes of every SST file (header page and footer page).
pub(crate) const SST_MAGIC: &[u8; 8] = b"METCDSST";
/// First bytes of the manifest.
pub(crate) const MANIFEST_MAGIC: &[u8; 8] = b"METCDMAN";
/// Format version of both file kinds; a newer one refuses to open.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Internal key order: user key ascending, then sequence descending, so the
/// first entry at or after `(key, s)` is the newest version of `key`
/// visible at sequence `s`.
pub(crate) fn cmp_internal(a_key: &[u8], a_seq: u64, b_key: &[u8], b_seq: u64) -> Ordering {
    a_key.cmp(b_key).then_with(|| b_seq.cmp(&a_seq))
}

/// One version of a key: `value == None` is a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: Bytes,
    pub seq: u64,
    pub value: Option<Bytes>,
}

/// A positioned cursor over entries in internal key order. Constructors
/// position it at its first entry; `current` is `None` once exhausted.
pub(crate) trait EntryIter {
    fn current(&self) -> Option<&Entry>;
    fn advance(&mut self) -> Result<()>;
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Little-endian, bounds-checked reads over a byte slice.
pub(crate) struct Reader<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    pub fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    /// A `u32`-length-prefixed byte string.
    pub fn len_prefixed(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }
}

pub(crate) fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    let n = u32::try_from(bytes.len())
        .map_err(|_| Error::Invalid(format!("key of {} bytes is too long", bytes.len())))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

/// Appends the crc32c of everything in `buf` so far.
pub(crate) fn seal(buf: &mut Vec<u8>) {
    let crc = crc32c::crc32c(buf);
    buf.extend_from_slice(&crc.to_le_bytes());
}

/// The contents of a sealed block if its trailing crc32c matches.
pub(crate) fn unseal(block: &[u8]) -> Option<&[u8]> {
    let split = block.len().checked_sub(4)?;
    let (body, crc) = block.split_at(split);
    let crc = u32::from_le_bytes(crc.try_into().ok()?);
    (crc32c::crc32c(body) == crc).then_some(body)
}

/// Evaluates failpoint `name` (a no-op unless the `fail` crate's
/// `failpoints` feature is on): a configured `return` becomes an I/O error
/// on `path`, as the real step would have failed.
pub(crate) fn failpoint(name: &str, path: &Path) -> Result<()> {
    let _ = (name, path);
    fail::fail_point!(name, |_| Err(Error::io_at(
        path,
        0,
        std::io::Error::other(format!("failpoint {name}"))
    )));
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn varints_round_trip_and_reject_truncation() {
        let mut out = Vec::new();
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            out.clear();
            put_varint(&mut out, v);
            assert_eq!(Reader::new(&out).varint(), Some(v));
            assert_eq!(Reader::new(&out[..out.len() - 1]).varint(), None);
        }
    }

    #[test]
    fn sealed_blocks_detect_any_flipped_byte() {
        let mut b = b"some block contents".to_vec();
        seal(&mut b);
        assert_eq!(unseal(&b), Some(&b"some block contents"[..]));
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert_eq!(unseal(&c), None, "flip at {i} undetected");
        }
    }

    #[test]
    fn internal_order_is_key_then_newest_first() {
        assert_eq!(cmp_internal(b"a", 1, b"b", 9), Ordering::Less);
        assert_eq!(cmp_internal(b"a", 9, b"a", 1), Ordering::Less);
        assert_eq!(cmp_internal(b"a", 5, b"a", 5), Ordering::Equal);
    }
}
