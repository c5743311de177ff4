//! Iterators combining the engine's sources: a level of disjoint tables read
//! as one run ([`LevelIter`]) and the k-way merge of memtables and runs
//! ([`MergeIter`]) that scans and compactions read through.
//!
//! This module owns only ordering: it must never drop or reorder versions
//! (choosing which version a reader sees, or which a compaction keeps, is
//! the caller's job), so equal internal keys come out newest source first.

use std::cmp::Ordering as CmpOrdering;
use std::ops::Bound;
use std::sync::Arc;

use super::format::{cmp_internal, Entry, EntryIter};
use super::sst::{Table, TableIter};
use crate::Result;

/// Disjoint tables sorted by key, read in order, opening each table only
/// when the previous one is exhausted and stopping before tables that start
/// past `end`.
pub(crate) struct LevelIter<'a> {
    tables: &'a [Arc<Table>],
    next: usize,
    end: Bound<&'a [u8]>,
    fill_cache: bool,
    iter: Option<TableIter<'a>>,
}

impl<'a> LevelIter<'a> {
    pub fn new(
        tables: &'a [Arc<Table>],
        start: Bound<&[u8]>,
        end: Bound<&'a [u8]>,
        fill_cache: bool,
    ) -> Result<LevelIter<'a>> {
        let first = match start {
            Bound::Unbounded => 0,
            Bound::Included(k) | Bound::Excluded(k) => {
                tables.partition_point(|t| t.meta.largest.as_ref() < k)
            }
        };
        let mut it = LevelIter {
            tables,
            next: first,
            end,
            fill_cache,
            iter: None,
        };
        if let Some(t) = it.tables.get(first) {
            if it.starts_before_end(t) {
                it.iter = Some(TableIter::with_cache(t, start, fill_cache)?);
                it.next = first + 1;
            }
        }
        it.skip_exhausted()?;
        Ok(it)
    }

    fn starts_before_end(&self, t: &Table) -> bool {
        match self.end {
            Bound::Unbounded => true,
            Bound::Included(e) => t.meta.smallest.as_ref() <= e,
            Bound::Excluded(e) => t.meta.smallest.as_ref() < e,
        }
    }

    fn skip_exhausted(&mut self) -> Result<()> {
        while self.iter.as_ref().is_some_and(|i| i.current().is_none()) {
            self.iter = None;
            if let Some(t) = self.tables.get(self.next) {
                if self.starts_before_end(t) {
                    self.iter = Some(TableIter::with_cache(t, Bound::Unbounded, self.fill_cache)?);
                    self.next += 1;
                }
            }
        }
        Ok(())
    }
}

impl EntryIter for LevelIter<'_> {
    fn current(&self) -> Option<&Entry> {
        self.iter.as_ref().and_then(|i| i.current())
    }

    fn advance(&mut self) -> Result<()> {
        if let Some(i) = self.iter.as_mut() {
            i.advance()?;
        }
        self.skip_exhausted()
    }
}

/// Merges sources given newest first; among equal internal keys the newest
/// source's entry comes first. The sources are few (memtables, L0 tables,
/// one per level), so a linear minimum beats a heap's bookkeeping.
pub(crate) struct MergeIter<'a> {
    sources: Vec<Box<dyn EntryIter + 'a>>,
    current: Option<usize>,
}

impl<'a> MergeIter<'a> {
    pub fn new(sources: Vec<Box<dyn EntryIter + 'a>>) -> MergeIter<'a> {
        let mut m = MergeIter {
            sources,
            current: None,
        };
        m.pick();
        m
    }

    fn pick(&mut self) {
        let mut best: Option<(usize, &Entry)> = None;
        for (i, s) in self.sources.iter().enumerate() {
            if let Some(e) = s.current() {
                let better = match best {
                    None => true,
                    Some((_, b)) => cmp_internal(&e.key, e.seq, &b.key, b.seq) == CmpOrdering::Less,
                };
                if better {
                    best = Some((i, e));
                }
            }
        }
        self.current = best.map(|(i, _)| i);
    }
}

impl EntryIter for MergeIter<'_> {
    fn current(&self) -> Option<&Entry> {
        self.current.and_then(|i| self.sources[i].current())
    }

    fn advance(&mut self) -> Result<()> {
        if let Some(i) = self.current {
            self.sources[i].advance()?;
        }
        self.pick();
        Ok(())
    }
}
