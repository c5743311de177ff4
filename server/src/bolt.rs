//! The bbolt file format: etcd's backend, and so the file `etcdctl snapshot
//! save` writes and `etcdctl snapshot status|restore` read.
//!
//! Owns the page layout only: [`BoltWriter`] bulk-loads buckets given in
//! ascending order into a fresh file, [`read`] visits every record of every
//! top-level bucket in order. What the buckets mean to etcd is
//! [`crate::backup`]'s business. The reader is fed backups from anywhere:
//! it must never panic or loop on a damaged file, only refuse it.
//!
//! Layout (bbolt v1.3, little-endian): pages of `page_size` bytes, each with
//! a 16-byte header `id u64, flags u16, count u16, overflow u32` (a node
//! larger than a page takes `overflow` more pages). Pages 0 and 1 hold the
//! two meta copies (`magic, version 2, page_size, flags, root bucket {root
//! pgid, sequence}, freelist pgid, high-water pgid, txid, FNV-1a checksum`);
//! the newer valid one wins. Leaf elements are `flags, pos, ksize, vsize`
//! (u32 each; `pos` counts from the element to its key, the value follows
//! the key), branch elements `pos, ksize, pgid`. A bucket is a leaf record
//! flagged 1 whose value is `root pgid u64, sequence u64`, followed by the
//! bucket's own leaf page when `root` is 0 (an "inline" bucket).

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Page size of the files we write (bbolt uses the OS page size).
pub const PAGE_SIZE: usize = 4096;
const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const FREELIST_PAGE: u16 = 0x10;
const BUCKET_LEAF: u32 = 0x01;
/// Bytes of the meta struct before its checksum.
const META_CHECKED: usize = 56;
/// Deeper trees would need more records than any file holds: a deeper
/// one is a cycle in a damaged file.
const MAX_DEPTH: usize = 32;
/// The largest node read (one record this size is far beyond etcd's
/// request limits); a larger claim is damage, not data.
const MAX_NODE_BYTES: u64 = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BoltError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a bbolt file: {0}")]
    Invalid(String),
    #[error("keys must be written in ascending order: {0}")]
    Order(String),
}

type Result<T> = std::result::Result<T, BoltError>;

fn invalid(what: impl std::fmt::Display) -> BoltError {
    BoltError::Invalid(what.to_string())
}

/// One node being filled: elements and the bytes they take on a page.
#[derive(Default)]
struct Node {
    /// (leaf flags, key, value) for a leaf; (0, key, child pgid LE) for a
    /// branch.
    elements: Vec<(u32, Vec<u8>, Vec<u8>)>,
    bytes: usize,
}

impl Node {
    fn fits(&self, key: &[u8], value: &[u8]) -> bool {
        self.elements.is_empty()
            || PAGE_HEADER + self.bytes + ELEMENT + key.len() + value.len() <= PAGE_SIZE
    }

    fn push(&mut self, flags: u32, key: &[u8], value: &[u8]) {
        self.bytes += ELEMENT + key.len() + value.len();
        self.elements.push((flags, key.to_vec(), value.to_vec()));
    }
}

/// Writes a bbolt file from buckets and records given in ascending order,
/// packing leaves full and building the branch levels above them; every
/// page below the high-water mark is used, so bbolt's consistency check
/// passes. Use: `bucket(name)`, then `put`s, for each bucket; `finish`.
pub struct BoltWriter<W: Write + Seek> {
    out: W,
    next_page: u64,
    /// Finished buckets: (name, root pgid).
    buckets: Vec<(Vec<u8>, u64)>,
    current: Option<Vec<u8>>,
    leaf: Node,
    /// The current bucket's finished leaves: (first key, pgid).
    leaves: Vec<(Vec<u8>, u64)>,
    last_key: Option<Vec<u8>>,
    records: u64,
}

impl<W: Write + Seek> BoltWriter<W> {
    pub fn new(mut out: W) -> Result<BoltWriter<W>> {
        // Pages 0 and 1 (the metas) are written last.
        out.seek(SeekFrom::Start(2 * PAGE_SIZE as u64))?;
        Ok(BoltWriter {
            out,
            next_page: 2,
            buckets: Vec::new(),
            current: None,
            leaf: Node::default(),
            leaves: Vec::new(),
            last_key: None,
            records: 0,
        })
    }

    /// Starts the next bucket (names ascending).
    pub fn bucket(&mut self, name: &[u8]) -> Result<()> {
        self.end_bucket()?;
        if let Some((last, _)) = self.buckets.last() {
            if name <= &last[..] {
                return Err(BoltError::Order(format!(
                    "bucket {:?} after {:?}",
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(last)
                )));
            }
        }
        self.current = Some(name.to_vec());
        Ok(())
    }

    /// Adds a record to the current bucket (keys strictly ascending).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.current.is_none() {
            return Err(BoltError::Order("a record before any bucket".into()));
        }
        if self.last_key.as_deref().is_some_and(|last| key <= last) {
            return Err(BoltError::Order(format!(
                "key {key:02x?} repeats or goes back"
            )));
        }
        if !self.leaf.fits(key, value) {
            let node = std::mem::take(&mut self.leaf);
            let first = node.elements[0].1.clone();
            let id = self.write_node(LEAF_PAGE, &node)?;
            self.leaves.push((first, id));
        }
        self.leaf.push(0, key, value);
        self.last_key = Some(key.to_vec());
        self.records += 1;
        Ok(())
    }

    /// Records written so far, over all buckets.
    pub fn records(&self) -> u64 {
        self.records
    }

    fn end_bucket(&mut self) -> Result<()> {
        let Some(name) = self.current.take() else {
            return Ok(());
        };
        let node = std::mem::take(&mut self.leaf);
        if !node.elements.is_empty() || self.leaves.is_empty() {
            let first = node
                .elements
                .first()
                .map(|e| e.1.clone())
                .unwrap_or_default();
            let id = self.write_node(LEAF_PAGE, &node)?;
            self.leaves.push((first, id));
        }
        let children = std::mem::take(&mut self.leaves);
        let root = self.build_branches(children)?;
        self.buckets.push((name, root));
        self.last_key = None;
        Ok(())
    }

    /// Branch levels over `children` until one node remains; its pgid.
    fn build_branches(&mut self, mut children: Vec<(Vec<u8>, u64)>) -> Result<u64> {
        while children.len() > 1 {
            let mut parents = Vec::new();
            let mut node = Node::default();
            for (key, id) in children {
                // A branch element's 8-byte pgid lives inside the element,
                // so only the key takes room after it.
                if !node.fits(&key, &[]) {
                    let first = node.elements[0].1.clone();
                    let written = self.write_node(BRANCH_PAGE, &node)?;
                    parents.push((first, written));
                    node = Node::default();
                }
                node.elements.push((0, key, id.to_le_bytes().to_vec()));
                node.bytes += ELEMENT + node.elements.last().map_or(0, |e| e.1.len());
            }
            if !node.elements.is_empty() {
                let first = node.elements[0].1.clone();
                let written = self.write_node(BRANCH_PAGE, &node)?;
                parents.push((first, written));
            }
            children = parents;
        }
        children
            .first()
            .map(|(_, id)| *id)
            .ok_or_else(|| invalid("a bucket without a root"))
    }

    /// Serialises `node` at the next free pages; answers its pgid.
    fn write_node(&mut self, kind: u16, node: &Node) -> Result<u64> {
        let count = u16::try_from(node.elements.len())
            .map_err(|_| invalid("more than 65535 elements in a node"))?;
        let size = PAGE_HEADER + node.bytes;
        let pages = size.div_ceil(PAGE_SIZE).max(1);
        let id = self.next_page;
        let mut buf = vec![0u8; pages * PAGE_SIZE];
        page_header(&mut buf, id, kind, count, (pages - 1) as u32);
        let mut data = PAGE_HEADER + node.elements.len() * ELEMENT;
        for (i, (flags, key, value)) in node.elements.iter().enumerate() {
            let at = PAGE_HEADER + i * ELEMENT;
            let pos = (data - at) as u32;
            if kind == LEAF_PAGE {
                put_u32(&mut buf, at, *flags);
                put_u32(&mut buf, at + 4, pos);
                put_u32(&mut buf, at + 8, key.len() as u32);
                put_u32(&mut buf, at + 12, value.len() as u32);
                buf[data..data + key.len()].copy_from_slice(key);
                buf[data + key.len()..data + key.len() + value.len()].copy_from_slice(value);
                data += key.len() + value.len();
            } else {
                put_u32(&mut buf, at, pos);
                put_u32(&mut buf, at + 4, key.len() as u32);
                buf[at + 8..at + 16].copy_from_slice(value);
                buf[data..data + key.len()].copy_from_slice(key);
                data += key.len();
            }
        }
        self.out.write_all(&buf)?;
        self.next_page += pages as u64;
        Ok(id)
    }

    /// Writes the root bucket, an empty freelist and both metas; answers
    /// the file's size (the high-water mark times the page size).
    pub fn finish(mut self) -> Result<(W, u64)> {
        self.end_bucket()?;
        let buckets = std::mem::take(&mut self.buckets);
        let mut leaf = Node::default();
        let mut leaves = Vec::new();
        for (name, root) in &buckets {
            let mut header = Vec::with_capacity(16);
            header.extend_from_slice(&root.to_le_bytes());
            header.extend_from_slice(&0u64.to_le_bytes());
            if !leaf.fits(name, &header) {
                let node = std::mem::take(&mut leaf);
                let first = node.elements[0].1.clone();
                leaves.push((first, self.write_node(LEAF_PAGE, &node)?));
            }
            leaf.push(BUCKET_LEAF, name, &header);
        }
        if !leaf.elements.is_empty() || leaves.is_empty() {
            let first = leaf
                .elements
                .first()
                .map(|e| e.1.clone())
                .unwrap_or_default();
            leaves.push((first, self.write_node(LEAF_PAGE, &leaf)?));
        }
        let root = self.build_branches(leaves)?;
        let freelist = self.next_page;
        let mut page = vec![0u8; PAGE_SIZE];
        page_header(&mut page, freelist, FREELIST_PAGE, 0, 0);
        self.out.write_all(&page)?;
        self.next_page += 1;
        let high_water = self.next_page;
        // The newer meta (txid 2) in page 0, as bbolt places even txids.
        for (id, txid) in [(0u64, 2u64), (1, 1)] {
            let mut page = vec![0u8; PAGE_SIZE];
            page_header(&mut page, id, META_PAGE, 0, 0);
            let m = &mut page[PAGE_HEADER..PAGE_HEADER + META_CHECKED + 8];
            m[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            m[4..8].copy_from_slice(&VERSION.to_le_bytes());
            m[8..12].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
            m[16..24].copy_from_slice(&root.to_le_bytes());
            m[32..40].copy_from_slice(&freelist.to_le_bytes());
            m[40..48].copy_from_slice(&high_water.to_le_bytes());
            m[48..56].copy_from_slice(&txid.to_le_bytes());
            let sum = fnv1a64(&m[..META_CHECKED]);
            m[56..64].copy_from_slice(&sum.to_le_bytes());
            self.out.seek(SeekFrom::Start(id * PAGE_SIZE as u64))?;
            self.out.write_all(&page)?;
        }
        self.out
            .seek(SeekFrom::Start(high_water * PAGE_SIZE as u64))?;
        self.out.flush()?;
        Ok((self.out, high_water * PAGE_SIZE as u64))
    }
}

fn page_header(buf: &mut [u8], id: u64, flags: u16, count: u16, overflow: u32) {
    buf[0..8].copy_from_slice(&id.to_le_bytes());
    buf[8..10].copy_from_slice(&flags.to_le_bytes());
    buf[10..12].copy_from_slice(&count.to_le_bytes());
    buf[12..16].copy_from_slice(&overflow.to_le_bytes());
}

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// What the chosen meta page says about a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoltInfo {
    pub page_size: u64,
    /// Pages below the high-water mark: bbolt's `Tx.Size()` is this times
    /// the page size.
    pub pages: u64,
    pub txid: u64,
}

/// Little-endian integer readers over a page that never panic.
fn u16_at(b: &[u8], at: usize) -> Result<u16> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or_else(|| invalid(format!("truncated page (u16 at {at})")))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| invalid(format!("truncated page (u32 at {at})")))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| invalid(format!("truncated page (u64 at {at})")))
}

fn slice_at(b: &[u8], at: usize, len: usize) -> Result<&[u8]> {
    at.checked_add(len)
        .and_then(|end| b.get(at..end))
        .ok_or_else(|| invalid(format!("element of {len} bytes at {at} runs off its page")))
}

/// Where a reader's pages come from: a file, or bytes in memory (fuzzing).
pub trait Pages {
    fn size(&self) -> std::io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl Pages for std::fs::File {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Pages for &[u8] {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..start.checked_add(buf.len())?))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// The meta at `offset` if it is a valid bbolt v2 meta:
/// (page size, root pgid, high-water pgid, txid).
fn meta_at(file: &dyn Pages, offset: u64) -> Option<(u64, u64, u64, u64)> {
    let mut raw = [0u8; PAGE_HEADER + META_CHECKED + 8];
    file.read_exact_at(&mut raw, offset).ok()?;
    let m = &raw[PAGE_HEADER..];
    let magic = u32_at(m, 0).ok()?;
    let version = u32_at(m, 4).ok()?;
    let checksum = u64_at(m, 56).ok()?;
    if magic != MAGIC || version != VERSION || checksum != fnv1a64(&m[..META_CHECKED]) {
        return None;
    }
    Some((
        u64::from(u32_at(m, 8).ok()?),
        u64_at(m, 16).ok()?,
        u64_at(m, 40).ok()?,
        u64_at(m, 48).ok()?,
    ))
}

/// Whether `path` looks like a bbolt file (either meta page valid).
pub fn is_bolt(path: &Path) -> bool {
    std::fs::File::open(path)
        .is_ok_and(|f| meta_at(&f, 0).is_some() || meta_at(&f, PAGE_SIZE as u64).is_some())
}

/// Visits every top-level bucket by name, `visit(bucket, None)` first
/// (also for an empty one), then each of its records in key order as
/// `visit(bucket, Some((key, value)))`; answers the meta's figures. Nested
/// buckets (etcd has none) are skipped.
pub fn read(
    path: &Path,
    visit: impl FnMut(&[u8], Option<(&[u8], &[u8])>) -> Result<()>,
) -> Result<BoltInfo> {
    read_from(&std::fs::File::open(path)?, visit)
}

/// [`read`] over any page source.
pub fn read_from(
    file: &dyn Pages,
    mut visit: impl FnMut(&[u8], Option<(&[u8], &[u8])>) -> Result<()>,
) -> Result<BoltInfo> {
    let len = file.size()?;
    let first = meta_at(file, 0);
    let page_size = first.map_or(PAGE_SIZE as u64, |m| m.0);
    if !(512..=1 << 20).contains(&page_size) {
        return Err(invalid(format!("page size {page_size}")));
    }
    let second = meta_at(file, page_size).filter(|m| m.0 == page_size);
    let (_, root, pages, txid) = match (first, second) {
        (Some(a), Some(b)) => {
            if b.3 > a.3 {
                b
            } else {
                a
            }
        }
        (Some(m), None) | (None, Some(m)) => m,
        (None, None) => return Err(invalid("no valid meta page")),
    };
    if pages.saturating_mul(page_size) > len {
        return Err(invalid(format!(
            "the meta counts {pages} pages of {page_size} bytes; the file has {len} bytes"
        )));
    }
    let reader = PageReader {
        file,
        page_size,
        pages,
        seen: Default::default(),
    };
    let mut buckets = Vec::new();
    reader.walk(root, 0, &mut |flags, key, value| {
        if flags & BUCKET_LEAF != 0 {
            // The 16-byte header, and the inline page only when there is one.
            let keep = if u64_at(value, 0).is_ok_and(|root| root != 0) {
                value.len().min(16)
            } else {
                value.len()
            };
            buckets.push((key.to_vec(), value[..keep].to_vec()));
        }
        Ok(())
    })?;
    for (name, header) in buckets {
        let bucket_root = u64_at(&header, 0)?;
        visit(&name, None)?;
        let mut on_record = |flags: u32, key: &[u8], value: &[u8]| {
            if flags & BUCKET_LEAF != 0 {
                return Ok(());
            }
            visit(&name, Some((key, value)))
        };
        if bucket_root == 0 {
            let inline = header
                .get(16..)
                .ok_or_else(|| invalid("inline bucket without its page"))?;
            leaf_records(inline, &mut on_record)?;
        } else {
            reader.walk(bucket_root, 0, &mut on_record)?;
        }
    }
    Ok(BoltInfo {
        page_size,
        pages,
        txid,
    })
}

/// Called with each leaf element: (flags, key, value).
type RecordVisitor<'v> = dyn FnMut(u32, &[u8], &[u8]) -> Result<()> + 'v;

struct PageReader<'a> {
    file: &'a dyn Pages,
    page_size: u64,
    pages: u64,
    /// Pages visited: each belongs to one place in one tree, so a second
    /// visit is a damaged (cyclic or shared) structure, not more data.
    seen: std::cell::RefCell<std::collections::HashSet<u64>>,
}

impl PageReader<'_> {
    /// The node at `id` with its overflow pages.
    fn node(&self, id: u64) -> Result<Vec<u8>> {
        if id < 2 || id >= self.pages {
            return Err(invalid(format!(
                "page {id} out of bounds ({} pages)",
                self.pages
            )));
        }
        let mut head = vec![0u8; PAGE_HEADER];
        self.file.read_exact_at(&mut head, id * self.page_size)?;
        let overflow = u64::from(u32_at(&head, 12)?);
        if u64_at(&head, 0)? != id
            || id + overflow >= self.pages
            || (overflow + 1) * self.page_size > MAX_NODE_BYTES
        {
            return Err(invalid(format!("page {id} is damaged")));
        }
        // Each page (overflow pages included) belongs to one node of one
        // tree: a second claim is damage, and refusing it bounds the
        // reading to the file's size.
        let mut seen = self.seen.borrow_mut();
        for page in id..=id + overflow {
            if !seen.insert(page) {
                return Err(invalid(format!("page {page} is referenced twice")));
            }
        }
        drop(seen);
        let mut buf = vec![0u8; ((overflow + 1) * self.page_size) as usize];
        self.file.read_exact_at(&mut buf, id * self.page_size)?;
        Ok(buf)
    }

    /// Visits the leaf records under the node `id` in key order.
    fn walk(&self, id: u64, depth: usize, visit: &mut RecordVisitor<'_>) -> Result<()> {
        if depth > MAX_DEPTH {
            return Err(invalid(format!(
                "tree deeper than {MAX_DEPTH} at page {id}"
            )));
        }
        let page = self.node(id)?;
        match u16_at(&page, 8)? {
            LEAF_PAGE => leaf_records(&page, visit),
            BRANCH_PAGE => {
                let count = usize::from(u16_at(&page, 10)?);
                for i in 0..count {
                    let at = PAGE_HEADER + i * ELEMENT;
                    let child = u64_at(&page, at + 8)?;
                    self.walk(child, depth + 1, visit)?;
                }
                Ok(())
            }
            other => Err(invalid(format!(
                "page {id} has type {other:#x} inside a tree"
            ))),
        }
    }
}

/// Visits the records of one leaf page held in `page`.
fn leaf_records(page: &[u8], visit: &mut RecordVisitor<'_>) -> Result<()> {
    if u16_at(page, 8)? != LEAF_PAGE {
        return Err(invalid("a bucket's page is not a leaf"));
    }
    let count = usize::from(u16_at(page, 10)?);
    // bbolt lays the keys and values out after the element array, in
    // element order, without overlap: holding damaged files to that keeps
    // every byte read once (overlapping elements would multiply the work).
    let mut data_end = PAGE_HEADER + count * ELEMENT;
    for i in 0..count {
        let at = PAGE_HEADER + i * ELEMENT;
        let flags = u32_at(page, at)?;
        let pos = u32_at(page, at + 4)? as usize;
        let ksize = u32_at(page, at + 8)? as usize;
        let vsize = u32_at(page, at + 12)? as usize;
        let start = at + pos;
        if start < data_end {
            return Err(invalid(format!(
                "leaf element {i} overlaps what comes before it"
            )));
        }
        let key = slice_at(page, start, ksize)?;
        let value = slice_at(page, start + ksize, vsize)?;
        data_end = start + ksize + vsize;
        visit(flags, key, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    type Buckets = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

    fn write_file(path: &Path, buckets: &Buckets) -> u64 {
        let file = std::fs::File::create(path).unwrap();
        let mut w = BoltWriter::new(std::io::BufWriter::new(file)).unwrap();
        for (name, records) in buckets {
            w.bucket(name).unwrap();
            for (k, v) in records {
                w.put(k, v).unwrap();
            }
        }
        let (_, size) = w.finish().unwrap();
        size
    }

    fn read_file(path: &Path) -> (Buckets, BoltInfo) {
        let mut out: Buckets = Vec::new();
        let info = read(path, |bucket, record| {
            match record {
                None => out.push((bucket.to_vec(), Vec::new())),
                Some((k, v)) => {
                    assert_eq!(out.last().unwrap().0, bucket);
                    out.last_mut().unwrap().1.push((k.to_vec(), v.to_vec()));
                }
            }
            Ok(())
        })
        .unwrap();
        (out, info)
    }

    #[test]
    fn buckets_round_trip_through_leaves_branches_and_overflow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let big: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000u32)
            .map(|i| {
                (
                    i.to_be_bytes().to_vec(),
                    vec![(i % 251) as u8; (i % 97) as usize],
                )
            })
            .collect();
        let huge = vec![(b"one".to_vec(), vec![7u8; 3 * PAGE_SIZE + 5])];
        let buckets: Buckets = vec![
            (b"a-empty".to_vec(), Vec::new()),
            (b"b-big".to_vec(), big),
            (b"c-huge".to_vec(), huge),
            (b"d-small".to_vec(), vec![(b"k".to_vec(), b"v".to_vec())]),
        ];
        let size = write_file(&path, &buckets);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        let (read_back, info) = read_file(&path);
        assert_eq!(read_back, buckets);
        assert_eq!(info.page_size, PAGE_SIZE as u64);
        assert_eq!(info.pages * PAGE_SIZE as u64, size);
        assert!(is_bolt(&path));
    }

    #[test]
    fn out_of_order_writes_are_refused() {
        let mut w = BoltWriter::new(std::io::Cursor::new(Vec::new())).unwrap();
        assert!(w.put(b"k", b"v").is_err(), "a record outside a bucket");
        w.bucket(b"b").unwrap();
        w.put(b"k2", b"v").unwrap();
        assert!(matches!(w.put(b"k1", b"v"), Err(BoltError::Order(_))));
        assert!(matches!(w.put(b"k2", b"v"), Err(BoltError::Order(_))));
        assert!(matches!(w.bucket(b"a"), Err(BoltError::Order(_))));
    }

    #[test]
    fn damaged_files_are_refused_without_panics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let records = (0..3000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![1u8; 40]))
            .collect();
        write_file(&path, &vec![(b"key".to_vec(), records)]);
        let good = std::fs::read(&path).unwrap();
        // Every 8-byte word of every page set to garbage in turn (a sample
        // of offsets): the reader answers, it never panics.
        let mut refused = 0;
        for offset in (0..good.len()).step_by(1237) {
            let mut bad = good.clone();
            bad[offset..offset + 8.min(good.len() - offset)].fill(0xff);
            std::fs::write(&path, &bad).unwrap();
            if read(&path, |_, _| Ok(())).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 0);
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert!(read(&path, |_, _| Ok(())).is_err(), "a truncated file");
        std::fs::write(&path, b"not a database").unwrap();
        assert!(!is_bolt(&path));
        assert!(read(&path, |_, _| Ok(())).is_err());
    }

    #[test]
    fn elements_that_share_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let records = (0..4u8).map(|i| (vec![b'k', i], vec![i; 100])).collect();
        write_file(&path, &vec![(b"b".to_vec(), records)]);
        assert!(read(&path, |_, _| Ok(())).is_ok());
        // The bucket's leaf is page 2: point element 1 at element 0's key,
        // as a crafted file would to make one page count many times.
        let mut bytes = std::fs::read(&path).unwrap();
        let page = 2 * PAGE_SIZE;
        let pos0 = u32::from_le_bytes(bytes[page + 20..page + 24].try_into().unwrap());
        bytes[page + 36..page + 40].copy_from_slice(&(pos0 - ELEMENT as u32).to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = read(&path, |_, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("overlaps"), "{err}");
    }

    #[test]
    fn a_page_claimed_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        write_file(
            &path,
            &vec![
                (b"a".to_vec(), vec![(b"k".to_vec(), b"v".to_vec())]),
                (b"b".to_vec(), vec![(b"k".to_vec(), b"v".to_vec())]),
            ],
        );
        // Pages: 2 = bucket a, 3 = bucket b, 4 = the root bucket's leaf.
        // Make b's header name a's root page.
        let mut bytes = std::fs::read(&path).unwrap();
        let root_leaf = 4 * PAGE_SIZE;
        let count = u16::from_le_bytes(bytes[root_leaf + 10..root_leaf + 12].try_into().unwrap());
        assert_eq!(count, 2);
        let at = root_leaf + PAGE_HEADER + ELEMENT;
        let pos = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let value = at + pos + 1;
        assert_eq!(
            u64::from_le_bytes(bytes[value..value + 8].try_into().unwrap()),
            3
        );
        bytes[value..value + 8].copy_from_slice(&2u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let err = read(&path, |_, _| Ok(())).unwrap_err();
        assert!(err.to_string().contains("referenced twice"), "{err}");
    }
}
