//! The in-memory copy-on-write B+tree: immutable, `Arc`-shared nodes that
//! are either resident ([`Child::Mem`]) or still on disk ([`Child::Disk`]),
//! point reads and range scans over any root, and the writer's path-copying
//! put and delete.
//!
//! This module owns the shape of the tree (split, merge, root growth and
//! collapse; splits are even, except that appends at the tree's right edge
//! leave full pages behind) and the bookkeeping of what a write makes
//! garbage ([`Freed`]). It must never modify a node another root can see:
//! a node reachable from a snapshot, from the published root or from a
//! commit in flight is shared (`Arc` count above one) and is copied before
//! it changes; only nodes the current batch created itself are changed in
//! place. It never writes: page ids are given to nodes by the commit in
//! `mod.rs`.
//!
//! # Page ids and epochs
//!
//! A node's `page` is 0 while it is dirty and becomes its page id once a
//! commit has written it (set through an atomic so a commit can do it while
//! the writer goes on copying). `born` is the writer epoch (the number of
//! the commit that will freeze it) that created the node. When the writer
//! replaces a node that has a page, that page is freed; when it replaces a
//! dirty node born in an earlier epoch, a commit in flight (or done) is
//! giving that node a page the writer does not know yet, so the writer keeps
//! the node itself ([`Freed::Node`]) and the next commit reads its page.
//! Dirty nodes born in the current epoch were never frozen and free nothing.
//! Overflow values ([`BigVal`]) follow the same rules.

use std::ops::Bound;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::page::{self, Probe, NODE_CAPACITY};
use super::DataFile;
use crate::{Error, Result, Scan};

/// A child pointer: a resident node or a page not loaded (in the tree's
/// file).
#[derive(Clone)]
pub enum Child {
    Mem(Arc<Node>),
    Disk(u64),
}

pub struct Node {
    page: AtomicU64,
    born: u64,
    pub kind: NodeKind,
}

pub enum NodeKind {
    Leaf {
        entries: Vec<Entry>,
    },
    /// `keys[0]` is always empty; `keys[i]` (i > 0) is the smallest key
    /// `children[i]` may hold.
    Branch {
        keys: Vec<Bytes>,
        children: Vec<Child>,
    },
}

#[derive(Clone)]
pub struct Entry {
    pub key: Bytes,
    pub value: Val,
}

#[derive(Clone)]
pub enum Val {
    Inline(Bytes),
    Big(Arc<BigVal>),
}

/// A value stored in an overflow run.
pub struct BigVal {
    pub len: u64,
    crc: AtomicU32,
    page: AtomicU64,
    born: u64,
    /// The bytes, for values written since open; `None` for values loaded
    /// from a page (read from the run when asked for).
    pub data: Option<Bytes>,
}

impl BigVal {
    pub fn stored(len: u64, page: u64, crc: u32) -> BigVal {
        BigVal {
            len,
            crc: AtomicU32::new(crc),
            page: AtomicU64::new(page),
            born: 0,
            data: None,
        }
    }

    /// A value just written, not yet in any page.
    pub fn fresh(data: Bytes, born: u64) -> BigVal {
        BigVal {
            len: data.len() as u64,
            crc: AtomicU32::new(0),
            page: AtomicU64::new(0),
            born,
            data: Some(data),
        }
    }

    pub fn page(&self) -> u64 {
        self.page.load(Ordering::Acquire)
    }

    pub fn crc(&self) -> u32 {
        self.crc.load(Ordering::Acquire)
    }

    /// Records where a commit wrote the value (crc first: a reader of the
    /// page id also sees the crc).
    pub fn set_written(&self, page: u64, crc: u32) {
        self.crc.store(crc, Ordering::Release);
        self.page.store(page, Ordering::Release);
    }
}

impl Node {
    pub fn stored(page: u64, kind: NodeKind) -> Node {
        Node {
            page: AtomicU64::new(page),
            born: 0,
            kind,
        }
    }

    fn dirty(kind: NodeKind, born: u64) -> Node {
        Node {
            page: AtomicU64::new(0),
            born,
            kind,
        }
    }

    pub fn empty_leaf(born: u64) -> Node {
        Node::dirty(
            NodeKind::Leaf {
                entries: Vec::new(),
            },
            born,
        )
    }

    /// The page this node was read from or written to; 0 while dirty.
    pub fn page(&self) -> u64 {
        self.page.load(Ordering::Acquire)
    }

    pub fn set_page(&self, page: u64) {
        self.page.store(page, Ordering::Release);
    }

    /// A dirty copy (no page) born in `born`.
    fn copy(&self, born: u64) -> Node {
        Node::dirty(self.kind.clone(), born)
    }

    fn is_empty(&self) -> bool {
        match &self.kind {
            NodeKind::Leaf { entries } => entries.is_empty(),
            NodeKind::Branch { children, .. } => children.is_empty(),
        }
    }
}

impl Clone for NodeKind {
    fn clone(&self) -> Self {
        match self {
            NodeKind::Leaf { entries } => NodeKind::Leaf {
                entries: entries.clone(),
            },
            NodeKind::Branch { keys, children } => NodeKind::Branch {
                keys: keys.clone(),
                children: children.clone(),
            },
        }
    }
}

/// Whether the tree under `root` is entirely written: a written node's
/// children were all written before it.
pub fn is_clean(root: &Child) -> bool {
    match root {
        Child::Disk(_) => true,
        Child::Mem(n) => n.page() != 0,
    }
}

/// Index of the child of a branch with `keys` that holds `key`.
fn route(keys: &[Bytes], key: &[u8]) -> usize {
    // keys[0] is empty and never compared.
    keys.get(1..)
        .map_or(0, |rest| rest.partition_point(|k| k[..] <= *key))
}

fn search(entries: &[Entry], key: &[u8]) -> std::result::Result<usize, usize> {
    entries.binary_search_by(|e| e.key[..].cmp(key))
}

fn before_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Unbounded => true,
        Bound::Included(e) => key <= e,
        Bound::Excluded(e) => key < e,
    }
}

/// The stored value of `key` under `root` (not yet read if it overflows).
/// Resident nodes are searched as they are; pages below them are probed in
/// place, never decoded.
pub fn lookup(file: &DataFile, root: &Child, key: &[u8]) -> Result<Option<Val>> {
    lookup_or(file, root, key, &mut || {})
}

/// [`lookup`], calling `before_read` before each page it has to read from
/// the file.
pub fn lookup_or(
    file: &DataFile,
    root: &Child,
    key: &[u8],
    before_read: &mut dyn FnMut(),
) -> Result<Option<Val>> {
    let mut child = root.clone();
    let mut page = loop {
        let node = match child {
            Child::Disk(p) => break p,
            Child::Mem(n) => n,
        };
        child = match &node.kind {
            NodeKind::Leaf { entries } => {
                return Ok(search(entries, key).ok().map(|i| entries[i].value.clone()));
            }
            NodeKind::Branch { keys, children } => match children.get(route(keys, key)) {
                Some(c) => c.clone(),
                None => return Ok(None),
            },
        };
    };
    loop {
        let (block, step) = file.probe_or(page, key, before_read)?;
        match step {
            Probe::Child(next) => page = next,
            Probe::Inline(range) => {
                let Some(block) = block else {
                    return Err(internal("an inline value without its page"));
                };
                return Ok(Some(Val::Inline(Bytes::from_owner(block).slice(range))));
            }
            Probe::Big { len, page, crc } => {
                return Ok(Some(Val::Big(Arc::new(BigVal::stored(len, page, crc)))));
            }
            Probe::Absent => return Ok(None),
        }
    }
}

/// Brings the node pages that lookups (or puts and deletes) of `keys`
/// under `root` go through into the cache: level by level, each level's
/// misses read together, so a batch of random writes waits for one device
/// round trip per level instead of one per page. Best effort: errors are
/// left for the operations themselves to report.
pub fn prefetch_paths(file: &DataFile, root: &Child, keys: &[&[u8]]) {
    let mut frontier: Vec<(u64, &[u8])> = keys
        .iter()
        .filter_map(|&k| first_disk(root, k).map(|p| (p, k)))
        .collect();
    while !frontier.is_empty() {
        let pages: Vec<u64> = frontier.iter().map(|f| f.0).collect();
        file.prefetch(&pages);
        frontier = frontier
            .into_iter()
            .filter_map(|(p, k)| match file.probe(p, k) {
                Ok((_, Probe::Child(c))) => Some((c, k)),
                _ => None,
            })
            .collect();
    }
}

/// The first page not resident on the way from `root` to `key`, if any.
fn first_disk(root: &Child, key: &[u8]) -> Option<u64> {
    let mut child = root;
    loop {
        match child {
            Child::Disk(p) => return Some(*p),
            Child::Mem(n) => match &n.kind {
                NodeKind::Leaf { .. } => return None,
                NodeKind::Branch { keys, children } => child = children.get(route(keys, key))?,
            },
        }
    }
}

pub fn get(file: &DataFile, root: &Child, key: &[u8]) -> Result<Option<Bytes>> {
    match lookup(file, root, key)? {
        Some(v) => Ok(Some(value_bytes(file, &v)?)),
        None => Ok(None),
    }
}

pub fn value_bytes(file: &DataFile, v: &Val) -> Result<Bytes> {
    match v {
        Val::Inline(b) => Ok(b.clone()),
        Val::Big(b) => match &b.data {
            Some(d) => Ok(d.clone()),
            None => file.read_big(b),
        },
    }
}

/// Children a scan reads ahead when it enters a branch, and the most it
/// reads ahead at once (the window doubles as the scan goes on).
const READ_AHEAD_FIRST: usize = 4;
const READ_AHEAD_MAX: usize = 32;

/// Visits `[start, end)`-style bounds in key order; returns `Scan::Stop`
/// once the visitor or the end bound stopped it.
pub fn scan<F>(
    file: &DataFile,
    child: &Child,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    visit: &mut F,
) -> Result<Scan>
where
    F: FnMut(&[u8], &Bytes) -> Scan,
{
    let node = match child {
        Child::Mem(n) => n.clone(),
        Child::Disk(p) => {
            let block = file.read_block(*p)?;
            let bad = |r: String| file.corrupt("btree page", page::offset_of(*p), r);
            if page::LeafView::new(&block).map_err(bad)?.is_some() {
                return scan_leaf_page(file, *p, block, start, end, visit);
            }
            let kind = page::decode_node(&Bytes::from_owner(block)).map_err(bad)?;
            Arc::new(Node::stored(*p, kind))
        }
    };
    match &node.kind {
        NodeKind::Leaf { entries } => {
            let from = match start {
                Bound::Unbounded => 0,
                Bound::Included(s) => entries.partition_point(|e| e.key[..] < *s),
                Bound::Excluded(s) => entries.partition_point(|e| e.key[..] <= *s),
            };
            for e in &entries[from..] {
                if !before_end(&e.key, end) {
                    return Ok(Scan::Stop);
                }
                let v = value_bytes(file, &e.value)?;
                if visit(&e.key, &v) == Scan::Stop {
                    return Ok(Scan::Stop);
                }
            }
            Ok(Scan::Continue)
        }
        NodeKind::Branch { keys, children } => {
            let first = match start {
                Bound::Unbounded => 0,
                Bound::Included(s) | Bound::Excluded(s) => route(keys, s),
            };
            // Read-ahead: the children the scan goes on to are read in
            // windows that double (like a file read-ahead), each with its
            // reads in flight together, instead of one read at a time.
            let mut ahead_until = first;
            let mut window = READ_AHEAD_FIRST;
            for i in first..children.len() {
                if i > 0 && !before_end(&keys[i], end) {
                    return Ok(Scan::Stop);
                }
                if i >= ahead_until {
                    ahead_until = (i + window).min(children.len());
                    window = (window * 2).min(READ_AHEAD_MAX);
                    let pages: Vec<u64> = (i..ahead_until)
                        .take_while(|&j| j == i || before_end(&keys[j], end))
                        .filter_map(|j| match children[j] {
                            Child::Disk(p) => Some(p),
                            Child::Mem(_) => None,
                        })
                        .collect();
                    file.prefetch(&pages);
                }
                if scan(file, &children[i], start, end, visit)? == Scan::Stop {
                    return Ok(Scan::Stop);
                }
            }
            Ok(Scan::Continue)
        }
    }
}

/// [`scan`] over a leaf page, read in place: keys and inline values are
/// slices of the cached block, nothing is decoded into entries.
fn scan_leaf_page<F>(
    file: &DataFile,
    page_id: u64,
    block: Arc<[u8]>,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
    visit: &mut F,
) -> Result<Scan>
where
    F: FnMut(&[u8], &Bytes) -> Scan,
{
    let bad = |r: String| file.corrupt("btree page", page::offset_of(page_id), r);
    let bytes = Bytes::from_owner(block);
    let Some(view) = page::LeafView::new(&bytes).map_err(bad)? else {
        return Err(bad("not a leaf".into()));
    };
    let from = match start {
        Bound::Unbounded => 0,
        Bound::Included(s) => view.seek(s, false).map_err(bad)?,
        Bound::Excluded(s) => view.seek(s, true).map_err(bad)?,
    };
    for i in from..view.count() {
        let (k, v) = view.entry(i).map_err(bad)?;
        if !before_end(&bytes[k.clone()], end) {
            return Ok(Scan::Stop);
        }
        let value = match v {
            page::LeafValue::Inline(r) => bytes.slice(r),
            page::LeafValue::Big { len, page, crc } => {
                file.read_big(&BigVal::stored(len, page, crc))?
            }
        };
        if visit(&bytes.slice(k), &value) == Scan::Stop {
            return Ok(Scan::Stop);
        }
    }
    Ok(Scan::Continue)
}

/// Something a write removed from the tree whose space a later commit may
/// reuse.
pub enum Freed {
    /// `pages` pages from `page`.
    Run(u64, u64),
    /// A node frozen by an earlier commit; its page is read at the next one.
    Node(Arc<Node>),
    /// An overflow value frozen by an earlier commit.
    Value(Arc<BigVal>),
}

/// The writer's context for one batch.
pub struct WriteCtx<'a> {
    pub file: &'a DataFile,
    pub epoch: u64,
    pub freed: Vec<Freed>,
    /// Nodes loaded or copied: a measure of how much became resident.
    pub touched: usize,
}

fn internal(what: &str) -> Error {
    Error::Invalid(format!("btree: internal invariant broken: {what}"))
}

impl WriteCtx<'_> {
    fn release_node(&mut self, n: &Arc<Node>) {
        let p = n.page();
        if p != 0 {
            self.freed.push(Freed::Run(p, 1));
        } else if n.born < self.epoch {
            self.freed.push(Freed::Node(n.clone()));
        }
    }

    fn release_val(&mut self, v: Val) {
        if let Val::Big(b) = v {
            let p = b.page();
            if p != 0 {
                self.freed.push(Freed::Run(p, page::pages_for(b.len)));
            } else if b.born < self.epoch {
                self.freed.push(Freed::Value(b));
            }
        }
    }

    /// Makes `child` a node this batch may change in place, loading or
    /// copying it (and freeing what it replaces) as needed.
    fn node_mut<'c>(&mut self, child: &'c mut Child) -> Result<&'c mut Node> {
        if let Child::Disk(p) = *child {
            let node = self.file.read_node(p)?;
            self.freed.push(Freed::Run(p, 1));
            self.touched += 1;
            *child = Child::Mem(Arc::new(Node::dirty(node.kind, self.epoch)));
        }
        let Child::Mem(arc) = child else {
            return Err(internal("child still on disk after loading"));
        };
        if Arc::get_mut(arc).is_none() {
            let copy = arc.copy(self.epoch);
            self.release_node(arc);
            self.touched += 1;
            *arc = Arc::new(copy);
        }
        let epoch = self.epoch;
        let Some(node) = Arc::get_mut(arc) else {
            return Err(internal("fresh node is shared"));
        };
        let p = *node.page.get_mut();
        if p != 0 {
            // Only this tree knew the node: its page is garbage now.
            self.freed.push(Freed::Run(p, 1));
            *node.page.get_mut() = 0;
        }
        node.born = epoch;
        Ok(node)
    }

    /// The node's kind for a node leaving the tree (merged away): taken if
    /// nobody else holds it, copied otherwise, and its page freed.
    fn take_kind(&mut self, child: Child) -> Result<NodeKind> {
        match child {
            Child::Disk(p) => {
                let node = self.file.read_node(p)?;
                self.freed.push(Freed::Run(p, 1));
                Ok(node.kind)
            }
            Child::Mem(arc) => {
                self.release_node(&arc);
                Ok(match Arc::try_unwrap(arc) {
                    Ok(node) => node.kind,
                    Err(shared) => shared.kind.clone(),
                })
            }
        }
    }

    fn size_of(&self, child: &Child) -> Result<usize> {
        match child {
            Child::Mem(n) => Ok(page::node_size(&n.kind)),
            Child::Disk(p) => Ok(page::node_size(&self.file.read_node(*p)?.kind)),
        }
    }

    /// Inserts or replaces `key` under `root`.
    pub fn put(&mut self, root: &mut Child, key: Bytes, value: Val) -> Result<()> {
        self.put_in(root, key.clone(), value, true)?;
        self.fit_root(root, &key)
    }

    /// Splits the root (making it a branch over the parts) until it fits a
    /// page. `key` is the one just written (for the append heuristic).
    fn fit_root(&mut self, root: &mut Child, key: &[u8]) -> Result<()> {
        loop {
            let node = self.node_mut(root)?;
            if page::node_size(&node.kind) <= NODE_CAPACITY {
                return Ok(());
            }
            let kind = std::mem::replace(
                &mut node.kind,
                NodeKind::Leaf {
                    entries: Vec::new(),
                },
            );
            let append = is_append(&kind, key);
            let mut keys = Vec::new();
            let mut children = Vec::new();
            for (sep, part) in split(kind, append)? {
                keys.push(if keys.is_empty() { Bytes::new() } else { sep });
                children.push(Child::Mem(Arc::new(Node::dirty(part, self.epoch))));
            }
            node.kind = NodeKind::Branch { keys, children };
        }
    }

    /// `rightmost`: `child` is on the tree's right edge (every ancestor's
    /// last child).
    fn put_in(&mut self, child: &mut Child, key: Bytes, value: Val, rightmost: bool) -> Result<()> {
        let node = self.node_mut(child)?;
        match &mut node.kind {
            NodeKind::Leaf { entries } => match search(entries, &key) {
                Ok(i) => {
                    let old = std::mem::replace(&mut entries[i].value, value);
                    self.release_val(old);
                }
                Err(i) => entries.insert(i, Entry { key, value }),
            },
            NodeKind::Branch { keys, children } => {
                let i = route(keys, &key);
                let rightmost = rightmost && i + 1 == children.len();
                let Some(c) = children.get_mut(i) else {
                    return Err(internal("branch without children"));
                };
                self.put_in(c, key.clone(), value, rightmost)?;
                self.split_child(keys, children, i, &key, rightmost)?;
            }
        }
        Ok(())
    }

    /// Splits `children[i]` if it outgrew a page. `key` is the key just
    /// put under it; `rightmost` says `children[i]` is on the tree's right
    /// edge.
    fn split_child(
        &mut self,
        keys: &mut Vec<Bytes>,
        children: &mut Vec<Child>,
        i: usize,
        key: &[u8],
        rightmost: bool,
    ) -> Result<()> {
        let node = self.node_mut(&mut children[i])?;
        if page::node_size(&node.kind) <= NODE_CAPACITY {
            return Ok(());
        }
        let kind = std::mem::replace(
            &mut node.kind,
            NodeKind::Leaf {
                entries: Vec::new(),
            },
        );
        // Only an append at the right edge of the whole tree packs (keys
        // that only grow, like revisions); a node inside the tree that grows
        // at its end takes random inserts too, so it splits evenly.
        let append = rightmost && is_append(&kind, key);
        let mut parts = split(kind, append)?.into_iter();
        let Some((_, first)) = parts.next() else {
            return Err(internal("split produced nothing"));
        };
        node.kind = first;
        for (j, (sep, part)) in parts.enumerate() {
            keys.insert(i + 1 + j, sep);
            children.insert(
                i + 1 + j,
                Child::Mem(Arc::new(Node::dirty(part, self.epoch))),
            );
        }
        Ok(())
    }

    /// Removes `key` from under `root`; returns whether it was there.
    pub fn delete(&mut self, root: &mut Child, key: &[u8]) -> Result<bool> {
        if lookup(self.file, root, key)?.is_none() {
            return Ok(false);
        }
        self.delete_in(root, key)?;
        // A leaf written by format 1 measures more now than when it was
        // written (2 bytes per inline entry), so losing an entry may still
        // leave it over a page: such a root splits like after a put.
        self.fit_root(root, key)?;
        // Collapse single-child roots; an empty branch root becomes a leaf.
        loop {
            let collapses = match root {
                Child::Mem(n) => matches!(
                    &n.kind,
                    NodeKind::Branch { children, .. } if children.len() <= 1
                ),
                Child::Disk(_) => false,
            };
            if !collapses {
                return Ok(true);
            }
            let node = self.node_mut(root)?;
            let NodeKind::Branch { children, .. } = &mut node.kind else {
                return Ok(true);
            };
            match children.len() {
                0 => {
                    node.kind = NodeKind::Leaf {
                        entries: Vec::new(),
                    }
                }
                1 => {
                    let Some(only) = children.pop() else {
                        return Err(internal("vanished child"));
                    };
                    *root = only;
                }
                _ => return Ok(true),
            }
        }
    }

    fn delete_in(&mut self, child: &mut Child, key: &[u8]) -> Result<()> {
        let node = self.node_mut(child)?;
        match &mut node.kind {
            NodeKind::Leaf { entries } => {
                if let Ok(i) = search(entries, key) {
                    let e = entries.remove(i);
                    self.release_val(e.value);
                }
            }
            NodeKind::Branch { keys, children } => {
                let i = route(keys, key);
                let Some(c) = children.get_mut(i) else {
                    return Err(internal("branch without children"));
                };
                self.delete_in(c, key)?;
                // As for the root (see `delete`): a format-1 leaf may not
                // fit a page as format 2 even after losing an entry.
                self.split_child(keys, children, i, key, false)?;
                self.rebalance(keys, children, i)?;
            }
        }
        Ok(())
    }

    /// After a delete under `children[i]`: drops it if empty, merges it
    /// with a neighbour if it is under a quarter full and both fit a page.
    fn rebalance(
        &mut self,
        keys: &mut Vec<Bytes>,
        children: &mut Vec<Child>,
        i: usize,
    ) -> Result<()> {
        let (empty, size) = match &children[i] {
            Child::Mem(n) => (n.is_empty(), page::node_size(&n.kind)),
            Child::Disk(_) => return Err(internal("deleted-from child not resident")),
        };
        if empty {
            let gone = children.remove(i);
            keys.remove(i);
            if let Some(k0) = keys.first_mut() {
                *k0 = Bytes::new();
            }
            self.take_kind(gone)?;
            return Ok(());
        }
        if size >= NODE_CAPACITY / 4 || children.len() < 2 {
            return Ok(());
        }
        let (l, r) = if i > 0 { (i - 1, i) } else { (i, i + 1) };
        let sep_len = keys[r].len();
        let left_size = self.size_of(&children[l])?;
        let right_size = self.size_of(&children[r])?;
        // A branch merge turns the right node's empty first key into the
        // separator.
        let extra = match &children[i] {
            Child::Mem(n) if matches!(n.kind, NodeKind::Branch { .. }) => sep_len,
            _ => 0,
        };
        if left_size + right_size + extra > NODE_CAPACITY {
            return Ok(());
        }
        let right = children.remove(r);
        let sep = keys.remove(r);
        let right_kind = self.take_kind(right)?;
        let left = self.node_mut(&mut children[l])?;
        match (&mut left.kind, right_kind) {
            (NodeKind::Leaf { entries }, NodeKind::Leaf { entries: more }) => entries.extend(more),
            (
                NodeKind::Branch {
                    keys: lk,
                    children: lc,
                },
                NodeKind::Branch {
                    keys: mut rk,
                    children: rc,
                },
            ) => {
                if let Some(k0) = rk.first_mut() {
                    *k0 = sep;
                }
                lk.extend(rk);
                lc.extend(rc);
            }
            _ => {
                return Err(Error::Corrupt {
                    what: "btree node",
                    path: self.file.path().to_path_buf(),
                    offset: 0,
                    reason: "sibling nodes at different tree levels".into(),
                })
            }
        }
        Ok(())
    }
}

/// Whether `key` (just put into the node `kind`) lies past every other key
/// of it: the last entry of a leaf, under the last child of a branch.
fn is_append(kind: &NodeKind, key: &[u8]) -> bool {
    match kind {
        NodeKind::Leaf { entries } => entries.last().is_some_and(|e| e.key[..] == *key),
        NodeKind::Branch { keys, .. } => {
            keys.len() < 2 || keys.last().is_some_and(|k| k[..] <= *key)
        }
    }
}

/// Splits an oversized node into parts that each fit a page; each part
/// comes with the smallest key it holds (its separator). The parts are of
/// about equal size, except after an `append` at the tree's right edge:
/// then all but the last are packed full, so keys that only grow (appends)
/// leave full pages behind instead of half-empty ones.
fn split(kind: NodeKind, append: bool) -> Result<Vec<(Bytes, NodeKind)>> {
    let cuts_for = |sizes: &[usize]| {
        if append {
            packed_cut_points(sizes)
        } else {
            cut_points(sizes)
        }
    };
    match kind {
        NodeKind::Leaf { entries } => {
            let sizes: Vec<usize> = entries
                .iter()
                .map(|e| page::leaf_entry_size(&e.key, &e.value))
                .collect();
            let cuts = cuts_for(&sizes)?;
            let mut parts = Vec::with_capacity(cuts.len());
            let mut rest = entries;
            for &cut in cuts.iter().rev() {
                let tail = rest.split_off(cut);
                let sep = tail.first().map(|e| e.key.clone()).unwrap_or_default();
                parts.push((sep, NodeKind::Leaf { entries: tail }));
            }
            let sep = rest.first().map(|e| e.key.clone()).unwrap_or_default();
            parts.push((sep, NodeKind::Leaf { entries: rest }));
            parts.reverse();
            Ok(parts)
        }
        NodeKind::Branch { keys, children } => {
            let sizes: Vec<usize> = keys.iter().map(|k| page::branch_entry_size(k)).collect();
            let cuts = cuts_for(&sizes)?;
            let mut parts = Vec::with_capacity(cuts.len() + 1);
            let (mut rk, mut rc) = (keys, children);
            for &cut in cuts.iter().rev() {
                let mut tk = rk.split_off(cut);
                let tc = rc.split_off(cut);
                let sep = tk.first().cloned().unwrap_or_default();
                if let Some(k0) = tk.first_mut() {
                    *k0 = Bytes::new();
                }
                parts.push((
                    sep,
                    NodeKind::Branch {
                        keys: tk,
                        children: tc,
                    },
                ));
            }
            parts.push((
                Bytes::new(),
                NodeKind::Branch {
                    keys: rk,
                    children: rc,
                },
            ));
            parts.reverse();
            Ok(parts)
        }
    }
}

/// Where to cut a node with entry `sizes` so every part fits a page and the
/// parts are about equally full. Returns the ascending start indices of
/// every part but the first.
fn cut_points(sizes: &[usize]) -> Result<Vec<usize>> {
    // prefix[i]: bytes of entries before i.
    let mut prefix = Vec::with_capacity(sizes.len() + 1);
    prefix.push(0usize);
    for &s in sizes {
        prefix.push(prefix[prefix.len() - 1] + s);
    }
    let total = prefix[sizes.len()];
    let mut parts = total.div_ceil(NODE_CAPACITY).max(2);
    // Each cut goes where the running size comes closest to its share of
    // the total (a cut at the first entry past the share would leave the
    // last part short: 15 equal entries in two parts became 7, 7 and 1).
    while parts <= sizes.len() {
        let mut cuts = Vec::with_capacity(parts - 1);
        let mut prev = 0;
        for j in 1..parts {
            let goal = total * j / parts;
            let i = prefix.partition_point(|&p| p < goal);
            let i = if i > 0 && goal - prefix[i - 1] < prefix[i].saturating_sub(goal) {
                i - 1
            } else {
                i
            };
            let i = i.clamp(prev + 1, sizes.len() - (parts - j));
            cuts.push(i);
            prev = i;
        }
        let fits = cuts
            .iter()
            .chain(std::iter::once(&sizes.len()))
            .scan(0, |start, &end| {
                let part = prefix[end] - prefix[*start];
                *start = end;
                Some(part)
            })
            .all(|part| part <= NODE_CAPACITY);
        if fits {
            return Ok(cuts);
        }
        parts += 1;
    }
    Err(internal("a node cannot be split into pages"))
}

/// Cut points that fill every part but the last to the page (greedily).
fn packed_cut_points(sizes: &[usize]) -> Result<Vec<usize>> {
    let mut cuts = Vec::new();
    let mut cur = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if s > NODE_CAPACITY {
            return Err(internal("an entry larger than a page"));
        }
        if cur > 0 && cur + s > NODE_CAPACITY {
            cuts.push(i);
            cur = 0;
        }
        cur += s;
    }
    if cuts.is_empty() {
        return Err(internal("splitting a node that fits a page"));
    }
    Ok(cuts)
}

/// How many nodes of the tree under `child` are resident.
pub fn resident(child: &Child) -> usize {
    let Child::Mem(arc) = child else {
        return 0;
    };
    match &arc.kind {
        NodeKind::Branch { children, .. } => 1 + children.iter().map(resident).sum::<usize>(),
        NodeKind::Leaf { .. } => 1,
    }
}

/// Whether more than `budget` nodes of the tree under `child` are
/// resident; stops counting there (a walk of at most `budget` nodes).
pub fn resident_above(child: &Child, budget: usize) -> bool {
    fn count(child: &Child, left: &mut usize) -> bool {
        let Child::Mem(arc) = child else {
            return false;
        };
        if *left == 0 {
            return true;
        }
        *left -= 1;
        match &arc.kind {
            NodeKind::Branch { children, .. } => children.iter().any(|c| count(c, left)),
            NodeKind::Leaf { .. } => false,
        }
    }
    let mut left = budget;
    count(child, &mut left)
}

/// Drops resident clean nodes from the tree under `child`, leaving page
/// pointers, so memory holds only dirty nodes. Dirty nodes shared with a
/// snapshot are copied (keeping their epoch: they are the same node).
pub fn evict(child: &mut Child) {
    let Child::Mem(arc) = child else {
        return;
    };
    let p = arc.page();
    if p != 0 {
        *child = Child::Disk(p);
        return;
    }
    let NodeKind::Branch { children, .. } = &arc.kind else {
        return;
    };
    if children.iter().all(|c| matches!(c, Child::Disk(_))) {
        return;
    }
    if Arc::get_mut(arc).is_none() {
        let born = arc.born;
        *arc = Arc::new(arc.copy(born));
    }
    if let Some(node) = Arc::get_mut(arc) {
        if let NodeKind::Branch { children, .. } = &mut node.kind {
            for c in children.iter_mut() {
                evict(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn cuts_fit_pages_and_balance() {
        for sizes in [
            vec![1000; 5],
            vec![30; 200],
            vec![1049, 7, 1049, 1049, 1049],
        ] {
            let cuts = cut_points(&sizes).unwrap();
            assert!(!cuts.is_empty());
            let mut start = 0;
            for &c in cuts.iter().chain(std::iter::once(&sizes.len())) {
                assert!(c > start, "empty part in {cuts:?}");
                let part: usize = sizes[start..c].iter().sum();
                assert!(part <= NODE_CAPACITY, "{part} in {cuts:?}");
                start = c;
            }
        }
    }

    #[test]
    fn an_overflowing_node_splits_in_two_halves() {
        let mut sizes = vec![279; 15];
        sizes[7] = 280;
        assert_eq!(cut_points(&sizes).unwrap(), vec![8]);
        assert_eq!(cut_points(&[1000; 9]).unwrap(), vec![3, 6]);
    }

    #[test]
    fn packed_cuts_fill_pages_and_keep_the_rest() {
        let sizes = vec![279; 15];
        let cuts = packed_cut_points(&sizes).unwrap();
        assert_eq!(cuts, vec![14]);
        let cuts = packed_cut_points(&[1000; 9]).unwrap();
        assert_eq!(cuts, vec![4, 8]);
        assert!(packed_cut_points(&[10; 3]).is_err());
    }

    fn leaf_sizes(child: &Child, out: &mut Vec<usize>) {
        let Child::Mem(n) = child else {
            panic!("written tree")
        };
        match &n.kind {
            NodeKind::Leaf { .. } => out.push(page::node_size(&n.kind)),
            NodeKind::Branch { children, .. } => {
                for c in children {
                    leaf_sizes(c, out);
                }
            }
        }
    }

    #[test]
    fn appends_at_the_right_edge_leave_full_leaves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path).unwrap();
        let cache = Arc::new(crate::io::BlockCache::new(1 << 20));
        let file = DataFile::open(&path, cache).unwrap();
        let mut ctx = WriteCtx {
            file: &file,
            epoch: 1,
            freed: Vec::new(),
            touched: 0,
        };
        let mut root = Child::Mem(Arc::new(Node::empty_leaf(1)));
        for i in 0..3000u32 {
            let key = Bytes::from(format!("k{i:015}"));
            ctx.put(&mut root, key, Val::Inline(Bytes::from(vec![7u8; 256])))
                .unwrap();
        }
        let mut sizes = Vec::new();
        leaf_sizes(&root, &mut sizes);
        let full = NODE_CAPACITY
            - page::leaf_entry_size(
                b"k000000000000000",
                &Val::Inline(Bytes::from(vec![0u8; 256])),
            );
        let last = sizes.pop().unwrap();
        assert!(last > 0);
        assert!(sizes.iter().all(|&s| s > full), "{sizes:?}");
        // Inserting in the middle afterwards still splits evenly.
        let mut ctx = WriteCtx {
            file: &file,
            epoch: 1,
            freed: Vec::new(),
            touched: 0,
        };
        ctx.put(
            &mut root,
            Bytes::from("k000000000000100x"),
            Val::Inline(Bytes::from(vec![7u8; 256])),
        )
        .unwrap();
        let mut after = Vec::new();
        leaf_sizes(&root, &mut after);
        assert_eq!(after.len(), sizes.len() + 2, "{sizes:?} {after:?}");
        assert!(after.iter().all(|&s| s <= NODE_CAPACITY));
        // (The last leaf, still filling, aside.)
        assert_eq!(
            after[..after.len() - 1]
                .iter()
                .filter(|&&s| s < NODE_CAPACITY / 2 + 300)
                .count(),
            2,
            "{after:?}"
        );
    }

    #[test]
    fn route_picks_the_child_holding_the_key() {
        let keys = vec![
            Bytes::new(),
            Bytes::from_static(b"m"),
            Bytes::from_static(b"t"),
        ];
        assert_eq!(route(&keys, b"a"), 0);
        assert_eq!(route(&keys, b"m"), 1);
        assert_eq!(route(&keys, b"s"), 1);
        assert_eq!(route(&keys, b"z"), 2);
    }
}
