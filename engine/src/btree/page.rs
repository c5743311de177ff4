//! Byte layout of `data.btree`: meta pages, node pages, overflow runs and
//! the free-list run. All integers are little-endian.
//!
//! This module owns encoding and decoding only: it never does I/O and never
//! trusts a byte it decodes (every length and offset is bounds-checked, a
//! bad one is an error string the caller turns into
//! [`Error::Corrupt`](crate::Error::Corrupt) with the file and offset).
//! Checksums are CRC32C.
//!
//! # File layout
//!
//! The file is an array of [`PAGE_SIZE`] pages; page `n` starts at byte
//! `n * PAGE_SIZE`. Pages 0 and 1 are the two meta slots; transaction `t`
//! writes its meta into slot `t % 2`, so the previous commit's meta is never
//! overwritten by the current one.
//!
//! Meta page (the file header):
//! ```text
//!  0  magic "METCDBT\0"      8  format version u32   12 page size u32
//! 16  txn u64               24  root page u64 (0 = empty tree)
//! 32  free-list page u64    40  free-list pages u64 (0 = no free list)
//! 48  page count u64        56  applied index u64
//! 64  crc32c of bytes 0..64
//! ```
//!
//! Node page:
//! ```text
//!  0  crc32c of bytes 4..PAGE_SIZE
//!  4  kind u8 (1 leaf, 2 branch)  5 reserved u8  6 count u16
//!  8  this page's id u64 (catches pages written to the wrong place)
//! 16  count slot offsets u16, then the entries they point at
//! ```
//! Leaf entry: `key_len u16, flag u8`, then for an inline value stored
//! apart (`flag 2`, what this version writes) `value_len u16, value offset
//! u16, key`, the values following all the entries, so a lookup's binary
//! search reads keys packed together rather than one cache line per entry;
//! for an overflow value (`flag 1`) `value_len u64, first page u64, value
//! crc32c u32, key`. Format version 1 wrote inline values next to their
//! key (`flag 0`: `value_len u16, key, value`); such pages are still read. A branch entry
//! is `child page u64, key_len u16, key`; entry 0's key is empty (child 0
//! holds everything below entry 1's key), entry `i`'s key is the smallest
//! key child `i` may hold.
//!
//! An overflow run is `ceil(len / PAGE_SIZE)` consecutive pages holding the
//! raw value, zero-padded; its checksum lives in the leaf entry pointing at
//! it. The free-list run is `crc32c u32 (of bytes 4..end of the run), kind
//! u8 = 3, 3 reserved, first page id u64, run count u64`, then `(start u64,
//! pages u64)` per free run.

use bytes::Bytes;

use super::tree::{BigVal, Child, Entry, NodeKind, Val};
use crate::io::ALIGN;

/// Size of every page; one direct-I/O block.
pub const PAGE_SIZE: usize = ALIGN;
/// The magic at the start of both meta pages.
pub const MAGIC: [u8; 8] = *b"METCDBT\0";
/// The format version this code writes and the newest it reads (2: leaf
/// values stored apart from their keys; version 1 files are read, and
/// become version 2 at their next commit).
pub const FORMAT_VERSION: u32 = 2;

const META_LEN: usize = 64;
const NODE_HEADER: usize = 16;
/// Bytes of a node page available to slots and entries.
pub const NODE_CAPACITY: usize = PAGE_SIZE - NODE_HEADER;
/// Longest key the engine accepts: at least three entries fit a page.
pub const MAX_KEY_LEN: usize = 1024;
/// A value is stored inline when key and value together are at most this
/// long; longer values go to an overflow run.
pub const INLINE_MAX: usize = 1024;

const KIND_LEAF: u8 = 1;
/// Leaf entry flags: inline value after the key (format 1), overflow run,
/// inline value stored apart (format 2).
const VALUE_NEXT_TO_KEY: u8 = 0;
const VALUE_OVERFLOW: u8 = 1;
const VALUE_APART: u8 = 2;
const KIND_BRANCH: u8 = 2;
const KIND_FREELIST: u8 = 3;
const FREELIST_HEADER: usize = 24;

/// Pages an overflow run of `len` bytes occupies.
pub fn pages_for(len: u64) -> u64 {
    len.div_ceil(PAGE_SIZE as u64).max(1)
}

/// Byte offset of page `page`. Saturates: a page id read from a damaged
/// page then points past the end of the file, and the read fails there
/// (naming the file and offset) instead of wrapping to some other page.
pub fn offset_of(page: u64) -> u64 {
    page.saturating_mul(PAGE_SIZE as u64)
}

/// The decoded, checksum-verified contents of a meta page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub txn: u64,
    pub root: u64,
    pub freelist_page: u64,
    pub freelist_pages: u64,
    pub page_count: u64,
    pub applied_index: u64,
}

/// What a meta slot holds.
#[derive(Debug)]
pub enum MetaSlot {
    Valid(Meta),
    /// Not our magic: some other file.
    Foreign,
    /// Our magic but a newer format (or another page size).
    Unsupported(String),
    /// Our magic but a bad checksum: torn or corrupt.
    Damaged,
}

pub fn encode_meta(meta: &Meta, buf: &mut [u8]) {
    buf[..PAGE_SIZE].fill(0);
    buf[0..8].copy_from_slice(&MAGIC);
    buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[12..16].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    for (i, v) in [
        meta.txn,
        meta.root,
        meta.freelist_page,
        meta.freelist_pages,
        meta.page_count,
        meta.applied_index,
    ]
    .into_iter()
    .enumerate()
    {
        buf[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let crc = crc32c::crc32c(&buf[..META_LEN]);
    buf[META_LEN..META_LEN + 4].copy_from_slice(&crc.to_le_bytes());
}

pub fn decode_meta(buf: &[u8]) -> MetaSlot {
    if buf.len() < META_LEN + 4 || buf[0..8] != MAGIC {
        return MetaSlot::Foreign;
    }
    if crc32c::crc32c(&buf[..META_LEN]) != u32_at(buf, META_LEN) {
        return MetaSlot::Damaged;
    }
    let version = u32_at(buf, 8);
    if version > FORMAT_VERSION || version == 0 {
        return MetaSlot::Unsupported(format!(
            "format version {version}, this build reads up to {FORMAT_VERSION}"
        ));
    }
    let page_size = u32_at(buf, 12);
    if page_size as usize != PAGE_SIZE {
        return MetaSlot::Unsupported(format!(
            "page size {page_size}, this build uses {PAGE_SIZE}"
        ));
    }
    let f = |i: usize| u64_at(buf, 16 + 8 * i);
    MetaSlot::Valid(Meta {
        txn: f(0),
        root: f(1),
        freelist_page: f(2),
        freelist_pages: f(3),
        page_count: f(4),
        applied_index: f(5),
    })
}

/// A binary search over a page that is not in the CPU cache misses on
/// every step, each miss waiting for the one before. This loads what the
/// search will read at once instead: the slots, then all the entries when
/// they span at most 1 KiB (a format-2 leaf's keys are packed together),
/// else the entries the first four steps can reach.
#[inline(always)]
fn prefetch_search(buf: &[u8], count: usize) {
    const ALL_ENTRIES_UP_TO: usize = 1024;
    if count == 0 {
        return;
    }
    let slot = |i: usize| u16_at(buf, NODE_HEADER + 2 * i) as usize;
    prefetch_lines(buf, NODE_HEADER, NODE_HEADER + 2 * count);
    let (first, last) = (slot(0), slot(count - 1));
    let (low, high) = (first.min(last), first.max(last));
    if high - low <= ALL_ENTRIES_UP_TO {
        // + 32: the last entry's header and the start of its key.
        prefetch_lines(buf, low, high + 32);
    } else {
        for sixteenth in 1..16 {
            prefetch_lines(buf, slot(count * sixteenth / 16), 0);
        }
    }
}

/// Hints the CPU to load the cache lines holding `buf[from..to]` (at
/// least the line of `buf[from]`). Only a hint: nothing is read into the
/// program, and offsets past the buffer are ignored.
#[inline(always)]
fn prefetch_lines(buf: &[u8], from: usize, to: usize) {
    const LINE: usize = 64;
    let end = to.min(buf.len());
    let mut at = from;
    while at < end.max(from + 1) && at < buf.len() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `at < buf.len()`, so the pointer is inside `buf`; a
        // prefetch never faults and has no effect the program can observe.
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(buf.as_ptr().add(at).cast());
        }
        at += LINE;
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Byte-wise key order (as `<[u8]>::cmp`), eight bytes at a time: keys are
/// short, and a lookup compares about seven per page, so the call into
/// `memcmp` cost more than the comparison (10 % of a cached point read).
pub fn compare_keys(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let (mut a_rest, mut b_rest) = (a, b);
    while let (Some((a8, a_tail)), Some((b8, b_tail))) = (
        a_rest.split_first_chunk::<8>(),
        b_rest.split_first_chunk::<8>(),
    ) {
        let order = u64::from_be_bytes(*a8).cmp(&u64::from_be_bytes(*b8));
        if order.is_ne() {
            return order;
        }
        a_rest = a_tail;
        b_rest = b_tail;
    }
    a_rest.cmp(b_rest)
}

/// Bytes a leaf entry takes in a page, slot included.
pub fn leaf_entry_size(key: &[u8], value: &Val) -> usize {
    2 + match value {
        Val::Inline(v) => 7 + key.len() + v.len(),
        Val::Big(_) => 23 + key.len(),
    }
}

/// Bytes a branch entry takes in a page, slot included.
pub fn branch_entry_size(key: &[u8]) -> usize {
    2 + 10 + key.len()
}

/// Bytes of slots and entries `kind` needs; it fits one page when at most
/// [`NODE_CAPACITY`].
pub fn node_size(kind: &NodeKind) -> usize {
    match kind {
        NodeKind::Leaf { entries } => entries
            .iter()
            .map(|e| leaf_entry_size(&e.key, &e.value))
            .sum(),
        NodeKind::Branch { keys, .. } => keys.iter().map(|k| branch_entry_size(k)).sum(),
    }
}

/// Writes `kind` as page `page` into `buf` (one page). Branch children are
/// given as page ids; overflow values must already have their page and crc.
pub fn encode_node(
    kind: &NodeKind,
    page: u64,
    child_pages: &[u64],
    buf: &mut [u8],
) -> Result<(), String> {
    let buf = &mut buf[..PAGE_SIZE];
    buf.fill(0);
    let size = node_size(kind);
    if size > NODE_CAPACITY {
        return Err(format!("node of {size} bytes does not fit a page"));
    }
    let (kind_byte, count) = match kind {
        NodeKind::Leaf { entries } => (KIND_LEAF, entries.len()),
        NodeKind::Branch { keys, children } => {
            if keys.len() != children.len() || child_pages.len() != children.len() {
                return Err("branch keys and children disagree".into());
            }
            (KIND_BRANCH, keys.len())
        }
    };
    buf[4] = kind_byte;
    buf[6..8].copy_from_slice(&(count as u16).to_le_bytes());
    buf[8..16].copy_from_slice(&page.to_le_bytes());
    let mut at = NODE_HEADER + 2 * count;
    let put = |buf: &mut [u8], at: &mut usize, bytes: &[u8]| {
        buf[*at..*at + bytes.len()].copy_from_slice(bytes);
        *at += bytes.len();
    };
    match kind {
        NodeKind::Leaf { entries } => {
            // Inline values go after every entry, in entry order.
            let records: usize = entries
                .iter()
                .map(|e| match &e.value {
                    Val::Inline(_) => 7 + e.key.len(),
                    Val::Big(_) => 23 + e.key.len(),
                })
                .sum();
            let mut value_at = at + records;
            for (i, e) in entries.iter().enumerate() {
                let slot = NODE_HEADER + 2 * i;
                buf[slot..slot + 2].copy_from_slice(&(at as u16).to_le_bytes());
                put(buf, &mut at, &(e.key.len() as u16).to_le_bytes());
                match &e.value {
                    Val::Inline(v) => {
                        put(buf, &mut at, &[VALUE_APART]);
                        put(buf, &mut at, &(v.len() as u16).to_le_bytes());
                        put(buf, &mut at, &(value_at as u16).to_le_bytes());
                        put(buf, &mut at, &e.key);
                        put(buf, &mut value_at, v);
                    }
                    Val::Big(b) => {
                        let first = b.page();
                        if first == 0 {
                            return Err("overflow value without a page".into());
                        }
                        put(buf, &mut at, &[VALUE_OVERFLOW]);
                        put(buf, &mut at, &b.len.to_le_bytes());
                        put(buf, &mut at, &first.to_le_bytes());
                        put(buf, &mut at, &b.crc().to_le_bytes());
                        put(buf, &mut at, &e.key);
                    }
                }
            }
        }
        NodeKind::Branch { keys, .. } => {
            for (i, (k, child)) in keys.iter().zip(child_pages).enumerate() {
                let slot = NODE_HEADER + 2 * i;
                buf[slot..slot + 2].copy_from_slice(&(at as u16).to_le_bytes());
                put(buf, &mut at, &child.to_le_bytes());
                let k: &[u8] = if i == 0 { &[] } else { k };
                put(buf, &mut at, &(k.len() as u16).to_le_bytes());
                put(buf, &mut at, k);
            }
        }
    }
    let crc = crc32c::crc32c(&buf[4..]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Checks a node page's checksum and that it is page `page`.
pub fn verify_node(buf: &[u8], page: u64) -> Result<(), String> {
    if buf.len() != PAGE_SIZE {
        return Err(format!("page of {} bytes", buf.len()));
    }
    let stored = u32_at(buf, 0);
    let actual = crc32c::crc32c(&buf[4..]);
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    let id = u64_at(buf, 8);
    if id != page {
        return Err(format!("page claims to be page {id}"));
    }
    Ok(())
}

/// Where a point lookup goes next from one node page.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// Descend into this child page.
    Child(u64),
    /// The key is in this leaf, its value inline at this byte range.
    Inline(std::ops::Range<usize>),
    /// The key is in this leaf, its value in an overflow run.
    Big {
        len: u64,
        page: u64,
        crc: u32,
    },
    Absent,
}

/// Looks `key` up in a verified node page without decoding it: a binary
/// search over the slots, every access bounds-checked.
pub fn probe(buf: &[u8], key: &[u8]) -> Result<Probe, String> {
    if buf.len() != PAGE_SIZE {
        return Err("short page".into());
    }
    let count = u16_at(buf, 6) as usize;
    if NODE_HEADER + 2 * count > PAGE_SIZE {
        return Err(format!("entry count {count} overflows the page"));
    }
    let slot = |i: usize| u16_at(buf, NODE_HEADER + 2 * i) as usize;
    let range = |at: usize, n: usize| -> Result<std::ops::Range<usize>, String> {
        match at.checked_add(n) {
            Some(end) if end <= PAGE_SIZE => Ok(at..end),
            _ => Err(format!("entry at {at} overruns the page")),
        }
    };
    match buf[4] {
        KIND_LEAF => {
            prefetch_search(buf, count);
            // Entry i's key.
            let key_at = |i: usize| -> Result<&[u8], String> {
                let at = slot(i);
                range(at, 3)?;
                let klen = u16_at(buf, at) as usize;
                let start = match buf[at + 2] {
                    VALUE_NEXT_TO_KEY => at + 5,
                    VALUE_APART => at + 7,
                    VALUE_OVERFLOW => at + 23,
                    f => return Err(format!("unknown value flag {f}")),
                };
                Ok(&buf[range(start, klen)?])
            };
            let (mut lo, mut hi) = (0, count);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match compare_keys(key_at(mid)?, key) {
                    std::cmp::Ordering::Less => lo = mid + 1,
                    std::cmp::Ordering::Greater => hi = mid,
                    std::cmp::Ordering::Equal => {
                        let at = slot(mid);
                        let klen = u16_at(buf, at) as usize;
                        return if buf[at + 2] == VALUE_APART {
                            range(at + 3, 4)?;
                            let vlen = u16_at(buf, at + 3) as usize;
                            let value_at = u16_at(buf, at + 5) as usize;
                            Ok(Probe::Inline(range(value_at, vlen)?))
                        } else if buf[at + 2] == VALUE_NEXT_TO_KEY {
                            range(at + 3, 2)?;
                            let vlen = u16_at(buf, at + 3) as usize;
                            Ok(Probe::Inline(range(at + 5 + klen, vlen)?))
                        } else {
                            range(at + 3, 20)?;
                            let page = u64_at(buf, at + 11);
                            if page < 2 {
                                return Err(format!("overflow value at page {page}"));
                            }
                            Ok(Probe::Big {
                                len: u64_at(buf, at + 3),
                                page,
                                crc: u32_at(buf, at + 19),
                            })
                        };
                    }
                }
            }
            Ok(Probe::Absent)
        }
        KIND_BRANCH => {
            if count == 0 {
                return Err("branch without children".into());
            }
            prefetch_search(buf, count);
            // The last child whose key is <= `key` (entry 0 has none).
            let (mut lo, mut hi) = (1, count);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let at = slot(mid);
                range(at, 10)?;
                let klen = u16_at(buf, at + 8) as usize;
                if compare_keys(&buf[range(at + 10, klen)?], key).is_le() {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let at = slot(lo - 1);
            range(at, 8)?;
            let child = u64_at(buf, at);
            if child < 2 {
                return Err(format!("child pointer to page {child}"));
            }
            Ok(Probe::Child(child))
        }
        k => Err(format!("unknown page kind {k}")),
    }
}

/// Where a leaf entry's value is, read in place from its page.
#[derive(Debug, PartialEq, Eq)]
pub enum LeafValue {
    Inline(std::ops::Range<usize>),
    Big { len: u64, page: u64, crc: u32 },
}

/// A verified leaf page read in place (scans walk it without decoding it
/// into entries); every access is bounds-checked like [`probe`]'s.
pub struct LeafView<'a> {
    buf: &'a [u8],
    count: usize,
}

impl<'a> LeafView<'a> {
    /// `None` for a branch page.
    pub fn new(buf: &'a [u8]) -> Result<Option<LeafView<'a>>, String> {
        if buf.len() != PAGE_SIZE {
            return Err("short page".into());
        }
        let count = u16_at(buf, 6) as usize;
        if NODE_HEADER + 2 * count > PAGE_SIZE {
            return Err(format!("entry count {count} overflows the page"));
        }
        match buf[4] {
            KIND_LEAF => Ok(Some(LeafView { buf, count })),
            KIND_BRANCH => Ok(None),
            k => Err(format!("unknown page kind {k}")),
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    fn range(at: usize, n: usize) -> Result<std::ops::Range<usize>, String> {
        match at.checked_add(n) {
            Some(end) if end <= PAGE_SIZE => Ok(at..end),
            _ => Err(format!("entry at {at} overruns the page")),
        }
    }

    /// Entry `i` (below [`LeafView::count`]): its key's byte range and its
    /// value.
    pub fn entry(&self, i: usize) -> Result<(std::ops::Range<usize>, LeafValue), String> {
        let buf = self.buf;
        let at = u16_at(buf, NODE_HEADER + 2 * i) as usize;
        Self::range(at, 3)?;
        let klen = u16_at(buf, at) as usize;
        match buf[at + 2] {
            VALUE_APART => {
                Self::range(at + 3, 4)?;
                let vlen = u16_at(buf, at + 3) as usize;
                let value_at = u16_at(buf, at + 5) as usize;
                let key = Self::range(at + 7, klen)?;
                Ok((key, LeafValue::Inline(Self::range(value_at, vlen)?)))
            }
            VALUE_NEXT_TO_KEY => {
                Self::range(at + 3, 2)?;
                let vlen = u16_at(buf, at + 3) as usize;
                let key = Self::range(at + 5, klen)?;
                let value = Self::range(key.end, vlen)?;
                Ok((key, LeafValue::Inline(value)))
            }
            VALUE_OVERFLOW => {
                Self::range(at + 3, 20)?;
                let page = u64_at(buf, at + 11);
                if page < 2 {
                    return Err(format!("overflow value at page {page}"));
                }
                let value = LeafValue::Big {
                    len: u64_at(buf, at + 3),
                    page,
                    crc: u32_at(buf, at + 19),
                };
                Ok((Self::range(at + 23, klen)?, value))
            }
            f => Err(format!("unknown value flag {f}")),
        }
    }

    /// The first entry whose key is above `key` (`after`) or at least
    /// `key`.
    pub fn seek(&self, key: &[u8], after: bool) -> Result<usize, String> {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let k = &self.buf[self.entry(mid)?.0];
            let order = compare_keys(k, key);
            if order.is_lt() || (after && order.is_eq()) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }
}

/// Decodes a verified node page; keys and inline values are zero-copy
/// slices of `page`.
pub fn decode_node(page: &Bytes) -> Result<NodeKind, String> {
    let buf: &[u8] = page;
    if buf.len() != PAGE_SIZE {
        return Err("short page".into());
    }
    let count = u16_at(buf, 6) as usize;
    if NODE_HEADER + 2 * count > PAGE_SIZE {
        return Err(format!("entry count {count} overflows the page"));
    }
    let need = |at: usize, n: usize| -> Result<(), String> {
        if at.checked_add(n).is_some_and(|end| end <= PAGE_SIZE) {
            Ok(())
        } else {
            Err(format!("entry at {at} overruns the page"))
        }
    };
    let mut prev: Option<Bytes> = None;
    let mut check_order = |key: &Bytes, first: bool| -> Result<(), String> {
        if let Some(p) = &prev {
            if !first && p >= key {
                return Err("keys out of order".into());
            }
        }
        prev = Some(key.clone());
        Ok(())
    };
    match buf[4] {
        KIND_LEAF => {
            let mut entries = Vec::with_capacity(count);
            for i in 0..count {
                let at = u16_at(buf, NODE_HEADER + 2 * i) as usize;
                need(at, 3)?;
                let klen = u16_at(buf, at) as usize;
                let value = match buf[at + 2] {
                    VALUE_APART => {
                        need(at + 3, 4 + klen)?;
                        let vlen = u16_at(buf, at + 3) as usize;
                        let value_at = u16_at(buf, at + 5) as usize;
                        need(value_at, vlen)?;
                        let key = page.slice(at + 7..at + 7 + klen);
                        check_order(&key, i == 0)?;
                        let v = page.slice(value_at..value_at + vlen);
                        entries.push(Entry {
                            key,
                            value: Val::Inline(v),
                        });
                        continue;
                    }
                    VALUE_NEXT_TO_KEY => {
                        need(at + 3, 2)?;
                        let vlen = u16_at(buf, at + 3) as usize;
                        let k = at + 5;
                        need(k, klen + vlen)?;
                        let key = page.slice(k..k + klen);
                        check_order(&key, i == 0)?;
                        let v = page.slice(k + klen..k + klen + vlen);
                        entries.push(Entry {
                            key,
                            value: Val::Inline(v),
                        });
                        continue;
                    }
                    VALUE_OVERFLOW => {
                        need(at + 3, 20 + klen)?;
                        let len = u64_at(buf, at + 3);
                        let first = u64_at(buf, at + 11);
                        let crc = u32_at(buf, at + 19);
                        if first < 2 {
                            return Err(format!("overflow value at page {first}"));
                        }
                        (
                            Val::Big(std::sync::Arc::new(BigVal::stored(len, first, crc))),
                            at + 23,
                        )
                    }
                    f => return Err(format!("unknown value flag {f}")),
                };
                let (value, k) = value;
                let key = page.slice(k..k + klen);
                check_order(&key, i == 0)?;
                entries.push(Entry { key, value });
            }
            Ok(NodeKind::Leaf { entries })
        }
        KIND_BRANCH => {
            if count == 0 {
                return Err("branch without children".into());
            }
            let mut keys = Vec::with_capacity(count);
            let mut children = Vec::with_capacity(count);
            for i in 0..count {
                let at = u16_at(buf, NODE_HEADER + 2 * i) as usize;
                need(at, 10)?;
                let child = u64_at(buf, at);
                if child < 2 {
                    return Err(format!("child pointer to page {child}"));
                }
                let klen = u16_at(buf, at + 8) as usize;
                need(at + 10, klen)?;
                let key = page.slice(at + 10..at + 10 + klen);
                check_order(&key, i <= 1)?;
                keys.push(key);
                children.push(Child::Disk(child));
            }
            Ok(NodeKind::Branch { keys, children })
        }
        k => Err(format!("unknown page kind {k}")),
    }
}

/// Bytes a free list of `runs` runs takes.
pub fn freelist_len(runs: usize) -> usize {
    FREELIST_HEADER + 16 * runs
}

/// Writes the free list `runs` as a run starting at page `first` into `buf`
/// (a whole number of pages, at least [`freelist_len`] bytes).
pub fn encode_freelist(first: u64, runs: &[(u64, u64)], buf: &mut [u8]) {
    buf.fill(0);
    buf[4] = KIND_FREELIST;
    buf[8..16].copy_from_slice(&first.to_le_bytes());
    buf[16..24].copy_from_slice(&(runs.len() as u64).to_le_bytes());
    for (i, (start, len)) in runs.iter().enumerate() {
        let at = FREELIST_HEADER + 16 * i;
        buf[at..at + 8].copy_from_slice(&start.to_le_bytes());
        buf[at + 8..at + 16].copy_from_slice(&len.to_le_bytes());
    }
    let crc = crc32c::crc32c(&buf[4..]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a free-list run that starts at page `first`.
pub fn decode_freelist(first: u64, buf: &[u8]) -> Result<Vec<(u64, u64)>, String> {
    if buf.len() < FREELIST_HEADER {
        return Err("short free list".into());
    }
    let stored = u32_at(buf, 0);
    let actual = crc32c::crc32c(&buf[4..]);
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    if buf[4] != KIND_FREELIST || u64_at(buf, 8) != first {
        return Err("not the free list this meta points at".into());
    }
    let count = u64_at(buf, 16);
    if count > ((buf.len() - FREELIST_HEADER) / 16) as u64 {
        return Err(format!("{count} runs overflow the free list"));
    }
    Ok((0..count as usize)
        .map(|i| {
            let at = FREELIST_HEADER + 16 * i;
            (u64_at(buf, at), u64_at(buf, at + 8))
        })
        .collect())
}

/// Fuzzing: seals `data` (cut or zero-padded to a page) as node page 9
/// and runs every node decoder over it, and the meta decoder over a sealed
/// meta page made of the same bytes. See [`crate::fuzzing`].
pub fn fuzz_decoders(data: &[u8]) {
    let mut buf = vec![0u8; PAGE_SIZE];
    let n = data.len().min(PAGE_SIZE);
    buf[..n].copy_from_slice(&data[..n]);
    let key = data.get(PAGE_SIZE..).unwrap_or_default();
    buf[8..16].copy_from_slice(&9u64.to_le_bytes());
    seal_node(&mut buf);
    if verify_node(&buf, 9).is_err() {
        return;
    }
    let _ = decode_node(&Bytes::from(buf.clone()));
    let _ = probe(&buf, key);
    if let Ok(Some(view)) = LeafView::new(&buf) {
        for i in 0..view.count() {
            let _ = view.entry(i);
        }
        let _ = view.seek(key, true);
        let _ = view.seek(key, false);
    }
    let _ = decode_freelist(9, &buf);
    seal_meta(&mut buf);
    let _ = decode_meta(&buf);
}

/// Fuzzing: `data` as a data file, zero-padded to whole pages (at least
/// the two meta pages), pages 0 and 1 sealed as meta pages, every other
/// page whose kind byte names a node or free-list page sealed as one, with
/// its own id.
pub fn fuzz_sealed_file(data: &[u8]) -> Vec<u8> {
    let pages = data.len().div_ceil(PAGE_SIZE).max(2);
    let mut file = vec![0u8; pages * PAGE_SIZE];
    file[..data.len()].copy_from_slice(data);
    for (i, page) in file.chunks_mut(PAGE_SIZE).enumerate() {
        if i < 2 {
            seal_meta(page);
        } else if (KIND_LEAF..=KIND_FREELIST).contains(&page[4]) {
            // Overflow pages carry raw value bytes and no header.
            page[8..16].copy_from_slice(&(i as u64).to_le_bytes());
            seal_node(page);
        }
    }
    file
}

fn seal_node(buf: &mut [u8]) {
    let crc = crc32c::crc32c(&buf[4..]);
    buf[0..4].copy_from_slice(&crc.to_le_bytes());
}

fn seal_meta(buf: &mut [u8]) {
    buf[0..8].copy_from_slice(&MAGIC);
    buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[12..16].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    let crc = crc32c::crc32c(&buf[..META_LEN]);
    buf[META_LEN..META_LEN + 4].copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn meta_round_trips_and_rejects_damage() {
        let meta = Meta {
            txn: 7,
            root: 9,
            freelist_page: 11,
            freelist_pages: 1,
            page_count: 12,
            applied_index: 42,
        };
        let mut buf = vec![0u8; PAGE_SIZE];
        encode_meta(&meta, &mut buf);
        assert!(matches!(decode_meta(&buf), MetaSlot::Valid(m) if m == meta));
        buf[20] ^= 1;
        assert!(matches!(decode_meta(&buf), MetaSlot::Damaged));
        buf[0] = b'X';
        assert!(matches!(decode_meta(&buf), MetaSlot::Foreign));
    }

    #[test]
    fn node_round_trips_and_detects_flips() {
        let entries = vec![
            Entry {
                key: Bytes::from_static(b"a"),
                value: Val::Inline(Bytes::from_static(b"1")),
            },
            Entry {
                key: Bytes::from_static(b"b"),
                value: Val::Inline(Bytes::new()),
            },
        ];
        let kind = NodeKind::Leaf { entries };
        let mut buf = vec![0u8; PAGE_SIZE];
        encode_node(&kind, 5, &[], &mut buf).unwrap();
        verify_node(&buf, 5).unwrap();
        assert!(verify_node(&buf, 6).is_err());
        let NodeKind::Leaf { entries } = decode_node(&Bytes::from(buf.clone())).unwrap() else {
            panic!("not a leaf")
        };
        assert_eq!(entries.len(), 2);
        assert_eq!(&entries[0].key[..], b"a");
        let Probe::Inline(r) = probe(&buf, b"a").unwrap() else {
            panic!("a not found")
        };
        assert_eq!(&buf[r], b"1");
        assert!(matches!(probe(&buf, b"b").unwrap(), Probe::Inline(r) if r.is_empty()));
        assert_eq!(probe(&buf, b"ab").unwrap(), Probe::Absent);
        assert_eq!(probe(&buf, b"").unwrap(), Probe::Absent);
        assert_eq!(probe(&buf, b"c").unwrap(), Probe::Absent);
        buf[100] ^= 0x40;
        assert!(verify_node(&buf, 5).is_err());
    }

    /// A leaf written by format version 1 (values next to their keys)
    /// reads back through every reader; this version writes values apart.
    #[test]
    fn format_1_leaves_still_read() {
        let pairs: [(&[u8], &[u8]); 3] = [(b"apple", b"red"), (b"kiwi", b""), (b"plum", b"purple")];
        let mut buf = vec![0u8; PAGE_SIZE];
        buf[4] = KIND_LEAF;
        buf[6..8].copy_from_slice(&(pairs.len() as u16).to_le_bytes());
        buf[8..16].copy_from_slice(&9u64.to_le_bytes());
        let mut at = NODE_HEADER + 2 * pairs.len();
        for (i, (k, v)) in pairs.iter().enumerate() {
            buf[NODE_HEADER + 2 * i..NODE_HEADER + 2 * i + 2]
                .copy_from_slice(&(at as u16).to_le_bytes());
            let mut entry = (k.len() as u16).to_le_bytes().to_vec();
            entry.push(VALUE_NEXT_TO_KEY);
            entry.extend_from_slice(&(v.len() as u16).to_le_bytes());
            entry.extend_from_slice(k);
            entry.extend_from_slice(v);
            buf[at..at + entry.len()].copy_from_slice(&entry);
            at += entry.len();
        }
        let crc = crc32c::crc32c(&buf[4..]);
        buf[0..4].copy_from_slice(&crc.to_le_bytes());
        verify_node(&buf, 9).unwrap();

        let NodeKind::Leaf { entries } = decode_node(&Bytes::from(buf.clone())).unwrap() else {
            panic!("not a leaf")
        };
        let view = LeafView::new(&buf).unwrap().unwrap();
        for (i, (k, v)) in pairs.iter().enumerate() {
            assert_eq!(&entries[i].key[..], *k);
            assert!(matches!(&entries[i].value, Val::Inline(got) if got[..] == **v));
            let Probe::Inline(r) = probe(&buf, k).unwrap() else {
                panic!("{k:?} not found")
            };
            assert_eq!(&buf[r], *v);
            let (key, LeafValue::Inline(value)) = view.entry(i).unwrap() else {
                panic!("not inline")
            };
            assert_eq!((&buf[key], &buf[value]), (*k, *v));
        }
        assert_eq!(probe(&buf, b"banana").unwrap(), Probe::Absent);

        // Re-encoded, the same entries come back with their values apart.
        let mut again = vec![0u8; PAGE_SIZE];
        encode_node(&NodeKind::Leaf { entries }, 9, &[], &mut again).unwrap();
        let at = u16_at(&again, NODE_HEADER) as usize;
        assert_eq!(again[at + 2], VALUE_APART);
        let Probe::Inline(r) = probe(&again, b"plum").unwrap() else {
            panic!("plum not found")
        };
        assert_eq!(&again[r], b"purple");
    }

    #[test]
    fn branch_probe_routes_like_the_tree() {
        let kind = NodeKind::Branch {
            keys: vec![
                Bytes::new(),
                Bytes::from_static(b"m"),
                Bytes::from_static(b"t"),
            ],
            children: vec![Child::Disk(7), Child::Disk(8), Child::Disk(9)],
        };
        let mut buf = vec![0u8; PAGE_SIZE];
        encode_node(&kind, 3, &[7, 8, 9], &mut buf).unwrap();
        for (key, child) in [
            (&b""[..], 7),
            (b"a", 7),
            (b"m", 8),
            (b"s", 8),
            (b"t", 9),
            (b"zz", 9),
        ] {
            assert_eq!(probe(&buf, key).unwrap(), Probe::Child(child), "{key:?}");
        }
    }

    #[test]
    fn leaf_view_reads_entries_in_place() {
        let entries = ["b", "d", "f"]
            .iter()
            .map(|k| Entry {
                key: Bytes::from(*k),
                value: Val::Inline(Bytes::from(format!("v{k}"))),
            })
            .collect();
        let mut buf = vec![0u8; PAGE_SIZE];
        encode_node(&NodeKind::Leaf { entries }, 5, &[], &mut buf).unwrap();
        let view = LeafView::new(&buf).unwrap().unwrap();
        assert_eq!(view.count(), 3);
        let (k, v) = view.entry(1).unwrap();
        assert_eq!(&buf[k], b"d");
        let LeafValue::Inline(v) = v else {
            panic!("not inline")
        };
        assert_eq!(&buf[v], b"vd");
        for (key, after, at) in [
            (&b"a"[..], false, 0),
            (b"b", false, 0),
            (b"b", true, 1),
            (b"c", false, 1),
            (b"f", true, 3),
            (b"g", false, 3),
        ] {
            assert_eq!(view.seek(key, after).unwrap(), at, "{key:?} {after}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// Decoders never panic on garbage that passes the checksum (a bug
        /// or a collision): they return an error or some entries.
        #[test]
        fn decoders_survive_garbage_with_a_valid_checksum(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), PAGE_SIZE),
            kind in 0u8..4,
            count in 0u16..600,
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..8),
        ) {
            let mut data = body;
            data[4] = kind;
            data[6..8].copy_from_slice(&count.to_le_bytes());
            data.extend_from_slice(&key);
            fuzz_decoders(&data);
        }
    }

    proptest::proptest! {
        #[test]
        fn compare_keys_orders_like_slices(
            a in proptest::collection::vec(0u8..4, 0..20),
            b in proptest::collection::vec(0u8..4, 0..20),
        ) {
            proptest::prop_assert_eq!(compare_keys(&a, &b), a.cmp(&b));
        }
    }

    #[test]
    fn freelist_round_trips() {
        let runs = vec![(3, 2), (9, 1)];
        let mut buf = vec![0u8; PAGE_SIZE];
        encode_freelist(4, &runs, &mut buf);
        assert_eq!(decode_freelist(4, &buf).unwrap(), runs);
        assert!(decode_freelist(5, &buf).is_err());
    }
}
