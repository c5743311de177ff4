//! Sorted string tables: the lsm engine's immutable on-disk runs.
//!
//! This module owns the SST file format, writing a table from a sorted
//! stream of entries ([`TableBuilder`]) and reading one back ([`Table`]:
//! point lookups and positioned iterators). It must never hand out bytes
//! whose checksum it has not verified, nor cache an unverified block (a
//! block it sealed itself while writing counts as verified): a mismatch is
//! an [`Error::Corrupt`] naming the file and the block offset. Sequential
//! readers (compactions, streaming scans) read many blocks per direct read
//! and verify each.
//! Deciding which tables are live is not its job; a table only deletes its
//! file when the engine marked it obsolete and its last reader let go.
//!
//! # Format (version 1, integers little-endian)
//!
//! All I/O is direct, so every region starts on a 4096-byte boundary and is
//! zero-padded to one:
//!
//! ```text
//! page 0        header: "METCDSST" | version u32 | crc32c u32
//! data blocks   ≤ 4096 bytes each unless one entry is bigger:
//!                 entries: shared varint | unshared varint |
//!                          value_len+1 varint (0 = tombstone) | seq u64 |
//!                          key suffix | value
//!                 restart offsets u32 × n | n u32 | crc32c u32
//! filter block  bloom bits | probe count u8 | crc32c u32
//! index block   n u32 | n × (last key: len u32 + bytes | last seq u64 |
//!               offset u64 | len u32) | smallest key | largest key | crc32c
//! last page     footer: "METCDSST" | version u32 | index off u64, len u32 |
//!               filter off u64, len u32 | entry count u64 | crc32c u32
//! ```
//!
//! Keys are prefix-compressed against the previous entry of their block,
//! with a full key every [`RESTART_INTERVAL`] entries so a lookup binary
//! searches the restarts. A block's `len` (in the index) excludes padding.
//! Every version of one user key lands in the same table (compaction cuts
//! tables only between user keys), which keeps levels ≥ 1 disjoint.

use std::cmp::Ordering as CmpOrdering;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::format::{
    cmp_internal, failpoint, put_len_prefixed, put_varint, seal, unseal, Entry, EntryIter, Reader,
    FORMAT_VERSION, SST_MAGIC,
};
use crate::io::{round_up, AlignedBuf, BlockCache, DirectFile, ALIGN};
use crate::{Error, Result};

/// Target size of a data block including its trailer: one aligned page.
const BLOCK_BYTES: usize = ALIGN;
/// Entries between two full (uncompressed) keys in a data block.
const RESTART_INTERVAL: usize = 16;
/// Padded blocks are staged up to this size before one batched write: each
/// write waits for its completion, so fewer, larger ones stream faster.
const STAGE_BYTES: usize = 1 << 20;
/// A compaction reads its inputs this much at a time: one direct read of
/// many consecutive blocks costs about what a single 4 KiB read costs.
const COMPACTION_READAHEAD_BYTES: usize = 1 << 20;
/// A scan that has already read one block from disk and needs the next
/// reads this much ahead (and caches it): a scan streams blocks in order.
const SCAN_READAHEAD_BYTES: usize = 64 << 10;
/// Sealed footer length: magic 8, version 4, index 12, filter 12,
/// entry count 8, crc 4.
const FOOTER_BYTES: usize = 48;
/// Bloom probes per key; ~optimal for 10 bits per key (ln 2 × 10 ≈ 7).
const MAX_BLOOM_PROBES: u32 = 30;

pub(crate) fn sst_name(file_no: u64) -> String {
    format!("{file_no:016x}.sst")
}

/// The file number of an SST file name, if it is one.
pub(crate) fn parse_sst_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".sst")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

fn corrupt(what: &'static str, path: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        what,
        path: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn bloom_hash(key: &[u8]) -> u64 {
    // FNV-1a, then a splitmix64 finaliser to spread the bits: the two
    // 32-bit halves drive double hashing.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn bloom_build(hashes: &[u64], bits_per_key: usize) -> Vec<u8> {
    let bits = (hashes.len() * bits_per_key).max(64);
    let bytes = bits.div_ceil(8);
    let bits = bytes * 8;
    let probes = ((bits_per_key as f64 * 0.69) as u32).clamp(1, MAX_BLOOM_PROBES);
    let mut out = vec![0u8; bytes];
    for &h in hashes {
        let (mut a, b) = (h as u32, (h >> 32) as u32 | 1);
        for _ in 0..probes {
            let bit = a as usize % bits;
            out[bit / 8] |= 1 << (bit % 8);
            a = a.wrapping_add(b);
        }
    }
    out.push(probes as u8);
    out
}

fn bloom_may_contain(filter: &[u8], key: &[u8]) -> bool {
    let Some((&probes, bits)) = filter.split_last() else {
        return true;
    };
    if bits.is_empty() {
        return true;
    }
    let nbits = bits.len() * 8;
    let h = bloom_hash(key);
    let (mut a, b) = (h as u32, (h >> 32) as u32 | 1);
    for _ in 0..probes {
        let bit = a as usize % nbits;
        if bits[bit / 8] & (1 << (bit % 8)) == 0 {
            return false;
        }
        a = a.wrapping_add(b);
    }
    true
}

/// What the manifest records about a finished table.
#[derive(Debug, Clone)]
pub(crate) struct TableMeta {
    pub file_no: u64,
    pub size: u64,
    pub smallest: Bytes,
    pub largest: Bytes,
}

/// Where a data block lies in its table's file: offset, sealed length.
pub(crate) type BlockSpan = (u64, u32);

struct IndexEntry {
    last_key: Bytes,
    last_seq: u64,
    offset: u64,
    len: u32,
}

/// Which written blocks a [`TableBuilder`] puts in the block cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheFill {
    /// Where the cache has room (a compaction's output: the blocks readers
    /// use now must not be pushed out by a bulk rewrite).
    IfRoom,
    /// Evicting colder blocks (a flush: the newest data is the likeliest
    /// read, and each point read looks into every level-0 table).
    Evict,
}

/// Writes one table from entries added in internal key order.
pub(crate) struct TableBuilder {
    file: DirectFile,
    file_no: u64,
    cache: Arc<BlockCache>,
    /// Whether written data blocks go into the cache (with O_DIRECT no page
    /// cache keeps a table just written).
    fill: CacheFill,
    /// Failpoint prefix, e.g. `lsm::flush`: which background job writes.
    ctx: &'static str,
    bloom_bits_per_key: usize,
    /// Padded blocks waiting for one batched write (reused for the whole
    /// table): `staged[..staged_len]` goes to `staged_offset`.
    staged: AlignedBuf,
    staged_len: usize,
    staged_offset: u64,
    block: Vec<u8>,
    restarts: Vec<u32>,
    block_count: usize,
    last_key: Vec<u8>,
    last_seq: u64,
    index: Vec<IndexEntry>,
    hashes: Vec<u64>,
    entries: u64,
    smallest: Option<Bytes>,
    /// Where the next block goes (file length after what is staged).
    offset: u64,
}

impl TableBuilder {
    pub fn create(
        dir: &Path,
        file_no: u64,
        ctx: &'static str,
        bloom_bits_per_key: usize,
        cache: Arc<BlockCache>,
        fill: CacheFill,
    ) -> Result<TableBuilder> {
        let path = dir.join(sst_name(file_no));
        let file = DirectFile::open(&path, true)?;
        // A leftover from a failed attempt with this number is garbage.
        file.set_len(0)?;
        let mut header = Vec::with_capacity(16);
        header.extend_from_slice(SST_MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        seal(&mut header);
        let mut staged = AlignedBuf::zeroed(STAGE_BYTES);
        staged[..header.len()].copy_from_slice(&header);
        Ok(TableBuilder {
            file,
            file_no,
            cache,
            fill,
            ctx,
            bloom_bits_per_key,
            staged,
            staged_len: ALIGN,
            staged_offset: 0,
            block: Vec::with_capacity(BLOCK_BYTES),
            restarts: Vec::new(),
            block_count: 0,
            last_key: Vec::new(),
            last_seq: 0,
            index: Vec::new(),
            hashes: Vec::new(),
            entries: 0,
            smallest: None,
            offset: ALIGN as u64,
        })
    }

    /// Bytes written or buffered so far: where compaction cuts tables.
    pub fn estimated_size(&self) -> u64 {
        self.offset + self.block.len() as u64
    }

    /// Adds the next entry; entries must come in strictly increasing
    /// internal key order.
    pub fn add(&mut self, key: &[u8], seq: u64, value: Option<&[u8]>) -> Result<()> {
        let value_len = value.map_or(0, <[u8]>::len);
        // Worst-case encoded size: three varints, the sequence, key, value.
        let worst = 30 + 8 + key.len() + value_len;
        let trailer = (self.restarts.len() + 2) * 4 + 4;
        if self.block_count > 0 && self.block.len() + worst + trailer > BLOCK_BYTES {
            self.finish_block()?;
        }
        if self.smallest.is_none() {
            self.smallest = Some(Bytes::copy_from_slice(key));
        }
        // (The first key counts even when it equals the empty `last_key`.)
        if self.entries == 0 || self.last_key.as_slice() != key {
            self.hashes.push(bloom_hash(key));
        }
        let shared = if self.block_count.is_multiple_of(RESTART_INTERVAL) {
            self.restarts.push(self.block.len() as u32);
            0
        } else {
            self.last_key
                .iter()
                .zip(key)
                .take_while(|(a, b)| a == b)
                .count()
        };
        put_varint(&mut self.block, shared as u64);
        put_varint(&mut self.block, (key.len() - shared) as u64);
        put_varint(&mut self.block, value.map_or(0, |v| v.len() as u64 + 1));
        self.block.extend_from_slice(&seq.to_le_bytes());
        self.block.extend_from_slice(&key[shared..]);
        if let Some(v) = value {
            self.block.extend_from_slice(v);
        }
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.last_seq = seq;
        self.block_count += 1;
        self.entries += 1;
        Ok(())
    }

    fn finish_block(&mut self) -> Result<()> {
        if self.block_count == 0 {
            return Ok(());
        }
        for r in &self.restarts {
            self.block.extend_from_slice(&r.to_le_bytes());
        }
        self.block
            .extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        seal(&mut self.block);
        let block = std::mem::take(&mut self.block);
        let (offset, len) = self.stage(&block)?;
        // The block is sealed by us, so its checksum is right by
        // construction. A failed table is forgotten by its cleanup.
        match self.fill {
            CacheFill::IfRoom => {
                self.cache
                    .insert_if_room(self.file_no, offset, Arc::from(&block[..]));
            }
            CacheFill::Evict => {
                self.cache
                    .insert(self.file_no, offset, Arc::from(&block[..]));
            }
        }
        self.index.push(IndexEntry {
            last_key: Bytes::copy_from_slice(&self.last_key),
            last_seq: self.last_seq,
            offset,
            len,
        });
        self.block = block;
        self.block.clear();
        self.restarts.clear();
        self.block_count = 0;
        Ok(())
    }

    /// Appends a sealed block (padded to the alignment) to the staging
    /// buffer, writing the buffer out first when the block does not fit.
    /// Returns the block's file offset and unpadded length.
    fn stage(&mut self, block: &[u8]) -> Result<(u64, u32)> {
        let len = u32::try_from(block.len())
            .map_err(|_| Error::Invalid(format!("sst block of {} bytes", block.len())))?;
        let offset = self.offset;
        let padded = round_up(block.len());
        if self.staged_len + padded > self.staged.capacity() {
            self.write_staged()?;
        }
        if padded > self.staged.capacity() {
            // One entry larger than the staging buffer: written on its own.
            failpoint(&format!("{}::sst_write", self.ctx), self.file.path())?;
            self.file
                .write_all_at(&[(offset, &AlignedBuf::from_slice(block))])?;
            self.staged_offset = offset + padded as u64;
        } else {
            let at = self.staged_len;
            self.staged[at..at + block.len()].copy_from_slice(block);
            self.staged[at + block.len()..at + padded].fill(0);
            self.staged_len += padded;
        }
        self.offset += padded as u64;
        Ok((offset, len))
    }

    fn write_staged(&mut self) -> Result<()> {
        if self.staged_len == 0 {
            return Ok(());
        }
        failpoint(&format!("{}::sst_write", self.ctx), self.file.path())?;
        self.staged.set_len(self.staged_len);
        let written = self
            .file
            .write_all_at(&[(self.staged_offset, &self.staged)]);
        self.staged.set_len(self.staged.capacity());
        written?;
        self.staged_offset += self.staged_len as u64;
        self.staged_len = 0;
        Ok(())
    }

    /// Writes filter, index and footer, and makes the file durable (its
    /// directory entry is made durable by the caller's `sync_dir`). Returns
    /// the table ready to read: index and filter are the ones just written,
    /// so nothing is read back.
    pub fn finish(mut self) -> Result<Table> {
        self.finish_block()?;
        let largest = Bytes::copy_from_slice(&self.last_key);
        let smallest = self.smallest.clone().unwrap_or_default();

        let bloom = bloom_build(&self.hashes, self.bloom_bits_per_key);
        let mut filter = bloom.clone();
        seal(&mut filter);
        let (filter_off, filter_len) = self.stage(&filter)?;

        let mut index = Vec::new();
        index.extend_from_slice(&(self.index.len() as u32).to_le_bytes());
        for e in &self.index {
            put_len_prefixed(&mut index, &e.last_key)?;
            index.extend_from_slice(&e.last_seq.to_le_bytes());
            index.extend_from_slice(&e.offset.to_le_bytes());
            index.extend_from_slice(&e.len.to_le_bytes());
        }
        put_len_prefixed(&mut index, &smallest)?;
        put_len_prefixed(&mut index, &largest)?;
        seal(&mut index);
        let (index_off, index_len) = self.stage(&index)?;

        let mut footer = Vec::with_capacity(64);
        footer.extend_from_slice(SST_MAGIC);
        footer.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        footer.extend_from_slice(&index_off.to_le_bytes());
        footer.extend_from_slice(&index_len.to_le_bytes());
        footer.extend_from_slice(&filter_off.to_le_bytes());
        footer.extend_from_slice(&filter_len.to_le_bytes());
        footer.extend_from_slice(&self.entries.to_le_bytes());
        seal(&mut footer);
        self.stage(&footer)?;
        self.write_staged()?;

        failpoint(&format!("{}::sst_sync", self.ctx), self.file.path())?;
        self.file.sync_data()?;
        Ok(Table {
            meta: TableMeta {
                file_no: self.file_no,
                size: self.offset,
                smallest,
                largest,
            },
            file: self.file,
            cache: self.cache,
            index: self.index,
            filter: bloom,
            obsolete: AtomicBool::new(false),
        })
    }
}

/// An open, verified table. Index and filter live in memory; data blocks
/// come through the engine's block cache.
pub(crate) struct Table {
    pub meta: TableMeta,
    file: DirectFile,
    cache: Arc<BlockCache>,
    index: Vec<IndexEntry>,
    filter: Vec<u8>,
    /// Set once a synced manifest no longer lists this table: the file is
    /// deleted when the last version holding it is dropped.
    obsolete: AtomicBool,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({})", self.file.path().display())
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        if self.obsolete.load(Ordering::Acquire) {
            self.cache.forget_file(self.meta.file_no);
            // A failure leaves an orphan that the next open deletes.
            let _ = std::fs::remove_file(self.file.path());
        }
    }
}

impl Table {
    pub fn open(dir: &Path, file_no: u64, cache: Arc<BlockCache>) -> Result<Table> {
        let path = dir.join(sst_name(file_no));
        let file = DirectFile::open(&path, false)?;
        let len = file.len()?;
        if len < 2 * ALIGN as u64 || !len.is_multiple_of(ALIGN as u64) {
            return Err(corrupt(
                "sst file",
                &path,
                len,
                format!("bad file length {len}"),
            ));
        }
        let header = read_raw(&file, 0, ALIGN)?;
        check_magic(&path, 0, &header[..16])?;
        let footer_off = len - ALIGN as u64;
        let footer = read_raw(&file, footer_off, ALIGN)?;
        check_magic(&path, footer_off, &footer)?;
        let body = unseal(&footer[..FOOTER_BYTES])
            .ok_or_else(|| corrupt("sst footer", &path, footer_off, "checksum mismatch"))?;
        let bad_footer = || corrupt("sst footer", &path, footer_off, "truncated");
        let mut r = Reader::new(&body[12..]);
        let index_off = r.u64().ok_or_else(bad_footer)?;
        let index_len = r.u32().ok_or_else(bad_footer)?;
        let filter_off = r.u64().ok_or_else(bad_footer)?;
        let filter_len = r.u32().ok_or_else(bad_footer)?;

        let index_block = read_sealed(&file, index_off, index_len, footer_off, "sst index block")?;
        let bad_index = || corrupt("sst index block", &path, index_off, "truncated");
        let mut r = Reader::new(&index_block);
        let n = r.u32().ok_or_else(bad_index)?;
        let mut index = Vec::with_capacity(n.min(1 << 20) as usize);
        // Blocks lie back to back after the header page, in index order
        // (sequential readers rely on it): each at or after the previous
        // one's padded end.
        let mut next_block = ALIGN as u64;
        for _ in 0..n {
            let last_key = Bytes::copy_from_slice(r.len_prefixed().ok_or_else(bad_index)?);
            let last_seq = r.u64().ok_or_else(bad_index)?;
            let offset = r.u64().ok_or_else(bad_index)?;
            let block_len = r.u32().ok_or_else(bad_index)?;
            if !offset.is_multiple_of(ALIGN as u64)
                || offset < next_block
                || !within(offset, block_len, footer_off)
            {
                return Err(corrupt(
                    "sst index block",
                    &path,
                    index_off,
                    "block out of range",
                ));
            }
            next_block = offset + round_up(block_len as usize) as u64;
            index.push(IndexEntry {
                last_key,
                last_seq,
                offset,
                len: block_len,
            });
        }
        let smallest = Bytes::copy_from_slice(r.len_prefixed().ok_or_else(bad_index)?);
        let largest = Bytes::copy_from_slice(r.len_prefixed().ok_or_else(bad_index)?);
        let filter = read_sealed(
            &file,
            filter_off,
            filter_len,
            footer_off,
            "sst filter block",
        )?
        .to_vec();
        Ok(Table {
            meta: TableMeta {
                file_no,
                size: len,
                smallest,
                largest,
            },
            file,
            cache,
            index,
            filter,
            obsolete: AtomicBool::new(false),
        })
    }

    pub fn mark_obsolete(&self) {
        self.obsolete.store(true, Ordering::Release);
    }

    /// Whether `[smallest, largest]` of this table meets the user-key range.
    pub fn overlaps(&self, lo: &[u8], hi: &[u8]) -> bool {
        self.meta.smallest.as_ref() <= hi && lo <= self.meta.largest.as_ref()
    }

    /// The newest version of `key` with a sequence <= `seq` in this table.
    pub fn get(&self, key: &[u8], seq: u64) -> Result<Option<Option<Bytes>>> {
        self.get_or(key, seq, &mut || {})
    }

    /// [`Table::get`], calling `before_read` first when the block it needs
    /// is not cached.
    pub fn get_or(
        &self,
        key: &[u8],
        seq: u64,
        before_read: &mut dyn FnMut(),
    ) -> Result<Option<Option<Bytes>>> {
        let Some(e) = self.block_of(key, seq) else {
            return Ok(None);
        };
        let data = self.data_block_or(e.offset, e.len, true, before_read)?;
        let mut cursor = BlockCursor::new(data, self.file.path(), e.offset)?;
        cursor.seek(key, seq)?;
        Ok((cursor.valid && cursor.key == key).then(|| cursor.value()))
    }

    /// The block that may hold `key` at `seq`: none where the table's key
    /// range or its bloom filter rules the key out.
    fn block_of(&self, key: &[u8], seq: u64) -> Option<&IndexEntry> {
        if !self.may_contain(key) {
            return None;
        }
        self.index.get(self.block_for(key, seq))
    }

    /// Where a [`Table::get`] of `key` at `seq` would read from the file
    /// (offset, sealed length): none where the table rules the key out or
    /// the block is cached.
    pub fn uncached_block_of(&self, key: &[u8], seq: u64) -> Option<BlockSpan> {
        self.block_of(key, seq)
            .filter(|e| !self.cache.contains(self.meta.file_no, e.offset))
            .map(|e| (e.offset, e.len))
    }

    /// Whether the table may hold `key` (its key range and bloom filter).
    pub fn may_contain(&self, key: &[u8]) -> bool {
        key >= self.meta.smallest.as_ref()
            && key <= self.meta.largest.as_ref()
            && bloom_may_contain(&self.filter, key)
    }

    /// Brings the data blocks at `blocks` (offset, sealed length, from
    /// [`Table::uncached_block_of`]) into the cache with reads all in
    /// flight at once. Best effort: a block that fails to read or verify is
    /// left out, for the ordinary read that follows to report.
    pub fn prefetch(&self, blocks: &mut Vec<BlockSpan>) {
        blocks.sort_unstable();
        blocks.dedup();
        let mut reads: Vec<(u64, AlignedBuf)> = blocks
            .iter()
            .map(|&(offset, len)| (offset, AlignedBuf::zeroed(round_up(len as usize))))
            .collect();
        if reads.len() < 2 || self.file.read_many_at(&mut reads).is_err() {
            return;
        }
        for (&(offset, len), (_, raw)) in blocks.iter().zip(&reads) {
            let sealed = &raw[..len as usize];
            if unseal(sealed).is_some() {
                // Referenced: read ahead, it must outlive the sweeps until
                // its reader gets to it.
                self.cache
                    .insert_referenced(self.meta.file_no, offset, Arc::from(sealed));
            }
        }
    }

    /// Index of the first block whose last entry is at/after `(key, seq)`.
    fn block_for(&self, key: &[u8], seq: u64) -> usize {
        self.index.partition_point(|e| {
            cmp_internal(&e.last_key, e.last_seq, key, seq) == CmpOrdering::Less
        })
    }

    /// A verified data block, from the cache or the disk; `fill_cache`
    /// false (compaction's one-pass reads) leaves the cache to hot blocks.
    fn data_block(&self, offset: u64, len: u32, fill_cache: bool) -> Result<Bytes> {
        self.data_block_or(offset, len, fill_cache, &mut || {})
    }

    /// [`Table::data_block`], calling `before_read` first on a cache miss.
    fn data_block_or(
        &self,
        offset: u64,
        len: u32,
        fill_cache: bool,
        before_read: &mut dyn FnMut(),
    ) -> Result<Bytes> {
        let block = match self.cache.get(self.meta.file_no, offset) {
            Some(b) => b,
            None => {
                before_read();
                let raw = read_raw(&self.file, offset, len as usize)?;
                if unseal(&raw[..len as usize]).is_none() {
                    return Err(corrupt(
                        "sst data block",
                        self.file.path(),
                        offset,
                        "checksum mismatch",
                    ));
                }
                let block: Arc<[u8]> = Arc::from(&raw[..len as usize]);
                if fill_cache {
                    self.cache.insert(self.meta.file_no, offset, block.clone());
                }
                block
            }
        };
        // Drop the crc; the owner keeps the cached block alive for views.
        let body_len = block.len().saturating_sub(4);
        Ok(Bytes::from_owner(block).slice(..body_len))
    }

    /// Reads the data blocks from `first` on that fit in `max_bytes` of
    /// the file (at least one) with a single direct read, verifies each,
    /// and returns them sealed (crc included, as the cache holds them), in
    /// order.
    fn read_blocks(&self, first: usize, max_bytes: usize) -> Result<Vec<Bytes>> {
        let Some(start) = self.index.get(first).map(|e| e.offset) else {
            return Ok(Vec::new());
        };
        // Blocks are laid out back to back, each padded to the alignment.
        let mut end = first;
        let mut span = 0usize;
        while let Some(e) = self.index.get(end) {
            let e_end = (e.offset - start) as usize + round_up(e.len as usize);
            if end > first && e_end > max_bytes {
                break;
            }
            span = e_end;
            end += 1;
        }
        let raw = read_raw(&self.file, start, span)?;
        let chunk = Bytes::from_owner(AlignedOwner(raw));
        let mut out = Vec::with_capacity(end - first);
        for e in &self.index[first..end] {
            let at = (e.offset - start) as usize;
            let sealed = chunk.slice(at..at + e.len as usize);
            if unseal(&sealed).is_none() {
                return Err(corrupt(
                    "sst data block",
                    self.file.path(),
                    e.offset,
                    "checksum mismatch",
                ));
            }
            out.push(sealed);
        }
        Ok(out)
    }

    /// Loads this table's data blocks into the cache, in large reads, where
    /// the cache has room (never evicting); false if more than half of them
    /// found none (the cache is full: warming more would be wasted reads).
    /// A compaction's outputs replace blocks readers had cached, and with
    /// O_DIRECT no page cache would serve them in the meantime.
    pub fn warm_cache(&self) -> Result<bool> {
        let (mut block, mut refused) = (0, 0);
        while block < self.index.len() {
            let blocks = self.read_blocks(block, COMPACTION_READAHEAD_BYTES)?;
            if blocks.is_empty() {
                break;
            }
            for sealed in blocks {
                let offset = self.index[block].offset;
                if !self
                    .cache
                    .insert_if_room(self.meta.file_no, offset, Arc::from(&sealed[..]))
                {
                    refused += 1;
                }
                block += 1;
            }
        }
        Ok(refused * 2 <= self.index.len())
    }
}

/// The body (crc dropped) of a sealed block.
fn body(sealed: Bytes) -> Bytes {
    let body_len = sealed.len().saturating_sub(4);
    sealed.slice(..body_len)
}

/// Lets a whole read-ahead buffer back the `Bytes` views of its blocks.
struct AlignedOwner(AlignedBuf);

impl AsRef<[u8]> for AlignedOwner {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn check_magic(path: &Path, offset: u64, page: &[u8]) -> Result<()> {
    if &page[..8] != SST_MAGIC {
        return Err(Error::Invalid(format!(
            "{} is not a metcd lsm table (bad magic at offset {offset})",
            path.display()
        )));
    }
    let version = u32::from_le_bytes([page[8], page[9], page[10], page[11]]);
    if version != FORMAT_VERSION {
        return Err(Error::Invalid(format!(
            "{} has sst format version {version}; this build reads version {FORMAT_VERSION}",
            path.display()
        )));
    }
    if offset == 0 && unseal(&page[..16]).is_none() {
        return Err(corrupt("sst header", path, 0, "checksum mismatch"));
    }
    Ok(())
}

/// Reads `len` bytes at the aligned `offset` (rounding the read up).
fn read_raw(file: &DirectFile, offset: u64, len: usize) -> Result<AlignedBuf> {
    let mut buf = AlignedBuf::zeroed(len);
    file.read_at(&mut buf, offset)?;
    Ok(buf)
}

/// Whether `len` bytes at `offset` end at or before `end`.
fn within(offset: u64, len: u32, end: u64) -> bool {
    offset.checked_add(u64::from(len)).is_some_and(|e| e <= end)
}

/// Reads and verifies the sealed block of `len` bytes at `offset`, which
/// must lie before `end` (the footer): a damaged length is refused before
/// it sizes a buffer.
fn read_sealed(
    file: &DirectFile,
    offset: u64,
    len: u32,
    end: u64,
    what: &'static str,
) -> Result<Vec<u8>> {
    if !offset.is_multiple_of(ALIGN as u64) {
        return Err(corrupt(what, file.path(), offset, "unaligned block"));
    }
    if !within(offset, len, end) {
        return Err(corrupt(
            what,
            file.path(),
            offset,
            format!("{len} bytes run past the table's blocks"),
        ));
    }
    let raw = read_raw(file, offset, len as usize)?;
    unseal(&raw[..len as usize])
        .map(<[u8]>::to_vec)
        .ok_or_else(|| corrupt(what, file.path(), offset, "checksum mismatch"))
}

/// A cursor inside one verified data block. Decoding an entry copies only
/// its key suffix into `key`; an [`Entry`] (with its own key) is built only
/// when an iterator hands one out.
struct BlockCursor<'a> {
    data: Bytes,
    path: &'a Path,
    offset: u64,
    /// Offset of the restart array (= end of the entries).
    entries_end: usize,
    restarts: usize,
    /// Offset of the entry after the current one.
    pos: usize,
    /// The current entry, valid if `valid`: its key, sequence and the
    /// range of its value in `data` (`None`: a tombstone).
    valid: bool,
    key: Vec<u8>,
    seq: u64,
    value: Option<(usize, usize)>,
}

impl<'a> BlockCursor<'a> {
    /// A cursor on the block's first entry.
    fn new(data: Bytes, path: &'a Path, offset: u64) -> Result<BlockCursor<'a>> {
        let bad = || corrupt("sst data block", path, offset, "bad restart array");
        let n_off = data.len().checked_sub(4).ok_or_else(bad)?;
        let n = Reader::new(&data[n_off..]).u32().ok_or_else(bad)? as usize;
        let entries_end = n
            .checked_mul(4)
            .and_then(|b| n_off.checked_sub(b))
            .ok_or_else(bad)?;
        let mut c = BlockCursor {
            data,
            path,
            offset,
            entries_end,
            restarts: n,
            pos: 0,
            valid: false,
            key: Vec::new(),
            seq: 0,
            value: None,
        };
        c.next()?;
        Ok(c)
    }

    fn bad(&self, reason: &str) -> Error {
        corrupt("sst data block", self.path, self.offset, reason)
    }

    /// Offset of restart point `i` (< `restarts`), checked.
    fn restart(&self, i: usize) -> Result<usize> {
        let at = self.entries_end + 4 * i;
        let Some(r) = Reader::new(&self.data[at..]).u32() else {
            return Err(self.bad("bad restart array"));
        };
        let r = r as usize;
        if r >= self.entries_end.max(1) {
            return Err(self.bad("bad restart array"));
        }
        Ok(r)
    }

    /// Decodes the entry at `pos` (or marks the cursor exhausted).
    fn next(&mut self) -> Result<()> {
        if self.pos >= self.entries_end {
            self.valid = false;
            return Ok(());
        }
        let mut r = Reader::new(&self.data[..self.entries_end]);
        r.pos = self.pos;
        let (Some(shared), Some(unshared), Some(vlen)) = (r.varint(), r.varint(), r.varint())
        else {
            return Err(self.bad("truncated entry header"));
        };
        let Some(seq) = r.u64() else {
            return Err(self.bad("truncated sequence"));
        };
        if shared as usize > self.key.len() {
            return Err(self.bad("shared prefix longer than previous key"));
        }
        let Some(suffix) = r.bytes(unshared as usize) else {
            return Err(self.bad("truncated key"));
        };
        self.key.truncate(shared as usize);
        self.key.extend_from_slice(suffix);
        self.value = if vlen == 0 {
            None
        } else {
            let start = r.pos;
            if r.bytes(vlen as usize - 1).is_none() {
                return Err(self.bad("truncated value"));
            }
            Some((start, r.pos))
        };
        self.seq = seq;
        self.pos = r.pos;
        self.valid = true;
        Ok(())
    }

    /// The current entry's value (a view of the block, no copy).
    fn value(&self) -> Option<Bytes> {
        self.value.map(|(a, b)| self.data.slice(a..b))
    }

    fn entry(&self) -> Option<Entry> {
        self.valid.then(|| Entry {
            key: Bytes::copy_from_slice(&self.key),
            seq: self.seq,
            value: self.value(),
        })
    }

    /// Whether the current entry sorts before `(key, seq)`.
    fn before(&self, key: &[u8], seq: u64) -> bool {
        self.valid && cmp_internal(&self.key, self.seq, key, seq) == CmpOrdering::Less
    }

    /// Positions at the first entry at/after `(key, seq)`.
    fn seek(&mut self, key: &[u8], seq: u64) -> Result<()> {
        // Last restart whose full key sorts before the target.
        let (mut lo, mut hi) = (0usize, self.restarts);
        while lo + 1 < hi {
            let mid = (lo + hi) / 2;
            self.pos = self.restart(mid)?;
            self.key.clear();
            self.next()?;
            if self.before(key, seq) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.pos = if self.restarts == 0 {
            0
        } else {
            self.restart(lo)?
        };
        self.key.clear();
        self.next()?;
        while self.before(key, seq) {
            self.next()?;
        }
        Ok(())
    }
}

/// Iterates a table's entries in internal order from a start bound.
pub(crate) struct TableIter<'a> {
    table: &'a Table,
    fill_cache: bool,
    block: usize,
    cursor: Option<BlockCursor<'a>>,
    cur: Option<Entry>,
    /// Blocks read ahead: bodies of blocks `ahead_first..` in order.
    ahead: std::collections::VecDeque<Bytes>,
    ahead_first: usize,
    /// Blocks this iterator has loaded: a second one means it streams.
    loaded: usize,
}

impl<'a> TableIter<'a> {
    pub fn new(table: &'a Table, start: Bound<&[u8]>) -> Result<TableIter<'a>> {
        Self::with_cache(table, start, true)
    }

    /// As [`TableIter::new`]. With `fill_cache` false (a compaction's
    /// single pass), blocks come from large direct reads and are not
    /// cached; otherwise they come through the cache, a scan that streams
    /// reading ahead on a miss.
    pub fn with_cache(
        table: &'a Table,
        start: Bound<&[u8]>,
        fill_cache: bool,
    ) -> Result<TableIter<'a>> {
        let mut it = TableIter {
            table,
            fill_cache,
            block: 0,
            cursor: None,
            cur: None,
            ahead: std::collections::VecDeque::new(),
            ahead_first: 0,
            loaded: 0,
        };
        match start {
            Bound::Unbounded => it.load(0)?,
            Bound::Included(k) | Bound::Excluded(k) => {
                it.block = table.block_for(k, u64::MAX);
                it.load(it.block)?;
                if let Some(c) = it.cursor.as_mut() {
                    c.seek(k, u64::MAX)?;
                }
                it.skip_empty()?;
                if matches!(start, Bound::Excluded(_)) {
                    while it.cursor.as_ref().is_some_and(|c| c.valid && c.key == k) {
                        it.step()?;
                    }
                }
            }
        }
        it.skip_empty()?;
        it.cur = it.cursor.as_ref().and_then(BlockCursor::entry);
        Ok(it)
    }

    /// The body of data block `block`, read ahead when streaming.
    fn block_data(&mut self, block: usize) -> Result<Bytes> {
        while self.ahead_first < block && !self.ahead.is_empty() {
            self.ahead.pop_front();
            self.ahead_first += 1;
        }
        if self.ahead_first == block {
            if let Some(b) = self.ahead.pop_front() {
                self.ahead_first += 1;
                return Ok(b);
            }
        }
        let table = self.table;
        let e = &table.index[block];
        let fetch = if self.fill_cache {
            if let Some(b) = table.cache.get(table.meta.file_no, e.offset) {
                let body_len = b.len().saturating_sub(4);
                return Ok(Bytes::from_owner(b).slice(..body_len));
            }
            if self.loaded == 0 {
                // A point seek or a short scan: one block only.
                return table.data_block(e.offset, e.len, true);
            }
            SCAN_READAHEAD_BYTES
        } else {
            COMPACTION_READAHEAD_BYTES
        };
        let mut blocks = std::collections::VecDeque::new();
        for (i, sealed) in table.read_blocks(block, fetch)?.into_iter().enumerate() {
            if self.fill_cache {
                let offset = table.index[block + i].offset;
                table
                    .cache
                    .insert(table.meta.file_no, offset, Arc::from(&sealed[..]));
            }
            blocks.push_back(body(sealed));
        }
        let Some(first) = blocks.pop_front() else {
            return Err(corrupt(
                "sst index block",
                table.file.path(),
                e.offset,
                "block out of range",
            ));
        };
        self.ahead = blocks;
        self.ahead_first = block + 1;
        Ok(first)
    }

    fn load(&mut self, block: usize) -> Result<()> {
        self.block = block;
        self.cursor = if block < self.table.index.len() {
            let data = self.block_data(block)?;
            self.loaded += 1;
            let offset = self.table.index[block].offset;
            Some(BlockCursor::new(data, self.table.file.path(), offset)?)
        } else {
            None
        };
        Ok(())
    }

    /// Moves past exhausted blocks.
    fn skip_empty(&mut self) -> Result<()> {
        while self.cursor.as_ref().is_some_and(|c| !c.valid) {
            self.load(self.block + 1)?;
        }
        Ok(())
    }

    /// Moves the cursor to the next entry without building it.
    fn step(&mut self) -> Result<()> {
        if let Some(c) = self.cursor.as_mut() {
            c.next()?;
        }
        self.skip_empty()
    }
}

impl EntryIter for TableIter<'_> {
    fn current(&self) -> Option<&Entry> {
        self.cur.as_ref()
    }

    fn advance(&mut self) -> Result<()> {
        self.step()?;
        self.cur = self.cursor.as_ref().and_then(BlockCursor::entry);
        Ok(())
    }
}

/// Fuzzing: `data` as the verified body of a data block: every entry
/// walked, then a seek for a key taken from the input's first bytes.
pub(crate) fn fuzz_block(data: &[u8]) {
    let path = Path::new("fuzz-block");
    let key = &data[..data.len().min(8)];
    let Ok(mut cursor) = BlockCursor::new(Bytes::copy_from_slice(data), path, 0) else {
        return;
    };
    // Each step consumes at least the 11-byte entry header.
    for _ in 0..=data.len() {
        if !cursor.valid || cursor.next().is_err() {
            break;
        }
        let _ = cursor.entry();
    }
    let _ = cursor.seek(key, u64::MAX);
    let _ = cursor.seek(key, 0);
}

/// Fuzzing: `data` as table file 1 in `dir`: zero-padded to whole pages
/// (header, body, footer), header and footer sealed, the index and filter
/// blocks the footer names (when inside the file) sealed, then opened,
/// iterated to the end and probed.
pub(crate) fn fuzz_table(dir: &Path, data: &[u8], cache: Arc<BlockCache>) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create dir", dir, e))?;
    let pages = data.len().div_ceil(ALIGN).max(2);
    let mut file = vec![0u8; pages * ALIGN];
    file[..data.len()].copy_from_slice(data);
    let seal_at = |file: &mut [u8], at: usize, body: usize| {
        if let Some(end) = at.checked_add(body).filter(|e| e + 4 <= file.len()) {
            let crc = crc32c::crc32c(&file[at..end]);
            file[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        }
    };
    file[..8].copy_from_slice(SST_MAGIC);
    file[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    seal_at(&mut file, 0, 12);
    let footer = file.len() - ALIGN;
    file[footer..footer + 8].copy_from_slice(SST_MAGIC);
    file[footer + 8..footer + 12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    seal_at(&mut file, footer, FOOTER_BYTES - 4);
    let mut r = Reader::new(&file[footer + 12..]);
    let regions = [(r.u64(), r.u32()), (r.u64(), r.u32())];
    for (offset, len) in regions {
        if let (Some(offset), Some(len)) = (offset, len) {
            if let (Ok(offset), Some(body)) =
                (usize::try_from(offset), (len as usize).checked_sub(4))
            {
                if offset < footer {
                    seal_at(&mut file, offset, body);
                }
            }
        }
    }
    let path = dir.join(sst_name(1));
    std::fs::write(&path, &file).map_err(|e| Error::io("write", &path, e))?;
    let table = Table::open(dir, 1, cache)?;
    let mut iter = TableIter::new(&table, Bound::Unbounded)?;
    let mut keys = Vec::new();
    // A table of n pages holds fewer than n * ALIGN entries.
    for _ in 0..file.len() {
        let Some(entry) = iter.current() else { break };
        if keys.len() < 16 {
            keys.push(entry.key.clone());
        }
        iter.advance()?;
    }
    for key in &keys {
        table.get(key, u64::MAX)?;
        TableIter::new(&table, Bound::Included(key))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    type Row = (Vec<u8>, u64, Option<Vec<u8>>);

    fn build(dir: &Path, entries: &[Row]) -> Table {
        let cache = Arc::new(BlockCache::new(1 << 20));
        let mut b =
            TableBuilder::create(dir, 7, "lsm::test", 10, cache, CacheFill::IfRoom).unwrap();
        for (k, s, v) in entries {
            b.add(k, *s, v.as_deref()).unwrap();
        }
        b.finish().unwrap();
        Table::open(dir, 7, Arc::new(BlockCache::new(1 << 20))).unwrap()
    }

    #[test]
    fn table_round_trips_many_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut entries = Vec::new();
        for i in 0..2000u32 {
            let k = format!("key{i:06}").into_bytes();
            entries.push((k.clone(), 10, Some(vec![b'x'; (i % 50) as usize])));
            if i % 3 == 0 {
                entries.push((k, 5, None));
            }
        }
        let t = build(dir.path(), &entries);
        assert!(t.index.len() > 10, "{} blocks", t.index.len());
        assert_eq!(
            t.get(b"key000003", 99).unwrap(),
            Some(Some(Bytes::from(vec![b'x'; 3])))
        );
        assert_eq!(t.get(b"key000003", 7).unwrap(), Some(None));
        assert_eq!(t.get(b"key000003", 4).unwrap(), None);
        assert_eq!(t.get(b"key000004", 7).unwrap(), None);
        assert_eq!(t.get(b"nokey", 99).unwrap(), None);
        let mut it = TableIter::new(&t, Bound::Unbounded).unwrap();
        let mut n = 0;
        while let Some(e) = it.current() {
            assert_eq!((&e.key[..], e.seq), (&entries[n].0[..], entries[n].1));
            n += 1;
            it.advance().unwrap();
        }
        assert_eq!(n, entries.len());
        let it = TableIter::new(&t, Bound::Excluded(b"key000999")).unwrap();
        assert_eq!(&it.current().unwrap().key[..], b"key001000");
        let it = TableIter::new(&t, Bound::Included(b"key0009995")).unwrap();
        assert_eq!(&it.current().unwrap().key[..], b"key001000");
        let it = TableIter::new(&t, Bound::Excluded(b"key001999")).unwrap();
        assert!(it.current().is_none());
    }

    /// A compaction's large reads and a streaming scan's read-ahead yield
    /// exactly the table's entries; a byte flipped in a block that came
    /// with a large read is corruption naming that block's offset.
    #[test]
    fn read_ahead_yields_every_entry_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let entries: Vec<Row> = (0..3000u32)
            .map(|i| (format!("key{i:06}").into_bytes(), 1, Some(vec![b'v'; 100])))
            .collect();
        let t = build(dir.path(), &entries);
        let collect = |t: &Table, fill_cache: bool| -> Result<Vec<Vec<u8>>> {
            let mut it = TableIter::with_cache(t, Bound::Unbounded, fill_cache)?;
            let mut keys = Vec::new();
            while let Some(e) = it.current() {
                keys.push(e.key.to_vec());
                it.advance()?;
            }
            Ok(keys)
        };
        let want: Vec<Vec<u8>> = entries.iter().map(|(k, _, _)| k.clone()).collect();
        assert_eq!(collect(&t, false).unwrap(), want);
        assert_eq!(collect(&t, true).unwrap(), want);
        assert!(t.warm_cache().unwrap());

        let bad = t.index[t.index.len() / 2].offset;
        let path = dir.path().join(sst_name(7));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[bad as usize + 10] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let t = Table::open(dir.path(), 7, Arc::new(BlockCache::new(1 << 20))).unwrap();
        for fill_cache in [false, true] {
            match collect(&t, fill_cache).unwrap_err() {
                Error::Corrupt { offset, .. } => assert_eq!(offset, bad),
                other => panic!("{other}"),
            }
        }
    }

    #[test]
    fn bloom_rejects_most_absent_keys() {
        let hashes: Vec<u64> = (0..1000)
            .map(|i: u32| bloom_hash(&i.to_be_bytes()))
            .collect();
        let f = bloom_build(&hashes, 10);
        for i in 0..1000u32 {
            assert!(bloom_may_contain(&f, &i.to_be_bytes()));
        }
        let false_pos = (1000..11000u32)
            .filter(|i| bloom_may_contain(&f, &i.to_be_bytes()))
            .count();
        assert!(false_pos < 500, "{false_pos} false positives of 10000");
    }
}
