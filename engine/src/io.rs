//! Direct I/O for the on-disk engines: aligned buffers, a file opened with
//! `O_DIRECT` whose batched writes and syncs go through io_uring, and a
//! shared block cache.
//!
//! This module owns the system calls of the btree and lsm engines. It must
//! never hide a short read or write, and every error it returns names the
//! file and the offset involved, so corruption reports point somewhere.
//!
//! Writes and syncs are submitted on an io_uring ring owned by the file (a
//! whole batch of pages kept in flight, then `fdatasync` as a ring op), and
//! wait for completion: the engines call them from a commit or a flush, off
//! the request path. Single reads are positional `pread`s into aligned
//! buffers so any thread can read without sharing a ring; batches of reads
//! (read-ahead) go through a ring of the calling thread. The block cache in
//! front keeps reads rare.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use io_uring::{opcode, types, IoUring};

use crate::{Error, Result};

/// Alignment (and granularity) of every direct I/O: offsets, lengths and
/// buffer addresses are multiples of it.
pub const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`] whose length is a multiple of it.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    /// Bytes in use (what the buffer derefs to and an I/O transfers).
    len: usize,
    /// Bytes allocated, all initialised; `len <= capacity`.
    capacity: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Vec<u8>); no
// interior mutability, so sending or sharing it across threads is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above; &AlignedBuf only gives out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes, rounded up to a multiple of [`ALIGN`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = round_up(len.max(1));
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (len >= ALIGN).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            len,
            capacity: len,
        }
    }

    /// Bytes allocated: the largest length [`AlignedBuf::set_len`] gives.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Uses the first `len` bytes (rounded up to the alignment, at most the
    /// capacity), so one allocation serves transfers of varying size. The
    /// bytes a longer length brings back hold whatever was written last.
    pub fn set_len(&mut self, len: usize) {
        self.len = round_up(len.max(1)).min(self.capacity);
    }

    /// A buffer holding `data`, zero-padded up to the alignment.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    fn layout(len: usize) -> std::alloc::Layout {
        match std::alloc::Layout::from_size_align(len, ALIGN) {
            Ok(l) => l,
            // len is a rounded usize well below isize::MAX in practice; a
            // layout error here is an allocation failure.
            Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; ALIGN]>()),
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to capacity >= len initialised (zeroed at
        // least) bytes we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in Deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Rounds `n` up to a multiple of [`ALIGN`].
pub fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN).saturating_mul(ALIGN)
}

/// A file read and written with `O_DIRECT`; batched writes and data syncs
/// go through its own io_uring ring.
pub struct DirectFile {
    file: File,
    path: PathBuf,
    ring: Mutex<Option<IoUring>>,
}

impl std::fmt::Debug for DirectFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DirectFile({})", self.path.display())
    }
}

impl DirectFile {
    /// Opens (or with `create`, creates) `path` for direct reads and writes.
    pub fn open(path: &Path, create: bool) -> Result<DirectFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| Error::io_at(path, 0, e))?;
        Ok(DirectFile {
            file,
            path: path.to_path_buf(),
            ring: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> Result<u64> {
        Ok(self
            .file
            .metadata()
            .map_err(|e| Error::io_at(&self.path, 0, e))?
            .len())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fills `buf` from `offset` (aligned); a short read (past the end of
    /// the file) is an error naming the file and offset.
    pub fn read_at(&self, buf: &mut AlignedBuf, offset: u64) -> Result<()> {
        check_aligned(&self.path, offset)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| Error::io_at(&self.path, offset, e))
    }

    /// Writes every `(offset, buffer)` pair (offsets aligned), kept in
    /// flight together on the file's io_uring ring, and waits for all of
    /// them. Not durable until [`DirectFile::sync_data`].
    pub fn write_all_at(&self, writes: &[(u64, &AlignedBuf)]) -> Result<()> {
        let fd = types::Fd(self.file.as_raw_fd());
        let mut ops = Vec::with_capacity(writes.len());
        for (i, (offset, buf)) in writes.iter().enumerate() {
            let len = self.op_len(*offset, buf.len(), "write")?;
            ops.push(
                opcode::Write::new(fd, buf.as_ptr(), len)
                    .offset(*offset)
                    .build()
                    .user_data(i as u64),
            );
        }
        let first = writes.first().map_or(0, |w| w.0);
        // SAFETY: every buffer is borrowed from `writes` for this whole
        // call, and `run` returns only once every submitted op has
        // completed (or the ring, with anything unsubmitted, is gone).
        let results = unsafe { self.run(&ops, first) }?;
        self.check_results(writes.iter().map(|(o, b)| (*o, b.len())), &results, "write")
    }

    /// `fdatasync` as an io_uring op: everything written before is durable.
    pub fn sync_data(&self) -> Result<()> {
        let op = opcode::Fsync::new(types::Fd(self.file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(0);
        // SAFETY: the op references no memory of ours.
        let results = unsafe { self.run(std::slice::from_ref(&op), 0) }?;
        match results.first() {
            Some(&res) if res < 0 => Err(Error::io_at(
                &self.path,
                0,
                std::io::Error::from_raw_os_error(-res),
            )),
            Some(_) => Ok(()),
            None => Err(Error::io_at(
                &self.path,
                0,
                std::io::Error::other("fdatasync: no completion"),
            )),
        }
    }

    /// Runs `ops` (`user_data` = their index) on the file's own ring and
    /// waits for every completion; returns each op's result in order. On a
    /// failure the ring is dropped, so nothing left in it can complete into
    /// a later call.
    ///
    /// # Safety
    /// Memory the ops point to must stay valid until this returns.
    unsafe fn run(&self, ops: &[io_uring::squeue::Entry], offset: u64) -> Result<Vec<i32>> {
        let mut slot = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: guaranteed by the caller.
        let result = unsafe { self.run_pipelined_on(&mut slot, ops, offset) };
        if result.is_err() {
            *slot = None;
        }
        result
    }

    /// Truncates or extends the file (extension reads as zeroes).
    pub fn set_len(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| Error::io_at(&self.path, len, e))
    }
}

/// Depth of every ring (a file's own, and the per-thread rings of
/// [`DirectFile::read_many_at`]): operations kept in flight at once.
const DEEP_RING_ENTRIES: u32 = 256;

thread_local! {
    /// Each thread's ring for [`DirectFile::read_many_at`]: reads never
    /// wait behind a commit's writes and syncs on the file's own ring.
    static THREAD_RING: std::cell::RefCell<Option<IoUring>> = const { std::cell::RefCell::new(None) };
}

impl DirectFile {
    /// Fills every `(offset, buffer)` (offsets aligned) with reads kept in
    /// flight together (io_uring, on a ring of the calling thread, refilled
    /// as reads complete): about one device round trip for pages that would
    /// otherwise be read one after the other. A short read is an error
    /// naming the file and offset.
    pub fn read_many_at(&self, reads: &mut [(u64, AlignedBuf)]) -> Result<()> {
        let fd = types::Fd(self.file.as_raw_fd());
        let mut ops = Vec::with_capacity(reads.len());
        for (i, (offset, buf)) in reads.iter_mut().enumerate() {
            let len = self.op_len(*offset, buf.len(), "read")?;
            ops.push(
                opcode::Read::new(fd, buf.as_mut_ptr(), len)
                    .offset(*offset)
                    .build()
                    .user_data(i as u64),
            );
        }
        let first = reads.first().map_or(0, |r| r.0);
        // SAFETY: every buffer is borrowed mutably from `reads` for this
        // whole call, and `run_pipelined` returns only once every submitted
        // op has completed (or the ring is gone).
        let results = unsafe { self.run_pipelined(&ops, first) }?;
        self.check_results(reads.iter().map(|(o, b)| (*o, b.len())), &results, "read")
    }

    /// Checks one ring op's offset alignment and returns its length as the
    /// ring wants it.
    fn op_len(&self, offset: u64, len: usize, what: &str) -> Result<u32> {
        check_aligned(&self.path, offset)?;
        u32::try_from(len).map_err(|_| {
            Error::io_at(
                &self.path,
                offset,
                std::io::Error::other(format!("{what} too large")),
            )
        })
    }

    fn check_results(
        &self,
        ops: impl Iterator<Item = (u64, usize)>,
        results: &[i32],
        what: &str,
    ) -> Result<()> {
        for ((offset, len), &res) in ops.zip(results) {
            if res < 0 {
                return Err(Error::io_at(
                    &self.path,
                    offset,
                    std::io::Error::from_raw_os_error(-res),
                ));
            }
            if res as usize != len {
                return Err(Error::io_at(
                    &self.path,
                    offset,
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("short {what}: {res} of {len} bytes"),
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Runs `ops` (`user_data` = their index) on the calling thread's ring,
    /// keeping it full, and waits for every completion; returns each op's
    /// result in order. On a failure the ring is dropped, so nothing left in
    /// it can complete into a later call. `offset` (the first op's) names
    /// a failure of the ring itself.
    ///
    /// # Safety
    /// Memory the ops point to must stay valid until this returns.
    unsafe fn run_pipelined(
        &self,
        ops: &[io_uring::squeue::Entry],
        offset: u64,
    ) -> Result<Vec<i32>> {
        THREAD_RING.with(|cell| {
            let mut slot = cell.borrow_mut();
            // SAFETY: guaranteed by the caller.
            let r = unsafe { self.run_pipelined_on(&mut slot, ops, offset) };
            if r.is_err() {
                *slot = None;
            }
            r
        })
    }

    /// # Safety
    /// As [`DirectFile::run_pipelined`].
    unsafe fn run_pipelined_on(
        &self,
        slot: &mut Option<IoUring>,
        ops: &[io_uring::squeue::Entry],
        offset: u64,
    ) -> Result<Vec<i32>> {
        if slot.is_none() {
            let ring =
                IoUring::new(DEEP_RING_ENTRIES).map_err(|e| Error::io_at(&self.path, offset, e))?;
            *slot = Some(ring);
        }
        let Some(ring) = slot.as_mut() else {
            return Err(Error::io_at(
                &self.path,
                offset,
                std::io::Error::other("no ring"),
            ));
        };
        let mut results = vec![0i32; ops.len()];
        let (mut next, mut in_flight, mut done) = (0, 0, 0);
        while done < ops.len() {
            while next < ops.len() && in_flight < DEEP_RING_ENTRIES as usize {
                // SAFETY: guaranteed by the caller.
                if unsafe { ring.submission().push(&ops[next]) }.is_err() {
                    break;
                }
                next += 1;
                in_flight += 1;
            }
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => return Err(Error::io_at(&self.path, offset, e)),
            }
            for cqe in ring.completion() {
                if let Some(r) = results.get_mut(cqe.user_data() as usize) {
                    *r = cqe.result();
                    done += 1;
                    in_flight -= 1;
                }
            }
        }
        Ok(results)
    }
}

impl BlockCache {
    /// Caches `block` as if it had just been read from the cache (CLOCK's
    /// usual insertion: a new block gets one sweep of the hand before it
    /// can go). [`BlockCache::insert`] leaves the block unreferenced, and
    /// eviction swaps the newest block under the hand, so the next insert
    /// into that shard evicts it: with plain inserts a full cache stops
    /// taking in new blocks (one slot per shard churns) and keeps whatever
    /// it held, even pages freed long ago. Read-ahead blocks, which must
    /// survive until their reader gets to them, need this too.
    pub fn insert_referenced(&self, file_id: u64, offset: u64, block: Arc<[u8]>) {
        let key = (file_id, offset);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.insert(key, block, true);
    }

    /// Whether the block is cached (without marking it used).
    pub fn contains(&self, file_id: u64, offset: u64) -> bool {
        let key = (file_id, offset);
        self.shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .contains_key(&key)
    }
}

fn check_aligned(path: &Path, offset: u64) -> Result<()> {
    if offset.is_multiple_of(ALIGN as u64) {
        Ok(())
    } else {
        Err(Error::io_at(
            path,
            offset,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "unaligned direct I/O offset",
            ),
        ))
    }
}

/// fsyncs a directory so a file created, renamed or removed in it survives
/// a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io_at(dir, 0, e))
}

/// What a [`BlockCache`] holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheUsage {
    pub used_bytes: u64,
    pub capacity_bytes: u64,
}

/// A block cache shared by the files of one engine: `(file id, offset)` to
/// the block's verified bytes, evicted by CLOCK within each shard.
///
/// Cached blocks are `Arc`s so a reader keeps using a block that is evicted
/// under it. Callers cache only blocks whose checksum they verified.
pub struct BlockCache {
    shards: Vec<Mutex<CacheShard>>,
}

struct CacheShard {
    capacity_bytes: usize,
    used_bytes: usize,
    /// A hit touches only its map entry (block and CLOCK bit live there):
    /// one cache miss fewer per page than going through `slots`.
    map: HashMap<(u64, u64), CachedBlock, BuildHasherDefault<BlockKeyHasher>>,
    /// The CLOCK ring: every cached key once, in no particular order.
    slots: Vec<(u64, u64)>,
    hand: usize,
}

struct CachedBlock {
    block: Arc<[u8]>,
    /// Index of this key in `slots`.
    slot: usize,
    referenced: bool,
}

const CACHE_SHARDS: usize = 16;

/// Hashes a cache key `(file id, offset)`: two integers we chose ourselves
/// (no one can pick them to collide), so a multiply-rotate mix does and
/// SipHash's cost buys nothing on a path every page read takes.
#[derive(Default)]
struct BlockKeyHasher(u64);

impl Hasher for BlockKeyHasher {
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(26) ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

impl BlockCache {
    /// A cache holding up to about `capacity_bytes` of blocks.
    pub fn new(capacity_bytes: usize) -> BlockCache {
        let per_shard = (capacity_bytes / CACHE_SHARDS).max(ALIGN);
        BlockCache {
            shards: (0..CACHE_SHARDS)
                .map(|_| {
                    Mutex::new(CacheShard {
                        capacity_bytes: per_shard,
                        used_bytes: 0,
                        map: HashMap::default(),
                        slots: Vec::new(),
                        hand: 0,
                    })
                })
                .collect(),
        }
    }

    /// Bytes of blocks held now, and the most it holds: what a member's
    /// memory holds for the cache, to count apart from what it holds per
    /// key.
    pub fn usage(&self) -> CacheUsage {
        let mut usage = CacheUsage::default();
        for shard in &self.shards {
            let s = shard.lock().unwrap_or_else(PoisonError::into_inner);
            usage.used_bytes += s.used_bytes as u64;
            usage.capacity_bytes += s.capacity_bytes as u64;
        }
        usage
    }

    fn shard(&self, key: (u64, u64)) -> &Mutex<CacheShard> {
        let h = key
            .0
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(key.1 / ALIGN as u64)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9);
        &self.shards[(h >> 59) as usize % CACHE_SHARDS]
    }

    pub fn get(&self, file_id: u64, offset: u64) -> Option<Arc<[u8]>> {
        self.with(file_id, offset, Arc::clone)
    }

    /// Runs `f` on a cached block under its shard's lock, without taking
    /// a reference: for a short look at a page (one step of a lookup) that
    /// keeps only what `f` returns.
    pub fn with<R>(&self, file_id: u64, offset: u64, f: impl FnOnce(&Arc<[u8]>) -> R) -> Option<R> {
        let key = (file_id, offset);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let cached = shard.map.get_mut(&key)?;
        cached.referenced = true;
        Some(f(&cached.block))
    }

    pub fn insert(&self, file_id: u64, offset: u64, block: Arc<[u8]>) {
        let key = (file_id, offset);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.insert(key, block, false);
    }

    /// Caches `block` only if its shard has room for it without evicting
    /// anything, and says whether the block is cached now (inserted or
    /// already there): for blocks that are merely likely to be read (a
    /// table just written), which must not push out blocks readers use.
    pub fn insert_if_room(&self, file_id: u64, offset: u64, block: Arc<[u8]>) -> bool {
        let key = (file_id, offset);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if shard.map.contains_key(&key) {
            return true;
        }
        if shard.used_bytes + block.len() > shard.capacity_bytes {
            return false;
        }
        shard.insert(key, block, false);
        true
    }

    /// Drops every block of the files in `file_ids` in one pass over the
    /// cache (the tables a compaction replaced).
    pub fn forget_files(&self, file_ids: &[u64]) {
        for s in &self.shards {
            let mut shard = s.lock().unwrap_or_else(PoisonError::into_inner);
            let mut i = 0;
            while i < shard.slots.len() {
                let key = shard.slots[i];
                if file_ids.contains(&key.0) {
                    shard.remove_at(i);
                } else {
                    i += 1;
                }
            }
            if shard.hand >= shard.slots.len() {
                shard.hand = 0;
            }
        }
    }

    /// Drops every block of `file_id` (a deleted or rewritten file).
    pub fn forget_file(&self, file_id: u64) {
        self.forget_files(&[file_id]);
    }

    /// Drops one block (a page freed and about to be reused).
    pub fn forget(&self, file_id: u64, offset: u64) {
        let key = (file_id, offset);
        let mut shard = self
            .shard(key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.remove(&key);
    }
}

impl CacheShard {
    /// Caches `block` under `key`, evicting by CLOCK to make room; a new
    /// block starts with the CLOCK bit `referenced` (a replaced one is
    /// marked referenced either way).
    fn insert(&mut self, key: (u64, u64), block: Arc<[u8]>, referenced: bool) {
        if let Some(cached) = self.map.get_mut(&key) {
            self.used_bytes = self.used_bytes - cached.block.len() + block.len();
            cached.block = block;
            cached.referenced = true;
            return;
        }
        while self.used_bytes + block.len() > self.capacity_bytes && !self.slots.is_empty() {
            if self.hand >= self.slots.len() {
                self.hand = 0;
            }
            let at_hand = self.slots[self.hand];
            match self.map.get_mut(&at_hand) {
                Some(cached) if cached.referenced => {
                    cached.referenced = false;
                    self.hand += 1;
                }
                _ => {
                    self.remove_at(self.hand);
                    // The last slot (the newest block) was swapped into the
                    // victim's place: step past it, or the next eviction
                    // would take it first and the cache would stop taking
                    // new blocks.
                    self.hand += 1;
                }
            }
        }
        self.used_bytes += block.len();
        let slot = self.slots.len();
        self.map.insert(
            key,
            CachedBlock {
                block,
                slot,
                referenced,
            },
        );
        self.slots.push(key);
    }

    /// Removes `key` if cached: its map entry, and its slot.
    fn remove(&mut self, key: &(u64, u64)) {
        if let Some(cached) = self.map.remove(key) {
            self.used_bytes -= cached.block.len();
            self.remove_slot(cached.slot);
        }
    }

    /// Removes ring slot `i` and its key's entry. Goes by position, so a
    /// sweep over the ring always advances (even were a slot's entry gone).
    fn remove_at(&mut self, i: usize) {
        let key = self.slots[i];
        if let Some(cached) = self.map.remove(&key) {
            self.used_bytes -= cached.block.len();
        }
        self.remove_slot(i);
    }

    /// Removes slot `i` by swapping the last slot into its place (whose
    /// key then learns its new position).
    fn remove_slot(&mut self, i: usize) {
        self.slots.swap_remove(i);
        if let Some(moved) = self.slots.get(i).copied() {
            if let Some(cached) = self.map.get_mut(&moved) {
                cached.slot = i;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn batched_direct_writes_read_back_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = DirectFile::open(&path, true).unwrap();
        let a = AlignedBuf::from_slice(b"first page");
        let mut b = AlignedBuf::zeroed(2 * ALIGN);
        b[ALIGN] = 7;
        f.write_all_at(&[(0, &a), (ALIGN as u64 * 3, &b)]).unwrap();
        f.sync_data().unwrap();
        assert_eq!(f.len().unwrap(), 5 * ALIGN as u64);
        let mut r = AlignedBuf::zeroed(ALIGN);
        f.read_at(&mut r, 0).unwrap();
        assert_eq!(&r[..10], b"first page");
        f.read_at(&mut r, 4 * ALIGN as u64).unwrap();
        assert_eq!(r[0], 7);
        let err = f.read_at(&mut r, 9 * ALIGN as u64).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(f.read_at(&mut r, 3).is_err());
    }

    /// The CLOCK ring and the map describe the same blocks, and the byte
    /// count matches them, through inserts, evictions, hits and forgets.
    #[test]
    fn cache_ring_and_map_agree_after_churn() {
        let cache = BlockCache::new(CACHE_SHARDS * 16 * ALIGN);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (file, off) = (x % 3, (x >> 8) % 400 * ALIGN as u64);
            match x % 7 {
                0 => cache.forget(file, off),
                1 if x % 1000 == 1 => cache.forget_file(file),
                2 | 3 => {
                    let _ = cache.get(file, off);
                }
                4 => {
                    let _ = cache.insert_if_room(file, off, vec![0u8; ALIGN].into());
                }
                5 => cache.insert_referenced(file, off, vec![1u8; ALIGN].into()),
                _ => cache.insert(file, off, vec![2u8; ALIGN].into()),
            }
        }
        for s in &cache.shards {
            let shard = s.lock().unwrap();
            assert_eq!(shard.map.len(), shard.slots.len());
            for (i, key) in shard.slots.iter().enumerate() {
                assert_eq!(shard.map[key].slot, i);
            }
            let bytes: usize = shard.map.values().map(|c| c.block.len()).sum();
            assert_eq!(bytes, shard.used_bytes);
            assert!(shard.used_bytes <= shard.capacity_bytes);
        }
    }

    /// Blocks inserted into a full cache stay long enough to be read back
    /// (a newly inserted block is not the next victim).
    #[test]
    fn a_full_cache_keeps_taking_new_blocks() {
        let cache = BlockCache::new(CACHE_SHARDS * 8 * ALIGN);
        let block: Arc<[u8]> = vec![1u8; ALIGN].into();
        let mut recent_hits = 0;
        for off in 0..10_000u64 {
            cache.insert(1, off * ALIGN as u64, block.clone());
            // The blocks inserted just before this one are still there.
            if off >= 4 && cache.get(1, (off - 1) * ALIGN as u64).is_some() {
                recent_hits += 1;
            }
        }
        assert!(recent_hits > 9_000, "{recent_hits}");
    }

    #[test]
    fn cache_evicts_within_capacity_and_forgets_files() {
        let cache = BlockCache::new(CACHE_SHARDS * 4 * ALIGN);
        let block: Arc<[u8]> = vec![1u8; ALIGN].into();
        for off in 0..1000u64 {
            cache.insert(1, off * ALIGN as u64, block.clone());
        }
        let held: usize = (0..1000u64)
            .filter(|off| cache.get(1, off * ALIGN as u64).is_some())
            .count();
        assert!(held > 0 && held <= CACHE_SHARDS * 4, "{held}");
        cache.insert(2, 0, block.clone());
        cache.forget_file(1);
        assert!((0..1000u64).all(|off| cache.get(1, off * ALIGN as u64).is_none()));
        assert!(cache.get(2, 0).is_some());
        cache.forget(2, 0);
        assert!(cache.get(2, 0).is_none());
    }
}
